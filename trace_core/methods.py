"""The method registry: a named method is its rules (:mod:`trace_core.allocation`), and every caller —
the trainer's executor, the planner, the simulator, the TRL plug-in — takes them from here.

Beside the method §4 baselines, the registry holds methods whose root rule remembers prompts across
steps (GRESO, the posterior-aware TRACE roots, VIP, Knapsack-RL), those whose group filter samples in
rounds (DAPO's dynamic sampling, with GRESO's skip filter in front of it), ``trace-tokens``, whose
step is priced in generated tokens (method §10, :mod:`trace_core.token_budget`), and ``arpo``, whose
prefix rule reads the entropy of the policy's tokens after each tool result. Each rule is a field of
:class:`Method`, as are method §5's root exploration and the advantage estimator the method trains
with; nothing reads a method's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trace_core.advantages import AdvantageEstimator, get_advantage_estimator
from trace_core.allocation.checks import as_probabilities
from trace_core.allocation.roots import explore_roots
from trace_core.allocation.rounds import (
    DynamicSampling,
    DynamicSamplingConfig,
    RoundRule,
    SampledRounds,
    next_checked_round,
)
from trace_core.allocation.rules import (
    AnchorSignals,
    ArpoPrefixes,
    CandidateFilter,
    EntropyReader,
    GresoRoots,
    PosteriorRoots,
    PrefixPlacement,
    PrefixRule,
    RootRule,
    TokenRule,
    prefixes_random,
    prefixes_trace,
    roots_pcl,
    roots_trace,
    roots_uniform,
    roots_uniform_all,
)
from trace_core.allocation.spec import BudgetSpec
from trace_core.history import HistoryView
from trace_core.knapsack import KnapsackRoots
from trace_core.token_budget import TOKEN_PRICED, OneBudget, TokenPricedRoots, prefixes_token_priced
from trace_core.vip import VipRoots


@dataclass(frozen=True)
class Method:
    """A named method: every rule a training step (the trainer's or the simulator's) takes from it.

    Its rules are its fields, never something read off its name: a caller asks
    ``method.explores_roots``, not whether the name starts with "trace". A step takes from it

    - the roots: ``root_rule``, one :class:`RootRule` whether or not it keeps state across steps
      (``root_rule.reads_history``: the caller then hands it each candidate's earlier outcomes, a
      :class:`~trace_core.history.HistoryView` of its :class:`~trace_core.history.PromptHistory`),
      then method §5's exploration where ``explores_roots`` (:meth:`allocate_roots`);
    - or, with a ``group_filter``, bare rollouts in rounds until that filter has its groups, and
      only the groups it keeps trained on (a caller that cannot sample in rounds uses
      ``root_rule``, every round at once); the rounds draw only from the candidates that pass the
      ``candidate_filter`` where there is one (:meth:`round_candidates`: GRESO in front of dynamic
      sampling);
    - the prefixes: ``prefix_rule`` (None: no expansion);
    - or, with a ``token_rule``, both stages under a budget of generated tokens (method §10): the
      trajectory slots of such a method refuse (:class:`TokenPricedRoots`), and a caller plans its
      step with ``token_rule.plan`` and ``token_rule.spend`` (``prices_tokens``);
    - the advantages: ``default_advantage``, unless the run names another estimator
      (:meth:`advantage_estimator`)."""

    name: str
    root_rule: RootRule
    prefix_rule: PrefixRule | None
    description: str
    # method §5's explore_fraction (random skipped prompts at m = 2) applies to this method's roots:
    # TRACE's root rule skips prompts by prediction, and a skipped prompt gets no target, so a
    # confident wrong prediction is never corrected. Uniform root rules skip nobody by prediction;
    # PCL is run as published, without exploration.
    explores_roots: bool = False
    # Either rule reads the success predictor's scores (PCL and TRACE's roots, TRACE's prefixes):
    # such a method is worth fitting the predictor for before RL (a warm-up); the others ignore it.
    uses_predictor: bool = False
    # The group filter (DAPO's dynamic sampling), which also schedules the bare rollouts in rounds
    # until enough groups pass it; None: the roots come at once and every group is trained on. A
    # method with one does not expand.
    group_filter: RoundRule | None = None
    # A pre-rollout filter of the candidates the rounds may sample (GRESO's skip filter), decided
    # once a step before the first round; None: every candidate. Only with a group_filter.
    candidate_filter: CandidateFilter | None = None
    # The advantage estimator it trains with (a name of trace_core.advantages' registry) unless the
    # run names another: method §6's tree advantage for every method, so that methods differ by
    # what they sample, not by how they score it (TreePO's own advantage stays an option).
    default_advantage: str = "tree"
    # The rule that prices the method's step in generated tokens (method §10): its roots, each
    # prompt's reservation and its stage 2 under BudgetSpec.tokens_per_step; None: a method of the
    # trajectory budget, whose rules are the fields above.
    token_rule: TokenRule | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.root_rule, RootRule):
            raise TypeError(f"method {self.name!r}: root_rule {self.root_rule!r} is no RootRule (it needs "
                            "reads_history; wrap a plain (v, spec, rng) function in StatelessRoots)")
        if self.group_filter is not None and self.prefix_rule is not None:
            raise ValueError(f"method {self.name!r}: a group filter samples bare groups only; it cannot expand")
        if self.candidate_filter is not None:
            if self.group_filter is None:
                raise ValueError(f"method {self.name!r}: a candidate filter stands in front of rounds; it needs "
                                 "a group_filter")
            if not isinstance(self.candidate_filter, CandidateFilter):
                raise TypeError(f"method {self.name!r}: candidate_filter {self.candidate_filter!r} is no "
                                "CandidateFilter (it needs reads_history and keep)")
        if self.token_rule is not None:
            if not isinstance(self.token_rule, TokenRule):
                raise TypeError(f"method {self.name!r}: token_rule {self.token_rule!r} is no TokenRule (it needs "
                                "plan and spend)")
            if self.group_filter is not None:
                raise ValueError(f"method {self.name!r}: a token-priced method plans its step at once; it "
                                 "cannot sample in rounds")
        try:
            get_advantage_estimator(self.default_advantage)
        except ValueError as err:
            raise ValueError(f"method {self.name!r}: default_advantage: {err}") from None

    @property
    def expands(self) -> bool:
        return self.prefix_rule is not None

    @property
    def entropy_window(self) -> int | None:
        """The window (tokens after a tool result) over which the prefix rule reads entropy, when it
        is an :class:`EntropyReader` (ARPO); None for a rule that reads no entropy."""
        return int(self.prefix_rule.entropy_window) if isinstance(self.prefix_rule, EntropyReader) else None

    @property
    def reads_entropy(self) -> bool:
        """Whether the prefix rule reads the entropy of the policy's tokens (a caller without tokens
        and log-probs, the simulator, cannot run it)."""
        return self.entropy_window is not None

    @property
    def prices_tokens(self) -> bool:
        """Whether the method's step is planned in generated tokens (``token_rule``); its trajectory
        rules then refuse."""
        return self.token_rule is not None

    @property
    def reads_history(self) -> bool:
        """Whether the roots (or the pre-rollout filter of its rounds) read the candidates' history:
        pass ``history`` to allocate_roots and round_candidates."""
        return bool(self.root_rule.reads_history) or bool(
            self.candidate_filter is not None and self.candidate_filter.reads_history)

    def round_candidates(
        self, v: object, spec: BudgetSpec, rng: np.random.Generator, history: HistoryView | None = None
    ) -> np.ndarray:
        """bool (B,): the candidates this step's rounds may sample — those the ``candidate_filter``
        keeps (one decision per step, before the first round), or all of them without one."""
        v = as_probabilities(v, "v")
        if self.candidate_filter is None:
            return np.ones(v.shape[0], dtype=bool)
        keep = np.asarray(self.candidate_filter.keep(v, spec, rng, history), dtype=bool)
        if keep.shape != v.shape:
            raise ValueError(f"{self.name}: the candidate filter returned shape {keep.shape} for "
                             f"{v.shape[0]} candidates")
        return keep

    @property
    def samples_in_rounds(self) -> bool:
        """Whether the roots come in rounds, for the group filter (run them with its ``next_round``)."""
        return self.group_filter is not None

    def allocate_roots(
        self, v: object, spec: BudgetSpec, rng: np.random.Generator, history: HistoryView | None = None,
        explore_fraction: float = 0.0,
    ) -> np.ndarray:
        """The step's bare rollouts per candidate. ``history`` (one row per candidate) is read by a
        rule that reads history and ignored otherwise; without it such a rule sees an empty history.
        ``explore_fraction`` (method §5) re-splits the roots with :func:`explore_roots` when the
        method explores, and is ignored otherwise: the explored prompts get 2 rollouts each and the
        method's own root rule re-splits the rest of the budget over the other prompts (their rows
        of ``history`` included), so a posterior rule keeps its posterior."""
        v = as_probabilities(v, "v")
        if self.prices_tokens:
            raise ValueError(f"method {self.name!r}: {TOKEN_PRICED}")
        m = self.root_rule(v, spec, rng, history)
        expected = spec.roots_M if self.expands else spec.total
        if int(m.sum()) != expected:  # a loud guard on the equal-cost contract
            raise AssertionError(f"{self.name}: root allocation spends {int(m.sum())}, expected {expected}")
        if explore_fraction > 0 and self.explores_roots:
            def own_rule(rest: np.ndarray, budget: int) -> np.ndarray:
                view = None if history is None else history.take(rest)
                return self.root_rule(v[rest], spec, rng, view, budget=budget)

            m = explore_roots(m, v, explore_fraction, rng, spec.max_per_prompt, reallocate=own_rule)
        return m

    def advantage_estimator(self, name: str | None = None) -> AdvantageEstimator:
        """The estimator registered as ``name``, or the method's ``default_advantage`` when None."""
        return get_advantage_estimator(self.default_advantage if name is None else name)

    def prefix_budget(self, m_i: int, expansion_N: int) -> int:
        """Method §3's prefix budget of a prompt given ``m_i`` bare rollouts: ``m_i·N``
        continuations for a method that expands, none for one that does not."""
        if self.prices_tokens:
            raise ValueError(f"method {self.name!r}: {TOKEN_PRICED}")
        return int(m_i) * int(expansion_N) if self.expands else 0

    def check_planned(self, spec: BudgetSpec, planned: int) -> None:
        """The equal-budget contract of method §4: a step planned in trajectory slots spends
        exactly ``spec.total``. A method sampling in rounds spends what its rounds sample (within
        its rule's limits) and a token-priced one what its token budget buys, so neither is held
        to it. AssertionError otherwise: a loud guard, not a condition to handle."""
        if planned != spec.total and not (self.samples_in_rounds or self.prices_tokens):
            raise AssertionError(f"{self.name}: spends {planned} != {spec.total}")

    def place_prefixes(self, anchors: AnchorSignals, budget: int, rng: np.random.Generator) -> PrefixPlacement:
        """Where one prompt's prefix ``budget`` goes, once its bare rollouts are done: over its
        anchors by the prefix rule (``anchors``: the signals of each), or — a prompt whose rollouts
        left no anchor (all one turn long) — all of it as more rollouts from the root, the depth-0
        anchor (method §3). A rule may itself send part of the budget to the root (ARPO's global
        fill: it returns a :class:`PrefixPlacement`). The executor and the simulator both place
        their continuations here. AssertionError if the rule does not spend exactly ``budget``."""
        n_anchors = anchors.size
        if budget and n_anchors == 0:
            return PrefixPlacement(np.zeros(0, dtype=np.int64), int(budget))
        if self.prefix_rule is None:
            if budget:
                raise ValueError(f"method {self.name!r} does not expand prefixes but got budget {budget}")
            return PrefixPlacement(np.zeros(n_anchors, dtype=np.int64), 0)
        out = self.prefix_rule(anchors, int(budget), rng)
        placement = out if isinstance(out, PrefixPlacement) else PrefixPlacement(np.asarray(out, dtype=np.int64), 0)
        K = np.asarray(placement.K, dtype=np.int64)
        if K.shape != (n_anchors,) or np.any(K < 0) or placement.extra_roots < 0:
            raise ValueError(f"{self.name}: the prefix rule placed K of shape {K.shape} (extra "
                             f"{placement.extra_roots}) for {n_anchors} anchors: one count >= 0 per anchor")
        spent = int(K.sum()) + int(placement.extra_roots)
        if spent != int(budget):
            raise AssertionError(f"{self.name}: prefix allocation spent {spent} of {int(budget)}")
        return PrefixPlacement(K, int(placement.extra_roots))


