"""Tests for trace_core.advantages (method §6)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_core.advantages import (
    ADVANTAGE_ESTIMATORS,
    EPS,
    UNIFORM_RTOL,
    get_advantage_estimator,
    grpo_advantages,
    token_advantages,
    tree_advantages,
    treepo_advantages,
    treepo_leaf_scores,
)
from trace_core.tree import ROOT, RolloutTree

SQRT_HALF = math.sqrt(0.5)


def run(tree: RolloutTree, turns: int, reward: float, branch: int = ROOT, kind: str | None = None) -> list[int]:
    """Add a trajectory of ``turns`` turns (2 model tokens + 1 observation token each) and
    finish it with ``reward``; returns its node ids."""
    kind = kind or ("bare" if branch == ROOT else "continuation")
    traj = tree.start_trajectory(kind, branch_node=branch)  # type: ignore[arg-type]
    nodes = [tree.add_turn(traj, [5, 6, 7], [1, 1, 0]) for _ in range(turns)]
    tree.finish(traj, reward)
    return nodes


def naive_tree_advantages(tree: RolloutTree, scale_by_std: bool = True) -> np.ndarray:
    """method §6 read literally, node by node, walking each node's path (a reference)."""
    u = tree.branch_uniform_values()
    out = np.zeros(len(tree.nodes))
    for y in range(1, len(tree.nodes)):
        path = tree.path(y)
        branching = [a for a in path[:-1] if a == ROOT or len(tree.nodes[a].children) >= 2]
        a = branching[-1]
        c_y = path[path.index(a) + 1]
        group = [u[c] for c in tree.nodes[a].children]
        if len(group) < 2 or np.ptp(group) <= UNIFORM_RTOL:
            continue
        num = u[c_y] - np.mean(group)
        out[y] = num / (np.std(group, ddof=1) + EPS) if scale_by_std else num
    return out


def random_tree(rng: np.random.Generator, binary: bool = True) -> RolloutTree:
    tree = RolloutTree("p")
    for _ in range(rng.integers(1, 5)):
        run(tree, int(rng.integers(1, 5)), float(rng.integers(0, 2) if binary else rng.random()))
    for _ in range(rng.integers(0, 8)):
        anchors = tree.anchors()
        branch = int(rng.choice(anchors)) if anchors else ROOT
        run(tree, int(rng.integers(1, 4)), float(rng.integers(0, 2) if binary else rng.random()),
            branch=branch, kind="continuation")
    return tree


# ---------------------------------------------------------------------------- GRPO equivalence
@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.integers(1, 4), st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0, 1))),
        min_size=1, max_size=12,
    ),
    st.booleans(),
)
def test_tree_equals_grpo_on_root_only_trees(trajs: list[tuple[int, float]], scale_by_std: bool) -> None:
    tree = RolloutTree("p")
    node_sets = []
    for i, (turns, reward) in enumerate(trajs):
        # odd ones are method §3's extra root rollouts (continuations from the root)
        node_sets.append(run(tree, turns, reward, kind="bare" if i % 2 == 0 else "continuation"))
    rewards = np.array([r for _, r in trajs])
    tree_adv = tree_advantages(tree, scale_by_std=scale_by_std)
    grpo_adv = grpo_advantages(tree, scale_by_std=scale_by_std)
    np.testing.assert_allclose(tree_adv, grpo_adv, rtol=1e-12, atol=1e-12)
    # and both equal the textbook formula with the unbiased std (a spread within float rounding
    # counts as a uniform group, whose exact advantage is 0)
    if len(rewards) >= 2 and np.ptp(rewards) > UNIFORM_RTOL:
        centred = rewards - rewards.mean()
        expected = centred / (rewards.std(ddof=1) + EPS) if scale_by_std else centred
    else:
        expected = np.zeros(len(rewards))
    for nodes, a in zip(node_sets, expected, strict=True):
        np.testing.assert_allclose(tree_adv[nodes], a, rtol=1e-12, atol=1e-12)
    assert tree_adv[ROOT] == 0.0


def test_matches_literal_reference_on_random_trees() -> None:
    rng = np.random.default_rng(0)
    for i in range(200):
        tree = random_tree(rng, binary=i % 2 == 0)
        for scale in (True, False):
            np.testing.assert_allclose(
                tree_advantages(tree, scale_by_std=scale), naive_tree_advantages(tree, scale), atol=1e-12
            )


# ---------------------------------------------------------------------------- method §6 examples
def worked_example() -> tuple[RolloutTree, list[int], list[int], list[list[int]]]:
    """Bare A succeeds and gets 10 successful continuations from its anchor; bare B fails."""
    tree = RolloutTree("p")
    a = run(tree, 2, 1.0)
    b = run(tree, 3, 0.0)
    conts = [run(tree, 1 + i % 2, 1.0, branch=a[0]) for i in range(10)]
    return tree, a, b, conts


