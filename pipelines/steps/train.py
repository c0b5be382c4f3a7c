"""train: RL training of the warm-started policy with one method of the registry (grpo, pcl, treepo, trace, ...)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.lineage import StageCache, closure_digest, copy_tree, fingerprint, lineage_tags
from pipelines.steps.artifacts import ArtifactMetadata, ArtifactRef, StepContext

if TYPE_CHECKING:
    from trace_core.training.config import TrainConfig

# What the trained artifact holds, copied from the run directory.
TRAINED_FILES = ("policy", "summary.json", "history.json", "cost_breakdown.txt", "train_config.yaml", "allocations")


@dataclass(frozen=True)
class Placement:
    """Where training runs: this process (CPU or one GPU), torchrun in this pod, or a PyTorchJob."""

    gpus: int  # GPUs per pod (> 1: DeepSpeed over torchrun)
    nodes: int  # pods (> 1: a Training Operator PyTorchJob that the step launches and follows)
    platform: dict[str, Any]  # the ``platform`` section (the PyTorchJob's namespace, volumes, resources)


@dataclass(frozen=True)
class Trained:
    """What train made: the MLflow run id and the trained artifact's metadata."""

    run_id: str  # the training run in MLflow
    metadata: ArtifactMetadata  # fingerprint, method, run_id, dvc_md5


PLACED = "<placed by the step>"  # a location field's value in the defining configuration


def defining_config(cfg: TrainConfig) -> dict[str, Any]:
    """What defines a training result: ``cfg`` with every field that only says where things are
    or where the run is logged (paths, the tracking target, progress bars) replaced by a fixed
    placeholder, through typed replacement; the predictor's warm-up file counts only as on/off."""
    from dataclasses import replace

    from trace_core.config import to_dict
    from trace_core.tracking import TrackingConfig

    warm = cfg.predictor_warmup
    anonymous = replace(cfg, output_dir=PLACED, policy_model=PLACED, tracking=TrackingConfig(), progress=False,
                        task=replace(cfg.task, data_dir=PLACED, index_dir=None, train_file=None),
                        predictor_warmup=replace(warm, task_file=None if warm.task_file is None else PLACED))
    return to_dict(anonymous)


def run_train(method: str, data: ArtifactRef, index: ArtifactRef, warm_policy: ArtifactRef, testbed: ArtifactRef,
              raw: dict[str, Any], placement: Placement, ctx: StepContext, out: str) -> Trained:
    """Train ``method`` from ``warm_policy`` with the TrainConfig JSON ``raw`` and write
    :data:`TRAINED_FILES` to ``out``. A rerun after a crash resumes from the checkpoints."""
    from dataclasses import replace

    from trace_core.config import from_dict
    from trace_core.training.config import TrainConfig

    given = replace(from_dict(TrainConfig, raw), method=method)
    defining = defining_config(given)
    fp = fingerprint("train", method, defining, warm_policy.metadata.fingerprint, data.metadata.fingerprint,
                     index.metadata.fingerprint, testbed.metadata.fingerprint, placement.gpus,
                     placement.nodes, closure_digest(__name__))  # all the code it can run
    stage = f"train-{method}"
    cache = StageCache(ctx.workspace, enabled=ctx.reuse)
    record = cache.lookup(stage, fp)
    if record is None:
        work = cache.start(stage, fp, resume=True)  # a rerun after a crash resumes from the checkpoints
        cfg = placed(given, data, index, warm_policy, testbed, ctx, work / "run")
        tags = {"method": method, "task": cfg.task.family, "pipeline.step": "train",
                **lineage_tags(dvc_data_hash=data.metadata.dvc_md5, kfp_run_id=ctx.kfp_run_id,
                               config=defining)}
        bed_file = Path(testbed.path) / "testbed.json"
        if bed_file.is_file():  # the testbed's hash goes with every result on it
            tags["testbed.hash"] = json.loads(bed_file.read_text())["hash"]
        run_id = _train(cfg, tags, method, fp, placement, work)
        record = cache.commit(stage, fp, {"run_id": run_id, "method": method})
    run_dir = cache.entry(stage, fp) / "run"
    for name in TRAINED_FILES:
        copy_tree(run_dir / name, Path(out) / name)
    return Trained(record["run_id"], ArtifactMetadata(fingerprint=fp, method=method, run_id=record["run_id"],
                                                      dvc_md5=data.metadata.dvc_md5))


