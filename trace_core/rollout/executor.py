"""Tree rollout executor: grows one rollout tree per prompt, expanding each prompt on its own.

Given a root allocation ``m`` and an :class:`Expansion` (the method's prefix rule, N and the anchor
scorer; ``None`` for bare groups only: measurements, evaluation), the executor

1. submits each activated prompt's ``m_i`` bare rollouts (one request with ``n = m_i``: they share
   the prompt, which the engine's prefix cache serves once);
2. runs the ReAct loop: each finished turn is parsed, its action executed by the prompt's
   environment (in a thread pool, overlapping generation), and the next turn submitted from the
   node's stored token ids;
3. **as soon as one prompt's bare rollouts have all finished** — without waiting for any other
   prompt — scores that prompt's anchors with the predictor, allocates its ``m_i·N``
   continuations with the method's prefix rule, puts a fresh environment at each chosen prefix
   (``restore`` of the snapshot taken there) and submits ``K`` continuations per anchor from the
   anchor's history (one request with ``n = K``; the prefix is reused from the cache);
4. a prompt without anchors spends its ``m_i·N`` on extra root rollouts (method §3); a prefix rule
   may also send part of it to the root itself (ARPO fills what its entropy-driven branches leave
   with more global rollouts), and a rule that reads entropy is handed, per anchor, the entropy of
   the tokens its rollout wrote after the anchor's tool result (method §4, "ARPO").

A method priced in generated tokens (``trace-tokens``, method §10) has no ``m_i·N``: its
expansion carries the step's :class:`TokenAllowance` (stage 1's reservations, the expected costs
and the run's :class:`~trace_core.token_ledger.TokenLedger`), and in step 3 each prompt spends its
reservation plus what its bare rollouts cost less than expected — known once they have finished —
with the method's stage 2 (``token_rule.spend``): continuations at its anchors, priced by their
expected remaining tokens, and further root rollouts, each next unit where it gains most per token.

A method that samples in rounds (DAPO's dynamic sampling: ``Method.group_filter``) runs through
:meth:`TreeRolloutExecutor.run_in_rounds`: one :meth:`~TreeRolloutExecutor.run` per round, bare
groups only, each round chosen after the earlier ones finished, then the group filter itself.

Every method of the allocation registry runs through this one executor, so budgets are
comparable: each step reports trajectories and generated tokens per prompt.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from trace_core.allocation import AnchorSignals, BudgetSpec, EntropySignals
from trace_core.arpo import anchor_entropy
from trace_core.history import HistoryView
from trace_core.methods import Method, sample_in_rounds
from trace_core.metrics import is_success, tree_is_mixed
from trace_core.planner import TokenAllowance
from trace_core.rollout.agent import AgentConfig, observation_tokens, render_prompt
from trace_core.rollout.engine import Completion, GenerationRequest, RolloutEngine, Sample, SamplingConfig
from trace_core.rollout.env import Action, Environment, Episode, Observation, Task, parse_action
from trace_core.seeding import derive_seed
from trace_core.tree import ROOT, RolloutTree


@dataclass(frozen=True)
class Expansion:
    """A run's prompt-local prefix expansion: once a prompt's bare rollouts finish, its anchors are
    scored with ``score_prefixes`` and ``method``'s prefix rule places m_i·N continuations — or,
    for a method priced in tokens, its stage 2 spends the prompt's :class:`TokenAllowance`."""

    method: Method  # its prefix rule places the continuations (its token rule's stage 2: spends them)
    expansion_N: int  # N: continuations per bare rollout (unused by a token-priced method)
    score_prefixes: PrefixScorer  # (tree, anchor node ids) -> success probability at each anchor
    tokens: TokenAllowance | None = None  # a token-priced method's stage-2 inputs; None for every other

    def __post_init__(self) -> None:
        if not self.method.expands:
            raise ValueError(f"method {self.method.name!r} has no prefix rule: pass expansion=None")
        if self.expansion_N < 0:
            raise ValueError(f"expansion_N must be >= 0, got {self.expansion_N}")
        if self.method.prices_tokens != (self.tokens is not None):
            raise ValueError(f"method {self.method.name!r}: a token-priced method's expansion needs its "
                             "TokenAllowance, and only such a method takes one")


