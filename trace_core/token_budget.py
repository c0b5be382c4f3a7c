"""The token budget (method §10): rollouts priced in expected generated tokens, numpy in, numpy out.

A trajectory budget charges a continuation from a late turn as much as a root rollout, though it
generates a fraction of the tokens; with prefix caching an engine's time follows generated tokens.
Here prompt ``i``'s root rollouts cost ``c_i`` tokens each and a continuation from anchor ``j``
costs ``c_j`` (the estimates of :mod:`trace_core.costs`), and one budget ``T`` of generated tokens
per step bounds them:

- **roots** (:func:`allocate_roots_tokens`, exact on quantised costs; :func:`allocate_roots_tokens_greedy`,
  the ratio greedy with its bound): ``max Σ_i V_root(v_i, m_i)`` s.t. ``Σ_i c_i m_i ≤ T``,
  ``m_i ∈ {0} ∪ {2..M_max}``;
- **prefixes** (:func:`allocate_prefixes_tokens`, :func:`allocate_prefixes_tokens_greedy`):
  ``max Σ_j V_pref(j, K_j)`` s.t. ``Σ_j c_j K_j ≤ T_pref``;
- **the one-budget rule** of ``trace-tokens``: one budget a step, no fixed ``m_i·N`` prefix share.
  Stage 1 (:func:`plan_token_step`) picks the roots and reserves part of ``T`` for stage 2 by
  predicting what the reserved tokens will buy; stage 2 (:func:`spend_prompt_tokens`), per prompt
  once its bare rollouts have finished, spends its reservation and its roots' leftover on
  continuations or more root rollouts, each next unit where it gains most per expected token;
- **uniform methods at a token budget** (:func:`uniform_groups_for_tokens`,
  :func:`uniform_spec_for_tokens`): as many groups of ``G`` as the budget buys at the expected costs.

**One scale for both stages.** ``V_root`` is the probability that a prompt's group shows both
outcomes, ``V_pref`` the probability that an anchor's branch group (the bare rollout through it
and its continuations) shows both: each is the probability that one group with a nonzero
group-relative advantage appears, so their sum is the expected number of such groups and a token
is worth the same in either stage. "Expected rollouts with a nonzero advantage" would be a worse
scale: it counts a group of sixteen with one success sixteen times, though the group teaches one
contrast, and so pays for large groups on decided prompts; and within a tree a rollout's advantage
is taken against its nearest branching node's siblings, so the count of rollouts it would credit
depends on the tree's shape, not on the contrasts it holds.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from trace_core.allocation import (
    GAIN_TIE_TOL,
    AnchorSignals,
    BudgetSpec,
    as_int,
    as_probabilities,
    check_prefix_inputs,
    continuation_keep_probability,
    root_unit_gains,
    root_value,
)
from trace_core.history import HistoryView

# The exact root DP's default resolution: the token budget in this many units (quantum ⌈T/units⌉).
ROOT_DP_UNITS = 4096
# The exact prefix DP's default resolution (its work grows with the square of the units).
PREFIX_DP_UNITS = 512
# A DP of more units than this is refused: the table would not fit in memory.
MAX_DP_UNITS = 1 << 20


# ============================================================================ validation
def _as_tokens(x: object, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int | np.integer):
        raise ValueError(f"{name} must be an integer number of tokens, got {x!r}")
    if int(x) < 0:
        raise ValueError(f"{name} = {int(x)}: a token budget cannot be negative")
    return int(x)


def _as_costs(x: object, name: str, n: int) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.shape != (n,):
        raise ValueError(f"{name} has shape {arr.shape}: it needs one expected cost per entry, shape ({n},)")
    bad = ~np.isfinite(arr) | (arr <= 0.0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}[{i}] = {float(arr[i])!r}: an expected cost in tokens must be finite and > 0")
    return arr


def _as_max_per_prompt(x: object) -> int:
    if isinstance(x, bool) or not isinstance(x, int | np.integer) or int(x) < 2:
        raise ValueError(f"max_per_prompt = {x!r}: it must be an integer >= 2 (a single rollout forms no group)")
    return int(x)


def token_quantum(budget_tokens: int, units: int = ROOT_DP_UNITS) -> int:
    """The default quantum of a DP over ``budget_tokens``: ``max(1, ⌈budget_tokens / units⌉)``
    tokens, so the table has at most ``units + 1`` columns."""
    budget_tokens = _as_tokens(budget_tokens, "budget_tokens")
    if isinstance(units, bool) or not isinstance(units, int | np.integer) or int(units) < 1:
        raise ValueError(f"units = {units!r}: it must be an integer >= 1")
    return max(1, -(-budget_tokens // int(units)))


def _quantise(
    cost: np.ndarray, budget_tokens: int, quantum: int | None, default_units: int
) -> tuple[np.ndarray, int, int]:
    q = token_quantum(budget_tokens, default_units) if quantum is None else quantum
    if isinstance(q, bool) or not isinstance(q, int | np.integer) or int(q) < 1:
        raise ValueError(f"quantum = {quantum!r}: it must be an integer >= 1 token")
    q = int(q)
    U = budget_tokens // q
    if U > MAX_DP_UNITS:
        raise ValueError(f"budget_tokens / quantum = {budget_tokens} / {q} = {U} units exceed the DP's limit of "
                         f"{MAX_DP_UNITS}: pass a larger quantum")
    units = np.ceil(cost / q).astype(np.int64)  # rounded up: the plan's true cost stays within the budget
    return np.maximum(units, 1), U, q


# ============================================================================ roots
def _root_dp(v: np.ndarray, units: np.ndarray, U: int, K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group knapsack over prompts: ``best[b]`` = max Σ V_root with Σ units·m ≤ b (every b ≤ U),
    ``back[i, b]`` the index into ``choices`` of prompt i's count there. Ties keep the smaller count."""
    B = v.shape[0]
    choices = np.array([0, *range(2, K + 1)], dtype=np.int64)
    values = root_value(np.repeat(v[:, None], choices.size, axis=1), np.broadcast_to(choices, (B, choices.size)))
    tol = GAIN_TIE_TOL * max(B, 1)
    best = np.zeros(U + 1)
    back = np.zeros((B, U + 1), dtype=np.int8)
    for i in range(B):
        new = best.copy()
        row = back[i]
        for ci in range(1, choices.size):
            w = int(choices[ci] * units[i])
            if w > U:
                break
            cand = best[: U + 1 - w] + values[i, ci]
            seg, seg_back = new[w:], row[w:]
            better = cand > seg + tol
            seg[better] = cand[better]
            seg_back[better] = ci
        best = new
    return best, back, choices


