"""The training loop: every method for a step on a tiny model, metrics in a real MLflow server,
and a run killed with SIGKILL that resumes into the same MLflow run with no step lost or doubled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_overrides

from trace_core.config import load_config
from trace_core.methods import METHODS
from trace_core.training.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
FAULT_AREA = "trainer resume"  # the fault summary's area of the tests with `fault` (a kill, then a resume)


# a method priced in generated tokens (method §10) needs a token budget: tests/test_trainer_tokens.py
@pytest.mark.parametrize("method", sorted(n for n, m in METHODS.items() if not m.prices_tokens))
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
    if METHODS[method].samples_in_rounds:  # rounds stop at their target or the budget, never above it
        assert final["budget/trajectories"] <= cfg.budget.spec().total
    else:
        assert final["budget/trajectories"] == cfg.budget.spec().total  # equal budget for every method
    assert 0.0 <= final["effective_ratio"] <= 1.0
    if not METHODS[method].explores_roots and METHODS[method].root_rule is not METHODS["trace"].root_rule:
        # exploration is the method's own property: uniform roots stay G per selected prompt
        assert final["alloc/mean_m_selected"] == cfg.budget.group_size_G
    assert any(not torch.equal(before[k], after[k]) for k in before), "the policy weights did not change"
    run = MlflowClient(server.uri).get_run(summary["run_id"])
    assert run.data.tags["method"] == method and run.info.status == "FINISHED"
    for key in ("effective_ratio", "contrastive_yield", "predictor/loss", "cost/rollout_frac",
                "budget/generated_tokens", "budget/rollout_wall_s", "counts/contrastive_rollouts",
                "contrast/mixed_per_1k_tokens", "contrast/yield_per_1k_tokens", "contrast/mixed_per_rollout_s"):
        assert key in run.data.metrics, key
    assert run.data.params["method"] == method
    assert (tmp_path / method / "checkpoints" / "latest").read_text() == "step_000001"
    assert (tmp_path / method / "policy" / "config.json").is_file()
    # Every tree of the step is logged (one compressed JSON-lines file, lossless): recounting the
    # step's effective ratio and contrastive yield from it gives the logged values.
    from trace_core.metrics import contrastive_yield, effective_ratio
    from trace_core.tree import load_trees

    client = MlflowClient(server.uri)
    logged = [f.path for f in client.list_artifacts(summary["run_id"], "trees")]
    assert logged == ["trees/step00000.jsonl.gz"]
    trees = load_trees(client.download_artifacts(summary["run_id"], logged[0], str(tmp_path / "dl")))
    assert sum(len(t.outcomes()) for t in trees) == final["budget/trajectories"]
    assert effective_ratio(trees) == pytest.approx(run.data.metrics["effective_ratio"])
    # a group filter's drops yield nothing: the allocation record says which trees were trained on
    record = json.loads((tmp_path / method / "allocations" / "step00000.json").read_text())
    assert len(record["kept"]) == len(trees)
    trained = [t for t, kept in zip(trees, record["kept"], strict=True) if kept]
    adv = iter(METHODS[method].advantage_estimator(cfg.advantage)(trained))
    all_adv = [next(adv) if t in trained else np.zeros(len(t.nodes)) for t in trees]
    recount = contrastive_yield(trees, all_adv)
    assert recount == pytest.approx(run.data.metrics["contrastive_yield"])
    # per token and per rollout second: the mixed groups trained on and the rollouts with a signal,
    # over every token the trees hold and the rollout phase's wall time
    from trace_core.metrics import contrast_counts

    tokens = sum(t.num_generated_tokens() for t in trees)
    assert tokens == final["budget/generated_tokens"] > 0
    mixed, useful = contrast_counts(trained).mixed, contrast_counts(trees, all_adv).contrastive
    logged = run.data.metrics
    assert logged["counts/contrastive_rollouts"] == useful
    assert logged["contrast/mixed_per_1k_tokens"] == pytest.approx(1000 * mixed / tokens)
    assert logged["contrast/yield_per_1k_tokens"] == pytest.approx(1000 * useful / tokens)
    assert logged["budget/rollout_wall_s"] > 0
    assert logged["contrast/mixed_per_rollout_s"] == pytest.approx(mixed / logged["budget/rollout_wall_s"])


def test_killed_run_resumes_the_same_mlflow_run(tiny_models, server, tmp_path, fault) -> None:
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
    fault.records([0, 1, 2, 3, 4, 5], steps)
    assert steps == [0, 1, 2, 3, 4, 5], f"steps logged: {steps} (killed after step {killed_at})"
    assert client.get_run(run_id).info.status == "FINISHED"
    # the per-step figures: appended once per step across the kill, none inside a checkpoint
    lines = [json.loads(line) for line in (out / "step_history.jsonl").read_text().splitlines()]
    assert [rec["step"] for rec in lines] == [0, 1, 2, 3, 4, 5]
    state = json.loads((out / "checkpoints" / "step_000006" / "trainer_state.json").read_text())
    assert state["history"] == {}


def _spy_on_history(trainer, seen: list) -> None:
    """Make ``trainer``'s root rule record each history view it is given, then decide as before."""
    import dataclasses

    rule = trainer.method.root_rule

    class Spy:
        reads_history = True

        def __call__(self, v, spec, rng, history):
            seen.append(history)
            return rule(v, spec, rng, history)

    trainer.method = trainer.planner.method = dataclasses.replace(trainer.method, root_rule=Spy())


