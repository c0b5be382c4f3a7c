"""Expected generated tokens: what a root rollout of a prompt, and a continuation from one of its
anchors, will cost (method §10, the token budget).

With prefix caching an engine's generation time follows the tokens it generates, so the token
budget prices every rollout by its expected generated tokens. This module estimates them from
what the run has seen, numpy in, numpy out:

- a **root rollout** of prompt ``i`` is expected to generate the prompt's own exponentially
  discounted mean of its earlier bare rollouts' generated tokens, shrunk towards the policy's
  recent mean by ``prior_weight`` pseudo-rollouts; a prompt never seen gets the policy's recent
  mean over all prompts (a discounted mean over steps), and before any rollout was observed at
  all, :attr:`CostModel.initial_tokens`. The expected number of turns of a rollout follows the same
  rule (:attr:`CostModel.initial_turns` first);
- a **continuation** from the anchor at turn ``t`` of a bare rollout of ``T`` turns is expected to
  generate ``root tokens × (1 − t/T) × w(t/T)``: the linear rule (the turns still to come, each as
  long as the prompt's average turn) times a learned per-depth correction ``w`` — the discounted
  mean, in each of :attr:`CostModel.depth_bins` bins of the relative depth ``t/T``, of realised
  continuation tokens over what the linear rule predicted for them, shrunk towards 1 by
  ``depth_prior_weight`` pseudo-observations. With no continuation observed ``w = 1`` and the
  estimate is the linear rule exactly; where later turns are shorter (or longer) than earlier ones
  ``w`` learns it.

The state (:class:`CostState`) is immutable: :func:`observe` and :func:`observe_continuations`
return a new one, and :meth:`CostState.to_dict` / :meth:`CostState.from_dict` give the JSON form a
trainer checkpoints. :func:`cost_error` measures an estimate against the realised cost.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

COST_FORMAT = "trace-rl/cost-state/v1"


# ============================================================================ configuration
@dataclass(frozen=True)
class CostModel:
    """How expected generated tokens are estimated from what the run has seen."""

    # Per step, the weight of a prompt's older observations in its discounted mean length: after
    # ``d`` steps an observation counts ``discount**d`` as much as a new one (1: a plain mean).
    discount: float = 0.7
    # The same for the policy's recent mean over all prompts (the fallback for unseen prompts):
    # smaller than ``discount`` because the policy's lengths drift as it trains.
    policy_discount: float = 0.5
    # Pseudo-rollouts of the policy's recent mean added to a seen prompt's own observations, so
    # that one unusually long or short rollout does not set its price alone (0: its own mean only).
    prior_weight: float = 1.0
    # Generated tokens of a rollout assumed before any rollout has been observed (a first step).
    initial_tokens: float = 512.0
    # Turns of a rollout assumed before any rollout has been observed.
    initial_turns: float = 4.0
    # Bins of the relative anchor depth t/T in (0, 1) over which the continuation correction w is
    # learned (equal widths).
    depth_bins: int = 4
    # Per step, the weight of older continuation observations in each bin's correction.
    depth_discount: float = 0.9
    # Pseudo-observations of w = 1 (the linear rule) in each bin.
    depth_prior_weight: float = 4.0

    def __post_init__(self) -> None:
        for name in ("discount", "policy_discount", "depth_discount"):
            value = getattr(self, name)
            if not (np.isfinite(value) and 0.0 < value <= 1.0):
                raise ValueError(f"{name} = {value}: a per-step discount must lie in (0, 1]")
        for name in ("prior_weight", "depth_prior_weight"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} = {value}: a pseudo-count must be finite and >= 0")
        if not (np.isfinite(self.initial_tokens) and self.initial_tokens > 0.0):
            raise ValueError(f"initial_tokens = {self.initial_tokens}: a rollout's tokens must be finite and > 0")
        if not (np.isfinite(self.initial_turns) and self.initial_turns >= 1.0):
            raise ValueError(f"initial_turns = {self.initial_turns}: a rollout has at least one turn")
        if isinstance(self.depth_bins, bool) or not isinstance(self.depth_bins, int) or self.depth_bins < 1:
            raise ValueError(f"depth_bins = {self.depth_bins!r}: it must be an integer >= 1")


# ============================================================================ state
class PromptCost(NamedTuple):
    """One prompt's discounted sums, as of the step it was last observed."""

    tokens: float  # Σ discount^(age) · generated tokens of its bare rollouts
    turns: float  # Σ discount^(age) · turns of its bare rollouts
    weight: float  # Σ discount^(age): its discounted number of rollouts
    step: int  # the step these sums are current at