def _root_backtrack(back: np.ndarray, choices: np.ndarray, units: np.ndarray, b: int) -> np.ndarray:
    m = np.zeros(back.shape[0], dtype=np.int64)
    for i in range(back.shape[0] - 1, -1, -1):
        m[i] = choices[back[i, b]]
        b -= int(m[i] * units[i])
    return m


def allocate_roots_tokens(
    v: object, cost: object, budget_tokens: int, max_per_prompt: int = 16, quantum: int | None = None
) -> np.ndarray:
    """The exact optimum of ``max Σ_i V_root(v_i, m_i)`` s.t. ``Σ_i ⌈c_i/q⌉·q·m_i ≤ T``,
    ``m_i ∈ {0} ∪ {2..max_per_prompt}``: a dynamic programme over the prompts on costs rounded up
    to the quantum ``q`` (default :func:`token_quantum`: ``T`` in ``ROOT_DP_UNITS`` units). It is
    exact for the rounded costs; rounding up keeps the plan's expected cost ``Σ c_i m_i`` within
    ``T``. O(B · M_max · T/q) time, B · T/q bytes. Among optima (within ``GAIN_TIE_TOL``·B) the DP
    keeps, prompt by prompt in index order, the smaller count.

    This is the solver the one-budget rule uses (:func:`plan_token_step`): one table gives the
    optimum at every budget up to ``T`` at once, which the stage-1 reservation reads at each
    candidate share, and at trainer-sized pools (hundreds of prompts, T/q = 4,096) it runs in a
    fraction of a second. :func:`allocate_roots_tokens_greedy` is the alternative for pools where
    the table is too large, with a gap of at most one opening unit."""
    v = as_probabilities(v, "v")
    c = _as_costs(cost, "cost", v.shape[0])
    T = _as_tokens(budget_tokens, "budget_tokens")
    K = _as_max_per_prompt(max_per_prompt)
    units, U, _ = _quantise(c, T, quantum, ROOT_DP_UNITS)
    _, back, choices = _root_dp(v, units, U, K)
    return _root_backtrack(back, choices, units, U)