def expansion_of(method: Method, expansion_N: int, score_prefixes: PrefixScorer | None,
                 tokens: TokenAllowance | None = None) -> Expansion | None:
    """The expansion a method asks for at this N (None when it expands nothing); a token-priced
    method expands by its allowance, whatever N."""
    if not method.expands or (expansion_N == 0 and not method.prices_tokens):
        return None
    if score_prefixes is None:
        raise ValueError(f"method {method.name!r} expands prefixes: score_prefixes is required")
    return Expansion(method, expansion_N, score_prefixes, tokens)

# Scores prefixes of one tree: (tree, node ids) -> predicted success probabilities in [0, 1].
PrefixScorer = Callable[[RolloutTree, Sequence[int]], np.ndarray]
EnvFactory = Callable[[Task], Environment]


@dataclass
class RolloutEvent:
    """Something that happened during a step, stamped with the engine step it happened after."""

    engine_step: int
    kind: str  # "submit_bare" | "bare_done" | "expand" | "prompt_done"
    prompt_id: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutStats:
    """Budget and cost accounting of one executor run."""

    trajectories: int = 0  # bare rollouts + continuations
    bare_trajectories: int = 0
    continuations: int = 0
    generated_tokens: int = 0  # model-written tokens (each tree node counted once)
    prompt_tokens_submitted: int = 0  # history tokens sent to the engine, over all requests
    cached_prompt_tokens: int = 0  # of those, served from the prefix cache (as the engine reports)
    requests: int = 0
    turns: int = 0
    tool_errors: int = 0
    rollout_s: float = 0.0  # wall time inside engine.poll
    tool_s: float = 0.0  # summed time of environment steps and restores (overlaps rollout when threaded)
    scoring_s: float = 0.0  # time in the prefix scorer
    wall_s: float = 0.0


@dataclass
class RolloutResult:
    trees: list[RolloutTree]  # one per activated prompt: in task order (in rounds: in sampling order)
    stats: RolloutStats
    events: list[RolloutEvent]
    continuations_per_anchor: dict[str, dict[int, int]]  # prompt id -> {anchor node: K}
    received_histories: dict[tuple[str, int], tuple[int, ...]]  # (prompt id, node) -> ids the engine got
    # per tree, indexed by node id: the anchor scorer's prediction at each anchor it scored, made
    # before the continuations were allocated (NaN at every other node): the predictor's update
    # reports its out-of-sample fit on them
    anchor_predictions: list[np.ndarray]
    # per tree: whether the policy trains on it (False: dropped by a round rule's group filter;
    # its rollouts were still spent and count in ``stats``)
    kept: list[bool] = field(default_factory=list)
    rounds: int = 1  # executor runs that produced the trees (a round rule's rounds)

    def predictions_before_update(self, root_pred: dict[str, float]) -> list[np.ndarray]:
        """Per tree, the predictions made before the predictor saw these trees — the root's from
        stage 1 (``root_pred``: prompt id -> score), the anchors' from stage 2 — so that the
        predictor's out-of-sample figures are honest."""
        out = []
        for tree, anchor_pred in zip(self.trees, self.anchor_predictions, strict=True):
            p = anchor_pred.copy()
            p[ROOT] = root_pred[tree.prompt_id]
            out.append(p)
        return out


@dataclass
class RoundsResult:
    """What :meth:`TreeRolloutExecutor.run_in_rounds` sampled."""

    result: RolloutResult  # every group sampled (kept or dropped), in sampling order
    m: np.ndarray  # int64 (len(tasks),): bare rollouts each candidate got over all rounds


