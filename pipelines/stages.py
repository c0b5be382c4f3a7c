"""DVC stages: the pipeline's components run one at a time on fixed paths (``dvc.yaml``).

``dvc repro`` runs the same component functions as the Kubeflow DAG (each component's
``python_func``), with artifacts at fixed locations under ``runs/dvc/`` so that DVC can hash them
and skip what is up to date. Each artifact directory has a ``.meta.json`` beside it (the KFP
artifact metadata: fingerprints, run ids), which the next stage reads back as its input's
metadata. DVC decides what reruns, so the components' own reuse cache is off here.

    python -m pipelines stage prepare_data            # one stage, settings from params.yaml
    python -m pipelines stage train --method trace
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from pipelines.config import PipelineConfig
from pipelines.dag import section_json

OUT = Path("runs/dvc")
STAGES = ("prepare_data", "build_retriever_index", "warm_start", "train", "evaluate", "profile", "compare")
PER_METHOD = ("train", "evaluate", "profile")


def _artifact(kind: str, path: Path, meta: dict[str, Any] | None = None):
    from kfp import dsl

    cls = {"dataset": dsl.Dataset, "model": dsl.Model, "artifact": dsl.Artifact, "metrics": dsl.Metrics,
           "markdown": dsl.Markdown}[kind]
    path.parent.mkdir(parents=True, exist_ok=True)
    return cls(name=path.name, uri=str(path.resolve()), metadata=dict(meta or {}))


def _read(kind: str, path: Path):
    meta_file = path.with_name(path.name + ".meta.json")
    if not meta_file.is_file():
        raise ValueError(f"{path} has no {meta_file.name}: run the stage that produces it first (dvc repro)")
    return _artifact(kind, path, json.loads(meta_file.read_text()))


def _write_meta(artifact: Any) -> None:
    path = Path(artifact.path)
    path.with_name(path.name + ".meta.json").write_text(json.dumps(artifact.metadata, indent=1, sort_keys=True))


def run_stage(name: str, cfg: PipelineConfig, method: str | None = None, out: Path = OUT) -> None:
    """Run one stage of ``dvc.yaml`` with ``cfg`` (module docstring)."""
    if name not in STAGES:
        raise ValueError(f"stage {name!r} is not one of {STAGES}")
    if (name in PER_METHOD) != (method is not None):
        raise ValueError(f"stage {name} {'needs' if name in PER_METHOD else 'takes no'} --method")
    if method is not None and method not in cfg.methods:
        raise ValueError(f"--method {method!r} is not one of methods {cfg.methods}")
    tracking = cfg.train.tracking
    common = {"workspace": str(out / "work"), "reuse": False, "tracking_uri": tracking.tracking_uri,
              "experiment": tracking.experiment}
    run_id = "dvc"
    data = out / "prepare_data" / "data"
    index = out / "build_retriever_index" / "index"
    policy = out / "warm_start" / "policy"
    testbed = out / "warm_start" / "testbed"
    if name == "prepare_data":
        art = _artifact("dataset", data)
        _fn("prepare_data")(data_config=section_json(cfg.data), kfp_run_id=run_id, data=art, **common)
        _write_meta(art)
    elif name == "build_retriever_index":
        art = _artifact("artifact", index)
        _fn("build_retriever_index")(data=_read("dataset", data), index_config=section_json(cfg.index),
                                     kfp_run_id=run_id, index=art, **common)
        _write_meta(art)
    elif name == "warm_start":
        art = _artifact("model", policy)
        bed = _artifact("dataset", testbed)
        _fn("warm_start")(data=_read("dataset", data), index=_read("artifact", index),
                          warm_start_config=section_json(cfg.warm_start), agent_config=section_json(cfg.train.agent),
                          registry_config=section_json(cfg.registry), kfp_run_id=run_id, policy=art, testbed=bed,
                          **common)
        _write_meta(art)
        _write_meta(bed)
    elif name == "train":
        art = _artifact("model", out / "train" / method / "trained")
        _fn("train")(method=method, data=_read("dataset", data), index=_read("artifact", index),
                     warm_policy=_read("model", policy), testbed=_read("dataset", testbed),
                     train_config=section_json(cfg.train), gpus=0, nodes=1,
                     platform_config=section_json(cfg.platform), kfp_run_id=run_id, trained=art, **common)
        _write_meta(art)
    elif name == "evaluate":
        result = _artifact("artifact", out / "evaluate" / method / "result.json")
        metrics = _artifact("metrics", out / "evaluate" / method / "kfp_metrics")
        _fn("evaluate")(trained=_read("model", out / "train" / method / "trained"), data=_read("dataset", data),
                        index=_read("artifact", index), eval_config=section_json(cfg.evaluate),
                        train_config=section_json(cfg.train), result=result, metrics=metrics, **common)
        _write_meta(result)
        (out / "evaluate" / method / "metrics.json").write_text(json.dumps(_finite(metrics.metadata), indent=1))
    elif name == "profile":
        report = _artifact("artifact", out / "profile" / method / "report.json")
        breakdown = _artifact("markdown", out / "profile" / method / "cost_breakdown.md")
        _fn("profile")(trained=_read("model", out / "train" / method / "trained"),
                       evaluation=_read("artifact", out / "evaluate" / method / "result.json"),
                       tracking_uri=tracking.tracking_uri, experiment=tracking.experiment,
                       workspace=common["workspace"], report=report, breakdown=breakdown)
        _write_meta(report)
    else:
        reports = [_read("artifact", out / "profile" / m / "report.json") for m in cfg.methods]
        table = _artifact("markdown", out / "compare" / "table.md")
        result = json.loads(_fn("compare")(reports=reports, methods=list(cfg.methods), kfp_run_id=run_id, table=table,
                                           **common))
        _compare_files(out, [json.loads(Path(r.path).read_text()) for r in reports], cfg.methods)
        print(result["table"])


def _fn(component: str):
    """The plain Python function of a component."""
    import importlib

    return getattr(importlib.import_module(f"components.{component}"), component).python_func


def _finite(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def _compare_files(out: Path, reports: list[dict[str, Any]], methods: list[str]) -> None:
    """DVC metrics (``metrics.json``) and plots (``effective_ratio.csv``: one column per method)
    under ``out/compare``, the histories read from the train stages under the same ``out``."""
    folder = out / "compare"
    by_method = dict(zip(methods, reports, strict=True))
    metrics = {m: _finite({"eval_score": r["score"], "effective_ratio": r["means"].get("effective_ratio", math.nan),
                           "seconds_per_step": r["means"].get("cost/step_s", math.nan),
                           **{f"cost_share/{p}": s for p, s in r["cost_shares"].items()}})
               for m, r in by_method.items()}
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=1, sort_keys=True))
    histories = {}
    for m in methods:
        trained = out / "train" / m / "trained" / "history.json"
        histories[m] = json.loads(trained.read_text()).get("effective_ratio", []) if trained.is_file() else []
    steps = max((len(h) for h in histories.values()), default=0)
    with (folder / "effective_ratio.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["step", *methods])
        for s in range(steps):
            writer.writerow([s, *[histories[m][s] if s < len(histories[m]) else "" for m in methods]])
