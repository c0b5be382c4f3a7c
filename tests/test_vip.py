"""VIP (trace_core.vip): the GP against direct linear algebra, the allocation against brute force
and the dynamic programme, the rounding's constraints, and the rule through the registry."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from trace_core.allocation import BudgetSpec
from trace_core.history import HistoryView, PromptHistory
from trace_core.methods import get_method
from trace_core.sim import OraclePredictor, PersistentPool, run_step
from trace_core.vip import (
    VipConfig,
    VipRoots,
    allocate_vip,
    allocate_vip_dp,
    gp_posterior,
    median_length_scale,
    rbf_kernel,
    relaxed_allocation,
    round_allocation,
    variance_factor,
    vip_objective,
    vip_observations,
    vip_predict,
)

FORMS = ("dr_grpo", "rloo")
SPEC = BudgetSpec(32, 2)  # total 96 = 12 prompts × 8, pool 48


def brute_force(a: np.ndarray, budget: int, lower: int, upper: int, form: str) -> float:
    """The smallest objective over every feasible integer allocation."""
    return min(vip_objective(a, np.array(c), form) for c in itertools.product(range(lower, upper + 1), repeat=a.size)
               if sum(c) == budget)


def random_a(rng: np.random.Generator, n: int) -> np.ndarray:
    kind = rng.integers(3)
    p = rng.random(n) if kind == 0 else rng.choice([0.1, 0.3, 0.5], n) if kind == 1 else rng.beta(0.3, 0.3, n)
    return np.maximum(p * (1 - p), 1e-12)  # the solver's own floor, so both sides price the same a


# ---------------------------------------------------------------------------- the Gaussian process
def test_gp_posterior_matches_the_direct_formula() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(9, 3))
    k = rbf_kernel(x, x, 1.3)
    obs, test = np.array([0, 2, 3, 7]), np.arange(9)
    y, prior = rng.normal(size=4), rng.normal(size=9)
    noise = 0.05
    mean, var = gp_posterior(k[np.ix_(obs, obs)], k[obs][:, test], np.diag(k), y, prior[obs], prior, noise)
    inv = np.linalg.inv(k[np.ix_(obs, obs)] + noise * np.eye(4))
    np.testing.assert_allclose(mean, prior + k[test][:, obs] @ inv @ (y - prior[obs]), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(var, np.diag(k - k[:, obs] @ inv @ k[obs]), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.linalg.solve(k[np.ix_(obs, obs)] + noise * np.eye(4), y - prior[obs]),
                               inv @ (y - prior[obs]), rtol=1e-10)


def test_gp_posterior_without_observations_is_the_prior() -> None:
    mean, var = gp_posterior(np.zeros((0, 0)), np.zeros((0, 3)), np.ones(3), np.zeros(0), np.zeros(0),
                             np.array([-1.0, 0.0, 2.0]), 1e-4)
    np.testing.assert_array_equal(mean, [-1.0, 0.0, 2.0])
    np.testing.assert_array_equal(var, [1.0, 1.0, 1.0])


def test_rbf_kernel_and_the_median_heuristic_by_hand() -> None:
    np.testing.assert_allclose(rbf_kernel([0.0, 1.0], [0.0, 2.0], 2.0),
                               [[1.0, np.exp(-0.5)], [np.exp(-1 / 8), np.exp(-1 / 8)]])
    assert median_length_scale([0.0, 1.0, 3.0]) == 2.0  # pairwise distances 1, 3, 2
    assert median_length_scale([0.4, 0.4, 0.4]) == 1.0  # all equal: the fallback
    assert median_length_scale([0.2]) == 1.0


def _view(rows: list[list[tuple[int, int, int]]], step: int) -> HistoryView:
    """A view from per-candidate events [(step, successes, failures), ...], any order."""
    h = PromptHistory()
    for s in sorted({e[0] for r in rows for e in r}):
        ids = [i for i, r in enumerate(rows) if any(e[0] == s for e in r)]
        succ = [next(e[1] for e in rows[i] if e[0] == s) for i in ids]
        fail = [next(e[2] for e in rows[i] if e[0] == s) for i in ids]
        h.record(s, ids, succ, fail, [0.5] * len(ids))
    return h.view(list(range(len(rows))), step)


def test_vip_predict_matches_the_direct_formula_and_reads_the_newest_outcome() -> None:
    v = np.array([0.1, 0.15, 0.5, 0.55, 0.9, 0.3])
    view = _view([[(0, 8, 0), (2, 1, 7)], [], [(1, 4, 4)], [], [(0, 0, 8)], []], step=3)
    cfg = VipConfig()
    observed, y = vip_observations(view, cfg)
    np.testing.assert_array_equal(observed, [True, False, True, False, True, False])
    np.testing.assert_allclose(y[observed], [np.log(1 / 7), 0.0, np.log(1e-6 / (1 - 1e-6))])  # newest: 1 of 8
    pred = vip_predict(v, view, cfg)
    ell = median_length_scale(v)
    k = 0.5 * np.exp(-0.5 * (v[:, None] - v[None, :]) ** 2 / ell**2) + 0.5 * np.eye(6)
    o = np.flatnonzero(observed)
    inv = np.linalg.inv(k[np.ix_(o, o)] + 1e-4 * np.eye(o.size))
    mean = -5.0 + k[:, o] @ inv @ (y[o] + 5.0)
    np.testing.assert_allclose(pred.mean, mean, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(pred.variance, np.diag(k - k[:, o] @ inv @ k[o]), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(pred.success, 1 / (1 + np.exp(-mean)), rtol=1e-12)
    np.testing.assert_allclose(pred.mean[o], y[o], atol=5e-3)  # its own outcome sets an observed prompt's mean
    assert pred.length_scale == ell
    sub = vip_predict(v, view, cfg, at=np.array([5, 0, 3]))  # a subset, in the order asked
    np.testing.assert_allclose(sub.mean, pred.mean[[5, 0, 3]], rtol=1e-12)
    np.testing.assert_allclose(sub.variance, pred.variance[[5, 0, 3]], rtol=1e-10, atol=1e-14)
    np.testing.assert_array_equal(sub.observed, [False, True, False])
    # max_age: the outcome of step 0 is 3 steps old at step 3; with max_age=2 only steps 1 and 2 count
    assert vip_observations(view, VipConfig(max_age=2))[0].tolist() == [True, False, True, False, False, False]


def test_vip_predict_without_history_is_the_prior() -> None:
    pred = vip_predict(np.linspace(0.0, 1.0, 5), HistoryView.empty(5), VipConfig(prior_logit=-2.0))
    np.testing.assert_allclose(pred.mean, -2.0)
    np.testing.assert_allclose(pred.variance, 1.0)
    assert not pred.observed.any()


# ---------------------------------------------------------------------------- the variance objective
def test_variance_factors_by_hand() -> None:
    np.testing.assert_allclose(variance_factor([2, 3, 4, 8], "dr_grpo"), [1 / 4, 2 / 9, 3 / 16, 7 / 64])
    np.testing.assert_allclose(variance_factor([2, 3, 5], "rloo"), [1.0, 0.5, 0.25])
    assert vip_objective([0.25, 0.09, 0.1], [4, 2, 0], "rloo") == pytest.approx(0.25 / 3 + 0.09)
    with pytest.raises(ValueError, match="m >= 2"):
        variance_factor([1], "rloo")


@pytest.mark.parametrize("form", FORMS)
def test_allocation_is_the_brute_force_optimum_on_every_small_case(form: str) -> None:
    rng = np.random.default_rng(1)
    for _ in range(600):
        Q, lower = int(rng.integers(1, 5)), int(rng.integers(2, 4))
        upper = int(rng.integers(lower, 8))
        budget = int(rng.integers(Q * lower, Q * upper + 1))
        a = random_a(rng, Q)
        m = allocate_vip(a, budget, lower, upper, form)
        assert m.sum() == budget and m.min() >= lower and m.max() <= upper
        assert vip_objective(a, m, form) <= brute_force(a, budget, lower, upper, form) + 1e-13


@pytest.mark.parametrize("form", FORMS)
def test_allocation_is_the_dp_optimum_at_scale(form: str) -> None:
    rng = np.random.default_rng(2)
    for Q, budget in ((12, 96), (96, 768), (40, 600)):
        a = random_a(rng, Q)
        m = allocate_vip(a, budget, 2, 16, form)
        m_dp = allocate_vip_dp(a, budget, 2, 16, form)
        assert vip_objective(a, m, form) <= vip_objective(a, m_dp, form) + 1e-12


def test_dp_is_the_brute_force_optimum() -> None:
    rng = np.random.default_rng(3)
    for _ in range(100):
        a = random_a(rng, 3)
        budget = int(rng.integers(6, 19))
        for form in FORMS:
            m = allocate_vip_dp(a, budget, 2, 6, form)
            assert vip_objective(a, m, form) == pytest.approx(brute_force(a, budget, 2, 6, form), abs=1e-14)


def test_relaxation_spends_the_budget_and_meets_the_kkt_conditions() -> None:
    rng = np.random.default_rng(4)
    a = random_a(rng, 30)
    for form in FORMS:
        m = relaxed_allocation(a, 240, 2, 16, form)
        assert m.sum() == pytest.approx(240) and m.min() >= 2 and m.max() <= 16
    # RLOO, interior prompts: a_i / (m_i − 1)² is one multiplier λ; at the bounds it lies on the right side
    m = relaxed_allocation(a, 240, 2, 16, "rloo")
    lam = a / (m - 1) ** 2
    inner = (m > 2 + 1e-9) & (m < 16 - 1e-9)
    assert inner.sum() >= 2
    np.testing.assert_allclose(lam[inner], lam[inner][0], rtol=1e-6)
    assert np.all(lam[m <= 2 + 1e-9] <= lam[inner][0] * (1 + 1e-6))
    assert np.all(lam[m >= 16 - 1e-9] >= lam[inner][0] * (1 - 1e-6))
    # ... and it bounds the integer optimum from below (the objective is convex there)
    assert vip_objective(a, m, "rloo") <= vip_objective(a, allocate_vip(a, 240, 2, 16, "rloo"), "rloo") + 1e-12


def test_relaxation_of_equal_prompts_is_uniform() -> None:
    for form in FORMS:
        np.testing.assert_allclose(relaxed_allocation(np.full(12, 0.2), 96, 2, 16, form), 8.0)
        np.testing.assert_array_equal(allocate_vip(np.full(12, 0.2), 96, 2, 16, form), 8)


def test_rounding_keeps_the_budget_and_the_bounds_from_any_fractional_start() -> None:
    rng = np.random.default_rng(5)
    for _ in range(300):
        Q, lower = int(rng.integers(1, 30)), 2
        upper = int(rng.integers(2, 17))
        budget = int(rng.integers(Q * lower, Q * upper + 1))
        a = random_a(rng, Q)
        start = rng.uniform(lower, upper, Q)  # not even summing to the budget
        for form in FORMS:
            m = round_allocation(a, start, budget, lower, upper, form)
            assert m.dtype.kind == "i" and int(m.sum()) == budget
            assert m.min() >= lower and m.max() <= upper


def test_allocation_errors_name_the_numbers() -> None:
    with pytest.raises(ValueError, match=r"budget = 10 cannot be split over 2 prompts"):
        allocate_vip([0.1, 0.2], 10, 2, 4)
    with pytest.raises(ValueError, match="p\\(1 − p\\)"):
        allocate_vip([0.3, 0.2], 6, 2, 4)
    with pytest.raises(ValueError, match="variance form"):
        allocate_vip([0.1, 0.2], 6, 2, 4, "grpo")


def test_config_validates_its_fields() -> None:
    for bad in ({"variance_form": "ppo"}, {"min_rollouts": 1}, {"max_rollouts": 1}, {"shared_fraction": 1.0},
                {"jitter": 0.0}, {"clip": 0.5}, {"max_age": 0}, {"length_scale": -1.0}):
        with pytest.raises(ValueError):
            VipConfig(**bad)


# ---------------------------------------------------------------------------- the rule
def _check_budget_rules(m: np.ndarray, spec: BudgetSpec) -> None:
    assert int(m.sum()) == spec.total  # a root-only method spends M(1+N) on bare rollouts
    assert np.all((m == 0) | ((m >= 2) & (m <= spec.max_per_prompt)))
    assert int((m > 0).sum()) == spec.total // spec.group_size_G  # the incumbent batch


def test_rule_without_history_is_grpo_on_the_same_batch() -> None:
    method = get_method("vip")
    assert method.reads_history and method.uses_predictor and not method.expands
    v = np.random.default_rng(6).random(SPEC.pool_size)
    m = method.allocate_roots(v, SPEC, np.random.default_rng(7))
    _check_budget_rules(m, SPEC)
    grpo = get_method("grpo").allocate_roots(v, SPEC, np.random.default_rng(7))
    np.testing.assert_array_equal(m, grpo)  # equal predictions: G each, on GRPO's draw


def test_rule_with_history_gives_more_rollouts_to_prompts_predicted_mixed() -> None:
    rng = np.random.default_rng(8)
    B = SPEC.pool_size
    v = rng.random(B)
    history = PromptHistory()
    ids = [f"q{i}" for i in range(B)]
    wins = rng.integers(0, 9, B)
    history.record(0, ids, wins, 8 - wins, v)
    view = history.view(ids, 1)
    method = get_method("vip")
    for seed in range(5):
        m = method.allocate_roots(v, SPEC, np.random.default_rng(seed), history=view)
        _check_budget_rules(m, SPEC)
        batch = np.flatnonzero(m)
        p = vip_predict(v, view).success[batch]
        a = p * (1 - p)
        assert vip_objective(a, m[batch]) == pytest.approx(vip_objective(a, allocate_vip_dp(a, SPEC.total, 2, 16)))
        order = np.argsort(a, kind="stable")
        assert np.all(np.diff(m[batch][order]) >= 0)  # more variance, never fewer rollouts
        assert m[batch].max() > m[batch].min()  # the history moved the split away from uniform


def test_rule_checks_its_inputs() -> None:
    rule = VipRoots()
    with pytest.raises(ValueError, match="pool holds only"):
        rule(np.full(5, 0.5), SPEC, np.random.default_rng(0))
    with pytest.raises(ValueError, match="history has 3 rows"):
        rule(np.full(SPEC.pool_size, 0.5), SPEC, np.random.default_rng(0), HistoryView.empty(3))
    with pytest.raises(ValueError, match="cannot be split"):
        VipRoots(VipConfig(max_rollouts=4))(np.full(SPEC.pool_size, 0.5), SPEC, np.random.default_rng(0))


def test_rule_runs_in_the_simulator_on_a_persistent_pool() -> None:
    pool = PersistentPool(SPEC.pool_size, seed=9)
    history = PromptHistory()
    sampled: dict[int, list[tuple[int, int, float]]] = {}  # prompt id -> (step, bare roots, prediction)
    for s in range(4):
        result = run_step("vip", SPEC, OraclePredictor(), np.random.default_rng([9, s]), pool=pool, history=history)
        _check_budget_rules(result.pool_m, SPEC)
        selected = np.flatnonzero(result.pool_m)
        assert [st.step for st in history.steps()][-1] == s and history.steps()[-1].groups == selected.size
        for i in selected.tolist():
            sampled.setdefault(int(result.pool_ids[i]), []).append(
                (s, int(result.pool_m[i]), float(result.pool_pred[i])))
    # every sampled prompt, and only those, holds one event a step it was sampled: its bare roots
    # split into successes and failures, with the root prediction the allocator used
    assert len(history) == len(sampled)
    for pid, rows in sampled.items():
        events = history.events(pid)
        assert [(e.step, e.successes + e.failures, e.prediction) for e in events] == rows