def merge_stats(parts: Sequence[RolloutStats]) -> RolloutStats:
    """The field-wise sum of several runs' accounting (rounds run one after another, so their
    wall times add up too)."""
    total = RolloutStats()
    for part in parts:
        for name in RolloutStats.__dataclass_fields__:
            setattr(total, name, getattr(total, name) + getattr(part, name))
    return total


def merge_parallel(parts: Sequence[RolloutResult], prompt_order: Sequence[str]) -> RolloutResult:
    """One result of single-round executor runs on disjoint prompts at the same time (one per
    process): :func:`merge_results` with the trees in ``prompt_order`` (prompt ids; ids no part
    rolled out are skipped) and the wall time of the longest part, not their sum."""
    if any(part.rounds != 1 for part in parts):
        raise ValueError("merge_parallel merges single-round runs; a round rule's rounds depend on each other")
    merged = merge_results(parts)
    at: dict[str, int] = {}
    for i, tree in enumerate(merged.trees):
        if at.setdefault(tree.prompt_id, i) != i:
            raise ValueError(f"prompt {tree.prompt_id!r} was rolled out by two parts: the parts must be disjoint")
    unknown = sorted(set(at) - set(prompt_order))
    if unknown:
        raise ValueError(f"prompts {unknown[:5]} were rolled out but are not in prompt_order")
    order = [at[pid] for pid in prompt_order if pid in at]
    merged.trees = [merged.trees[i] for i in order]
    merged.anchor_predictions = [merged.anchor_predictions[i] for i in order]
    merged.kept = [merged.kept[i] for i in order]
    merged.stats.wall_s = max((part.stats.wall_s for part in parts), default=0.0)
    merged.rounds = 1
    return merged


@dataclass
class _Traj:
    prompt: int  # index into the executor's prompt states
    traj: int  # trajectory id in the tree
    env: Environment
    actions: list[Action] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)
    last_node: int = ROOT
    turns: int = 0


@dataclass
class _Prompt:
    task: Task
    index: int  # the task's position in the run's tasks
    tree: RolloutTree
    m: int
    prefix_budget: int  # m_i·N continuations (0 under a token allowance: stage 2 decides)
    bare_left: int
    bare_tokens: int = 0  # generated tokens of its bare rollouts so far
    open_trajs: int = 0
    expanded: bool = False
    done: bool = False
    anchor_predictions: dict[int, float] = field(default_factory=dict)  # anchor node -> scorer's value