def placed(cfg: TrainConfig, data: ArtifactRef, index: ArtifactRef, warm_policy: ArtifactRef, testbed: ArtifactRef,
           ctx: StepContext, run_dir: Path) -> TrainConfig:
    """``cfg`` with the inputs' paths, the run folder and the tracking target filled in (typed
    replacement; ``cfg`` itself is unchanged); ``{testbed}`` in its file paths becomes the
    testbed folder."""
    from dataclasses import replace

    def place(path: str | None) -> str | None:  # "{testbed}/pool.jsonl" -> this run's testbed folder
        return None if path is None else path.replace("{testbed}", testbed.path)

    return replace(
        cfg, output_dir=str(run_dir), policy_model=warm_policy.path, progress=False,
        task=replace(cfg.task, data_dir=data.path, index_dir=index.path, train_file=place(cfg.task.train_file)),
        predictor_warmup=replace(cfg.predictor_warmup, task_file=place(cfg.predictor_warmup.task_file)),
        tracking=replace(cfg.tracking, tracking_uri=ctx.tracking_uri, experiment=ctx.experiment, run_name=cfg.method,
                         spool_dir=str(run_dir / "spool")))


def _train(cfg: TrainConfig, tags: dict[str, str], method: str, fp: str, placement: Placement, work: Path) -> str:
    """Run the trainer where ``placement`` says, write ``history.json`` beside its summary, and
    return the training run's id."""
    import yaml

    from trace_core.config import flatten, to_dict
    from trace_core.tracking import MLflowTracker

    run_dir = work / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    config_file = run_dir / "train_config.yaml"
    config_file.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    gpus, nodes = placement.gpus, placement.nodes
    if nodes > 1:
        _run_pytorchjob(method, fp, config_file, placement)
    elif gpus > 1:
        subprocess.run(["torchrun", "--standalone", f"--nproc-per-node={gpus}", "-m", "trace_core.cli",
                        "train", "--config", str(config_file)], check=True)
    else:
        from trace_core.training.trainer import Trainer

        tracker = MLflowTracker(cfg.tracking, tags=tags)  # resumes the run recorded in the spool, if any
        tracker.log_params(flatten(cfg))
        Trainer(cfg, tracker=tracker).run()
    summary = json.loads((run_dir / "summary.json").read_text())
    from trace_core.training.step_history import run_history

    (run_dir / "history.json").write_text(json.dumps(run_history(run_dir)))  # every step's metrics
    if nodes > 1 or gpus > 1:  # the trainer's own run: add the lineage tags to it
        from dataclasses import replace

        late = MLflowTracker(replace(cfg.tracking, spool_dir=str(work / "tag-spool")), run_id=summary["run_id"])
        late.set_tags(tags)
        late.flush()
    return summary["run_id"]


def _run_pytorchjob(method: str, fp: str, config_file: Path, placement: Placement) -> None:
    """Launch the multi-node PyTorchJob of this training and follow it to completion."""
    from pipelines.pytorchjob import pytorchjob_manifest, run_pytorchjob

    plat = placement.platform
    name = f"trace-rl-{method}-{fp[:10]}".replace("_", "-").lower()
    image = os.environ.get("TRACE_RL_TRAIN_IMAGE") or os.environ["TRACE_RL_IMAGE"]
    run_pytorchjob(pytorchjob_manifest(
        name, image, str(config_file), placement.nodes, max(placement.gpus, 1),
        namespace=plat["namespace"], workspace_mount=plat["workspace_mount"],
        checkpoints_pvc=plat["checkpoints_pvc"], accelerator_type=plat["accelerator_type"],
        node_selector=plat["train_node_selector"], tolerations=plat["train_tolerations"],
        cpu=plat["train_cpu"], memory=plat["train_memory"], service_account=plat["service_account"],
        config_map=plat["config_map"]))
