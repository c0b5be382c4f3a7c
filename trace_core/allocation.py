"""Budgeted rollout allocation: method §2 (global roots), §3 (local prefixes), §4 (baselines).

Everything here is numpy in, numpy out. The two TRACE solvers are exact; their reference
implementations (`allocate_roots_dp`, `allocate_prefixes_greedy`) exist for tests and benchmarks
and are never used as a silent fallback. The posterior-aware root solver
(`allocate_roots_beta`) is the same exact solver on a Beta posterior per prompt.

Beside the method §4 baselines, the registry holds methods whose root rule remembers prompts
across steps (GRESO, the posterior-aware TRACE roots: a :class:`RootRule` that reads a
:class:`~trace_core.history.HistoryView`) and those whose group filter samples in rounds (DAPO's
dynamic sampling: a :class:`RoundRule`, with GRESO's skip filter in front of it as a
:class:`CandidateFilter`), and ``trace-tokens``, whose step is priced in generated tokens (method
§10: a :class:`TokenRule`, solved in :mod:`trace_core.token_budget`; a :class:`BudgetSpec` may carry
``tokens_per_step``), and ``arpo``, whose prefix rule reads the entropy of the policy's tokens after
each tool result (:class:`ArpoPrefixes`, an :class:`EntropyReader`; a prefix rule reads its
anchors' :class:`AnchorSignals`). Each is a field of :class:`Method`, as are method §5's root exploration
(:func:`explore_roots`) and the advantage estimator the method trains with; nothing reads a
method's name.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from trace_core.advantages import AdvantageEstimator, get_advantage_estimator
from trace_core.arpo import ArpoConfig, arpo_placement
from trace_core.history import GresoConfig, HistoryView, PosteriorConfig, beta_posterior, greso_keep
from trace_core.knapsack import KnapsackRoots
from trace_core.vip import VipRoots

# Unit gains closer than this are treated as equal when the tie rules apply (method §2 "Ties").
# With at most ~1e3 tied units per step the objective moves by < 1e-9, far below any objective gap the tests resolve.
GAIN_TIE_TOL = 1e-12
# allocate_prefixes stops bisecting once this few units lie between its brackets.
_FINISH_UNITS = 1 << 16


# ============================================================================ validation
def _as_probabilities(x: object, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of probabilities, got shape {arr.shape}")
    bad = ~np.isfinite(arr) | (arr < 0.0) | (arr > 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}[{i}] = {float(arr[i])!r} is not a probability in [0, 1] (NaN is not allowed)")
    return arr


def _as_int(x: object, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {x!r}")
    return int(x)


def check_root_budget(num_prompts: int, budget: int, max_per_prompt: int) -> None:
    """Raise ValueError for every infeasible case of method §2, naming the numbers."""
    budget = _as_int(budget, "budget")
    max_per_prompt = _as_int(max_per_prompt, "max_per_prompt")
    if max_per_prompt < 2:
        raise ValueError(
            f"max_per_prompt = {max_per_prompt}: it must be >= 2 (a single rollout forms no group)"
        )
    if budget < 0:
        raise ValueError(f"budget = {budget}: the root budget cannot be negative")
    if budget == 1:
        raise ValueError("budget = 1: m_i = 1 is excluded (a single rollout forms no group), so 1 is infeasible")
    if budget > num_prompts * max_per_prompt:
        raise ValueError(
            f"budget = {budget} exceeds the pool's capacity B * max_per_prompt = "
            f"{num_prompts} * {max_per_prompt} = {num_prompts * max_per_prompt}"
        )
    if max_per_prompt == 2 and budget % 2:
        raise ValueError(f"budget = {budget} is odd but max_per_prompt = 2 allows only m_i in {{0, 2}}")


# ============================================================================ method §2: roots
def root_value(v: object, m: object) -> np.ndarray:
    """Activation probability ``V_root(v, m) = 1 − v^m − (1 − v)^m`` for m ≥ 2, and 0 for m < 2.

    The literal formula gives −1 at m = 0; a skipped prompt contributes nothing (method §2)."""
    v = np.asarray(v, dtype=np.float64)
    m = np.asarray(m)
    if np.any(~np.isfinite(v) | (v < 0) | (v > 1)):
        raise ValueError("v must hold probabilities in [0, 1] (NaN is not allowed)")
    if np.any(m < 0):
        raise ValueError("m must be non-negative")
    val = 1.0 - np.power(v, m) - np.power(1.0 - v, m)
    return np.where(m >= 2, val, 0.0)


def root_unit_gains(v: np.ndarray, max_per_prompt: int) -> np.ndarray:
    """Gain of each rollout unit, shape ``(B, max_per_prompt)``.

    Let ``a = v(1−v)``. Opening a prompt at m = 2 gains ``2a``: we split it as two units of ``a``.
    The third rollout gains ``V(3) − V(2) = a`` and the k-th (k ≥ 3) gains
    ``a(v^{k−2} + (1−v)^{k−2})``, which is non-increasing. The first three units are set to
    ``a`` exactly (not recomputed) so that they tie bit-for-bit; the rest are made monotone
    against rounding with a running minimum."""
    a = v * (1.0 - v)
    gains = np.empty((v.shape[0], max_per_prompt), dtype=np.float64)
    gains[:, : min(3, max_per_prompt)] = a[:, None]
    if max_per_prompt > 3:
        k = np.arange(4, max_per_prompt + 1, dtype=np.float64)  # unit index k (1-based)
        gains[:, 3:] = a[:, None] * (np.power(v[:, None], k - 2) + np.power(1.0 - v[:, None], k - 2))
        np.minimum.accumulate(gains, axis=1, out=gains)
    return gains


def allocate_roots(v: object, budget: int, max_per_prompt: int = 16) -> np.ndarray:
    """Exact optimum of method §2: ``max Σ V_root(v_i, m_i)`` s.t. ``Σ m_i = budget``,
    ``m_i ∈ {0} ∪ {2..max_per_prompt}``. O(B·K) time after an O(B·K) selection.

    **Why a threshold is exact.** Write each prompt's value as a sum of unit gains
    (:func:`root_unit_gains`): ``g_1 = g_2 = g_3 = a`` and then non-increasing. With m = 1 allowed
    at value ``a`` the problem is separable concave, so taking the ``budget`` largest units (all
    units with gain > λ plus ``R`` units at the threshold λ) is optimal for this *relaxation*,
    whose value bounds the true optimum from above. Because a prompt's first three units tie,
    a prompt above λ always holds ≥ 3 units; a relaxed solution can only be infeasible through
    the units tied at λ. Those are *singles* (deeper units of already-open prompts: 0 or 1 each)
    and *openings* (prompts whose ``a`` equals λ: 0, 2, 3, … units). Every R is composed from
    them, singles first, except R = 1 with no single (K ≥ 3; with K = 2 every R is even because
    budgets are). In that one case, write the Lagrangian bound: for any feasible m,
    ``value(m) = L(λ) − Σ_i d_i(m_i)`` with ``d_i ≥ 0`` the loss of prompt i against its
    λ-optimal count ``c_i`` (open prompts ``c_i ≥ 3``, tie prompts 0 with 2 and 3 also free).
    We need a net +1 unit. Either some open prompt goes up (cost ≥ its next unit's ``λ − g``), or
    only closed prompts go up — by ≥ 2 each — so some open prompt must go down by ≥ 1 (cost ≥ its
    last unit's ``g − λ``), and opening a tie prompt at 2 is free. Hence the optimum is the
    better of (a) the best extra unit on an open prompt and (b) opening a tie prompt at 2 while
    removing the cheapest last unit of an open prompt — both of which we evaluate. So the result
    always equals :func:`allocate_roots_dp`'s objective (tested, and benchmarked at B = 4,096).

    **Ties** (deterministic): units within ``GAIN_TIE_TOL`` of λ are tied; they are taken
    singles first (no new prompt), then openings of as many units as allowed (fewest activated
    prompts, e.g. (3, 3, 0) over (2, 2, 2)), each in index order; in case (a)-vs-(b) ties, (a)
    (fewer prompts). Callers shuffle the pool each step so no prompt is favoured by its index.
    """
    v = _as_probabilities(v, "v")
    check_root_budget(v.shape[0], budget, max_per_prompt)
    budget, K = int(budget), int(max_per_prompt)
    if budget == 0:
        return np.zeros(v.shape[0], dtype=np.int64)
    return _allocate_from_unit_gains(root_unit_gains(v, K), budget, K)


def _allocate_from_unit_gains(gains: np.ndarray, budget: int, K: int) -> np.ndarray:
    """The threshold-and-repair solver of :func:`allocate_roots` on a ``(B, K)`` table of unit
    gains whose first three columns hold one number per row and whose later columns do not
    increase (the only properties its exactness argument uses). ``budget`` is feasible and > 0."""
    B = gains.shape[0]
    m = np.zeros(B, dtype=np.int64)
    flat = gains.ravel()
    lam = float(np.partition(flat, flat.size - budget)[flat.size - budget])  # budget-th largest
    above = gains > lam + GAIN_TIE_TOL
    tied = ~above & (gains >= lam - GAIN_TIE_TOL)
    m[:] = above.sum(axis=1)
    remaining = budget - int(m.sum())
    # Singles: tied units on prompts already open (each unit is one more rollout there).
    open_idx = np.flatnonzero(m > 0)
    if remaining > 0 and open_idx.size:
        single_cap = tied[open_idx].sum(axis=1)
        take = np.minimum(single_cap, np.maximum(remaining - np.concatenate(([0], np.cumsum(single_cap)[:-1])), 0))
        m[open_idx] += take
        remaining -= int(take.sum())
    if remaining == 0:
        return m
    # Openings: prompts whose first units are tied with λ; capacity = their tied unit count.
    tie_prompts = np.flatnonzero((m == 0) & tied[:, 0])
    caps = tied[tie_prompts].sum(axis=1)
    if remaining == 1:
        return _repair_single_leftover(m, gains, lam, tie_prompts, K)
    order = np.argsort(-caps, kind="stable")  # largest capacity first: fewest prompts
    for j, cap in zip(tie_prompts[order], caps[order], strict=True):
        if remaining == 0:
            break
        take = min(int(cap), remaining)
        if remaining - take == 1:  # never leave a single unit behind: the next opening takes 2
            take -= 1
        m[j] = take
        remaining -= take
    if remaining != 0:  # unreachable by the argument above; kept as a loud guard
        raise AssertionError(f"allocate_roots left {remaining} units unplaced (budget={budget})")
    return m


def _repair_single_leftover(
    m: np.ndarray, gains: np.ndarray, lam: float, tie_prompts: np.ndarray, K: int
) -> np.ndarray:
    """Place the one unit at λ that no feasible tie choice can take (see :func:`allocate_roots`)."""
    B = m.shape[0]
    rows = np.arange(B)
    is_open = m >= 2
    # (a) one more unit on an open prompt with room: loss λ − g_next.
    can_add = is_open & (m < K)
    next_gain = np.where(can_add, gains[rows, np.minimum(m, K - 1)], -np.inf)
    j_add = int(np.argmax(next_gain)) if can_add.any() else -1
    loss_add = lam - next_gain[j_add] if j_add >= 0 else np.inf
    # (b) open a tie prompt at 2 and drop the last unit of an open prompt (m ≥ 3 → m − 1 ≥ 2).
    can_drop = is_open & (m >= 3)
    last_gain = np.where(can_drop, gains[rows, np.maximum(m - 1, 0)], np.inf)
    j_drop = int(np.argmin(last_gain)) if can_drop.any() else -1
    loss_drop = last_gain[j_drop] - lam if (j_drop >= 0 and tie_prompts.size) else np.inf
    if not np.isfinite(loss_add) and not np.isfinite(loss_drop):
        raise AssertionError("allocate_roots: no feasible repair (should be impossible for a feasible budget)")
    if loss_add <= loss_drop + GAIN_TIE_TOL:
        m[j_add] += 1
    else:
        m[j_drop] -= 1
        m[int(tie_prompts[0])] = 2
    return m


def allocate_roots_dp(v: object, budget: int, max_per_prompt: int = 16) -> np.ndarray:
    """Reference dynamic programme for method §2 (the paper's solver), O(B · budget · K).

    Among optima (values within ``GAIN_TIE_TOL`` · budget) it keeps the one with fewer activated
    prompts. Used by tests and benchmarks to certify :func:`allocate_roots`."""
    v = _as_probabilities(v, "v")
    check_root_budget(v.shape[0], budget, max_per_prompt)
    K = int(max_per_prompt)
    choices = np.array([0] + list(range(2, K + 1)), dtype=np.int64)
    values = root_value(np.repeat(v[:, None], choices.size, axis=1), np.broadcast_to(choices, (v.size, choices.size)))
    return _dp_from_values(values, choices, int(budget))


def _dp_from_values(values: np.ndarray, choices: np.ndarray, budget: int) -> np.ndarray:
    """Exact DP over per-prompt value tables: ``values[i, c]`` is prompt i's value at
    ``choices[c]`` rollouts (``choices[0] = 0``). Ties within ``GAIN_TIE_TOL`` · budget keep the
    allocation with fewer activated prompts."""
    B, K = values.shape[0], int(choices[-1])
    tol = GAIN_TIE_TOL * max(budget, 1)
    best = np.full(budget + 1, -np.inf)
    best[0] = 0.0
    count = np.zeros(budget + 1, dtype=np.int64)  # activated prompts of the kept optimum
    back = np.zeros((B, budget + 1), dtype=np.int8)  # index into `choices`
    for i in range(B):
        vals = values[i]
        new_best = best.copy()  # choice 0
        new_count = count.copy()
        new_back = np.zeros(budget + 1, dtype=np.int8)
        for ci in range(1, len(choices)):
            c = choices[ci]
            if c > budget:
                break
            cand = np.full(budget + 1, -np.inf)
            cand[c:] = best[: budget + 1 - c] + vals[ci]
            cand_count = np.zeros(budget + 1, dtype=np.int64)
            cand_count[c:] = count[: budget + 1 - c] + 1
            with np.errstate(invalid="ignore"):  # -inf − -inf where neither is reachable
                tie = np.abs(cand - new_best) <= tol
            better = (cand > new_best + tol) | (tie & (cand_count < new_count))
            better &= np.isfinite(cand)
            new_best = np.where(better, cand, new_best)
            new_count = np.where(better, cand_count, new_count)
            new_back = np.where(better, np.int8(ci), new_back)
        best, count, back[i] = new_best, new_count, new_back
    if not np.isfinite(best[budget]):
        raise ValueError(f"budget = {budget} cannot be split into groups of 0 or 2..{K}")
    m = np.zeros(B, dtype=np.int64)
    b = budget
    for i in range(B - 1, -1, -1):
        m[i] = choices[back[i, b]]
        b -= m[i]
    return m


def root_objective(v: object, m: object) -> float:
    """``Σ_i V_root(v_i, m_i)``."""
    return float(np.sum(root_value(v, m)))


# ============================================================================ method §5: root exploration
def explore_roots(
    m: np.ndarray, v: np.ndarray, fraction: float, rng: np.random.Generator, max_per_prompt: int = 16,
    reallocate: Callable[[np.ndarray, int], np.ndarray] | None = None,
) -> np.ndarray:
    """method §5's ``explore_fraction``: re-split the root budget ``Σ m`` so that
    ``k = ⌊fraction · Σm / 2⌋`` prompts skipped by ``m`` (capped by how many there are, and so
    that no single rollout is left over), drawn uniformly, get ``m = 2``; the remaining
    ``Σm − 2k`` rollouts are re-allocated over the other prompts by ``reallocate(rest, budget)``
    (``rest``: their indices, ascending; it returns their counts) — the method's own root rule
    (:meth:`Method.allocate_roots` passes it), or, when None, the point rule :func:`allocate_roots`
    on ``v``. ``fraction = 0`` returns ``m`` unchanged. The budget ``Σ m`` is preserved.

    Why: a skipped prompt gets no tree and so no target, so a confident wrong prediction of 0 or
    1 is never corrected. :meth:`Method.allocate_roots` applies it to the methods that explore."""
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
        if reallocate is None:
            out[rest] = allocate_roots(v[rest], remaining, max_per_prompt)
        else:
            m_rest = np.asarray(reallocate(rest, remaining), dtype=np.int64)
            if m_rest.shape != rest.shape or int(m_rest.sum()) != remaining:
                raise AssertionError(f"the root rule re-split {int(m_rest.sum())} rollouts, expected {remaining}")
            out[rest] = m_rest
    return out


# ============================================================================ roots under a Beta posterior
def _as_beta_parameters(alpha: object, beta: object) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(alpha, dtype=np.float64)
    b = np.asarray(beta, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"alpha and beta must be 1-D arrays of one length, got shapes {a.shape} and {b.shape}")
    for name, x in (("alpha", a), ("beta", b)):
        bad = ~np.isfinite(x) | (x < 0.0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{name}[{i}] = {float(x[i])!r}: a Beta parameter must be finite and >= 0")
    empty = (a + b) <= 0.0
    if empty.any():
        i = int(np.flatnonzero(empty)[0])
        raise ValueError(f"alpha[{i}] + beta[{i}] = 0: the Beta distribution needs alpha + beta > 0")
    return a, b


def beta_moments(alpha: object, beta: object, order: int) -> tuple[np.ndarray, np.ndarray]:
    """``E[p^k]`` and ``E[(1 − p)^k]`` for ``p ~ Beta(α, β)`` and ``k = 0..order``, each of shape
    ``(B, order + 1)``, by the product recursion ``E[p^k] = Π_{j<k} (α + j)/(α + β + j)`` (no
    differences of exponentiated log-Beta values: each factor lies in [0, 1] and the products are
    accurate to a few ulps). ``α = 0`` is the point mass at 0, ``β = 0`` the one at 1."""
    a, b = _as_beta_parameters(alpha, beta)
    order = _as_int(order, "order")
    if order < 0:
        raise ValueError(f"order = {order}: it must be >= 0")
    j = np.arange(order, dtype=np.float64)[None, :]
    den = (a + b)[:, None] + j
    ep = np.ones((a.size, order + 1))
    eq = np.ones((a.size, order + 1))
    np.cumprod((a[:, None] + j) / den, axis=1, out=ep[:, 1:])
    np.cumprod((b[:, None] + j) / den, axis=1, out=eq[:, 1:])
    return ep, eq


def root_value_beta(alpha: object, beta: object, m: object) -> np.ndarray:
    """``E_{p∼Beta(α,β)}[V_root(p, m)] = 1 − E[p^m] − E[(1 − p)^m]`` for m ≥ 2, and 0 for m < 2:
    the chance that ``m`` rollouts of a prompt whose success probability is only known up to its
    posterior hold both outcomes. ``m`` is one count per prompt (or one for all)."""
    a, b = _as_beta_parameters(alpha, beta)
    m = np.broadcast_to(np.asarray(m), a.shape)
    if not np.issubdtype(m.dtype, np.integer) or np.any(m < 0):
        raise ValueError("m must hold non-negative integers")
    if a.size == 0:
        return np.zeros(0)
    ep, eq = beta_moments(a, b, int(m.max()))
    rows = np.arange(a.size)
    return np.where(m >= 2, 1.0 - ep[rows, m] - eq[rows, m], 0.0)


def root_objective_beta(alpha: object, beta: object, m: object) -> float:
    """``Σ_i E_{p∼Beta(α_i,β_i)}[V_root(p, m_i)]``."""
    return float(np.sum(root_value_beta(alpha, beta, m)))


def root_unit_gains_beta(alpha: np.ndarray, beta: np.ndarray, max_per_prompt: int) -> np.ndarray:
    """Gain of each rollout unit under ``p ~ Beta(α, β)``, shape ``(B, max_per_prompt)``.

    With ``f(m) = 1 − E[p^m] − E[(1−p)^m]`` (``f(1) = 0``), ``f(k+1) − f(k) = E[p(1−p)(p^{k−1} +
    (1−p)^{k−1})]``. Let ``c = E[p(1−p)] = αβ/((α+β)(α+β+1)) = v(1−v)(α+β)/(α+β+1)``, ``v`` the
    posterior mean. Opening at m = 2 gains ``f(2) = 2c`` (two units of ``c``), the third rollout
    ``f(3) − f(2) = c``, and the k-th (k ≥ 4) ``E[p^{k−1}(1−p)] + E[p(1−p)^{k−1}]
    = E[p^{k−1}]·β/(α+β+k−1) + E[(1−p)^{k−1}]·α/(α+β+k−1)``. The first three units are one
    number ``c`` (so that they tie bit-for-bit); the rest are made monotone against rounding
    with a running minimum (they are non-increasing in exact arithmetic: ``x^{k} ≤ x^{k−1}`` on
    [0, 1] pointwise, and expectation keeps the order)."""
    s = alpha + beta
    c = (alpha / s) * (beta / (s + 1.0))  # E[p(1 − p)], written so that huge α + β cannot overflow
    gains = np.empty((alpha.shape[0], max_per_prompt), dtype=np.float64)
    gains[:, : min(3, max_per_prompt)] = c[:, None]
    if max_per_prompt > 3:
        ep, eq = beta_moments(alpha, beta, max_per_prompt - 1)
        k = np.arange(4, max_per_prompt + 1)  # unit index k (1-based): E[·] at power k − 1
        den = s[:, None] + (k - 1)
        gains[:, 3:] = ep[:, k - 1] * (beta[:, None] / den) + eq[:, k - 1] * (alpha[:, None] / den)
        np.minimum.accumulate(gains, axis=1, out=gains)
    return gains


def allocate_roots_beta(alpha: object, beta: object, budget: int, max_per_prompt: int = 16) -> np.ndarray:
    """Exact posterior-aware root allocation: ``max Σ_i E_{p∼Beta(α_i,β_i)}[1 − p^{m_i} −
    (1 − p)^{m_i}]`` s.t. ``Σ m_i = budget``, ``m_i ∈ {0} ∪ {2..max_per_prompt}`` (a skipped
    prompt is worth 0). Same infeasible budgets, same errors and same tie rule as
    :func:`allocate_roots`; O(B·K) after an O(B·K) selection.

    **Exactness.** The expected value is again a sum of unit gains
    (:func:`root_unit_gains_beta`): the first pair together gains ``f(2) = 2E[p(1−p)]``, the
    third rollout ``E[p(1−p)]`` as well, and every later one
    ``E[p(1−p)(p^{k−1} + (1−p)^{k−1})]``, which does not increase with k — the value is concave
    from the first pair on. The argument of :func:`allocate_roots` uses nothing else (three equal
    first units, stored as one number, then non-increasing units; a prompt's value at m ≥ 2 the
    sum of its first m units, 0 at m = 0): the relaxation that allows m = 1 is solved by the
    ``budget`` largest units, the {0} ∪ {2..} constraint can only bite through units tied at the
    threshold, and the one leftover unit that no tie choice can place is repaired exactly by the
    better of "one more unit on an open prompt" and "open a tied prompt at 2, drop the cheapest
    last unit elsewhere". So the same solver applies verbatim and returns
    :func:`allocate_roots_beta_dp`'s objective (tested against it and against brute force).

    **The point case** is the limit ``α + β → ∞`` at a fixed mean ``v``: every moment tends to
    ``v^k``, the gains to :func:`root_unit_gains`, and the allocation to :func:`allocate_roots`.

    **This objective penalises uncertainty.** ``E[p(1−p)] = v(1−v)(α+β)/(α+β+1)``: at the same
    posterior mean, a prompt known from a few pseudo-rollouts (an unseen prompt with a weak prior)
    gains less from its first rollouts than one known well, because its ``p`` may well sit near 0
    or 1. Maximising the expected number of mixed groups this step therefore exploits
    well-measured prompts and never pays to *learn* about uncertain ones; the value of that
    information lies in later steps, which this one-step objective does not see. That is why
    :func:`allocate_roots_thompson` (one posterior draw per prompt, as BOTS samples) is offered
    beside it."""
    a, b = _as_beta_parameters(alpha, beta)
    check_root_budget(a.shape[0], budget, max_per_prompt)
    budget, K = int(budget), int(max_per_prompt)
    if budget == 0:
        return np.zeros(a.shape[0], dtype=np.int64)
    return _allocate_from_unit_gains(root_unit_gains_beta(a, b, K), budget, K)


def allocate_roots_beta_dp(alpha: object, beta: object, budget: int, max_per_prompt: int = 16) -> np.ndarray:
    """Reference dynamic programme for :func:`allocate_roots_beta` (O(B · budget · K)); ties keep
    fewer activated prompts. For tests and benchmarks."""
    a, b = _as_beta_parameters(alpha, beta)
    check_root_budget(a.shape[0], budget, max_per_prompt)
    K = int(max_per_prompt)
    choices = np.array([0] + list(range(2, K + 1)), dtype=np.int64)
    ep, eq = beta_moments(a, b, K)
    values = np.where(choices[None, :] >= 2, 1.0 - ep[:, choices] - eq[:, choices], 0.0)
    return _dp_from_values(values, choices, int(budget))


def allocate_roots_thompson(
    alpha: object, beta: object, budget: int, max_per_prompt: int, rng: np.random.Generator
) -> np.ndarray:
    """Thompson root allocation: draw one ``p_i ~ Beta(α_i, β_i)`` per prompt and return
    :func:`allocate_roots` on the draws (BOTS's posterior sampling, with TRACE's exact point
    solver). Uncertain prompts sometimes draw a value near 1/2 and get rollouts, so the
    posterior learns about them — the exploration :func:`allocate_roots_beta` does not do.
    ``α = 0`` draws 0 and ``β = 0`` draws 1 (the point masses)."""
    a, b = _as_beta_parameters(alpha, beta)
    check_root_budget(a.shape[0], budget, max_per_prompt)
    proper = (a > 0) & (b > 0)
    draw = np.where(b == 0, 1.0, 0.0)
    if proper.any():
        draw[proper] = rng.beta(a[proper], b[proper])
    return allocate_roots(draw, budget, max_per_prompt)


# ============================================================================ method §3: prefixes
def _check_prefix_inputs(p: object, r: object, turn: object | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    p = _as_probabilities(p, "p")
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


def continuation_keep_probability(p: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``q = r·p + (1 − r)(1 − p)``: probability a continuation repeats the bare outcome."""
    return r * p + (1.0 - r) * (1.0 - p)


def prefix_value(p: object, r: object, k: object) -> np.ndarray:
    """``V_pref = 1 − q^k``: the chance that one of ``k`` continuations from the prefix ends with
    the opposite outcome to the bare rollout through it (method §3); 0 at k = 0."""
    p, r_arr, _ = _check_prefix_inputs(p, r, None)
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
    p, r_arr, t = _check_prefix_inputs(p, r, turn)
    budget = _as_int(budget, "budget")
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
    p, r_arr, t = _check_prefix_inputs(p, r, turn)
    budget = _as_int(budget, "budget")
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


# ============================================================================ method §4: methods
@dataclass(frozen=True)
class BudgetSpec:
    """Per-step rollout budget, shared by every method so that costs are equal (method §4)."""

    roots_M: int  # M: TRACE's root budget (bare rollouts); the total is M(1+N) trajectories
    expansion_N: int  # N: expansion factor; TRACE spends m_i·N continuations on prompt i
    group_size_G: int = 8  # G: rollouts per prompt for the uniform baselines (GRPO, PCL, TreePO)
    max_per_prompt: int = 16  # M_max: largest m_i TRACE may give one prompt
    pool_factor: int = 4  # candidate pool B = pool_factor·M(1+N)/G (PCL's k = 4)
    # T: the budget in generated tokens per step (method §10), for a method that prices rollouts in
    # tokens (``Method.token_rule``) and for uniform methods run at equal tokens
    # (trace_core.token_budget.uniform_spec_for_tokens); the fields above still define the candidate
    # pool and G. None: the budget is M(1+N) trajectories.
    tokens_per_step: int | None = None

    def __post_init__(self) -> None:
        for name in ("roots_M", "expansion_N", "group_size_G", "max_per_prompt", "pool_factor"):
            _as_int(getattr(self, name), name)
        if self.tokens_per_step is not None and _as_int(self.tokens_per_step, "tokens_per_step") < 1:
            raise ValueError(f"tokens_per_step = {self.tokens_per_step}: a token budget must be >= 1 token "
                             "(None: a budget in trajectories)")
        if self.roots_M < 2:
            raise ValueError(f"roots_M = {self.roots_M}: the root budget M must be >= 2")
        if self.expansion_N < 0:
            raise ValueError(f"expansion_N = {self.expansion_N}: the expansion factor cannot be negative")
        if self.group_size_G < 2:
            raise ValueError(f"group_size_G = {self.group_size_G}: a group needs >= 2 rollouts")
        if self.roots_M % self.group_size_G:
            raise ValueError(
                f"roots_M = {self.roots_M} is not divisible by group_size_G = {self.group_size_G} "
                "(the uniform baselines need M/G and M(1+N)/G whole prompts)"
            )
        if self.max_per_prompt < 2:
            raise ValueError(f"max_per_prompt = {self.max_per_prompt}: it must be >= 2")
        if self.pool_factor < 1:
            raise ValueError(f"pool_factor = {self.pool_factor}: it must be >= 1")

    @property
    def total(self) -> int:
        """Trajectories per step, for every method: M(1+N)."""
        return self.roots_M * (1 + self.expansion_N)

    @property
    def prices_tokens(self) -> bool:
        """Whether the budget is counted in generated tokens (``tokens_per_step``)."""
        return self.tokens_per_step is not None

    @property
    def pool_size(self) -> int:
        """Candidate pool B = pool_factor·M(1+N)/G."""
        return self.pool_factor * self.total // self.group_size_G


@runtime_checkable
class RootRule(Protocol):
    """How a method picks the step's bare rollouts per candidate: ``(v, spec, rng, history) → m``.

    One interface for every root rule, so that :class:`Method` has one root field whether or not
    the rule keeps state across steps. A rule that does (GRESO, the posterior roots) keeps none
    itself: its state is the caller's :class:`~trace_core.history.PromptHistory`, handed in as a
    :class:`~trace_core.history.HistoryView` with one row per candidate, so a checkpoint holds it
    and the trainer and the simulator share it. ``reads_history`` tells a caller whether building
    that view is worth it; a rule that reads none ignores ``history``, and one that does treats
    ``None`` as an empty history (a first step, or a caller that keeps no history).

    ``budget``, when given, replaces the root rollouts the rule spends (its default: ``spec.roots_M``
    for an expanding method's rule, ``spec.total`` otherwise): method §5's exploration re-runs the
    rule of a method that explores on the prompts it does not explore, with what is left. Only
    such rules take it; the others raise on it."""

    @property
    def reads_history(self) -> bool: ...

    def __call__(
        self, v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator, history: HistoryView | None,
        budget: int | None = None,
    ) -> np.ndarray: ...


@dataclass(frozen=True)
class StatelessRoots:
    """A root rule that decides from the step's predictions alone (GRPO, PCL, TRACE's roots): a
    plain ``(v, spec, rng) → m`` function, which keeps nothing across steps and so ignores any
    history. Used as a decorator, the function's own name becomes the :class:`RootRule`, still
    callable as ``rule(v, spec, rng)``. A ``budget`` is handed on as the keyword ``budget``, which
    only a function that takes part in exploration accepts (TRACE's roots)."""

    choose: Callable[..., np.ndarray]
    reads_history: ClassVar[bool] = False

    def __call__(
        self, v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator, history: HistoryView | None = None,
        budget: int | None = None,
    ) -> np.ndarray:
        return self.choose(v, spec, rng) if budget is None else self.choose(v, spec, rng, budget=budget)


@dataclass(frozen=True)
class EntropySignals:
    """Per-anchor entropy features of one prompt's finished bare rollouts (ARPO's branch signal,
    :func:`~trace_core.arpo.anchor_entropy`), each normalised by ``log |V|``."""

    after: np.ndarray  # float64 (A,): the first k tokens the rollout wrote after the anchor's tool result
    initial: np.ndarray  # float64 (A,): the first k tokens of that rollout's first turn

    def __post_init__(self) -> None:
        after = np.asarray(self.after, dtype=np.float64)
        initial = np.asarray(self.initial, dtype=np.float64)
        if after.ndim != 1 or after.shape != initial.shape:
            raise ValueError(f"after and initial need one entry per anchor, got shapes {after.shape} and "
                             f"{initial.shape}")
        if not (np.all(np.isfinite(after)) and np.all(np.isfinite(initial))):
            raise ValueError("entropy signals must be finite")
        object.__setattr__(self, "after", after)
        object.__setattr__(self, "initial", initial)

    @property
    def change(self) -> np.ndarray:
        """ΔH: each anchor's entropy after its tool result less its rollout's initial entropy."""
        return self.after - self.initial


@dataclass(frozen=True)
class AnchorSignals:
    """What a prefix rule reads of one prompt's anchors, one entry per anchor: the predictor's score
    ``p``, the outcome ``r`` of the bare rollout through the anchor (1.0 success), its depth ``turn``,
    the bare rollout it belongs to (``rollout``: its trajectory id; None where the caller has none)
    and, for a rule that reads them (:class:`EntropyReader`), the entropy features. Validated on
    construction (:func:`_check_prefix_inputs`)."""

    p: np.ndarray
    r: np.ndarray
    turn: np.ndarray
    rollout: np.ndarray | None = None
    entropy: EntropySignals | None = None

    def __post_init__(self) -> None:
        p, r, t = _check_prefix_inputs(self.p, self.r, self.turn)
        object.__setattr__(self, "p", p)
        object.__setattr__(self, "r", r)
        object.__setattr__(self, "turn", t)
        if self.rollout is not None:
            rollout = np.asarray(self.rollout, dtype=np.int64)
            if rollout.shape != p.shape:
                raise ValueError(f"rollout has shape {rollout.shape} but p has shape {p.shape}")
            object.__setattr__(self, "rollout", rollout)
        if self.entropy is not None and self.entropy.after.shape != p.shape:
            raise ValueError(f"the entropy signals have shape {self.entropy.after.shape} but p has shape {p.shape}")

    @property
    def size(self) -> int:
        return int(self.p.shape[0])


# A prefix rule: (the prompt's anchor signals, its prefix budget, rng) → K per anchor spending the
# whole budget, or a PrefixPlacement that sends part of it back to the root (ARPO's global fill).
PrefixRule = Callable[[AnchorSignals, int, np.random.Generator], "np.ndarray | PrefixPlacement"]


@runtime_checkable
class EntropyReader(Protocol):
    """A prefix rule that reads the entropy of the tokens written after each anchor's tool result
    (ARPO): its caller hands it :class:`EntropySignals` over windows of ``entropy_window`` tokens."""

    @property
    def entropy_window(self) -> int: ...


def _uniform_prompts(num_prompts: int, pool: int, group: int, rng: np.random.Generator) -> np.ndarray:
    if num_prompts > pool:
        raise ValueError(f"need {num_prompts} prompts of {group} rollouts but the pool holds only {pool}")
    m = np.zeros(pool, dtype=np.int64)
    m[rng.choice(pool, size=num_prompts, replace=False)] = group
    return m


@StatelessRoots
def roots_uniform_all(v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator) -> np.ndarray:
    """GRPO: M(1+N)/G random prompts × G rollouts (no expansion)."""
    return _uniform_prompts(spec.total // spec.group_size_G, v.shape[0], spec.group_size_G, rng)


@StatelessRoots
def roots_uniform(v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator) -> np.ndarray:
    """TreePO / trace-prefix-only: M/G random prompts × G rollouts (the rest goes to expansion)."""
    return _uniform_prompts(spec.roots_M // spec.group_size_G, v.shape[0], spec.group_size_G, rng)


@StatelessRoots
def roots_pcl(v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator) -> np.ndarray:
    """PCL: the M(1+N)/G prompts whose predicted v is nearest 0.5, G rollouts each (random ties)."""
    n = spec.total // spec.group_size_G
    if n > v.shape[0]:
        raise ValueError(f"PCL needs {n} prompts but the pool holds only {v.shape[0]}")
    order = np.lexsort((rng.permutation(v.shape[0]), np.abs(v - 0.5)))
    m = np.zeros(v.shape[0], dtype=np.int64)
    m[order[:n]] = spec.group_size_G
    return m


@StatelessRoots
def roots_trace(v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator, budget: int | None = None) -> np.ndarray:
    """TRACE stage 1: the exact optimum of method §2 with budget M (or ``budget``)."""
    return allocate_roots(v, spec.roots_M if budget is None else budget, spec.max_per_prompt)


def prefixes_trace(anchors: AnchorSignals, budget: int, rng: np.random.Generator) -> np.ndarray:
    """TRACE stage 2: the exact optimum of method §3."""
    return allocate_prefixes(anchors.p, anchors.r, budget, anchors.turn)


def prefixes_random(anchors: AnchorSignals, budget: int, rng: np.random.Generator) -> np.ndarray:
    """TreePO / trace-root-only: each continuation goes to a uniformly random anchor."""
    n = anchors.size
    if budget and n == 0:
        raise ValueError(f"budget = {budget} but there are no anchors to spend it on")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    return np.bincount(rng.integers(0, n, size=budget), minlength=n).astype(np.int64)


@dataclass(frozen=True)
class ArpoPrefixes:
    """ARPO's prefix rule (arXiv 2507.19849; :mod:`trace_core.arpo`): continuations at the anchors
    whose entropy rose after their tool result (:func:`~trace_core.arpo.arpo_placement`, up to
    ``Z − 1`` per anchor, turn by turn), the rest of the budget as more root rollouts. It reads the
    anchors' :class:`EntropySignals` (an :class:`EntropyReader`), not the predictor."""

    config: ArpoConfig = ArpoConfig()

    @property
    def entropy_window(self) -> int:
        return int(self.config.entropy_window)

    def __call__(self, anchors: AnchorSignals, budget: int, rng: np.random.Generator) -> PrefixPlacement:
        if anchors.entropy is None:
            raise ValueError("ARPO's prefix rule reads the anchors' entropy signals; the caller gave none")
        K, extra = arpo_placement(anchors.turn, anchors.rollout, anchors.entropy.change, budget, self.config, rng)
        return PrefixPlacement(K, extra)


# ============================================================================ rules with memory or rounds
@dataclass(frozen=True)
class WithoutHistory:
    """A history-reading root rule that is always shown an empty history: what it does on a first
    step, kept for every step. The rule's memoryless ablation (GRESO that forgets, the posterior
    roots on the prior alone); it reads no history, so a caller builds no view for it."""

    rule: RootRule
    reads_history: ClassVar[bool] = False

    def __call__(
        self, v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator, history: HistoryView | None = None,
        budget: int | None = None,
    ) -> np.ndarray:
        empty = HistoryView.empty(v.shape[0])
        return self.rule(v, spec, rng, empty) if budget is None else self.rule(v, spec, rng, empty, budget=budget)


@runtime_checkable
class CandidateFilter(Protocol):
    """A pre-rollout filter: which of the step's candidates a method's rounds may sample at all
    (GRESO's skip filter in front of dynamic sampling). Decided once per step, before the first
    round, from the predictions and, where ``reads_history``, the candidates' history."""

    @property
    def reads_history(self) -> bool: ...

    def keep(
        self, v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator, history: HistoryView | None
    ) -> np.ndarray:
        """bool (B,): the candidates that pass."""
        ...


@dataclass(frozen=True)
class GresoRoots:
    """GRESO (arXiv 2506.02177): its pre-rollout filter (:func:`~trace_core.history.greso_keep`:
    a prompt whose newest groups were all successes, or all failures, is skipped with a probability
    that grows with the streak, under two probabilities adapted every step from the recorded
    zero-variance shares) and ``G`` rollouts per prompt, no expansion.

    As a :class:`CandidateFilter` (:meth:`keep`) it stands in front of the dynamic sampling its
    authors run it with (the ``greso`` method). As a root rule, for a caller that cannot sample
    in rounds, it takes ``M(1+N)/G`` prompts: the kept candidates in random order, then, if fewer
    are kept than needed, filtered ones in random order (GRESO would draw more prompts from the
    dataset; our pool is the step's candidates). With no history both are GRPO's uniform rule."""

    config: GresoConfig = GresoConfig()
    reads_history: ClassVar[bool] = True

    def keep(
        self, v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator, history: HistoryView | None = None
    ) -> np.ndarray:
        B = v.shape[0]
        if history is None:
            history = HistoryView.empty(B)
        if len(history) != B:
            raise ValueError(f"history has {len(history)} rows for a pool of {B} prompts")
        return greso_keep(history, self.config, rng)

    def __call__(
        self, v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator, history: HistoryView | None = None,
        budget: int | None = None,
    ) -> np.ndarray:
        if budget is not None:
            raise ValueError("GRESO's roots take G rollouts per prompt; they do not re-split a budget")
        n, B = spec.total // spec.group_size_G, v.shape[0]
        if n > B:
            raise ValueError(f"need {n} prompts of {spec.group_size_G} rollouts but the pool holds only {B}")
        keep = self.keep(v, spec, rng, history)
        order = rng.permutation(B)
        ranked = np.concatenate([order[keep[order]], order[~keep[order]]])
        m = np.zeros(B, dtype=np.int64)
        m[ranked[:n]] = spec.group_size_G
        return m


@dataclass(frozen=True)
class PosteriorRoots:
    """TRACE's roots on a Beta posterior per prompt (:func:`~trace_core.history.beta_posterior`:
    the predictor's prior with ``prior_strength`` pseudo-rollouts plus the prompt's own discounted
    bare root outcomes): the exact :func:`allocate_roots_beta`, or, with ``sample_posterior``,
    :func:`allocate_roots_thompson` on one draw per prompt. Budget M (or ``budget``), as TRACE's roots."""

    config: PosteriorConfig = PosteriorConfig()
    sample_posterior: bool = False  # True: Thompson (one posterior draw per prompt); False: the exact expectation
    reads_history: ClassVar[bool] = True

    def __call__(
        self, v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator, history: HistoryView | None = None,
        budget: int | None = None,
    ) -> np.ndarray:
        if history is None:
            history = HistoryView.empty(v.shape[0])
        if len(history) != v.shape[0]:
            raise ValueError(f"history has {len(history)} rows for a pool of {v.shape[0]} prompts")
        alpha, beta = beta_posterior(history, v, self.config)
        roots = spec.roots_M if budget is None else int(budget)
        if self.sample_posterior:
            return allocate_roots_thompson(alpha, beta, roots, spec.max_per_prompt, rng)
        return allocate_roots_beta(alpha, beta, roots, spec.max_per_prompt)


@dataclass(frozen=True)
class RoundLimits:
    """What a round rule may spend in one step. ``None``: no such cap (the pool still bounds it)."""

    max_rounds: int | None  # sampling rounds a step
    max_rollouts: int | None  # bare rollouts a step, over all its rounds


class RoundRule(Protocol):
    """A group filter and the rounds that feed it: before each round the rule sees what the earlier
    rounds produced and returns the round's bare rollouts per candidate (all zeros: stop); after
    the last round it says which groups the policy trains on. The two halves are one rule because
    the rounds exist to fill the filter (DAPO samples until enough groups pass it). A round rule
    spends what its rounds spend, within its own :meth:`limits` (a cap on rounds, on rollouts, or
    both), which the caller checks (:func:`next_checked_round`) and reports as spent."""

    def next_round(
        self, v: np.ndarray, available: np.ndarray, mixed_groups: int, spent: int, rounds: int, spec: BudgetSpec,
        rng: np.random.Generator,
    ) -> np.ndarray:
        """``available``: bool (B,), candidates the round may sample (not sampled yet, and not
        skipped by the method's pre-rollout filter); ``mixed_groups``: groups so far holding both
        outcomes; ``spent``: bare rollouts so far; ``rounds``: rounds so far."""
        ...

    def keep_groups(self, mixed: np.ndarray, spec: BudgetSpec) -> np.ndarray:
        """bool mask over the sampled groups, given in sampling order with ``mixed`` flags."""
        ...

    def limits(self, spec: BudgetSpec) -> RoundLimits:
        """The caps the rounds of one step stay within."""
        ...


def next_checked_round(
    rule: RoundRule, v: np.ndarray, m: np.ndarray, mixed_groups: int, rounds: int, spec: BudgetSpec,
    rng: np.random.Generator, eligible: np.ndarray | None = None,
) -> np.ndarray:
    """The rule's next round (int64, one entry per candidate) after the ``rounds`` rounds that gave
    ``m`` rollouts per candidate, checked against the round contract the trainer's executor and the
    simulator both rely on: fresh candidates that passed the pre-rollout filter (``eligible``; None:
    all) only, 0 or >= 2 rollouts each, and never past the rule's :meth:`~RoundRule.limits`.
    ValueError for a malformed round, AssertionError for a round past a cap."""
    available = m == 0 if eligible is None else (m == 0) & np.asarray(eligible, dtype=bool)
    m_r = np.asarray(rule.next_round(v, available, mixed_groups, int(m.sum()), int(rounds), spec, rng),
                     dtype=np.int64)
    if m_r.shape != m.shape or np.any(m_r < 0) or np.any(m_r == 1) or np.any((m_r > 0) & ~available):
        raise ValueError("a round must give available prompts 0 or >= 2 rollouts each, one entry per candidate")
    limits = rule.limits(spec)
    if m_r.any() and limits.max_rounds is not None and rounds >= limits.max_rounds:
        raise AssertionError(f"round {rounds + 1} is past the rule's cap of {limits.max_rounds} rounds")
    if limits.max_rollouts is not None and int(m.sum() + m_r.sum()) > limits.max_rollouts:
        raise AssertionError(f"rounds spend {int(m.sum() + m_r.sum())} > the budget {limits.max_rollouts}")
    return m_r


@dataclass(frozen=True)
class SampledRounds:
    """What a step's rounds sampled (:func:`sample_in_rounds`); the arrays over groups are in
    sampling order — round by round, candidate order within a round."""

    m: np.ndarray  # int64 (B,): bare rollouts per candidate over all rounds
    order: np.ndarray  # int64 (groups,): the sampled candidates in sampling order
    mixed: np.ndarray  # bool (groups,): the group holds both outcomes (metrics.is_mixed)
    kept: np.ndarray  # bool (groups,): the group filter trains on the group
    rounds: int  # rounds run


def sample_in_rounds(
    method: Method, v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator,
    roll: Callable[[np.ndarray], np.ndarray], history: HistoryView | None = None,
) -> SampledRounds:
    """A method's bare groups in rounds, the one loop the trainer's executor and the simulator run:
    the pre-rollout filter once (:meth:`Method.round_candidates`, reading ``history``), then round
    after round the group filter's next round (:func:`next_checked_round`), each rolled out by
    ``roll`` before the next is chosen, until the rule stops; then the filter's keep decision over
    every sampled group in sampling order. ``roll(m_r)`` rolls out one round (``m_r``: rollouts per
    candidate) and returns whether each of its groups is mixed, in candidate order (the order of
    ``np.flatnonzero(m_r)``)."""
    rule = method.group_filter
    if rule is None:
        raise ValueError(f"method {method.name!r} has no round rule: it samples its roots at once")
    v = np.asarray(v, dtype=np.float64)
    eligible = method.round_candidates(v, spec, rng, history)
    m = np.zeros(v.shape[0], dtype=np.int64)
    order: list[np.ndarray] = []
    flags: list[np.ndarray] = []
    mixed = rounds = 0
    while True:
        m_r = next_checked_round(rule, v, m, mixed, rounds, spec, rng, eligible)
        if not m_r.any():
            break
        sampled = np.flatnonzero(m_r)
        round_mixed = np.asarray(roll(m_r), dtype=bool)
        if round_mixed.shape != sampled.shape:
            raise ValueError(f"a round of {sampled.size} groups rolled out {round_mixed.size} mixed flags")
        mixed += int(round_mixed.sum())
        order.append(sampled)
        flags.append(round_mixed)
        m += m_r
        rounds += 1
    order_all = np.concatenate(order) if order else np.zeros(0, dtype=np.int64)
    mixed_all = np.concatenate(flags) if flags else np.zeros(0, dtype=bool)
    kept = np.asarray(rule.keep_groups(mixed_all, spec), dtype=bool)
    if kept.shape != mixed_all.shape:
        raise ValueError(f"keep_groups returned shape {kept.shape} for {mixed_all.size} groups")
    return SampledRounds(m, order_all, mixed_all, kept, rounds)


@dataclass(frozen=True)
class DynamicSamplingConfig:
    """Dynamic sampling (DAPO, arXiv 2503.14476): rounds of fresh prompts × ``G``; groups of one
    outcome dropped, mixed ones kept up to the batch. The defaults are DAPO's as its authors run it
    (verl's ``recipe/dapo``, ``run_dapo_qwen2.5_32b.sh``: ``gen_prompt_bsz = 3 × train_prompt_bsz``,
    ``max_num_gen_batches = 10``); ``dapo-capped`` and ``greso`` set their own (the registry)."""

    target_fraction: float = 1.0  # mixed groups the batch holds, as a share of GRPO's M(1+N)/G
    round_fraction: float = 3.0  # prompts of a round (the first, with refill_margin), as a share of M(1+N)/G
    max_rounds: int = 10  # rounds a step at most (DAPO's max_num_gen_batches); 0: no cap (the pool bounds them)
    budget_capped: bool = False  # True: rounds never spend past M(1+N) (our budget-capped variant)
    # > 0: rounds after the first are sized from the shortfall: ⌊missing / (mixed share so far) ×
    # refill_margin⌋ prompts, between min_round_fraction and round_fraction of M(1+N)/G (GRESO's
    # code sizes its later sampling batches so); 0: every round has round_fraction
    refill_margin: float = 0.0
    min_round_fraction: float = 0.0  # the smallest round sized from the shortfall, as a share of M(1+N)/G

    def __post_init__(self) -> None:
        if not (np.isfinite(self.target_fraction) and 0.0 < self.target_fraction <= 1.0):
            raise ValueError(f"target_fraction = {self.target_fraction}: it must lie in (0, 1]")
        if not (np.isfinite(self.round_fraction) and self.round_fraction > 0.0):
            raise ValueError(f"round_fraction = {self.round_fraction}: it must be finite and > 0")
        if int(self.max_rounds) < 0:
            raise ValueError(f"max_rounds = {self.max_rounds}: it must be >= 0 (0: no cap)")
        if not (np.isfinite(self.refill_margin) and self.refill_margin >= 0.0):
            raise ValueError(f"refill_margin = {self.refill_margin}: it must be finite and >= 0")
        if not (0.0 <= self.min_round_fraction <= self.round_fraction):
            raise ValueError(f"min_round_fraction = {self.min_round_fraction}: it must lie in [0, round_fraction]")


@dataclass(frozen=True)
class DynamicSampling:
    """Dynamic sampling: rounds of random available prompts × ``G`` until the batch holds ``B``
    mixed groups (``target_groups``), the round cap is reached, the candidates run out, or — when
    ``budget_capped`` — the budget ``M(1+N)`` is spent. Groups of one outcome are dropped (the group
    filter) and mixed groups beyond the first ``B`` too (DAPO trims the batch to its size) — they
    still cost their rollouts, and the step reports every rollout spent."""

    config: DynamicSamplingConfig = DynamicSamplingConfig()

    def _batch_prompts(self, spec: BudgetSpec) -> int:
        return spec.total // spec.group_size_G

    def target_groups(self, spec: BudgetSpec) -> int:
        return max(1, round(self.config.target_fraction * self._batch_prompts(spec)))

    def round_prompts(self, spec: BudgetSpec) -> int:
        """Prompts of a round of full size (every round, unless later rounds are sized from the shortfall)."""
        return max(1, round(self.config.round_fraction * self._batch_prompts(spec)))

    def limits(self, spec: BudgetSpec) -> RoundLimits:
        return RoundLimits(int(self.config.max_rounds) or None, spec.total if self.config.budget_capped else None)

    def next_round(
        self, v: np.ndarray, available: np.ndarray, mixed_groups: int, spent: int, rounds: int, spec: BudgetSpec,
        rng: np.random.Generator,
    ) -> np.ndarray:
        m = np.zeros(v.shape[0], dtype=np.int64)
        cap = self.config.max_rounds
        if mixed_groups >= self.target_groups(spec) or (cap and rounds >= cap):
            return m
        n = self.round_prompts(spec)
        sampled_groups = spent // spec.group_size_G
        if self.config.refill_margin > 0 and rounds > 0 and mixed_groups > 0:
            missing = self.target_groups(spec) - mixed_groups
            estimate = int(missing / (mixed_groups / sampled_groups) * self.config.refill_margin)
            floor = max(1, round(self.config.min_round_fraction * self._batch_prompts(spec)))
            n = min(max(estimate, floor), n)
        fresh = np.flatnonzero(available)
        n = min(n, fresh.size)
        if self.config.budget_capped:
            n = min(n, (spec.total - spent) // spec.group_size_G)
        if n > 0:
            m[rng.choice(fresh, size=n, replace=False)] = spec.group_size_G
        return m

    def keep_groups(self, mixed: np.ndarray, spec: BudgetSpec) -> np.ndarray:
        mixed = np.asarray(mixed, dtype=bool)
        return mixed & (np.cumsum(mixed) <= self.target_groups(spec))


# ============================================================================ rules priced in tokens
@dataclass(frozen=True)
class OneBudgetConfig:
    """The one-budget rule of ``trace-tokens`` (method §10, :mod:`trace_core.token_budget`)."""

    # Candidate shares R/T of the step's token budget kept from the root solver for stage 2; the
    # share whose root value plus predicted prefix value is largest wins (ties: the smaller share).
    reservation_grid: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
    # Budget units of stage 1's exact root DP: its quantum is ⌈T / root_dp_units⌉ tokens.
    root_dp_units: int = 4096
    # Continuations per expected anchor that stage 1's prediction counts (the k-th gains
    # v(1−v)(v^{k−1} + (1−v)^{k−1}), so later ones add little).
    plan_units_per_anchor: int = 32

    def __post_init__(self) -> None:
        grid = tuple(float(x) for x in self.reservation_grid)
        if not grid or any(not (np.isfinite(x) and 0.0 <= x < 1.0) for x in grid):
            raise ValueError(f"reservation_grid = {self.reservation_grid}: it needs at least one share, each in [0, 1)")
        for name in ("root_dp_units", "plan_units_per_anchor"):
            if _as_int(getattr(self, name), name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)}: it must be >= 1")


@runtime_checkable
class TokenRule(Protocol):
    """How a method spends a step's budget of generated tokens (method §10): :meth:`plan` picks the
    bare rollouts and each prompt's reservation before any rollout, :meth:`spend` one prompt's
    continuations and extra root rollouts once its bare rollouts have finished. Whatever state the
    rule reads (cost estimates, its calibration) is the caller's, handed in as numbers."""

    def plan(
        self, v: np.ndarray, root_cost: np.ndarray, turns: np.ndarray, anchor_fraction: np.ndarray,
        spec: BudgetSpec, rho: float = 1.0,
    ) -> object:
        """A :class:`~trace_core.token_budget.TokenPlan` (``m``, ``reserved`` per candidate)."""
        ...

    def spend(
        self, p: np.ndarray, r: np.ndarray, turn: np.ndarray, anchor_cost: np.ndarray, bare_rewards: np.ndarray,
        root_p: float, root_cost: float, allowance: float,
    ) -> object:
        """A :class:`~trace_core.token_budget.PromptSpend` (``K`` per anchor, ``extra_roots``)."""
        ...


@dataclass(frozen=True)
class OneBudget:
    """``trace-tokens``' rule: one token budget a step, no fixed ``m_i·N`` prefix share — stage 1
    :func:`~trace_core.token_budget.plan_token_step` (exact roots, a reservation chosen on
    :attr:`OneBudgetConfig.reservation_grid`), stage 2
    :func:`~trace_core.token_budget.spend_prompt_tokens` (per prompt, gain per expected token over
    continuations and more root rollouts)."""

    config: OneBudgetConfig = OneBudgetConfig()

    def plan(
        self, v: np.ndarray, root_cost: np.ndarray, turns: np.ndarray, anchor_fraction: np.ndarray,
        spec: BudgetSpec, rho: float = 1.0,
    ) -> object:
        if spec.tokens_per_step is None:
            raise ValueError("a token-priced rule needs a token budget: BudgetSpec.tokens_per_step is None")
        from trace_core.token_budget import plan_token_step  # that module builds on this one

        return plan_token_step(v, root_cost, turns, anchor_fraction, spec.tokens_per_step, rho,
                               spec.max_per_prompt, self.config)

    def spend(
        self, p: np.ndarray, r: np.ndarray, turn: np.ndarray, anchor_cost: np.ndarray, bare_rewards: np.ndarray,
        root_p: float, root_cost: float, allowance: float,
    ) -> object:
        from trace_core.token_budget import spend_prompt_tokens

        return spend_prompt_tokens(p, r, turn, anchor_cost, bare_rewards, root_p, root_cost, allowance)


_TOKEN_PRICED = ("this method prices its rollouts in generated tokens: plan it with its token_rule (plan, then "
                 "spend per prompt) under a BudgetSpec with tokens_per_step; it has no trajectory-budget rule")


@dataclass(frozen=True)
class TokenPricedRoots:
    """The trajectory root slot of a method priced in tokens: it has no reading under a budget of
    trajectories, so it refuses rather than fall back to another rule."""

    reads_history: ClassVar[bool] = False

    def __call__(
        self, v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator, history: HistoryView | None = None,
        budget: int | None = None,
    ) -> np.ndarray:
        raise ValueError(_TOKEN_PRICED)


def prefixes_token_priced(anchors: AnchorSignals, budget: int, rng: np.random.Generator) -> np.ndarray:
    """The trajectory prefix slot of a method priced in tokens: it refuses (see :class:`TokenPricedRoots`)."""
    raise ValueError(_TOKEN_PRICED)


@dataclass(frozen=True)
class PrefixPlacement:
    """Where one prompt's prefix budget went (:meth:`Method.place_prefixes`)."""

    K: np.ndarray  # int64 (anchors,): continuations from each anchor
    extra_roots: int  # continuations from the root: an anchorless prompt's whole budget


@dataclass(frozen=True)
class Method:
    """A named method: every rule a training step (the trainer's or the simulator's) takes from it.

    Its rules are its fields, never something read off its name: a caller asks
    ``method.explores_roots``, not whether the name starts with "trace". A step takes from it

    - the roots: ``root_rule``, one :class:`RootRule` whether or not it keeps state across steps
      (``root_rule.reads_history``: the caller then hands it each candidate's earlier outcomes, a
      :class:`~trace_core.history.HistoryView` of its :class:`~trace_core.history.PromptHistory`),
      then method §5's exploration where ``explores_roots`` (:meth:`allocate_roots`);
    - or, with a ``group_filter``, bare rollouts in rounds until that filter has its groups, and
      only the groups it keeps trained on (a caller that cannot sample in rounds uses
      ``root_rule``, every round at once); the rounds draw only from the candidates that pass the
      ``candidate_filter`` where there is one (:meth:`round_candidates`: GRESO in front of dynamic
      sampling);
    - the prefixes: ``prefix_rule`` (None: no expansion);
    - or, with a ``token_rule``, both stages under a budget of generated tokens (method §10): the
      trajectory slots of such a method refuse (:class:`TokenPricedRoots`), and a caller plans its
      step with ``token_rule.plan`` and ``token_rule.spend`` (``prices_tokens``);
    - the advantages: ``default_advantage``, unless the run names another estimator
      (:meth:`advantage_estimator`)."""

    name: str
    root_rule: RootRule
    prefix_rule: PrefixRule | None
    description: str
    # method §5's explore_fraction (random skipped prompts at m = 2) applies to this method's roots:
    # TRACE's root rule skips prompts by prediction, and a skipped prompt gets no target, so a
    # confident wrong prediction is never corrected. Uniform root rules skip nobody by prediction;
    # PCL is run as published, without exploration.
    explores_roots: bool = False
    # Either rule reads the success predictor's scores (PCL and TRACE's roots, TRACE's prefixes):
    # such a method is worth fitting the predictor for before RL (a warm-up); the others ignore it.
    uses_predictor: bool = False
    # The group filter (DAPO's dynamic sampling), which also schedules the bare rollouts in rounds
    # until enough groups pass it; None: the roots come at once and every group is trained on. A
    # method with one does not expand.
    group_filter: RoundRule | None = None
    # A pre-rollout filter of the candidates the rounds may sample (GRESO's skip filter), decided
    # once a step before the first round; None: every candidate. Only with a group_filter.
    candidate_filter: CandidateFilter | None = None
    # The advantage estimator it trains with (a name of trace_core.advantages' registry) unless the
    # run names another: method §6's tree advantage for every method, so that methods differ by
    # what they sample, not by how they score it (TreePO's own advantage stays an option).
    default_advantage: str = "tree"
    # The rule that prices the method's step in generated tokens (method §10): its roots, each
    # prompt's reservation and its stage 2 under BudgetSpec.tokens_per_step; None: a method of the
    # trajectory budget, whose rules are the fields above.
    token_rule: TokenRule | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.root_rule, RootRule):
            raise TypeError(f"method {self.name!r}: root_rule {self.root_rule!r} is no RootRule (it needs "
                            "reads_history; wrap a plain (v, spec, rng) function in StatelessRoots)")
        if self.group_filter is not None and self.prefix_rule is not None:
            raise ValueError(f"method {self.name!r}: a group filter samples bare groups only; it cannot expand")
        if self.candidate_filter is not None:
            if self.group_filter is None:
                raise ValueError(f"method {self.name!r}: a candidate filter stands in front of rounds; it needs "
                                 "a group_filter")
            if not isinstance(self.candidate_filter, CandidateFilter):
                raise TypeError(f"method {self.name!r}: candidate_filter {self.candidate_filter!r} is no "
                                "CandidateFilter (it needs reads_history and keep)")
        if self.token_rule is not None:
            if not isinstance(self.token_rule, TokenRule):
                raise TypeError(f"method {self.name!r}: token_rule {self.token_rule!r} is no TokenRule (it needs "
                                "plan and spend)")
            if self.group_filter is not None:
                raise ValueError(f"method {self.name!r}: a token-priced method plans its step at once; it "
                                 "cannot sample in rounds")
        try:
            get_advantage_estimator(self.default_advantage)
        except ValueError as err:
            raise ValueError(f"method {self.name!r}: default_advantage: {err}") from None

    @property
    def expands(self) -> bool:
        return self.prefix_rule is not None

    @property
    def entropy_window(self) -> int | None:
        """The window (tokens after a tool result) over which the prefix rule reads entropy, when it
        is an :class:`EntropyReader` (ARPO); None for a rule that reads no entropy."""
        return int(self.prefix_rule.entropy_window) if isinstance(self.prefix_rule, EntropyReader) else None

    @property
    def reads_entropy(self) -> bool:
        """Whether the prefix rule reads the entropy of the policy's tokens (a caller without tokens
        and log-probs, the simulator, cannot run it)."""
        return self.entropy_window is not None

    @property
    def prices_tokens(self) -> bool:
        """Whether the method's step is planned in generated tokens (``token_rule``); its trajectory
        rules then refuse."""
        return self.token_rule is not None

    @property
    def reads_history(self) -> bool:
        """Whether the roots (or the pre-rollout filter of its rounds) read the candidates' history:
        pass ``history`` to allocate_roots and round_candidates."""
        return bool(self.root_rule.reads_history) or bool(
            self.candidate_filter is not None and self.candidate_filter.reads_history)

    def round_candidates(
        self, v: object, spec: BudgetSpec, rng: np.random.Generator, history: HistoryView | None = None
    ) -> np.ndarray:
        """bool (B,): the candidates this step's rounds may sample — those the ``candidate_filter``
        keeps (one decision per step, before the first round), or all of them without one."""
        v = _as_probabilities(v, "v")
        if self.candidate_filter is None:
            return np.ones(v.shape[0], dtype=bool)
        keep = np.asarray(self.candidate_filter.keep(v, spec, rng, history), dtype=bool)
        if keep.shape != v.shape:
            raise ValueError(f"{self.name}: the candidate filter returned shape {keep.shape} for "
                             f"{v.shape[0]} candidates")
        return keep

    @property
    def samples_in_rounds(self) -> bool:
        """Whether the roots come in rounds, for the group filter (run them with its ``next_round``)."""
        return self.group_filter is not None

    def allocate_roots(
        self, v: object, spec: BudgetSpec, rng: np.random.Generator, history: HistoryView | None = None,
        explore_fraction: float = 0.0,
    ) -> np.ndarray:
        """The step's bare rollouts per candidate. ``history`` (one row per candidate) is read by a
        rule that reads history and ignored otherwise; without it such a rule sees an empty history.
        ``explore_fraction`` (method §5) re-splits the roots with :func:`explore_roots` when the
        method explores, and is ignored otherwise: the explored prompts get 2 rollouts each and the
        method's own root rule re-splits the rest of the budget over the other prompts (their rows
        of ``history`` included), so a posterior rule keeps its posterior."""
        v = _as_probabilities(v, "v")
        if self.prices_tokens:
            raise ValueError(f"method {self.name!r}: {_TOKEN_PRICED}")
        m = self.root_rule(v, spec, rng, history)
        expected = spec.roots_M if self.expands else spec.total
        if int(m.sum()) != expected:  # a loud guard on the equal-cost contract
            raise AssertionError(f"{self.name}: root allocation spends {int(m.sum())}, expected {expected}")
        if explore_fraction > 0 and self.explores_roots:
            def own_rule(rest: np.ndarray, budget: int) -> np.ndarray:
                view = None if history is None else history.take(rest)
                return self.root_rule(v[rest], spec, rng, view, budget=budget)

            m = explore_roots(m, v, explore_fraction, rng, spec.max_per_prompt, reallocate=own_rule)
        return m

    def advantage_estimator(self, name: str | None = None) -> AdvantageEstimator:
        """The estimator registered as ``name``, or the method's ``default_advantage`` when None."""
        return get_advantage_estimator(self.default_advantage if name is None else name)

    def prefix_budget(self, m_i: int, expansion_N: int) -> int:
        """Method §3's prefix budget of a prompt given ``m_i`` bare rollouts: ``m_i·N``
        continuations for a method that expands, none for one that does not."""
        if self.prices_tokens:
            raise ValueError(f"method {self.name!r}: {_TOKEN_PRICED}")
        return int(m_i) * int(expansion_N) if self.expands else 0

    def check_planned(self, spec: BudgetSpec, planned: int) -> None:
        """The equal-budget contract of method §4: a step planned in trajectory slots spends
        exactly ``spec.total``. A method sampling in rounds spends what its rounds sample (within
        its rule's limits) and a token-priced one what its token budget buys, so neither is held
        to it. AssertionError otherwise: a loud guard, not a condition to handle."""
        if planned != spec.total and not (self.samples_in_rounds or self.prices_tokens):
            raise AssertionError(f"{self.name}: spends {planned} != {spec.total}")

    def place_prefixes(self, anchors: AnchorSignals, budget: int, rng: np.random.Generator) -> PrefixPlacement:
        """Where one prompt's prefix ``budget`` goes, once its bare rollouts are done: over its
        anchors by the prefix rule (``anchors``: the signals of each), or — a prompt whose rollouts
        left no anchor (all one turn long) — all of it as more rollouts from the root, the depth-0
        anchor (method §3). A rule may itself send part of the budget to the root (ARPO's global
        fill: it returns a :class:`PrefixPlacement`). The executor and the simulator both place
        their continuations here. AssertionError if the rule does not spend exactly ``budget``."""
        n_anchors = anchors.size
        if budget and n_anchors == 0:
            return PrefixPlacement(np.zeros(0, dtype=np.int64), int(budget))
        if self.prefix_rule is None:
            if budget:
                raise ValueError(f"method {self.name!r} does not expand prefixes but got budget {budget}")
            return PrefixPlacement(np.zeros(n_anchors, dtype=np.int64), 0)
        out = self.prefix_rule(anchors, int(budget), rng)
        placement = out if isinstance(out, PrefixPlacement) else PrefixPlacement(np.asarray(out, dtype=np.int64), 0)
        K = np.asarray(placement.K, dtype=np.int64)
        if K.shape != (n_anchors,) or np.any(K < 0) or placement.extra_roots < 0:
            raise ValueError(f"{self.name}: the prefix rule placed K of shape {K.shape} (extra "
                             f"{placement.extra_roots}) for {n_anchors} anchors: one count >= 0 per anchor")
        spent = int(K.sum()) + int(placement.extra_roots)
        if spent != int(budget):
            raise AssertionError(f"{self.name}: prefix allocation spent {spent} of {int(budget)}")
        return PrefixPlacement(K, int(placement.extra_roots))

METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    if method.name in METHODS:
        raise ValueError(f"allocation method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown allocation method {name!r}; known: {', '.join(sorted(METHODS))}") from None


register_method(Method("grpo", roots_uniform_all, None, "uniform: M(1+N)/G random prompts × G, no expansion"))
register_method(Method("pcl", roots_pcl, None, "M(1+N)/G prompts with v nearest 0.5 × G, no expansion",
                       uses_predictor=True))
register_method(Method("treepo", roots_uniform, prefixes_random, "M/G random prompts × G; random anchors"))
register_method(Method("trace", roots_trace, prefixes_trace, "exact method §2 roots; exact method §3 prefixes",
                       explores_roots=True, uses_predictor=True))
register_method(Method("trace-root-only", roots_trace, prefixes_random, "exact method §2 roots; random anchors",
                       explores_roots=True, uses_predictor=True))
register_method(Method("trace-prefix-only", roots_uniform, prefixes_trace, "M/G random prompts × G; exact §3",
                       uses_predictor=True))

_GRESO = GresoRoots()
register_method(Method("greso", _GRESO, None,
                       "GRESO as its authors run it: its adaptive pre-rollout skip filter in front of dynamic "
                       "sampling (first round 1.5·M(1+N)/G prompts × G, later ones sized from the shortfall, "
                       "until M(1+N)/G mixed groups); one-outcome groups dropped",
                       group_filter=DynamicSampling(DynamicSamplingConfig(
                           target_fraction=1.0, round_fraction=1.5, max_rounds=0, refill_margin=1.25,
                           min_round_fraction=0.25)),
                       candidate_filter=_GRESO))
register_method(Method("dapo", roots_uniform_all, None,
                       "DAPO dynamic sampling as its authors run it: rounds of 3·M(1+N)/G random prompts × G "
                       "until M(1+N)/G mixed groups or 10 rounds; one-outcome groups dropped; spends what it "
                       "samples", group_filter=DynamicSampling()))
register_method(Method("dapo-capped", roots_uniform_all, None,
                       "ours: DAPO's dynamic sampling within the equal budget: rounds of M(1+N)/(4G) random "
                       "prompts × G until M(1+N)/(2G) mixed groups or M(1+N) rollouts; one-outcome groups dropped",
                       group_filter=DynamicSampling(DynamicSamplingConfig(
                           target_fraction=0.5, round_fraction=0.25, max_rounds=0, budget_capped=True))))
register_method(Method("trace-posterior", PosteriorRoots(), prefixes_trace,
                       "exact roots on a Beta posterior (predictor prior + own outcomes); exact method §3 prefixes",
                       explores_roots=True, uses_predictor=True))
register_method(Method("trace-posterior-thompson", PosteriorRoots(sample_posterior=True), prefixes_trace,
                       "method §2 roots on one posterior draw per prompt; exact method §3 prefixes",
                       explores_roots=True, uses_predictor=True))
register_method(Method("vip", VipRoots(), None,
                       "VIP: M(1+N)/G random prompts; a GP on recent outcomes predicts success and the budget M(1+N) "
                       "is split between 2 and M_max to minimise the batch's gradient variance", uses_predictor=True))
register_method(Method("knapsack-rl", KnapsackRoots(), None,
                       "Knapsack-RL: M(1+N)/G random prompts; the budget M(1+N) shared by a knapsack over each "
                       "prompt's success rate from its last root group (floor 2, unseen G, the rest of what "
                       "α = 0.9 confidence needs to the never-solved prompts); no expansion"))
register_method(Method("trace-tokens", TokenPricedRoots(), prefixes_token_priced,
                       "method §10: one budget of generated tokens a step; exact roots on quantised costs with a "
                       "reservation for stage 2, then per prompt continuations or more roots by gain per token",
                       uses_predictor=True, token_rule=OneBudget()))
register_method(Method("arpo", roots_uniform, ArpoPrefixes(),
                       "ARPO: M/G random prompts × G global rollouts; m_i·N continuations at the anchors whose "
                       "entropy rose after their tool result (up to Z − 1 = 1 each, turn by turn), the rest as more "
                       "global rollouts; ARPO's soft advantage attribution", default_advantage="arpo-soft"))
