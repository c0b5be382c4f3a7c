"""The token budget (trace_core/token_budget.py, method §10): the exact DPs against brute force, the
ratio greedies within their proven bounds, both against the trajectory allocators at equal costs,
the one-budget rule's stage 1 against an independent recomputation, stage 2 against brute force,
the uniform methods' groups, and every bad-input rule. The reservation on the simulator is tested
in test_sim.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from trace_core.allocation import (
    BudgetSpec,
    allocate_prefixes,
    allocate_roots_dp,
    continuation_keep_probability,
    prefix_objective,
    root_objective,
)
from trace_core.methods import METHODS, get_method
from trace_core.token_budget import (
    OneBudget,
    OneBudgetConfig,
    PrefixCalibration,
    allocate_prefixes_tokens,
    allocate_prefixes_tokens_greedy,
    allocate_roots_tokens,
    allocate_roots_tokens_greedy,
    expected_prefix_unit_gains,
    model_prefix_value,
    plan_token_step,
    root_tokens,
    spend_prompt_tokens,
    token_quantum,
    uniform_groups_for_tokens,
    uniform_spec_for_tokens,
)


# ---------------------------------------------------------------------------- brute force
def brute_roots(v, cost, budget, K):
    """max Σ V_root over m ∈ {0} ∪ {2..K} with Σ cost·m ≤ budget, by enumeration."""
    best = 0.0
    for combo in itertools.product([0, *range(2, K + 1)], repeat=len(v)):
        if float(np.dot(cost, combo)) <= budget + 1e-9:
            best = max(best, root_objective(v, list(combo)))
    return best


def brute_prefixes(p, r, cost, budget):
    q = continuation_keep_probability(np.asarray(p, float), np.asarray(r, float))
    ranges = [range(int(budget // c) + 1) for c in cost]
    best = 0.0
    for combo in itertools.product(*ranges):
        if float(np.dot(cost, combo)) <= budget + 1e-9:
            best = max(best, float(np.sum(1.0 - q ** np.array(combo))))
    return best


def _cases(seed, n):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        B = int(rng.integers(1, 5))
        K = int(rng.integers(2, 6))
        v = rng.choice([0.0, 0.5, 1.0, *rng.random(3)], size=B)
        cost = rng.uniform(5.0, 60.0, size=B)
        budget = int(rng.integers(0, 300))
        yield v, cost, budget, K


# ---------------------------------------------------------------------------- roots
def test_root_dp_is_exact_for_the_rounded_costs():
    for v, cost, budget, K in _cases(0, 60):
        q = int(np.random.default_rng(budget).integers(1, 8))
        m = allocate_roots_tokens(v, cost, budget, K, quantum=q)
        rounded = np.ceil(cost / q) * q
        assert float(np.dot(rounded, m)) <= budget // q * q and root_tokens(cost, m) <= budget
        assert all(x == 0 or 2 <= x <= K for x in m)
        assert root_objective(v, m) == pytest.approx(brute_roots(v, rounded, budget // q * q, K), abs=1e-12)


def test_root_greedy_stays_within_one_opening_unit():
    for v, cost, budget, K in _cases(1, 60):
        m = allocate_roots_tokens_greedy(v, cost, budget, K)
        assert root_tokens(cost, m) <= budget + 1e-9 and all(x == 0 or 2 <= x <= K for x in m)
        gap = brute_roots(v, cost, budget, K) - root_objective(v, m)
        assert -1e-12 <= gap <= float(np.max(2 * v * (1 - v))) + 1e-12


def test_root_greedy_can_fall_short_and_the_dp_does_not():
    # A's units per token: pair 0.025, third 0.025, fourth 0.0125; B's pair 0.0227. The greedy fills A
    # to 4 rollouts (40 tokens, value 0.875) and B's pair no longer fits; opening both (42) is worth 1.
    v, cost = np.array([0.5, 0.5]), np.array([10.0, 11.0])
    greedy = allocate_roots_tokens_greedy(v, cost, 42, 16)
    exact = allocate_roots_tokens(v, cost, 42, 16, quantum=1)
    assert greedy.tolist() == [4, 0] and exact.tolist() == [2, 2]
    assert root_objective(v, exact) - root_objective(v, greedy) == pytest.approx(0.125)


def test_equal_costs_give_the_trajectory_optimum():
    rng = np.random.default_rng(2)
    v = rng.random(6)
    for budget in [0, 2, 3, 5, 8, 13, 21, 34]:
        want = 0.0 if budget == 0 else root_objective(v, allocate_roots_dp(v, budget, 16))
        m = allocate_roots_tokens(v, np.full(6, 37.0), 37 * budget, 16)
        assert root_objective(v, m) == pytest.approx(want, abs=1e-9)
        assert root_objective(v, allocate_roots_tokens_greedy(v, np.full(6, 37.0), 37 * budget, 16)) <= want + 1e-9


def test_default_quantum_bounds_the_table():
    assert token_quantum(4096) == 1 and token_quantum(4097) == 2 and token_quantum(0) == 1
    assert token_quantum(10_000, units=100) == 100
    v = np.full(3, 0.5)
    m = allocate_roots_tokens(v, [1000.5, 2000.0, 999.0], 9000)  # quantum 3: costs 1002, 2001, 999
    assert root_tokens([1000.5, 2000.0, 999.0], m) <= 9000


# ---------------------------------------------------------------------------- prefixes
def _prefix_cases(seed, n):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        A = int(rng.integers(1, 4))
        p = rng.choice([0.0, 0.5, 1.0, *rng.random(3)], size=A)
        r = rng.integers(0, 2, size=A)
        cost = rng.uniform(10.0, 60.0, size=A)
        budget = int(rng.integers(0, 160))
        yield p, r, cost, budget


def test_prefix_dp_is_exact_for_the_rounded_costs():
    for p, r, cost, budget in _prefix_cases(3, 60):
        q = int(np.random.default_rng(budget + 1).integers(1, 6))
        K = allocate_prefixes_tokens(p, r, cost, budget, quantum=q)
        rounded = np.ceil(cost / q) * q
        assert float(np.dot(cost, K)) <= budget
        assert prefix_objective(p, r, K) == pytest.approx(brute_prefixes(p, r, rounded, budget // q * q), abs=1e-12)


def test_prefix_greedy_stays_within_one_first_continuation():
    for p, r, cost, budget in _prefix_cases(4, 60):
        K = allocate_prefixes_tokens_greedy(p, r, cost, budget)
        assert float(np.dot(cost, K)) <= budget + 1e-9
        first = 1.0 - continuation_keep_probability(np.asarray(p, float), np.asarray(r, float))
        gap = brute_prefixes(p, r, cost, budget) - prefix_objective(p, r, K)
        assert -1e-12 <= gap <= float(first.max()) + 1e-12


def test_prefix_equal_costs_give_the_trajectory_optimum():
    rng = np.random.default_rng(5)
    p, r = rng.random(7), rng.integers(0, 2, 7)
    for budget in [0, 1, 4, 9, 25]:
        want = prefix_objective(p, r, allocate_prefixes(p, r, budget))
        cost = np.full(7, 23.0)
        exact = allocate_prefixes_tokens(p, r, cost, 23 * budget, quantum=1)  # 23 on a coarser grid would round up
        greedy = allocate_prefixes_tokens_greedy(p, r, cost, 23 * budget)
        assert prefix_objective(p, r, exact) == pytest.approx(want, abs=1e-9)
        assert prefix_objective(p, r, greedy) == pytest.approx(want, abs=1e-9)


# ---------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    "call, rule",
    [
        (lambda: allocate_roots_tokens([0.5, 0.5], [10, -1], 100), r"cost\[1\] = -1.0: an expected cost in tokens"),
        (lambda: allocate_roots_tokens([0.5], [10, 10], 100), r"cost has shape \(2,\)"),
        (lambda: allocate_roots_tokens([0.5], [np.nan], 100), r"cost\[0\] = nan"),
        (lambda: allocate_roots_tokens([1.5], [10], 100), r"v\[0\] = 1.5 is not a probability"),
        (lambda: allocate_roots_tokens([0.5], [10], -5), "budget_tokens = -5: a token budget cannot be negative"),
        (lambda: allocate_roots_tokens([0.5], [10], 10.5), "budget_tokens must be an integer"),
        (lambda: allocate_roots_tokens([0.5], [10], 100, max_per_prompt=1), "max_per_prompt = 1"),
        (lambda: allocate_roots_tokens([0.5], [10], 100, quantum=0), "quantum = 0: it must be an integer >= 1"),
        (lambda: allocate_roots_tokens([0.5], [10], 1 << 22, quantum=1), "exceed the DP's limit"),
        (lambda: allocate_roots_tokens_greedy([0.5], [0.0], 100), r"cost\[0\] = 0.0"),
        (lambda: allocate_prefixes_tokens([0.5], [2], [10], 100), r"r\[0\] = 2.0"),
        (lambda: allocate_prefixes_tokens_greedy([0.5], [1], [10], -1.0), "budget_tokens = -1.0"),
        (lambda: plan_token_step([0.5], [10], [3], [0.5], 100, rho=1.5), "rho = 1.5"),
        (lambda: plan_token_step([0.5], [10], [0], [0.5], 100), r"turns\[0\] = 0.0"),
        (lambda: spend_prompt_tokens([0.5], [1], [1], [10], [], 0.5, 10, 100), "bare_rewards"),
        (lambda: spend_prompt_tokens([0.5], [1], [1], [10], [1], 0.5, 10, np.inf), "allowance = inf"),
        (lambda: uniform_groups_for_tokens([10, 20], 100, 1), "group_size = 1"),
        (lambda: OneBudgetConfig(reservation_grid=(0.0, 1.0)), "reservation_grid"),
        (lambda: BudgetSpec(16, 2, tokens_per_step=0), "tokens_per_step = 0: a token budget must be >= 1"),
        (lambda: BudgetSpec(16, 2, tokens_per_step=2.5), "tokens_per_step must be an integer"),
    ],
)
def test_bad_inputs_are_errors_that_name_the_input_and_the_rule(call, rule):
    with pytest.raises(ValueError, match=rule):
        call()


# ---------------------------------------------------------------------------- stage 1
def test_expected_prefix_unit_gains_average_the_bare_outcome():
    v = np.array([0.3])
    g = expected_prefix_unit_gains(v, 3)[0]
    np.testing.assert_allclose(g, [0.42, 0.21, 0.21 * (0.09 + 0.49)])
    for k in range(1, 4):  # E over r ~ Bernoulli(v) of q^{k−1}(1 − q) with p = v
        q1, q0 = continuation_keep_probability(v, np.ones(1)), continuation_keep_probability(v, np.zeros(1))
        want = 0.3 * q1 ** (k - 1) * (1 - q1) + 0.7 * q0 ** (k - 1) * (1 - q0)
        assert g[k - 1] == pytest.approx(float(want[0]))


def test_model_prefix_value_fills_level_by_level():
    # v = 0.5: the first continuation of an anchor gains 0.5, the second 0.25
    np.testing.assert_allclose(model_prefix_value([0.5, 0.5], [2, 3], [3, 0]), [2 * 0.5 + 0.25, 0.0])


def _fractional_prefix(v, m, turns, frac, cost, budget, rho, units):
    """Stage 1's predicted prefix value, recomputed with a plain loop."""
    items = []
    for i in range(len(v)):
        A = m[i] * max(turns[i] - 1, 0)
        if A <= 0:
            continue
        for k in range(1, units + 1):
            g = rho * v[i] * (1 - v[i]) * (v[i] ** (k - 1) + (1 - v[i]) ** (k - 1))
            if g > 0:
                items.append((g / (frac[i] * cost[i]), A, g, frac[i] * cost[i]))
    items.sort(key=lambda x: -x[0])
    value, left = 0.0, budget
    for _, A, g, c in items:
        n = min(A, left / c)
        value += n * g
        left -= n * c
        if left <= 0:
            break
    return value


