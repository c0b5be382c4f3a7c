"""VIP (arXiv 2602.01601, ICLR 2026): variance-informed rollout allocation over an incumbent batch.

VIP predicts each prompt's success probability ``p`` before sampling with a light Gaussian
process over recent rollout outcomes, turns it into the prompt's share of the policy gradient's
variance, and splits the step's rollout budget across the prompts of the batch to minimise the
batch's total gradient variance. The three parts here (method §4 "VIP"):

1. **The success model** (:func:`vip_predict`): a GP on the latent logit of each prompt's
   success rate, observed as the logit of the prompt's newest empirical success rate (clipped
   away from 0 and 1), with a constant prior mean, an RBF kernel whose bandwidth is the median
   pairwise distance (the median heuristic), a small jitter on the observations, and the sigmoid
   of the posterior mean as ``p``. Pure numpy: :func:`gp_posterior` (mean and variance),
   :func:`rbf_kernel`, :func:`median_length_scale`.

   *The substitution.* VIP's kernel compares prompts by a sentence embedding of their text
   (MiniLM). A root rule sees no text: per candidate it has the success predictor's score ``v``
   and the prompt's own :class:`~trace_core.history.HistoryView`. So the kernel's input is ``v``
   (the predictor reads the prompt's tokens; its score is the one learned summary of the prompt
   we have), and, because a 1-D score calls many distinct prompts identical where an embedding
   would not, the kernel is ``ρ · RBF(v) + (1 − ρ) · [same prompt]``: the second part is each
   prompt's own component, so that a prompt's own outcome sets its prediction (as an embedding's
   distinctness does in VIP) while ``ρ`` of it is shared with prompts of a similar score.

2. **The variance objective** (:func:`vip_objective`). With ``m`` rollouts of a prompt of
   success probability ``p``, the paper's per-prompt gradient variance is
   ``4σ²·p(1 − p)·(m − 1)/m²`` for Dr.GRPO and ``4σ²·p(1 − p)/(m − 1)`` for RLOO, σ² a projected
   gradient variance assumed equal across prompts (so it drops out). Minimise
   ``Σ_i a_i f(m_i)``, ``a_i = p_i(1 − p_i)``, over the batch.

3. **The allocation** (:func:`allocate_vip`): ``Σ m_i = budget``, ``L ≤ m_i ≤ U`` for every
   prompt of the batch. The paper solves the continuous relaxation by bisection on the Lagrange
   multiplier and rounds greedily; so do we (:func:`relaxed_allocation`,
   :func:`round_allocation`), and our rounding ends with an exchange search so that the integer
   allocation is the exact integer optimum (checked against brute force and the dynamic
   programme :func:`allocate_vip_dp`).

**Our budget rules** (method §2: ``m ∈ {0} ∪ {2..M_max}``, ``Σ m = M(1+N)`` for a method that does
not expand). VIP does not choose prompts: it allocates over "the incumbent batch". We draw that
batch as GRPO draws its prompts — ``M(1+N)/G`` uniformly random candidates — and give it GRPO's
budget ``M(1+N)`` (the paper's ``G × Q`` setting); candidates outside the batch get 0, every batch
prompt at least ``L = 2`` (a variance objective cannot price a skipped prompt: skipping removes
its variance, so the minimiser would drop the most informative prompts first) and at most
``U = M_max``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from trace_core.history import HistoryView, draw_batch

if TYPE_CHECKING:  # only for annotations: the registry in trace_core.allocation imports this module
    from trace_core.allocation import BudgetSpec

VARIANCE_FORMS = ("dr_grpo", "rloo")
# Slope of Dr.GRPO's convex envelope on [2, 4]: (f(4) − f(2)) / 2 with f(m) = (m − 1)/m².
_DRGRPO_CHORD = -1.0 / 32.0
# Floor on a = p(1 − p): every prompt's marginal gain stays positive, so the relaxation is well posed.
_MIN_A = 1e-12


# ============================================================================ configuration
@dataclass(frozen=True)
class VipConfig:
    """VIP's knobs. Defaults are the paper's where it gives one and its authors' public training
    code where only the code does; ``shared_fraction`` is ours (the embedding substitution)."""

    # Which estimator's gradient variance is minimised: "dr_grpo", f(m) = (m − 1)/m² (our advantage is
    # group-mean centred, as Dr.GRPO's), or "rloo", f(m) = 1/(m − 1). The paper derives both.
    variance_form: str = "dr_grpo"
    # L: fewest rollouts a batch prompt gets (our smallest group; every batch prompt is trained).
    min_rollouts: int = 2
    # U: most rollouts one prompt gets; None takes the budget's M_max (BudgetSpec.max_per_prompt).
    max_rollouts: int | None = None
    # GP prior mean of the latent logit success rate, for a prompt with no observation nearby
    # (the authors' training code: -5, i.e. p ≈ 0.007 — an unseen prompt is assumed hard).
    prior_logit: float = -5.0
    # RBF bandwidth on the kernel's input; None: the median heuristic (median pairwise distance over the pool).
    length_scale: float | None = None
    # ρ: share of the kernel that compares prompts by their predictor score; 1 − ρ is each prompt's own part.
    shared_fraction: float = 0.5
    # Jitter (observation noise variance) on the latent observations, as in the authors' code.
    jitter: float = 1e-4
    # Empirical success rates are clipped to [clip, 1 − clip] before the logit (the authors' 1e-6).
    clip: float = 1e-6
    # Newest outcome used at any age (None: the authors' recursive mean keeps a prompt's last observation
    # until a newer one replaces it); an integer k uses only outcomes at most k steps old.
    max_age: int | None = None

    def __post_init__(self) -> None:
        if self.variance_form not in VARIANCE_FORMS:
            raise ValueError(f"variance_form = {self.variance_form!r}: expected one of {VARIANCE_FORMS}")
        if int(self.min_rollouts) != self.min_rollouts or self.min_rollouts < 2:
            raise ValueError(f"min_rollouts = {self.min_rollouts}: it must be an integer >= 2 (a group needs 2)")
        if self.max_rollouts is not None and (int(self.max_rollouts) != self.max_rollouts
                                              or self.max_rollouts < self.min_rollouts):
            raise ValueError(f"max_rollouts = {self.max_rollouts}: it must be an integer >= min_rollouts")
        if not np.isfinite(self.prior_logit):
            raise ValueError(f"prior_logit = {self.prior_logit}: it must be finite")
        if self.length_scale is not None and not (np.isfinite(self.length_scale) and self.length_scale > 0):
            raise ValueError(f"length_scale = {self.length_scale}: it must be finite and > 0 (or None)")
        if not 0.0 <= self.shared_fraction < 1.0:
            raise ValueError(f"shared_fraction = {self.shared_fraction}: it must lie in [0, 1)")
        if not (np.isfinite(self.jitter) and self.jitter > 0):
            raise ValueError(f"jitter = {self.jitter}: it must be finite and > 0")
        if not 0.0 < self.clip < 0.5:
            raise ValueError(f"clip = {self.clip}: it must lie in (0, 0.5)")
        if self.max_age is not None and (int(self.max_age) != self.max_age or self.max_age < 1):
            raise ValueError(f"max_age = {self.max_age}: it must be an integer >= 1 (or None)")


# ============================================================================ the Gaussian process
def _as_features(x: object) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or not np.all(np.isfinite(arr)):
        raise ValueError(f"features must be a finite (n,) or (n, d) array, got shape {arr.shape}")
    return arr


def rbf_kernel(x1: object, x2: object, length_scale: float) -> np.ndarray:
    """``exp(−‖x1_i − x2_j‖² / (2ℓ²))``, shape ``(n1, n2)``; features are ``(n,)`` or ``(n, d)``."""
    a, b = _as_features(x1), _as_features(x2)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"feature dimensions differ: {a.shape[1]} and {b.shape[1]}")
    if not (np.isfinite(length_scale) and length_scale > 0):
        raise ValueError(f"length_scale = {length_scale}: it must be finite and > 0")
    sq = np.sum((a[:, None, :] - b[None, :, :]) ** 2, axis=2)
    return np.exp(-0.5 * sq / float(length_scale) ** 2)


def median_length_scale(x: object) -> float:
    """The median heuristic: the median Euclidean distance over distinct pairs of points, or 1.0
    when it is 0 (fewer than two points, or most points coincide)."""
    a = _as_features(x)
    if a.shape[0] < 2:
        return 1.0
    i, j = np.triu_indices(a.shape[0], k=1)
    med = float(np.median(np.sqrt(np.sum((a[i] - a[j]) ** 2, axis=1))))
    return med if med > 0 else 1.0


def gp_posterior(
    k_train: object, k_cross: object, k_test_diag: object, y: object, prior_train: object,
    prior_test: object, noise: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and variance of a GP at test points given noisy observations ``y``:

        mean = m_* + K_*ᵀ (K + σ² I)⁻¹ (y − m),      var = k_** − diag(K_*ᵀ (K + σ² I)⁻¹ K_*),

    with ``K = k_train`` (n, n) over the observed points, ``K_* = k_cross`` (n, t) between observed
    and test points, ``k_** = k_test_diag`` (t,), prior means ``m = prior_train`` (n,) and
    ``m_* = prior_test`` (t,), noise variance ``σ² = noise``: one linear solve of ``K + σ² I``
    against ``[y − m, K_*]``. With no observation (n = 0) the posterior is the prior. Variances
    are floored at 0 against rounding."""
    K = np.asarray(k_train, dtype=np.float64)
    Ks = np.asarray(k_cross, dtype=np.float64)
    kss = np.asarray(k_test_diag, dtype=np.float64)
    yv = np.asarray(y, dtype=np.float64)
    m = np.asarray(prior_train, dtype=np.float64)
    ms = np.asarray(prior_test, dtype=np.float64)
    n, t = yv.shape[0], kss.shape[0]
    if K.shape != (n, n) or Ks.shape != (n, t) or m.shape != (n,) or ms.shape != (t,):
        raise ValueError(f"shapes disagree: k_train {K.shape}, k_cross {Ks.shape}, k_test_diag {kss.shape}, "
                         f"y {yv.shape}, prior_train {m.shape}, prior_test {ms.shape}")
    if not (np.isfinite(noise) and noise > 0):
        raise ValueError(f"noise = {noise}: it must be finite and > 0")
    if n == 0:
        return ms.copy(), kss.copy()
    sol = np.linalg.solve(K + noise * np.eye(n), np.column_stack([yv - m, Ks]))  # (n, 1 + t)
    mean = ms + Ks.T @ sol[:, 0]
    var = np.maximum(kss - np.sum(Ks * sol[:, 1:], axis=0), 0.0)
    return mean, var


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p) - np.log1p(-p)


