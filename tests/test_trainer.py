"""The training loop: every method for a step on a tiny model, metrics in a real MLflow server,
and a run killed with SIGKILL that resumes into the same MLflow run with no step lost or doubled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from trace_core.allocation import METHODS
from trace_core.config import load_config
from trace_core.training.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]


def tiny_overrides(model_dir: Path, out: Path, uri: str, method: str, steps: int = 1) -> list[str]:
    return [
        f"method={method}", f"steps={steps}", f"policy_model={model_dir}", f"output_dir={out}",
        "task.family=fixed-turns", "task.fixed_turns=3", "task.synthetic_prompts=16",
        "budget.roots_M=8", "budget.expansion_N=1", "budget.group_size_G=4", "budget.max_per_prompt=4",
        "budget.pool_factor=1", "agent.max_new_tokens=8", "agent.max_total_tokens=1024",
        "engine.max_model_len=1024", "engine.kv_cache_mb=64", "policy.lr=1e-3", "policy.micro_batches=1",
        "predictor.tiny_hidden_size=32", "predictor.tiny_intermediate_size=64", "progress=false",
        f"tracking.tracking_uri={uri}", "tracking.experiment=trainer-tests", "tracking.retry_interval_s=0",
    ]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_each_method_trains_one_step(method, vllm_engine, tiny_models, server, tmp_path) -> None:
    from mlflow.tracking import MlflowClient

    from trace_core.training.trainer import Trainer

    overrides = tiny_overrides(tiny_models[0], tmp_path / method, server.uri, method)
    cfg = load_config(TrainConfig, None, [*overrides, "predictor.explore_fraction=0.25"])
    trainer = Trainer(cfg, engine=vllm_engine)
    before = {k: v.clone() for k, v in trainer.policy.full_state_dict().items()}
    try:
        summary = trainer.run()
        after = trainer.policy.full_state_dict()
    finally:
        vllm_engine.load_weights(str(tiny_models[0]))  # the session engine goes back to seed 0
    final = summary["final"]
    assert np.isfinite(final["policy/policy_loss"]) and np.isfinite(final["predictor/loss"])
    assert final["budget/trajectories"] == cfg.budget.spec().total  # equal budget for every method
    assert 0.0 <= final["effective_ratio"] <= 1.0
    if not METHODS[method].explores_roots and METHODS[method].root_rule is not METHODS["trace"].root_rule:
        # exploration is the method's own property: uniform roots stay G per selected prompt
        assert final["alloc/mean_m_selected"] == cfg.budget.group_size_G
    assert any(not torch.equal(before[k], after[k]) for k in before), "the policy weights did not change"
    run = MlflowClient(server.uri).get_run(summary["run_id"])
    assert run.data.tags["method"] == method and run.info.status == "FINISHED"
    for key in ("effective_ratio", "contrastive_yield", "predictor/loss", "cost/rollout_frac",
                "budget/generated_tokens"):
        assert key in run.data.metrics, key
    assert run.data.params["method"] == method
    assert (tmp_path / method / "checkpoints" / "latest").read_text() == "step_000001"
    assert (tmp_path / method / "policy" / "config.json").is_file()
    # Every tree of the step is logged (one compressed JSON-lines file, lossless): recounting the
    # step's effective ratio and contrastive yield from it gives the logged values.
    from trace_core.advantages import get_advantage_estimator
    from trace_core.metrics import contrastive_yield, effective_ratio
    from trace_core.tree import load_trees

    client = MlflowClient(server.uri)
    logged = [f.path for f in client.list_artifacts(summary["run_id"], "trees")]
    assert logged == ["trees/step00000.jsonl.gz"]
    trees = load_trees(client.download_artifacts(summary["run_id"], logged[0], str(tmp_path / "dl")))
    assert sum(len(t.outcomes()) for t in trees) == cfg.budget.spec().total
    assert effective_ratio(trees) == pytest.approx(run.data.metrics["effective_ratio"])
    recount = contrastive_yield(trees, get_advantage_estimator(cfg.advantage)(trees))
    assert recount == pytest.approx(run.data.metrics["contrastive_yield"])


def test_killed_run_resumes_the_same_mlflow_run(tiny_models, server, tmp_path) -> None:
    from mlflow.tracking import MlflowClient

    out = tmp_path / "resume"
    args = [sys.executable, "-m", "trace_core.cli", "train", "engine.kind=hf",
            *tiny_overrides(tiny_models[0], out, server.uri, "trace", steps=6)]
    launcher_vars = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher_vars}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    latest = out / "checkpoints" / "latest"
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline and proc.poll() is None:  # kill it once 2 steps are durable
        if latest.is_file() and latest.read_text().startswith("step_") and int(latest.read_text()[5:]) >= 2:
            break
        time.sleep(0.05)
    first_log = (tmp_path / "first.log").read_text()[-2000:]
    assert proc.poll() is None, "the run ended before it could be killed: " + first_log
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = int(latest.read_text()[5:])
    assert killed_at < 6
    resumed = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    client = MlflowClient(server.uri)
    runs = client.search_runs([client.get_experiment_by_name("trainer-tests").experiment_id],
                              filter_string="tags.method = 'trace'")
    run_ids = {r.info.run_id for r in runs if r.data.params.get("output_dir") == str(out)}
    assert len(run_ids) == 1, "the resumed run must continue the same MLflow run"
    (run_id,) = run_ids
    steps = sorted(m.step for m in client.get_metric_history(run_id, "effective_ratio"))
    assert steps == [0, 1, 2, 3, 4, 5], f"steps logged: {steps} (killed after step {killed_at})"
    assert client.get_run(run_id).info.status == "FINISHED"
