"""Tests for trace_core.metrics (method §7)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trace_core.advantages import tree_advantages
from trace_core.metrics import (
    WILSON_Z90,
    ContrastCounts,
    allocation_stats,
    anchor_allocation,
    contrast_counts,
    contrastive_yield,
    effective_ratio,
    predictor_spearman,
    prefix_effective_ratio,
    rate_interval,
    reward_stats,
    root_and_prefix_pairs,
    spearman,
    step_metrics,
)
from trace_core.tree import ROOT, RolloutTree


def run(tree: RolloutTree, turns: int, reward: float, branch: int = ROOT, kind: str | None = None,
        tool_error_at: int | None = None) -> list[int]:
    """Add a finished trajectory of ``turns`` turns (2 model tokens + 1 observation each)."""
    kind = kind or ("bare" if branch == ROOT else "continuation")
    traj = tree.start_trajectory(kind, branch_node=branch)  # type: ignore[arg-type]
    nodes = [
        tree.add_turn(traj, [5, 6, 7], [1, 1, 0], info={"tool_error": i == tool_error_at})
        for i in range(turns)
    ]
    tree.finish(traj, reward)
    return nodes


def make_tree(name: str, rewards: list[float]) -> RolloutTree:
    tree = RolloutTree(name)
    for r in rewards:
        run(tree, 2, r)
    return tree


# ---------------------------------------------------------------------------- effective ratios
def test_effective_ratio_counts_activated_prompts_only() -> None:
    trees = [
        make_tree("mixed", [1, 0, 0]),
        make_tree("all-success", [1, 1]),
        make_tree("all-fail", [0, 0]),
        make_tree("half-credit", [0.6, 0.5]),  # 0.6 > 0.5 succeeds, 0.5 fails
        RolloutTree("skipped"),  # no trajectory: not activated
    ]
    assert effective_ratio(trees) == pytest.approx(2 / 4)
    # a continuation's leaf counts as a leaf of the tree
    tree = make_tree("cont", [1, 1])
    run(tree, 1, 0.0, branch=tree.anchors()[0])
    assert effective_ratio([tree]) == 1.0


def test_effective_ratio_without_activated_prompts_is_nan() -> None:
    assert math.isnan(effective_ratio([]))
    assert math.isnan(effective_ratio([RolloutTree("a"), RolloutTree("b")]))


def test_prefix_effective_ratio() -> None:
    tree = RolloutTree("p")
    a = run(tree, 3, 1.0)
    b = run(tree, 3, 0.0)
    run(tree, 1, 0.0, branch=a[0])  # A1's group: bare A (1) + this (0): both outcomes
    run(tree, 1, 1.0, branch=a[1])  # A2's group: bare A (1) + this (1): one outcome
    run(tree, 2, 0.0, branch=b[1])  # B2's group: bare B (0) + two continuations (0, 0): one outcome
    run(tree, 1, 0.0, branch=b[1])
    other = RolloutTree("q")
    c = run(other, 2, 0.0)
    run(other, 1, 1.0, branch=c[0])  # both outcomes
    assert sorted(tree.expanded_anchors()) == [a[0], a[1], b[1]]
    assert prefix_effective_ratio([tree, other]) == pytest.approx(2 / 4)
    # the tree as a whole is mixed even where its anchor groups are not
    assert effective_ratio([tree]) == 1.0


def test_prefix_effective_ratio_without_expanded_anchors_is_nan() -> None:
    assert math.isnan(prefix_effective_ratio([make_tree("a", [1, 0]), RolloutTree("b")]))
    root_only = make_tree("c", [1])
    run(root_only, 1, 0.0, kind="continuation")  # extra root rollout: the root is not an anchor
    assert math.isnan(prefix_effective_ratio([root_only]))


# ---------------------------------------------------------------------------- contrastive yield
def test_contrastive_yield_on_spec_example() -> None:
    tree = RolloutTree("p")
    a = run(tree, 2, 1.0)
    run(tree, 2, 0.0)
    for _ in range(10):
        run(tree, 1, 1.0, branch=a[0])  # all agree with bare A: zero advantage on their nodes
    flat = make_tree("flat", [1, 1, 1, 1])  # uniform: zero everywhere
    trees = [tree, flat]
    adv = [tree_advantages(t) for t in trees]
    # only the two bare rollouts of the first tree carry signal: 2 of 16 trajectories
    assert contrastive_yield(trees, adv) == pytest.approx(100 * 2 / 16)
    # a nonzero advantage on a shared node counts for the trajectory that generated it only
    adv[0][:] = 0.0
    adv[0][a[0]] = 0.5
    assert contrastive_yield(trees, adv) == pytest.approx(100 * 1 / 16)
    assert math.isnan(contrastive_yield([RolloutTree("e")], [np.zeros(1)]))


def test_contrastive_yield_bad_input() -> None:
    tree = make_tree("a", [1, 0])
    adv = tree_advantages(tree)
    with pytest.raises(ValueError, match="advantages must have one array per tree"):
        contrastive_yield([tree], [adv, adv])
    with pytest.raises(ValueError, match=r"advantages\[0\] must have one value per node"):
        contrastive_yield([tree], [adv[:-1]])
    bad = adv.copy()
    bad[1] = np.nan
    with pytest.raises(ValueError, match=r"advantages\[0\] has non-finite"):
        contrastive_yield([tree], [bad])
    with pytest.raises(ValueError, match="single RolloutTree"):
        contrastive_yield(tree, [adv])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- per token, per second
def test_contrast_counts_per_token_and_per_second_pool_as_sums() -> None:
    # run() writes 2 model tokens a turn; make_tree's trajectories have 2 turns: 4 tokens each
    first = [make_tree("a", [1, 0, 1]), make_tree("b", [1, 1])]  # 5 rollouts, 20 tokens, 1 mixed group
    second = [make_tree("c", [0, 1]), make_tree("d", [0, 1]), make_tree("e", [0, 1])]  # 6, 24, 3 mixed
    c1 = contrast_counts(first, [tree_advantages(t) for t in first], rollout_s=4.0)
    c2 = contrast_counts(second, [tree_advantages(t) for t in second], rollout_s=1.0)
    assert (c1.generated_tokens, c1.contrastive, c1.rollout_s) == (20, 3, 4.0)  # a's 3 rollouts carry signal
    assert (c2.generated_tokens, c2.contrastive) == (24, 6)
    assert c1.mixed_per_1k_tokens == pytest.approx(1000 / 20) and c1.mixed_per_rollout_s == 0.25
    assert c1.contrastive_per_1k_tokens == pytest.approx(3000 / 20)
    pooled = c1 + c2
    assert (pooled.mixed, pooled.generated_tokens, pooled.rollout_s, pooled.contrastive) == (4, 44, 5.0, 9)
    # ratios of the sums, not the means of the ratios (150 and 250 per 1k tokens; 0.25 and 3 per s)
    assert pooled.mixed_per_1k_tokens == pytest.approx(4000 / 44)
    assert pooled.contrastive_per_1k_tokens == pytest.approx(9000 / 44)
    assert pooled.mixed_per_rollout_s == pytest.approx(4 / 5)
    # trees alone hold neither seconds nor advantages: a pool with an unmeasured part is unmeasured
    bare = contrast_counts(second)
    assert bare.rollout_s is None and bare.contrastive is None and bare.generated_tokens == 24
    assert math.isnan((c1 + bare).mixed_per_rollout_s) and math.isnan((c1 + bare).contrastive_per_1k_tokens)
    assert (c1 + bare).mixed_per_1k_tokens == pytest.approx(4000 / 44)
    empty = ContrastCounts(0, 0, 0, 0, 0, 0, 0.0, 0)
    assert all(math.isnan(x) for x in (empty.mixed_per_1k_tokens, empty.contrastive_per_1k_tokens,
                                       empty.mixed_per_rollout_s))
    with pytest.raises(ValueError, match="rollout_s"):
        contrast_counts(first, rollout_s=float("nan"))


def test_rate_interval_is_the_poisson_score_interval() -> None:
    # 4 mixed groups in 2,000 tokens, per 1,000: (4 + z²/2 ∓ z·sqrt(4 + z²/4)) / 2 with z = 1.6449
    lo, hi = rate_interval(4, 2000, per=1000)
    assert lo == pytest.approx(0.8978918, abs=1e-6) and hi == pytest.approx(4.4548800, abs=1e-6)
    for bound in (lo, hi):  # each bound solves the score equation (count − λE)² = z²·λE
        mean = bound * 2000 / 1000
        assert (4 - mean) ** 2 == pytest.approx(WILSON_Z90 ** 2 * mean)
    # nothing seen: from 0 up to z² events over the exposure; nothing spent: no interval
    assert rate_interval(0, 500.0) == (0.0, pytest.approx(WILSON_Z90 ** 2 / 500))
    assert all(math.isnan(x) for x in rate_interval(3, 0.0))
    # more exposure at the same rate narrows it
    assert rate_interval(40, 20000, per=1000)[1] - rate_interval(40, 20000, per=1000)[0] < hi - lo
    with pytest.raises(ValueError, match="non-negative integer"):
        rate_interval(-1, 10.0)


# ---------------------------------------------------------------------------- Spearman
def test_spearman_with_ties_and_nans() -> None:
    # ranks: pred (1, 2.5, 2.5, 4), target (1, 3, 2, 4): rho = 4.5 / sqrt(4.5 * 5) = sqrt(0.9)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(math.sqrt(0.9))
    assert spearman([1, 2, 2, 3, np.nan, 7], [1, 3, 2, 4, 5, np.nan]) == pytest.approx(math.sqrt(0.9))
    assert spearman([3, 2, 1], [0.1, 0.5, 0.9]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1.0], [2.0]))
    assert math.isnan(spearman([1, 2, np.nan], [np.nan, 1, 1]))
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))  # constant side: undefined
    assert math.isnan(spearman([], []))
    with pytest.raises(ValueError, match="pred .* and target .* must have the same length"):
        spearman([1, 2, 3], [1, 2])


def test_predictor_spearman_at_roots_and_prefixes() -> None:
    t1 = RolloutTree("a")  # V̂(root) = 1/3
    a = run(t1, 3, 1.0)
    run(t1, 1, 0.0)
    run(t1, 1, 0.0, branch=a[0])  # A1 has 2 leaves below (V̂ = 1/2), A2 only 1 (V̂ = 1)
    t2 = make_tree("b", [1, 1])  # V̂(root) = 1; its anchors have 1 leaf each
    t3 = RolloutTree("c")  # V̂(root) = 0
    c = run(t3, 2, 0.0)
    run(t3, 1, 0.0, branch=c[0])  # C1: 2 leaves, V̂ = 0
    pred = [np.full(len(t.nodes), np.nan) for t in (t1, t2, t3)]
    pred[0][[ROOT, a[0], a[1]]] = [0.5, 0.2, 0.9]
    pred[1][ROOT] = 0.8
    pred[2][[ROOT, c[0]]] = [0.1, 0.7]
    (rp, rt), (pp, pt) = root_and_prefix_pairs([t1, t2, t3], pred)
    np.testing.assert_allclose(rt, [1 / 3, 1, 0])
    np.testing.assert_allclose(rp, [0.5, 0.8, 0.1])
    np.testing.assert_allclose(pt, [0.5, 0.0])  # A1 and C1; A2 has a single leaf below
    np.testing.assert_allclose(pp, [0.2, 0.7])
    result = predictor_spearman([t1, t2, t3], pred)
    assert result.root == pytest.approx(1.0)
    assert result.prefix == pytest.approx(-1.0)
    assert (result.num_roots, result.num_prefixes) == (3, 2)
    # with min_leaves=1, A2 and the single-leaf anchors enter (the unscored ones drop as NaN)
    _, (pp1, pt1) = root_and_prefix_pairs([t1, t2, t3], pred, min_leaves=1)
    np.testing.assert_allclose(pp1, [0.2, 0.9, 0.7])
    np.testing.assert_allclose(pt1, [0.5, 1.0, 0.0])
    with pytest.raises(ValueError, match="predictions must have one array per tree"):
        predictor_spearman([t1], pred)
    with pytest.raises(ValueError, match=r"predictions\[0\] must have one value per node"):
        predictor_spearman([t1], [pred[0][:-1]])
    with pytest.raises(ValueError, match="min_leaves"):
        predictor_spearman([t1], pred[:1], min_leaves=0)


# ---------------------------------------------------------------------------- allocation
def test_allocation_stats_hand_computed() -> None:
    m = [0, 0, 2, 4, 0, 3, 0, 0]
    k = [3, 0, 1, 2, 6]
    pos = [0.0, 0.25, 0.5, 0.5, 0.8]  # bins of width 0.2: 0, 1, 2, 2, 4
    stats = allocation_stats(m, k, pos)
    assert stats.pool_size == 8
    assert stats.skipped_share == pytest.approx(5 / 8)
    assert stats.mean_m_selected == pytest.approx(3.0)
    assert stats.mean_rollouts_selected == pytest.approx((9 + 12) / 3)
    np.testing.assert_array_equal(stats.m_histogram, [5, 0, 1, 1, 1])
    np.testing.assert_allclose(stats.position_bin_edges, [0, 0.2, 0.4, 0.6, 0.8, 1.0])
    np.testing.assert_array_equal(stats.k_by_position, [3, 0, 3, 0, 6])
    np.testing.assert_array_equal(stats.anchors_by_position, [1, 1, 2, 0, 1])
    np.testing.assert_allclose(stats.k_share_by_position, [0.25, 0, 0.25, 0, 0.5])
    assert stats.budget_trajectories == 21
    assert stats.generated_tokens is None


def test_allocation_stats_edge_cases() -> None:
    stats = allocation_stats([0, 0], [], [])
    assert stats.skipped_share == 1.0
    assert math.isnan(stats.mean_m_selected) and math.isnan(stats.mean_rollouts_selected)
    assert np.all(np.isnan(stats.k_share_by_position))
    assert stats.budget_trajectories == 0
    empty = allocation_stats([], [], [])
    assert empty.pool_size == 0 and math.isnan(empty.skipped_share)
    np.testing.assert_array_equal(empty.m_histogram, [0])


def test_allocation_stats_bad_input() -> None:
    with pytest.raises(ValueError, match="m must hold non-negative integers"):
        allocation_stats([2, -1], [], [])
    with pytest.raises(ValueError, match="m must hold non-negative integers"):
        allocation_stats([2.5], [], [])
    with pytest.raises(ValueError, match="anchor_k must hold non-negative integers"):
        allocation_stats([2], [np.nan], [0.5])
    with pytest.raises(ValueError, match="anchor_position .* and anchor_k .* same length"):
        allocation_stats([2], [1, 2], [0.5])
    with pytest.raises(ValueError, match=r"anchor_position values must lie in \[0, 1\)"):
        allocation_stats([2], [1], [1.0])
    with pytest.raises(ValueError, match="n_position_bins"):
        allocation_stats([2], [1], [0.5], n_position_bins=0)


def test_anchor_allocation_from_trees_and_token_budget() -> None:
    tree = RolloutTree("p")
    a = run(tree, 4, 1.0)  # anchors at t = 1, 2, 3 of T = 4
    run(tree, 2, 0.0)  # anchor at t = 1 of T = 2
    run(tree, 1, 0.0, branch=a[1])
    run(tree, 2, 1.0, branch=a[1])
    run(tree, 1, 0.0, branch=a[2])
    anchorless = RolloutTree("q")
    run(anchorless, 1, 1.0)  # one-turn bare rollout, not expanded: contributes no entry
    single = RolloutTree("r")
    run(single, 1, 1.0)
    run(single, 1, 0.0, kind="continuation")  # method §3: the budget went to the root
    run(single, 1, 1.0, kind="continuation")
    k, pos = anchor_allocation([tree, anchorless, single])
    np.testing.assert_array_equal(k, [0, 2, 1, 0, 2])
    np.testing.assert_allclose(pos, [0.25, 0.5, 0.75, 0.5, 0.0])
    stats = allocation_stats([2, 1, 0], k, pos, trees=[tree, single], n_position_bins=4)
    np.testing.assert_array_equal(stats.k_by_position, [2, 0, 2, 1])
    assert stats.budget_trajectories == 3 + 5
    # 2 model tokens per turn: tree has 4 + 2 + 1 + 2 + 1 turns, single has 3
    assert stats.generated_tokens == 2 * (10 + 3)


# ---------------------------------------------------------------------------- rewards
def test_reward_stats() -> None:
    tree = RolloutTree("p")
    a = run(tree, 3, 1.0, tool_error_at=1)
    run(tree, 1, 0.0)
    run(tree, 1, 0.6, branch=a[0], tool_error_at=0)  # path: A1 + its own node -> 2 turns
    everything = reward_stats([tree])
    assert everything.num_trajectories == 3
    assert everything.mean_reward == pytest.approx(1.6 / 3)
    assert everything.accuracy == pytest.approx(2 / 3)
    assert everything.mean_response_tokens == pytest.approx(2 * (3 + 1 + 2) / 3)
    assert everything.mean_turns == pytest.approx((3 + 1 + 2) / 3)
    assert everything.tool_error_rate == pytest.approx(2 / 5)  # own nodes: 3 + 1 + 1
    bare = reward_stats([tree], kind="bare")
    assert (bare.num_trajectories, bare.accuracy, bare.tool_error_rate) == (2, 0.5, 0.25)
    cont = reward_stats([tree], kind="continuation")
    assert (cont.num_trajectories, cont.mean_reward, cont.mean_turns) == (1, 0.6, 2.0)
    none = reward_stats([RolloutTree("e")])
    assert none.num_trajectories == 0 and math.isnan(none.mean_reward)
    with pytest.raises(ValueError, match="kind must be"):
        reward_stats([tree], kind="roots")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- one step
def test_step_metrics_count_every_rollout_and_train_only_on_the_kept_trees() -> None:
    trees = [make_tree("a", [1, 0, 1]), make_tree("b", [1, 1]), make_tree("c", [0, 1])]
    kept = [True, True, False]  # c: a mixed group a group filter dropped
    adv = [tree_advantages(t) for t in trees[:2]]
    k, pos = anchor_allocation(trees)
    alloc = allocation_stats([3, 2, 2, 0], k, pos, trees)
    m = step_metrics(trees, kept, adv, alloc, rounds=2)
    assert m["effective_ratio"] == pytest.approx(2 / 3)  # every sampled group, c included
    assert m["counts/mixed_groups"] == 2 and m["counts/mixed_groups_trained"] == 1
    assert m["counts/rollouts"] == 7 and m["rollouts_per_mixed_group"] == 7.0
    assert m["mixed_groups_per_100_rollouts"] == pytest.approx(100 / 7)
    assert m["counts/dropped_groups"] == 1 and m["counts/dropped_rollouts"] == 2
    assert m["contrastive_yield"] == pytest.approx(100 * 3 / 7)  # c's rollouts carry no signal
    # per token: 28 generated tokens (7 rollouts of 2 turns x 2 model tokens), every tree's
    assert m["counts/contrastive_rollouts"] == 3
    assert m["contrast/mixed_per_1k_tokens"] == pytest.approx(1000 * 1 / 28)  # mixed groups trained on
    assert m["contrast/yield_per_1k_tokens"] == pytest.approx(1000 * 3 / 28)
    assert "contrast/mixed_per_rollout_s" not in m  # no wall time given (a simulator has none)
    timed = step_metrics(trees, kept, adv, alloc, rounds=2, rollout_s=4.0)
    assert timed["contrast/mixed_per_rollout_s"] == 0.25
    assert m["alloc/skipped_share"] == 0.25 and m["alloc/rounds"] == 2
    assert m["reward/mean"] == pytest.approx(5 / 7)
    assert sum(m[f"alloc/k_position_bin{b}"] for b in range(5)) == 0
    with pytest.raises(ValueError, match="one flag per tree"):
        step_metrics(trees, kept[:2], adv, alloc)
    with pytest.raises(ValueError, match="kept tree"):
        step_metrics(trees, kept, [*adv, adv[0]], alloc)


# -- pass@1 with the question as the unit ------------------------------------------------------------


def test_pass_at_1_takes_its_error_from_the_spread_of_questions():
    from trace_core.metrics import pass_at_1

    p = pass_at_1({"a": 4, "b": 0, "c": 2, "d": 2}, 4)
    rates = np.array([1.0, 0.0, 0.5, 0.5])
    assert p.value == pytest.approx(0.5) and p.questions == 4
    assert p.se == pytest.approx(rates.std(ddof=1) / 2)
    # a question solved always or never is still one unit: the pooled binomial SE would be smaller
    assert p.se > np.sqrt(0.5 * 0.5 / 16)
    with pytest.raises(ValueError, match="samples"):
        pass_at_1({"a": 1}, 0)
    with pytest.raises(ValueError, match=r"\[0, 4\]"):
        pass_at_1({"a": 5}, 4)


def test_paired_difference_removes_the_questions_own_difficulty():
    from trace_core.metrics import paired_pass_difference, pass_at_1

    easy_hard = {f"q{i}": (8 if i % 2 else 0) for i in range(20)}
    better = {q: min(8, s + 1) if s == 0 else s for q, s in easy_hard.items()}  # +1/8 on every hard question
    d = paired_pass_difference(better, 8, easy_hard, 8)
    assert d.value == pytest.approx(pass_at_1(better, 8).value - pass_at_1(easy_hard, 8).value)
    assert d.value == pytest.approx(0.5 / 8)
    # the paired SE is far below the two unpaired SEs in quadrature
    unpaired = np.hypot(pass_at_1(better, 8).se, pass_at_1(easy_hard, 8).se)
    assert d.se < unpaired / 5
    # different sample counts compare as rates
    assert paired_pass_difference({"a": 2}, 4, {"a": 4}, 8).value == pytest.approx(0.0)
    with pytest.raises(ValueError, match="same questions"):
        paired_pass_difference({"a": 1}, 4, {"b": 1}, 4)