def test_prompt_history_feeds_the_root_rule_and_survives_a_resume(vllm_engine, tiny_models, server,
                                                                   tmp_path, fault) -> None:
    """trace-posterior (a root rule that reads history and also expands): each step's view holds the bare root
    outcomes of the earlier steps, as the logged trees show them, with the predictions the
    allocator used; a resumed trainer continues with the same history. The same run checks the
    predictor's prefix floor and its random-anchor diagnostic."""
    import json

    from trace_core.training.trainer import Trainer
    from trace_core.tree import load_trees

    out = tmp_path / "posterior"
    # 8 prompts and a pool of 8: every prompt is a candidate at every step, so histories grow
    overrides = [*tiny_overrides(tiny_models[0], out, server.uri, "trace-posterior", steps=2),
                 "task.envs.fixed_turns.prompts=8", "budget.pool_factor=2"]
    seen: list = []
    try:
        first = Trainer(load_config(TrainConfig, None, overrides), engine=vllm_engine)
        _spy_on_history(first, seen)
        first.run()
        saved = first.planner.history
        resumed = Trainer(load_config(TrainConfig, None, [*overrides, "steps=3"]), engine=vllm_engine)
        assert resumed.state.step == 2
        fault.check("prompt-history records", 1, int(resumed.planner.history == saved))
        assert resumed.planner.history == saved and len(saved) > 0  # read back from the checkpoint
        _spy_on_history(resumed, seen)
        resumed.run()
    finally:
        vllm_engine.load_weights(str(tiny_models[0]))
    history = resumed.planner.history
    assert [view.step for view in seen] == [0, 1, 2]
    for step in range(3):
        alloc = json.loads((out / "allocations" / f"step{step:05d}.json").read_text())
        trees = load_trees(out / "trees" / f"step{step:05d}.jsonl.gz")
        v = dict(zip(alloc["pool"], alloc["v"], strict=True))
        for tree in trees:  # the event of this step: bare outcomes only, with the allocation's prediction
            (event,) = [e for e in history.events(tree.prompt_id) if e.step == step]
            bare = [tree.trajectory_reward(b.id) > 0.5 for b in tree.bare_trajectories()]
            assert (event.successes, event.failures) == (sum(bare), len(bare) - sum(bare))
            assert event.prediction == pytest.approx(v[tree.prompt_id])
            assert any(t.kind == "continuation" for t in tree.trajectories) or not tree.anchors()
        # what the rule saw at this step: one event per earlier step in which the prompt was sampled
        expected = [sum(1 for e in history.events(pid) if e.step < step) for pid in alloc["pool"]]
        assert seen[step].count.tolist() == expected
        metrics = {k: vals[step] for k, vals in resumed.state.history.items()}
        # the unbiased prefix diagnostic: one random anchor per bare rollout with an internal node
        eligible = sum(1 for t in trees for b in t.bare_trajectories() if len(b.nodes) >= 2)
        assert eligible > 0 and metrics["predictor/prefix_random_anchors"] == eligible
        assert "predictor/prefix_spearman_random_anchor" in metrics
        assert metrics["predictor/prefix_spearman_expanded_anchors"] == pytest.approx(
            metrics["predictor/oos_spearman_prefix"], nan_ok=True)
        # the prefix floor: the 6% share of 8 roots is under one example; the floor gives more
        floor = min(resumed.cfg.predictor.min_prefix_examples, metrics["predictor/n_prefix_candidates"])
        assert floor > 1 and metrics["predictor/n_prefixes"] >= floor
    assert max(len(history.events(pid)) for pid in alloc["pool"]) >= 2