def test_plan_recomputed_share_by_share():
    rng = np.random.default_rng(7)
    B, T = 6, 1500
    v, cost = rng.random(B), rng.uniform(50, 150, B)
    turns, frac = rng.uniform(1, 6, B), rng.uniform(0.2, 0.8, B)
    config = OneBudgetConfig(plan_units_per_anchor=8)
    plan = plan_token_step(v, cost, turns, frac, T, rho=0.3, max_per_prompt=5, config=config)
    totals = []
    for (share, rv, pv), want_share in zip(plan.candidates, sorted(config.reservation_grid), strict=True):
        assert share == want_share
        b = T - int(np.floor(share * T))
        m = allocate_roots_tokens(v, cost, b, 5, quantum=1)
        assert rv == pytest.approx(root_objective(v, m), abs=1e-12)
        assert rv == pytest.approx(brute_roots(v, np.ceil(cost), b, 5), abs=1e-12)
        want = _fractional_prefix(v, m, turns, frac, cost, T - root_tokens(cost, m), 0.3, 8)
        assert pv == pytest.approx(want, rel=1e-9, abs=1e-12)
        totals.append(rv + pv)
    best = int(np.argmax(np.array(totals) > max(totals) - 1e-9))  # the smallest share among the best
    assert plan.reservation_share == plan.candidates[best][0]
    assert plan.root_tokens <= T and plan.reserved.sum() <= T - plan.root_tokens + 1e-9
    assert plan.unreserved >= -1e-9
    assert np.all(plan.reserved[plan.m == 0] == 0)