def test_spec_worked_example() -> None:
    tree, a, b, conts = worked_example()
    adv = tree_advantages(tree)
    assert adv[a[0]] == pytest.approx(SQRT_HALF, abs=1e-5)  # the A branch at the root
    np.testing.assert_allclose(adv[b], -SQRT_HALF, atol=1e-5)  # every node of B
    # below A's anchor every sibling succeeded: no contrast there
    assert adv[a[1]] == 0.0
    assert all(adv[n] == 0.0 for c in conts for n in c)
    # the leaf-weighted alternative (one group of 12 leaves, same unbiased std) gives the spec's
    # +0.29 / −3.18 instead, i.e. the heavily expanded branch swamps its sibling
    leaf_rewards = np.array([1.0] * 11 + [0.0])
    leaf_weighted = (leaf_rewards - leaf_rewards.mean()) / (leaf_rewards.std(ddof=1) + EPS)
    assert leaf_weighted[0] == pytest.approx(0.29, abs=0.005)
    assert leaf_weighted[-1] == pytest.approx(-3.18, abs=0.005)
    assert not np.isclose(leaf_weighted[0], adv[a[0]], atol=0.1)
    assert not np.isclose(leaf_weighted[-1], adv[b[0]], atol=0.1)


def test_continuations_and_bare_sibling_form_the_anchor_group() -> None:
    tree = RolloutTree("p")
    a = run(tree, 3, 0.0)  # A1 -> A2 -> A3, fails
    b = run(tree, 2, 1.0)
    c1 = run(tree, 2, 1.0, branch=a[0])
    c2 = run(tree, 1, 1.0, branch=a[0])
    adv = tree_advantages(tree)
    # group at A1: bare continuation A2.. (U=0) and the two continuations (U=1)
    group = np.array([0.0, 1.0, 1.0])
    std = group.std(ddof=1)
    np.testing.assert_allclose(adv[a[1:]], (0 - 2 / 3) / (std + EPS))
    np.testing.assert_allclose(adv[c1 + c2], (1 - 2 / 3) / (std + EPS))
    # root group: U(A1) = mean(0, 1, 1) = 2/3 (each child once), U(B1) = 1
    root = np.array([2 / 3, 1.0])
    assert adv[a[0]] == pytest.approx((2 / 3 - root.mean()) / (root.std(ddof=1) + EPS))
    np.testing.assert_allclose(adv[b], (1 - root.mean()) / (root.std(ddof=1) + EPS))


def test_uniform_group_gives_exact_zero() -> None:
    tree = RolloutTree("p")
    nodes = [run(tree, 2, 0.1) for _ in range(3)]  # 0.1 is not exact in binary: mean may round
    conts = [run(tree, 1, 0.1, branch=nodes[0][0]) for _ in range(2)]
    adv = tree_advantages(tree)
    assert np.all(adv == 0.0)
    assert all(grpo_advantages(RolloutTree("q")) == 0.0)
    assert len(conts) == 2


def test_single_child_group_gives_zero() -> None:
    tree = RolloutTree("p")
    only = run(tree, 3, 1.0)
    assert np.all(tree_advantages(tree) == 0.0)
    assert np.all(grpo_advantages(tree) == 0.0)
    # a single bare rollout whose anchor was expanded: the root group has one child (A = 0 for
    # A1), while the anchor's group of three gives signal below it
    c = run(tree, 1, 0.0, branch=only[0])
    adv = tree_advantages(tree)
    assert adv[only[0]] == 0.0
    assert adv[only[1]] > 0 > adv[c[0]]


def test_scale_by_std_false_is_centred_u() -> None:
    tree = RolloutTree("p")
    a = run(tree, 2, 1.0)
    b = run(tree, 1, 0.0)
    c = run(tree, 1, 0.0, branch=a[0])
    adv = tree_advantages(tree, scale_by_std=False)
    # root: U(A1) = 0.5, U(B1) = 0 -> mean 0.25; anchor A1: U = 1, 0 -> mean 0.5
    assert adv[a[0]] == pytest.approx(0.25)
    assert adv[b[0]] == pytest.approx(-0.25)
    assert adv[a[1]] == pytest.approx(0.5)
    assert adv[c[0]] == pytest.approx(-0.5)
    scaled = tree_advantages(tree)
    assert scaled[a[0]] == pytest.approx(0.25 / (np.std([0.5, 0.0], ddof=1) + EPS))


