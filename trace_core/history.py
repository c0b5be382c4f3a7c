"""Per-prompt history across steps: the bare root outcomes each prompt got, and the two rules
that read them — GRESO's skip filter and the Beta posterior of the posterior-aware TRACE roots.

A trainer (or the simulator) keeps one :class:`PromptHistory` per run. After each step it calls
:meth:`PromptHistory.record` with the step's bare root outcomes — for every prompt that got
rollouts, how many of its *bare* root rollouts succeeded and failed, and the root prediction the
allocator used for it — and before the next allocation it calls :meth:`PromptHistory.view` for
the step's candidate pool. A :class:`HistoryView` is plain numpy arrays aligned with the pool; the
rules below are pure functions of it (numpy in, numpy out), so the trainer can call them without
the simulator, and every method reads the same record (nothing here knows a method's name).

Only bare root rollouts are recorded: they are independent draws of the prompt's success
probability. Continuations start from chosen prefixes and are not.

Beside the per-prompt events the record keeps one :class:`StepOutcome` per step: how many groups
the step sampled and how many of them were all successes or all failures. GRESO's adaptive skip
probabilities are a function of that sequence (:func:`greso_state`), so they too live in the
record a checkpoint already holds.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HISTORY_FORMAT = "trace-rl/prompt-history/v2"
_HISTORY_FORMAT_V1 = "trace-rl/prompt-history/v1"  # events only, no step outcomes (still read)


# ============================================================================ the record
@dataclass(frozen=True)
class RootOutcome:
    """One prompt's bare root group in one step."""

    step: int  # the step the rollouts were made in
    successes: int  # bare root rollouts with reward > 0.5
    failures: int  # the other bare root rollouts
    prediction: float  # root prediction the allocator used that step, scored before the predictor saw these outcomes


@dataclass(frozen=True)
class StepOutcome:
    """One step's bare root groups, summed over the prompts recorded for it."""

    step: int
    groups: int  # prompts that got bare root rollouts
    all_success: int  # of those, groups whose rollouts all succeeded
    all_failure: int  # of those, groups whose rollouts all failed
    recurring: int  # of those, prompts with an earlier event (0 throughout a first pass over the data)


def _no_steps() -> np.ndarray:
    return np.zeros((0, 5), dtype=np.int64)


@dataclass(frozen=True)
class HistoryView:
    """The newest events of ``n`` prompts at step ``step``, newest first, padded: column ``e`` is
    a prompt's ``e``-th newest event; ``event_step`` is −1 (and ``prediction`` NaN) past its last."""

    step: int  # the step about to be allocated (every event is older)
    event_step: np.ndarray  # int64 (n, E)
    successes: np.ndarray  # float64 (n, E)
    failures: np.ndarray  # float64 (n, E)
    prediction: np.ndarray  # float64 (n, E)
    # int64 (S, 5): the run's StepOutcome rows (step, groups, all_success, all_failure, recurring)
    # of the steps before ``step``, oldest first; not per prompt (every row of the view shares them)
    steps: np.ndarray = field(default_factory=_no_steps)

    def __post_init__(self) -> None:
        shape = self.event_step.shape
        if self.event_step.ndim != 2 or any(a.shape != shape for a in (self.successes, self.failures,
                                                                         self.prediction)):
            raise ValueError("event_step, successes, failures and prediction must share one (n, E) shape")
        if self.steps.ndim != 2 or self.steps.shape[1] != 5:
            raise ValueError(f"steps has shape {self.steps.shape}: it needs one row of 5 counts per step")

    def __len__(self) -> int:
        return self.event_step.shape[0]

    @property
    def valid(self) -> np.ndarray:
        """bool (n, E): which cells hold an event."""
        return self.event_step >= 0

    @property
    def count(self) -> np.ndarray:
        """int64 (n,): events held per prompt (at most E)."""
        return self.valid.sum(axis=1)

    def take(self, rows: np.ndarray) -> HistoryView:
        """The view of the prompts at ``rows`` (indices into this view), with the same steps."""
        rows = np.asarray(rows, dtype=np.int64)
        return HistoryView(self.step, self.event_step[rows], self.successes[rows], self.failures[rows],
                           self.prediction[rows], self.steps)

    @staticmethod
    def empty(n: int, step: int = 0) -> HistoryView:
        """``n`` prompts with no history (a first step, or a pool of fresh prompts)."""
        z = np.zeros((n, 1))
        return HistoryView(int(step), np.full((n, 1), -1, dtype=np.int64), z, z.copy(), np.full((n, 1), np.nan))


