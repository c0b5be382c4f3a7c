"""method §5's supervised set and its sampling into predictor examples. Pure numpy.

``S`` = each tree's prompt root plus its *informative* prefixes: non-root, non-terminal nodes
with at least ``min_leaves`` (default 2) leaves below. Targets are the tree-backed means ``V̂``
(:meth:`RolloutTree.tree_values`). Prefixes are sub-sampled so that they make up about
``prefix_share`` of a step's examples (the paper: 6% of a predictor batch), with a floor of
``minimum`` prefixes a step (``PredictorConfig.min_prefix_examples``, a scale adaptation: the
paper's share of ~1,000 roots is ~60 prefixes a step; of our tens of roots it is under one).

The floor trains the prefix head; it must not also change what the roots learn. When it raises
the count above the share, each prefix example is down-weighted (:func:`prefix_weight`) so that
the prefixes still carry ``prefix_share`` of the loss, as the paper's 6% of a batch does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from trace_core.tree import ROOT, RolloutTree


def informative_prefixes(tree: RolloutTree, min_leaves: int = 2) -> np.ndarray:
    """Non-root, non-terminal nodes of ``tree`` with ``>= min_leaves`` leaves below (int64, id order)."""
    if min_leaves < 1:
        raise ValueError(f"min_leaves must be >= 1, got {min_leaves}")
    leaves = tree.leaf_counts()
    return np.array(
        [n.id for n in tree.nodes[1:] if not n.terminal and leaves[n.id] >= min_leaves], dtype=np.int64
    )


@dataclass(frozen=True)
class Example:
    """One supervised node: tree index (into the step's trees), node id, target ``V̂``."""

    tree: int
    node: int
    target: float
    weight: float = 1.0  # its weight in the loss (a weighted mean over the batch)


@dataclass(frozen=True)
class SupervisedSet:
    """A step's candidates: every root with a leaf, every informative prefix."""

    roots: list[Example]
    prefixes: list[Example]


def supervised_set(trees: Sequence[RolloutTree], min_leaves: int = 2) -> SupervisedSet:
    """method §5's ``S`` over a step's trees. A tree without leaves (a skipped prompt) gives nothing."""
    roots, prefixes = [], []
    for i, tree in enumerate(trees):
        if not isinstance(tree, RolloutTree):
            raise ValueError(f"trees[{i}] is a {type(tree).__name__}, not a RolloutTree")
        if tree.leaf_counts()[ROOT] == 0:
            continue
        v_hat = tree.tree_values()
        roots.append(Example(i, ROOT, float(v_hat[ROOT])))
        prefixes.extend(Example(i, int(n), float(v_hat[n])) for n in informative_prefixes(tree, min_leaves))
    return SupervisedSet(roots, prefixes)


def num_prefix_examples(
    num_roots: int, num_candidates: int, prefix_share: float, rng: np.random.Generator, minimum: int = 0
) -> int:
    """How many prefixes to draw so that they are ``prefix_share`` of the examples in expectation:
    ``share / (1 − share) · num_roots``, rounded stochastically, raised to ``minimum``, capped by
    the candidates. The rounding draw is taken whatever the floor does, so the generator's stream
    does not depend on ``minimum``."""
    if not 0 <= prefix_share < 1:
        raise ValueError(f"prefix_share must lie in [0, 1), got {prefix_share}")
    if num_roots < 0 or num_candidates < 0:
        raise ValueError("num_roots and num_candidates must be >= 0")
    if minimum < 0:
        raise ValueError(f"minimum must be >= 0, got {minimum}")
    expected = prefix_share / (1.0 - prefix_share) * num_roots
    whole = int(np.floor(expected))
    n = whole + int(rng.random() < expected - whole)
    return min(max(n, int(minimum)), num_candidates)


def prefix_weight(num_roots: int, num_prefixes: int, prefix_share: float) -> float:
    """The loss weight of each of ``num_prefixes`` prefix examples beside ``num_roots`` roots
    (weight 1): 1 while there are no more of them than the share's stochastic rounding can draw
    (``⌈share / (1 − share) · roots⌉``), else — the floor raised the count — the weight that gives
    them exactly that share of the total, ``share / (1 − share) · roots / prefixes``. Without
    roots there is nothing to share the loss with: 1."""
    if not 0 <= prefix_share < 1:
        raise ValueError(f"prefix_share must lie in [0, 1), got {prefix_share}")
    if num_roots < 0 or num_prefixes < 0:
        raise ValueError("num_roots and num_prefixes must be >= 0")
    expected = prefix_share / (1.0 - prefix_share) * num_roots
    if num_prefixes <= math.ceil(expected) or num_roots == 0:
        return 1.0
    return expected / num_prefixes


def sample_examples(
    candidates: SupervisedSet, prefix_share: float, rng: np.random.Generator, minimum: int = 0
) -> tuple[list[Example], int]:
    """All roots plus a uniform sample (without replacement) of prefixes — ``prefix_share`` of the
    examples, at least ``minimum`` while there are that many candidates, the prefixes weighted
    (:func:`prefix_weight`) so that they carry at most ``prefix_share`` of the loss; returns the
    examples (roots first, prefixes in candidate order) and the number of prefixes drawn."""
    n = num_prefix_examples(len(candidates.roots), len(candidates.prefixes), prefix_share, rng, minimum)
    chosen = np.sort(rng.choice(len(candidates.prefixes), size=n, replace=False)) if n else np.zeros(0, int)
    w = prefix_weight(len(candidates.roots), n, prefix_share)
    prefixes = [candidates.prefixes[j] for j in chosen.tolist()]
    if w != 1.0:
        prefixes = [replace(ex, weight=w) for ex in prefixes]
    return list(candidates.roots) + prefixes, n