def test_capped_dapo_spends_at_most_the_budget_and_counts_its_dropped_groups(vllm_engine, tiny_models, server,
                                                                             tmp_path) -> None:
    from trace_core.metrics import effective_ratio
    from trace_core.rollout.env import FixedTurnsEnvironment
    from trace_core.training.trainer import Trainer
    from trace_core.tree import load_trees

    out = tmp_path / "dapo-capped"  # the budget-capped variant (published DAPO spends what its rounds sample)
    cfg = load_config(TrainConfig, None, [*tiny_overrides(tiny_models[0], out, server.uri, "dapo-capped", steps=2),
                                          "budget.pool_factor=2"])
    try:
        trainer = Trainer(cfg, engine=vllm_engine)
        # mostly failures: most groups are of one outcome, so the filter has groups to drop
        trainer.executor.env_factory = lambda task: FixedTurnsEnvironment(num_turns=3, success_rate=0.15)
        trainer.run()
    finally:
        vllm_engine.load_weights(str(tiny_models[0]))
    total, dropped_seen = cfg.budget.spec().total, 0
    for step in range(2):
        metrics = {k: vals[step] for k, vals in trainer.state.history.items()}
        trees = load_trees(out / "trees" / f"step{step:05d}.jsonl.gz")
        record = json.loads((out / "allocations" / f"step{step:05d}.json").read_text())
        dropped = [t for t, kept in zip(trees, record["kept"], strict=True) if not kept]
        assert [t.prompt_id for t in dropped] == record["dropped"]
        kept = [t for t in trees if t not in dropped]
        spent = sum(len(t.outcomes()) for t in trees)  # dropped groups included
        assert spent == metrics["budget/trajectories"] == metrics["counts/rollouts"] <= total
        assert metrics["counts/dropped_groups"] == len(dropped)
        assert metrics["counts/dropped_rollouts"] == sum(len(t.outcomes()) for t in dropped)
        assert metrics["alloc/rounds"] == len(trees)  # one prompt a round at this size
        mixed_kept = sum(0 < sum(t.outcomes() > 0.5) < len(t.outcomes()) for t in kept)
        assert mixed_kept == len(kept) == metrics["counts/mixed_groups_trained"]  # only mixed groups are trained
        # the price of a mixed group and the effective ratio count every rollout spent
        assert metrics["effective_ratio"] == pytest.approx(effective_ratio(trees))
        if mixed_kept:
            assert metrics["rollouts_per_mixed_group"] == pytest.approx(spent / mixed_kept)
        if spent < total:  # stopping short means the target of mixed groups was reached
            assert mixed_kept == trainer.method.group_filter.target_groups(cfg.budget.spec())
        dropped_seen += len(dropped)
    assert dropped_seen > 0


def test_heldout_pass_at_1_is_measured_at_its_steps_on_questions_outside_the_pool(vllm_engine, tiny_models, server,
                                                                                  tmp_path) -> None:
    """The held-out measurement: k rollouts of every held-out question before step 0 (the curve's
    k) and after the last step (the end's k), one sampling seed (the same policy gives the same
    counts), its counts on disk and its pass@1 in MLflow; a held-out file sharing a question with
    the pool is refused up front.
    Pool success, measured beside it, is the mean over the pool of each prompt's success share."""
    from mlflow.tracking import MlflowClient

    from trace_core.config import ConfigError
    from trace_core.data.chains import ChainConfig, generate
    from trace_core.training.trainer import Trainer

    split = generate(ChainConfig(n_warm=4, n_pool=16, n_heldout=5, seed=3))
    files = {}
    for name in ("pool", "heldout"):
        files[name] = tmp_path / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(e.to_record()) + "\n" for e in split[name]))
    overrides = [o for o in tiny_overrides(tiny_models[0], tmp_path / "run", server.uri, "grpo")
                 if not o.startswith("task.")] + [
        "task.family=math", f"task.train_file={files['pool']}", "predictor.task_family=math",
        "heldout.curve_samples=2", "pool_success.samples=2", f"heldout.task_file={files['heldout']}",
        "heldout.samples=3", "heldout.at_steps=[0]"]
    cfg = load_config(TrainConfig, None, overrides)
    try:
        summary = Trainer(cfg, engine=vllm_engine).run()
    finally:
        vllm_engine.load_weights(str(tiny_models[0]))
    assert [r["step"] for r in summary["heldout"]] == [0.0, 1.0]
    start = json.loads((tmp_path / "run" / "heldout" / "step00000.json").read_text())
    # before the end at heldout.curve_samples = 2, the end at heldout.samples = 3
    assert sorted(start["successes"]) == sorted(e.id for e in split["heldout"]) and start["samples"] == 2
    assert start["rollouts"] == 10 and all(0 <= c <= 2 for c in start["successes"].values())
    assert start["pass_at_1"] == sum(start["successes"].values()) / 10
    end = json.loads((tmp_path / "run" / "heldout" / "step00001.json").read_text())
    assert end["samples"] == 3 and end["rollouts"] == 15 and end["pass_at_1"] == sum(end["successes"].values()) / 15
    metrics = MlflowClient(server.uri).get_metric_history(summary["run_id"], "heldout/pass_at_1")
    assert sorted(m.step for m in metrics) == [0, 1]
    pool = json.loads((tmp_path / "run" / "pool_success" / "step00000.json").read_text())
    assert sorted(pool["per_prompt"]) == sorted(e.id for e in split["pool"]) and pool["samples"] == 2
    assert set(pool["per_prompt"].values()) <= {0.0, 0.5, 1.0} and pool["rollouts"] == 32
    assert pool["success"] == float(np.mean(list(pool["per_prompt"].values())))
    assert [r["step"] for r in summary["pool_success"]] == [0.0, 1.0]

    (tmp_path / "mixed.jsonl").write_text(files["heldout"].read_text() + files["pool"].read_text().splitlines()[0])
    bad = load_config(TrainConfig, None, [*overrides[:-3], f"heldout.task_file={tmp_path / 'mixed.jsonl'}",
                                          f"output_dir={tmp_path / 'bad'}"])
    with pytest.raises(ConfigError, match=r"heldout.task_file .*mixed.jsonl shares 1 questions with the training pool"):
        Trainer(bad, engine=vllm_engine)
