"""train: RL training of the warm-started policy with one method of the registry (grpo, pcl, treepo, trace, ...)."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)  # the images ship kfp (the lock)
def train(
    method: str,
    data: Input[Dataset],
    index: Input[Artifact],
    warm_policy: Input[Model],
    testbed: Input[Dataset],
    train_config: str,
    gpus: int,
    nodes: int,
    platform_config: str,
    workspace: str,
    reuse: bool,
    tracking_uri: str,
    experiment: str,
    kfp_run_id: str,
    trained: Output[Model],
) -> str:
    """Train with ``method`` and return the MLflow run id.

    ``train_config`` is the trainer's TrainConfig (JSON), the single config source; the step sets
    the method, the inputs' paths and the tracking target. Where it runs: in this process on CPU
    or one GPU; with ``gpus > 1`` DeepSpeed over ``torchrun`` in this pod; with ``nodes > 1`` a
    Training Operator PyTorchJob (``pipelines/pytorchjob.py``) that this step launches and
    follows. ``{testbed}`` in the config's file paths (the RL pool, the predictor's warm-up split)
    is the warm-start step's testbed folder. The output holds ``policy/``, ``summary.json`` (final
    metrics, cost fractions, pool success, warm-up), ``history.json`` (every step's metrics),
    ``allocations/`` (each step's root allocation) and ``cost_breakdown.txt``; the MLflow run
    carries the lineage tags."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from trace_core.lineage import StageCache, code_digest, copy_tree, fingerprint, lineage_tags

    raw = json.loads(train_config)
    # What defines the result: everything but where things are and where the run is logged.
    defining = {k: v for k, v in raw.items() if k not in ("output_dir", "policy_model", "tracking", "progress")}
    defining["task"] = {k: v for k, v in raw["task"].items() if k not in ("data_dir", "index_dir", "train_file")}
    code = code_digest("trace_core.training", "trace_core.rollout", "trace_core.predictor", "trace_core.envs",
                       "trace_core.allocation", "trace_core.advantages", "trace_core.metrics", "trace_core.tree")
    defining["predictor_warmup"] = {k: v for k, v in raw["predictor_warmup"].items() if k != "task_file"}
    defining["predictor_warmup"]["on"] = raw["predictor_warmup"]["task_file"] is not None
    fp = fingerprint("train", method, defining, warm_policy.metadata["fingerprint"], data.metadata["fingerprint"],
                     index.metadata["fingerprint"], testbed.metadata.get("fingerprint", ""), gpus, nodes, code)
    stage = f"train-{method}"
    cache = StageCache(workspace, enabled=reuse)
    record = cache.lookup(stage, fp)
    if record is None:
        import yaml

        from trace_core.config import flatten, from_dict, to_dict
        from trace_core.tracking import MLflowTracker
        from trace_core.training.config import TrainConfig

        work = cache.start(stage, fp, resume=True)  # a rerun after a crash resumes from the checkpoints
        run_dir = work / "run"
        raw.update(method=method, output_dir=str(run_dir), policy_model=warm_policy.path, progress=False)
        def place(path):  # "{testbed}/pool.jsonl" -> this run's testbed folder
            return None if path is None else path.replace("{testbed}", testbed.path)

        raw["task"].update(data_dir=data.path, index_dir=index.path, train_file=place(raw["task"]["train_file"]))
        raw["predictor_warmup"]["task_file"] = place(raw["predictor_warmup"]["task_file"])
        raw["tracking"].update(tracking_uri=tracking_uri, experiment=experiment, run_name=method,
                               spool_dir=str(run_dir / "spool"))
        cfg = from_dict(TrainConfig, raw)
        tags = {"method": method, "task": cfg.task.family, "pipeline.step": "train",
                **lineage_tags(dvc_data_hash=data.metadata.get("dvc_md5", ""), kfp_run_id=kfp_run_id, config=defining)}
        bed_file = Path(testbed.path) / "testbed.json"
        if bed_file.is_file():  # the testbed's hash goes with every result on it
            tags["testbed.hash"] = json.loads(bed_file.read_text())["hash"]
        run_dir.mkdir(parents=True, exist_ok=True)
        config_file = run_dir / "train_config.yaml"
        config_file.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        if nodes > 1:
            home = os.environ.get("TRACE_RL_HOME", "/opt/trace-rl")  # the image's source checkout
            sys.path.insert(0, home)
            from pipelines.pytorchjob import pytorchjob_manifest, run_pytorchjob

            plat = json.loads(platform_config)
            name = f"trace-rl-{method}-{fp[:10]}".replace("_", "-").lower()
            image = os.environ.get("TRACE_RL_TRAIN_IMAGE") or os.environ["TRACE_RL_IMAGE"]
            run_pytorchjob(pytorchjob_manifest(
                name, image, str(config_file), nodes, max(gpus, 1),
                namespace=plat["namespace"], workspace_mount=plat["workspace_mount"],
                checkpoints_pvc=plat["checkpoints_pvc"], accelerator_type=plat["accelerator_type"],
                node_selector=plat["train_node_selector"], tolerations=plat["train_tolerations"],
                cpu=plat["train_cpu"], memory=plat["train_memory"], service_account=plat["service_account"],
                config_map=plat["config_map"]))
        elif gpus > 1:
            subprocess.run(["torchrun", "--standalone", f"--nproc-per-node={gpus}", "-m", "trace_core.cli",
                            "train", "--config", str(config_file)], check=True)
        else:
            from trace_core.training.trainer import Trainer

            tracker = MLflowTracker(cfg.tracking, tags=tags)  # resumes the run recorded in the spool, if any
            tracker.log_params(flatten(cfg))
            Trainer(cfg, tracker=tracker).run()
        summary = json.loads((run_dir / "summary.json").read_text())
        latest = (run_dir / "checkpoints" / "latest").read_text().strip()
        state = json.loads((run_dir / "checkpoints" / latest / "trainer_state.json").read_text())
        (run_dir / "history.json").write_text(json.dumps(state["history"]))  # every step's metrics
        if nodes > 1 or gpus > 1:  # the trainer's own run: add the lineage tags to it
            from dataclasses import replace

            late = MLflowTracker(replace(cfg.tracking, spool_dir=str(work / "tag-spool")), run_id=summary["run_id"])
            late.set_tags(tags)
            late.flush()
        record = cache.commit(stage, fp, {"run_id": summary["run_id"], "method": method})
    run_dir = cache.entry(stage, fp) / "run"
    for name in ("policy", "summary.json", "history.json", "cost_breakdown.txt", "train_config.yaml", "allocations"):
        copy_tree(run_dir / name, Path(trained.path) / name)
    trained.metadata.update({"fingerprint": fp, "method": method, "run_id": record["run_id"],
                             "dvc_md5": data.metadata.get("dvc_md5", "")})
    return record["run_id"]
