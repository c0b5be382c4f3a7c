"""method §2–§4 allocators against brute force, the DP, and every bad-input rule."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scipy.special import betaln

from trace_core.allocation import (
    AnchorSignals,
    BudgetSpec,
    DynamicSampling,
    DynamicSamplingConfig,
    EntropySignals,
    GresoRoots,
    PosteriorRoots,
    PrefixPlacement,
    RootRule,
    allocate_prefixes,
    allocate_prefixes_greedy,
    allocate_roots,
    allocate_roots_beta,
    allocate_roots_beta_dp,
    allocate_roots_dp,
    allocate_roots_thompson,
    beta_moments,
    check_root_budget,
    explore_roots,
    next_checked_round,
    prefix_objective,
    prefix_value,
    prefixes_trace,
    root_objective,
    root_objective_beta,
    root_unit_gains_beta,
    root_value,
    root_value_beta,
    roots_trace,
    roots_uniform_all,
)
from trace_core.history import GresoConfig, HistoryView, PosteriorConfig, PromptHistory, beta_posterior
from trace_core.methods import METHODS, Method, get_method, sample_in_rounds

# Probabilities with the edge values SPEC asks for (0, 0.5, 1) mixed with arbitrary ones.
probability = st.one_of(
    st.sampled_from([0.0, 0.5, 1.0, 0.25, 0.75]), st.floats(0.0, 1.0, allow_nan=False, allow_subnormal=False)
)
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])


def brute_force_roots(v: list[float], budget: int, max_per_prompt: int) -> float:
    choices = [0, *range(2, max_per_prompt + 1)]
    best = -np.inf
    for combo in itertools.product(choices, repeat=len(v)):
        if sum(combo) == budget:
            best = max(best, root_objective(v, combo))
    return best


def brute_force_prefixes(p: list[float], r: list[int], budget: int) -> float:
    best = -np.inf
    for combo in itertools.product(range(budget + 1), repeat=len(p)):
        if sum(combo) == budget:
            best = max(best, prefix_objective(p, r, combo))
    return best


def is_feasible_budget(n: int, budget: int, k: int) -> bool:
    try:
        check_root_budget(n, budget, k)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------- root value
def test_root_value_definition() -> None:
    assert root_value(0.3, 0) == 0.0  # not the literal −1
    assert root_value(0.3, 1) == 0.0
    assert root_value(0.5, 2) == pytest.approx(0.5)
    assert root_value(0.3, 4) == pytest.approx(1 - 0.3**4 - 0.7**4)
    assert root_value(0.0, 8) == 0.0 and root_value(1.0, 8) == 0.0


def test_spec_counterexamples_to_greedy() -> None:
    # method §2: greedy by gain per rollout picks (4, 0) = 0.875 < (2, 2) = 0.98.
    m = allocate_roots([0.5, 0.4], 4)
    assert root_objective([0.5, 0.4], m) == pytest.approx(0.98)
    # Greedy by step gain picks (3, 2) = 0.93 < (5, 0) = 0.9375.
    m = allocate_roots([0.5, 0.1], 5)
    assert root_objective([0.5, 0.1], m) == pytest.approx(0.9375)
    assert m.tolist() == [5, 0]


def test_tie_rule_prefers_fewer_activated_prompts() -> None:
    # (3, 3, 0) over (2, 2, 2): both 6·v(1−v).
    m = allocate_roots([0.5, 0.5, 0.5], 6)
    assert sorted(m.tolist()) == [0, 3, 3]
    assert (allocate_roots_dp([0.5, 0.5, 0.5], 6) > 0).sum() == 2
    # Deterministic: the same input always gives the same allocation.
    v = np.random.default_rng(3).random(50).round(1)
    assert np.array_equal(allocate_roots(v, 60), allocate_roots(v, 60))


@FAST
@given(
    v=st.lists(probability, min_size=1, max_size=4),
    budget=st.integers(0, 16),
    max_per_prompt=st.integers(2, 5),
)
def test_allocate_roots_matches_brute_force(v: list[float], budget: int, max_per_prompt: int) -> None:
    assume(is_feasible_budget(len(v), budget, max_per_prompt))
    m = allocate_roots(v, budget, max_per_prompt)
    assert m.sum() == budget
    assert all(x == 0 or 2 <= x <= max_per_prompt for x in m)
    best = brute_force_roots(v, budget, max_per_prompt)
    assert root_objective(v, m) == pytest.approx(best, abs=1e-9)
    assert root_objective(v, allocate_roots_dp(v, budget, max_per_prompt)) == pytest.approx(best, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(5, 60), k=st.integers(2, 16), ties=st.booleans())
def test_allocate_roots_matches_dp_on_larger_pools(seed: int, n: int, k: int, ties: bool) -> None:
    rng = np.random.default_rng(seed)
    v = rng.choice([0.0, 0.2, 0.5, 0.8, 1.0], size=n) if ties else rng.beta(0.3, 0.3, size=n)
    budget = int(rng.integers(0, n * k + 1))
    if k == 2:
        budget -= budget % 2
    assume(budget != 1)
    m = allocate_roots(v, budget, k)
    d = allocate_roots_dp(v, budget, k)
    assert m.sum() == budget == d.sum()
    assert root_objective(v, m) == pytest.approx(root_objective(v, d), abs=1e-9)
    assert (m > 0).sum() <= (d > 0).sum() + 1  # near-ties aside, no more prompts than the DP


@pytest.mark.parametrize(
    ("n", "budget", "k", "rule"),
    [
        (4, 5, 2, "odd"),
        (3, 1, 4, "m_i = 1 is excluded"),
        (3, -2, 4, "cannot be negative"),
        (3, 13, 4, "exceeds the pool's capacity"),
        (3, 4, 1, "must be >= 2"),
    ],
)
def test_infeasible_root_budgets_are_errors(n: int, budget: int, k: int, rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        allocate_roots(np.full(n, 0.5), budget, k)
    with pytest.raises(ValueError, match=rule):
        allocate_roots_dp(np.full(n, 0.5), budget, k)
    with pytest.raises(ValueError, match=f"max_per_prompt = {k}" if k < 2 else f"budget = {budget}"):
        allocate_roots(np.full(n, 0.5), budget, k)  # the message names the offending number


@pytest.mark.parametrize("bad", [[0.5, float("nan")], [0.5, 1.5], [-0.1, 0.5], [[0.5, 0.5]]])
def test_bad_probabilities_are_errors(bad: list) -> None:
    with pytest.raises(ValueError, match=r"v(\[1\]|\[0\])? |v must be 1-D|v\[|1-D"):
        allocate_roots(bad, 2)


def test_budget_must_be_an_integer() -> None:
    with pytest.raises(ValueError, match="budget must be an integer"):
        allocate_roots([0.5, 0.5], 2.5)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- roots under a Beta posterior
# Beta parameters with the edges: point masses (one parameter 0), tiny and large strengths.
beta_param = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 3.0, 1e3]), st.floats(0.01, 20.0, allow_nan=False))


def beta_value_independent(a: float, b: float, m: int) -> float:
    """``1 − E[p^m] − E[(1−p)^m]`` from log-Beta functions (scipy), independent of the solver's
    product recursion; point masses by hand."""
    if m < 2:
        return 0.0
    if a == 0.0 or b == 0.0:
        return 0.0  # a point mass at 0 or 1: never both outcomes
    ep = np.exp(betaln(a + m, b) - betaln(a, b))
    eq = np.exp(betaln(a, b + m) - betaln(a, b))
    return float(1.0 - ep - eq)


def brute_force_roots_beta(a: list[float], b: list[float], budget: int, max_per_prompt: int) -> float:
    choices = [0, *range(2, max_per_prompt + 1)]
    table = [[beta_value_independent(x, y, c) for c in choices] for x, y in zip(a, b, strict=True)]
    best = -np.inf
    for combo in itertools.product(range(len(choices)), repeat=len(a)):
        if sum(choices[c] for c in combo) == budget:
            best = max(best, sum(table[i][c] for i, c in enumerate(combo)))
    return best


def test_beta_moments_match_log_beta_functions() -> None:
    a = np.array([0.3, 1.0, 2.5, 40.0, 0.0, 5.0])
    b = np.array([0.7, 1.0, 0.4, 60.0, 2.0, 0.0])
    ep, eq = beta_moments(a, b, 9)
    proper = (a > 0) & (b > 0)
    for k in range(10):
        want_p = np.exp(betaln(a[proper] + k, b[proper]) - betaln(a[proper], b[proper]))
        want_q = np.exp(betaln(a[proper], b[proper] + k) - betaln(a[proper], b[proper]))
        np.testing.assert_allclose(ep[proper, k], want_p, rtol=1e-12)
        np.testing.assert_allclose(eq[proper, k], want_q, rtol=1e-12)
    # point masses: alpha = 0 is p ≡ 0, beta = 0 is p ≡ 1
    assert ep[4, 1:].tolist() == [0.0] * 9 and eq[4].tolist() == [1.0] * 10
    assert ep[5].tolist() == [1.0] * 10 and eq[5, 1:].tolist() == [0.0] * 9


def test_beta_unit_gains_structure() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.gamma(1.0, 3.0, size=200), rng.gamma(1.0, 3.0, size=200)
    K = 12
    g = root_unit_gains_beta(a, b, K)
    # the first three units are one number: E[p(1−p)] = v(1−v)(α+β)/(α+β+1)
    assert np.array_equal(g[:, 0], g[:, 1]) and np.array_equal(g[:, 1], g[:, 2])
    v, s = a / (a + b), a + b
    np.testing.assert_allclose(g[:, 0], v * (1 - v) * s / (s + 1), rtol=1e-12)
    assert np.all(np.diff(g[:, 2:], axis=1) <= 0)  # non-increasing after the first pair
    # a prompt's value at m >= 2 is the sum of its first m units
    for m in range(2, K + 1):
        np.testing.assert_allclose(g[:, :m].sum(axis=1), root_value_beta(a, b, np.full(200, m)), atol=1e-13)
    assert root_value_beta([1.0], [1.0], 1)[0] == 0.0 and root_value_beta([1.0], [1.0], 0)[0] == 0.0


def test_beta_objective_penalises_uncertainty() -> None:
    # Same posterior mean 1/2; the prompt known from 1,000 pseudo-rollouts gets the budget.
    m = allocate_roots_beta([1.0, 500.0], [1.0, 500.0], 2)
    assert m.tolist() == [0, 2]
    assert root_value_beta([1.0], [1.0], 2)[0] == pytest.approx(2 * 0.25 * 2 / 3)


@FAST
@given(
    ab=st.lists(st.tuples(beta_param, beta_param).filter(lambda t: t[0] + t[1] > 0), min_size=1, max_size=4),
    budget=st.integers(0, 16),
    max_per_prompt=st.integers(2, 5),
)
def test_allocate_roots_beta_matches_brute_force(
    ab: list[tuple[float, float]], budget: int, max_per_prompt: int
) -> None:
    assume(is_feasible_budget(len(ab), budget, max_per_prompt))
    a, b = [x[0] for x in ab], [x[1] for x in ab]
    m = allocate_roots_beta(a, b, budget, max_per_prompt)
    assert m.sum() == budget and all(x == 0 or 2 <= x <= max_per_prompt for x in m)
    best = brute_force_roots_beta(a, b, budget, max_per_prompt)
    assert root_objective_beta(a, b, m) == pytest.approx(best, abs=1e-9)
    d = allocate_roots_beta_dp(a, b, budget, max_per_prompt)
    assert root_objective_beta(a, b, d) == pytest.approx(best, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(5, 50), k=st.integers(2, 16), ties=st.booleans())
def test_allocate_roots_beta_matches_dp_on_larger_pools(seed: int, n: int, k: int, ties: bool) -> None:
    rng = np.random.default_rng(seed)
    if ties:  # repeated (α, β) pairs: many exactly tied gains
        pairs = np.array([(1.0, 1.0), (2.0, 8.0), (0.0, 3.0), (6.0, 6.0), (4.0, 0.5)])[rng.integers(0, 5, size=n)]
        a, b = pairs[:, 0], pairs[:, 1]
    else:
        v = rng.beta(0.3, 0.3, size=n)
        s = rng.choice([0.5, 2.0, 8.0, 64.0], size=n)
        a, b = v * s + rng.integers(0, 4, size=n), (1 - v) * s + rng.integers(0, 4, size=n)
    budget = int(rng.integers(0, n * k + 1))
    if k == 2:
        budget -= budget % 2
    assume(budget != 1)
    m = allocate_roots_beta(a, b, budget, k)
    d = allocate_roots_beta_dp(a, b, budget, k)
    assert m.sum() == budget == d.sum()
    assert root_objective_beta(a, b, m) == pytest.approx(root_objective_beta(a, b, d), abs=1e-9)
    assert (m > 0).sum() <= (d > 0).sum() + 1


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 80), k=st.integers(2, 16))
def test_point_case_is_the_limit_of_huge_strength(seed: int, n: int, k: int) -> None:
    rng = np.random.default_rng(seed)
    v = rng.beta(0.3, 0.3, size=n)
    budget = int(rng.integers(0, n * k + 1))
    if k == 2:
        budget -= budget % 2
    assume(budget != 1)
    strength = 1e13
    m = allocate_roots_beta(v * strength, (1 - v) * strength, budget, k)
    assert root_objective(v, m) == pytest.approx(root_objective(v, allocate_roots(v, budget, k)), abs=1e-9)


def test_beta_tie_rule_and_determinism() -> None:
    m = allocate_roots_beta([2.0, 2.0, 2.0], [2.0, 2.0, 2.0], 6)
    assert sorted(m.tolist()) == [0, 3, 3]  # (3, 3, 0) over (2, 2, 2)
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, 4, 50) + 0.5, rng.integers(0, 4, 50) + 0.5
    assert np.array_equal(allocate_roots_beta(a, b, 60), allocate_roots_beta(a, b, 60))


@pytest.mark.parametrize(
    ("n", "budget", "k", "rule"),
    [
        (4, 5, 2, "odd"),
        (3, 1, 4, "m_i = 1 is excluded"),
        (3, -2, 4, "cannot be negative"),
        (3, 13, 4, "exceeds the pool's capacity"),
        (3, 4, 1, "must be >= 2"),
    ],
)
def test_infeasible_budgets_are_errors_for_the_beta_solvers(n: int, budget: int, k: int, rule: str) -> None:
    ones = np.ones(n)
    for solver in (allocate_roots_beta, allocate_roots_beta_dp):
        with pytest.raises(ValueError, match=rule):
            solver(ones, ones, budget, k)
    with pytest.raises(ValueError, match=rule):
        allocate_roots_thompson(ones, ones, budget, k, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("a", "b", "rule"),
    [
        ([1.0, -1.0], [1.0, 1.0], r"alpha\[1\] = -1.0"),
        ([1.0, 1.0], [1.0, float("nan")], r"beta\[1\] = nan"),
        ([0.0, 1.0], [0.0, 1.0], r"alpha\[0\] \+ beta\[0\] = 0"),
        ([1.0, 1.0], [1.0], "one length"),
        ([1.0, float("inf")], [1.0, 1.0], "finite"),
    ],
)
def test_bad_beta_parameters_are_errors(a: list, b: list, rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        allocate_roots_beta(a, b, 2)


def test_thompson_is_the_point_solver_on_one_draw_per_prompt() -> None:
    rng = np.random.default_rng(5)
    a, b = rng.gamma(1.0, 2.0, 40) + 0.1, rng.gamma(1.0, 2.0, 40) + 0.1
    a[0], b[1] = 0.0, 0.0  # point masses draw 0 and 1: neither prompt can form a mixed group
    m = allocate_roots_thompson(a, b, 30, 16, np.random.default_rng(9))
    draws_rng = np.random.default_rng(9)
    draw = np.array([0.0, 1.0, *draws_rng.beta(a[2:], b[2:])])
    assert np.array_equal(m, allocate_roots(draw, 30, 16))
    assert m[0] == 0 and m[1] == 0 and m.sum() == 30
    # different draws, different allocations: it explores
    other = [allocate_roots_thompson(a, b, 30, 16, np.random.default_rng(s)) for s in range(5)]
    assert len({tuple(x) for x in other}) > 1


# ---------------------------------------------------------------------------- prefixes
def test_prefix_value_definition() -> None:
    # q = r·p + (1−r)(1−p): a success with p = 0.8 keeps its outcome with probability 0.8.
    assert prefix_value([0.8], [1], [3])[0] == pytest.approx(1 - 0.8**3)
    assert prefix_value([0.8], [0], [3])[0] == pytest.approx(1 - 0.2**3)
    assert prefix_value([0.8], [1], [0])[0] == 0.0


@FAST
@given(
    data=st.lists(st.tuples(probability, st.integers(0, 1)), min_size=1, max_size=4),
    budget=st.integers(0, 7),
)
def test_allocate_prefixes_matches_brute_force(data: list[tuple[float, int]], budget: int) -> None:
    p = [d[0] for d in data]
    r = [d[1] for d in data]
    K = allocate_prefixes(p, r, budget)
    assert K.sum() == budget and (K >= 0).all()
    best = brute_force_prefixes(p, r, budget)
    assert prefix_objective(p, r, K) == pytest.approx(best, abs=1e-9)
    assert prefix_objective(p, r, allocate_prefixes_greedy(p, r, budget)) == pytest.approx(best, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), ties=st.booleans())
def test_allocate_prefixes_matches_greedy_on_larger_inputs(seed: int, n: int, ties: bool) -> None:
    rng = np.random.default_rng(seed)
    p = rng.choice([0.0, 0.3, 0.5, 0.9, 1.0], size=n) if ties else rng.random(n)
    r = rng.integers(0, 2, size=n)
    turn = rng.integers(1, 6, size=n)
    budget = int(rng.integers(0, 3 * n + 1))
    K = allocate_prefixes(p, r, budget, turn)
    G = allocate_prefixes_greedy(p, r, budget, turn)
    assert K.sum() == budget
    assert prefix_objective(p, r, K) == pytest.approx(prefix_objective(p, r, G), abs=1e-9)


def test_zero_gains_still_spend_the_budget_in_tie_order() -> None:
    # p = 1 with r = 1 (or p = 0 with r = 0): no continuation can flip; gains are all 0.
    K = allocate_prefixes([1.0, 1.0, 0.0], [1, 1, 0], 4, turn=[3, 1, 2])
    assert K.sum() == 4
    # Spread first (fewest placed), then the earlier turn, then the lower index.
    assert K.tolist() == [1, 2, 1]
    assert allocate_prefixes([1.0, 1.0], [1, 1], 1, turn=[2, 2]).tolist() == [1, 0]


@pytest.mark.parametrize(
    ("p", "r", "budget", "rule"),
    [
        ([0.5, 0.5], [1, 2], 2, r"r\[1\] = 2.0: rewards of bare rollouts must be 0 or 1"),
        ([0.5, float("nan")], [1, 0], 2, r"p\[1\] = nan"),
        ([0.5, 0.5], [1], 2, "one reward per anchor"),
        ([0.5], [1], -1, "cannot be negative"),
        ([], [], 3, "no anchors"),
    ],
)
def test_bad_prefix_inputs_are_errors(p: list, r: list, budget: int, rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        allocate_prefixes(p, r, budget)


# ---------------------------------------------------------------------------- registry
def test_budget_spec_rules() -> None:
    spec = BudgetSpec(roots_M=512, expansion_N=2)
    assert spec.total == 1536 and spec.pool_size == 4 * 1536 // 8
    with pytest.raises(ValueError, match="roots_M = 12 is not divisible by group_size_G = 8"):
        BudgetSpec(roots_M=12, expansion_N=2)
    with pytest.raises(ValueError, match="expansion_N"):
        BudgetSpec(roots_M=16, expansion_N=-1)
    with pytest.raises(ValueError, match="max_per_prompt"):
        BudgetSpec(roots_M=16, expansion_N=1, max_per_prompt=1)


def test_unknown_method_names_the_known_ones() -> None:
    known = "arpo, dapo, dapo-capped, greso, grpo, knapsack-rl, pcl"
    with pytest.raises(ValueError, match=f"unknown allocation method 'ppo'; known: {known}"):
        get_method("ppo")


TRAJECTORY_METHODS = sorted(n for n, m in METHODS.items() if not m.prices_tokens)  # trace-tokens: test_token_budget


@pytest.mark.parametrize("name", TRAJECTORY_METHODS)
def test_every_method_spends_the_same_total_budget(name: str) -> None:
    spec = BudgetSpec(roots_M=32, expansion_N=2)
    rng = np.random.default_rng(0)
    method = get_method(name)
    v = rng.beta(0.15, 0.15, size=spec.pool_size)
    m = method.allocate_roots(v, spec, rng)
    assert m.shape == v.shape and all(x == 0 or x >= 2 for x in m)
    total = int(m.sum())
    for mi in m[m > 0]:
        budget = method.prefix_budget(mi, spec.expansion_N)
        anchors = int(rng.integers(1, 10))
        entropy = EntropySignals(rng.random(anchors), rng.random(anchors)) if method.reads_entropy else None
        signals = AnchorSignals(rng.random(anchors), rng.integers(0, 2, anchors), np.ones(anchors, dtype=np.int64),
                                entropy=entropy)
        placed = method.place_prefixes(signals, budget, rng)
        assert placed.K.sum() + placed.extra_roots == budget
        total += int(placed.K.sum()) + placed.extra_roots
    assert total == spec.total


def test_pcl_picks_prompts_nearest_one_half() -> None:
    spec = BudgetSpec(roots_M=8, expansion_N=0, group_size_G=8, pool_factor=2)
    v = np.array([0.0, 0.49, 0.9, 1.0, 0.1, 0.55, 0.3, 0.95, 0.2, 0.05, 0.7, 0.99, 0.02, 0.4, 0.97, 0.01])
    m = get_method("pcl").allocate_roots(v[: spec.pool_size], spec, np.random.default_rng(0))
    assert np.flatnonzero(m).tolist() == [1]


def test_trace_root_allocation_is_the_exact_optimum() -> None:
    spec = BudgetSpec(roots_M=16, expansion_N=2)
    v = np.random.default_rng(1).random(spec.pool_size)
    m = get_method("trace").allocate_roots(v, spec, np.random.default_rng(0))
    assert root_objective(v, m) == pytest.approx(root_objective(v, allocate_roots_dp(v, 16, 16)), abs=1e-9)


# ---------------------------------------------------------------------------- rules with memory or rounds
def _view_with_streaks(streaks: list[int], step: int = 10) -> HistoryView:
    """A view whose prompt i had ``streaks[i]`` one-outcome groups as its newest events."""
    h = PromptHistory()
    for k in range(max(streaks), 0, -1):
        ids = [i for i, z in enumerate(streaks) if z >= k]
        h.record(step - k, ids, [4] * len(ids), [0] * len(ids), [0.5] * len(ids))
    return h.view(list(range(len(streaks))), step)


def test_greso_skips_filtered_prompts_and_fills_from_them_only_when_short():
    spec = BudgetSpec(roots_M=8, expansion_N=1, group_size_G=4, pool_factor=2)  # 4 prompts × 4 of a pool of 8
    rule = GresoRoots(GresoConfig(initial_p_easy=0.0, initial_p_hard=0.0, p_min=0.0, min_keep_probability=0.0))
    never = Method("greso-test", rule, None, "")
    v = np.full(spec.pool_size, 0.5)
    view = _view_with_streaks([1, 2, 0, 0, 0, 0, 3, 1])
    for seed in range(20):
        m = never.allocate_roots(v, spec, np.random.default_rng(seed), history=view)
        assert m.sum() == spec.total and set(m.tolist()) <= {0, 4}
        assert np.flatnonzero(m).tolist() == [2, 3, 4, 5]  # the four unfiltered prompts, never a filtered one
    m = never.allocate_roots(v, spec, np.random.default_rng(0), history=_view_with_streaks([1, 1, 1, 1, 1, 0, 0, 0]))
    assert {5, 6, 7} <= set(np.flatnonzero(m).tolist())  # three kept, one filtered fills the fourth place
    # without a history (a first step) GRESO is GRPO's uniform rule: G per prompt, any prompt
    greso = get_method("greso")
    assert greso.reads_history and not greso.uses_predictor and not greso.expands
    m = greso.allocate_roots(v, spec, np.random.default_rng(0))
    assert sorted(m.tolist()) == [0] * 4 + [4] * 4
    # as its authors run it, the filter stands in front of dynamic sampling: it decides once which
    # candidates the rounds may sample, and the rounds never sample a skipped one
    assert greso.samples_in_rounds and greso.candidate_filter is greso.root_rule
    strict = dataclasses.replace(greso, root_rule=rule, candidate_filter=rule)
    eligible = strict.round_candidates(v, spec, np.random.default_rng(0), view)
    assert np.flatnonzero(eligible).tolist() == [2, 3, 4, 5]
    assert greso.round_candidates(v, spec, np.random.default_rng(0)).all()  # no history: every candidate
    m = np.zeros(spec.pool_size, dtype=np.int64)
    m_r = next_checked_round(strict.group_filter, v, m, 0, 0, spec, np.random.default_rng(0), eligible)
    assert set(np.flatnonzero(m_r).tolist()) <= {2, 3, 4, 5} and m_r.any()
    with pytest.raises(ValueError, match="needs a group_filter"):
        Method("x", rule, None, "", candidate_filter=rule)


def _round(rule, v, sampled, mixed, spent, rounds, spec, seed=0):
    return rule.next_round(v, ~sampled, mixed, spent, rounds, spec, np.random.default_rng(seed))


def test_budget_capped_dynamic_sampling_rounds_stop_at_the_target_or_the_budget():
    method = get_method("dapo-capped")
    rule = method.group_filter
    assert rule is not None and method.samples_in_rounds
    spec = BudgetSpec(roots_M=64, expansion_N=0)  # GRPO's batch: 8 prompts × 8; target 4 mixed, rounds of 2
    assert rule.target_groups(spec) == 4 and rule.round_prompts(spec) == 2
    assert rule.limits(spec).max_rollouts == spec.total and rule.limits(spec).max_rounds is None
    v = np.full(spec.pool_size, 0.5)
    sampled = np.zeros(spec.pool_size, dtype=bool)
    m = _round(rule, v, sampled, 0, 0, 0, spec)
    assert sorted(m[m > 0].tolist()) == [8, 8]
    sampled |= m > 0
    m2 = _round(rule, v, sampled, 1, 16, 1, spec)
    assert not (m2 > 0)[sampled].any() and (m2 > 0).sum() == 2  # fresh prompts only
    assert not _round(rule, v, sampled, 4, 16, 1, spec).any()  # the target is met: stop
    assert not _round(rule, v, sampled, 0, 64, 4, spec).any()  # the budget is spent: stop
    assert (_round(rule, v, sampled, 0, 56, 3, spec) > 0).sum() == 1  # the last round fits the budget
    # the filter drops one-outcome groups and trims mixed ones beyond the target, in sampling order
    mixed = np.array([True, False, True, True, False, True, True, True])
    assert rule.keep_groups(mixed, spec).tolist() == [True, False, True, True, False, True, False, False]
    # a caller that cannot sample in rounds gets every round at once: GRPO's allocation
    m = method.allocate_roots(v, spec, np.random.default_rng(0))
    assert m.sum() == spec.total and set(m.tolist()) <= {0, 8}


def test_dapo_as_published_fills_grpos_batch_and_stops_at_its_round_cap():
    """verl's recipe/dapo: rounds of 3 × the batch's prompts, up to 10 rounds, until the batch
    holds GRPO's M(1+N)/G mixed groups — spending what that takes, past M(1+N) if need be."""
    rule = get_method("dapo").group_filter
    assert rule is not None and rule.config == DynamicSamplingConfig()
    spec = BudgetSpec(roots_M=64, expansion_N=0, pool_factor=40)  # a batch of 8 prompts; a pool of 320
    assert rule.target_groups(spec) == 8 and rule.round_prompts(spec) == 24
    limits = rule.limits(spec)
    assert limits.max_rounds == 10 and limits.max_rollouts is None
    v = np.full(spec.pool_size, 0.5)
    sampled = np.zeros(spec.pool_size, dtype=bool)
    m = _round(rule, v, sampled, 0, 0, 0, spec)
    assert (m > 0).sum() == 24 and set(m[m > 0].tolist()) == {8}  # 192 rollouts: three times GRPO's 64
    sampled |= m > 0
    assert (_round(rule, v, sampled, 7, 192, 1, spec) > 0).sum() == 24  # one short: a second full round
    assert not _round(rule, v, sampled, 8, 192, 1, spec).any()  # the batch is full
    assert not _round(rule, v, sampled, 0, 192 * 10, 10, spec).any()  # ten rounds: the cap
    # the rounds run out of candidates before the cap when the pool is small
    small = BudgetSpec(roots_M=64, expansion_N=0)  # pool of 32: a round of 24, then the last 8
    left = np.zeros(small.pool_size, dtype=bool)
    left[:24] = True
    assert (_round(rule, np.full(small.pool_size, 0.5), left, 2, 192, 1, small) > 0).sum() == 8
    # the checked round holds the rule to its own cap, not to the equal budget
    m = np.zeros(spec.pool_size, dtype=np.int64)
    m[:240] = 8  # ten rounds' worth, past M(1+N) many times over
    assert not next_checked_round(rule, v, m, 0, 10, spec, np.random.default_rng(0)).any()

    class Eager(DynamicSampling):  # a rule that ignores its own cap is stopped before it rolls out
        def next_round(self, v, available, mixed_groups, spent, rounds, spec, rng):
            return super().next_round(v, available, mixed_groups, spent, 0, spec, rng)

    with pytest.raises(AssertionError, match="cap of 10 rounds"):
        next_checked_round(Eager(), v, m, 0, 10, spec, np.random.default_rng(0))
    assert next_checked_round(Eager(), v, m, 0, 9, spec, np.random.default_rng(0)).sum() == 24 * 8


