"""Per-step predictor diagnostics (method §5, §7): Spearman and calibration on out-of-sample
predictions. Pure numpy; :class:`~trace_core.predictor.success_predictor.SuccessPredictor`
scores a step's trees *before* training on them and hands the predictions here.

Two prefix figures, because method §5's informative prefixes are not a fair sample:

- **expanded anchors** (``spearman_prefix``, logged as ``prefix_spearman_expanded_anchors`` and,
  under its older name, ``oos_spearman_prefix``): prediction against ``V̂`` at the internal nodes
  with >= 2 leaves below, i.e. where continuations were sent. TRACE's prefix rule sends them
  where prediction and outcome disagree, so this set is selected on the very error it measures.
- **a random anchor** (``prefix_spearman_random_anchor``): for every bare rollout with at least
  one internal node, the prediction at one uniformly random internal node of its path against
  that rollout's reward. The anchor is drawn independently of the prediction and the outcome,
  so the figure is unbiased for "how well does the predictor rank prefixes", for every method
  (expanding or not).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from trace_core.metrics import predictor_spearman, root_and_prefix_pairs, spearman
from trace_core.tree import RolloutTree


@dataclass(frozen=True)
class Calibration:
    """Reliability diagram over equal-width bins of the prediction."""

    bin_edges: np.ndarray  # float64 (n_bins + 1,) over [0, 1]
    count: np.ndarray  # int64 (n_bins,): pairs whose prediction falls in each bin
    mean_prediction: np.ndarray  # float64 (n_bins,): NaN for an empty bin
    mean_target: np.ndarray  # float64 (n_bins,): NaN for an empty bin
    ece: float  # expected calibration error Σ_b (n_b / N) |mean_pred_b − mean_target_b|; NaN when N = 0

    def as_dict(self) -> dict[str, list[float] | float]:
        return {
            "bin_edges": self.bin_edges.tolist(), "count": self.count.tolist(),
            "mean_prediction": self.mean_prediction.tolist(), "mean_target": self.mean_target.tolist(),
            "ece": self.ece,
        }


def calibration(pred: ArrayLike, target: ArrayLike, n_bins: int = 10) -> Calibration:
    """Bin predictions in [0, 1] into ``n_bins`` equal bins (the last bin includes 1.0) and compare
    each bin's mean prediction with its mean target. Pairs with a NaN are dropped."""
    p = np.asarray(pred, dtype=np.float64).ravel()
    t = np.asarray(target, dtype=np.float64).ravel()
    if p.shape != t.shape:
        raise ValueError(f"pred ({p.size}) and target ({t.size}) must have the same length")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    keep = ~(np.isnan(p) | np.isnan(t))
    p, t = p[keep], t[keep]
    if np.any((p < 0) | (p > 1)):
        raise ValueError("pred must lie in [0, 1]")
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    b = np.minimum((p * n_bins).astype(np.int64), n_bins - 1)
    count = np.bincount(b, minlength=n_bins).astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mp = np.bincount(b, weights=p, minlength=n_bins) / count
        mt = np.bincount(b, weights=t, minlength=n_bins) / count
    ece = float(np.nansum(count / p.size * np.abs(mp - mt))) if p.size else float("nan")
    return Calibration(edges, count, mp, mt, ece)


def random_anchor_nodes(trees: Sequence[RolloutTree], rng: np.random.Generator) -> list[np.ndarray]:
    """Per tree, one uniformly random internal node (a non-root, non-terminal node of its path)
    of each finished bare rollout that has one, in trajectory order (int64). Continuations are
    not sampled: where they start was chosen by an allocator."""
    out = []
    for tree in trees:
        chosen = []
        for traj in tree.bare_trajectories():
            internal = traj.nodes[:-1] if traj.finished else []
            if internal:
                chosen.append(internal[int(rng.integers(len(internal)))])
        out.append(np.array(chosen, dtype=np.int64))
    return out