def _sigmoid(f: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(f))  # no overflow, and full relative precision near p = 0
    return np.where(f >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@dataclass(frozen=True)
class VipPrediction:
    """The GP's view of every candidate."""

    success: np.ndarray  # p̂ = sigmoid(posterior mean): the success probability VIP allocates with
    mean: np.ndarray  # posterior mean of the latent logit success rate
    variance: np.ndarray  # posterior variance of the latent logit (reported; VIP allocates on the mean)
    observed: np.ndarray  # bool: which of them had an outcome the GP was fitted on
    length_scale: float  # the RBF bandwidth used


def vip_kernel(x: object, length_scale: float, shared_fraction: float) -> np.ndarray:
    """``ρ · RBF(x_i, x_j) + (1 − ρ) · [i = j]`` over one set of candidates (module docstring)."""
    k = shared_fraction * rbf_kernel(x, x, length_scale)
    k[np.diag_indices_from(k)] += 1.0 - shared_fraction
    return k


def vip_observations(history: HistoryView, config: VipConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(observed, y)``: which candidates have an outcome the GP uses — their newest bare root
    group, of any age unless ``config.max_age`` — and its latent value ``logit(clip(S/(S+F)))``
    (0 where unobserved)."""
    newest_ok = history.valid[:, 0]
    if config.max_age is not None:
        newest_ok = newest_ok & (history.step - history.event_step[:, 0] <= config.max_age)
    n = history.successes[:, 0] + history.failures[:, 0]
    observed = newest_ok & (n > 0)
    rate = np.where(observed, history.successes[:, 0] / np.where(n > 0, n, 1.0), 0.5)
    y = np.where(observed, _logit(np.clip(rate, config.clip, 1.0 - config.clip)), 0.0)
    return observed, y


def vip_predict(
    v: object, history: HistoryView, config: VipConfig = VipConfig(), at: np.ndarray | None = None
) -> VipPrediction:
    """VIP's success model on a candidate pool: the GP of the module docstring, fitted on the
    candidates with an outcome (:func:`vip_observations`), its input the predictor score ``v``,
    predicted at the candidates ``at`` (indices; None: every candidate), in that order. The
    bandwidth's median heuristic runs over the whole pool either way."""
    x = np.asarray(v, dtype=np.float64)
    if x.ndim != 1 or len(history) != x.shape[0]:
        raise ValueError(f"v has shape {x.shape} but the history has {len(history)} rows: one per candidate")
    if np.any(~np.isfinite(x) | (x < 0) | (x > 1)):
        raise ValueError("v must hold probabilities in [0, 1] (NaN is not allowed)")
    idx = np.arange(x.shape[0]) if at is None else np.asarray(at, dtype=np.int64)
    ell = config.length_scale if config.length_scale is not None else median_length_scale(x)
    observed, y = vip_observations(history, config)
    obs = np.flatnonzero(observed)
    rho = config.shared_fraction
    k_obs = vip_kernel(x[obs], ell, rho)
    k_cross = rho * rbf_kernel(x[obs], x[idx], ell) + (1.0 - rho) * (obs[:, None] == idx[None, :])
    prior = config.prior_logit
    mean, var = gp_posterior(k_obs, k_cross, np.ones(idx.size), y[obs], np.full(obs.size, prior),
                             np.full(idx.size, prior), config.jitter)
    return VipPrediction(_sigmoid(mean), mean, var, observed[idx], float(ell))


# ============================================================================ the variance objective
def _check_form(form: str) -> None:
    if form not in VARIANCE_FORMS:
        raise ValueError(f"variance form {form!r}: expected one of {VARIANCE_FORMS}")


def variance_factor(m: object, form: str = "dr_grpo") -> np.ndarray:
    """The paper's variance factor of ``m ≥ 2`` rollouts: ``(m − 1)/m²`` (Dr.GRPO) or ``1/(m − 1)``
    (RLOO); a prompt's gradient variance is ``4σ² · p(1 − p) · f(m)``."""
    _check_form(form)
    m = np.asarray(m, dtype=np.float64)
    if np.any(m < 2):
        raise ValueError("the variance factor is defined for m >= 2 rollouts")
    return (m - 1.0) / (m * m) if form == "dr_grpo" else 1.0 / (m - 1.0)


def vip_objective(a: object, m: object, form: str = "dr_grpo") -> float:
    """``Σ_i a_i f(m_i)`` over the prompts with ``m_i > 0`` (the batch): the batch's gradient
    variance up to the common factor ``4σ²``; ``a_i = p_i(1 − p_i)``."""
    a = np.asarray(a, dtype=np.float64)
    m = np.asarray(m)
    if a.shape != m.shape:
        raise ValueError(f"a {a.shape} and m {m.shape} must have one shape")
    batch = m > 0
    return float(np.sum(a[batch] * variance_factor(m[batch], form)))


def _check_allocation_inputs(a: object, budget: int, lower: int, upper: int, form: str) -> np.ndarray:
    _check_form(form)
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim != 1 or np.any(~np.isfinite(arr) | (arr < 0) | (arr > 0.25)):
        raise ValueError("a must be a 1-D array of p(1 − p) values in [0, 1/4]")
    for name, x in (("budget", budget), ("lower", lower), ("upper", upper)):
        if isinstance(x, bool) or not isinstance(x, int | np.integer):
            raise ValueError(f"{name} must be an integer, got {x!r}")
    if lower < 2 or upper < lower:
        raise ValueError(f"bounds [{lower}, {upper}]: need 2 <= lower <= upper")
    Q = arr.shape[0]
    if not Q * lower <= budget <= Q * upper:
        raise ValueError(f"budget = {budget} cannot be split over {Q} prompts with {lower} <= m_i <= {upper} "
                         f"(it must lie in [{Q * lower}, {Q * upper}])")
    return np.maximum(arr, _MIN_A)


# ============================================================================ the continuous relaxation
def _marginal(m: np.ndarray, form: str) -> np.ndarray:
    """``−f'(m)``: (m − 2)/m³ for Dr.GRPO, 1/(m − 1)² for RLOO."""
    return (m - 2.0) / m**3 if form == "dr_grpo" else 1.0 / (m - 1.0) ** 2


def _relaxed_counts(a: np.ndarray, lam: float, lower: int, upper: int, form: str) -> np.ndarray:
    """Per-prompt minimiser of ``a f̃(m) + λ m`` over real ``m ∈ [lower, upper]``, ``f̃`` the convex
    envelope of ``f`` there (``f`` itself for RLOO, and for Dr.GRPO above m = 3; Dr.GRPO's ``f``
    is concave on [2, 3], and its envelope from m = 2 is the chord to the tangent point m = 4,
    of slope −1/32). Where the minimiser is an interval (λ on a chord), its upper end."""
    lo, hi = float(lower), float(upper)
    if form == "rloo":
        m = 1.0 + np.sqrt(a / lam) if lam > 0 else np.full(a.shape, hi)
        return np.clip(m, lo, hi)
    start = lo
    m = np.empty_like(a)
    if lower == 2:  # the chord from 2 to t = min(4, upper)
        t = min(4.0, hi)
        slope = _DRGRPO_CHORD if upper >= 4 else (float(variance_factor(t)) - 0.25) / (t - 2.0)
        on_chord = lam > -a * slope  # the chord's marginal a/32 is below λ: stay at 2
        m[on_chord] = lo
        start = t
        rest = ~on_chord
    else:
        rest = np.ones(a.shape, dtype=bool)
    if rest.any():
        # On [start, upper] (convex: start >= 3) the marginal a(m − 2)/m³ decreases; a(m − 2)/m³ = λ is the
        # cubic r·m³ − m + 2 = 0 (r = λ/a ≤ 1/27), whose largest root is the trigonometric one below.
        r = lam / a[rest]
        with np.errstate(divide="ignore", invalid="ignore"):
            root = 2.0 / np.sqrt(3.0 * r) * np.cos(np.arccos(np.clip(-3.0 * np.sqrt(3.0 * r), -1.0, 1.0)) / 3.0)
        m[rest] = np.where(r >= _marginal(np.float64(start), form), start,
                           np.where(r <= _marginal(np.float64(hi), form), hi, np.clip(root, start, hi)))
    return m


def relaxed_allocation(a: object, budget: int, lower: int, upper: int, form: str = "dr_grpo") -> np.ndarray:
    """The paper's continuous relaxation: ``min Σ a_i f̃(m_i)`` s.t. ``Σ m_i = budget``,
    ``lower ≤ m_i ≤ upper`` real (``f̃``: :func:`_relaxed_counts`). KKT: each ``m_i`` minimises
    ``a_i f̃(m) + λ m`` for one multiplier λ; ``Σ m_i(λ)`` does not increase with λ, so λ is
    found by bisection, and where the sum jumps (a prompt on a chord, or a tie) the two
    bracketing solutions are mixed to spend the budget exactly. Returns float counts."""
    a = _check_allocation_inputs(a, budget, lower, upper, form)
    if a.size == 0 or lower == upper:
        return np.full(a.size, float(lower))
    lam_lo, lam_hi = 0.0, float(np.max(a)) * 2.0  # λ ≥ max a·(largest marginal ≤ 1): every prompt at `lower`
    m_hi = _relaxed_counts(a, lam_hi, lower, upper, form)
    m_lo = _relaxed_counts(a, lam_lo, lower, upper, form)
    for _ in range(200):
        if lam_hi - lam_lo <= 1e-15 * lam_hi:
            break
        mid = 0.5 * (lam_lo + lam_hi)
        m_mid = _relaxed_counts(a, mid, lower, upper, form)
        if m_mid.sum() >= budget:
            lam_lo, m_lo = mid, m_mid
        else:
            lam_hi, m_hi = mid, m_mid
    s_lo, s_hi = float(m_lo.sum()), float(m_hi.sum())
    theta = 0.0 if s_lo <= s_hi else (budget - s_hi) / (s_lo - s_hi)
    return np.clip(m_hi + np.clip(theta, 0.0, 1.0) * (m_lo - m_hi), lower, upper)


# ============================================================================ rounding
def _top(values: np.ndarray, k: int, largest: bool) -> np.ndarray:
    """Indices of the ``k`` largest (or smallest) finite values, best first."""
    finite = np.flatnonzero(np.isfinite(values))
    order = finite[np.argsort(-values[finite] if largest else values[finite], kind="stable")]
    return order[:k]


def _best_exchange(cost: np.ndarray, m: np.ndarray, lower: int, upper: int) -> tuple[float, dict[int, int]]:
    """The best move of one or two rollouts between batch prompts: the change of the objective
    (negative: an improvement) and the move as {prompt: change of m}. ``cost[i, k]`` is prompt i's
    cost at ``k`` rollouts (inf outside [lower, upper])."""
    rows = np.arange(m.size)

    def delta(k: int) -> np.ndarray:  # cost change of prompt i going from m_i to m_i + k (inf: not allowed)
        target = m + k
        ok = (target >= lower) & (target <= upper)
        out = np.full(m.size, np.inf)
        out[ok] = cost[rows[ok], target[ok]] - cost[rows[ok], m[ok]]
        return out

    change = {k: delta(k) for k in (1, 2, -1, -2)}
    # The moves, as the per-prompt steps of distinct prompts: one to one, two from one, two from two, one each to two.
    moves = ((1, -1), (2, -2), (2, -1, -1), (1, 1, -2))
    best, best_move = 0.0, {}
    for steps in moves:
        # A move's value is a sum of per-prompt terms, so the len(steps) best prompts of each term suffice.
        cands = [_top(change[k], len(steps), largest=False) for k in steps]
        for combo in itertools.product(*cands):
            if len(set(combo)) != len(steps):
                continue
            value = float(sum(change[k][i] for k, i in zip(steps, combo, strict=True)))
            if value < best:
                best, best_move = value, {int(i): k for k, i in zip(steps, combo, strict=True)}
    return best, best_move


def round_allocation(a: object, m_relaxed: object, budget: int, lower: int, upper: int,
                     form: str = "dr_grpo") -> np.ndarray:
    """Integer counts from the relaxation, keeping ``Σ m = budget`` and ``lower ≤ m ≤ upper``:

    1. floor each count (never below ``lower``: the relaxation's counts lie in the bounds);
    2. hand the units the floors left over, one at a time, to the prompt whose variance falls
       most from one more rollout (the paper's greedy), never past ``upper``;
    3. exchange search: move one or two rollouts between prompts (one to one, two from one or
       from two, one each to two) while that lowers the objective.

    Step 3 makes the result the integer optimum. For RLOO ``f`` is discretely convex, so no
    improving one-rollout move means optimal; Dr.GRPO's ``f`` is convex from m = 3 on but its
    first step 2 → 3 gains less than its second 3 → 4, and the two-rollout moves are the ones
    that open or close that pair. Checked against brute force on every small case and
    :func:`allocate_vip_dp` at scale (tests)."""
    a = _check_allocation_inputs(a, budget, lower, upper, form)
    mr = np.asarray(m_relaxed, dtype=np.float64)
    if mr.shape != a.shape:
        raise ValueError(f"m_relaxed {mr.shape} and a {a.shape} must have one shape")
    m = np.clip(np.floor(mr + 1e-9), lower, upper).astype(np.int64)
    ks = np.arange(upper + 1)
    cost = np.full((a.size, upper + 1), np.inf)
    cost[:, lower:] = a[:, None] * variance_factor(ks[lower:], form)[None, :]
    rows = np.arange(a.size)
    while m.sum() > budget:  # only through the floor's guard against rounding: remove the cheapest units
        loss = np.where(m > lower, cost[rows, np.maximum(m - 1, lower)] - cost[rows, m], np.inf)
        m[int(np.argmin(loss))] -= 1
    while m.sum() < budget:
        gain = np.where(m < upper, cost[rows, m] - cost[rows, np.minimum(m + 1, upper)], -np.inf)
        m[int(np.argmax(gain))] += 1
    scale = float(np.max(a)) if a.size else 0.0
    for _ in range(4 * int(budget) + 16):
        value, move = _best_exchange(cost, m, lower, upper)
        if not move or value >= -1e-13 * scale:
            break
        for i, step in move.items():
            m[i] += step
    else:  # unreachable: each move lowers a bounded objective by a finite amount
        raise AssertionError("round_allocation: the exchange search did not settle")
    if int(m.sum()) != budget or m.min(initial=lower) < lower or m.max(initial=upper) > upper:
        raise AssertionError("round_allocation broke a constraint")  # a loud guard
    return m


def allocate_vip(a: object, budget: int, lower: int, upper: int, form: str = "dr_grpo") -> np.ndarray:
    """VIP's allocation over a batch: :func:`relaxed_allocation` then :func:`round_allocation`."""
    m_rel = relaxed_allocation(a, budget, lower, upper, form)
    return round_allocation(a, m_rel, budget, lower, upper, form)


def allocate_vip_dp(a: object, budget: int, lower: int, upper: int, form: str = "dr_grpo") -> np.ndarray:
    """Reference dynamic programme for the integer problem of :func:`allocate_vip`,
    O(Q · budget · (upper − lower)). For tests and benchmarks."""
    a = _check_allocation_inputs(a, budget, lower, upper, form)
    Q = a.size
    extra = budget - Q * lower  # units above `lower` to place
    choices = np.arange(upper - lower + 1)
    values = a[:, None] * variance_factor(lower + choices, form)[None, :]
    best = np.full(extra + 1, np.inf)
    best[0] = 0.0
    back = np.zeros((Q, extra + 1), dtype=np.int64)
    for i in range(Q):
        new = np.full(extra + 1, np.inf)
        arg = np.zeros(extra + 1, dtype=np.int64)
        for c in choices:
            if c > extra:
                break
            cand = np.full(extra + 1, np.inf)
            cand[c:] = best[: extra + 1 - c] + values[i, c]
            better = cand < new
            new = np.where(better, cand, new)
            arg = np.where(better, c, arg)
        best, back[i] = new, arg
    m = np.zeros(Q, dtype=np.int64)
    b = extra
    for i in range(Q - 1, -1, -1):
        m[i] = lower + back[i, b]
        b -= back[i, b]
    return m


# ============================================================================ the root rule
@dataclass(frozen=True)
class VipRoots:
    """VIP as a root rule (reads history): draw the incumbent batch of ``M(1+N)/G`` candidates
    uniformly (as GRPO draws its prompts, from the same generator call), predict every
    candidate's success with :func:`vip_predict` (the GP is fitted on every candidate with an
    outcome, in the batch or not), and split the budget ``M(1+N)`` over the batch with
    :func:`allocate_vip` between ``L = min_rollouts`` and ``U = max_rollouts or M_max``. With no
    history every batch prompt has the prior's ``p``, so the split is uniform: ``G`` each, GRPO."""

    config: VipConfig = VipConfig()
    reads_history: ClassVar[bool] = True

    def __call__(
        self, v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator, history: HistoryView | None = None
    ) -> np.ndarray:
        B, Q = v.shape[0], spec.total // spec.group_size_G
        lower = int(self.config.min_rollouts)
        upper = int(self.config.max_rollouts if self.config.max_rollouts is not None else spec.max_per_prompt)
        if not Q * lower <= spec.total <= Q * upper:
            raise ValueError(f"VIP: the budget {spec.total} cannot be split over {Q} prompts with "
                             f"{lower} <= m_i <= {upper}")
        batch, history = draw_batch(B, Q, rng, history, "VIP")
        p = vip_predict(v, history, self.config, at=batch).success
        m = np.zeros(B, dtype=np.int64)
        m[batch] = allocate_vip(p * (1.0 - p), spec.total, lower, upper, self.config.variance_form)
        return m