def test_no_prefix_value_reserves_nothing():
    rng = np.random.default_rng(8)
    v, cost = rng.random(20), rng.uniform(50, 150, 20)
    plan = plan_token_step(v, cost, np.full(20, 5.0), np.full(20, 0.5), 3000, rho=0.0)
    assert plan.reservation_share == 0.0 and not plan.reserved.any() and plan.prefix_value == 0.0
    np.testing.assert_array_equal(plan.m, allocate_roots_tokens(v, cost, 3000))
    # one-turn rollouts have no anchors: nothing to reserve for either
    plan = plan_token_step(v, cost, np.ones(20), np.full(20, 0.5), 3000, rho=1.0)
    assert plan.reservation_share == 0.0 and not plan.reserved.any()


def test_cheaper_continuations_win_a_larger_reservation_where_the_prefix_stage_is_marginal():
    rng = np.random.default_rng(9)
    v, cost = rng.beta(0.15, 0.15, 96), rng.lognormal(np.log(350), 0.5, 96)
    shares = [plan_token_step(v, cost, np.full(96, 5.5), np.full(96, f), 48 * 350, rho=0.1).reservation_share
              for f in (0.1, 0.3, 0.5, 0.9)]
    assert shares == sorted(shares, reverse=True) and shares[0] > shares[-1]