def random_anchor_pairs(
    trees: Sequence[RolloutTree], predictions: Sequence[ArrayLike], anchors: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """``(prediction at each anchor, reward of the bare rollout it lies on)`` for the nodes of
    :func:`random_anchor_nodes`; a pair with a NaN prediction is dropped."""
    if not (len(trees) == len(predictions) == len(anchors)):
        raise ValueError(f"trees ({len(trees)}), predictions ({len(predictions)}) and anchors ({len(anchors)}) "
                         "need one entry per tree")
    pred, reward = [], []
    for tree, p, nodes in zip(trees, predictions, anchors, strict=True):
        p = np.asarray(p, dtype=np.float64)
        for n in np.asarray(nodes, dtype=np.int64).tolist():
            node = tree.nodes[n]
            if node.kind != "bare" or node.terminal:
                raise ValueError(f"prompt {tree.prompt_id!r}: node {n} is not an internal node of a bare rollout")
            pred.append(p[n])
            reward.append(tree.trajectory_reward(node.trajectory))
    pred_arr, reward_arr = np.asarray(pred, dtype=np.float64), np.asarray(reward, dtype=np.float64)
    keep = ~np.isnan(pred_arr)
    return pred_arr[keep], reward_arr[keep]


@dataclass(frozen=True)
class StepDiagnostics:
    """Out-of-sample diagnostics of one step: predictions made before training on the step."""

    spearman_root: float
    spearman_prefix: float
    num_roots: int
    num_prefixes: int
    mse_root: float  # mean (pred − V̂)² at roots, before the update
    mse_prefix: float
    calibration_root: Calibration
    calibration_prefix: Calibration
    # prediction at one random internal node per bare rollout vs that rollout's reward (NaN: not computed)
    spearman_random_anchor: float = float("nan")
    num_random_anchors: int = 0  # pairs in it: bare rollouts with >= 1 internal node

    def as_dict(self) -> dict[str, float]:
        """Flat scalars for loggers (the bins are in :attr:`calibration_root` / ``_prefix``)."""
        return {
            "oos_spearman_root": self.spearman_root, "oos_spearman_prefix": self.spearman_prefix,
            "prefix_spearman_expanded_anchors": self.spearman_prefix,
            "prefix_spearman_random_anchor": self.spearman_random_anchor,
            "prefix_random_anchors": float(self.num_random_anchors),
            "oos_num_roots": float(self.num_roots), "oos_num_prefixes": float(self.num_prefixes),
            "oos_mse_root": self.mse_root, "oos_mse_prefix": self.mse_prefix,
            "ece_root": self.calibration_root.ece, "ece_prefix": self.calibration_prefix.ece,
        }


def step_diagnostics(
    trees: Sequence[RolloutTree], predictions: Sequence[ArrayLike], min_leaves: int = 2, n_bins: int = 10,
    random_anchors: Sequence[np.ndarray] | None = None,
) -> StepDiagnostics:
    """Spearman (:func:`trace_core.metrics.predictor_spearman`), MSE and calibration of
    ``predictions`` (one array per tree, NaN where not scored) against ``V̂`` at roots and at
    prefixes with ``>= min_leaves`` leaves below; with ``random_anchors`` (from
    :func:`random_anchor_nodes`, scored in ``predictions``) also the random-anchor Spearman."""
    sp = predictor_spearman(trees, predictions, min_leaves)
    (rp, rt), (pp, pt) = root_and_prefix_pairs(trees, predictions, min_leaves)
    ap, ar = (np.zeros(0), np.zeros(0)) if random_anchors is None else \
        random_anchor_pairs(trees, predictions, random_anchors)

    def mse(p: np.ndarray, t: np.ndarray) -> float:
        return float(np.mean((p - t) ** 2)) if p.size else float("nan")

    return StepDiagnostics(
        spearman_root=sp.root, spearman_prefix=sp.prefix,
        num_roots=sp.num_roots, num_prefixes=sp.num_prefixes,
        mse_root=mse(rp, rt), mse_prefix=mse(pp, pt),
        calibration_root=calibration(rp, rt, n_bins), calibration_prefix=calibration(pp, pt, n_bins),
        spearman_random_anchor=spearman(ap, ar), num_random_anchors=int(ap.size),
    )