def allocate_roots_tokens_greedy(v: object, cost: object, budget_tokens: int, max_per_prompt: int = 16) -> np.ndarray:
    """The ratio greedy for the token-priced roots (unrounded costs): each prompt is a chain of
    units — the opening pair ``m = 2`` (gain ``2a``, ``a = v(1−v)``, cost ``2c``), then each further
    rollout (gain :func:`~trace_core.allocation.root_unit_gains`' ``k``-th, cost ``c``) — taken in
    decreasing gain per token (ties: lower prompt index, then the chain's order); a unit whose
    predecessor was not taken, or which does not fit in what is left, is skipped; zero gains are
    never bought.

    **Bound: OPT − greedy ≤ max_i 2a_i ≤ 1/2.** Within a chain the gain per token does not
    increase (``2a/2c = a/c`` for the pair and the third rollout, then less), so every integer
    allocation takes a prefix of each chain, and the fractional knapsack over all units (precedence
    dropped) is a relaxation with value ``LP ≥ OPT``. Its optimum takes units in decreasing ratio
    until the first one that does not fit and a fraction ``θ < 1`` of that critical unit; sorting
    by ratio with chain order on ties never places a unit before its predecessor, so the greedy's
    first stretch takes exactly the relaxation's whole units and later fits only add value:
    ``greedy ≥ LP − θ·g_crit ≥ OPT − max unit gain``. The largest unit is an opening pair, ``2a ≤ 1/2``."""
    v = as_probabilities(v, "v")
    c = _as_costs(cost, "cost", v.shape[0])
    T = _as_tokens(budget_tokens, "budget_tokens")
    K = _as_max_per_prompt(max_per_prompt)
    B = v.shape[0]
    g = root_unit_gains(v, K)
    unit_gain = np.concatenate([g[:, :1] + g[:, 1:2], g[:, 2:]], axis=1)  # (B, K − 1): pair, then rollouts 3..K
    unit_cost = np.concatenate([2.0 * c[:, None], np.repeat(c[:, None], K - 2, axis=1)], axis=1)
    ratio = unit_gain / unit_cost
    prompt = np.repeat(np.arange(B), K - 1)
    unit = np.tile(np.arange(K - 1), B)
    order = np.lexsort((unit, prompt, -ratio.ravel()))
    taken = np.zeros(B, dtype=np.int64)
    left = float(T)
    flat_gain, flat_cost = unit_gain.ravel(), unit_cost.ravel()
    for u in order.tolist():
        if flat_gain[u] <= 0.0:
            break
        i, k = prompt[u], unit[u]
        if taken[i] != k or flat_cost[u] > left * (1.0 + 1e-12):
            continue
        taken[i] += 1
        left -= flat_cost[u]
    return np.where(taken > 0, taken + 1, 0).astype(np.int64)


def root_tokens(cost: object, m: object) -> float:
    """``Σ_i c_i m_i``: the expected generated tokens of a root allocation."""
    m = np.asarray(m)
    return float(np.sum(_as_costs(cost, "cost", m.shape[0]) * m))


