"""DVC stages: the pipeline's steps run one at a time on fixed paths (``dvc.yaml``).

``dvc repro`` runs the same step functions the Kubeflow components call (``pipelines.steps``),
with their typed inputs (:class:`~pipelines.steps.artifacts.ArtifactRef`,
:class:`~pipelines.steps.artifacts.StepContext`) and artifacts at fixed locations under
``runs/dvc/`` so that DVC can hash them and skip what is up to date. Each artifact has a
``.meta.json`` beside it (the metadata its step returned: fingerprints, run ids), which the next
stage reads back as its input's metadata. DVC decides what reruns, so the steps' own reuse cache
is off here.

    python -m pipelines stage prepare_data            # one stage, settings from params.yaml
    python -m pipelines stage train --method trace
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from pipelines.config import PipelineConfig, section_json
from pipelines.steps.artifacts import ArtifactMetadata, ArtifactRef, StepContext

OUT = Path("runs/dvc")
STAGES = ("prepare_data", "build_retriever_index", "warm_start", "train", "evaluate", "profile", "compare")
PER_METHOD = ("train", "evaluate", "profile")


def _output(path: Path) -> str:
    """Where a stage writes an artifact (its parent folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return str(path.resolve())


def _read(path: Path) -> ArtifactRef:
    """An earlier stage's artifact and the metadata its step returned."""
    meta_file = path.with_name(path.name + ".meta.json")
    if not meta_file.is_file():
        raise ValueError(f"{path} has no {meta_file.name}: run the stage that produces it first (dvc repro)")
    metadata = ArtifactMetadata.from_dict(json.loads(meta_file.read_text()), str(meta_file))
    return ArtifactRef(str(path.resolve()), metadata)


def _write_meta(path: Path, metadata: ArtifactMetadata) -> None:
    path.with_name(path.name + ".meta.json").write_text(json.dumps(metadata.to_dict(), indent=1, sort_keys=True))


def _section(section: Any) -> dict[str, Any]:
    """A configuration section as the steps read it (the JSON a component receives, parsed)."""
    return json.loads(section_json(section))


def run_stage(name: str, cfg: PipelineConfig, method: str | None = None, out: Path = OUT) -> None:
    """Run one stage of ``dvc.yaml`` with ``cfg`` (module docstring)."""
    if name not in STAGES:
        raise ValueError(f"stage {name!r} is not one of {STAGES}")
    if (name in PER_METHOD) != (method is not None):
        raise ValueError(f"stage {name} {'needs' if name in PER_METHOD else 'takes no'} --method")
    if method is not None and method not in cfg.methods:
        raise ValueError(f"--method {method!r} is not one of methods {cfg.methods}")
    tracking = cfg.train.tracking
    ctx = StepContext(str(out / "work"), False, tracking.tracking_uri, tracking.experiment, "dvc")
    data = out / "prepare_data" / "data"
    index = out / "build_retriever_index" / "index"
    policy = out / "warm_start" / "policy"
    testbed = out / "warm_start" / "testbed"
    if name == "prepare_data":
        from pipelines.steps.prepare_data import run_prepare_data

        _write_meta(data, run_prepare_data(_section(cfg.data), ctx, _output(data)).metadata)
    elif name == "build_retriever_index":
        from pipelines.steps.build_retriever_index import run_build_retriever_index

        _write_meta(index, run_build_retriever_index(_read(data), _section(cfg.index), ctx, _output(index)).metadata)
    elif name == "warm_start":
        from pipelines.steps.warm_start import run_warm_start

        made = run_warm_start(_read(data), _read(index), _section(cfg.warm_start), _section(cfg.train.agent),
                              _section(cfg.registry), ctx, _output(policy), _output(testbed))
        _write_meta(policy, made.policy_metadata)
        _write_meta(testbed, made.testbed_metadata)
    elif name == "train":
        from pipelines.steps.train import Placement, run_train

        trained = out / "train" / method / "trained"
        made = run_train(method, _read(data), _read(index), _read(policy), _read(testbed), _section(cfg.train),
                         Placement(0, 1, _section(cfg.platform)), ctx, _output(trained))
        _write_meta(trained, made.metadata)
    elif name == "evaluate":
        from pipelines.steps.evaluate import run_evaluate

        result = out / "evaluate" / method / "result.json"
        made = run_evaluate(_read(out / "train" / method / "trained"), _read(data), _read(index),
                            _section(cfg.evaluate), _section(cfg.train),
                            StepContext(ctx.workspace, False, ctx.tracking_uri, ctx.experiment), _output(result))
        _write_meta(result, made.metadata)
        metrics = {f"{made.family}_{made.primary_metric}": made.score}
        (out / "evaluate" / method / "metrics.json").write_text(json.dumps(_finite(metrics), indent=1))
    elif name == "profile":
        from pipelines.steps.profile import run_profile

        report = out / "profile" / method / "report.json"
        made = run_profile(_read(out / "train" / method / "trained"), _read(out / "evaluate" / method / "result.json"),
                           tracking.tracking_uri, tracking.experiment, ctx.workspace, _output(report),
                           _output(out / "profile" / method / "cost_breakdown.md"))
        _write_meta(report, made.metadata)
    else:
        from pipelines.steps.compare import run_compare

        reports = [_read(out / "profile" / m / "report.json") for m in cfg.methods]
        made = run_compare(reports, list(cfg.methods), ctx, _output(out / "compare" / "table.md"))
        _compare_files(out, [json.loads(Path(r.path).read_text()) for r in reports], cfg.methods)
        print(made.table)


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
