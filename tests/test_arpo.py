"""ARPO (arXiv 2507.19849) as the registry method ``arpo``: its entropy features on hand-made trees,
its branch decisions and budget split, its advantage attribution worked by hand, and the method
run through the tree executor on the tiny policy (method §4, "ARPO")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trace_core.advantages import arpo_advantages, get_advantage_estimator, grpo_advantages
from trace_core.allocation import (
    AnchorSignals,
    ArpoPrefixes,
    BudgetSpec,
    EntropySignals,
    PrefixPlacement,
    roots_uniform,
)
from trace_core.arpo import ArpoConfig, anchor_entropy, arpo_placement, branch_order, window_entropy
from trace_core.methods import get_method
from trace_core.tree import ROOT, RolloutTree


class Draws:
    """A stand-in generator whose ``random()`` returns the given numbers in order."""

    def __init__(self, values: list[float]) -> None:
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def turn(tree: RolloutTree, traj: int, model_lp: list[float], obs: int = 2) -> int:
    """One turn of ``len(model_lp)`` model tokens with these log-probs, then ``obs`` observation tokens."""
    n = len(model_lp)
    return tree.add_turn(traj, list(range(10, 10 + n + obs)), [1] * n + [0] * obs, logprobs=model_lp + [0.0] * obs)


def two_rollouts() -> tuple[RolloutTree, list[int]]:
    """Two bare rollouts of three turns. Rollout 0 writes calm first tokens, then uncertain ones
    after its first tool result; rollout 1 the other way round."""
    tree = RolloutTree("q", [1, 2, 3])
    b0, b1 = tree.start_trajectory("bare"), tree.start_trajectory("bare")
    a = turn(tree, b0, [-0.1, -0.1, -0.1])  # node 1: initial window 0.3 nats
    turn(tree, b1, [-2.0, -2.0])  # node 2: initial window 4.0 nats
    b = turn(tree, b0, [-1.0, -1.0, -1.0, -5.0])  # node 3: after anchor 1 (k = 3: 3.0 nats)
    turn(tree, b1, [-0.5])  # node 4: after anchor 2: 0.5 nats
    turn(tree, b0, [-0.2])  # node 5: after anchor 3
    turn(tree, b1, [-0.3, -0.3])  # node 6: after anchor 4
    tree.finish(b0, 1.0)
    tree.finish(b1, 0.0)
    return tree, [a, b]


# ---------------------------------------------------------------------------- entropy features
def test_the_window_entropy_is_the_summed_surprise_of_the_first_k_model_tokens() -> None:
    tree, _ = two_rollouts()
    assert window_entropy(tree.nodes[3], 3) == pytest.approx(3.0)  # the 4th token lies outside the window
    assert window_entropy(tree.nodes[3], 20) == pytest.approx(8.0)  # a short turn: all of it
    tree.nodes[3].logprobs = None
    with pytest.raises(ValueError, match="no log-probs"):
        window_entropy(tree.nodes[3], 3)
    assert window_entropy(tree.nodes[0], 3) == 0.0  # the prompt: no model-written token


def test_anchor_entropy_reads_the_next_turn_against_the_rollouts_first() -> None:
    tree, _ = two_rollouts()
    anchors = tree.anchors()
    assert anchors == [1, 2, 3, 4]
    after, initial = anchor_entropy(tree, anchors, 3, 100)
    log_v = math.log(100)
    np.testing.assert_allclose(after * log_v, [3.0, 0.5, 0.2, 0.6])
    np.testing.assert_allclose(initial * log_v, [0.3, 4.0, 0.3, 4.0])
    change = EntropySignals(after, initial).change
    assert change[0] > 0 > change[1]  # rollout 0 grew uncertain after its first tool result
    with pytest.raises(ValueError, match="no anchor"):
        anchor_entropy(tree, [5], 3, 100)  # a final turn


# ---------------------------------------------------------------------------- branch decisions
def test_a_trial_branches_when_u_minus_beta_delta_h_is_at_most_tau() -> None:
    cfg = ArpoConfig(entropy_weight=0.2, branch_threshold=0.5, beam_size=2)
    turns = np.array([1, 1, 1])
    # ΔH = 1.0 lowers the draw by 0.2: u = 0.65 → 0.45 branches; ΔH = −1.0 raises 0.4 → 0.6: no branch;
    # ΔH = 0: u = 0.5 sits at τ and branches
    K, extra = arpo_placement(turns, None, np.array([1.0, -1.0, 0.0]), 5, cfg, Draws([0.65, 0.4, 0.5]))
    assert K.tolist() == [1, 0, 1] and extra == 3
    # a large rise always branches (clipped to 0), a large fall never does (clipped to 1)
    K, extra = arpo_placement(turns, None, np.array([10.0, -10.0, 10.0]), 5, cfg, Draws([0.99, 0.0, 0.99]))
    assert K.tolist() == [1, 0, 1] and extra == 3


def test_each_anchor_gets_up_to_z_minus_one_trials_turn_by_turn_until_the_budget_is_spent() -> None:
    turns, rollout = np.array([2, 1, 1, 2]), np.array([0, 1, 0, 1])
    assert branch_order(turns, rollout).tolist() == [2, 1, 0, 3]  # turn 1 (rollouts 0, 1), then turn 2
    cfg = ArpoConfig(beam_size=3)  # two trials an anchor
    always = np.full(4, 100.0)
    K, extra = arpo_placement(turns, rollout, always, 5, cfg, Draws([0.5] * 5))
    assert K.tolist() == [1, 2, 2, 0] and extra == 0  # the budget runs out at the last anchor met
    K, extra = arpo_placement(turns, rollout, always, 20, cfg, Draws([0.5] * 8))
    assert K.tolist() == [2, 2, 2, 2] and extra == 12  # the rest fills with global rollouts
    K, extra = arpo_placement(turns, rollout, always, 0, cfg, Draws([]))
    assert K.tolist() == [0, 0, 0, 0] and extra == 0


def test_the_budget_split_through_the_registry_method() -> None:
    """``m_i·N`` per prompt: branches first, global rollouts fill the rest; no anchor: all global."""
    arpo = get_method("arpo")
    assert arpo.root_rule is roots_uniform and arpo.prefix_budget(4, 1) == 4 and arpo.prefix_budget(4, 3) == 12
    assert arpo.entropy_window == 20 and arpo.reads_entropy and not arpo.uses_predictor
    assert not get_method("trace").reads_entropy and get_method("trace").entropy_window is None
    tree, _ = two_rollouts()
    anchors = tree.anchors()
    after, initial = anchor_entropy(tree, anchors, 20, 100)
    signals = AnchorSignals(np.full(4, 0.5), np.array([1.0, 0.0, 1.0, 0.0]), np.array([1, 1, 2, 2]),
                            np.array([0, 1, 0, 1]), EntropySignals(after, initial))
    draws = [0.55, 0.55, 0.55, 0.55]  # branches where ΔH > (0.55 − 0.5)/0.2 = 0.25 (normalised)
    placed = arpo.place_prefixes(signals, 4, Draws(draws))
    want = (signals.entropy.change > 0.25).astype(np.int64)
    assert placed.K.tolist() == want.tolist() and placed.extra_roots == 4 - int(want.sum())
    empty = AnchorSignals(np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64))
    placed = arpo.place_prefixes(empty, 4, Draws([]))
    assert isinstance(placed, PrefixPlacement) and placed.K.size == 0 and placed.extra_roots == 4
    with pytest.raises(ValueError, match="entropy signals"):
        ArpoPrefixes()(AnchorSignals(np.array([0.5]), np.array([1.0]), np.array([1])), 1, Draws([0.1]))
    spec = BudgetSpec(roots_M=8, expansion_N=1, group_size_G=4, pool_factor=1)
    m = arpo.allocate_roots(np.full(spec.pool_size, 0.5), spec, np.random.default_rng(0))
    assert sorted(m.tolist()) == [0, 0, 4, 4]  # M/G prompts × G global rollouts


def test_bad_configs_are_errors() -> None:
    for bad in ({"entropy_window": 0}, {"beam_size": 1}, {"branch_threshold": 1.5}, {"entropy_weight": math.inf}):
        with pytest.raises(ValueError):
            ArpoConfig(**bad)
    with pytest.raises(ValueError, match="one entry per anchor"):
        arpo_placement(np.array([1, 2]), None, np.array([0.0]), 1, ArpoConfig(), Draws([]))


# ---------------------------------------------------------------------------- advantage attribution
def branched_tree() -> RolloutTree:
    """Bare b0: n1 → n2 (success); bare b1: n3 → n4 (failure); a continuation from anchor n1: n5 (failure)."""
    tree = RolloutTree("q", [1])
    b0, b1 = tree.start_trajectory("bare"), tree.start_trajectory("bare")
    turn(tree, b0, [-1.0])  # 1
    turn(tree, b1, [-1.0])  # 2
    turn(tree, b0, [-1.0], obs=0)  # 3
    turn(tree, b1, [-1.0], obs=0)  # 4
    tree.finish(b0, 1.0)
    tree.finish(b1, 0.0)
    c = tree.start_trajectory("continuation", branch_node=1)
    turn(tree, c, [-1.0], obs=0)  # 5
    tree.finish(c, 0.0)
    return tree


def test_hard_and_soft_attribution_on_a_tree_worked_by_hand() -> None:
    tree = branched_tree()
    # rewards (1, 0, 0): mean 1/3, unbiased std √(1/3); GRPO gives b0 2/√3, b1 and c −1/√3
    hi, lo = 2 / math.sqrt(3), -1 / math.sqrt(3)
    hard = arpo_advantages(tree, soft=False)
    soft = arpo_advantages(tree, soft=True)
    # node 1 is shared by b0 and c: the mean (hard) or the sum (soft); the others belong to one trajectory
    np.testing.assert_allclose(hard, [0.0, (hi + lo) / 2, lo, hi, lo, lo], atol=1e-5)
    np.testing.assert_allclose(soft, [0.0, hi + lo, lo, hi, lo, lo], atol=1e-5)
    assert [a.tolist() for a in get_advantage_estimator("arpo-hard")([tree])] == [hard.tolist()]
    assert [a.tolist() for a in get_advantage_estimator("arpo-soft")([tree])] == [soft.tolist()]
    assert get_method("arpo").advantage_estimator() is get_advantage_estimator("arpo-soft")


def test_without_branches_both_attributions_are_grpo() -> None:
    tree, _ = two_rollouts()
    extra = tree.start_trajectory("continuation", branch_node=ROOT)  # a global fill rollout
    turn(tree, extra, [-1.0], obs=0)
    tree.finish(extra, 1.0)
    grpo = grpo_advantages(tree)
    np.testing.assert_array_equal(arpo_advantages(tree, soft=False), grpo)
    np.testing.assert_array_equal(arpo_advantages(tree, soft=True), grpo)
    uniform = branched_tree()
    for leaf in uniform.leaves():
        uniform.nodes[leaf].reward = 1.0
    assert not arpo_advantages(uniform).any()  # one outcome: no signal


# ---------------------------------------------------------------------------- through the executor
def test_arpo_runs_through_the_executor_and_branches_where_its_rule_says(hf_engine, tiny_tokenizer) -> None:
    from trace_core.rollout.agent import AgentConfig
    from trace_core.rollout.env import FixedTurnsEnvironment, Task
    from trace_core.rollout.executor import TreeRolloutExecutor, expansion_of

    agent = AgentConfig(max_turns=8, max_new_tokens=6, max_total_tokens=1024, temperature=1.0, seed=7)
    tasks = [Task(id=f"q{i}", question=f"What is {i} + {i}?", answer=str(2 * i), metadata={"turns": 3})
             for i in range(2)]
    def env(task: Task) -> FixedTurnsEnvironment:
        return FixedTurnsEnvironment(num_turns=task.metadata["turns"])

    executor = TreeRolloutExecutor(hf_engine, tiny_tokenizer, env, agent, tool_workers=0)
    arpo = get_method("arpo")
    N = 2
    result = executor.run(tasks, [3, 0], expansion_of(arpo, N, lambda tree, nodes: np.full(len(nodes), 0.5)),
                          np.random.default_rng(11))
    tree = result.trees[0]
    assert len(tree.trajectories) == 3 * (1 + N) == result.stats.trajectories
    # the placement is ARPO's rule on the features of the finished bare rollouts, with the run's generator
    anchors = tree.anchors()
    after, initial = anchor_entropy(tree, anchors, 20, len(tiny_tokenizer))
    assert np.all(after > 0) and np.all(initial > 0)  # a random policy is unsure of every token
    turns = np.array([tree.nodes[a].depth for a in anchors])
    rollout = np.array([tree.nodes[a].trajectory for a in anchors])
    K, extra = arpo_placement(turns, rollout, after - initial, 3 * N, ArpoConfig(), np.random.default_rng(11))
    want = {int(a): int(k) for a, k in zip(anchors, K, strict=True) if k > 0}
    if extra:
        want[ROOT] = extra
    assert result.continuations_per_anchor["q0"] == want
    starts: dict[int, int] = {}
    for t in tree.trajectories:
        if t.kind == "continuation":
            starts[t.branch_node] = starts.get(t.branch_node, 0) + 1
    assert starts == want and all(k <= 1 for a, k in want.items() if a != ROOT)  # Z − 1 = 1 per anchor
    adv = arpo.advantage_estimator()(result.trees)
    assert len(adv) == 1 and np.all(np.isfinite(adv[0])) and adv[0][ROOT] == 0.0