def _no_bins() -> tuple[tuple[float, float], ...]:
    return ()


@dataclass(frozen=True)
class CostState:
    """What the run has seen of generated lengths. Never mutated: the functions below return new
    states. ``step`` is the newest step observed (−1: none)."""

    step: int = -1
    policy: PromptCost = PromptCost(0.0, 0.0, 0.0, -1)  # the same sums over every prompt
    prompts: dict[Hashable, PromptCost] = field(default_factory=dict)
    # per depth bin: (Σ discount^(age) · realised / linear-rule tokens, Σ discount^(age)); empty: none seen
    depth: tuple[tuple[float, float], ...] = field(default_factory=_no_bins)
    depth_step: int = -1  # the step the depth sums are current at

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description (prompt ids must be JSON values: strings or integers)."""
        return {
            "format": COST_FORMAT,
            "step": self.step,
            "policy": list(self.policy),
            "prompts": [[pid, *row] for pid, row in self.prompts.items()],
            "depth": [list(b) for b in self.depth],
            "depth_step": self.depth_step,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostState:
        """The state :meth:`to_dict` described."""
        if data.get("format") != COST_FORMAT:
            raise ValueError(f"format {data.get('format')!r}: not a cost state ({COST_FORMAT})")
        prompts = {}
        for row in data["prompts"]:
            pid = row[0] if not isinstance(row[0], list) else tuple(row[0])
            prompts[pid] = PromptCost(float(row[1]), float(row[2]), float(row[3]), int(row[4]))
        p = data["policy"]
        return cls(step=int(data["step"]), policy=PromptCost(float(p[0]), float(p[1]), float(p[2]), int(p[3])),
                   prompts=prompts, depth=tuple((float(a), float(b)) for a, b in data["depth"]),
                   depth_step=int(data["depth_step"]))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> CostState:
        return cls.from_dict(json.loads(text))


# ============================================================================ validation
def _positive_array(x: object, name: str, allow_zero: bool = False) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    bad = ~np.isfinite(arr) | ((arr < 0.0) if allow_zero else (arr <= 0.0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        rule = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}[{i}] = {float(arr[i])!r}: it must be finite and {rule}")
    return arr


def _check_step(state: CostState, step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int | np.integer):
        raise ValueError(f"step must be an integer, got {step!r}")
    step = int(step)
    if step < 0:
        raise ValueError(f"step = {step}: steps count from 0")
    if step < state.step:
        raise ValueError(f"step = {step} is older than the state's newest step {state.step}: observe in step order")
    return step


def _decayed(row: PromptCost, discount: float, step: int) -> PromptCost:
    if row.step < 0:
        return PromptCost(0.0, 0.0, 0.0, step)
    f = discount ** (step - row.step)
    return PromptCost(row.tokens * f, row.turns * f, row.weight * f, step)


# ============================================================================ updates
def observe(
    state: CostState,
    model: CostModel,
    step: int,
    lengths: object,
    turns: object,
    prompt_ids: Sequence[Hashable] | np.ndarray | None = None,
) -> CostState:
    """The state after step ``step``'s bare root rollouts: ``lengths[k]`` generated tokens in
    ``turns[k]`` turns, of prompt ``prompt_ids[k]`` (None: prompts that never recur — only the
    policy's mean learns). Older sums are discounted by the steps since they were current; several
    calls for one step add up. Continuations are not observed here (they start mid-way:
    :func:`observe_continuations`)."""
    step = _check_step(state, step)
    lengths = _positive_array(lengths, "lengths", allow_zero=True)
    turns = _positive_array(turns, "turns")
    if turns.shape != lengths.shape:
        raise ValueError(f"turns has shape {turns.shape} but lengths has {lengths.shape}: one per rollout")
    pol = _decayed(state.policy, model.policy_discount, step)
    pol = PromptCost(pol.tokens + float(lengths.sum()), pol.turns + float(turns.sum()), pol.weight + lengths.size, step)
    prompts = state.prompts
    if prompt_ids is not None:
        ids = list(prompt_ids)
        if len(ids) != lengths.size:
            raise ValueError(f"prompt_ids has {len(ids)} entries but lengths has {lengths.size}: one per rollout")
        prompts = dict(state.prompts)
        for pid, n_tok, n_turn in zip(ids, lengths.tolist(), turns.tolist(), strict=True):
            row = _decayed(prompts.get(pid, PromptCost(0.0, 0.0, 0.0, -1)), model.discount, step)
            prompts[pid] = PromptCost(row.tokens + n_tok, row.turns + n_turn, row.weight + 1.0, step)
    return replace(state, step=step, policy=pol, prompts=prompts)


def depth_bin(relative_depth: np.ndarray, bins: int) -> np.ndarray:
    """The bin of each relative depth ``t/T`` in (0, 1): ``⌊bins · t/T⌋``, clipped to the last bin."""
    return np.clip((np.asarray(relative_depth, dtype=np.float64) * bins).astype(np.int64), 0, bins - 1)


def _relative_depth(turn: object, turns: object) -> np.ndarray:
    t = np.asarray(turn, dtype=np.float64)
    n = np.asarray(turns, dtype=np.float64)
    if t.shape != n.shape or t.ndim != 1:
        raise ValueError(f"turn and turns must be 1-D arrays of one length, got shapes {t.shape} and {n.shape}")
    bad = ~np.isfinite(t) | ~np.isfinite(n) | (t < 0) | (n < 1) | (t >= n)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"turn[{i}] = {float(t[i])!r}, turns[{i}] = {float(n[i])!r}: "
                         "an anchor needs 0 <= turn < turns (turn 0: the root)")
    return t / n


def observe_continuations(
    state: CostState, model: CostModel, step: int, turn: object, turns: object, predicted: object, realised: object
) -> CostState:
    """The state after step ``step``'s continuations: the one from turn ``turn[k]`` of a rollout of
    ``turns[k]`` turns generated ``realised[k]`` tokens where the linear rule predicted
    ``predicted[k]`` (root tokens × (1 − t/T), as :func:`remaining_tokens` gives with w = 1).
    Each bin of ``t/T`` keeps a discounted mean of realised/predicted: the correction ``w``."""
    step = _check_step(state, step)
    x = _relative_depth(turn, turns)
    predicted = _positive_array(predicted, "predicted")
    realised = _positive_array(realised, "realised", allow_zero=True)
    if not (predicted.shape == realised.shape == x.shape):
        raise ValueError("turn, turns, predicted and realised must have one entry per continuation")
    bins = model.depth_bins
    old = state.depth or tuple((0.0, 0.0) for _ in range(bins))
    if len(old) != bins:
        raise ValueError(f"the state holds {len(old)} depth bins but the model has depth_bins = {bins}")
    f = model.depth_discount ** (step - state.depth_step) if state.depth_step >= 0 else 0.0
    b = depth_bin(x, bins)
    ratio_sum = np.bincount(b, weights=realised / predicted, minlength=bins)
    count = np.bincount(b, minlength=bins).astype(np.float64)
    depth = tuple((s * f + float(ratio_sum[k]), w * f + float(count[k])) for k, (s, w) in enumerate(old))
    return replace(state, step=max(state.step, step), depth=depth, depth_step=step)


# ============================================================================ estimates
def policy_mean(state: CostState, model: CostModel) -> tuple[float, float]:
    """The policy's recent mean generated tokens and turns per rollout over all prompts (the
    discounted means of :func:`observe`), or the model's initial values before any rollout."""
    pol = state.policy
    if pol.weight <= 0.0:
        return float(model.initial_tokens), float(model.initial_turns)
    return pol.tokens / pol.weight, pol.turns / pol.weight


