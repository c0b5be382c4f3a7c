"""One step's decisions, in one place: :class:`StepPlanner`.

A training step of any method makes the same few decisions, whoever rolls out (our trainer with a
real engine, the simulator with synthetic paths, a TRL or verl plug-in):

1. **the roots** of a candidate pool (:meth:`StepPlanner.plan_roots`): the method's root rule on
   the predictor's scores (reading the prompts' history where the rule reads one, then method §5's
   exploration); under a budget of generated tokens, a token-priced method's stage 1 (roots and
   each prompt's reservation) or, for a uniform method, as many groups of ``G`` as the budget buys
   at the expected costs;
2. **each prompt's expansion** once its bare rollouts end: ``m_i·N`` continuations placed by the
   method's prefix rule (:meth:`StepPlanner.prefix_budget`), or, for a token-priced method, the
   prompt's token allowance spent by its stage 2 (:meth:`TokenAllowance.allowance`);
3. **what the step teaches the next one** (:meth:`StepPlanner.record_root_outcomes`,
   :meth:`StepPlanner.observe_costs`): the bare root outcomes into the prompt history and the
   realised lengths into the token ledger; a checkpoint keeps both (:meth:`StepPlanner.state_dict`).

The predictor is the caller's: the trainer's reads token histories, the simulator's reads
synthetic features, and each caller scores and updates it with its own data. The planner holds no
model and no engine; its inputs and outputs are numpy arrays and typed values.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trace_core.allocation import BudgetSpec
from trace_core.costs import expected_anchor_fraction, expected_root_tokens, expected_turns, remaining_tokens
from trace_core.history import HistoryView, PromptHistory
from trace_core.methods import Method
from trace_core.metrics import is_success
from trace_core.token_budget import TokenPlan, uniform_spec_for_tokens
from trace_core.token_ledger import StepCosts, TokenLedger, ledger_after_rollouts, tree_step_costs
from trace_core.tree import RolloutTree

PromptIds = Sequence[Hashable] | np.ndarray


@dataclass(frozen=True)
class TokenAllowance:
    """What a token-priced step's stage 2 needs from its stage 1 (method §10), one entry per
    candidate: each prompt's allowance is ``reserved[i] + root_cost[i]·m_i −`` its bare rollouts'
    realised tokens."""

    reserved: np.ndarray  # float64 (tasks,): stage 1's reservation of each task (TokenPlan.reserved)
    root_cost: np.ndarray  # float64 (tasks,): the expected tokens of one root rollout of each task
    root_p: np.ndarray  # float64 (tasks,): the root prediction of each task (stage 1's v)
    ledger: TokenLedger  # the run's costs before the step: an anchor's expected remaining tokens

    def __post_init__(self) -> None:
        shapes = {np.shape(self.reserved), np.shape(self.root_cost), np.shape(self.root_p)}
        if len(shapes) != 1 or len(next(iter(shapes))) != 1:
            raise ValueError(f"reserved, root_cost and root_p need one entry per task each, got shapes {shapes}")
        if np.any(~np.isfinite(self.root_cost) | (np.asarray(self.root_cost) <= 0)):
            raise ValueError("root_cost must be finite and > 0: a root rollout's expected tokens")

    def allowance(self, i: int, m_i: int, realised_tokens: float) -> float:
        """Prompt ``i``'s stage-2 allowance: its reservation, plus what its ``m_i`` roots were
        expected to cost, less what they did cost (a prompt whose roots ran short spends the rest
        on its prefixes; one whose roots ran long has less)."""
        return float(self.reserved[i]) + float(self.root_cost[i]) * int(m_i) - float(realised_tokens)

    def anchor_cost(self, i: int, turn: np.ndarray, turns: np.ndarray) -> np.ndarray:
        """float64 (anchors,): the expected tokens of one continuation of prompt ``i`` from each
        anchor at depth ``turn`` of a rollout of ``turns`` turns."""
        turn = np.asarray(turn)
        return remaining_tokens(self.ledger.costs, self.ledger.cost_model, np.full(turn.shape[0], self.root_cost[i]),
                                turn, np.asarray(turns))


@dataclass(frozen=True)
class RootPlan:
    """Stage 1 of a step (:meth:`StepPlanner.plan_roots`), one entry per candidate in pool order."""

    m: np.ndarray  # int64 (B,): bare rollouts per candidate
    spec: BudgetSpec  # the budget the step spends: a uniform method at a token budget, the groups it buys
    root_cost: np.ndarray  # float64 (B,): the expected generated tokens of one root rollout of each
    token_plan: TokenPlan | None = None  # a token-priced method's stage 1 (its reservations); None otherwise
    tokens: TokenAllowance | None = None  # a token-priced method's stage-2 inputs; None otherwise


class StepPlanner:
    """A run's step decisions and the state they carry from step to step (the prompt history and
    the token ledger). Build one per run; call :meth:`plan_roots` (or :meth:`history_view` for a
    method that samples in rounds), :meth:`prefix_budget` or the plan's :class:`TokenAllowance`
    per prompt, then :meth:`record_root_outcomes` and :meth:`observe_costs` once the step's trees
    are in."""

    def __init__(self, method: Method, spec: BudgetSpec, ledger: TokenLedger, history: PromptHistory | None = None,
                 explore_fraction: float = 0.0) -> None:
        if method.prices_tokens and not spec.prices_tokens:
            raise ValueError(f"method {method.name!r} prices its step in generated tokens: the budget needs "
                             "tokens_per_step")
        if spec.prices_tokens and not method.prices_tokens and (method.expands or method.group_filter is not None):
            raise ValueError(f"method {method.name!r}: under a token budget a method is token-priced, or has no "
                             "expansion or rounds (as many groups of G as the budget buys)")
        self.method = method
        self.spec = spec
        self.ledger = ledger  # the costs as they stand before the next step's rollouts
        self.history = history  # the run's per-prompt root outcomes (None: prompts never recur)
        self.explore_fraction = float(explore_fraction)

    # ------------------------------------------------------------------ stage 1
    def history_view(self, ids: PromptIds | None, step: int) -> HistoryView | None:
        """The candidates' history for a root rule that reads one (None for every other rule)."""
        if self.history is None or ids is None or not self.method.reads_history:
            return None
        return self.history.view(ids, step)

    def root_costs(self, ids: PromptIds | None, n: int | None = None) -> np.ndarray:
        """float64 (B,): the expected generated tokens of one root rollout of each candidate (``ids``
        None: ``n`` fresh prompts, priced at the policy's mean)."""
        return expected_root_tokens(self.ledger.costs, self.ledger.cost_model, ids, n=n)

    def plan_roots(self, v: np.ndarray, ids: PromptIds | None, step: int, rng: np.random.Generator) -> RootPlan:
        """The step's bare rollouts per candidate (``v``: the predictor's root scores, ``ids``: the
        candidates' prompt ids, None for fresh prompts that never recur). A method that samples in
        rounds chooses its roots round by round instead (its caller runs the rounds with
        :meth:`history_view`). ValueError when a token budget buys no group."""
        v = np.asarray(v, dtype=np.float64)
        B = v.shape[0]
        root_cost = self.root_costs(ids, n=B)
        spec = self.spec
        if self.method.prices_tokens:  # stage 1 in tokens: the roots and each prompt's reservation
            costs, model = self.ledger.costs, self.ledger.cost_model
            turns = expected_turns(costs, model, ids, n=B)
            fraction = expected_anchor_fraction(costs, model, turns)
            plan = self.method.token_rule.plan(v, root_cost, turns, fraction, spec, self.ledger.calibration.rho)
            m = np.asarray(plan.m, dtype=np.int64)
            if not m.any():
                raise ValueError(f"step {step}: budget.tokens_per_step = {spec.tokens_per_step} buys no group of 2 "
                                 f"rollouts at the expected {float(root_cost.min()):.0f}+ generated tokens a "
                                 "rollout: raise it")
            tokens = TokenAllowance(plan.reserved.astype(np.float64), root_cost, v, self.ledger)
            return RootPlan(m, spec, root_cost, plan, tokens)
        if spec.prices_tokens:  # a uniform method at equal tokens: the groups of G the budget buys
            spec = uniform_spec_for_tokens(spec, root_cost)
        return RootPlan(self.allocate(v, ids, step, spec, rng), spec, root_cost)

    def allocate(self, v: np.ndarray, ids: PromptIds | None, step: int, spec: BudgetSpec,
                 rng: np.random.Generator) -> np.ndarray:
        """int64 (B,): the method's root rule under ``spec``, reading the candidates' history where
        the rule reads one, then ``explore_fraction`` where the method explores."""
        return np.asarray(self.method.allocate_roots(v, spec, rng, history=self.history_view(ids, step),
                                                     explore_fraction=self.explore_fraction), dtype=np.int64)

    # ------------------------------------------------------------------ stage 2
    def prefix_budget(self, m_i: int) -> int:
        """Method §3's continuations for a prompt of ``m_i`` bare rollouts (0 for a token-priced
        method: it spends its :class:`TokenAllowance` instead)."""
        if self.method.prices_tokens:
            return 0
        return int(self.method.prefix_budget(int(m_i), self.spec.expansion_N))

    def token_figures(self, plan: RootPlan, extra_roots: int) -> dict[str, float]:
        """A token-priced step's ``tokens/*`` figures (none for any other plan)."""
        p = plan.token_plan
        if p is None:
            return {}
        return {"tokens/budget": float(self.spec.tokens_per_step), "tokens/reservation_share": p.reservation_share,
                "tokens/reserved": float(p.reserved.sum()), "tokens/planned_root_tokens": p.root_tokens,
                "tokens/predicted_prefix_value": p.prefix_value, "tokens/extra_roots": float(extra_roots)}

    # ------------------------------------------------------------------ after the step
    def record_root_outcomes(self, step: int, ids: PromptIds, bare_rewards: Sequence[np.ndarray],
                             predictions: np.ndarray) -> None:
        """Each sampled prompt's bare root rewards of ``step`` (successes by
        :func:`~trace_core.metrics.is_success`) with the root prediction the allocator used, into
        the history. Continuations are not recorded: they start where prediction and outcome were
        expected to disagree, so they are no independent draw of the prompt."""
        if self.history is None:
            return
        wins = np.array([int(is_success(r).sum()) for r in bare_rewards], dtype=np.int64)
        sizes = np.array([np.size(r) for r in bare_rewards], dtype=np.int64)
        self.history.record(step, ids, wins, sizes - wins, np.asarray(predictions, dtype=np.float64))

    def observe_costs(self, costs: StepCosts) -> dict[str, float]:
        """The ledger after the step's realised lengths; returns the cost estimates' figures."""
        self.ledger, figures = self.ledger.after_step(costs)
        return figures

    def observe_trees(self, step: int, trees: Sequence[RolloutTree], root_cost: Mapping[str, float],
                      root_pred: Mapping[str, float], plan: RootPlan | None = None) -> dict[str, float]:
        """After a step that rolled out as trees (a real engine's): each tree's bare root outcomes
        into the history and every rollout's realised length into the ledger. ``root_cost`` and
        ``root_pred``: the expected root tokens and root prediction each tree's prompt was planned
        at; ``plan``: the step's plan (a token-priced one also calibrates its prefix value; None
        for a method that samples in rounds). Returns the cost estimates' figures."""
        ids = [t.prompt_id for t in trees]
        rewards = [np.array([t.trajectory_reward(b.id) for b in t.bare_trajectories()], dtype=np.float64)
                   for t in trees]
        self.record_root_outcomes(step, ids, rewards, np.array([root_pred[i] for i in ids], dtype=np.float64))
        token_priced = plan is not None and plan.token_plan is not None
        return self.observe_costs(tree_step_costs(trees, self.ledger, root_cost, root_pred if token_priced else None))

    def observe_rollouts(self, trees: Sequence[RolloutTree]) -> dict[str, float]:
        """The ledger after rollouts of the same policy made outside a step (a predictor warm-up's,
        before step 0: the first step then prices its rollouts at the policy's real lengths, not at
        the first guess); returns the cost estimates' figures against them."""
        self.ledger, figures = ledger_after_rollouts(self.ledger, trees)
        return figures

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the history and the ledger, as JSON-ready values."""
        return {"root_outcomes": None if self.history is None else self.history.to_dict(),
                "token_ledger": self.ledger.to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (a missing part keeps the fresh value)."""
        if state.get("root_outcomes") is not None:
            self.history = PromptHistory.from_dict(state["root_outcomes"])
        if state.get("token_ledger") is not None:
            self.ledger = TokenLedger.from_dict(self.ledger.cost_model, state["token_ledger"])
