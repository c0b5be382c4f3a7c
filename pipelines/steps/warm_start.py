"""warm_start: the policy every method starts from — the registry's champion, or a fresh SFT warm start."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.lineage import StageCache, closure_digest, copy_tree, fingerprint, lineage_tags, tree_digest
from pipelines.steps.artifacts import ArtifactMetadata, ArtifactRef, StepContext

if TYPE_CHECKING:
    from trace_core.tracking import Tracker
    from trace_core.warmstart.pipeline import WarmStartConfig

STAGE = "warm_start"
TESTBED_FILES = ("pool.jsonl", "warmup.jsonl", "heldout.jsonl", "testbed.json")


@dataclass(frozen=True)
class WarmStart:
    """What warm_start made: where the policy came from and the two artifacts' metadata."""

    origin: str  # "sft" or "registry:<model>/<version>"
    policy_metadata: ArtifactMetadata  # fingerprint, origin, run_id, dvc_md5
    testbed_metadata: ArtifactMetadata  # fingerprint


def run_warm_start(data: ArtifactRef, index: ArtifactRef, cfg: dict[str, Any], agent: dict[str, Any],
                   registry: dict[str, Any], ctx: StepContext, policy_out: str, testbed_out: str) -> WarmStart:
    """Write the starting policy to ``policy_out`` and the testbed's question files to
    ``testbed_out`` (``cfg``: the ``warm_start`` section, ``agent``: the trainer's agent limits,
    ``registry``: the ``registry`` section). With ``from_registry`` the policy is the registered
    champion (else the latest version); without one, or when nothing is registered yet, it is
    ``trace_core.warmstart``'s SFT on scripted expert demonstrations."""
    from trace_core.tracking import MLflowTracker, TrackingConfig

    start = None
    if cfg["from_registry"]:
        from pipelines.registry import starting_point

        start = starting_point(ctx.tracking_uri, registry["model_name"])
    if start is not None:  # the fingerprint is the registered version itself
        origin = f"registry:{start.name}/{start.version}"
        fp = fingerprint(STAGE, origin, start.run_id)
    else:
        origin = "sft"
        fp = fingerprint(STAGE, origin, data.metadata.fingerprint, cfg, agent,
                         closure_digest(__name__))
    cache = StageCache(ctx.workspace, enabled=ctx.reuse)
    record = cache.lookup(STAGE, fp)
    if record is None:
        work = cache.start(STAGE, fp)
        tracker = MLflowTracker(
            TrackingConfig(tracking_uri=ctx.tracking_uri, experiment=ctx.experiment, run_name=f"warm_start ({origin})",
                           spool_dir=str(work / "spool")),
            tags={"pipeline.step": STAGE, "warm_start.origin": origin,
                  **lineage_tags(dvc_data_hash=data.metadata.dvc_md5, kfp_run_id=ctx.kfp_run_id,
                                 config={"warm_start": cfg, "agent": agent})})
        if start is not None:
            from pipelines.registry import download_policy

            download_policy(ctx.tracking_uri, start, work / "policy")
            tracker.log_params({"origin": origin, "source_run_id": start.run_id})
        else:
            _sft(data, index, cfg, agent, work, tracker)
        tracker.close()
        record = cache.commit(STAGE, fp, {"origin": origin, "run_id": tracker.run_id,
                                          "policy_digest": tree_digest(work / "policy")})
    entry = cache.entry(STAGE, fp)
    copy_tree(entry / "policy", policy_out)
    Path(testbed_out).mkdir(parents=True, exist_ok=True)
    for name in TESTBED_FILES:
        if (entry / name).is_file():
            copy_tree(entry / name, Path(testbed_out) / name)
    return WarmStart(record["origin"],
                     ArtifactMetadata(fingerprint=fp, origin=record["origin"], run_id=record["run_id"],
                                      dvc_md5=data.metadata.dvc_md5),
                     ArtifactMetadata(fingerprint=fp))