def test_calibration():
    c = PrefixCalibration()
    assert c.rho == 1.0
    c = c.observe(10.0, 4.0)
    assert c.rho == pytest.approx(0.4)
    assert c.observe(2.0, 20.0).rho == 1.0  # clipped
    assert PrefixCalibration.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="predicted = -1.0"):
        PrefixCalibration(-1.0, 0.0)


# ---------------------------------------------------------------------------- stage 2
def brute_spend(p, r, anchor_cost, bare, root_p, root_cost, allowance):
    q = list(continuation_keep_probability(np.asarray(p, float), np.asarray(r, float)))
    mixed = min(bare) != max(bare)
    q_root = 1.0 if mixed else float(continuation_keep_probability(np.array([root_p]), np.array([bare[0]], float))[0])
    costs = [*anchor_cost, root_cost]
    keeps = [*q, q_root]
    best = 0.0
    for combo in itertools.product(*[range(int(allowance // c) + 1) for c in costs]):
        if float(np.dot(costs, combo)) <= allowance + 1e-9:
            best = max(best, sum(1.0 - k**n for k, n in zip(keeps, combo, strict=True)))
    return best, max(1.0 - k for k in keeps)


def test_stage_two_by_hand():
    # anchor: 0.5 then 0.25 per 50 tokens (0.01, 0.005 a token); one more root: 0.1 per 100 (0.001)
    s = spend_prompt_tokens([0.5], [1], [1], [50.0], [1, 1], 0.9, 100.0, 100.0)
    assert s.K.tolist() == [2] and s.extra_roots == 0 and s.tokens == 100.0 and s.value == pytest.approx(0.75)
    # no anchors: the allowance buys root rollouts, (1 − 0.5)·0.5 for the second
    s = spend_prompt_tokens([], [], [], [], [0, 0], 0.5, 100.0, 250.0)
    assert s.extra_roots == 2 and s.value == pytest.approx(0.75) and s.tokens == 200.0
    # a mixed group gains nothing from another root rollout; a negative allowance buys nothing
    assert spend_prompt_tokens([], [], [], [], [0, 1], 0.5, 100.0, 250.0).extra_roots == 0
    s = spend_prompt_tokens([0.5], [1], [1], [50.0], [1, 1], 0.5, 100.0, -30.0)
    assert s.K.tolist() == [0] and s.extra_roots == 0 and s.tokens == 0.0


def test_stage_two_is_within_one_first_unit_of_brute_force():
    rng = np.random.default_rng(10)
    for _ in range(60):
        A = int(rng.integers(0, 3))
        p, r = rng.random(A), rng.integers(0, 2, A)
        anchor_cost = rng.uniform(10, 60, A)
        bare = rng.integers(0, 2, int(rng.integers(1, 4))).tolist()
        root_p, root_cost = float(rng.random()), float(rng.uniform(40, 100))
        allowance = float(rng.uniform(0, 180))
        s = spend_prompt_tokens(p, r, np.arange(1, A + 1), anchor_cost, bare, root_p, root_cost, allowance)
        spent = float(np.dot(anchor_cost, s.K)) + s.extra_roots * root_cost
        assert spent == pytest.approx(s.tokens) and spent <= allowance + 1e-9
        best, bound = brute_spend(p, r, anchor_cost, bare, root_p, root_cost, allowance)
        assert -1e-12 <= best - s.value <= bound + 1e-12


# ---------------------------------------------------------------------------- uniform methods, registry
def test_uniform_groups_for_tokens():
    assert uniform_groups_for_tokens(np.full(10, 100.0), 2500, 8) == 3  # 800 tokens a group
    assert uniform_groups_for_tokens([100.0, 300.0, 50.0], 850, 2, order=[1, 0, 2]) == 2  # 600, 800, 900
    assert uniform_groups_for_tokens([100.0, 100.0], 10**9, 2) == 2  # never more groups than candidates
    spec = uniform_spec_for_tokens(BudgetSpec(16, 2, tokens_per_step=2500), np.full(24, 100.0))
    assert (spec.roots_M, spec.expansion_N, spec.tokens_per_step, spec.total) == (24, 0, None, 24)
    with pytest.raises(ValueError, match="buys no group"):
        uniform_spec_for_tokens(BudgetSpec(16, 2, tokens_per_step=700), np.full(24, 100.0))
    with pytest.raises(ValueError, match="counted in trajectories"):
        uniform_spec_for_tokens(BudgetSpec(16, 2), np.full(24, 100.0))


def test_trace_tokens_is_a_registry_method_of_the_token_budget():
    method = get_method("trace-tokens")
    assert method.prices_tokens and method.expands and method.uses_predictor and not method.explores_roots
    assert [n for n, m in METHODS.items() if m.prices_tokens] == ["trace-tokens"]
    spec = BudgetSpec(16, 2)
    v = np.random.default_rng(0).random(spec.pool_size)
    with pytest.raises(ValueError, match="prices its rollouts in generated tokens"):
        method.allocate_roots(v, spec, np.random.default_rng(0))
    with pytest.raises(ValueError, match="prices its rollouts in generated tokens"):
        method.prefix_budget(2, spec.expansion_N)
    with pytest.raises(ValueError, match="tokens_per_step is None"):
        method.token_rule.plan(v, np.full(v.size, 100.0), np.full(v.size, 4.0), np.full(v.size, 0.5), spec)
    priced = BudgetSpec(16, 2, tokens_per_step=5000)
    plan = method.token_rule.plan(v, np.full(v.size, 100.0), np.full(v.size, 4.0), np.full(v.size, 0.5), priced, 0.5)
    want = plan_token_step(v, np.full(v.size, 100.0), np.full(v.size, 4.0), np.full(v.size, 0.5), 5000, 0.5, 16)
    np.testing.assert_array_equal(plan.m, want.m)
    np.testing.assert_array_equal(plan.reserved, want.reserved)
    assert isinstance(method.token_rule, OneBudget)


# ============================================================================ the ledger over real trees
def _turn(tree, traj, model_tokens, obs_tokens=2):
    """One turn of ``model_tokens`` model-written tokens and ``obs_tokens`` observation tokens."""
    return tree.add_turn(traj, [5] * (model_tokens + obs_tokens), [1] * model_tokens + [0] * obs_tokens)


def _hand_tree():
    """Prompt q: two bare rollouts of 3 turns (10+20+30 and 5+5+5 model tokens; rewards 1, 0), two
    continuations from the first one's turn-1 anchor (7+8 and 4+4 tokens; rewards 0, 1), one from
    the second's turn-2 anchor (9 tokens; reward 0) and one further root rollout (11 tokens)."""
    from trace_core.tree import ROOT, RolloutTree

    tree = RolloutTree("q", [1, 2, 3])
    a = tree.start_trajectory("bare")
    a1 = _turn(tree, a, 10)
    _turn(tree, a, 20)
    _turn(tree, a, 30, obs_tokens=0)
    tree.finish(a, 1.0)
    b = tree.start_trajectory("bare")
    _turn(tree, b, 5)
    b2 = _turn(tree, b, 5)
    _turn(tree, b, 5, obs_tokens=0)
    tree.finish(b, 0.0)
    for tokens, reward in (((7, 8), 0.0), ((4, 4), 1.0)):
        c = tree.start_trajectory("continuation", a1)
        _turn(tree, c, tokens[0])
        _turn(tree, c, tokens[1], obs_tokens=0)
        tree.finish(c, reward)
    c = tree.start_trajectory("continuation", b2)
    _turn(tree, c, 9, obs_tokens=0)
    tree.finish(c, 0.0)
    r = tree.start_trajectory("continuation", ROOT)
    _turn(tree, r, 11, obs_tokens=0)
    tree.finish(r, 1.0)
    return tree


def test_a_steps_costs_read_off_its_trees_count_each_rollouts_own_tokens() -> None:
    from trace_core.costs import CostModel, remaining_tokens
    from trace_core.token_budget import model_prefix_value
    from trace_core.token_ledger import TokenLedger, tree_step_costs

    ledger = TokenLedger(CostModel(initial_tokens=50.0, initial_turns=3.0))
    tree = _hand_tree()
    costs = tree_step_costs([tree], ledger, {"q": 40.0})
    assert costs.bare_tokens.tolist() == [60.0, 15.0] and costs.bare_turns.tolist() == [3.0, 3.0]
    assert costs.bare_estimate.tolist() == [40.0, 40.0] and list(costs.bare_prompt_ids) == ["q", "q"]
    # continuations from anchors only (the further root rollout is neither a bare rollout nor one)
    assert costs.cont_tokens.tolist() == [15.0, 8.0, 9.0]
    assert costs.cont_turn.tolist() == [1.0, 1.0, 2.0] and costs.cont_turns.tolist() == [3.0, 3.0, 3.0]
    want = remaining_tokens(ledger.costs, ledger.cost_model, np.full(3, 40.0), np.array([1.0, 1.0, 2.0]),
                            np.full(3, 3.0))
    np.testing.assert_allclose(costs.cont_estimate, want)  # 40·(2/3), 40·(2/3), 40·(1/3) with w = 1
    np.testing.assert_allclose(want, [80 / 3, 80 / 3, 40 / 3])
    assert costs.prefix_predicted is None  # not a token-priced step
    priced = tree_step_costs([tree], ledger, {"q": 40.0}, root_p={"q": 0.5})
    # anchor a1's branch group holds 1, 0, 1: mixed; b2's holds 0, 0: not
    assert priced.prefix_realised == 1.0
    # 4 anchors (two per bare rollout), 3 continuations from them
    want_value = model_prefix_value(np.array([0.5]), np.array([4.0]), np.array([3.0]))[0]
    assert priced.prefix_predicted == pytest.approx(want_value)


def test_the_ledger_learns_from_a_step_and_reports_its_estimates_error() -> None:
    from trace_core.costs import CostModel, expected_root_tokens
    from trace_core.token_ledger import COST_FIGURES, TokenLedger, tree_step_costs

    ledger = TokenLedger(CostModel(initial_tokens=50.0, initial_turns=3.0, prior_weight=1.0))
    tree = _hand_tree()
    after, figures = ledger.after_step(tree_step_costs([tree], ledger, {"q": 50.0}, root_p={"q": 0.5}))
    assert set(COST_FIGURES) <= set(figures)
    assert figures["tokens/root_cost_expected"] == 50.0 and figures["tokens/root_cost_realised"] == 37.5
    # |50 − 60| / 60 and |50 − 15| / 15, averaged
    assert figures["tokens/root_cost_error"] == pytest.approx((10 / 60 + 35 / 15) / 2)
    assert figures["tokens/root_cost_bias"] == pytest.approx((-10 / 60 + 35 / 15) / 2)
    assert figures["tokens/rho"] == pytest.approx(after.calibration.rho)
    assert after.calibration.realised == 1.0
    # the prompt's own mean (75 / 2) shrunk towards the policy's (the same 37.5) by one pseudo-rollout
    assert expected_root_tokens(after.costs, after.cost_model, ["q"])[0] == pytest.approx(37.5)
    assert TokenLedger.from_dict(after.cost_model, after.to_dict()) == after
    _, no_rollout = ledger.after_step(tree_step_costs([], ledger, {}))
    assert all(np.isnan(no_rollout[k]) for k in COST_FIGURES)


def test_rollouts_before_step_zero_set_the_price_of_every_unseen_prompt() -> None:
    """The predictor warm-up's bare rollouts seed the ledger: an unseen pool prompt is then priced
    at their mean, not at the first guess, and the figures compare that guess with them."""
    from trace_core.costs import CostModel, expected_root_tokens
    from trace_core.token_ledger import TokenLedger, ledger_after_rollouts

    ledger = TokenLedger(CostModel(initial_tokens=500.0, initial_turns=3.0))
    seeded, figures = ledger_after_rollouts(ledger, [_hand_tree()])  # bare rollouts of 60 and 15 tokens
    assert expected_root_tokens(seeded.costs, seeded.cost_model, ["pool-prompt"]).tolist() == [37.5]
    assert expected_root_tokens(ledger.costs, ledger.cost_model, ["pool-prompt"]).tolist() == [500.0]
    assert figures["tokens/root_cost_expected"] == 500.0 and figures["tokens/root_cost_realised"] == 37.5
    assert seeded.costs.step == ledger.costs.step + 1  # one step of the ledger, before the run's first