def test_greso_rounds_are_sized_from_the_shortfall():
    """GRESO's code: a first sampling batch of 1.5 × the training batch, later ones of
    ⌊missing / (mixed share) × 1.25⌋ prompts, at least a quarter of the batch, at most the first."""
    rule = get_method("greso").group_filter
    spec = BudgetSpec(roots_M=128, expansion_N=0, pool_factor=8)  # a batch of 16 prompts × 8
    v = np.full(spec.pool_size, 0.5)
    sampled = np.zeros(spec.pool_size, dtype=bool)
    assert (_round(rule, v, sampled, 0, 0, 0, spec) > 0).sum() == 24
    sampled[:24] = True
    # 6 of 24 groups mixed: 10 missing / 0.25 × 1.25 = 50 > 24: a full round
    assert (_round(rule, v, sampled, 6, 24 * 8, 1, spec) > 0).sum() == 24
    # 12 of 24 mixed: 4 / 0.5 × 1.25 = 10 prompts
    assert (_round(rule, v, sampled, 12, 24 * 8, 1, spec) > 0).sum() == 10
    # 15 of 24 mixed: 1 / 0.625 × 1.25 = 2, raised to a quarter of the batch (4)
    assert (_round(rule, v, sampled, 15, 24 * 8, 1, spec) > 0).sum() == 4
    # nothing mixed yet: no estimate, a full round
    assert (_round(rule, v, sampled, 0, 24 * 8, 1, spec) > 0).sum() == 24
    assert rule.limits(spec).max_rounds is None and rule.limits(spec).max_rollouts is None