def sample_in_rounds(
    method: Method, v: np.ndarray, spec: BudgetSpec, rng: np.random.Generator,
    roll: Callable[[np.ndarray], np.ndarray], history: HistoryView | None = None,
) -> SampledRounds:
    """A method's bare groups in rounds, the one loop the trainer's executor and the simulator run:
    the pre-rollout filter once (:meth:`Method.round_candidates`, reading ``history``), then round
    after round the group filter's next round (:func:`next_checked_round`), each rolled out by
    ``roll`` before the next is chosen, until the rule stops; then the filter's keep decision over
    every sampled group in sampling order. ``roll(m_r)`` rolls out one round (``m_r``: rollouts per
    candidate) and returns whether each of its groups is mixed, in candidate order (the order of
    ``np.flatnonzero(m_r)``)."""
    rule = method.group_filter
    if rule is None:
        raise ValueError(f"method {method.name!r} has no round rule: it samples its roots at once")
    v = np.asarray(v, dtype=np.float64)
    eligible = method.round_candidates(v, spec, rng, history)
    m = np.zeros(v.shape[0], dtype=np.int64)
    order: list[np.ndarray] = []
    flags: list[np.ndarray] = []
    mixed = rounds = 0
    while True:
        m_r = next_checked_round(rule, v, m, mixed, rounds, spec, rng, eligible)
        if not m_r.any():
            break
        sampled = np.flatnonzero(m_r)
        round_mixed = np.asarray(roll(m_r), dtype=bool)
        if round_mixed.shape != sampled.shape:
            raise ValueError(f"a round of {sampled.size} groups rolled out {round_mixed.size} mixed flags")
        mixed += int(round_mixed.sum())
        order.append(sampled)
        flags.append(round_mixed)
        m += m_r
        rounds += 1
    order_all = np.concatenate(order) if order else np.zeros(0, dtype=np.int64)
    mixed_all = np.concatenate(flags) if flags else np.zeros(0, dtype=bool)
    kept = np.asarray(rule.keep_groups(mixed_all, spec), dtype=bool)
    if kept.shape != mixed_all.shape:
        raise ValueError(f"keep_groups returned shape {kept.shape} for {mixed_all.size} groups")
    return SampledRounds(m, order_all, mixed_all, kept, rounds)


METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    if method.name in METHODS:
        raise ValueError(f"allocation method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown allocation method {name!r}; known: {', '.join(sorted(METHODS))}") from None


register_method(Method("grpo", roots_uniform_all, None, "uniform: M(1+N)/G random prompts × G, no expansion"))
register_method(Method("pcl", roots_pcl, None, "M(1+N)/G prompts with v nearest 0.5 × G, no expansion",
                       uses_predictor=True))
register_method(Method("treepo", roots_uniform, prefixes_random, "M/G random prompts × G; random anchors"))
register_method(Method("trace", roots_trace, prefixes_trace, "exact method §2 roots; exact method §3 prefixes",
                       explores_roots=True, uses_predictor=True))
register_method(Method("trace-root-only", roots_trace, prefixes_random, "exact method §2 roots; random anchors",
                       explores_roots=True, uses_predictor=True))
register_method(Method("trace-prefix-only", roots_uniform, prefixes_trace, "M/G random prompts × G; exact §3",
                       uses_predictor=True))
_GRESO = GresoRoots()
register_method(Method("greso", _GRESO, None,
                       "GRESO as its authors run it: its adaptive pre-rollout skip filter in front of dynamic "
                       "sampling (first round 1.5·M(1+N)/G prompts × G, later ones sized from the shortfall, "
                       "until M(1+N)/G mixed groups); one-outcome groups dropped",
                       group_filter=DynamicSampling(DynamicSamplingConfig(
                           target_fraction=1.0, round_fraction=1.5, max_rounds=0, refill_margin=1.25,
                           min_round_fraction=0.25)),
                       candidate_filter=_GRESO))