# ============================================================================ prefixes
def allocate_prefixes_tokens(
    p: object, r: object, cost: object, budget_tokens: int, quantum: int | None = None
) -> np.ndarray:
    """The exact optimum of ``max Σ_j 1 − q_j^{K_j}`` s.t. ``Σ_j ⌈c_j/q⌉·q·K_j ≤ T_pref``,
    ``K_j ≥ 0`` (``q_j`` :func:`~trace_core.allocation.continuation_keep_probability`): a DP over
    the anchors on costs rounded up to the quantum (default: ``T_pref`` in ``PREFIX_DP_UNITS``
    units), exact for the rounded costs, within ``T_pref`` for the true ones. O(Σ_j (U/u_j) · U)
    time for ``U = T_pref/q`` units; ties keep the smaller ``K_j``. A reference for the greedy
    (:func:`allocate_prefixes_tokens_greedy`), which the one-budget rule uses per prompt."""
    p, r_arr, _ = check_prefix_inputs(p, r, None)
    c = _as_costs(cost, "cost", p.shape[0])
    T = _as_tokens(budget_tokens, "budget_tokens")
    units, U, _ = _quantise(c, T, quantum, PREFIX_DP_UNITS)
    A = p.shape[0]
    keep = continuation_keep_probability(p, r_arr)
    tol = GAIN_TIE_TOL * max(A, 1)
    best = np.zeros(U + 1)
    back = np.zeros((A, U + 1), dtype=np.int64)
    for j in range(A):
        new = best.copy()
        row = back[j]
        for k in range(1, U // int(units[j]) + 1):
            w = k * int(units[j])
            cand = best[: U + 1 - w] + (1.0 - keep[j] ** k)
            seg, seg_back = new[w:], row[w:]
            better = cand > seg + tol
            seg[better] = cand[better]
            seg_back[better] = k
        best = new
    K = np.zeros(A, dtype=np.int64)
    b = U
    for j in range(A - 1, -1, -1):
        K[j] = back[j, b]
        b -= int(K[j] * units[j])
    return K


def _greedy_chains(keep: np.ndarray, cost: np.ndarray, turn: np.ndarray, budget: float) -> tuple[np.ndarray, float]:
    """Geometric chains (the k-th unit of chain j gains ``keep_j^{k−1}(1 − keep_j)`` at cost
    ``cost_j``) bought in decreasing gain per token within ``budget``. Ties: fewer units already
    placed on the chain, then the earlier ``turn``, then the lower index. A chain whose next unit
    does not fit is dropped (its later units cost the same); zero gains are never bought.
    Returns the units per chain and the tokens spent."""
    n = keep.shape[0]
    K = np.zeros(n, dtype=np.int64)
    heap = [(-(1.0 - keep[j]) / cost[j], 0, int(turn[j]), j) for j in range(n)]
    heapq.heapify(heap)
    left = float(budget)
    while heap:
        neg_ratio, k, tj, j = heapq.heappop(heap)
        if neg_ratio >= 0.0:
            break
        if cost[j] > left * (1.0 + 1e-12):
            continue
        K[j] += 1
        left -= cost[j]
        heapq.heappush(heap, (-(keep[j] ** (k + 1) * (1.0 - keep[j])) / cost[j], k + 1, tj, j))
    return K, float(float(budget) - left)


def allocate_prefixes_tokens_greedy(
    p: object, r: object, cost: object, budget_tokens: float, turn: object | None = None
) -> np.ndarray:
    """The ratio greedy for the token-priced prefixes: the next continuation always goes where it
    gains most per expected token, ``q_j^{K_j}(1 − q_j) / c_j`` (ties: fewer continuations already
    at the anchor, the earlier ``turn``, the lower index); an anchor whose next continuation does
    not fit what is left is passed over; zero gains are never bought. ``budget_tokens`` may be
    fractional (an allowance of expected tokens).

    **Bound: OPT − greedy ≤ max_j (1 − q_j) ≤ 1.** Each anchor's unit gains ``q^{k−1}(1 − q)``
    fall with k at a fixed cost, so its gain per token falls along its chain; the argument of
    :func:`allocate_roots_tokens_greedy` (the fractional knapsack over all units is a relaxation
    whose optimum the greedy matches up to a fraction of one critical unit) bounds the gap by the
    largest unit gain, an anchor's first continuation."""
    p, r_arr, t = check_prefix_inputs(p, r, turn)
    c = _as_costs(cost, "cost", p.shape[0])
    budget = float(budget_tokens)
    if not (np.isfinite(budget) and budget >= 0.0):
        raise ValueError(f"budget_tokens = {budget_tokens!r}: a token budget must be finite and >= 0")
    return _greedy_chains(continuation_keep_probability(p, r_arr), c, t, budget)[0]


# ============================================================================ the one-budget rule, stage 1
def expected_prefix_unit_gains(v: object, units: int) -> np.ndarray:
    """float64 (B, units): stage 1's expected gain of the k-th continuation at an anchor of a prompt
    rated ``v`` before the anchor exists — the anchor's prediction taken as ``p ≈ v`` and the bare
    outcome through it as ``r ~ Bernoulli(v)``: ``E_r[q^{k−1}(1 − q)] = v(1−v)(v^{k−1} + (1−v)^{k−1})``."""
    v = as_probabilities(v, "v")
    k = np.arange(1, int(units) + 1, dtype=np.float64)[None, :]
    a = (v * (1.0 - v))[:, None]
    return a * (np.power(v[:, None], k - 1) + np.power(1.0 - v[:, None], k - 1))


def model_prefix_value(v: object, anchors: object, continuations: object, units: int = 32) -> np.ndarray:
    """float64 (B,): stage 1's model of what ``continuations`` continuations, spread over ``anchors``
    anchors of a prompt rated ``v``, are worth (uncalibrated): every anchor's first continuation,
    then every anchor's second, … (the best spread, the gains falling with k) over the first
    ``units`` per anchor. The one-budget rule's calibration compares it with the realised count of
    mixed branch groups (:class:`PrefixCalibration`)."""
    v = as_probabilities(v, "v")
    A = np.asarray(anchors, dtype=np.float64)
    n = np.asarray(continuations, dtype=np.float64)
    if A.shape != v.shape or n.shape != v.shape or np.any(A < 0) or np.any(n < 0):
        raise ValueError("anchors and continuations must be non-negative, one per prompt")
    g = expected_prefix_unit_gains(v, units)
    level = np.arange(units, dtype=np.float64)[None, :]
    at_level = np.clip(n[:, None] - level * A[:, None], 0.0, A[:, None])
    return np.sum(at_level * g, axis=1)


def _plan_prefix_value(
    v: np.ndarray, anchors: np.ndarray, anchor_cost: np.ndarray, budget: float, rho: float, units: int
) -> tuple[float, np.ndarray]:
    """The fractional greedy of stage 1's prediction: classes (prompt i, k-th continuation) of
    ``anchors_i`` copies each, gain ``ρ·`` :func:`expected_prefix_unit_gains`, cost ``anchor_cost_i``
    each, in decreasing gain per token, the last class taken in part. Returns the value and the
    tokens it puts on each prompt."""
    B = v.shape[0]
    tokens = np.zeros(B)
    live = np.flatnonzero(anchors > 0)
    if live.size == 0 or budget <= 0.0 or rho <= 0.0:
        return 0.0, tokens
    g = rho * expected_prefix_unit_gains(v[live], units)  # (L, units)
    ratio = g / anchor_cost[live, None]
    rows = np.repeat(np.arange(live.size), units)
    cols = np.tile(np.arange(units), live.size)
    flat_ratio = ratio.ravel()
    order = np.lexsort((cols, rows, -flat_ratio))
    order = order[flat_ratio[order] > 0.0]
    count = anchors[live][rows[order]]
    cost = count * anchor_cost[live][rows[order]]
    cum = np.cumsum(cost)
    full = int(np.searchsorted(cum, budget, side="right"))  # classes that fit whole
    take = np.zeros(order.size)
    take[:full] = 1.0
    if full < order.size:
        before = cum[full - 1] if full else 0.0
        take[full] = (budget - before) / cost[full]
    value = float(np.sum(take * count * g.ravel()[order]))
    np.add.at(tokens, live[rows[order]], take * cost)
    return value, tokens


@dataclass(frozen=True)
class TokenPlan:
    """Stage 1 of the one-budget rule (:func:`plan_token_step`)."""

    m: np.ndarray  # int64 (B,): bare rollouts per candidate
    reserved: np.ndarray  # int64 (B,): expected tokens reserved for each prompt's stage 2
    reservation_share: float  # the chosen R/T of the grid (R: the budget kept from the root solver)
    budget_tokens: int  # T
    root_tokens: float  # Σ c_i m_i: the roots' expected tokens
    root_value: float  # Σ V_root(v_i, m_i)
    prefix_value: float  # the predicted (calibrated) value of the reserved tokens
    candidates: tuple[tuple[float, float, float], ...]  # per grid share: (share, root value, prefix value)

    @property
    def unreserved(self) -> float:
        """Expected tokens of ``T`` that neither the roots nor a reservation plan to spend."""
        return float(self.budget_tokens - self.root_tokens - int(self.reserved.sum()))


def plan_token_step(
    v: object, root_cost: object, turns: object, anchor_fraction: object, budget_tokens: int, rho: float = 1.0,
    max_per_prompt: int = 16, config: OneBudgetConfig | None = None,
) -> TokenPlan:
    """Stage 1 of ``trace-tokens``: the step's roots and each prompt's reservation for stage 2,
    decided before any anchor exists.

    For each share ``s`` of :attr:`OneBudgetConfig.reservation_grid`, the roots get ``T − ⌊sT⌋``
    tokens by the exact solver (:func:`allocate_roots_tokens`, one DP table read at every share),
    and everything they leave, ``T − Σ c_i m_i``, is predicted to buy continuations at the chosen
    prompts' expected anchors: prompt ``i`` has ``m_i·(turns_i − 1)`` of them, each continuation
    costs ``anchor_fraction_i · c_i`` (an anchor of unknown depth:
    :func:`~trace_core.costs.expected_anchor_fraction`) and its k-th gains
    ``ρ·v(1−v)(v^{k−1} + (1−v)^{k−1})`` (:func:`expected_prefix_unit_gains`; the first
    ``plan_units_per_anchor`` counted), bought by the fractional greedy in decreasing gain per
    token. ``ρ`` (``rho``, :class:`PrefixCalibration`) is the run's realised over predicted prefix
    value so far: the model takes an anchor's prediction for the prompt's and its bare outcome as
    independent of it, where a real anchor late in a path is mostly decided, and ``ρ`` scales the
    prediction to what the run finds. The share with the largest root value + predicted prefix
    value wins (ties: the smaller share); each prompt's reservation is what that prediction spends
    on it (floored to whole tokens). With ``ρ = 0`` nothing is reserved."""
    config = config or OneBudgetConfig()
    v = as_probabilities(v, "v")
    B = v.shape[0]
    c = _as_costs(root_cost, "root_cost", B)
    n_turns = _as_costs(turns, "turns", B)
    frac = _as_costs(anchor_fraction, "anchor_fraction", B)
    T = _as_tokens(budget_tokens, "budget_tokens")
    K = _as_max_per_prompt(max_per_prompt)
    rho = float(rho)
    if not (np.isfinite(rho) and 0.0 <= rho <= 1.0):
        raise ValueError(f"rho = {rho}: the prefix calibration must lie in [0, 1]")
    units, U, q = _quantise(c, T, None, config.root_dp_units)
    best, back, choices = _root_dp(v, units, U, K)
    chosen = None
    candidates = []
    for share in sorted(config.reservation_grid):
        b = (T - int(np.floor(share * T))) // q
        m = _root_backtrack(back, choices, units, b)
        spent = float(np.sum(c * m))
        anchors = m * np.maximum(n_turns - 1.0, 0.0)
        pv, tokens = _plan_prefix_value(v, anchors, frac * c, T - spent, rho, config.plan_units_per_anchor)
        rv = float(best[b])
        candidates.append((float(share), rv, pv))
        if chosen is None or rv + pv > chosen[1] + chosen[2] + GAIN_TIE_TOL * max(B, 1):
            chosen = (float(share), rv, pv, m, spent, tokens)
    share, rv, pv, m, spent, tokens = chosen
    reserved = np.floor(tokens + 1e-9).astype(np.int64)
    return TokenPlan(m=m, reserved=reserved, reservation_share=share, budget_tokens=T, root_tokens=spent,
                     root_value=rv, prefix_value=pv, candidates=tuple(candidates))


@dataclass(frozen=True)
class PrefixCalibration:
    """The one-budget rule's calibration state: over the run so far, the stage-1 model's predicted
    prefix value of the continuations that were run (:func:`model_prefix_value`) and the realised
    count of expanded anchors whose branch group showed both outcomes. ``rho`` — their ratio,
    clipped to [0, 1], 1 before anything was predicted — scales stage 1's prediction. Immutable;
    the trainer checkpoints :meth:`to_dict`."""

    predicted: float = 0.0
    realised: float = 0.0

    def __post_init__(self) -> None:
        for name in ("predicted", "realised"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} = {value}: a sum of expected groups must be finite and >= 0")

    @property
    def rho(self) -> float:
        return 1.0 if self.predicted <= 0.0 else float(np.clip(self.realised / self.predicted, 0.0, 1.0))

    def observe(self, predicted: float, realised: float) -> PrefixCalibration:
        """The state after a step whose continuations the model valued at ``predicted`` and which
        gave ``realised`` mixed branch groups."""
        return PrefixCalibration(self.predicted + float(predicted), self.realised + float(realised))

    def to_dict(self) -> dict[str, Any]:
        return {"predicted": self.predicted, "realised": self.realised}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrefixCalibration:
        return cls(float(data["predicted"]), float(data["realised"]))


# ============================================================================ the one-budget rule, stage 2
@dataclass(frozen=True)
class PromptSpend:
    """Stage 2 of the one-budget rule for one prompt (:func:`spend_prompt_tokens`)."""

    K: np.ndarray  # int64 (A,): continuations per anchor
    extra_roots: int  # further root rollouts of the prompt
    tokens: float  # their expected generated tokens (at most the allowance)
    value: float  # their expected gain: Σ_j V_pref(j, K_j) + the extra roots' chance to mix the group


def spend_prompt_tokens(
    p: object, r: object, turn: object, anchor_cost: object, bare_rewards: object, root_p: float,
    root_cost: float, allowance: float,
) -> PromptSpend:
    """Stage 2 of ``trace-tokens`` for one prompt whose bare rollouts have finished: spend its
    ``allowance`` (its reservation plus what its roots cost less than planned — the realised
    leftover, which the caller passes in; a negative allowance is spent as 0) one unit at a time on
    the larger expected gain per expected token among

    - the next continuation at anchor ``j`` (``p``: the predictor at the anchor, ``r``: the bare
      outcome through it, ``turn``: its depth, ``anchor_cost``: its expected remaining tokens): gain
      ``q_j^{K_j}(1 − q_j)`` with ``q_j = r_j p_j + (1 − r_j)(1 − p_j)``;
    - one more root rollout of the prompt (``root_p``: the prediction at the root, ``root_cost``: a
      root rollout's expected tokens): gain 0 if ``bare_rewards`` already hold both outcomes, else
      the predicted chance that it, and none of the extra ones before it, has the other outcome —
      ``(1 − P)^e·P`` for the ``e+1``-th, ``P = 1 − root_p`` after all successes, ``root_p`` after all
      failures: the root as a depth-0 anchor.

    By :func:`allocate_prefixes_tokens_greedy`'s argument the result is within one first unit's
    gain (≤ 1) of the best spend of the allowance. A prompt without anchors spends on root
    rollouts only. Returns the continuations per anchor and the extra root rollouts."""
    p_arr, r_arr, t = check_prefix_inputs(p, r, turn)
    A = p_arr.shape[0]
    c = _as_costs(anchor_cost, "anchor_cost", A)
    bare = np.asarray(bare_rewards, dtype=np.float64)
    if bare.ndim != 1 or bare.size == 0 or np.any(~np.isin(bare, (0.0, 1.0))):
        raise ValueError("bare_rewards must hold the prompt's bare outcomes, each 0 or 1, at least one")
    root_p = float(as_probabilities([root_p], "root_p")[0])
    root_cost_arr = _as_costs([root_cost], "root_cost", 1)
    allowance = float(allowance)
    if not np.isfinite(allowance):
        raise ValueError(f"allowance = {allowance!r}: it must be finite")
    mixed = bool(bare.min() != bare.max())
    keep = continuation_keep_probability(p_arr, r_arr)
    root_keep = 1.0 if mixed else float(continuation_keep_probability(np.array([root_p]), bare[:1])[0])
    chains_keep = np.concatenate([keep, [root_keep]])
    chains_cost = np.concatenate([c, root_cost_arr])
    chains_turn = np.concatenate([t.astype(np.int64), [0]])
    units, spent = _greedy_chains(chains_keep, chains_cost, chains_turn, max(allowance, 0.0))
    K, extra = units[:A], int(units[A])
    value = float(np.sum(1.0 - np.power(keep, K)) + (1.0 - root_keep**extra))
    return PromptSpend(K=K, extra_roots=extra, tokens=spent, value=value)


# ============================================================================ uniform methods
def uniform_groups_for_tokens(
    cost: object, budget_tokens: int, group_size: int, order: object | None = None
) -> int:
    """How many groups of ``group_size`` rollouts a uniform method (GRPO, PCL) buys with
    ``budget_tokens`` at the expected costs ``cost`` (per rollout of each candidate): the most
    groups, taken in ``order`` (the candidates in the order the method picks them), whose expected
    tokens ``Σ G·c`` stay within the budget. ``order`` None: a method that picks at random, every
    group priced at the pool's mean ``G·mean(c)``."""
    T = _as_tokens(budget_tokens, "budget_tokens")
    c = np.asarray(cost, dtype=np.float64)
    if c.ndim != 1 or c.size == 0:
        raise ValueError(f"cost has shape {c.shape}: it needs one expected cost per candidate, at least one")
    c = _as_costs(c, "cost", c.shape[0])
    if isinstance(group_size, bool) or not isinstance(group_size, int | np.integer) or int(group_size) < 2:
        raise ValueError(f"group_size = {group_size!r}: a group needs >= 2 rollouts")
    G = int(group_size)
    if order is None:
        price = G * float(c.mean())
        return min(int(np.floor(T / price + 1e-12)), c.shape[0])
    idx = np.asarray(order, dtype=np.int64)
    if idx.ndim != 1 or np.unique(idx).size != idx.size or np.any((idx < 0) | (idx >= c.shape[0])):
        raise ValueError("order must list distinct candidate indices")
    cum = np.cumsum(G * c[idx])
    return int(np.searchsorted(cum, T * (1.0 + 1e-12), side="right"))


def uniform_spec_for_tokens(spec: BudgetSpec, cost: object) -> BudgetSpec:
    """The trajectory budget under which a uniform method without expansion spends
    ``spec.tokens_per_step`` at the expected costs: ``n`` groups of ``G``
    (:func:`uniform_groups_for_tokens`, random order) as ``roots_M = n·G``, ``expansion_N = 0``.
    ValueError when the budget buys no group."""
    if spec.tokens_per_step is None:
        raise ValueError("spec.tokens_per_step is None: this budget is counted in trajectories")
    n = uniform_groups_for_tokens(cost, spec.tokens_per_step, spec.group_size_G)
    if n < 1:
        raise ValueError(f"tokens_per_step = {spec.tokens_per_step} buys no group of {spec.group_size_G} rollouts "
                         f"at {float(np.mean(cost)):.1f} expected tokens a rollout")
    return replace(spec, roots_M=n * spec.group_size_G, expansion_N=0, tokens_per_step=None)


# ============================================================================ the one-budget rule as a method's rule
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
            if as_int(getattr(self, name), name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)}: it must be >= 1")


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


TOKEN_PRICED = ("this method prices its rollouts in generated tokens: plan it with its token_rule (plan, then "
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
        raise ValueError(TOKEN_PRICED)


def prefixes_token_priced(anchors: AnchorSignals, budget: int, rng: np.random.Generator) -> np.ndarray:
    """The trajectory prefix slot of a method priced in tokens: it refuses (see :class:`TokenPricedRoots`)."""
    raise ValueError(TOKEN_PRICED)
