"""The step planner: one owner of a step's decisions for the trainer, the simulator and the plug-ins."""

from __future__ import annotations

import numpy as np
import pytest

from trace_core.allocation import BudgetSpec
from trace_core.costs import CostModel
from trace_core.history import PromptHistory
from trace_core.methods import get_method
from trace_core.planner import StepPlanner
from trace_core.token_ledger import TokenLedger

SPEC = BudgetSpec(16, 1, group_size_G=4, max_per_prompt=8, pool_factor=2)


def _planner(name: str, spec: BudgetSpec = SPEC, history: PromptHistory | None = None) -> StepPlanner:
    return StepPlanner(get_method(name), spec, TokenLedger(CostModel()), history)


def _pool(seed: int = 0) -> tuple[np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    return rng.uniform(0.05, 0.95, SPEC.pool_size), [f"q{i}" for i in range(SPEC.pool_size)]


@pytest.mark.parametrize("name", ["grpo", "pcl", "trace", "trace-posterior"])
def test_roots_are_the_methods_own_rule(name):
    v, ids = _pool()
    plan = _planner(name, history=PromptHistory()).plan_roots(v, ids, 0, np.random.default_rng(3))
    direct = get_method(name).allocate_roots(v, SPEC, np.random.default_rng(3), history=PromptHistory().view(ids, 0)
                                             if get_method(name).reads_history else None)
    np.testing.assert_array_equal(plan.m, direct)
    assert plan.token_plan is None and plan.tokens is None and plan.spec == SPEC
    assert plan.root_cost.shape == (SPEC.pool_size,) and np.all(plan.root_cost > 0)


def test_prefix_budget_is_m_times_n_and_zero_without_expansion():
    assert _planner("trace").prefix_budget(4) == 4 * SPEC.expansion_N
    assert _planner("grpo").prefix_budget(4) == 0


def test_a_uniform_method_at_a_token_budget_buys_whole_groups():
    spec = BudgetSpec(16, 1, group_size_G=4, max_per_prompt=8, pool_factor=2, tokens_per_step=3 * 4 * 512)
    v, ids = _pool()
    plan = _planner("grpo", spec).plan_roots(v, ids, 0, np.random.default_rng(0))
    # a fresh ledger prices every rollout at the cost model's first guess (512 tokens)
    assert int(plan.m.sum()) == 12 and set(plan.m[plan.m > 0].tolist()) == {4}
    assert plan.spec.expansion_N == 0 and plan.spec.roots_M == 12


def test_a_token_priced_plan_carries_each_prompts_allowance():
    spec = BudgetSpec(16, 1, group_size_G=4, max_per_prompt=8, pool_factor=2, tokens_per_step=20 * 512)
    v, ids = _pool()
    planner = _planner("trace-tokens", spec)
    plan = planner.plan_roots(v, ids, 0, np.random.default_rng(0))
    assert plan.token_plan is not None and plan.tokens is not None and plan.m.sum() > 0
    i = int(np.flatnonzero(plan.m)[0])
    reserved, cost = float(plan.token_plan.reserved[i]), float(plan.root_cost[i])
    # roots that ran 100 tokens short of their estimate leave those 100 to the prefixes
    assert plan.tokens.allowance(i, plan.m[i], cost * plan.m[i] - 100) == pytest.approx(reserved + 100)
    figures = planner.token_figures(plan, extra_roots=3)
    assert figures["tokens/budget"] == spec.tokens_per_step and figures["tokens/extra_roots"] == 3.0
    assert planner.token_figures(_planner("grpo").plan_roots(v, ids, 0, np.random.default_rng(0)), 0) == {}


def test_bad_plans_are_refused_naming_the_rule():
    with pytest.raises(ValueError, match="the budget needs tokens_per_step"):
        _planner("trace-tokens")
    tokens = BudgetSpec(16, 1, group_size_G=4, max_per_prompt=8, pool_factor=2, tokens_per_step=100)
    with pytest.raises(ValueError, match="under a token budget a method is token-priced"):
        _planner("trace", tokens)
    with pytest.raises(ValueError, match="under a token budget a method is token-priced"):
        _planner("dapo", tokens)
    v, ids = _pool()
    with pytest.raises(ValueError, match="buys no group of 2 rollouts"):
        _planner("trace-tokens", tokens).plan_roots(v, ids, 4, np.random.default_rng(0))


def test_root_outcomes_count_successes_by_the_binarisation_rule():
    planner = _planner("trace-posterior", history=PromptHistory())
    # a partial reward above 0.5 is a success, one below a failure (not summed as raw rewards)
    planner.record_root_outcomes(0, ["a", "b"], [np.array([0.7, 0.3, 1.0]), np.array([0.0, 0.4])],
                                 np.array([0.5, 0.2]))
    a, = planner.history.events("a")
    b, = planner.history.events("b")
    assert (a.successes, a.failures) == (2, 1) and (b.successes, b.failures) == (0, 2)


def test_a_restored_planner_plans_what_the_original_would():
    v, ids = _pool()
    original = _planner("trace-posterior", history=PromptHistory())
    for step in range(3):
        plan = original.plan_roots(v, ids, step, np.random.default_rng(step))
        chosen = np.flatnonzero(plan.m)
        rewards = [np.random.default_rng([step, int(i)]).binomial(1, v[i], plan.m[i]).astype(float) for i in chosen]
        original.record_root_outcomes(step, [ids[i] for i in chosen], rewards, v[chosen])
    restored = _planner("trace-posterior", history=PromptHistory())
    restored.load_state_dict(original.state_dict())
    fresh = _planner("trace-posterior", history=PromptHistory())
    after = original.plan_roots(v, ids, 3, np.random.default_rng(9)).m
    np.testing.assert_array_equal(restored.plan_roots(v, ids, 3, np.random.default_rng(9)).m, after)
    assert restored.ledger.to_dict() == original.ledger.to_dict()
    # the history is what moved the plan: a planner without it plans otherwise
    assert not np.array_equal(fresh.plan_roots(v, ids, 3, np.random.default_rng(9)).m, after)