register_method(Method("dapo", roots_uniform_all, None,
                       "DAPO dynamic sampling as its authors run it: rounds of 3·M(1+N)/G random prompts × G "
                       "until M(1+N)/G mixed groups or 10 rounds; one-outcome groups dropped; spends what it "
                       "samples", group_filter=DynamicSampling()))
register_method(Method("dapo-capped", roots_uniform_all, None,
                       "ours: DAPO's dynamic sampling within the equal budget: rounds of M(1+N)/(4G) random "
                       "prompts × G until M(1+N)/(2G) mixed groups or M(1+N) rollouts; one-outcome groups dropped",
                       group_filter=DynamicSampling(DynamicSamplingConfig(
                           target_fraction=0.5, round_fraction=0.25, max_rounds=0, budget_capped=True))))
register_method(Method("trace-posterior", PosteriorRoots(), prefixes_trace,
                       "exact roots on a Beta posterior (predictor prior + own outcomes); exact method §3 prefixes",
                       explores_roots=True, uses_predictor=True))
register_method(Method("trace-posterior-thompson", PosteriorRoots(sample_posterior=True), prefixes_trace,
                       "method §2 roots on one posterior draw per prompt; exact method §3 prefixes",
                       explores_roots=True, uses_predictor=True))
register_method(Method("vip", VipRoots(), None,
                       "VIP: M(1+N)/G random prompts; a GP on recent outcomes predicts success and the budget M(1+N) "
                       "is split between 2 and M_max to minimise the batch's gradient variance", uses_predictor=True))
register_method(Method("knapsack-rl", KnapsackRoots(), None,
                       "Knapsack-RL: M(1+N)/G random prompts; the budget M(1+N) shared by a knapsack over each "
                       "prompt's success rate from its last root group (floor 2, unseen G, the rest of what "
                       "α = 0.9 confidence needs to the never-solved prompts); no expansion"))
register_method(Method("trace-tokens", TokenPricedRoots(), prefixes_token_priced,
                       "method §10: one budget of generated tokens a step; exact roots on quantised costs with a "
                       "reservation for stage 2, then per prompt continuations or more roots by gain per token",
                       uses_predictor=True, token_rule=OneBudget()))
register_method(Method("arpo", roots_uniform, ArpoPrefixes(),
                       "ARPO: M/G random prompts × G global rollouts; m_i·N continuations at the anchors whose "
                       "entropy rose after their tool result (up to Z − 1 = 1 each, turn by turn), the rest as more "
                       "global rollouts; ARPO's soft advantage attribution", default_advantage="arpo-soft"))
