"""The token ledger: what a run priced in generated tokens carries from step to step.

The cost model's state (:mod:`trace_core.costs`: per-prompt and policy-wide discounted lengths, the
learned per-depth continuation correction) and the one-budget rule's calibration
(:class:`~trace_core.token_budget.PrefixCalibration`), updated after each step from what its rollouts
generated (:class:`StepCosts`, built from a step's trees by :func:`tree_step_costs`). The simulator,
the trainer and the TRL plug-in learn their costs by this one rule.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trace_core.costs import (
    CostModel,
    CostState,
    cost_error,
    expected_root_tokens,
    observe,
    observe_continuations,
    remaining_tokens,
)
from trace_core.metrics import SUCCESS_THRESHOLD
from trace_core.token_budget import PrefixCalibration, model_prefix_value
from trace_core.tree import ROOT, RolloutTree


@dataclass(frozen=True)
class StepCosts:
    """What one step generated, beside what the ledger expected of it, for
    :meth:`TokenLedger.after_step`. The simulator and the trainer each build one from their own
    rollouts; the update is this module's, so both learn their costs by one rule."""

    bare_tokens: np.ndarray  # float64 (R,): generated tokens of each bare root rollout
    bare_turns: np.ndarray  # float64 (R,): its turns
    bare_estimate: np.ndarray  # float64 (R,): a root rollout of its prompt's expected tokens, as the step priced it
    bare_prompt_ids: Sequence[Hashable] | None  # (R,): its prompt's id; None: prompts that never recur
    cont_tokens: np.ndarray  # float64 (C,): generated tokens of each continuation from an anchor (not extra roots)
    cont_turn: np.ndarray  # float64 (C,): the turn t of its anchor
    cont_turns: np.ndarray  # float64 (C,): the turns T of the bare rollout through that anchor
    cont_root_estimate: np.ndarray  # float64 (C,): its prompt's root estimate the step used (the linear rule's base)
    cont_estimate: np.ndarray  # float64 (C,): the anchor's expected remaining tokens, as the step priced it
    # A token-priced step's calibration pair (None otherwise): stage 1's model value of the
    # continuations each prompt ran (model_prefix_value), summed, and the expanded anchors whose
    # branch group shows both outcomes.
    prefix_predicted: float | None = None
    prefix_realised: float = 0.0

    def __post_init__(self) -> None:
        R, C = np.shape(self.bare_tokens), np.shape(self.cont_tokens)
        for name in ("bare_turns", "bare_estimate"):
            if np.shape(getattr(self, name)) != R:
                raise ValueError(f"{name} has shape {np.shape(getattr(self, name))}: one per bare rollout {R}")
        if self.bare_prompt_ids is not None and len(self.bare_prompt_ids) != R[0]:
            raise ValueError(f"bare_prompt_ids has {len(self.bare_prompt_ids)} entries: one per bare rollout {R}")
        for name in ("cont_turn", "cont_turns", "cont_root_estimate", "cont_estimate"):
            if np.shape(getattr(self, name)) != C:
                raise ValueError(f"{name} has shape {np.shape(getattr(self, name))}: one per continuation {C}")


COST_FIGURES = ("tokens/root_cost_expected", "tokens/root_cost_realised", "tokens/root_cost_error",
                "tokens/root_cost_bias", "tokens/anchor_cost_expected", "tokens/anchor_cost_realised",
                "tokens/anchor_cost_error", "tokens/anchor_cost_bias")


def _cost_figures(kind: str, estimated: np.ndarray, realised: np.ndarray) -> dict[str, float]:
    """``tokens/{kind}_cost_*`` of :data:`COST_FIGURES`: mean expected and realised tokens a rollout,
    the mean relative error and its sign (a realised 0 counted as 1)."""
    err = cost_error(estimated, np.maximum(realised, 1))
    return {f"tokens/{kind}_cost_expected": float(np.mean(estimated)),
            f"tokens/{kind}_cost_realised": float(np.mean(realised)),
            f"tokens/{kind}_cost_error": err.mean_relative, f"tokens/{kind}_cost_bias": err.bias}


