"""The token budget (method §10) in the trainer: ``trace-tokens`` plans its roots and reservations
in generated tokens and spends each prompt's allowance through the executor; a uniform method at
a token budget rolls out the groups the budget buys; every step logs its cost estimates beside
what the rollouts generated; the ledger survives a resume. A tiny policy on the session's vLLM
engine, metrics in a real MLflow server."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import tiny_overrides

from trace_core.config import ConfigError, load_config
from trace_core.token_ledger import COST_FIGURES
from trace_core.training.config import TrainConfig
from trace_core.tree import ROOT, load_trees

# tiny_overrides: 3-turn episodes of at most agent.max_new_tokens = 8 tokens a turn (the random
# policy writes all 8), so a first guess of 40 tokens a rollout is wrong and the ledger must learn
FIRST_GUESS = 40  # costs.initial_tokens below, within the cap of agent.max_new_tokens × agent.max_turns
BUDGET = 400  # generated tokens per step: 10 rollouts at the first guess


def overrides(model, out, uri, method, steps, budget=BUDGET):
    return [*tiny_overrides(model, out, uri, method, steps=steps), f"budget.tokens_per_step={budget}",
            f"costs.initial_tokens={FIRST_GUESS}", "costs.initial_turns=3"]


def test_trace_tokens_plans_in_tokens_spends_allowances_and_keeps_its_ledger_across_a_resume(
        vllm_engine, tiny_models, server, tmp_path) -> None:
    from mlflow.tracking import MlflowClient

    from trace_core.training.trainer import Trainer

    out = tmp_path / "trace-tokens"
    cfg = load_config(TrainConfig, None, overrides(tiny_models[0], out, server.uri, "trace-tokens", steps=2))
    trainer = Trainer(cfg, engine=vllm_engine)
    try:
        summary = trainer.run()
        history = trainer.state.history
        for step in range(cfg.steps):
            # stage 1 never plans past the budget: the roots' expected tokens plus the reservations
            planned = history["tokens/planned_root_tokens"][step] + history["tokens/reserved"][step]
            assert planned <= BUDGET + 1e-9
            assert history["tokens/budget"][step] == BUDGET
            trees = load_trees(out / "trees" / f"step{step:05d}.jsonl.gz")
            allocation = json.loads((out / "allocations" / f"step{step:05d}.json").read_text())
            bare = sum(len(t.bare_trajectories()) for t in trees)
            assert bare == sum(allocation["m"]) and all(m == 0 or m >= 2 for m in allocation["m"])
            conts = sum(len(t.trajectories) for t in trees) - bare
            assert history["budget/trajectories"][step] == bare + conts
            extra = sum(c.kind == "continuation" and c.branch_node == ROOT for t in trees for c in t.trajectories)
            assert history["tokens/extra_roots"][step] == extra
            assert history["budget/generated_tokens"][step] == sum(t.num_generated_tokens() for t in trees)
            assert np.isfinite(history["tokens/root_cost_error"][step])
            assert 0.0 <= history["tokens/rho"][step] <= 1.0
        # the first step priced every root at the first guess; the second at what step 0 generated
        assert history["tokens/root_cost_expected"][0] == FIRST_GUESS
        assert history["tokens/root_cost_expected"][1] < FIRST_GUESS
        assert history["tokens/root_cost_error"][1] < history["tokens/root_cost_error"][0]
        ledger = trainer.state.token_ledger
        assert ledger is not None and ledger["costs"]["step"] == cfg.steps - 1
        run = MlflowClient(server.uri).get_run(summary["run_id"])
        for key in (*COST_FIGURES[:4], "tokens/budget", "tokens/reservation_share", "tokens/rho",
                    "contrast/mixed_per_1k_tokens"):
            assert key in run.data.metrics, key

        # a resume to a third step reads the checkpointed ledger, not a fresh one
        cfg3 = load_config(TrainConfig, None, overrides(tiny_models[0], out, server.uri, "trace-tokens", steps=3))
        resumed = Trainer(cfg3, engine=vllm_engine)
        assert resumed.planner.ledger.to_dict() == ledger
        resumed.run()
        assert resumed.state.history["tokens/root_cost_expected"][:2] == history["tokens/root_cost_expected"]
        assert resumed.state.token_ledger["costs"]["step"] == 2
    finally:
        vllm_engine.load_weights(str(tiny_models[0]))  # the session engine goes back to seed 0


def test_grpo_at_a_token_budget_rolls_out_the_groups_the_budget_buys_from_its_first_step(
        vllm_engine, tiny_models, server, tmp_path) -> None:
    from trace_core.training.trainer import Trainer

    G = 4  # tiny_overrides' group_size_G; its pool has B = 4 candidates
    budget = 2 * G * FIRST_GUESS + 10  # two groups at the first guess, not three
    cfg = load_config(TrainConfig, None, overrides(tiny_models[0], tmp_path / "grpo", server.uri, "grpo", steps=2,
                                                   budget=budget))
    trainer = Trainer(cfg, engine=vllm_engine)
    try:
        trainer.run()
    finally:
        vllm_engine.load_weights(str(tiny_models[0]))
    history = trainer.state.history
    rounds = [json.loads((tmp_path / "grpo" / "allocations" / f"step{s:05d}.json").read_text())["rounds"]
              for s in range(2)]
    # Step 0 prices at the first guess (two groups), learns the real lengths from them (shorter:
    # 3 turns of 8 tokens), and spends the rest of the budget at those: a third group in a second
    # wave, from a candidate not yet opened. Step 1 prices at the ledger in one wave.
    assert rounds == [2, 1]
    assert history["budget/trajectories"][0] > 2 * G and history["budget/trajectories"][0] % G == 0
    assert history["tokens/root_cost_expected"][0] < FIRST_GUESS  # the second wave's prices are measured
    assert history["budget/generated_tokens"][0] <= budget  # the measured prices held on this policy
    assert history["budget/trajectories"][1] % G == 0  # whole groups, however many the learned costs buy
    assert np.isnan(history["tokens/anchor_cost_error"][0])  # bare groups only: no continuation was priced
    trees = load_trees(tmp_path / "grpo" / "trees" / "step00000.jsonl.gz")
    assert len({t.prompt_id for t in trees}) == len(trees) == history["budget/trajectories"][0] // G


@pytest.mark.parametrize(("method", "extra", "message"), [
    ("trace-tokens", [], "set budget.tokens_per_step"),
    ("trace", ["budget.tokens_per_step=5000"], "expands or samples in rounds"),
    ("dapo", ["budget.tokens_per_step=5000"], "expands or samples in rounds"),
    ("grpo", ["budget.tokens_per_step=100", "costs.initial_tokens=50"], "buys no step of method 'grpo'"),
    ("trace-tokens", ["budget.tokens_per_step=60", "costs.initial_tokens=50"], "(2 rollouts) costs 100 tokens"),
])
def test_a_token_budget_a_method_cannot_spend_is_refused_when_the_configuration_loads(method, extra,
                                                                                        message) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, None, [f"method={method}", *extra])
    assert message in str(err.value) and "budget.tokens_per_step" in str(err.value)
