"""Knapsack-RL's rollout budgets (Li et al., arXiv 2509.25849): a batch's rollouts shared among its
prompts as a knapsack over their estimated success rates.

What the method decides, from what (numpy in, numpy out; :class:`~trace_core.allocation.KnapsackRoots`
is the registry's root rule around it). A batch of prompts gets ``total`` rollouts (``n`` a prompt
on average). Each prompt's success rate ``p`` is estimated from its own earlier rollouts (its
newest ``window`` root groups: in an epoch-ordered run, the previous epoch's):

- a prompt never seen gets the default ``n``;
- ``p = 0`` gets ``negative_n``, ``p = 1`` gets ``positive_n`` (both ``min_n`` unless set);
- ``0 < p < 1`` (an *effective* prompt) gets the floor ``min_n`` and takes part in the knapsack:
  ``k`` more rollouts are worth ``w(p) · (1 − p^{min_n+k} − (1 − p)^{min_n+k})`` — the probability
  that its group holds both outcomes (a nonzero gradient) times the information weight
  ``w(p) = p(1 − p)²`` — with at most ``max_n`` in all;
- **fallback**: each effective prompt is expected to need ``c(p) = ln(1 − α) / ln max(p, 1 − p)``
  rollouts to show both outcomes with probability ``α`` (capped at ``max_n``); when the budget left
  after the floors exceeds ``Σ c(p)``, the excess goes to the ``p = 0`` prompts (hard prompts may
  get many rollouts), or, without such prompts, to the other non-effective ones (``p = 1`` and
  unseen), evenly; the knapsack then spends ``Σ c(p)``;
- what the knapsack cannot place (every effective prompt at ``max_n``) is spread evenly over the
  effective prompts; with no effective prompt the rest goes to the ``p = 0`` prompts, or, with none,
  every prompt gets ``n``.

The rollouts given always sum to ``total`` exactly.

One difference from the authors' code, on purpose: their dynamic programme values a prompt given
no rollout beyond its floor at 0 instead of at its floor's worth ``w(p)·(1 − p^{min_n} − (1 −
p)^{min_n})``, which makes the first extra rollout of every prompt look worth a whole group. Here
each prompt is valued at the rollouts it gets, the objective the paper writes
(:func:`knapsack_extra_rollouts`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from trace_core.history import HistoryView, draw_batch

if TYPE_CHECKING:  # only for annotations: the registry in trace_core.allocation imports this module
    from trace_core.allocation import BudgetSpec


@dataclass(frozen=True)
class KnapsackConfig:
    """Knapsack-RL's knobs, at the paper's defaults."""

    min_n: int = 2  # the floor of a prompt whose estimate is strictly between 0 and 1
    # the most rollouts the knapsack gives one prompt (None: the budget's M_max); the fallback and
    # the spread of what the knapsack cannot place may exceed it, as in the paper
    max_n: int | None = None
    negative_n: int | None = None  # rollouts of a prompt never solved so far (None: min_n)
    positive_n: int | None = None  # rollouts of a prompt always solved so far (None: min_n)
    alpha: float = 0.9  # the confidence of the cost estimate c(p): both outcomes seen with probability α
    allow_fallback: bool = True  # budget beyond Σ c(p) to the p = 0 prompts (False: all to the knapsack)
    window: int = 1  # root groups of a prompt its estimate reads, newest first (1: its last epoch's)

    def __post_init__(self) -> None:
        if self.min_n < 1:
            raise ValueError(f"knapsack min_n = {self.min_n}: a prompt in the knapsack gets >= 1 rollout")
        if self.max_n is not None and self.max_n < self.min_n:
            raise ValueError(f"knapsack max_n = {self.max_n} is below min_n = {self.min_n}")
        for name in ("negative_n", "positive_n"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"knapsack {name} = {value}: a count of rollouts cannot be negative")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"knapsack alpha = {self.alpha}: a probability strictly between 0 and 1")
        if self.window < 1:
            raise ValueError(f"knapsack window = {self.window}: the estimate reads >= 1 root group")


def success_estimates(successes: np.ndarray, failures: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each prompt's estimated success rate from its counted rollouts (rows: prompts, columns: its
    groups in the window), and whether it has any: ``(p, seen)``; ``p`` is NaN where unseen."""
    s = np.asarray(successes, dtype=np.float64).sum(axis=1)
    n = s + np.asarray(failures, dtype=np.float64).sum(axis=1)
    seen = n > 0
    p = np.full(s.shape, np.nan)
    p[seen] = s[seen] / n[seen]
    return p, seen


def expected_cost(p: np.ndarray, alpha: float) -> np.ndarray:
    """Rollouts an effective prompt needs to show both outcomes with probability ``alpha``:
    ``ln(1 − α) / ln max(p, 1 − p)`` (``0 < p < 1``)."""
    p = np.asarray(p, dtype=np.float64)
    return math.log(1.0 - alpha) / np.log(np.maximum(p, 1.0 - p))


def knapsack_value(p: float, rollouts: int) -> float:
    """A prompt's worth at ``rollouts`` rollouts: ``p(1 − p)² · (1 − p^n − (1 − p)^n)``."""
    return p * (1.0 - p) ** 2 * (1.0 - p ** rollouts - (1.0 - p) ** rollouts)


