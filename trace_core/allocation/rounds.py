"""Group filters that sample in rounds (DAPO's dynamic sampling): a :class:`RoundRule` decides each
round from what the earlier ones produced and which groups the policy trains on;
:func:`next_checked_round` holds every round to the contract the trainer and the simulator rely on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from trace_core.allocation.spec import BudgetSpec


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
