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
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

HISTORY_FORMAT = "trace-rl/prompt-history/v1"


# ============================================================================ the record
@dataclass(frozen=True)
class RootOutcome:
    """One prompt's bare root group in one step."""

    step: int  # the step the rollouts were made in
    successes: int  # bare root rollouts with reward > 0.5
    failures: int  # the other bare root rollouts
    prediction: float  # root prediction the allocator used that step, scored before the predictor saw these outcomes


@dataclass(frozen=True)
class HistoryView:
    """The newest events of ``n`` prompts at step ``step``, newest first, padded: column ``e`` is
    a prompt's ``e``-th newest event; ``event_step`` is −1 (and ``prediction`` NaN) past its last."""

    step: int  # the step about to be allocated (every event is older)
    event_step: np.ndarray  # int64 (n, E)
    successes: np.ndarray  # float64 (n, E)
    failures: np.ndarray  # float64 (n, E)
    prediction: np.ndarray  # float64 (n, E)

    def __post_init__(self) -> None:
        shape = self.event_step.shape
        if self.event_step.ndim != 2 or any(a.shape != shape for a in (self.successes, self.failures,
                                                                         self.prediction)):
            raise ValueError("event_step, successes, failures and prediction must share one (n, E) shape")

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

    def __len__(self) -> int:
        """Prompts with at least one event."""
        return len(self._events)

    def events(self, prompt_id: Hashable) -> tuple[RootOutcome, ...]:
        """A prompt's kept events, oldest first."""
        return tuple(self._events.get(prompt_id, ()))

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
        for pid, si, fi, pi in zip(ids, s.tolist(), f.tolist(), p.tolist(), strict=True):
            if si + fi == 0:
                continue  # no rollouts, no event
            events = self._events.setdefault(pid, [])
            if events and events[-1].step >= step:
                raise ValueError(
                    f"prompt {pid!r}: step {step} is not newer than its last event (step {events[-1].step})"
                )
            events.append(RootOutcome(step, int(si), int(fi), float(pi)))
            if len(events) > self.max_events:
                del events[0]

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
        return HistoryView(int(step), event_step, succ, fail, pred)

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
        return {"format": HISTORY_FORMAT, "max_events": self.max_events, "prompts": prompts}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PromptHistory:
        """The history :meth:`to_dict` described: the same events, in the same order."""
        if data.get("format") != HISTORY_FORMAT:
            raise ValueError(f"not a prompt history (format={data.get('format')!r})")
        history = cls(int(data["max_events"]))
        for pid, events in data["prompts"]:
            history._events[pid] = [RootOutcome(int(s), int(w), int(f), float(p)) for s, w, f, p in events]
        return history

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> PromptHistory:
        return cls.from_dict(json.loads(text))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, PromptHistory) and self.max_events == other.max_events
                and self._events == other._events)


# ============================================================================ GRESO's filter
@dataclass(frozen=True)
class GresoConfig:
    """GRESO's pre-rollout filter (arXiv 2506.02177), as we run it. Pinned defaults."""

    streak_k: int = 1  # k: a prompt whose k newest groups were each all-success or all-failure is filtered
    readmit_probability: float = 0.5  # p: a filtered prompt with a streak of z ≥ k is kept with probability p^(z−k+1)

    def __post_init__(self) -> None:
        if int(self.streak_k) < 1:
            raise ValueError(f"streak_k = {self.streak_k}: it must be >= 1")
        if not 0.0 <= self.readmit_probability <= 1.0:
            raise ValueError(f"readmit_probability = {self.readmit_probability}: it must lie in [0, 1]")


def uniform_streak(view: HistoryView) -> np.ndarray:
    """int64 (n,): how many of each prompt's newest consecutive groups were of one outcome (all
    successes or all failures, a zero-variance group). 0 for a prompt without history."""
    uniform = view.valid & ((view.successes == 0) | (view.failures == 0))
    broken = ~uniform  # the first non-uniform (or missing) event ends the streak
    first_break = np.where(broken.any(axis=1), broken.argmax(axis=1), uniform.shape[1])
    return first_break.astype(np.int64)


def greso_keep(view: HistoryView, config: GresoConfig, rng: np.random.Generator) -> np.ndarray:
    """bool (n,): GRESO's pre-rollout decision for each candidate. A prompt with a zero-variance
    streak ``z ≥ k`` is kept (re-admitted) with probability ``p^(z − k + 1)`` — with k = 1 this is
    GRESO's ``p^z`` — and every other prompt is kept. GRESO tunes ``p`` online towards a target
    share of zero-variance groups, separately for easy and hard prompts; we pin one ``p``."""
    z = uniform_streak(view)
    filtered = z >= config.streak_k
    keep_p = np.where(filtered, config.readmit_probability ** np.maximum(z - config.streak_k + 1, 0), 1.0)
    return rng.random(len(view)) < keep_p


# ============================================================================ the Beta posterior
@dataclass(frozen=True)
class PosteriorConfig:
    """The Beta posterior of a prompt's success probability used by the posterior-aware TRACE
    roots. Pinned defaults, fixed on the simulator before any reported run: the argmin of
    rollouts per mixed group (mean of the learned and the noisy predictor) over s ∈ {1, 2, 4, 8,
    16} × γ ∈ {0.5, 0.7, 0.9} × W ∈ {4, 8} on the persistent pool at (M, N) = (256, 2), tuning
    seed 100 (``bench/contrast.py --posterior-sweep --seed 100``). The whole grid lay within
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
