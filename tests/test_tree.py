"""Rollout tree: structure, anchors, method §5 targets, method §6 branch-uniform values, serialization."""

from __future__ import annotations

import numpy as np
import pytest

from trace_core.tree import RolloutTree


def build_example() -> RolloutTree:
    """Prompt with two bare rollouts (3 turns, success; 2 turns, failure) and two continuations
    from the first bare rollout's turn-1 anchor (one success, one failure)."""
    tree = RolloutTree("p0", prompt_token_ids=[1, 2, 3])
    a = tree.start_trajectory("bare")
    a1 = tree.add_turn(a, [10, 11, 90], [1, 1, 0], logprobs=[-0.1, -0.2, 0.0], info={"action": "search"})
    tree.add_turn(a, [12, 91], [1, 0])
    tree.add_turn(a, [13], [1])
    tree.finish(a, 1.0)
    b = tree.start_trajectory("bare")
    tree.add_turn(b, [20, 92], [1, 0])
    tree.add_turn(b, [21], [1])
    tree.finish(b, 0.0)
    for reward in (1.0, 0.0):
        c = tree.start_trajectory("continuation", branch_node=a1)
        tree.add_turn(c, [30 + int(reward)], [1])
        tree.finish(c, reward)
    return tree


def test_structure_and_anchors() -> None:
    tree = build_example()
    tree.validate()
    assert len(tree) == 8
    assert tree.anchors() == [1, 2, 4]  # non-terminal nodes of bare rollouts
    assert tree.expanded_anchors() == [1]
    assert tree.branching_nodes() == [0, 1]
    assert sorted(tree.leaves()) == [3, 5, 6, 7]
    assert tree.history_tokens(3) == [1, 2, 3, 10, 11, 90, 12, 91, 13]
    assert tree.history_loss_mask(3) == [0, 0, 0, 1, 1, 0, 1, 0, 1]
    # A continuation's history starts with its anchor's history, token for token.
    assert tree.history_tokens(6)[: len(tree.history_tokens(1))] == tree.history_tokens(1)
    assert tree.relative_position(1) == pytest.approx(1 / 3)
    assert tree.branch_group(1) == [0, 2, 3]
    assert tree.num_generated_tokens() == 8


def test_tree_backed_targets_are_leaf_means() -> None:
    tree = build_example()
    n = tree.leaf_counts()
    v = tree.tree_values()
    assert n[0] == 4 and n[1] == 3 and n[4] == 1
    assert v[1] == pytest.approx(2 / 3)  # leaves 3 (1), 6 (1), 7 (0)
    assert v[0] == pytest.approx(2 / 4)
    # Recursive definition: V̂(y) = Σ_c n_c V̂(c) / n_y.
    for node in tree.nodes:
        if node.children:
            rec = sum(n[c] * v[c] for c in node.children) / n[node.id]
            assert v[node.id] == pytest.approx(rec)


def test_branch_uniform_values_count_each_child_once() -> None:
    tree = build_example()
    u = tree.branch_uniform_values()
    assert u[1] == pytest.approx((1.0 + 1.0 + 0.0) / 3)
    assert u[0] == pytest.approx((u[1] + 0.0) / 2)
    assert u[2] == u[3] == 1.0


def test_json_round_trip_is_lossless() -> None:
    tree = build_example()
    tree.nodes[1].logprobs = [-0.1234567890123456789, -1e-300, 0.0]
    text = tree.to_json()
    back = RolloutTree.from_json(text)
    assert back == tree
    assert back.to_json() == text
    assert back.nodes[1].logprobs == tree.nodes[1].logprobs
    np.testing.assert_array_equal(back.tree_values(), tree.tree_values())


def test_building_errors_name_the_problem() -> None:
    tree = RolloutTree("p", [1])
    with pytest.raises(ValueError, match="a bare rollout starts at the root"):
        t = tree.start_trajectory("bare")
        tree.add_turn(t, [5], [1])
        tree.start_trajectory("bare", branch_node=1)
    with pytest.raises(ValueError, match="token_ids \\(2\\) and loss_mask \\(1\\)"):
        tree.add_turn(0, [1, 2], [1])
    with pytest.raises(ValueError, match="loss_mask values must be 0 or 1"):
        tree.add_turn(0, [1], [2])
    tree.finish(0, 1.0)
    with pytest.raises(ValueError, match="trajectory 0 is finished"):
        tree.add_turn(0, [1], [1])
    with pytest.raises(ValueError, match="branch_node 1 is terminal"):
        tree.start_trajectory("continuation", branch_node=1)
    with pytest.raises(ValueError, match="trajectory kind"):
        tree.start_trajectory("root")  # type: ignore[arg-type]


def test_unfinished_leaf_is_reported() -> None:
    tree = RolloutTree("q", [1])
    t = tree.start_trajectory("bare")
    tree.add_turn(t, [2], [1])
    with pytest.raises(ValueError, match="prompt 'q': node 1 is a leaf without a reward"):
        tree.tree_values()


def test_from_dict_rejects_foreign_data() -> None:
    with pytest.raises(ValueError, match="not a rollout tree"):
        RolloutTree.from_dict({"format": "something-else"})
    data = build_example().to_dict()
    data["nodes"][3]["depth"] = 7
    with pytest.raises(ValueError, match="node 3: depth 7"):
        RolloutTree.from_dict(data)