def knapsack_extra_rollouts(p: np.ndarray, floor: int, cap: int, budget: int) -> np.ndarray:
    """int64 (n,): the rollouts beyond ``floor`` of each effective prompt that maximise
    ``Σ knapsack_value(p_i, floor + k_i)`` subject to ``Σ k_i = budget``, ``0 ≤ k_i ≤ cap − floor``;
    when ``budget`` exceeds what the caps allow, the largest feasible sum. An exact dynamic
    programme over prompts and budget (O(n · budget · cap)); ties keep the fewer rollouts on the
    earlier prompt."""
    p = np.asarray(p, dtype=np.float64)
    n, room = p.shape[0], max(0, cap - floor)
    budget = min(int(budget), n * room)
    if n == 0 or budget <= 0:
        return np.zeros(n, dtype=np.int64)
    ks = np.arange(room + 1)
    gains = np.array([[knapsack_value(float(pi), floor + int(k)) for k in ks] for pi in p])
    best = np.full((n + 1, budget + 1), -np.inf)
    best[0, 0] = 0.0
    choice = np.zeros((n + 1, budget + 1), dtype=np.int64)
    for i in range(1, n + 1):
        for k in range(min(room, budget) + 1):  # k ascending: a tie keeps the fewer rollouts
            value = best[i - 1, : budget + 1 - k] + gains[i - 1, k]
            better = value > best[i, k:] + 1e-15
            best[i, k:][better] = value[better]
            choice[i, k:][better] = k
    extra = np.zeros(n, dtype=np.int64)
    w = budget
    for i in range(n, 0, -1):
        extra[i - 1] = choice[i, w]
        w -= choice[i, w]
    return extra


def _spread(budget: int, rows: np.ndarray, size: int) -> np.ndarray:
    """``budget`` rollouts spread evenly over ``rows`` (the first ones take the remainder)."""
    out = np.zeros(size, dtype=np.int64)
    if rows.size and budget > 0:
        out[rows] = budget // rows.size
        out[rows[: budget % rows.size]] += 1
    return out


def knapsack_budgets(p: np.ndarray, seen: np.ndarray, total: int, n: int, max_n: int,
                     config: KnapsackConfig = KnapsackConfig()) -> np.ndarray:
    """int64 (B,): Knapsack-RL's rollouts for a batch of ``B`` prompts (module docstring):
    ``p`` and ``seen`` from :func:`success_estimates`, ``total`` rollouts (``n`` a prompt on
    average), ``max_n`` the knapsack's cap. Sums to ``total`` exactly; ValueError when the floors
    alone exceed it."""
    p = np.asarray(p, dtype=np.float64)
    seen = np.asarray(seen, dtype=bool)
    B = p.shape[0]
    negative_n = config.min_n if config.negative_n is None else config.negative_n
    positive_n = config.min_n if config.positive_n is None else config.positive_n
    effective = seen & (p > 0) & (p < 1)
    never = seen & (p == 0)
    always = seen & (p == 1)
    m = np.where(~seen, n, 0) + np.where(effective, config.min_n, 0) + np.where(never, negative_n, 0) \
        + np.where(always, positive_n, 0)
    left = int(total) - int(m.sum())
    if left < 0:
        raise ValueError(f"knapsack: the floors ask {int(m.sum())} rollouts of a batch of {total} "
                         f"({B} prompts: unseen {n}, min_n {config.min_n}, negative_n {negative_n}, "
                         f"positive_n {positive_n})")
    rows = np.flatnonzero(effective)
    if left == 0:
        return m
    if rows.size == 0:  # nothing to weigh: the hard prompts take the rest, or every prompt its n
        if never.any():
            return m + _spread(left, np.flatnonzero(never), B)
        return _spread(int(total), np.arange(B), B)
    knapsack = left
    if config.allow_fallback:
        needed = int(np.minimum(max_n, expected_cost(p[rows], config.alpha)).astype(np.int64).sum())
        others = np.flatnonzero(never) if never.any() else np.flatnonzero(~effective)
        if needed < left and others.size:
            m = m + _spread(left - needed, others, B)
            knapsack = needed
    extra = knapsack_extra_rollouts(p[rows], config.min_n, max_n, knapsack)
    m[rows] += extra
    return m + _spread(knapsack - int(extra.sum()), rows, B)


@dataclass(frozen=True)
class KnapsackRoots:
    """Knapsack-RL as a root rule (reads history): the batch is ``M(1+N)/G`` candidates drawn
    uniformly (as GRPO draws its prompts, from the same generator call); its ``M(1+N)`` rollouts are
    shared by :func:`knapsack_budgets` with the default ``n = G`` and the cap ``max_n`` (None:
    M_max), each prompt's estimate from its newest ``window`` root groups. With no history every
    prompt is unseen and gets ``G``: GRPO."""

    config: KnapsackConfig = KnapsackConfig()
    reads_history: ClassVar[bool] = True

    def __call__(
        self, v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator, history: HistoryView | None = None
    ) -> np.ndarray:
        B, G = v.shape[0], spec.group_size_G
        batch, history = draw_batch(B, spec.total // G, rng, history, "Knapsack-RL")
        w = self.config.window
        p, seen = success_estimates(history.successes[batch, :w], history.failures[batch, :w])
        cap = spec.max_per_prompt if self.config.max_n is None else self.config.max_n
        m = np.zeros(B, dtype=np.int64)
        m[batch] = knapsack_budgets(p, seen, spec.total, G, cap, self.config)
        return m
