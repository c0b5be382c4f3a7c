"""Benchmark metrics as pure functions over arrays: pass@k, means, in/out-of-domain averages.

Outcomes use the project's one rule (:func:`trace_core.metrics.is_success`): a trajectory
succeeds iff its reward is > 0.5. A benchmark's sampled outcomes are a matrix ``S`` of shape
(examples, k): row ``i`` holds the k samples of example ``i``.

* **pass@1 averaged over k samples** is ``S.mean()`` — the mean over examples of ``c_i / k``,
  which is also the unbiased pass@1 estimate;
* **pass@j** for ``j <= k`` uses the unbiased estimator of Chen et al. (2021, "Evaluating Large
  Language Models Trained on Code"): ``1 - C(n - c, j) / C(n, j)`` per example, computed as the
  numerically stable product ``1 - prod_{i = n-c+1}^{n} (1 - j / i)``, then averaged;
* **greedy accuracy** is the mean of one greedy trajectory's outcome per example.

Averages over benchmarks are unweighted (each benchmark counts once, as in the paper's tables)
and are taken per task family and scope: ``in_domain``, ``out_of_domain`` and ``all``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

DOMAINS = ("in", "out")
SCOPES = {"in_domain": ("in",), "out_of_domain": ("out",), "all": DOMAINS}
# Metrics that are averaged over benchmarks (the rest — lengths, tool calls — are per benchmark only).
AVERAGED_METRICS = ("pass_at_1", "greedy_acc", "em", "f1", "greedy_em", "greedy_f1")


def pass_at_k(n: ArrayLike, c: ArrayLike, k: int) -> float | np.ndarray:
    """Unbiased pass@k of problems with ``n`` samples of which ``c`` are correct (Chen et al.).

    ``n`` and ``c`` are integers or equal-shape integer arrays; the result has their shape (a
    float for scalars). Requires ``1 <= k <= n`` and ``0 <= c <= n``."""
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    n_arr, c_arr = np.asarray(n), np.asarray(c)
    if n_arr.shape != c_arr.shape:
        raise ValueError(f"n and c must have the same shape, got {n_arr.shape} and {c_arr.shape}")
    for name, arr in (("n", n_arr), ("c", c_arr)):
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            if not np.all(np.equal(np.mod(arr, 1), 0)):
                raise ValueError(f"{name} must hold integers, got {arr!r}")
    n_arr, c_arr = n_arr.astype(np.int64), c_arr.astype(np.int64)
    if np.any(c_arr < 0) or np.any(c_arr > n_arr):
        raise ValueError(f"c must satisfy 0 <= c <= n, got n={n_arr!r}, c={c_arr!r}")
    if np.any(n_arr < k):
        raise ValueError(f"pass@{k} needs at least k={k} samples per problem, got n={n_arr!r}")
    out = np.ones(n_arr.shape, dtype=np.float64)
    for idx in np.ndindex(n_arr.shape):
        ni, ci = int(n_arr[idx]), int(c_arr[idx])
        if ni - ci >= k:  # otherwise every k-subset holds a correct sample
            out[idx] = 1.0 - float(np.prod(1.0 - k / np.arange(ni - ci + 1, ni + 1, dtype=np.float64)))
    return float(out) if out.ndim == 0 else out


def mean_pass_at_k(successes: ArrayLike, k: int) -> float:
    """Mean over examples (rows) of the unbiased pass@k of a boolean (examples, n) matrix."""
    s = _outcome_matrix(successes)
    if s.shape[0] == 0:
        return float("nan")
    return float(np.mean(pass_at_k(np.full(s.shape[0], s.shape[1]), s.sum(axis=1), k)))


def pass_at_1_avg(successes: ArrayLike) -> float:
    """pass@1 averaged over the k samples of each example: the mean of the outcome matrix."""
    s = _outcome_matrix(successes)
    return float(s.mean()) if s.size else float("nan")


def mean_or_nan(values: ArrayLike) -> float:
    """The mean, or NaN for no values ("nothing measured" is not logged as 0)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()) if arr.size else float("nan")


def _outcome_matrix(successes: ArrayLike) -> np.ndarray:
    s = np.asarray(successes)
    if s.ndim != 2:
        raise ValueError(f"successes must be a 2-d (examples, samples) matrix, got shape {s.shape}")
    if s.size and s.dtype != bool:
        if not np.all((s == 0) | (s == 1)):
            raise ValueError("successes must hold booleans (or 0/1)")
        s = s.astype(bool)
    return s


def domain_averages(
    benchmarks: Sequence[tuple[str, str, Mapping[str, float]]], keys: Sequence[str] = AVERAGED_METRICS
) -> dict[str, float]:
    """``{"<family>/<scope>/<key>": mean}`` over benchmarks given as ``(family, domain, metrics)``.

    A scope appears only when it holds a benchmark that has the key; NaN values are skipped
    (a benchmark without greedy runs does not pull the greedy average to NaN)."""
    out: dict[str, float] = {}
    families = list(dict.fromkeys(f for f, _, _ in benchmarks))
    for family, domain, _ in benchmarks:
        if domain not in DOMAINS:
            raise ValueError(f"domain must be one of {DOMAINS}, got {domain!r} (family {family})")
    for family in families:
        for scope, domains in SCOPES.items():
            for key in keys:
                values = [m[key] for f, d, m in benchmarks
                          if f == family and d in domains and key in m and np.isfinite(m[key])]
                if values:
                    out[f"{family}/{scope}/{key}"] = float(np.mean(values))
    return out


def finite(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric entries of a metrics dict (what goes to MLflow)."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, int | float | np.number) and not isinstance(v, bool) and np.isfinite(v)}
