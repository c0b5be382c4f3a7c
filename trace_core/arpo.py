"""ARPO's branch decisions (Dong et al., arXiv 2507.19849, "Agentic Reinforced Policy Optimization").

ARPO samples ``N`` global rollouts of a prompt, watches the entropy of the first ``k`` tokens the
policy writes after each tool result, and branches partial rollouts where that entropy has risen
above the rollout's initial entropy (the first ``k`` tokens of its first turn): a branch trial
succeeds when ``clip(u − β·ΔH, 0, 1) ≤ τ`` with ``u ~ U(0, 1)`` — the paper's ``P_t = α + β·ΔH_t``
against ``τ``, as its authors' code draws it — and each anchor gets up to ``Z − 1`` trials, anchors
taken turn by turn, until the prompt's partial budget is spent; what is left goes to more global
rollouts. The registry method ``arpo`` (:mod:`trace_core.allocation`) places a prompt's ``m_i·N``
continuations by :func:`arpo_placement` on the features :func:`anchor_entropy` reads off its
finished bare rollouts; its advantage attribution (hard and soft) lives with the other estimators
(:mod:`trace_core.advantages`: ``"arpo-hard"``, ``"arpo-soft"``). Docs: method §4, "ARPO".

The entropy estimate: the engines return the sampled token's log-prob only (no top-k), so a
token's entropy is estimated by ``−log p`` of the token the policy sampled, an unbiased estimate of
the entropy of the distribution it was sampled from (``E_{x∼p}[−log p(x)] = H(p)``; with a
temperature or top-p other than 1 the raw log-probs estimate the cross-entropy of the sampling
distribution to the policy's). A window's entropy is the sum of these over its first ``min(k, n)``
model-written tokens, normalised by ``log |V|`` — the authors' code sums its per-position top-10
entropies over the window and divides by the log of the vocabulary size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trace_core.tree import RolloutTree, TurnNode


@dataclass(frozen=True)
class ArpoConfig:
    """ARPO's rollout settings. The defaults are its authors' (``dongguanting/ARPO``: the run scripts
    ``ARPO/scripts/ARPO_*_1node.sh`` and ``verl/workers/rollout/vllm_rollout/vllm_rollout_with_tools.py``):
    ``BEAM_SIZE=2``, ``BRANCH_PROBABILITY=0.5``, ``Entropy_weight=0.2`` in every script, and the
    window of the first 20 generated tokens in the rollout code. Their ``ROLLOUT_N = 2 ×
    INITIAL_ROLLOUTS`` is our ``N = 1`` (the prompt's ``G`` bare rollouts are the global samples)."""

    entropy_window: int = 20  # k: the first k generated tokens after a tool result
    entropy_weight: float = 0.2  # β: the weight of the normalised entropy change
    branch_threshold: float = 0.5  # τ: a trial branches when clip(u − β·ΔH, 0, 1) <= τ
    beam_size: int = 2  # Z: paths through a branch point (the bare one and up to Z − 1 continuations)

    def __post_init__(self) -> None:
        if isinstance(self.entropy_window, bool) or int(self.entropy_window) != self.entropy_window \
                or self.entropy_window < 1:
            raise ValueError(f"entropy_window = {self.entropy_window}: it must be an integer >= 1")
        if not np.isfinite(self.entropy_weight):
            raise ValueError(f"entropy_weight = {self.entropy_weight}: it must be finite")
        if not (np.isfinite(self.branch_threshold) and 0.0 <= self.branch_threshold <= 1.0):
            raise ValueError(f"branch_threshold = {self.branch_threshold}: it must lie in [0, 1]")
        if isinstance(self.beam_size, bool) or int(self.beam_size) != self.beam_size or self.beam_size < 2:
            raise ValueError(f"beam_size = {self.beam_size}: it must be an integer >= 2 (the bare path and one "
                             "continuation at least)")


# ---------------------------------------------------------------------------- entropy features
def window_entropy(node: TurnNode, k: int) -> float:
    """The estimated entropy (nats, unnormalised) of the first ``min(k, n)`` model-written tokens of
    ``node``: the sum of their ``−log p``. 0.0 for a turn without model tokens (the authors' code
    gives an empty window 0). ValueError for a node without log-probs."""
    n_model = sum(node.loss_mask)
    if n_model == 0:
        return 0.0
    if node.logprobs is None:
        raise ValueError(f"node {node.id} has no log-probs: ARPO reads the sampled tokens' log-probs")
    return float(-np.sum(np.asarray(node.logprobs[: min(int(k), n_model)], dtype=np.float64)))


def anchor_entropy(tree: RolloutTree, anchors: Sequence[int], k: int, vocab_size: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``(after, initial)``, float64 (anchors,): at each anchor (a non-final turn of a bare rollout,
    ending with its tool result) the normalised entropy of the first ``k`` tokens its rollout wrote
    next (the next turn of the same rollout), and that rollout's initial entropy (the first ``k``
    tokens of its first turn); both divided by ``log vocab_size``. ``ΔH = after − initial``."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size = {vocab_size}: the normaliser log |V| needs |V| >= 2")
    norm = math.log(vocab_size)
    after = np.zeros(len(anchors), dtype=np.float64)
    initial = np.zeros(len(anchors), dtype=np.float64)
    for j, a in enumerate(anchors):
        node = tree.nodes[int(a)]
        if node.kind != "bare" or node.terminal:
            raise ValueError(f"node {a} of prompt {tree.prompt_id!r} is no anchor (a non-final turn of a bare rollout)")
        path = tree.trajectories[node.trajectory].nodes
        nxt = path[path.index(node.id) + 1]
        after[j] = window_entropy(tree.nodes[nxt], k) / norm
        initial[j] = window_entropy(tree.nodes[path[0]], k) / norm
    return after, initial


