"""A training run's figures, pooled over its steps, and the table that compares methods.

Ratios are pooled as counts (Σ mixed groups / Σ activated prompts), not averaged per step, and
each comes with a 90% Wilson interval from those counts: on a small machine a run forms a few
dozen groups, and the interval says how much a difference between two methods can mean.

A user pays for generation time, which with prefix caching follows the generated tokens, so the
mixed groups are also priced per 1,000 generated tokens and per second of rollout wall time (the
rollout phase's: generation, tool steps and prefix scoring; ``budget/rollout_wall_s``), pooled
the same way (Σ mixed groups trained on / Σ tokens), each with a 90% Poisson score interval
(:func:`~trace_core.metrics.rate_interval`: the count Poisson given the tokens or seconds
spent). The contrastive yield per 1,000 tokens (trajectories with a nonzero own-node advantage)
has no interval: its trajectories carry a signal together, group by group, and an interval
that counted them as independent would be too narrow. A history from before a count was logged
shows "–" where the count is missing; the seconds are never reconstructed from other timings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trace_core.metrics import per_exposure, rate_interval, wilson_interval


@dataclass(frozen=True)
class RunFigures:
    """What one training run did with its rollouts (see the module docstring)."""

    method: str
    steps: int
    activated: int  # prompts that got rollouts, over all steps
    mixed_groups: int  # of those, prompts whose tree held both a success and a failure
    mixed_groups_trained: int  # of those, the ones trained on (a group filter may drop mixed groups past its target)
    expanded_anchors: int
    mixed_anchors: int
    rollouts: int  # training rollouts (bare + continuations), over all steps
    generated_tokens: float  # model-written tokens, over all steps
    contrastive_yield: float  # per 100 rollouts, mean over steps
    skipped_share: float  # share of candidate prompts given no rollout, mean over steps
    reward: float  # mean training reward, mean over steps
    warmup_rollouts: int  # rollouts spent fitting the predictor before RL (0: none)
    pool_success: tuple[tuple[int, float], ...]  # (step, pool success) as measured
    pool_samples: int  # samples per prompt behind the pool success
    contrastive_rollouts: int | None = None  # rollouts with a nonzero own-node advantage, over all steps
    rollout_s: float | None = None  # rollout phase wall time, over all steps (None: not logged every step)
    # the predictor's Spearman between its root scores, made before the step's update, and the
    # step's tree values (out of sample), mean over the steps where it is defined (NaN: none)
    predictor_spearman: float = math.nan

    @property
    def effective_ratio(self) -> float:
        return self.mixed_groups / self.activated if self.activated else math.nan

    @property
    def effective_ratio_interval(self) -> tuple[float, float]:
        return wilson_interval(self.mixed_groups, self.activated)

    @property
    def prefix_effective_ratio(self) -> float:
        return self.mixed_anchors / self.expanded_anchors if self.expanded_anchors else math.nan

    @property
    def prefix_effective_ratio_interval(self) -> tuple[float, float]:
        return wilson_interval(self.mixed_anchors, self.expanded_anchors)

    @property
    def mixed_per_100_rollouts(self) -> float:
        """Mixed groups trained on per 100 rollouts spent (the step metric of that name, pooled): a
        group filter's dropped mixed groups are paid for and give nothing, as in every figure per
        unit of cost."""
        return 100.0 * self.mixed_groups_trained / self.rollouts if self.rollouts else math.nan

    @property
    def rollouts_per_mixed_group(self) -> float:
        """Every rollout spent per mixed group trained on: what filling a batch with informative
        groups cost (dropped groups' rollouts included)."""
        return self.rollouts / self.mixed_groups_trained if self.mixed_groups_trained else math.nan

    @property
    def mixed_per_1k_tokens(self) -> float:
        """Mixed groups trained on per 1,000 tokens generated (dropped groups' tokens included)."""
        return per_exposure(self.mixed_groups_trained, self.generated_tokens, 1000.0)

    @property
    def mixed_per_1k_tokens_interval(self) -> tuple[float, float]:
        return rate_interval(self.mixed_groups_trained, self.generated_tokens, 1000.0)

    @property
    def contrastive_per_1k_tokens(self) -> float:
        """Rollouts with a nonzero own-node advantage per 1,000 tokens generated."""
        if self.contrastive_rollouts is None:
            return math.nan
        return per_exposure(self.contrastive_rollouts, self.generated_tokens, 1000.0)

    @property
    def mixed_per_rollout_s(self) -> float:
        """Mixed groups trained on per second of rollout wall time (NaN where it was not logged)."""
        return math.nan if self.rollout_s is None else per_exposure(self.mixed_groups_trained, self.rollout_s)

    @property
    def mixed_per_rollout_s_interval(self) -> tuple[float, float]:
        if self.rollout_s is None:
            return math.nan, math.nan
        return rate_interval(self.mixed_groups_trained, self.rollout_s)

    @property
    def opened_per_step(self) -> float:
        """Prompts given rollouts per step (GRPO and PCL: M(1+N)/G)."""
        return self.activated / self.steps if self.steps else math.nan

    @property
    def rollouts_per_opened_prompt(self) -> float:
        """Rollouts (bare and continuations) per prompt given any: how wide each group is."""
        return self.rollouts / self.activated if self.activated else math.nan

    @property
    def pool_success_start(self) -> float:
        return self.pool_success[0][1] if self.pool_success else math.nan

    @property
    def pool_success_end(self) -> float:
        return self.pool_success[-1][1] if self.pool_success else math.nan


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def contrastive_rollouts(yields: Sequence[float], rollouts: Sequence[float]) -> float:
    """Rollouts with a nonzero own-node advantage, summed over steps, from each step's contrastive
    yield (per 100 rollouts) and its rollout count; a step whose yield is undefined (NaN: it
    trained on no tree) adds none. The one pooling of the yield: run summaries and the benchmarks
    call it."""
    return float(sum(y / 100 * n for y, n in zip(yields, rollouts, strict=True) if math.isfinite(y)))


def run_figures(method: str, history: Mapping[str, Sequence[float]], pool_success: Sequence[Mapping[str, Any]] = (),
                warmup: Mapping[str, Any] | None = None, pool_samples: int = 0) -> RunFigures:
    """The figures of one run from the trainer's per-step history (``history.json``), its pool
    success records and its warm-up record (``summary.json``)."""
    def total(key: str) -> int:
        return int(round(sum(history.get(key, []))))

    steps = len(history.get("effective_ratio", []))
    if "counts/contrastive_rollouts" in history:
        contrastive: int | None = total("counts/contrastive_rollouts")
    elif "contrastive_yield" in history and "counts/rollouts" in history:
        contrastive = int(round(contrastive_rollouts(history["contrastive_yield"], history["counts/rollouts"])))
    else:
        contrastive = None
    wall = history.get("budget/rollout_wall_s", [])
    rollout_s = float(sum(wall)) if len(wall) == steps and steps else None

    return RunFigures(
        method=method, steps=steps,
        activated=total("counts/activated"), mixed_groups=total("counts/mixed_groups"),
        mixed_groups_trained=total("counts/mixed_groups_trained" if "counts/mixed_groups_trained" in history
                                   else "counts/mixed_groups"),
        expanded_anchors=total("counts/expanded_anchors"), mixed_anchors=total("counts/mixed_anchors"),
        rollouts=total("counts/rollouts"), generated_tokens=float(sum(history.get("budget/generated_tokens", []))),
        contrastive_yield=_mean(history.get("contrastive_yield", [])),
        skipped_share=_mean(history.get("alloc/skipped_share", [])),
        reward=_mean(history.get("reward/mean", [])),
        warmup_rollouts=int((warmup or {}).get("rollouts", 0)),
        pool_success=tuple(sorted((int(r["step"]), float(r["success"])) for r in pool_success)),
        pool_samples=pool_samples, contrastive_rollouts=contrastive, rollout_s=rollout_s,
        predictor_spearman=_mean(history.get("predictor/oos_spearman_root", [])),
    )


def _ratio(value: float, interval: tuple[float, float]) -> str:
    if not math.isfinite(value):
        return "–"
    return f"{value:.3f} [{interval[0]:.2f}, {interval[1]:.2f}]"


def _num(value: float, digits: int = 1) -> str:
    return "–" if not math.isfinite(value) else f"{value:.{digits}f}"


def _rate(value: float, interval: tuple[float, float], digits: int = 2) -> str:
    """A rate with its interval, to ``digits`` places ("–" when it was not measured)."""
    if not math.isfinite(value):
        return "–"
    return f"{value:.{digits}f} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def training_table(runs: Sequence[RunFigures], held_out: Mapping[str, float] | None = None,
                   held_out_label: str = "held-out pass@1 (%)") -> str:
    """The methods side by side (markdown): each ratio with its 90% Wilson interval, the mixed groups
    per 1,000 generated tokens and per rollout second with their 90% Poisson score intervals
    (module docstring), held-out evaluation next to pool success, and what the rollouts cost."""
    k = max((r.pool_samples for r in runs), default=0)
    head = ["method", "effective ratio [90% CI]", "mixed groups / 100 rollouts", "contrastive yield / 100",
            "rollouts per mixed group", "mixed groups / 1k tokens [90% CI]", "contrastive yield / 1k tokens",
            "mixed groups / rollout s [90% CI]", "prefix eff. ratio [90% CI]", "skipped share",
            "gen. tokens / step",
            f"pool success start → end (k={k})", held_out_label, "rollouts (+ warm-up)",
            "prompts opened / step", "rollouts / opened prompt", "predictor root Spearman (out of sample)"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in runs:
        held = (held_out or {}).get(r.method, math.nan)
        cells = [
            r.method, _ratio(r.effective_ratio, r.effective_ratio_interval), _num(r.mixed_per_100_rollouts),
            _num(r.contrastive_yield), _num(r.rollouts_per_mixed_group),
            _rate(r.mixed_per_1k_tokens, r.mixed_per_1k_tokens_interval), _num(r.contrastive_per_1k_tokens, 2),
            _rate(r.mixed_per_rollout_s, r.mixed_per_rollout_s_interval, 3),
            _ratio(r.prefix_effective_ratio, r.prefix_effective_ratio_interval), _num(r.skipped_share, 2),
            _num(r.generated_tokens / r.steps if r.steps else math.nan, 0),
            f"{_num(100 * r.pool_success_start)}% → {_num(100 * r.pool_success_end)}%",
            _num(100 * held if math.isfinite(held) else math.nan),
            f"{r.rollouts} (+ {r.warmup_rollouts})",
            _num(r.opened_per_step), _num(r.rollouts_per_opened_prompt), _num(r.predictor_spearman, 2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def training_reading(runs: Sequence[RunFigures], reference: str = "grpo") -> str:
    """The table in words, one line per method against ``reference``: how many prompts it opened
    and how wide, what share showed both outcomes (the effective ratio is per opened prompt), and
    what that came to per rollout and per 1,000 generated tokens — the trade-off the methods make
    differently (a method whose continuations generate only the rest of an episode pays fewer
    tokens per rollout)."""
    base = next((r for r in runs if r.method == reference), None)
    lines = []
    for r in runs:
        line = (f"- {r.method}: opened {_num(r.opened_per_step)} prompts a step with "
                f"{_num(r.rollouts_per_opened_prompt)} rollouts each; {_num(100 * r.effective_ratio, 0)}% of them "
                f"showed both outcomes, {_num(r.mixed_per_100_rollouts)} mixed groups per 100 rollouts and "
                f"{_num(r.mixed_per_1k_tokens, 2)} per 1,000 generated tokens")
        if base is not None and r is not base and base.effective_ratio > 0 and base.mixed_per_100_rollouts > 0:
            line += (f" ({r.effective_ratio / base.effective_ratio:.2f}× {reference}'s effective ratio, "
                     f"{r.mixed_per_100_rollouts / base.mixed_per_100_rollouts:.2f}× its mixed groups per rollout")
            if base.mixed_per_1k_tokens > 0 and math.isfinite(r.mixed_per_1k_tokens):
                line += f", {r.mixed_per_1k_tokens / base.mixed_per_1k_tokens:.2f}× per generated token"
            line += ")"
        lines.append(line + ".")
    return "\n".join(lines)
