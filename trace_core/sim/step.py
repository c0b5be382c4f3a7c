"""One simulated training step: a method's roots, its bare rollouts, its prefixes and their
continuations, the trees they make and the figures the trainer reports of them — every rule taken
from the method and the step planner, as the trainer takes them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trace_core.advantages import AdvantageEstimator
from trace_core.allocation import AnchorSignals, BudgetSpec, SampledRounds
from trace_core.costs import (
    CostModel,
    remaining_tokens,
)
from trace_core.history import HistoryView, PromptHistory
from trace_core.methods import Method, get_method, sample_in_rounds
from trace_core.metrics import (
    allocation_stats,
    is_mixed,
    per_exposure,
    predictor_spearman,
    spearman,
    step_metrics,
    tree_is_mixed,
)
from trace_core.planner import RootPlan, StepPlanner
from trace_core.sim.predictors import (
    HistoryBatch,
    ValuePredictor,
)
from trace_core.sim.world import (
    Paths,
    PersistentPool,
    PromptPool,
    SimConfig,
    draw_turn_tokens,
    expected_rollout_tokens,
    path_tokens,
    sample_prompts,
    simulate_paths,
)
from trace_core.token_budget import model_prefix_value
from trace_core.token_ledger import StepCosts, TokenLedger
from trace_core.tree import ROOT, RolloutTree


# ============================================================================ one step
@dataclass
class StepResult:
    """Everything one simulated step produced. Pool arrays have one entry per candidate prompt
    (shuffled order); anchor arrays one per anchor of the bare rollouts, grouped by prompt."""

    method: str
    trees: list[RolloutTree]  # one per selected prompt (m > 0), in pool order
    tree_prompt: np.ndarray  # int64: pool index of each tree
    pool_m: np.ndarray  # int64 (B,): bare rollouts per pool prompt (0 = skipped)
    pool_pred: np.ndarray  # float64 (B,): predicted root value v (scored before any update)
    pool_value: np.ndarray  # float64 (B,): hidden p0
    root_extra: np.ndarray  # int64 (B,): extra root rollouts of anchorless prompts (method §3)
    anchor_prompt: np.ndarray  # int64 (A,): pool index of the anchor's prompt
    anchor_node: np.ndarray  # int64 (A,): node id in that prompt's tree
    anchor_turn: np.ndarray  # int64 (A,): t
    anchor_position: np.ndarray  # float64 (A,): t / T
    anchor_reward: np.ndarray  # float64 (A,): reward of the bare rollout through the anchor
    anchor_pred: np.ndarray  # float64 (A,): predicted V at the anchor (before any update)
    anchor_value: np.ndarray  # float64 (A,): hidden V_t
    anchor_K: np.ndarray  # int64 (A,): continuations allocated to the anchor
    node_value: list[np.ndarray]  # float64 per tree, one per node: hidden V_t (the root's: p0), never in node.info
    trajectories: int  # finished trajectories in the trees (== spec.total, asserted; a round rule's own spend)
    turns_generated: int  # generated turn nodes: the simulator's stand-in for tokens
    metrics: dict[str, float] = field(default_factory=dict)
    pool_ids: np.ndarray | None = None  # int64 (B,): dataset index of each candidate (persistent pool only)
    tree_kept: np.ndarray | None = None  # bool per tree: the policy trains on it (a round rule's group filter)
    rounds: int = 1  # sampling rounds of the bare rollouts
    pool_success: float = float("nan")  # persistent pool: mean success probability after this step's drift
    generated_tokens: int = 0  # tokens the step generated (bare rollouts and continuations), method §10
    bare_tokens: np.ndarray | None = None  # int64 (R,): generated tokens of each bare rollout, grouped by prompt
    cont_tokens: np.ndarray | None = None  # int64 (C,): generated tokens of each continuation, grouped by prompt
    token_plan: object | None = None  # a token-priced method's stage 1 (trace_core.token_budget.TokenPlan)
    token_ledger: TokenLedger | None = None  # the ledger after this step: pass it to the next one


def sim_token_ledger(config: SimConfig) -> TokenLedger:
    """A fresh :class:`~trace_core.token_ledger.TokenLedger` whose first guesses are the
    configuration's expected rollout tokens and turns."""
    turns = 0.5 * (config.horizon_min + config.horizon_max)
    return TokenLedger(CostModel(initial_tokens=expected_rollout_tokens(config), initial_turns=turns))


