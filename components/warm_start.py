"""warm_start: the policy every method starts from — the registry's champion, or a fresh SFT warm start."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)  # the images ship kfp (the lock)
def warm_start(
    data: Input[Dataset],
    index: Input[Artifact],
    warm_start_config: str,
    agent_config: str,
    registry_config: str,
    workspace: str,
    reuse: bool,
    tracking_uri: str,
    experiment: str,
    kfp_run_id: str,
    policy: Output[Model],
    testbed: Output[Dataset],
) -> str:
    """Write the starting policy (a transformers model directory) and return where it came from.

    With ``from_registry`` (recurring retrains) the policy is the registered champion of
    ``registry.model_name`` (else its latest version); without one, or when nothing is registered
    yet, it is ``trace_core.warmstart``'s SFT on scripted expert demonstrations. With ``testbed``
    the SFT follows the embedded testbed's plan and ``testbed`` receives its question files
    (``pool.jsonl``, ``warmup.jsonl``) and ``testbed.json``."""
    import json
    import math
    from pathlib import Path

    from trace_core.config import flatten, from_dict
    from trace_core.lineage import StageCache, code_digest, copy_tree, fingerprint, lineage_tags, tree_digest
    from trace_core.rollout.agent import AgentConfig
    from trace_core.tracking import MLflowTracker, TrackingConfig

    cfg, agent, reg = json.loads(warm_start_config), json.loads(agent_config), json.loads(registry_config)
    start = None
    if cfg["from_registry"]:
        from trace_core.registry_mlflow import starting_point

        start = starting_point(tracking_uri, reg["model_name"])
    if start is not None:  # the fingerprint is the registered version itself
        origin = f"registry:{start.name}/{start.version}"
        fp = fingerprint("warm_start", origin, start.run_id)
    else:
        origin = "sft"
        fp = fingerprint("warm_start", origin, data.metadata["fingerprint"], cfg, agent,
                         code_digest("trace_core.warmstart", "trace_core.models"))
    cache = StageCache(workspace, enabled=reuse)
    record = cache.lookup("warm_start", fp)
    if record is None:
        work = cache.start("warm_start", fp)
        tracker = MLflowTracker(
            TrackingConfig(tracking_uri=tracking_uri, experiment=experiment, run_name=f"warm_start ({origin})",
                           spool_dir=str(work / "spool")),
            tags={"pipeline.step": "warm_start", "warm_start.origin": origin,
                  **lineage_tags(dvc_data_hash=data.metadata.get("dvc_md5", ""), kfp_run_id=kfp_run_id,
                                 config={"warm_start": cfg, "agent": agent})})
        if start is not None:
            from trace_core.registry_mlflow import download_policy

            download_policy(tracking_uri, start, work / "policy")
            tracker.log_params({"origin": origin, "source_run_id": start.run_id})
        else:
            from dataclasses import replace

            from trace_core.warmstart.pipeline import WarmStartConfig, run_warm_start

            def given(**kw):  # None keeps the warm start's own (tuned) default
                return {k: v for k, v in kw.items() if v is not None}

            from trace_core.warmstart.pipeline import TESTBED_SFT
            from trace_core.warmstart.testbed import TestbedConfig

            base = WarmStartConfig()
            if cfg["testbed"]:  # the testbed's own recipe: full demonstrations only, fitted closely
                base = replace(base, view_sft=None, sft=TESTBED_SFT,
                               testbed=TestbedConfig(pool_size=cfg["testbed_pool"]))
            view_sft = None if base.view_sft is None else replace(
                base.view_sft, seed=cfg["seed"], progress=False, **given(epochs=cfg["view_epochs"]))
            ws = replace(
                base, data_dir=data.path, out_dir=str(work), families=tuple(cfg["families"]),
                train_tasks=cfg["train_tasks"], eval_tasks=cfg["eval_tasks"], qa_index=index.path,
                demos=replace(base.demos, seed=cfg["seed"], **given(epsilon=cfg["epsilon"])),
                view_sft=view_sft,
                sft=replace(base.sft, seed=cfg["seed"], progress=False,
                            **given(lr=cfg["lr"], epochs=cfg["epochs"], batch_size=cfg["batch_size"])),
                eval=replace(base.eval, seed=cfg["seed"]),
                agent=from_dict(AgentConfig, agent), **given(synthetic_kbs=cfg["synthetic_kbs"]),
            )
            report = run_warm_start(ws)
            tracker.log_params({"origin": origin, **{f"warm_start.{k}": v for k, v in cfg.items()}})
            # Every number of the warm start's report (SFT phases, sizes, its own evaluation), whatever its layout.
            numbers = {k: float(v) for k, v in flatten({k: v for k, v in report.items() if k != "config"}).items()
                       if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}
            tracker.log_metrics(numbers, step=0)
            tracker.log_artifact(Path(work) / "report.json")
        tracker.close()
        record = cache.commit("warm_start", fp, {"origin": origin, "run_id": tracker.run_id,
                                                 "policy_digest": tree_digest(work / "policy")})
    copy_tree(cache.entry("warm_start", fp) / "policy", policy.path)
    Path(testbed.path).mkdir(parents=True, exist_ok=True)
    for name in ("pool.jsonl", "warmup.jsonl", "testbed.json"):
        if (cache.entry("warm_start", fp) / name).is_file():
            copy_tree(cache.entry("warm_start", fp) / name, Path(testbed.path) / name)
    testbed.metadata.update({"fingerprint": fp})
    policy.metadata.update({"fingerprint": fp, "origin": record["origin"], "run_id": record["run_id"],
                            "dvc_md5": data.metadata.get("dvc_md5", "")})
    return record["origin"]