def test_bad_dynamic_sampling_config():
    for kwargs, word in [({"target_fraction": 0.0}, "target_fraction"), ({"round_fraction": 0.0}, "round_fraction"),
                         ({"max_rounds": -1}, "max_rounds"), ({"refill_margin": -1.0}, "refill_margin"),
                         ({"min_round_fraction": 4.0}, "min_round_fraction")]:
        with pytest.raises(ValueError, match=word):
            DynamicSamplingConfig(**kwargs)


def test_posterior_roots_are_the_exact_beta_solver_on_the_posterior():
    spec = BudgetSpec(roots_M=32, expansion_N=2)
    rng = np.random.default_rng(3)
    h = PromptHistory()
    ids = list(range(spec.pool_size))
    for step in range(3):
        sel = ids[step::3]
        n = rng.integers(2, 9, size=len(sel))
        wins = rng.binomial(n, rng.random(len(sel)))
        h.record(step, sel, wins, n - wins, rng.random(len(sel)))
    view = h.view(ids, 3)
    v = rng.random(spec.pool_size)
    alpha, beta = beta_posterior(view, v, PosteriorConfig())
    exact = get_method("trace-posterior")
    assert exact.reads_history and exact.expands and exact.explores_roots and exact.uses_predictor
    m = exact.allocate_roots(v, spec, np.random.default_rng(0), history=view)
    assert np.array_equal(m, allocate_roots_beta(alpha, beta, spec.roots_M, spec.max_per_prompt))
    ts = get_method("trace-posterior-thompson").allocate_roots(v, spec, np.random.default_rng(5), history=view)
    want = allocate_roots_thompson(alpha, beta, spec.roots_M, spec.max_per_prompt, np.random.default_rng(5))
    assert np.array_equal(ts, want)
    # without a history the posterior is the prior alone: Beta(s·v, s·(1 − v))
    s = PosteriorConfig().prior_strength
    m0 = exact.allocate_roots(v, spec, np.random.default_rng(0))
    assert np.array_equal(m0, allocate_roots_beta(s * v, s * (1 - v), spec.roots_M, spec.max_per_prompt))