def _sft(data: ArtifactRef, index: ArtifactRef, cfg: dict[str, Any], agent: dict[str, Any], work: Path,
         tracker: Tracker) -> None:
    """The SFT warm start into ``work`` (policy/, report.json, the testbed files), logged to ``tracker``."""
    from trace_core.config import flatten
    from trace_core.warmstart.pipeline import run_warm_start as run_sft
    from trace_core.warmstart.pretrained import run_pretrained_warm_start

    if cfg.get("policy", "tiny") == "smollm2":
        report = run_pretrained_warm_start(pretrained_config(cfg, agent, str(work)))
        _pretrained_testbed_files(work, cfg)
    else:
        report = run_sft(sft_config(data.path, index.path, cfg, agent, str(work)))
    tracker.log_params({"origin": "sft", **{f"warm_start.{k}": v for k, v in cfg.items()}})
    # Every number of the warm start's report (SFT phases, sizes, its own evaluation), whatever its layout.
    numbers = {k: float(v) for k, v in flatten({k: v for k, v in report.items() if k != "config"}).items()
               if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}
    tracker.log_metrics(numbers, step=0)
    tracker.log_artifact(Path(work) / "report.json")


def sft_config(data_dir: str, index_dir: str, cfg: dict[str, Any], agent: dict[str, Any],
               out_dir: str) -> WarmStartConfig:
    """The ``WarmStartConfig`` of the ``warm_start`` section ``cfg``: the warm start's own (tuned)
    defaults, the testbed's recipe with ``testbed``, and every setting ``cfg`` gives (not None)."""
    from dataclasses import replace

    from trace_core.config import from_dict
    from trace_core.rollout.agent import AgentConfig
    from trace_core.warmstart.pipeline import TESTBED_SFT, WarmStartConfig
    from trace_core.warmstart.testbed import TestbedConfig

    def given(**kw):  # None keeps the warm start's own (tuned) default
        return {k: v for k, v in kw.items() if v is not None}

    base = WarmStartConfig()
    if cfg["testbed"]:  # the testbed's own recipe: full demonstrations only, fitted closely
        testbed = TestbedConfig(pool_size=cfg["testbed_pool"], seed=cfg["testbed_seed"])
        base = replace(base, view_sft=None, sft=TESTBED_SFT, testbed=testbed)
    view_sft = None if base.view_sft is None else replace(
        base.view_sft, seed=cfg["seed"], progress=False, **given(epochs=cfg["view_epochs"]))
    return replace(
        base, data_dir=data_dir, out_dir=out_dir, families=tuple(cfg["families"]),
        train_tasks=cfg["train_tasks"], eval_tasks=cfg["eval_tasks"], qa_index=index_dir,
        demos=replace(base.demos, seed=cfg["seed"], **given(epsilon=cfg["epsilon"])),
        view_sft=view_sft,
        sft=replace(base.sft, seed=cfg["seed"], progress=False,
                    **given(lr=cfg["lr"], epochs=cfg["epochs"], batch_size=cfg["batch_size"])),
        eval=replace(base.eval, seed=cfg["seed"]),
        agent=from_dict(AgentConfig, agent), **given(synthetic_kbs=cfg["synthetic_kbs"]),
        sft_cache=cfg.get("sft_cache"), keep_sft=bool(cfg.get("keep_sft", False)),
    )


def pretrained_config(cfg: dict[str, Any], agent: dict[str, Any], out_dir: str):
    """The ``PretrainedWarmStartConfig`` of the ``warm_start`` section ``cfg``: its own defaults,
    the chained problems drawn with ``testbed_seed``, and the SFT settings ``cfg`` gives (not None)."""
    from dataclasses import replace

    from trace_core.config import from_dict
    from trace_core.rollout.agent import AgentConfig
    from trace_core.warmstart.pretrained import PretrainedWarmStartConfig

    given = {k: cfg[k] for k in ("lr", "epochs", "batch_size") if cfg.get(k) is not None}
    base = PretrainedWarmStartConfig()
    return replace(base, out_dir=out_dir, chains=replace(base.chains, seed=cfg["testbed_seed"]),
                   sft=replace(base.sft, seed=cfg["seed"], progress=False, **given),
                   agent=from_dict(AgentConfig, agent))


def _pretrained_testbed_files(work: Path, cfg: dict[str, Any]) -> None:
    """The pretrained warm start's questions where the train step looks for the testbed's: the pool
    as ``pool.jsonl``, its predictor warm-up split (made like the pool, in no other file) as
    ``warmup.jsonl``, and ``heldout.jsonl`` beside them (never shown to training)."""
    tasks = work / "tasks"
    for name in ("pool.jsonl", "warmup.jsonl", "heldout.jsonl"):
        copy_tree(tasks / name, work / name)