class PromptHistory:
    """Bare root outcomes keyed by prompt id (any hashable: a dataset index, a task id).

    Keeps each prompt's ``max_events`` newest events; the rules here read at most that many."""

    def __init__(self, max_events: int = 16) -> None:
        if int(max_events) < 1:
            raise ValueError(f"max_events = {max_events}: it must be >= 1")
        self.max_events = int(max_events)
        self._events: dict[Hashable, list[RootOutcome]] = {}
        self._steps: dict[int, StepOutcome] = {}  # every step's totals, never truncated

    def __len__(self) -> int:
        """Prompts with at least one event."""
        return len(self._events)

    def events(self, prompt_id: Hashable) -> tuple[RootOutcome, ...]:
        """A prompt's kept events, oldest first."""
        return tuple(self._events.get(prompt_id, ()))

    def steps(self) -> tuple[StepOutcome, ...]:
        """Every recorded step's totals, in step order."""
        return tuple(self._steps[k] for k in sorted(self._steps))

    def record(
        self,
        step: int,
        prompt_ids: Sequence[Hashable] | np.ndarray,
        successes: object,
        failures: object,
        predictions: object,
    ) -> None:
        """Add one event per prompt: the step's bare root outcomes of the prompts that got
        rollouts. ``step`` must be newer than every event already held for those prompts."""
        ids = list(np.asarray(prompt_ids, dtype=object).tolist()) if isinstance(prompt_ids, np.ndarray) \
            else list(prompt_ids)
        s = np.asarray(successes)
        f = np.asarray(failures)
        p = np.asarray(predictions, dtype=np.float64)
        if not (s.shape == f.shape == p.shape == (len(ids),)):
            raise ValueError(
                f"successes {s.shape}, failures {f.shape} and predictions {p.shape} need one entry per "
                f"prompt id ({len(ids)})"
            )
        if len(set(ids)) != len(ids):
            raise ValueError("a prompt id appears twice in one step's record")
        if np.any(s < 0) or np.any(f < 0) or np.any(s != np.round(s)) or np.any(f != np.round(f)):
            raise ValueError("successes and failures must be non-negative whole counts")
        if np.any(~np.isfinite(p) | (p < 0) | (p > 1)):
            raise ValueError("predictions must be probabilities in [0, 1]")
        step = int(step)
        for pid, si, fi in zip(ids, s.tolist(), f.tolist(), strict=True):
            events = self._events.get(pid)
            if si + fi > 0 and events and events[-1].step >= step:
                raise ValueError(
                    f"prompt {pid!r}: step {step} is not newer than its last event (step {events[-1].step})"
                )
        groups = easy = hard = recurring = 0
        for pid, si, fi, pi in zip(ids, s.tolist(), f.tolist(), p.tolist(), strict=True):
            if si + fi == 0:
                continue  # no rollouts, no event
            events = self._events.setdefault(pid, [])
            groups, easy, hard, recurring = groups + 1, easy + (fi == 0), hard + (si == 0), recurring + bool(events)
            events.append(RootOutcome(step, int(si), int(fi), float(pi)))
            if len(events) > self.max_events:
                del events[0]
        if groups:  # a step recorded in parts (several calls) sums its parts
            old = self._steps.get(step, StepOutcome(step, 0, 0, 0, 0))
            self._steps[step] = StepOutcome(step, old.groups + groups, old.all_success + int(easy),
                                            old.all_failure + int(hard), old.recurring + int(recurring))

    def view(self, prompt_ids: Sequence[Hashable] | np.ndarray, step: int) -> HistoryView:
        """The events of ``prompt_ids`` (one row each, in that order) for the allocation of ``step``."""
        ids = list(np.asarray(prompt_ids, dtype=object).tolist()) if isinstance(prompt_ids, np.ndarray) \
            else list(prompt_ids)
        n, E = len(ids), self.max_events
        event_step = np.full((n, E), -1, dtype=np.int64)
        succ = np.zeros((n, E))
        fail = np.zeros((n, E))
        pred = np.full((n, E), np.nan)
        for row, pid in enumerate(ids):
            events = self._events.get(pid)
            if not events:
                continue
            for col, ev in enumerate(reversed(events)):
                if ev.step >= step:
                    raise ValueError(f"prompt {pid!r} has an event at step {ev.step}, not before step {step}")
                event_step[row, col] = ev.step
                succ[row, col] = ev.successes
                fail[row, col] = ev.failures
                pred[row, col] = ev.prediction
        rows = [[o.step, o.groups, o.all_success, o.all_failure, o.recurring] for o in self.steps() if o.step < step]
        steps = np.array(rows, dtype=np.int64).reshape(len(rows), 5)
        return HistoryView(int(step), event_step, succ, fail, pred, steps)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able record of every kept event (a trainer's checkpoint holds it). Prompt ids
        must be strings or integers; they come back as they went in."""
        prompts = []
        for pid, events in self._events.items():
            if isinstance(pid, bool) or not isinstance(pid, str | int | np.integer):
                raise ValueError(f"prompt id {pid!r} is a {type(pid).__name__}: only str and int ids can be saved")
            prompts.append([pid if isinstance(pid, str) else int(pid),
                            [[e.step, e.successes, e.failures, e.prediction] for e in events]])
        steps = [[o.step, o.groups, o.all_success, o.all_failure, o.recurring] for o in self.steps()]
        return {"format": HISTORY_FORMAT, "max_events": self.max_events, "prompts": prompts, "steps": steps}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PromptHistory:
        """The history :meth:`to_dict` described: the same events, in the same order, and the same
        step totals. A v1 record (events only) comes back without step totals."""
        if data.get("format") not in (HISTORY_FORMAT, _HISTORY_FORMAT_V1):
            raise ValueError(f"not a prompt history (format={data.get('format')!r})")
        history = cls(int(data["max_events"]))
        for pid, events in data["prompts"]:
            history._events[pid] = [RootOutcome(int(s), int(w), int(f), float(p)) for s, w, f, p in events]
        for row in data.get("steps", []):
            outcome = StepOutcome(*(int(x) for x in row))
            history._steps[outcome.step] = outcome
        return history

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> PromptHistory:
        return cls.from_dict(json.loads(text))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, PromptHistory) and self.max_events == other.max_events
                and self._events == other._events and self._steps == other._steps)


# ============================================================================ GRESO's filter
@dataclass(frozen=True)
class GresoConfig:
    """GRESO's pre-rollout filter (arXiv 2506.02177) with its authors' defaults (their public code:
    the ``all_probabilistic`` filter and its trainer's adaptation; ``train-scripts/*_greso.sh``).

    A prompt whose newest ``z`` groups were all successes is kept with probability
    ``max(p_easy^z, min_keep_probability)``; one whose newest ``z`` groups were all failures with
    ``max(p_hard^z, min_keep_probability)``; every other prompt is kept. After every step each
    probability moves by ``step_size`` towards its target: down (skip more) while the step's share
    of all-success (all-failure) groups is at or above ``target_easy`` (``target_hard``), up
    otherwise, clamped to ``[p_min, p_max]``."""

    initial_p_easy: float = 0.5  # p_easy before the first adaptation (the scripts' data.p_easy)
    initial_p_hard: float = 0.5  # p_hard before the first adaptation (the scripts' data.p_hard)
    # targets: a third and two thirds of the 25% zero-variance share the scripts aim at
    # (target_zero_variance = 0.25; hard prompts get the larger share, they change more often)
    target_easy: float = 0.25 / 3  # share of a step's groups that are all successes GRESO aims at
    target_hard: float = 0.25 * 2 / 3  # share of a step's groups that are all failures GRESO aims at
    step_size: float = 0.01  # how far each probability moves per step
    p_min: float = 0.05  # lower clamp of both probabilities (the code's min_p)
    p_max: float = 0.95  # upper clamp of both probabilities (the code's max_p)
    min_keep_probability: float = 0.01  # floor: however long its streak, a prompt is kept this often
    # the authors' trainer adapts only after the first epoch (before it no prompt has a record,
    # so nothing is filtered): we start at the first step in which a sampled prompt recurred
    adapt_from_recurrence: bool = True

    def __post_init__(self) -> None:
        for name in ("initial_p_easy", "initial_p_hard", "target_easy", "target_hard", "p_min", "p_max",
                     "min_keep_probability"):
            value = getattr(self, name)
            if not (np.isfinite(value) and 0.0 <= value <= 1.0):
                raise ValueError(f"{name} = {value}: it must lie in [0, 1]")
        if not (np.isfinite(self.step_size) and self.step_size >= 0.0):
            raise ValueError(f"step_size = {self.step_size}: it must be finite and >= 0")
        if self.p_min > self.p_max:
            raise ValueError(f"p_min = {self.p_min} > p_max = {self.p_max}")


@dataclass(frozen=True)
class GresoState:
    """GRESO's two skip probabilities at one step: what its authors' trainer checkpoints. Here it is
    derived from the :class:`PromptHistory` (:func:`greso_state`), so a resumed run continues with
    the probabilities it stopped at without a state of its own."""

    p_easy: float
    p_hard: float

    def adapt(self, outcome: StepOutcome, config: GresoConfig) -> GresoState:
        """The probabilities after ``outcome``'s step: each moves by ``config.step_size`` towards its
        target share of zero-variance groups, clamped to ``[p_min, p_max]``. A step without groups
        leaves them as they are."""
        if outcome.groups <= 0:
            return self

        def move(p: float, share: float, target: float) -> float:
            moved = p - config.step_size if share >= target else p + config.step_size  # too many: skip more
            return round(min(max(moved, config.p_min), config.p_max), 12)  # no drift from summed steps

        return GresoState(move(self.p_easy, outcome.all_success / outcome.groups, config.target_easy),
                          move(self.p_hard, outcome.all_failure / outcome.groups, config.target_hard))


def greso_state(view: HistoryView, config: GresoConfig) -> GresoState:
    """GRESO's probabilities for the allocation of ``view.step``: ``config``'s initial pair, adapted
    once per recorded step before it (:attr:`HistoryView.steps`), in step order; with
    ``adapt_from_recurrence``, from the first step in which a sampled prompt had been sampled before."""
    state = GresoState(config.initial_p_easy, config.initial_p_hard)
    started = not config.adapt_from_recurrence
    for row in view.steps.tolist():
        outcome = StepOutcome(*row)
        started = started or outcome.recurring > 0
        if started:
            state = state.adapt(outcome, config)
    return state


def outcome_streaks(view: HistoryView) -> tuple[np.ndarray, np.ndarray]:
    """``(easy, hard)``, int64 (n,) each: how many of each prompt's newest consecutive groups were
    all successes (``easy``) and all failures (``hard``). The two are counted apart, as GRESO does:
    a prompt whose newest group failed throughout and whose group before succeeded throughout has
    ``hard = 1``, ``easy = 0``. At most one of the two is nonzero; both are 0 without history."""

    def streak(uniform: np.ndarray) -> np.ndarray:
        broken = ~uniform  # the first other (or missing) event ends the streak
        return np.where(broken.any(axis=1), broken.argmax(axis=1), uniform.shape[1]).astype(np.int64)

    return (streak(view.valid & (view.failures == 0) & (view.successes > 0)),
            streak(view.valid & (view.successes == 0) & (view.failures > 0)))


def greso_keep_probability(view: HistoryView, config: GresoConfig) -> np.ndarray:
    """float64 (n,): the chance GRESO keeps (rolls out) each candidate: ``max(p_easy^z, floor)`` for
    a streak of ``z ≥ 1`` all-success groups, ``max(p_hard^z, floor)`` for one of all-failure
    groups, 1 otherwise; the probabilities are :func:`greso_state`'s for ``view.step``."""
    state = greso_state(view, config)
    easy, hard = outcome_streaks(view)
    p = np.where(easy > 0, state.p_easy ** easy.astype(np.float64), state.p_hard ** hard.astype(np.float64))
    return np.where((easy > 0) | (hard > 0), np.maximum(p, config.min_keep_probability), 1.0)


def greso_keep(view: HistoryView, config: GresoConfig, rng: np.random.Generator) -> np.ndarray:
    """bool (n,): GRESO's pre-rollout decision for each candidate, one draw each against
    :func:`greso_keep_probability`."""
    return rng.random(len(view)) < greso_keep_probability(view, config)


# ============================================================================ the Beta posterior
@dataclass(frozen=True)
class PosteriorConfig:
    """The Beta posterior of a prompt's success probability used by the posterior-aware TRACE
    roots. Pinned defaults, fixed on the simulator before any reported run: the argmin of
    rollouts per mixed group (mean of the learned and the noisy predictor) over s ∈ {1, 2, 4, 8,
    16} × γ ∈ {0.5, 0.7, 0.9} × W ∈ {4, 8} on the persistent pool at (M, N) = (256, 2), tuning
    seed 100 (``python -m bench.contrast --posterior-sweep --seed 100``). The whole grid lay within
    ±8% of the point-estimate TRACE there; these values are not claimed to matter much."""

    prior_strength: float = 8.0  # s: pseudo-rollouts the predictor's prior counts for
    discount: float = 0.9  # γ: an outcome from a steps ago counts γ^a rollouts (the policy has moved since)
    evidence_window: int = 4  # outcomes older than this many steps are left to the prior

    def __post_init__(self) -> None:
        if not (np.isfinite(self.prior_strength) and self.prior_strength > 0):
            raise ValueError(f"prior_strength = {self.prior_strength}: it must be finite and > 0")
        if not 0.0 < self.discount <= 1.0:
            raise ValueError(f"discount = {self.discount}: it must lie in (0, 1]")
        if int(self.evidence_window) < 1:
            raise ValueError(f"evidence_window = {self.evidence_window}: it must be >= 1")


def beta_posterior(view: HistoryView, prediction: object, config: PosteriorConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(α, β)`` per prompt: a prior from the predictor plus the prompt's own discounted bare root
    outcomes,

        α = s·v₀ + Σ_e γ^{age_e} S_e,    β = s·(1 − v₀) + Σ_e γ^{age_e} F_e,

    over the prompt's events ``e`` of the last ``evidence_window`` steps (``age_e = step − step_e``).

    **Nothing is counted twice.** The predictor is trained online on the same trees, so its
    current score of a prompt already reflects that prompt's earlier outcomes; adding those
    outcomes again as evidence would count them twice and make the posterior overconfident.
    So the prior mean ``v₀`` is not the current score but the prediction recorded with the
    *oldest counted* event — the score the allocator used at that step, made before the predictor
    was updated on that step's trees, hence on none of the counted outcomes. Outcomes older than
    the window are represented only through that prior (the predictor had trained on them); the
    counted ones only as evidence. A prompt without counted events gets the current prediction
    as its prior (it has no evidence to double count). The price is a prior up to
    ``evidence_window`` steps old; the discount makes the counted evidence fade at the same pace.
    """
    v = np.asarray(prediction, dtype=np.float64)
    if v.shape != (len(view),):
        raise ValueError(f"prediction has shape {v.shape}, expected ({len(view)},): one per prompt of the view")
    if np.any(~np.isfinite(v) | (v < 0) | (v > 1)):
        raise ValueError("prediction must hold probabilities in [0, 1]")
    age = view.step - view.event_step
    counted = view.valid & (age <= config.evidence_window)
    if np.any(counted & (age < 1)):
        raise ValueError("the view holds an event that is not older than its step")
    weight = np.where(counted, config.discount ** np.where(counted, age, 0).astype(np.float64), 0.0)
    n_counted = counted.sum(axis=1)
    oldest = np.maximum(n_counted - 1, 0)  # events are newest first; counted ones form a prefix
    rows = np.arange(len(view))
    prior = np.where(n_counted > 0, view.prediction[rows, oldest], v)
    s = config.prior_strength
    alpha = s * prior + (weight * view.successes).sum(axis=1)
    beta = s * (1.0 - prior) + (weight * view.failures).sum(axis=1)
    return alpha, beta


def draw_batch(pool: int, batch: int, rng: np.random.Generator, history: HistoryView | None,
               who: str) -> tuple[np.ndarray, HistoryView]:
    """GRPO's draw of ``batch`` of the ``pool`` candidates (uniform, the same generator call), for a
    root rule that shares a batch's budget by history (VIP, Knapsack-RL), and the pool's history
    (empty when None). ValueError naming ``who`` when the pool is too small or the history's rows
    are not the pool's."""
    if batch > pool:
        raise ValueError(f"{who} needs a batch of {batch} prompts but the pool holds only {pool}")
    if history is None:
        history = HistoryView.empty(pool)
    if len(history) != pool:
        raise ValueError(f"history has {len(history)} rows for a pool of {pool} prompts")
    return rng.choice(pool, size=batch, replace=False), history