def test_a_group_filter_cannot_expand():
    with pytest.raises(ValueError, match="cannot expand"):
        Method("x", roots_uniform_all, prefixes_trace, "", group_filter=DynamicSampling())


def test_every_root_rule_is_one_interface_that_says_whether_it_reads_history():
    spec = BudgetSpec(roots_M=16, expansion_N=2)
    v = np.random.default_rng(2).random(spec.pool_size)
    view = HistoryView.empty(spec.pool_size)
    for method in METHODS.values():
        rule = method.root_rule
        assert isinstance(rule, RootRule) and method.reads_history == rule.reads_history
        if method.prices_tokens:  # its trajectory slot refuses: it has no reading at a trajectory budget
            with pytest.raises(ValueError, match="prices its rollouts in generated tokens"):
                rule(v, spec, np.random.default_rng(0), None)
            continue
        # a rule that reads history treats None as an empty history; one that reads none ignores it
        assert np.array_equal(rule(v, spec, np.random.default_rng(0), None),
                              rule(v, spec, np.random.default_rng(0), view))
    readers = {"greso", "trace-posterior", "trace-posterior-thompson", "vip", "knapsack-rl"}
    assert {n for n, m in METHODS.items() if m.reads_history} == readers
    with pytest.raises(TypeError, match="StatelessRoots"):  # a bare function does not say whether it reads history
        Method("x", lambda v, spec, rng: np.zeros(v.shape[0], dtype=np.int64), None, "")