class TreeGrowth:
    """One :meth:`TreeRolloutExecutor.run`: its trees, requests, snapshots and counters live here,
    not on the executor, so an executor holds only its settings and two runs share no state. An
    executor subclass may name a subclass of this one (``growth_type``) to change when prompts
    expand — as ``bench/rollout.py``'s synchronous baseline does."""

    def __init__(self, engine: RolloutEngine, tokenizer: Any, env_factory: EnvFactory, agent: AgentConfig,
                 tool_workers: int, rng: np.random.Generator, sampling_seed: int,
                 expansion: Expansion | None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.env_factory = env_factory
        self.agent = agent
        self.tool_workers = tool_workers
        self._rng = rng
        self._sampling_seed = sampling_seed
        self._expansion = expansion
        self._stats = RolloutStats()
        self._events: list[RolloutEvent] = []
        self._engine_step = 0
        self._requests: dict[str, list[_Traj]] = {}
        self._snapshots: dict[tuple[int, int], Any] = {}
        self._k_by_anchor: dict[str, dict[int, int]] = {}
        self._received: dict[tuple[str, int], tuple[int, ...]] = {}
        self._prompts: list[_Prompt] = []
        self._pool: cf.ThreadPoolExecutor | None = None
        self._futures: dict[cf.Future, tuple[_Traj, Sample, float]] = {}

    def grow(self, tasks: Sequence[Task], m: Sequence[int]) -> RolloutResult:
        """The trees of ``tasks`` with ``m[i] > 0`` (the executor has checked the inputs)."""
        self._pool = cf.ThreadPoolExecutor(self.tool_workers) if self.tool_workers > 0 else None
        t0 = time.perf_counter()
        try:
            for index, (task, mi) in enumerate(zip(tasks, m, strict=True)):
                if int(mi) == 0:
                    continue
                env = self.env_factory(task)
                prompt_ids = render_prompt(self.tokenizer, task, env.tool_descriptions(), self.agent)
                tree = RolloutTree(task.id, prompt_ids, info={"question": task.question})
                expansion = self._expansion
                budget = (0 if expansion is None or expansion.tokens is not None
                          else expansion.method.prefix_budget(int(mi), expansion.expansion_N))
                state = _Prompt(task=task, index=index, tree=tree, m=int(mi), prefix_budget=budget,
                                bare_left=int(mi))
                self._prompts.append(state)
                self._start_group(len(self._prompts) - 1, "bare", ROOT, int(mi), first_env=env)
                self._event("submit_bare", state, m=int(mi))
            self._loop()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
        self._stats.wall_s = time.perf_counter() - t0
        for p in self._prompts:
            p.tree.validate()
        return RolloutResult(
            trees=[p.tree for p in self._prompts], stats=self._stats, events=self._events,
            continuations_per_anchor=self._k_by_anchor, received_histories=self._received,
            anchor_predictions=[_node_values(p.tree, p.anchor_predictions) for p in self._prompts],
            kept=[True] * len(self._prompts),
        )

    # ------------------------------------------------------------------ groups and requests
    def _start_group(self, pi: int, kind: str, branch: int, n: int, first_env: Environment | None = None) -> None:
        """Open ``n`` trajectories of ``kind`` at node ``branch`` and submit their first turn as one
        request with ``n`` samples (they share the history)."""
        state = self._prompts[pi]
        snapshot = None if branch == ROOT else self._snapshots[(pi, branch)]
        trajs = []
        for i in range(n):
            env = first_env if (i == 0 and first_env is not None) else self.env_factory(state.task)
            t_tool = time.perf_counter()
            if snapshot is None:
                env.reset(state.task)
            else:
                env.restore(snapshot)
            self._stats.tool_s += time.perf_counter() - t_tool
            tid = state.tree.start_trajectory("bare" if kind == "bare" else "continuation", branch_node=branch)
            trajs.append(_Traj(prompt=pi, traj=tid, env=env, last_node=branch,
                               turns=state.tree.nodes[branch].depth))
            state.open_trajs += 1
            self._stats.trajectories += 1
            if kind == "bare":
                self._stats.bare_trajectories += 1
            else:
                self._stats.continuations += 1
        self._submit(trajs, branch)

    def _submit(self, trajs: list[_Traj], node: int) -> None:
        state = self._prompts[trajs[0].prompt]
        history = state.tree.history_tokens(node)
        rid = f"{trajs[0].prompt}:{trajs[0].traj}:{node}"
        room = self.agent.max_total_tokens - len(history)
        sampling = SamplingConfig(
            n=len(trajs), max_new_tokens=min(self.agent.max_new_tokens, room),
            temperature=self.agent.temperature, top_p=self.agent.top_p,
            seed=derive_seed(self._sampling_seed, state.task.id, trajs[0].traj, node), stop=self.agent.stop,
        )
        self._requests[rid] = trajs
        self._stats.requests += 1
        self._stats.prompt_tokens_submitted += len(history)
        self.engine.submit([GenerationRequest(rid, history, sampling)])

    # ------------------------------------------------------------------ the event loop
    def _loop(self) -> None:
        while self.engine.num_pending or self._futures:
            if self.engine.num_pending:
                t = time.perf_counter()
                completions = self.engine.poll()
                self._stats.rollout_s += time.perf_counter() - t
                self._engine_step += 1
                for c in completions:
                    self._on_completion(c)
            if self._futures:
                done = [f for f in self._futures if f.done()]
                if not done and not self.engine.num_pending:
                    done = list(cf.wait(list(self._futures), return_when=cf.FIRST_COMPLETED).done)
                for f in sorted(done, key=lambda f: self._futures[f][2]):
                    traj, sample, _ = self._futures.pop(f)
                    obs, seconds = f.result()
                    self._stats.tool_s += seconds
                    self._after_step(traj, sample, obs)

    def _on_completion(self, completion: Completion) -> None:
        trajs = self._requests.pop(completion.request_id)
        state = self._prompts[trajs[0].prompt]
        self._received[(state.task.id, trajs[0].last_node)] = completion.prompt_token_ids
        if completion.num_cached_tokens is not None:
            self._stats.cached_prompt_tokens += int(completion.num_cached_tokens)
        for traj, sample in zip(trajs, completion.samples, strict=True):
            action = parse_action(sample.text)
            if self._pool is None:
                obs, seconds = _timed_step(traj.env, action)
                self._stats.tool_s += seconds
                self._after_step(traj, sample, obs, action)
            else:
                fut = self._pool.submit(_timed_step, traj.env, action)
                self._futures[fut] = (traj, sample, time.perf_counter())
                traj.actions.append(action)  # recorded now; the observation follows

    def _after_step(self, traj: _Traj, sample: Sample, obs: Observation, action: Action | None = None) -> None:
        if action is not None:
            traj.actions.append(action)
        action = traj.actions[-1]
        traj.observations.append(obs)
        traj.turns += 1
        state = self._prompts[traj.prompt]
        tree = state.tree
        self._stats.turns += 1
        self._stats.tool_errors += int(obs.tool_error)
        model_ids = list(sample.token_ids)
        # The environment decides when an answer ends the episode (in BFCL it only ends a user
        # turn, and the next user message comes back as the observation).
        finished = obs.done or traj.turns >= self.agent.max_turns
        obs_ids = [] if finished else observation_tokens(self.tokenizer, obs.text)
        if not finished:  # max tokens: the next turn needs room for at least one more token
            history_len = len(tree.history_tokens(traj.last_node)) + len(model_ids) + len(obs_ids)
            if history_len >= self.agent.max_total_tokens:
                finished, obs_ids = True, []
        info = {"action": action.raw, "tool": action.tool, "tool_error": obs.tool_error,
                "finish_reason": sample.finish_reason}
        if action.final_answer is not None:
            info["final_answer"] = action.final_answer
        node = tree.add_turn(
            traj.traj, model_ids + obs_ids, [1] * len(model_ids) + [0] * len(obs_ids),
            logprobs=list(sample.logprobs) + [0.0] * len(obs_ids), info=info,
        )
        traj.last_node = node
        self._stats.generated_tokens += len(model_ids)
        if tree.trajectories[traj.traj].kind == "bare":
            state.bare_tokens += len(model_ids)
        if finished:
            reward = float(traj.env.reward(Episode(state.task, traj.actions, traj.observations)))
            tree.finish(traj.traj, reward)
            state.open_trajs -= 1
            if tree.trajectories[traj.traj].kind == "bare":
                state.bare_left -= 1
                if state.bare_left == 0:
                    self._event("bare_done", state)
                    self._expand(traj.prompt)
            if state.open_trajs == 0 and state.expanded and not state.done:
                state.done = True
                self._event("prompt_done", state)
            return
        if tree.trajectories[traj.traj].kind == "bare":
            self._snapshots[(traj.prompt, node)] = traj.env.snapshot()
        self._submit([traj], node)

    # ------------------------------------------------------------------ prompt-local expansion
    def _expand(self, pi: int) -> None:
        state = self._prompts[pi]
        state.expanded = True
        expansion = self._expansion
        if expansion is not None and expansion.tokens is not None:
            self._spend_allowance(pi, expansion)
            return
        budget = state.prefix_budget
        if budget == 0:
            if state.open_trajs == 0:
                state.done = True
                self._event("prompt_done", state)
            return
        tree = state.tree
        assert expansion is not None  # a prefix budget exists only with an expansion
        anchors, signals = self._anchors(tree, expansion)
        placement = expansion.method.place_prefixes(signals, budget, self._rng)
        if not anchors:  # method §3: the root is the depth-0 anchor of an anchorless prompt
            self._k_by_anchor[state.task.id] = {ROOT: placement.extra_roots}
            self._event("expand", state, anchors=0, continuations=budget)
            self._start_group(pi, "continuation", ROOT, placement.extra_roots)
            return
        state.anchor_predictions = {int(a): float(pa) for a, pa in zip(anchors, signals.p, strict=True)}
        by_anchor = {int(a): int(k) for a, k in zip(anchors, placement.K, strict=True) if k > 0}
        if placement.extra_roots:  # a rule's own fill from the root (ARPO's global samples)
            by_anchor[ROOT] = placement.extra_roots
        self._k_by_anchor[state.task.id] = by_anchor
        self._event("expand", state, anchors=len(anchors), continuations=budget)
        for a, k in zip(anchors, placement.K, strict=True):
            if k > 0:
                self._start_group(pi, "continuation", int(a), int(k))
        if placement.extra_roots:
            self._start_group(pi, "continuation", ROOT, placement.extra_roots)

    def _spend_allowance(self, pi: int, expansion: Expansion) -> None:
        """Stage 2 of a token-priced method for one prompt whose bare rollouts have finished: its
        allowance (its reservation plus its roots' expected tokens less their realised ones) spent
        by ``token_rule.spend`` on continuations at its anchors and further root rollouts."""
        state = self._prompts[pi]
        tree, tokens, i = state.tree, expansion.tokens, state.index
        assert tokens is not None and expansion.method.token_rule is not None
        anchors, signals = self._anchors(tree, expansion)
        p, r, turn = signals.p, signals.r, signals.turn
        root_cost = float(tokens.root_cost[i])
        anchor_cost = np.zeros(0)
        if anchors:
            turns = np.array([tree.bare_length(a) for a in anchors], dtype=np.float64)
            anchor_cost = tokens.anchor_cost(i, turn, turns)
        allowance = tokens.allowance(i, state.m, state.bare_tokens)
        bare = is_success([tree.trajectory_reward(b.id) for b in tree.bare_trajectories()]).astype(np.float64)
        spend = expansion.method.token_rule.spend(p, r, turn, anchor_cost, bare, float(tokens.root_p[i]), root_cost,
                                                  allowance)
        K, extra = np.asarray(spend.K, dtype=np.int64), int(spend.extra_roots)
        state.anchor_predictions = {int(a): float(pa) for a, pa in zip(anchors, p, strict=True)}
        by_anchor = {int(a): int(k) for a, k in zip(anchors, K, strict=True) if k > 0}
        if extra:
            by_anchor[ROOT] = extra
        self._k_by_anchor[state.task.id] = by_anchor
        self._event("expand", state, anchors=len(anchors), continuations=int(K.sum()) + extra,
                    allowance=allowance, expected_tokens=float(spend.tokens))
        for a, k in zip(anchors, K, strict=True):
            if k > 0:
                self._start_group(pi, "continuation", int(a), int(k))
        if extra:
            self._start_group(pi, "continuation", ROOT, extra)
        if state.open_trajs == 0 and not state.done:  # nothing to spend on: the prompt is complete
            state.done = True
            self._event("prompt_done", state)

    def _anchors(self, tree: RolloutTree, expansion: Expansion) -> tuple[list[int], AnchorSignals]:
        """What both expansion rules read of a prompt's finished bare rollouts: its anchors and their
        signals — the scorer's predictions there, each anchor's own rollout's outcome (1.0 success),
        its depth (turns before the anchor), that rollout's trajectory id and, for a prefix rule
        that reads entropy (ARPO), the entropy of the tokens written after the anchor's tool result
        against the rollout's first (:func:`~trace_core.arpo.anchor_entropy`, normalised by the
        log of the tokenizer's size)."""
        anchors = tree.anchors()
        p = self._score(tree, anchors, expansion)
        r = is_success([tree.trajectory_reward(tree.nodes[a].trajectory) for a in anchors]).astype(np.float64)
        turn = np.array([tree.nodes[a].depth for a in anchors], dtype=np.int64)
        rollout = np.array([tree.nodes[a].trajectory for a in anchors], dtype=np.int64)
        entropy = None
        window = expansion.method.entropy_window
        if window is not None:
            entropy = EntropySignals(*anchor_entropy(tree, anchors, window, len(self.tokenizer)))
        return anchors, AnchorSignals(p, r, turn, rollout, entropy)

    def _score(self, tree: RolloutTree, anchors: list[int], expansion: Expansion) -> np.ndarray:
        """The anchor scorer's predictions at ``anchors`` (timed as scoring)."""
        if not anchors:
            return np.zeros(0)
        t = time.perf_counter()
        p = np.asarray(expansion.score_prefixes(tree, anchors), dtype=np.float64)
        self._stats.scoring_s += time.perf_counter() - t
        if p.shape != (len(anchors),):
            raise ValueError(f"score_prefixes returned shape {p.shape} for {len(anchors)} anchors")
        return p

    def _event(self, kind: str, state: _Prompt, **detail: Any) -> None:
        self._events.append(RolloutEvent(self._engine_step, kind, state.task.id, detail))


class TreeRolloutExecutor:
    """Runs tree rollouts for a batch of prompts on one engine (see the module docstring)."""

    growth_type: type[TreeGrowth] = TreeGrowth  # one run's state and scheduling

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: Any,
        env_factory: EnvFactory,
        agent: AgentConfig | None = None,
        tool_workers: int = 16,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.env_factory = env_factory
        self.agent = agent if agent is not None else AgentConfig()
        self.tool_workers = tool_workers

    # ------------------------------------------------------------------ public
    def run(
        self,
        tasks: Sequence[Task],
        m: Sequence[int],
        expansion: Expansion | None,
        rng: np.random.Generator,
        sampling_seed: int | None = None,
    ) -> RolloutResult:
        """Grow one tree per task with ``m[i] > 0``; see the module docstring. ``expansion``: the
        prompt-local prefix expansion (the method's prefix rule, N and the anchor scorer); None
        rolls out the bare groups only.

        ``sampling_seed`` keys this run's sampling: every request's seed is derived from it, the
        prompt, the trajectory and the node, so one call is reproducible and two calls with
        different seeds (two training steps, two runs) draw different tokens for the same
        prompt. None: ``agent.seed`` (a one-off measurement). A trainer passes a seed derived from
        its run seed and the step (:func:`trace_core.seeding.derive_seed`)."""
        if len(tasks) != len(m):
            raise ValueError(f"tasks ({len(tasks)}) and m ({len(m)}) must have the same length")
        active_ids = [t.id for t, mi in zip(tasks, m, strict=True) if int(mi) > 0]
        if len(set(active_ids)) != len(active_ids):
            repeated = sorted({i for i in active_ids if active_ids.count(i) > 1})
            raise ValueError(f"tasks {repeated} appear more than once among the activated prompts: one tree per "
                             "prompt (a repeated prompt would draw the same seeds and the same rollouts)")
        if any(int(x) < 0 or int(x) == 1 for x in m):
            raise ValueError("m must hold 0 or values >= 2 (a single rollout forms no group)")
        if expansion is not None and expansion.tokens is not None and len(expansion.tokens.reserved) != len(tasks):
            raise ValueError(f"the token allowance has {len(expansion.tokens.reserved)} entries for {len(tasks)} "
                             "tasks: one per task")
        if self.engine.num_pending:
            raise ValueError(f"the engine has {self.engine.num_pending} pending requests; it must be idle")
        growth = self.growth_type(self.engine, self.tokenizer, self.env_factory, self.agent, self.tool_workers,
                                  rng, self.agent.seed if sampling_seed is None else int(sampling_seed), expansion)
        return growth.grow(tasks, m)

    def run_in_rounds(
        self,
        tasks: Sequence[Task],
        v: np.ndarray,
        method: Method,
        spec: BudgetSpec,
        rng: np.random.Generator,
        sampling_seed: int | None = None,
        history: HistoryView | None = None,
    ) -> RoundsResult:
        """Bare groups in rounds with ``method.group_filter`` (DAPO's dynamic sampling), within the
        rule's own limits (a cap on rounds, on rollouts, or both). First the method's pre-rollout
        filter, where it has one, decides which candidates the rounds may sample
        (:meth:`~trace_core.methods.Method.round_candidates`, reading ``history``: one row per
        task, as the trainer's :class:`~trace_core.history.PromptHistory` views it). Before each
        round the rule sees the candidates still available, the mixed groups so far, the rollouts
        spent and the rounds run, and returns the round's ``m`` (all zeros: stop); each round is one
        :meth:`run` without expansion, finished before the next is chosen. After the last round the
        rule's group filter marks which trees the policy trains on (``result.kept``, in sampling
        order); every rollout, a dropped group's too, counts in ``result.stats`` — what the step
        spent, which may exceed ``spec.total`` for a rule without a rollout cap. Every round samples
        with ``sampling_seed``: request seeds are keyed by the prompt too, and no prompt is
        sampled in two rounds.

        Raises AssertionError if a round would go past the rule's limits, ValueError for a
        malformed round (a prompt sampled twice or filtered out, ``m = 1``, a wrong length)."""
        if method.group_filter is None:
            raise ValueError(f"method {method.name!r} has no round rule: use run()")
        v = np.asarray(v, dtype=np.float64)
        B = len(tasks)
        if v.shape != (B,):
            raise ValueError(f"v has shape {v.shape}, expected ({B},): one prediction per task")
        parts: list[RolloutResult] = []

        def roll(m_r: np.ndarray) -> np.ndarray:  # one round, finished before the next is chosen
            part = self.run(tasks, m_r.tolist(), None, rng, sampling_seed=sampling_seed)
            parts.append(part)
            return np.array([tree_is_mixed(t) for t in part.trees], dtype=bool)

        sampled = sample_in_rounds(method, v, spec, rng, roll, history)
        # the trees in sampling order, as sampled.kept
        result = replace(merge_results(parts), kept=sampled.kept.tolist(), rounds=sampled.rounds)
        return RoundsResult(result, sampled.m)


def merge_results(parts: Sequence[RolloutResult]) -> RolloutResult:
    """Several executor runs, one after another, as one: their trees (and each tree's anchor
    predictions and kept flag) in run order, the accounting summed (:func:`merge_stats`), the
    events with engine steps counting on across the runs, and the runs' rounds added up."""
    events, offset = [], 0
    for part in parts:
        events += [RolloutEvent(e.engine_step + offset, e.kind, e.prompt_id, e.detail) for e in part.events]
        offset += max((e.engine_step for e in part.events), default=0)
    return RolloutResult(
        trees=[t for part in parts for t in part.trees], stats=merge_stats([part.stats for part in parts]),
        events=events,
        continuations_per_anchor={k: d for part in parts for k, d in part.continuations_per_anchor.items()},
        received_histories={k: h for part in parts for k, h in part.received_histories.items()},
        anchor_predictions=[p for part in parts for p in part.anchor_predictions],
        kept=[k for part in parts for k in part.kept], rounds=sum(part.rounds for part in parts),
    )


def _node_values(tree: RolloutTree, values: dict[int, float]) -> np.ndarray:
    """float64 (nodes,): ``values`` at their node ids, NaN elsewhere."""
    out = np.full(len(tree.nodes), np.nan)
    for node, value in values.items():
        out[node] = value
    return out


def _timed_step(env: Environment, action: Action) -> tuple[Observation, float]:
    t = time.perf_counter()
    obs = env.step(action)
    return obs, time.perf_counter() - t