# ---------------------------------------------------------------------------- branch decisions
def branch_order(turn: np.ndarray, rollout: np.ndarray | None) -> np.ndarray:
    """The order in which ARPO's rollout loop meets a prompt's anchors: turn by turn (its rollouts
    advance one turn per round), within a turn by rollout, then by index."""
    idx = np.arange(np.asarray(turn).shape[0])
    roll = idx if rollout is None else np.asarray(rollout)
    return np.lexsort((idx, roll, np.asarray(turn)))


def arpo_placement(turn: np.ndarray, rollout: np.ndarray | None, delta_h: np.ndarray, budget: int,
                   config: ArpoConfig, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """``(K, extra)``: ARPO's continuations per anchor and the global rollouts that fill the rest of
    one prompt's partial ``budget``. Anchors in :func:`branch_order`; each gets up to ``Z − 1``
    trials while budget is left, one draw ``u`` each, and a trial branches (one continuation) when
    ``clip(u − β·ΔH, 0, 1) <= τ``; ``extra = budget − ΣK`` (ARPO's global samples once every path
    has ended). ``K.sum() + extra == budget`` always."""
    delta_h = np.asarray(delta_h, dtype=np.float64)
    if delta_h.ndim != 1 or np.asarray(turn).shape != delta_h.shape:
        raise ValueError(f"turn and delta_h need one entry per anchor, got shapes {np.shape(turn)} and {delta_h.shape}")
    if not np.all(np.isfinite(delta_h)):
        raise ValueError("delta_h must be finite")
    if budget < 0:
        raise ValueError(f"budget = {budget}: the prefix budget cannot be negative")
    K = np.zeros(delta_h.shape[0], dtype=np.int64)
    left = int(budget)
    for j in branch_order(turn, rollout):
        if left == 0:
            break
        for _ in range(min(config.beam_size - 1, left)):
            prob = min(1.0, max(0.0, float(rng.random()) - config.entropy_weight * float(delta_h[j])))
            if prob <= config.branch_threshold:
                K[j] += 1
                left -= 1
    return K, left