def test_a_sweep_swaps_the_one_root_rule():
    """A configuration sweep replaces the one root rule; ``replace`` keeps it otherwise."""
    rule = PosteriorRoots(PosteriorConfig(prior_strength=2.0))
    method = dataclasses.replace(get_method("trace-posterior"), root_rule=rule)
    assert method.root_rule is rule and method.reads_history
    assert dataclasses.replace(method, description="same").root_rule is rule
    assert dataclasses.replace(method, root_rule=roots_trace).root_rule is roots_trace
    assert get_method("dapo").group_filter is not None and get_method("grpo").group_filter is None


def test_explore_roots_keeps_the_budget() -> None:
    rng = np.random.default_rng(0)
    v = np.array([0.5, 0.4, 0.0, 1.0, 0.99, 0.01, 0.6, 0.0])
    m = np.array([4, 4, 0, 0, 0, 0, 4, 0])
    np.testing.assert_array_equal(explore_roots(m, v, 0.0, rng), m)
    out = explore_roots(m, v, 0.25, rng)  # 3 rollouts of 12 -> one skipped prompt at m = 2
    assert out.sum() == m.sum()
    assert ((m == 0) & (out == 2)).sum() == 1 and not np.any(out == 1)
    full = explore_roots(m, v, 1.0, rng)
    assert full.sum() == m.sum() and (full[m == 0] == 2).all()
    with pytest.raises(ValueError, match="fraction"):
        explore_roots(m, v, 1.5, rng)


