"""The rules a method is made of, and the stateless and history-reading rules of the methods we run.

A method (:class:`trace_core.methods.Method`) is its rules: a :class:`RootRule` for the bare rollouts
(one interface whether or not it keeps state across steps: a rule that does reads the caller's
:class:`~trace_core.history.HistoryView`), a prefix rule over one prompt's :class:`AnchorSignals`
(an :class:`EntropyReader` reads the policy's entropy too), a :class:`CandidateFilter` in front of
rounds, and a :class:`TokenRule` for a step priced in generated tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from trace_core.allocation.checks import check_prefix_inputs
from trace_core.allocation.prefixes import allocate_prefixes
from trace_core.allocation.roots import allocate_roots, allocate_roots_beta, allocate_roots_thompson
from trace_core.allocation.spec import BudgetSpec
from trace_core.arpo import ArpoConfig, arpo_placement
from trace_core.history import GresoConfig, HistoryView, PosteriorConfig, beta_posterior, greso_keep


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
    construction (:func:`check_prefix_inputs`)."""

    p: np.ndarray
    r: np.ndarray
    turn: np.ndarray
    rollout: np.ndarray | None = None
    entropy: EntropySignals | None = None

    def __post_init__(self) -> None:
        p, r, t = check_prefix_inputs(self.p, self.r, self.turn)
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
class PrefixPlacement:
    """Where one prompt's prefix budget went (:meth:`Method.place_prefixes`)."""

    K: np.ndarray  # int64 (anchors,): continuations from each anchor
    extra_roots: int  # continuations from the root: an anchorless prompt's whole budget


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
