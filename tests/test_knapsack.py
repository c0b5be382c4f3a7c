"""Knapsack-RL's rollout budgets: hand-worked allocations, the dynamic programme against brute
force, the exact budget, and the registry method in the simulator."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_core.allocation import BudgetSpec, roots_uniform_all
from trace_core.history import HistoryView, PromptHistory
from trace_core.knapsack import (
    KnapsackConfig,
    KnapsackRoots,
    expected_cost,
    knapsack_budgets,
    knapsack_extra_rollouts,
    knapsack_value,
    success_estimates,
)
from trace_core.methods import get_method


def _seen(p):
    p = np.asarray(p, dtype=np.float64)
    return p, ~np.isnan(p)


def test_each_kind_of_prompt_gets_its_floor_and_the_fallback_goes_to_the_unsolved():
    # [0.5, 0.2, never solved, always solved, unseen]; 40 rollouts, n = 8, cap 16
    p, seen = _seen([0.5, 0.2, 0.0, 1.0, np.nan])
    m = knapsack_budgets(p, seen, 40, 8, 16)
    # floors 2 + 2 + 2 + 2 and the unseen prompt's 8: 24 left. At α = 0.9 the two effective prompts
    # need int(3.32) + int(10.32) = 13, so 24 − 13 = 11 fall back to the never-solved prompt.
    assert expected_cost(np.array([0.5, 0.2]), 0.9).astype(int).tolist() == [3, 10]
    assert m[2] == 2 + 11 and m[3] == 2 and m[4] == 8
    assert m[0] + m[1] == 4 + 13 and m.sum() == 40
    # the 13 go where the knapsack values them: checked against every split
    best = max(range(14), key=lambda k: (knapsack_value(0.5, 2 + k) + knapsack_value(0.2, 2 + 13 - k), -k))
    assert (m[0], m[1]) == (2 + best, 2 + 13 - best)


def test_without_fallback_the_knapsack_spends_everything_left():
    p, seen = _seen([0.5, 0.2, 0.0, 1.0, np.nan])
    m = knapsack_budgets(p, seen, 40, 8, 16, KnapsackConfig(allow_fallback=False))
    assert m[2] == 2 and m[3] == 2 and m[4] == 8 and m[0] + m[1] == 28 and m.sum() == 40


def test_no_effective_prompt_gives_the_rest_to_the_unsolved_evenly():
    p, seen = _seen([0.0, 1.0, 0.0, 0.0])
    m = knapsack_budgets(p, seen, 32, 8, 16)
    # floors 2 each: 24 left over three never-solved prompts, 8 each
    assert m.tolist() == [10, 2, 10, 10]
    # floors 8, 25 left over two never-solved prompts: 12 each and the remainder to the first
    m = knapsack_budgets(*_seen([0.0, 1.0, 0.0, 1.0]), 33, 8, 16)
    assert m.tolist() == [15, 2, 14, 2]


def test_all_solved_or_unseen_prompts_get_n_each():
    assert knapsack_budgets(*_seen([1.0, np.nan, 1.0]), 24, 8, 16).tolist() == [8, 8, 8]
    assert knapsack_budgets(*_seen([np.nan] * 4), 32, 8, 16).tolist() == [8, 8, 8, 8]


def test_what_the_caps_leave_is_spread_over_the_effective_prompts():
    # two effective prompts capped at 4 can hold 8 of 20 rollouts beyond the unseen one's 8
    m = knapsack_budgets(*_seen([0.5, 0.5, np.nan]), 28, 8, 4, KnapsackConfig(allow_fallback=False))
    assert m.tolist() == [10, 10, 8]


def test_floors_beyond_the_batch_are_refused_naming_them():
    with pytest.raises(ValueError, match="the floors ask 24 rollouts of a batch of 16"):
        knapsack_budgets(*_seen([np.nan, np.nan, np.nan]), 16, 8, 16)
    with pytest.raises(ValueError, match="max_n = 1 is below min_n = 2"):
        KnapsackConfig(max_n=1)
    with pytest.raises(ValueError, match="alpha"):
        KnapsackConfig(alpha=1.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.01, 0.99), min_size=1, max_size=4), st.integers(2, 3), st.integers(3, 6),
       st.integers(0, 14))
def test_the_dynamic_programme_is_the_brute_force_optimum(p, floor, cap, budget):
    p = np.array(p)
    extra = knapsack_extra_rollouts(p, floor, cap, budget)
    room = cap - floor
    feasible = min(budget, room * p.size)
    assert extra.sum() == feasible and np.all((extra >= 0) & (extra <= room))
    best = max(sum(knapsack_value(pi, floor + k) for pi, k in zip(p, ks, strict=True))
               for ks in itertools.product(range(room + 1), repeat=p.size) if sum(ks) == feasible)
    got = sum(knapsack_value(pi, floor + int(k)) for pi, k in zip(p, extra, strict=True))
    assert got == pytest.approx(best, rel=1e-12, abs=1e-15)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0, float("nan")]), min_size=1, max_size=8),
       st.integers(4, 8), st.booleans())
def test_the_budget_is_met_exactly(p, n, fallback):
    p, seen = _seen(p)
    total = n * p.size
    m = knapsack_budgets(p, seen, total, n, 2 * n, KnapsackConfig(allow_fallback=fallback))
    assert m.sum() == total and np.all(m >= 0)


def test_the_estimate_reads_the_newest_window_of_root_groups():
    history = PromptHistory()
    history.record(0, ["a", "b"], [0, 3], [4, 1], [0.5, 0.5])
    history.record(1, ["a"], [2], [2], [0.5])
    view = history.view(["a", "b", "c"], 2)
    p, seen = success_estimates(view.successes[:, :1], view.failures[:, :1])
    assert p[:2].tolist() == [0.5, 0.75] and seen.tolist() == [True, True, False]
    p, _ = success_estimates(view.successes[:, :2], view.failures[:, :2])
    assert p[0] == pytest.approx(2 / 8)


def test_without_history_it_is_grpo_on_the_same_prompts():
    spec = BudgetSpec(16, 1, group_size_G=4, max_per_prompt=8, pool_factor=2)
    v = np.full(spec.pool_size, 0.5)
    m = KnapsackRoots()(v, spec, np.random.default_rng(4), HistoryView.empty(spec.pool_size))
    np.testing.assert_array_equal(m, roots_uniform_all(v, spec, np.random.default_rng(4)))


def test_the_registry_method_runs_in_the_simulator_at_the_equal_budget():
    from trace_core.sim import OraclePredictor, PersistentPool, SimConfig, run_step

    spec = BudgetSpec(32, 1, group_size_G=8, max_per_prompt=16, pool_factor=2)
    method = get_method("knapsack-rl")
    assert method.root_rule.reads_history and not method.expands
    pool, history = PersistentPool(spec.pool_size, SimConfig(), seed=3), PromptHistory()
    spread = []
    for s in range(6):
        result = run_step(method, spec, OraclePredictor(), np.random.default_rng([5, s]), pool=pool,
                          history=history)
        assert result.trajectories == spec.total
        spread.append(len(set(result.pool_m[result.pool_m > 0].tolist())))
    assert max(spread) > 1  # once prompts recur, the budgets differ by prompt
