"""Method §3: the prompt-local prefix expansion — continuations per anchor under the budget m_i·N.

Numpy in, numpy out. :func:`allocate_prefixes` is exact (a bisection on the marginal-gain threshold,
then method §3's tie rules); :func:`allocate_prefixes_greedy` is its reference.
"""

from __future__ import annotations

import heapq

import numpy as np

from trace_core.allocation.checks import as_int, check_prefix_inputs

# allocate_prefixes stops bisecting once this few units lie between its brackets.
_FINISH_UNITS = 1 << 16


def continuation_keep_probability(p: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``q = r·p + (1 − r)(1 − p)``: probability a continuation repeats the bare outcome."""
    return r * p + (1.0 - r) * (1.0 - p)


def prefix_value(p: object, r: object, k: object) -> np.ndarray:
    """``V_pref = 1 − q^k``: the chance that one of ``k`` continuations from the prefix ends with
    the opposite outcome to the bare rollout through it (method §3); 0 at k = 0."""
    p, r_arr, _ = check_prefix_inputs(p, r, None)
    k = np.asarray(k)
    if np.any(k < 0):
        raise ValueError("k must be non-negative")
    return 1.0 - np.power(continuation_keep_probability(p, r_arr), k)


def allocate_prefixes(p: object, r: object, budget: int, turn: object | None = None) -> np.ndarray:
    """Exact optimum of method §3: ``max Σ_j V_pref(j, K_j)`` s.t. ``Σ K_j = budget``, ``K_j ≥ 0``.

    The k-th continuation at anchor j gains ``q_j^{k−1}(1 − q_j)``, non-increasing in k, so the
    objective is separable concave and taking the ``budget`` largest unit gains is optimal. We
    find the threshold without materialising units: the number of units of anchor j above λ is
    ``⌈log(λ/(1−q_j)) / log q_j⌉`` (closed form), λ is bisected in log space, and the few
    units between the bracketing thresholds are sorted exactly. Vectorised: O(A · iterations).

    Ties (deterministic; also how the budget is spent when every gain is 0): among equal gains,
    fewer continuations already placed at that anchor first (spreading), then the earlier turn
    (``turn``; anchors' depths), then the lower index.
    """
    p, r_arr, t = check_prefix_inputs(p, r, turn)
    budget = as_int(budget, "budget")
    if budget < 0:
        raise ValueError(f"budget = {budget}: the prefix budget cannot be negative")
    A = p.shape[0]
    K = np.zeros(A, dtype=np.int64)
    if budget == 0:
        return K
    if A == 0:
        raise ValueError(f"budget = {budget} but there are no anchors to spend it on")
    q = continuation_keep_probability(p, r_arr)
    first = 1.0 - q  # gain of the first unit, the largest of each anchor

    positive = first > 0.0
    finite_q = (q > 0.0) & positive  # 0 < q < 1: infinitely many positive units
    with np.errstate(divide="ignore"):
        log_first = np.log(first)
        inv_log_q = np.where(finite_q, 1.0 / np.log(np.where(finite_q, q, 0.5)), 0.0)
    cap = float(budget + 1)  # no anchor can use more than `budget` units

    def units_above(lam: float) -> np.ndarray:
        """Number of units with gain > lam at each anchor (gain_k = q^{k−1}(1−q))."""
        if lam <= 0.0:
            return np.where(finite_q, int(cap), positive.astype(np.int64)).astype(np.int64)
        # gain_k > lam  <=>  k − 1 < x = log(lam/first)/log q  (log q < 0): ⌈x⌉ units.
        with np.errstate(invalid="ignore"):
            x = np.ceil((np.log(lam) - log_first) * inv_log_q)
        x = np.where(finite_q, np.clip(x, 0.0, cap), 1.0)  # q == 0: one positive unit
        return np.where(first > lam, x, 0.0).astype(np.int64)

    def gain(j: np.ndarray, k: np.ndarray) -> np.ndarray:  # gain of the k-th unit (1-based)
        return np.power(q[j], k - 1) * first[j]

    if int(units_above(0.0).sum()) < budget:
        # Not enough positive gains: every positive unit is taken and the rest tie at 0.
        K[:] = units_above(0.0)
        _spread_ties(K, t, budget - int(K.sum()), np.arange(A))
        return K

    # Bisection in log space on λ: count(hi) < budget <= count(lo). Gains below 1e-300 are not
    # resolved by bisection; they are all candidates of the exact finish below.
    hi, lo = float(first.max()), 1e-300
    lo_count_ok = int(units_above(lo).sum()) >= budget
    if lo_count_ok:
        lo, hi = _bisect_prefix_threshold(log_first[finite_q], inv_log_q[finite_q],
                                          int((positive & ~finite_q).sum()), budget, lo, hi, cap)
    else:  # the rest of the gains are below 1e-300: treat them as zero-gain ties
        K[:] = units_above(lo)
        _spread_ties(K, t, budget - int(K.sum()), np.arange(A))
        return K
    K[:] = units_above(hi)  # all units with gain > hi: fewer than budget
    need = budget - int(K.sum())
    # Exact finish: candidate units with gain in (lo, hi], sorted by gain, then the
    # tie rule. No anchor can take more than `need` of them.
    k_lo = units_above(lo)
    extra = np.minimum(k_lo - K, need)
    js = np.repeat(np.arange(A), extra)
    if js.size:
        ks = K[js] + (np.arange(js.size) - np.repeat(np.cumsum(extra) - extra, extra)) + 1
        g = gain(js, ks)
        order = np.lexsort((js, t[js], ks, -g))
        np.add.at(K, js[order[:need]], 1)
    short = budget - int(K.sum())
    if short:
        _spread_ties(K, t, short, np.arange(A))
    return K


def _bisect_prefix_threshold(
    log_first: np.ndarray, inv_log_q: np.ndarray, n_single: int, budget: int, lo: float, hi: float, cap: float
) -> tuple[float, float]:
    """Bisect λ in log space until count(hi) < budget <= count(lo) with few units in between.

    Only anchors with 0 < q < 1 are passed (``n_single`` anchors with q = 0 hold one unit for
    every λ < 1). An anchor whose count is the same at both brackets stays constant inside them,
    so it leaves the active set: after a few halvings only the anchors near λ are evaluated."""
    def counts(lam: float, lf: np.ndarray, c: np.ndarray) -> np.ndarray:
        x = (np.log(lam) - lf) * c
        np.ceil(x, out=x)
        return np.clip(x, 0.0, cap, out=x)

    cnt_lo = counts(lo, log_first, inv_log_q)
    cnt_hi = np.zeros_like(cnt_lo)  # hi = max first gain: no unit is above it
    lf, c = log_first, inv_log_q
    base = float(n_single)
    for _ in range(200):
        between = cnt_lo - cnt_hi
        if hi <= lo * (1.0 + 1e-12) or float(between.sum()) <= _FINISH_UNITS:
            break
        keep = between > 0
        if np.count_nonzero(keep) < 0.5 * keep.size:  # compact only when it pays for the copies
            base += float(cnt_lo[~keep].sum())
            lf, c, cnt_lo, cnt_hi = lf[keep], c[keep], cnt_lo[keep], cnt_hi[keep]
        mid = float(np.sqrt(lo * hi))
        cnt_mid = counts(mid, lf, c)
        if base + float(cnt_mid.sum()) >= budget:
            lo, cnt_lo = mid, cnt_mid
        else:
            hi, cnt_hi = mid, cnt_mid
    return lo, hi


def _spread_ties(K: np.ndarray, turn: np.ndarray, count: int, candidates: np.ndarray) -> None:
    """Hand out ``count`` equal-gain units as a heap keyed by (units placed, turn, index) would:
    water-fill every candidate up to a common level, then one more each in (turn, index) order."""
    if count <= 0:
        return
    base = K[candidates]
    levels = np.sort(base)
    # Smallest level L with fill(L) = Σ max(0, L − K_j) >= count; fill is piecewise linear.
    fill_at = np.cumsum(np.arange(1, levels.size + 1) * np.diff(np.append(levels, np.inf)))
    i = int(np.searchsorted(fill_at, count))  # L lies in [levels[i], levels[i+1])
    below = i + 1
    filled_before = fill_at[i - 1] if i > 0 else 0
    L = int(levels[i] + (count - filled_before) // below)
    give = np.maximum(L - base, 0)
    rest = count - int(give.sum())
    at_level = np.flatnonzero(base + give == L)
    order = at_level[np.lexsort((candidates[at_level], turn[candidates[at_level]]))]
    give[order[:rest]] += 1
    K[candidates] += give


def allocate_prefixes_greedy(p: object, r: object, budget: int, turn: object | None = None) -> np.ndarray:
    """Reference marginal-gain greedy for method §3 (a heap; O(budget · log A)). Same tie rule."""
    p, r_arr, t = check_prefix_inputs(p, r, turn)
    budget = as_int(budget, "budget")
    if budget < 0:
        raise ValueError(f"budget = {budget}: the prefix budget cannot be negative")
    if budget and p.shape[0] == 0:
        raise ValueError(f"budget = {budget} but there are no anchors to spend it on")
    q = continuation_keep_probability(p, r_arr)
    K = np.zeros(p.shape[0], dtype=np.int64)
    heap = [(-(1.0 - q[j]), 0, int(t[j]), j) for j in range(p.shape[0])]
    heapq.heapify(heap)
    for _ in range(budget):
        _, k, tj, j = heapq.heappop(heap)
        K[j] += 1
        heapq.heappush(heap, (-(q[j] ** (k + 1) * (1.0 - q[j])), k + 1, tj, j))  # unit k + 2
    return K


def prefix_objective(p: object, r: object, K: object) -> float:
    return float(np.sum(prefix_value(p, r, K)))