def test_exploration_is_a_rule_of_the_methods_that_explore():
    spec = BudgetSpec(roots_M=16, expansion_N=2)
    v = np.random.default_rng(1).random(spec.pool_size)
    for name, method in METHODS.items():
        if method.prices_tokens:
            continue
        plain = method.allocate_roots(v, spec, np.random.default_rng(4))
        explored = method.allocate_roots(v, spec, np.random.default_rng(4), explore_fraction=0.5)
        if not method.explores_roots:
            assert np.array_equal(explored, plain), name
            continue
        rng = np.random.default_rng(4)
        first = method.allocate_roots(v, spec, rng)

        def own_rule(rest, budget, method=method, rng=rng):
            return method.root_rule(v[rest], spec, rng, None, budget=budget)

        want = explore_roots(first, v, 0.5, rng, spec.max_per_prompt, reallocate=own_rule)
        assert np.array_equal(explored, want) and explored.sum() == plain.sum(), name


def test_exploration_keeps_the_posterior_rule_on_the_prompts_it_does_not_explore():
    """Regression: exploration used to re-split the non-explored prompts with the point rule on
    ``v``, so the posterior methods discarded their posterior whenever ``explore_fraction > 0``.
    Now the rest is the exact posterior optimum of what is left, on the rest's own history rows."""
    spec = BudgetSpec(roots_M=32, expansion_N=1)
    rng = np.random.default_rng(7)
    h = PromptHistory()
    ids = list(range(spec.pool_size))
    for step in range(4):
        sel = ids[step::2]
        n = rng.integers(2, 9, size=len(sel))
        wins = rng.binomial(n, rng.random(len(sel)))
        h.record(step, sel, wins, n - wins, rng.random(len(sel)))
    view = h.view(ids, 4)
    v = rng.random(spec.pool_size)
    alpha, beta = beta_posterior(view, v, PosteriorConfig())
    method = get_method("trace-posterior")
    m = method.allocate_roots(v, spec, np.random.default_rng(0), history=view, explore_fraction=0.5)
    plain = method.allocate_roots(v, spec, np.random.default_rng(0), history=view)
    explored = np.flatnonzero((plain == 0) & (m == 2))  # skipped by the posterior rule, explored at 2
    assert explored.size == int(0.5 * spec.roots_M) // 2 and m.sum() == spec.roots_M
    rest = np.setdiff1d(np.arange(spec.pool_size), explored)
    best = allocate_roots_beta(alpha[rest], beta[rest], spec.roots_M - 2 * explored.size, spec.max_per_prompt)
    assert np.array_equal(m[rest], best)
    # the old point rule on the rest scores below the posterior optimum on the posterior objective
    point = allocate_roots(v[rest], spec.roots_M - 2 * explored.size, spec.max_per_prompt)
    assert root_objective_beta(alpha[rest], beta[rest], m[rest]) > root_objective_beta(alpha[rest], beta[rest], point)