def _checked_scores(values: object, n: int, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise ValueError(f"predictor returned shape {arr.shape} for {n} {what} histories")
    if np.any(~np.isfinite(arr) | (arr < 0) | (arr > 1)):
        raise ValueError(f"predictor returned {what} values outside [0, 1] (or NaN)")
    return arr


def _segment_bounds(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.searchsorted(sorted_keys, keys, "left"), np.searchsorted(sorted_keys, keys, "right")


def run_step(
    method: str | Method,
    spec: BudgetSpec,
    predictor: ValuePredictor,
    rng: np.random.Generator,
    config: SimConfig | None = None,
    compute_metrics: bool = True,
    pool: PersistentPool | None = None,
    history: PromptHistory | None = None,
    explore_fraction: float = 0.0,
    ledger: TokenLedger | None = None,
) -> StepResult:
    """One step of method §2–§4 with ``method`` at budget ``spec`` (``spec.total`` trajectories).

    Order: pool → score roots → ``m`` → bare rollouts → score anchors → ``K`` per prompt
    (an anchorless prompt spends ``m_i·N`` on extra root rollouts) → continuations → trees →
    metrics → ``predictor.update(trees)`` → ``history.record`` → ``pool.advance``. Raises
    AssertionError if the trees do not hold exactly ``spec.total`` trajectories (the
    equal-budget contract of method §4); a method that samples in rounds spends what its rounds
    sample, within its own limits (``trajectories`` reports it, and the metrics count it).

    ``pool``: a :class:`PersistentPool` to draw the candidates from (default: fresh i.i.d.
    prompts); ``history``: the run's per-prompt record, read by a root rule that reads history and updated with the
    step's bare root outcomes (persistent pool only: i.i.d. prompts never recur);
    ``explore_fraction``: method §5's root exploration, applied by the methods that explore (as
    the trainer's ``predictor.explore_fraction``; 0: none).

    Generated tokens (method §10): every rollout's tokens are drawn from a generator spawned from
    ``rng`` (so the rest of the step's stream is what it is without them) and reported
    (``generated_tokens``). ``ledger``: the run's :class:`TokenLedger` (default: a fresh one), read
    for the expected costs and returned updated in ``StepResult.token_ledger``. Under a token budget
    (``spec.tokens_per_step``) a token-priced method (``method.prices_tokens``: ``trace-tokens``)
    plans its roots and reservations with its token rule and spends each prompt's allowance — its
    reservation plus its roots' expected cost less their realised cost — with the rule's stage 2;
    a method without expansion or rounds gets as many groups of ``G`` as the budget buys at the
    expected costs (:func:`~trace_core.token_budget.uniform_spec_for_tokens`); other methods are
    refused there.

    Every rule comes from ``method``, as in the trainer: its root rule (with the history where it
    reads one), exploration, its group filter and rounds, its prefix rule and its default advantage estimator; the
    metrics carry the trainer's names (:func:`simulator_metrics`). A method whose prefix rule reads the
    entropy of the policy's tokens (``method.reads_entropy``: ARPO) is refused with a ValueError: the
    synthetic paths have no tokens, and a stand-in signal would be an invention, not ARPO."""
    config = config or SimConfig()
    method = get_method(method) if isinstance(method, str) else method
    if method.reads_entropy:
        raise ValueError(f"method {method.name!r} branches where the entropy of the tokens the policy wrote after a "
                         "tool result rose (its prefix rule reads entropy); the simulator's rollouts are synthetic "
                         "paths without tokens or log-probs, so it cannot run it: run it through the trainer's "
                         "executor (method §4, ARPO)")
    H = config.horizon_max
    B = spec.pool_size
    token_rng = rng.spawn(1)[0]  # generated tokens only: the step's own stream is left as it was
    ledger = ledger or sim_token_ledger(config)
    planner = StepPlanner(method, spec, ledger, history, explore_fraction)

    # ---- candidate pool, shuffled
    prompts, ids, step = _candidates(config, B, pool, history, rng, token_rng)

    # ---- stage 1: roots
    root_batch = HistoryBatch(prompts.feature, np.full((B, H), np.nan), np.zeros(B, dtype=np.int64), prompts.p0)
    v = _checked_scores(predictor.score(root_batch), B, "root")
    rounds, sampled = 1, None
    if method.group_filter is None:
        root_plan = planner.plan_roots(v, ids, step, rng)
        m, spec = root_plan.m, root_plan.spec
    else:  # the pre-rollout filter (where there is one) once, then the rounds over what it kept
        sampled, bare_prompt, bare = _sample_in_rounds(method, v, prompts, spec, config, rng,
                                                       planner.history_view(ids, step))
        m, rounds = sampled.m, sampled.rounds
        root_plan = RootPlan(m, spec, planner.root_costs(ids, n=B))
    root_cost, plan, allowances = root_plan.root_cost, root_plan.token_plan, root_plan.tokens
    model, costs = ledger.cost_model, ledger.costs
    prefix_budget = np.array([planner.prefix_budget(mi) for mi in m.tolist()], dtype=np.int64)
    planned = int(m.sum() + prefix_budget.sum())
    method.check_planned(spec, planned)
    selected = np.flatnonzero(m)

    # ---- bare rollouts, grouped by prompt in pool order
    if method.group_filter is None:
        bare_prompt = np.repeat(selected, m[selected])
        bare = simulate_paths(prompts.p0[bare_prompt], np.zeros(bare_prompt.size, dtype=np.int64),
                              prompts.horizon[bare_prompt], config, rng)
    R = bare_prompt.size
    bare_tokens = path_tokens(prompts.turn_tokens[bare_prompt], np.zeros(R, dtype=np.int64),
                              prompts.horizon[bare_prompt], config, token_rng)

    # ---- anchors: turns 1..T−1 of each bare rollout, scored
    anchors = _anchors(prompts, bare_prompt, bare, H)
    anchor_prompt, anchor_turn, anchor_reward = anchors.prompt, anchors.turn, anchors.reward
    A = anchor_prompt.size
    p = _checked_scores(predictor.score(anchors.histories), A, "anchor")

    # ---- stage 2: prefixes, prompt by prompt (method §3: a prompt needs only its own rollouts)
    K = np.zeros(A, dtype=np.int64)
    root_extra = np.zeros(B, dtype=np.int64)
    lo, hi = _segment_bounds(anchor_prompt, selected)
    anchor_cost = remaining_tokens(costs, model, root_cost[anchor_prompt], anchor_turn, prompts.horizon[anchor_prompt])
    if method.prices_tokens:  # each prompt's allowance: its reservation and what its roots cost less than expected
        b_lo, b_hi = _segment_bounds(bare_prompt, selected)
        realised = np.bincount(bare_prompt, weights=bare_tokens, minlength=B)
        for i, a0, a1, b0, b1 in zip(selected.tolist(), lo.tolist(), hi.tolist(), b_lo.tolist(), b_hi.tolist(),
                                     strict=True):
            allowance = allowances.allowance(i, m[i], realised[i])
            spent_i = method.token_rule.spend(p[a0:a1], anchor_reward[a0:a1], anchor_turn[a0:a1], anchor_cost[a0:a1],
                                              bare.reward[b0:b1], float(v[i]), float(root_cost[i]), allowance)
            K[a0:a1] = spent_i.K
            root_extra[i] = spent_i.extra_roots
        planned = int(m.sum() + K.sum() + root_extra.sum())
    for i, a0, a1 in zip(selected.tolist(), lo.tolist(), hi.tolist(), strict=True):
        budget = int(prefix_budget[i])
        if budget == 0:
            continue
        placement = method.place_prefixes(AnchorSignals(p[a0:a1], anchor_reward[a0:a1], anchor_turn[a0:a1]), budget,
                                          rng)
        K[a0:a1] = placement.K
        root_extra[i] = placement.extra_roots
    spent = int(m.sum() + K.sum() + root_extra.sum())
    if spent != planned:
        raise AssertionError(f"{method.name}: allocated {spent} rollouts != {planned}")

    # ---- continuations (from anchors, then extra root rollouts), grouped by prompt
    cont = _continue(prompts, anchors, K, root_extra, config, rng, token_rng)

    # ---- trees
    trees, anchor_node, node_value = _build_trees(
        prompts, selected, bare_prompt, bare, anchors.path, anchor_turn, cont.prompt, cont.start_depth,
        cont.from_anchor, cont.paths,
    )
    trajectories = sum(len(t.trajectories) for t in trees)
    if trajectories != planned:
        raise AssertionError(f"{method.name}: trees hold {trajectories} trajectories != {planned}")
    turns = sum(len(t.nodes) - 1 for t in trees)
    mixed = np.array([tree_is_mixed(t) for t in trees], dtype=bool)
    if sampled is None:
        kept = np.ones(len(trees), dtype=bool)
    else:  # the group filter decided in sampling order; the trees are in pool order
        kept_by_candidate = np.zeros(B, dtype=bool)
        kept_by_candidate[sampled.order] = sampled.kept
        kept = kept_by_candidate[selected]
    result = StepResult(
        method=method.name, trees=trees, tree_prompt=selected, pool_m=m, pool_pred=v, pool_value=prompts.p0,
        root_extra=root_extra, anchor_prompt=anchor_prompt, anchor_node=anchor_node, anchor_turn=anchor_turn,
        anchor_position=anchor_turn / prompts.horizon[anchor_prompt], anchor_reward=anchor_reward,
        anchor_pred=p, anchor_value=anchors.value, anchor_K=K, node_value=node_value, trajectories=trajectories,
        turns_generated=turns, pool_ids=ids, tree_kept=kept, rounds=rounds,
        generated_tokens=int(bare_tokens.sum() + cont.tokens.sum()), bare_tokens=bare_tokens, cont_tokens=cont.tokens,
        token_plan=plan,
    )
    token_figures = planner.observe_costs(_step_costs(
        method, v, root_cost, ids, bare_prompt, bare_tokens, prompts, anchor_prompt, anchor_reward, anchor_cost, K,
        cont.from_anchor, cont.prompt, cont.start_depth, cont.paths.reward, cont.tokens))
    result.token_ledger = planner.ledger
    if compute_metrics:
        result.metrics = simulator_metrics(result, method.advantage_estimator())
        result.metrics.update(token_figures)
        result.metrics.update(planner.token_figures(root_plan, int(root_extra.sum())))
    predictor.update(trees)  # after every score of this step has been used and recorded
    if history is not None:  # the bare root outcomes, with the predictions the allocator used
        b_lo, b_hi = _segment_bounds(bare_prompt, selected)
        planner.record_root_outcomes(step, ids[selected], [bare.reward[a:b] for a, b in zip(b_lo, b_hi, strict=True)],
                                     v[selected])
    if pool is not None:
        pool.advance(ids[selected[mixed & kept]])
        result.pool_success = pool.success()
        if compute_metrics:
            result.metrics["pool_success"] = result.pool_success
    return result


def _candidates(
    config: SimConfig, B: int, pool: PersistentPool | None, history: PromptHistory | None, rng: np.random.Generator,
    token_rng: np.random.Generator,
) -> tuple[PromptPool, np.ndarray | None, int]:
    """The step's ``B`` candidates, shuffled (so no prompt is favoured by its index even if a
    caller passes a fixed dataset order: method §2's promise), with their dataset ids (persistent
    pool only) and the step number."""
    if pool is None:
        if history is not None:
            raise ValueError("a history needs a persistent pool: i.i.d. prompts never recur")
        prompts, ids = sample_prompts(config, B, rng), None
    else:
        if pool.candidates_per_step != B:
            raise ValueError(f"the pool serves {pool.candidates_per_step} candidates a step but the budget needs {B}")
        if pool.config != config:
            raise ValueError("the persistent pool was built with another SimConfig")
        ids, prompts = pool.candidates()
    if prompts.turn_tokens is None:
        prompts = PromptPool(prompts.p0, prompts.horizon, prompts.feature, draw_turn_tokens(config, B, token_rng))
    order = rng.permutation(B)
    return prompts.take(order), None if ids is None else ids[order], 0 if pool is None else pool.step


@dataclass(frozen=True)
class _Anchors:
    """The anchors of a step's bare rollouts (turns 1..T−1 of each), grouped by prompt."""

    path: np.ndarray  # int64 (A,): the bare rollout through the anchor
    turn: np.ndarray  # int64 (A,): t
    prompt: np.ndarray  # int64 (A,): pool index of the anchor's prompt
    value: np.ndarray  # float64 (A,): hidden V_t
    reward: np.ndarray  # float64 (A,): reward of the bare rollout through the anchor
    histories: HistoryBatch  # what a predictor sees at each anchor


def _anchors(prompts: PromptPool, bare_prompt: np.ndarray, bare: Paths, H: int) -> _Anchors:
    n_anchor = prompts.horizon[bare_prompt] - 1
    path = np.repeat(np.arange(bare_prompt.size), n_anchor)
    turn = 1 + np.arange(path.size) - np.repeat(np.cumsum(n_anchor) - n_anchor, n_anchor)
    prompt = bare_prompt[path]
    obs = np.where(np.arange(1, H + 1)[None, :] <= turn[:, None], bare.observations[path, 1:], np.nan)
    value = bare.values[path, turn]
    histories = HistoryBatch(prompts.feature[prompt], obs, turn, value)
    return _Anchors(path, turn, prompt, value, bare.reward[path], histories)


@dataclass(frozen=True)
class _Continuations:
    """A step's continuations (from anchors, then extra root rollouts), grouped by prompt."""

    prompt: np.ndarray  # int64 (C,): pool index of the continuation's prompt
    start_depth: np.ndarray  # int64 (C,): the turn it branches at (0: from the root)
    from_anchor: np.ndarray  # int64 (C,): the anchor it branches at (−1: from the root)
    paths: Paths
    tokens: np.ndarray  # int64 (C,): generated tokens


def _continue(
    prompts: PromptPool, anchors: _Anchors, K: np.ndarray, root_extra: np.ndarray, config: SimConfig,
    rng: np.random.Generator, token_rng: np.random.Generator,
) -> _Continuations:
    cont_anchor = np.repeat(np.arange(K.size), K)
    extra_prompt = np.repeat(np.arange(root_extra.size), root_extra)
    prompt = np.concatenate([anchors.prompt[cont_anchor], extra_prompt])
    start_depth = np.concatenate([anchors.turn[cont_anchor], np.zeros(extra_prompt.size, dtype=np.int64)])
    start_value = np.concatenate([anchors.value[cont_anchor], prompts.p0[extra_prompt]])
    from_anchor = np.concatenate([cont_anchor, np.full(extra_prompt.size, -1, dtype=np.int64)])
    by_prompt = np.argsort(prompt, kind="stable")
    prompt, start_depth = prompt[by_prompt], start_depth[by_prompt]
    start_value, from_anchor = start_value[by_prompt], from_anchor[by_prompt]
    paths = simulate_paths(start_value, start_depth, prompts.horizon[prompt], config, rng)
    tokens = path_tokens(prompts.turn_tokens[prompt], start_depth, prompts.horizon[prompt], config, token_rng)
    return _Continuations(prompt, start_depth, from_anchor, paths, tokens)


def _step_costs(
    method: Method, v: np.ndarray, root_cost: np.ndarray, ids: np.ndarray | None,
    bare_prompt: np.ndarray, bare_tokens: np.ndarray, prompts: PromptPool, anchor_prompt: np.ndarray,
    anchor_reward: np.ndarray, anchor_cost: np.ndarray, K: np.ndarray,
    cont_from_anchor: np.ndarray, cont_prompt: np.ndarray, cont_start_depth: np.ndarray, cont_reward: np.ndarray,
    cont_tokens: np.ndarray,
) -> StepCosts:
    """What the step's rollouts cost against their estimates, for the ledger
    (:meth:`~trace_core.planner.StepPlanner.observe_costs`). A token-priced method's calibration
    pair is the stage-1 model's value of the continuations each prompt ran
    (:func:`~trace_core.token_budget.model_prefix_value`, over the prompt's anchors) and the
    expanded anchors whose branch group holds both outcomes."""
    horizon = prompts.horizon
    from_anchor = cont_from_anchor >= 0
    a = cont_from_anchor[from_anchor]
    predicted, realised = None, 0.0
    if method.prices_tokens:
        B = root_cost.shape[0]
        differs = cont_reward[from_anchor] != anchor_reward[a]
        realised = float((np.bincount(a, weights=differs, minlength=K.size) > 0).sum())
        anchors = np.bincount(anchor_prompt, minlength=B).astype(np.float64)
        continuations = np.bincount(anchor_prompt, weights=K, minlength=B)
        predicted = float(model_prefix_value(v, anchors, continuations).sum())
    return StepCosts(
        bare_tokens=bare_tokens.astype(np.float64), bare_turns=horizon[bare_prompt].astype(np.float64),
        bare_estimate=root_cost[bare_prompt], bare_prompt_ids=None if ids is None else ids[bare_prompt],
        cont_tokens=cont_tokens[from_anchor].astype(np.float64),
        cont_turn=cont_start_depth[from_anchor].astype(np.float64),
        cont_turns=horizon[cont_prompt[from_anchor]].astype(np.float64),
        cont_root_estimate=root_cost[cont_prompt[from_anchor]], cont_estimate=anchor_cost[a],
        prefix_predicted=predicted, prefix_realised=realised,
    )


def _sample_in_rounds(
    method: Method, v: np.ndarray, prompts: PromptPool, spec: BudgetSpec, config: SimConfig, rng: np.random.Generator,
    view: HistoryView | None,
) -> tuple[SampledRounds, np.ndarray, Paths]:
    """The method's bare groups in rounds (:func:`~trace_core.methods.sample_in_rounds`, the
    trainer's loop), each round's paths simulated before the next is chosen. Returns what the
    rounds sampled and the bare paths grouped by prompt in pool order."""
    parts: list[tuple[np.ndarray, Paths]] = []

    def roll(m_r: np.ndarray) -> np.ndarray:
        sel = np.flatnonzero(m_r)
        bp = np.repeat(sel, m_r[sel])
        paths = simulate_paths(prompts.p0[bp], np.zeros(bp.size, dtype=np.int64), prompts.horizon[bp], config, rng)
        parts.append((bp, paths))
        return np.array([is_mixed(paths.reward[bp == i]) for i in sel.tolist()], dtype=bool)

    sampled = sample_in_rounds(method, v, spec, rng, roll, view)
    if not parts:
        empty = np.zeros((0, config.horizon_max + 1))
        return sampled, np.zeros(0, dtype=np.int64), Paths(empty, empty.copy(), np.zeros(0))
    bp_all = np.concatenate([bp for bp, _ in parts])
    by_prompt = np.argsort(bp_all, kind="stable")
    paths = Paths(
        values=np.concatenate([q.values for _, q in parts])[by_prompt],
        observations=np.concatenate([q.observations for _, q in parts])[by_prompt],
        reward=np.concatenate([q.reward for _, q in parts])[by_prompt],
    )
    return sampled, bp_all[by_prompt], paths


def _build_trees(
    pool: PromptPool,
    selected: np.ndarray,
    bare_prompt: np.ndarray,
    bare: Paths,
    anchor_path: np.ndarray,
    anchor_turn: np.ndarray,
    cont_prompt: np.ndarray,
    cont_start_depth: np.ndarray,
    cont_from_anchor: np.ndarray,
    cont: Paths,
) -> tuple[list[RolloutTree], np.ndarray, list[np.ndarray]]:
    """Real rollout trees with empty token lists; ``info`` holds what a predictor may see: ``obs``
    per turn node, ``horizon`` and ``feature`` at the root. Returns the trees, each anchor's node id
    and each tree's hidden values per node (the root's: ``p0``)."""
    bare_v, bare_o, bare_r = bare.values.tolist(), bare.observations.tolist(), bare.reward.tolist()
    cont_v, cont_o, cont_r = cont.values.tolist(), cont.observations.tolist(), cont.reward.tolist()
    horizon = pool.horizon.tolist()
    node_of_path: list[list[int]] = [[] for _ in range(bare_prompt.size)]
    b_lo, b_hi = _segment_bounds(bare_prompt, selected)
    c_lo, c_hi = _segment_bounds(cont_prompt, selected)
    starts, from_anchor = cont_start_depth.tolist(), cont_from_anchor.tolist()
    a_path, a_turn = anchor_path.tolist(), anchor_turn.tolist()
    trees, node_value = [], []
    bounds = zip(selected.tolist(), b_lo.tolist(), b_hi.tolist(), c_lo.tolist(), c_hi.tolist(), strict=True)
    for i, j0, j1, k0, k1 in bounds:
        T = horizon[i]
        tree = RolloutTree(
            prompt_id=str(i),
            info={"horizon": T, "feature": float(pool.feature[i])},
        )
        values = [float(pool.p0[i])]
        for j in range(j0, j1):
            traj = tree.start_trajectory("bare")
            ids = [ROOT]
            vj, oj = bare_v[j], bare_o[j]
            for d in range(1, T + 1):
                ids.append(tree.add_turn(traj, [], [], info={"obs": oj[d]}))
                values.append(vj[d])
            tree.finish(traj, bare_r[j])
            node_of_path[j] = ids
        for c in range(k0, k1):
            a = from_anchor[c]
            branch = ROOT if a < 0 else node_of_path[a_path[a]][a_turn[a]]
            traj = tree.start_trajectory("continuation", branch_node=branch)
            vc, oc = cont_v[c], cont_o[c]
            for d in range(starts[c] + 1, T + 1):
                tree.add_turn(traj, [], [], info={"obs": oc[d]})
                values.append(vc[d])
            tree.finish(traj, cont_r[c])
        trees.append(tree)
        node_value.append(np.array(values))
    anchor_node = np.array([node_of_path[j][t] for j, t in zip(a_path, a_turn, strict=True)], dtype=np.int64)
    return trees, anchor_node, node_value


def simulator_metrics(result: StepResult, estimator: AdvantageEstimator) -> dict[str, float]:
    """One step's figures: :func:`~trace_core.metrics.step_metrics` under the trainer's names
    (``estimator``: the method's advantage, on the trees the policy trains on), then what only a
    simulator reports.

    Spearman is reported twice: against the tree-backed targets ``V̂`` (method §5, what a real
    run can log) and against the hidden true ``V`` over the whole pool / every anchor (what only
    a simulator can know). All predictions were made before the predictor saw this step. Beside
    them: ``turns_generated``, the step's simulated tokens under the trainer's names
    (``budget/generated_tokens``; the mixed groups trained on and the contrastive rollouts per 1,000
    of them, ``contrast/mixed_per_1k_tokens`` and ``contrast/yield_per_1k_tokens``, which the
    trees' empty token lists would leave undefined), the mixed groups with the expanded anchors
    whose branch group holds both outcomes per 1,000 tokens
    (``mixed_groups_with_anchors_per_1k_tokens``: the token budget's objective, method §10), and
    the share of the prefix budget per position bin (``k_share_pos_<lo>_<hi>``)."""
    trees = result.trees
    kept = [True] * len(trees) if result.tree_kept is None else [bool(k) for k in result.tree_kept]
    advantages = estimator([t for t, k in zip(trees, kept, strict=True) if k])
    predictions = []
    tree_of_prompt = {int(i): k for k, i in enumerate(result.tree_prompt)}
    for k, tree in enumerate(trees):
        pred = np.full(len(tree.nodes), np.nan)
        pred[ROOT] = result.pool_pred[result.tree_prompt[k]]
        predictions.append(pred)
    for a in range(result.anchor_node.size):
        tree_k = tree_of_prompt[int(result.anchor_prompt[a])]
        predictions[tree_k][result.anchor_node[a]] = result.anchor_pred[a]
    sp = predictor_spearman(trees, predictions)
    extra = np.flatnonzero(result.root_extra)
    stats = allocation_stats(
        result.pool_m,
        np.concatenate([result.anchor_K, result.root_extra[extra]]),
        np.concatenate([result.anchor_position, np.zeros(extra.size)]),
    )
    out = step_metrics(trees, kept, advantages, stats, result.rounds)
    out.update({
        "turns_generated": float(result.turns_generated),
        "spearman_root_vs_target": sp.root,
        "spearman_prefix_vs_target": sp.prefix,
        "spearman_root_vs_true": spearman(result.pool_pred, result.pool_value),
        "spearman_anchor_vs_true": spearman(result.anchor_pred, result.anchor_value),
    })
    # per generated token: the simulator's tokens (its trees hold no token ids), under the trainer's names
    tokens = float(result.generated_tokens)
    groups = out["counts/mixed_groups_trained"] + out["counts/mixed_anchors"]
    out.update({
        "budget/generated_tokens": tokens,
        "contrast/mixed_per_1k_tokens": per_exposure(out["counts/mixed_groups_trained"], tokens, 1000.0),
        "contrast/yield_per_1k_tokens": per_exposure(out["counts/contrastive_rollouts"], tokens, 1000.0),
        "mixed_groups_with_anchors_per_1k_tokens": per_exposure(groups, tokens, 1000.0),
    })
    k_share = stats.k_share_by_position
    for b in range(k_share.size):
        lo_edge, hi_edge = stats.position_bin_edges[b], stats.position_bin_edges[b + 1]
        out[f"k_share_pos_{lo_edge:.1f}_{hi_edge:.1f}"] = float(k_share[b])
    return out
