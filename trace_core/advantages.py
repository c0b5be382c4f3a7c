"""Advantage estimators over rollout trees (method §6).

Every estimator maps a batch of rollout trees to one float array per tree, indexed by node id:
the advantage of each generated turn node. A node is trained once (the tree is packed, shared
prefixes are not repeated per leaf), so the advantage lives on the node, and
:func:`token_advantages` spreads it over the node's model-written tokens.

Estimators, chosen by name through :func:`get_advantage_estimator`:

``"tree"``
    method §6's tree-aware advantage: each node is compared with the siblings of its branch at
    its nearest branching ancestor, using branch-uniform values ``U`` and the unbiased std.
``"tree-no-std"``
    The same without the std divisor (Dr. GRPO style).
``"grpo"``
    Plain GRPO over the trajectories of a root-only tree (every trajectory starts at the root).
    On such trees it equals ``"tree"``; on a tree with continuations it is undefined and raises.
``"treepo"``
    The TreePO baseline's advantage (Li et al. 2025) as method §6 states it: a size-weighted
    average of leaf-vs-subgroup differences over the leaf's branching ancestors, whitened over
    the batch; a shared node takes the mean over the leaves below it.
``"arpo-hard"``, ``"arpo-soft"``
    ARPO's advantage attribution (arXiv 2507.19849): GRPO's advantage of every trajectory of the
    prompt's tree, then a node shared by ``d`` trajectories takes their mean (hard) or, as ARPO's
    default GRPO loss over duplicated sequences weighs a shared token ``d`` times, their sum
    (soft); a node of one trajectory takes that trajectory's advantage under both.

Conventions shared by all estimators: the root holds only prompt tokens, which are never
trained on, so its advantage is **0.0** (not NaN), which keeps token-level sums safe. Trees must
be complete (every trajectory finished); :class:`~trace_core.tree.RolloutTree` raises a
ValueError otherwise. Pure numpy; no torch, no tracking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from trace_core.tree import ROOT, RolloutTree

EPS = 1e-6  # method §6's ε in the std divisor
# A group whose values differ by at most this (relative to max(1, |value|)) is uniform: such a
# spread is float rounding of U's means (mean(0.1, 0.1, 0.1) != 0.1), not contrast.
UNIFORM_RTOL = 1e-12


# ---------------------------------------------------------------------------- tree-aware (method §6)
def branch_groups(tree: RolloutTree) -> tuple[np.ndarray, np.ndarray]:
    """For every node ``y``, its nearest branching ancestor ``a(y)`` and the child ``c_y`` of
    ``a(y)`` on the path to ``y``.

    A branching node is the root or a node with ≥ 2 children (method §6). Returns two int64
    arrays indexed by node id; both are -1 at the root. One forward sweep suffices because a
    parent's id is smaller than its children's.
    """
    size = len(tree.nodes)
    group = np.full(size, -1, dtype=np.int64)
    branch = np.full(size, -1, dtype=np.int64)
    for node in tree.nodes[1:]:
        p = node.parent
        if p == ROOT or len(tree.nodes[p].children) >= 2:
            group[node.id], branch[node.id] = p, node.id
        else:  # a non-branching parent passes its own group on
            group[node.id], branch[node.id] = group[p], branch[p]
    return group, branch


def tree_advantages(tree: RolloutTree, scale_by_std: bool = True, eps: float = EPS) -> np.ndarray:
    """method §6's tree-aware advantage of every node of ``tree`` (0.0 at the root).

    ``A(y) = (U(c_y) − mean_{c∈C(a)} U(c)) / (std_{c∈C(a)} U(c) + ε)`` with ``a = a(y)``,
    ``U`` the branch-uniform value (:meth:`RolloutTree.branch_uniform_values`) and the unbiased
    (ddof=1) std; ``U(c_y) = U(y)`` because the chain from ``c_y`` to ``y`` does not branch.
    ``scale_by_std=False`` drops the divisor. A group with a single child (only possible at the
    root) gives 0, and so does a group whose values are all equal: its numerator is exactly 0
    in exact arithmetic, and we return that exact 0 rather than float rounding divided by ε
    (``U`` is a mean of means, so equal rewards can differ in the last bit; see
    :data:`UNIFORM_RTOL`).
    """
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    u = tree.branch_uniform_values()
    _, branch = branch_groups(tree)
    # advantage of each branch child c (a child of a branching node); every other node inherits
    # the value of its c_y
    child_adv = np.zeros(len(tree.nodes), dtype=np.float64)
    for a in tree.branching_nodes():
        children = tree.nodes[a].children
        if len(children) < 2:
            continue  # single-child (or empty) root group: no baseline, A = 0
        values = u[children]
        if _is_uniform(values):
            continue  # uniform group: A = 0 exactly
        centred = values - values.mean()
        if scale_by_std:
            centred = centred / (values.std(ddof=1) + eps)
        child_adv[children] = centred
    adv = np.zeros(len(tree.nodes), dtype=np.float64)
    adv[1:] = child_adv[branch[1:]]
    return adv


def tree_advantages_batch(
    trees: Sequence[RolloutTree], scale_by_std: bool = True, eps: float = EPS
) -> list[np.ndarray]:
    """:func:`tree_advantages` for each tree (the groups never cross trees)."""
    return [tree_advantages(t, scale_by_std=scale_by_std, eps=eps) for t in as_tree_list(trees)]


# ---------------------------------------------------------------------------- plain GRPO
def grpo_advantages(tree: RolloutTree, scale_by_std: bool = True, eps: float = EPS) -> np.ndarray:
    """GRPO's advantage for a root-only tree: ``(r_j − mean r) / (std r + ε)`` over its finished
    trajectories (unbiased std), given to every node of trajectory ``j``; 0.0 at the root and
    for a tree with fewer than two trajectories or uniform rewards.

    Root-only means every trajectory starts at the root (bare rollouts, and method §3's extra root
    rollouts of an anchorless prompt). On a tree with continuations a shared node belongs to
    several outcomes and per-trajectory GRPO is undefined: that raises ValueError.
    """
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    off_root = [t.id for t in tree.trajectories if t.branch_node != ROOT]
    if off_root:
        raise ValueError(
            f"grpo needs a root-only tree, but prompt {tree.prompt_id!r} has trajectories "
            f"{off_root} branching below the root; use the 'tree' estimator"
        )
    tree.branch_uniform_values()  # raises on an unfinished trajectory, like the other estimators
    finished = [t for t in tree.trajectories if t.finished]
    adv = np.zeros(len(tree.nodes), dtype=np.float64)
    if len(finished) < 2:
        return adv
    rewards = np.array([tree.trajectory_reward(t.id) for t in finished])
    if _is_uniform(rewards):
        return adv
    centred = rewards - rewards.mean()
    if scale_by_std:
        centred = centred / (rewards.std(ddof=1) + eps)
    for traj, a in zip(finished, centred, strict=True):
        adv[traj.nodes] = a
    return adv


def grpo_advantages_batch(
    trees: Sequence[RolloutTree], scale_by_std: bool = True, eps: float = EPS
) -> list[np.ndarray]:
    """:func:`grpo_advantages` for each tree."""
    return [grpo_advantages(t, scale_by_std=scale_by_std, eps=eps) for t in as_tree_list(trees)]


# ---------------------------------------------------------------------------- TreePO baseline
def treepo_leaf_scores(tree: RolloutTree) -> dict[int, float]:
    """TreePO's raw (unwhitened) score of each leaf, keyed by leaf node id.

    Over the leaf's ancestors ``g`` that are branching nodes (root or ≥ 2 children) with
    ``n_g ≥ 2`` leaves below, the average of ``r_leaf − V̂(g)`` weighted by ``n_g``; ``V̂(g)`` is
    the mean reward of the leaves under ``g`` (method §5's tree value). A leaf with no such
    ancestor (the only leaf of its tree) has no group and is left out of the result.
    """
    n = tree.leaf_counts()
    v = tree.tree_values()
    groups = {g for g in tree.branching_nodes() if n[g] >= 2}
    scores: dict[int, float] = {}
    for leaf in tree.leaves():
        r = float(tree.nodes[leaf].reward)  # type: ignore[arg-type]
        ancestors = [g for g in tree.path(leaf)[:-1] if g in groups]
        if not ancestors:
            continue
        weights = n[ancestors].astype(np.float64)
        scores[leaf] = float(np.dot(weights, r - v[ancestors]) / weights.sum())
    return scores


def treepo_advantages(trees: Sequence[RolloutTree], eps: float = EPS) -> list[np.ndarray]:
    """TreePO's advantage for a batch of trees (method §6's alternative for the TreePO baseline).

    1. Each leaf gets its raw score (:func:`treepo_leaf_scores`).
    2. The scores are whitened over the whole batch: ``(s − mean) / (std + ε)`` with the
       unbiased std (as verl's ``masked_whiten``). Our choice: only leaves that belong to at
       least one group enter the statistics; a leaf without a group keeps 0 (it has no
       contrast to learn from, and a batch shift should not invent one).
    3. Every non-root node takes the mean of the whitened values of the leaves below it (a
       leaf is its own only leaf); the root gets 0.0.
    """
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    trees = as_tree_list(trees)
    per_tree = [treepo_leaf_scores(t) for t in trees]
    pooled = np.array([s for scores in per_tree for s in scores.values()], dtype=np.float64)
    if len(pooled) >= 2:
        mean, std = pooled.mean(), pooled.std(ddof=1)
    else:  # no groups at all (every group needs two leaves, so pooled is never of size 1)
        mean, std = 0.0, 1.0
    out = []
    for tree, scores in zip(trees, per_tree, strict=True):
        leaf_value = np.zeros(len(tree.nodes), dtype=np.float64)
        for leaf, s in scores.items():
            leaf_value[leaf] = (s - mean) / (std + eps)
        # sum of leaf values and leaf count below each node, in one reverse sweep
        total = leaf_value.copy()
        count = np.array([1.0 if n.terminal else 0.0 for n in tree.nodes])
        for node in reversed(tree.nodes[1:]):
            total[node.parent] += total[node.id]
            count[node.parent] += count[node.id]
        adv = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
        adv[ROOT] = 0.0
        out.append(adv)
    return out


# ---------------------------------------------------------------------------- ARPO
def arpo_advantages(tree: RolloutTree, soft: bool = True, scale_by_std: bool = True, eps: float = EPS) -> np.ndarray:
    """ARPO's advantage attribution (arXiv 2507.19849) for one tree (0.0 at the root).

    Every finished trajectory ``j`` of the tree — bare rollouts, continuations and further root
    rollouts alike, the prompt's one group — gets GRPO's advantage ``Â_j = (r_j − mean r) / (std r
    + ε)`` (unbiased std; 0 for fewer than two trajectories or uniform rewards). A trajectory is the
    path from the root to its leaf, so a node lies on the trajectories whose leaves are below it:

    - *hard*: the node takes the mean of their ``Â_j`` — the paper's shared-token advantage
      ``(1/d) Σ_i Â_i``; a node of one trajectory (its branched, individual tokens) takes its own;
    - *soft* (``soft=True``, the paper's default and its authors' run: plain GRPO over the
      duplicated sequences): a shared token is trained once per trajectory through it, with one
      and the same importance ratio, so its weight in the loss is ``Σ_i Â_i``, which a tree trained
      once per node (method §6's packing) carries as the node's advantage. At a ratio inside the
      clip range this is the authors' loss term for term; their token mean counts a shared token
      ``d`` times where ours counts it once.

    On a tree without continuations both are GRPO (:func:`grpo_advantages`)."""
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    tree.branch_uniform_values()  # raises on an unfinished trajectory, like the other estimators
    finished = [t for t in tree.trajectories if t.finished]
    leaf_adv = np.zeros(len(tree.nodes), dtype=np.float64)
    if len(finished) >= 2:
        rewards = np.array([tree.trajectory_reward(t.id) for t in finished])
        if not _is_uniform(rewards):
            centred = rewards - rewards.mean()
            if scale_by_std:
                centred = centred / (rewards.std(ddof=1) + eps)
            for traj, a in zip(finished, centred, strict=True):
                leaf_adv[traj.leaf] = a
    total = leaf_adv.copy()
    count = np.array([1.0 if n.terminal else 0.0 for n in tree.nodes])
    for node in reversed(tree.nodes[1:]):
        total[node.parent] += total[node.id]
        count[node.parent] += count[node.id]
    adv = total if soft else np.divide(total, count, out=np.zeros_like(total), where=count > 0)
    adv[ROOT] = 0.0
    return adv


# ---------------------------------------------------------------------------- tokens
@dataclass(frozen=True)
class TokenAdvantages:
    """A tree packed into one token sequence: the nodes' tokens in node-id order, each node
    once (the root's prompt tokens first). All arrays have one entry per token."""

    node: np.ndarray  # int64: id of the node the token belongs to
    loss_mask: np.ndarray  # int8: 1 = model-written (trained on), 0 = prompt or observation
    advantage: np.ndarray  # float64: the node's advantage where loss_mask is 1, else 0.0

    @property
    def num_loss_tokens(self) -> int:
        """Number of trained tokens (= the tree's distinct model-written tokens)."""
        return int(self.loss_mask.sum())


def token_advantages(tree: RolloutTree, advantages: np.ndarray) -> TokenAdvantages:
    """Spread per-node ``advantages`` over the tree's packed tokens (method §6: shared prefix
    tokens are trained once). Masked tokens (prompt, observations) get 0.0."""
    advantages = np.asarray(advantages, dtype=np.float64)
    if advantages.shape != (len(tree.nodes),):
        raise ValueError(
            f"advantages must have one value per node of prompt {tree.prompt_id!r} "
            f"({len(tree.nodes)}), got shape {advantages.shape}"
        )
    lengths = np.array([len(n.token_ids) for n in tree.nodes], dtype=np.int64)
    node = np.repeat(np.arange(len(tree.nodes), dtype=np.int64), lengths)
    mask = np.array([m for n in tree.nodes for m in n.loss_mask], dtype=np.int8)
    trained = advantages[node][mask == 1]
    if not np.all(np.isfinite(trained)):
        raise ValueError(f"advantages of prompt {tree.prompt_id!r} are not finite on trained tokens")
    return TokenAdvantages(node=node, loss_mask=mask, advantage=np.where(mask == 1, advantages[node], 0.0))


# ---------------------------------------------------------------------------- registry
class AdvantageEstimator(Protocol):
    """The one contract of an advantage estimator: a batch of complete trees in, one float
    array per tree out, indexed by node id (0.0 at the root). Batch-level so that estimators
    that normalise over the batch (TreePO) fit the same signature."""

    def __call__(self, trees: Sequence[RolloutTree]) -> list[np.ndarray]: ...


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_adv_est(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator adding an estimator to :data:`ADVANTAGE_ESTIMATORS` under ``name``."""

    def register(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return register


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``; ValueError listing the known names otherwise."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; known: {sorted(ADVANTAGE_ESTIMATORS)}"
        ) from None


@register_adv_est("tree")
def _tree(trees: Sequence[RolloutTree]) -> list[np.ndarray]:
    return tree_advantages_batch(trees, scale_by_std=True)


@register_adv_est("tree-no-std")
def _tree_no_std(trees: Sequence[RolloutTree]) -> list[np.ndarray]:
    return tree_advantages_batch(trees, scale_by_std=False)


@register_adv_est("grpo")
def _grpo(trees: Sequence[RolloutTree]) -> list[np.ndarray]:
    return grpo_advantages_batch(trees, scale_by_std=True)


@register_adv_est("treepo")
def _treepo(trees: Sequence[RolloutTree]) -> list[np.ndarray]:
    return treepo_advantages(trees)


@register_adv_est("arpo-hard")
def _arpo_hard(trees: Sequence[RolloutTree]) -> list[np.ndarray]:
    return [arpo_advantages(t, soft=False) for t in as_tree_list(trees)]


@register_adv_est("arpo-soft")
def _arpo_soft(trees: Sequence[RolloutTree]) -> list[np.ndarray]:
    return [arpo_advantages(t, soft=True) for t in as_tree_list(trees)]


def _is_uniform(values: np.ndarray) -> bool:
    return bool(np.ptp(values) <= UNIFORM_RTOL * max(1.0, float(np.abs(values).max())))


def as_tree_list(trees: Sequence[RolloutTree]) -> list[RolloutTree]:
    """``trees`` as a list, checking that it is a batch (not one tree) of RolloutTree."""
    if isinstance(trees, RolloutTree):
        raise ValueError("trees must be a sequence of RolloutTree, got a single RolloutTree")
    out = list(trees)
    for i, t in enumerate(out):
        if not isinstance(t, RolloutTree):
            raise ValueError(f"trees[{i}] must be a RolloutTree, got {type(t).__name__}")
    return out