# ---------------------------------------------------------------------------- tokens
def test_token_advantages_pack_each_node_once() -> None:
    tree, a, b, conts = worked_example()
    adv = tree_advantages(tree)
    packed = token_advantages(tree, adv)
    assert packed.num_loss_tokens == tree.num_generated_tokens()
    assert packed.node.size == sum(len(n.token_ids) for n in tree.nodes)
    for n in tree.nodes:
        sel = packed.node == n.id
        np.testing.assert_array_equal(packed.loss_mask[sel], n.loss_mask)
        np.testing.assert_array_equal(packed.advantage[sel], np.where(np.array(n.loss_mask) == 1, adv[n.id], 0))
    with pytest.raises(ValueError, match="one value per node"):
        token_advantages(tree, adv[:-1])


# ---------------------------------------------------------------------------- TreePO
def test_treepo_on_hand_computed_tree() -> None:
    tree = RolloutTree("p")
    a = run(tree, 2, 1.0)  # A1 -> A2 (r = 1)
    b = run(tree, 1, 0.0)  # B1 (r = 0)
    c = run(tree, 1, 0.0, branch=a[0])  # C1 from A1 (r = 0)
    # groups: root (3 leaves, mean 1/3) and A1 (2 leaves, mean 1/2)
    raw = {
        a[1]: (3 * (1 - 1 / 3) + 2 * (1 - 1 / 2)) / 5,  # 0.6
        c[0]: (3 * (0 - 1 / 3) + 2 * (0 - 1 / 2)) / 5,  # -0.4
        b[0]: 0 - 1 / 3,  # the root is B1's only group
    }
    scores = treepo_leaf_scores(tree)
    assert scores.keys() == raw.keys()
    for leaf, value in raw.items():
        assert scores[leaf] == pytest.approx(value)
    values = np.array(list(raw.values()))
    whitened = dict(zip(raw, (values - values.mean()) / (values.std(ddof=1) + EPS), strict=True))
    (adv,) = treepo_advantages([tree])
    for leaf, w in whitened.items():
        assert adv[leaf] == pytest.approx(w)
    assert adv[a[0]] == pytest.approx((whitened[a[1]] + whitened[c[0]]) / 2)  # shared node
    assert adv[ROOT] == 0.0
    assert adv.sum() != 0


def test_treepo_whitens_over_the_batch() -> None:
    t1, t2, lone = RolloutTree("a"), RolloutTree("b"), RolloutTree("c")
    x = run(t1, 1, 1.0), run(t1, 1, 0.0)
    y = run(t2, 2, 1.0), run(t2, 1, 1.0), run(t2, 1, 0.0)
    lone_nodes = run(lone, 2, 1.0)  # one leaf: no group, stays 0 and stays out of the statistics
    adv = treepo_advantages([t1, t2, lone])
    raw = np.array([0.5, -0.5, 1 / 3, 1 / 3, -2 / 3])
    white = (raw - raw.mean()) / (raw.std(ddof=1) + EPS)
    got = [adv[0][x[0][0]], adv[0][x[1][0]], adv[1][y[0][-1]], adv[1][y[1][0]], adv[1][y[2][0]]]
    np.testing.assert_allclose(got, white)
    assert np.all(adv[2][lone_nodes] == 0.0)
    # batch-level: the same tree whitened alone differs
    (alone,) = treepo_advantages([t1])
    assert not np.isclose(alone[x[0][0]], adv[0][x[0][0]])


# ---------------------------------------------------------------------------- registry and input
def test_registry_names_and_equivalence() -> None:
    assert set(ADVANTAGE_ESTIMATORS) == {"tree", "tree-no-std", "grpo", "treepo", "arpo-hard", "arpo-soft"}
    rng = np.random.default_rng(1)
    trees = []
    for k in range(4):
        tree = RolloutTree(str(k))
        for _ in range(4):
            run(tree, int(rng.integers(1, 4)), float(rng.integers(0, 2)))
        trees.append(tree)
    for a, b in zip(get_advantage_estimator("tree")(trees), get_advantage_estimator("grpo")(trees), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-12)
    assert all(len(a) == len(t.nodes) for a, t in zip(get_advantage_estimator("treepo")(trees), trees, strict=True))
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'ppo'.*'grpo'.*'tree'"):
        get_advantage_estimator("ppo")


def test_bad_input() -> None:
    tree, *_ = worked_example()
    with pytest.raises(ValueError, match="grpo needs a root-only tree"):
        grpo_advantages(tree)
    with pytest.raises(ValueError, match="eps"):
        tree_advantages(tree, eps=-1.0)
    with pytest.raises(ValueError, match="single RolloutTree"):
        get_advantage_estimator("tree")(tree)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"trees\[1\]"):
        get_advantage_estimator("treepo")([tree, "x"])  # type: ignore[list-item]
    unfinished = RolloutTree("u")
    run(unfinished, 1, 1.0)
    traj = unfinished.start_trajectory("bare")
    unfinished.add_turn(traj, [1], [1])
    for name in ADVANTAGE_ESTIMATORS:
        with pytest.raises(ValueError, match="unfinished"):
            get_advantage_estimator(name)([unfinished])