def test_every_method_trains_with_the_tree_advantage_unless_told_otherwise():
    from trace_core.advantages import ADVANTAGE_ESTIMATORS

    own = {"arpo": "arpo-soft"}  # ARPO's attribution is part of the method as published
    for name, method in METHODS.items():
        assert method.default_advantage == own.get(name, "tree"), name
        assert method.advantage_estimator() is ADVANTAGE_ESTIMATORS[own.get(name, "tree")]
        assert method.advantage_estimator("treepo") is ADVANTAGE_ESTIMATORS["treepo"]
    with pytest.raises(ValueError, match="default_advantage"):
        Method("x", roots_uniform_all, None, "", default_advantage="ppo")


# ---------------------------------------------------------------------------- the step's shared rules
def test_a_prompt_without_anchors_spends_its_prefix_budget_at_the_root_and_a_short_rule_is_refused():
    trace = get_method("trace")
    assert trace.prefix_budget(3, 2) == 6 and get_method("grpo").prefix_budget(8, 2) == 0
    rng = np.random.default_rng(0)
    empty = np.zeros(0)
    placed = trace.place_prefixes(AnchorSignals(empty, empty, empty.astype(np.int64)), 6, rng)
    assert placed.extra_roots == 6 and placed.K.size == 0
    three = AnchorSignals(np.array([0.5, 0.9, 0.1]), np.array([1.0, 1.0, 0.0]), np.array([1, 2, 1]))
    placed = trace.place_prefixes(three, 4, rng)
    assert placed.extra_roots == 0 and placed.K.sum() == 4 and placed.K.shape == (3,)
    one = AnchorSignals(np.array([0.5]), np.array([1.0]), np.array([1]))
    stingy = dataclasses.replace(trace, prefix_rule=lambda anchors, budget, rng: np.zeros(anchors.size, dtype=np.int64))
    with pytest.raises(AssertionError, match="spent 0 of 4"):
        stingy.place_prefixes(one, 4, rng)
    # a rule may send part of the budget to the root (ARPO's global fill), but must still spend it all
    filler = dataclasses.replace(trace, prefix_rule=lambda anchors, budget, rng: PrefixPlacement(np.array([1]), 3))
    placed = filler.place_prefixes(one, 4, rng)
    assert placed.K.tolist() == [1] and placed.extra_roots == 3
    with pytest.raises(AssertionError, match="spent 4 of 5"):
        filler.place_prefixes(one, 5, rng)
    with pytest.raises(ValueError, match="does not expand"):
        get_method("grpo").place_prefixes(one, 2, rng)


