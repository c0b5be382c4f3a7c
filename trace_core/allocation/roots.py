"""Method §2: the global root allocation — bare rollouts per prompt under the budget M.

Numpy in, numpy out. :func:`allocate_roots` is exact (marginal gains are non-increasing past
``m = 2``, so a greedy over unit gains with the ``m = 2`` pair treated as one unit and method §2's
tie rules is optimal); :func:`allocate_roots_dp` is its reference, for tests and benchmarks, never a
silent fallback. The Beta-posterior solvers (:func:`allocate_roots_beta`, Thompson's
:func:`allocate_roots_thompson`) are the same solver on a posterior per prompt; :func:`explore_roots`
is method §5's exploration.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trace_core.allocation.checks import GAIN_TIE_TOL, as_int, as_probabilities


def check_root_budget(num_prompts: int, budget: int, max_per_prompt: int) -> None:
    """Raise ValueError for every infeasible case of method §2, naming the numbers."""
    budget = as_int(budget, "budget")
    max_per_prompt = as_int(max_per_prompt, "max_per_prompt")
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
    v = as_probabilities(v, "v")
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
    v = as_probabilities(v, "v")
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
    order = as_int(order, "order")
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