def _per_prompt(state: CostState, model: CostModel, prompt_ids: Sequence[Hashable] | np.ndarray | None,
                n: int | None, column: int) -> np.ndarray:
    fallback = policy_mean(state, model)[column]
    if prompt_ids is None:
        if n is None:
            raise ValueError("pass prompt_ids, or n (the number of prompts never seen)")
        return np.full(int(n), fallback)
    ids = list(prompt_ids)
    out = np.full(len(ids), fallback)
    k = model.prior_weight
    for row, pid in enumerate(ids):
        seen = state.prompts.get(pid)
        if seen is not None and seen.weight > 0.0:
            own = seen.tokens if column == 0 else seen.turns
            out[row] = (own + k * fallback) / (seen.weight + k)
    return out


def expected_root_tokens(
    state: CostState, model: CostModel, prompt_ids: Sequence[Hashable] | np.ndarray | None = None, n: int | None = None
) -> np.ndarray:
    """float64 (B,): expected generated tokens of one root rollout of each prompt: ``(S_i + κ·L̄) /
    (W_i + κ)`` for a prompt seen before (``S_i``, ``W_i``: its discounted token sum and rollout
    count, ``κ = prior_weight``, ``L̄`` the policy's recent mean), and ``L̄`` for a prompt never seen
    — every prompt when ``prompt_ids`` is None (give ``n``, their number). ``L̄`` is
    ``initial_tokens`` before any rollout was observed."""
    return _per_prompt(state, model, prompt_ids, n, 0)