@dataclass(frozen=True)
class TokenLedger:
    """What the token budget carries from step to step, immutable: the cost model and its state
    (:mod:`trace_core.costs`: per-prompt and policy-wide discounted lengths, the learned per-depth
    continuation correction) and the one-budget rule's calibration (:class:`PrefixCalibration`).
    :meth:`after_step` returns the next one; a trainer checkpoints :meth:`to_dict`."""

    cost_model: CostModel
    costs: CostState = field(default_factory=CostState)
    calibration: PrefixCalibration = PrefixCalibration()

    def after_step(self, step: StepCosts) -> tuple[TokenLedger, dict[str, float]]:
        """The ledger after a step, and the cost estimates' figures against what it generated
        (:data:`COST_FIGURES`: mean expected and realised tokens a rollout, the mean relative
        error and its sign — NaN where the step had no such rollout — and ``tokens/rho`` after a
        token-priced step).

        The costs observe the bare rollouts (tokens and turns, per prompt where prompts recur) and
        the continuations from anchors (realised tokens against the linear rule's prediction from
        the root estimate the step used); a token-priced step's calibration adds its predicted and
        realised prefix value. A realised length of 0 tokens counts as 1 in the relative error."""
        model, costs = self.cost_model, self.costs
        t = costs.step + 1
        figures = dict.fromkeys(COST_FIGURES, float("nan"))
        bare_tokens = np.asarray(step.bare_tokens, dtype=np.float64)
        if bare_tokens.size:
            figures.update(_cost_figures("root", step.bare_estimate, bare_tokens))
            costs = observe(costs, model, t, bare_tokens, step.bare_turns, step.bare_prompt_ids)
        cont_tokens = np.asarray(step.cont_tokens, dtype=np.float64)
        if cont_tokens.size:
            figures.update(_cost_figures("anchor", step.cont_estimate, cont_tokens))
            turn = np.asarray(step.cont_turn, dtype=np.float64)
            turns = np.asarray(step.cont_turns, dtype=np.float64)
            linear = np.asarray(step.cont_root_estimate, dtype=np.float64) * (1.0 - turn / turns)
            costs = observe_continuations(costs, model, t, turn, turns, linear, cont_tokens)
        calibration = self.calibration
        if step.prefix_predicted is not None:
            calibration = calibration.observe(step.prefix_predicted, step.prefix_realised)
            figures["tokens/rho"] = calibration.rho
        return TokenLedger(model, costs, calibration), figures

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of the state (the cost model is configuration, not state: not included)."""
        return {"costs": self.costs.to_dict(), "calibration": self.calibration.to_dict()}

    @classmethod
    def from_dict(cls, cost_model: CostModel, data: dict[str, Any]) -> TokenLedger:
        """The ledger :meth:`to_dict` described, under ``cost_model``."""
        return cls(cost_model, CostState.from_dict(data["costs"]), PrefixCalibration.from_dict(data["calibration"]))


def tree_step_costs(
    trees: Sequence[RolloutTree], ledger: TokenLedger, root_estimate: Mapping[str, float],
    root_p: Mapping[str, float] | None = None,
) -> StepCosts:
    """A step's :class:`StepCosts` read off its trees (the trainer's rollouts): every bare
    rollout's generated tokens and turns, and every continuation from an anchor's (a further root
    rollout — a continuation from the root — is neither: it is priced as a root and observed as
    none, since it is no independent draw of the prompt's length once the allocator chose to run
    it). ``root_estimate``: the expected tokens of a root rollout of each tree's prompt, as the
    step priced it; an anchor's estimate is :func:`~trace_core.costs.remaining_tokens` from the
    ``ledger`` the step read. ``root_p``: a token-priced step's root predictions — its calibration
    pair is computed (the stage-1 model's value of the continuations each prompt ran, and its
    expanded anchors whose branch group shows both outcomes); None for any other step."""
    bare_tokens, bare_turns, bare_est, bare_ids = [], [], [], []
    c_tokens, c_turn, c_turns, c_root = [], [], [], []
    predicted = 0.0 if root_p is not None else None
    realised = 0.0
    for tree in trees:
        est = float(root_estimate[tree.prompt_id])
        per_anchor: dict[int, list[int]] = {}
        for traj in tree.trajectories:
            generated = sum(sum(tree.nodes[n].loss_mask) for n in traj.nodes)
            if traj.kind == "bare":
                bare_tokens.append(generated)
                bare_turns.append(tree.nodes[traj.nodes[-1]].depth)
                bare_est.append(est)
                bare_ids.append(tree.prompt_id)
            elif traj.branch_node != ROOT:
                c_tokens.append(generated)
                c_turn.append(tree.nodes[traj.branch_node].depth)
                c_turns.append(tree.bare_length(traj.branch_node))
                c_root.append(est)
                per_anchor.setdefault(traj.branch_node, []).append(traj.id)
        if root_p is not None:
            for anchor, conts in per_anchor.items():
                outcomes = [tree.trajectory_reward(t) > SUCCESS_THRESHOLD
                            for t in [tree.nodes[anchor].trajectory, *conts]]
                realised += float(min(outcomes) != max(outcomes))
            n_cont = float(sum(len(c) for c in per_anchor.values()))
            v = np.array([float(root_p[tree.prompt_id])])
            predicted += float(model_prefix_value(v, np.array([float(len(tree.anchors()))]), np.array([n_cont]))[0])
    c_root_arr, c_turn_arr, c_turns_arr = (np.asarray(x, dtype=np.float64) for x in (c_root, c_turn, c_turns))
    cont_estimate = (remaining_tokens(ledger.costs, ledger.cost_model, c_root_arr, c_turn_arr, c_turns_arr)
                     if c_root else np.zeros(0))
    bare_arrays = (np.asarray(x, dtype=np.float64) for x in (bare_tokens, bare_turns, bare_est))
    return StepCosts(
        *bare_arrays, bare_prompt_ids=bare_ids,
        cont_tokens=np.asarray(c_tokens, dtype=np.float64), cont_turn=c_turn_arr, cont_turns=c_turns_arr,
        cont_root_estimate=c_root_arr, cont_estimate=cont_estimate,
        prefix_predicted=predicted, prefix_realised=realised,
    )


def ledger_after_rollouts(ledger: TokenLedger, trees: Sequence[RolloutTree]) -> tuple[TokenLedger, dict[str, float]]:
    """The ledger after rollouts of the same policy made outside a training step — the predictor
    warm-up's bare rollouts, before step 0 — and its cost figures against them. Without them a
    run's first token-priced step plans at ``initial_tokens``, a guess that may be several times
    the policy's real length (the step then buys far fewer rollouts than the budget allows); with
    them it plans at the policy's measured mean. They count as one step of the ledger, priced at
    its estimates before them; their prompts are not the training pool's, so only the policy's
    mean (the fallback for every unseen prompt) carries over to the pool."""
    ids = [t.prompt_id for t in trees]
    estimate = expected_root_tokens(ledger.costs, ledger.cost_model, ids)
    return ledger.after_step(tree_step_costs(trees, ledger, dict(zip(ids, estimate.tolist(), strict=True))))
