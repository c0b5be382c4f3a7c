"""method §5's ``explore_fraction``: give part of the root budget, at m = 2, to random skipped prompts.

Skipped prompts get no tree and so no target: a confident wrong prediction of 0 or 1 is never
corrected. This is a root-allocation rule (it belongs next to :func:`allocate_roots` and is
called by the trainer after it); it lives here, pure numpy, until the allocation module takes it.
"""

from __future__ import annotations

import numpy as np

from trace_core.allocation import allocate_roots


def explore_roots(
    m: np.ndarray, v: np.ndarray, fraction: float, rng: np.random.Generator, max_per_prompt: int = 16
) -> np.ndarray:
    """Re-split the root budget ``Σ m``: ``k = ⌊fraction · Σm / 2⌋`` prompts skipped by ``m``
    (capped by how many there are, and so that no single rollout is left over), drawn uniformly,
    get ``m = 2``; the remaining ``Σm − 2k`` rollouts are re-allocated exactly
    (:func:`allocate_roots`) over the other prompts.
    ``fraction = 0`` returns ``m`` unchanged. The budget ``Σ m`` is preserved."""
    m = np.asarray(m, dtype=np.int64)
    v = np.asarray(v, dtype=np.float64)
    if m.ndim != 1 or v.shape != m.shape:
        raise ValueError(f"m and v must be 1-D arrays of the same length, got {m.shape} and {v.shape}")
    if np.any(m < 0) or np.any(m == 1):
        raise ValueError("m must hold root counts in {0} ∪ {2..max_per_prompt}")
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must lie in [0, 1], got {fraction}")
    budget = int(m.sum())
    skipped = np.flatnonzero(m == 0)
    k = min(int(fraction * budget) // 2, skipped.size)
    if budget - 2 * k == 1:  # a single leftover rollout cannot open a prompt (m = 1 is not allowed)
        k -= 1
    if k == 0:
        return m.copy()
    explored = rng.choice(skipped, size=k, replace=False)
    out = np.zeros_like(m)
    out[explored] = 2
    rest = np.setdiff1d(np.arange(m.size), explored)
    remaining = budget - 2 * k
    if remaining:
        out[rest] = allocate_roots(v[rest], remaining, max_per_prompt)
    return out