def expected_turns(
    state: CostState, model: CostModel, prompt_ids: Sequence[Hashable] | np.ndarray | None = None, n: int | None = None
) -> np.ndarray:
    """float64 (B,): expected turns of one rollout of each prompt, by :func:`expected_root_tokens`'
    rule on the observed turns (``initial_turns`` before any rollout)."""
    return _per_prompt(state, model, prompt_ids, n, 1)


def depth_correction(state: CostState, model: CostModel) -> np.ndarray:
    """float64 (depth_bins,): the learned correction ``w`` of the linear rule per bin of ``t/T``,
    ``(Σ ratio + κ) / (Σ weight + κ)`` with ``κ = depth_prior_weight`` (1 with no observation)."""
    k = model.depth_prior_weight
    if not state.depth:
        return np.ones(model.depth_bins)
    if len(state.depth) != model.depth_bins:
        raise ValueError(f"the state holds {len(state.depth)} depth bins but the model has "
                         f"depth_bins = {model.depth_bins}")
    s = np.array([b[0] for b in state.depth])
    w = np.array([b[1] for b in state.depth])
    return np.divide(s + k, w + k, out=np.ones_like(s), where=(w + k) > 0)


def remaining_tokens(
    state: CostState, model: CostModel, root_tokens: object, turn: object, turns: object
) -> np.ndarray:
    """float64 (A,): expected generated tokens of a continuation from the anchor at turn ``turn``
    of a rollout of ``turns`` turns of a prompt whose root rollout costs ``root_tokens``:
    ``root_tokens × (1 − turn/turns) × w(turn/turns)`` (:func:`depth_correction`). ``turn = 0`` is
    the root itself (a fresh root rollout, w = 1)."""
    c = _positive_array(root_tokens, "root_tokens")
    x = _relative_depth(turn, turns)
    if c.shape != x.shape:
        raise ValueError(f"root_tokens has shape {c.shape} but turn has {x.shape}: one per anchor")
    w = np.where(x > 0, depth_correction(state, model)[depth_bin(x, model.depth_bins)], 1.0)
    return c * (1.0 - x) * w


def expected_anchor_fraction(state: CostState, model: CostModel, turns: object) -> np.ndarray:
    """float64 (B,): the expected remaining fraction of a root rollout's tokens at an anchor of
    unknown depth, for rollouts of ``turns`` expected turns (rounded, at least 2): the mean of
    ``(1 − t/T)·w(t/T)`` over the anchors ``t = 1..T−1`` — exactly 1/2 for every T while w = 1.
    Used to price a prompt's continuations before its anchors exist (the token budget's stage 1)."""
    n = _positive_array(turns, "turns")
    T = np.maximum(np.rint(n), 2).astype(np.int64)
    w = depth_correction(state, model)
    out = np.empty(T.size)
    for T_val in np.unique(T):
        t = np.arange(1, T_val)
        x = t / T_val
        out[T == T_val] = float(np.mean((1.0 - x) * w[depth_bin(x, model.depth_bins)]))
    return out


# ============================================================================ error
@dataclass(frozen=True)
class CostError:
    """An estimate against the realised cost, over ``n`` rollouts."""

    n: int
    mean_absolute: float  # mean |estimated − realised|, in tokens
    mean_relative: float  # mean |estimated − realised| / realised
    bias: float  # mean (estimated − realised) / realised (> 0: the estimate runs high)


def cost_error(estimated: object, realised: object) -> CostError:
    """How far estimated costs lie from the realised ones (NaN figures for no rollout). A realised
    cost must be > 0 (the relative error divides by it)."""
    est = _positive_array(estimated, "estimated", allow_zero=True)
    real = _positive_array(realised, "realised")
    if est.shape != real.shape:
        raise ValueError(f"estimated has shape {est.shape} but realised has {real.shape}")
    if est.size == 0:
        nan = float("nan")
        return CostError(0, nan, nan, nan)
    diff = est - real
    return CostError(int(est.size), float(np.mean(np.abs(diff))), float(np.mean(np.abs(diff) / real)),
                     float(np.mean(diff / real)))
