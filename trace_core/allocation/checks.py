"""The input checks every solver shares: probabilities, integers, one prompt's anchors.

Public so that the token-priced solvers (:mod:`trace_core.token_budget`) check their inputs by the
same rules and name the same inputs in their errors.
"""

from __future__ import annotations

import numpy as np

# Unit gains closer than this are treated as equal when the tie rules apply (method §2 "Ties").
# With at most ~1e3 tied units per step the objective moves by < 1e-9, far below any objective gap the tests resolve.
GAIN_TIE_TOL = 1e-12


def as_probabilities(x: object, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of probabilities, got shape {arr.shape}")
    bad = ~np.isfinite(arr) | (arr < 0.0) | (arr > 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}[{i}] = {float(arr[i])!r} is not a probability in [0, 1] (NaN is not allowed)")
    return arr


def as_int(x: object, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {x!r}")
    return int(x)


def check_prefix_inputs(p: object, r: object, turn: object | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    p = as_probabilities(p, "p")
    r_arr = np.asarray(r, dtype=np.float64)
    if r_arr.shape != p.shape:
        raise ValueError(f"r has shape {r_arr.shape} but p has shape {p.shape}: one reward per anchor")
    bad = ~np.isin(r_arr, (0.0, 1.0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"r[{i}] = {float(r_arr[i])!r}: rewards of bare rollouts must be 0 or 1")
    if turn is None:
        t = np.zeros(p.shape, dtype=np.int64)
    else:
        t = np.asarray(turn)
        if t.shape != p.shape:
            raise ValueError(f"turn has shape {t.shape} but p has shape {p.shape}")
    return p, r_arr, t