def test_the_equal_budget_check_holds_slot_methods_only():
    spec = BudgetSpec(roots_M=16, expansion_N=1)
    get_method("trace").check_planned(spec, spec.total)
    with pytest.raises(AssertionError, match="spends 31 != 32"):
        get_method("grpo").check_planned(spec, 31)
    get_method("dapo").check_planned(spec, 200)  # a round rule spends what its rounds sample


def test_rounds_are_rolled_one_by_one_and_the_filter_keeps_groups_in_sampling_order():
    method = get_method("dapo-capped")
    spec = BudgetSpec(roots_M=64, expansion_N=0)  # target 4 mixed groups, rounds of 2 prompts
    v = np.full(spec.pool_size, 0.5)
    seen: list[np.ndarray] = []
    outcomes = iter([[False, True], [True, False], [True, True], [True, True]])

    def roll(m_r: np.ndarray) -> np.ndarray:
        assert not any((m_r[s] > 0).any() for s in seen)  # a prompt is never sampled twice
        seen.append(np.flatnonzero(m_r))
        return np.array(next(outcomes))

    sampled = sample_in_rounds(method, v, spec, np.random.default_rng(0), roll)
    assert sampled.rounds == 3  # 1 + 1 + 2 mixed: the target is met after the third round
    assert sampled.order.tolist() == np.concatenate(seen).tolist()
    assert sampled.mixed.tolist() == [False, True, True, False, True, True]
    assert sampled.kept.tolist() == sampled.mixed.tolist()  # four mixed groups, all within the target
    assert (sampled.m > 0).sum() == 6 and sampled.m.sum() == 48
    with pytest.raises(ValueError, match="rolled out 1 mixed flags"):
        sample_in_rounds(method, v, spec, np.random.default_rng(0), lambda m_r: np.array([True]))
    with pytest.raises(ValueError, match="no round rule"):
        sample_in_rounds(get_method("grpo"), v, spec, np.random.default_rng(0), roll)
