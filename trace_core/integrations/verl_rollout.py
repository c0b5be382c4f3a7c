"""TRACE's continuations inside verl's own rollout (verl 0.9.1, its legacy trainer).

verl loads the agent-loop manager named by ``actor_rollout_ref.rollout.agent.agent_loop_manager_class``
(``verl/trainer/ppo/ray_trainer.py``, ``init_workers``); this module's
``trace_core.integrations.verl_rollout.TraceAgentLoopManager`` is one. Its ``generate_sequences``
turns verl's step into TRACE's:

1. verl hands it ``n = rollout.n`` rows per prompt (one uid each). It rolls out ``m = n/(1+N)`` of
   them bare, through verl's own agent loops (``AgentLoopManager.generate_sequences``);
2. it reads those rows back as one :class:`~trace_core.tree.RolloutTree` per prompt
   (:func:`trees_from_rows`: a turn is a run of model-written tokens and the observation after
   it), scores the anchors (the ends of observations, where the model writes its next turn) with
   the success predictor and lets the method's prefix rule place the prompt's ``m·N``
   continuations (:func:`place_continuations`);
3. each continuation is one row for verl's agent loop ``trace_continuation``
   (:func:`continuation_batch`), a ``ToolAgentLoop`` that starts from its anchor's exact token
   history (the prompt, then the bare rollout's response up to the anchor) instead of rendering
   messages, and runs the tool loop to its end; a prompt without anchors gets fresh rollouts;
4. the continuations join their trees (:func:`attach_continuations`) and every trajectory becomes
   one of the prompt's ``n`` rows (:func:`merge_rows`), in verl's layout: the prompt, then the
   whole response, the anchor's shared history masked 0 in a continuation's row, so each shared
   token is trained once. The rows' :class:`~trace_core.integrations.verl.TreeRowId`\\ s are issued
   (:func:`~trace_core.integrations.verl.issue_row_ids`) for the ``trace_tree`` estimator, which
   verl's trainer calls with its own string uids.

What verl allows and what it does not (docs/integration.md): the rows per prompt stay ``rollout.n``
(the trainer unions the rollout into its batch row by row), so TRACE's root allocation (``m_i``
per prompt) has no seat here; ``trainer.balance_batch`` must be off (the estimator finds each row's
trajectory by its place among its prompt's rows); verl's V1 trainer (TransferQueue) is not
supported.

The pure functions take verl's ``DataProto`` and return typed values; importing this module needs
no verl. The verl classes (``TraceAgentLoopManager``, ``TraceAgentLoopWorker``,
``ContinuationAgentLoop``) are built on first access, which imports verl.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trace_core.allocation import AnchorSignals
from trace_core.integrations.verl import TRACE_ESTIMATOR, TreeRowId, issue_row_ids
from trace_core.methods import Method
from trace_core.metrics import is_success
from trace_core.tree import ROOT, RolloutTree

CONTINUATION_AGENT = "trace_continuation"  # the agent_name of a continuation row
HISTORY_KEY = "trace_history"  # a continuation row's field: the anchor's exact history (AnchorHistory)

# Scores prefixes of one tree: (tree, node ids) -> predicted success probabilities in [0, 1].
PrefixScorer = Callable[[RolloutTree, Sequence[int]], np.ndarray]


@dataclass(frozen=True)
class RowTokens:
    """One row of verl's rollout output, unpadded."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]  # 1 model-written, 0 observation
    response_logprobs: list[float] | None  # the engine's, where verl returned them
    reward: float | None  # the row's reward (rm_scores summed), where verl computed it


@dataclass(frozen=True)
class AnchorHistory:
    """What a continuation starts from: its anchor's exact token history, the prompt and the bare
    rollout's response up to the anchor (with that response's mask and log-probs)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None = None


@dataclass(frozen=True)
class Continuation:
    """One continuation row: tree ``tree``'s continuation from ``branch_node`` (the root: a fresh
    rollout of a prompt without anchors)."""

    tree: int
    branch_node: int
    offset: int  # response tokens of the anchor's history (0 from the root)


@dataclass
class TraceVerlConfig:
    """The ``trace`` section of verl's config (``+trace.method=trace`` and so on)."""

    method: str = "trace"  # a name of trace_core.methods' registry, one with a prefix rule
    expansion_N: int = 1  # N: continuations per bare rollout; rollout.n must be a multiple of 1 + N
    seed: int = 0  # seeds the prefix rule's draws
    predictor_path: str | None = None  # a saved SuccessPredictor (SuccessPredictor.save); None: a new one
    predictor: dict[str, Any] = field(default_factory=dict)  # PredictorConfig fields for a new one
    update_predictor: bool = True  # train the predictor online on each step's trees

    @classmethod
    def from_verl(cls, config: Any) -> TraceVerlConfig:
        section = config.get("trace", None) if hasattr(config, "get") else None
        if section is None:
            return cls()
        try:
            from omegaconf import OmegaConf

            raw = OmegaConf.to_container(section, resolve=True) if OmegaConf.is_config(section) else dict(section)
        except ImportError:
            raw = dict(section)
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"trace: unknown keys {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        return cls(**raw)


# ---------------------------------------------------------------------- rows and trees
def _tensor(batch: Any, key: str) -> np.ndarray | None:
    if batch.batch is None or key not in batch.batch.keys():
        return None
    return batch.batch[key].detach().cpu().numpy()


def unpad_rows(batch: Any) -> list[RowTokens]:
    """Each row of verl's rollout output (``prompts`` left-padded, ``responses`` right-padded, the
    ``attention_mask`` over both) without its padding."""
    prompts, responses = _tensor(batch, "prompts"), _tensor(batch, "responses")
    attention, mask = _tensor(batch, "attention_mask"), _tensor(batch, "response_mask")
    if prompts is None or responses is None or attention is None or mask is None:
        raise ValueError("a rollout output needs prompts, responses, attention_mask and response_mask")
    logprobs, scores = _tensor(batch, "rollout_log_probs"), _tensor(batch, "rm_scores")
    width = prompts.shape[1]
    rows = []
    for i in range(prompts.shape[0]):
        n = int(attention[i, width:].sum())
        rows.append(RowTokens(
            prompt_ids=[int(t) for t in prompts[i][attention[i, :width] == 1]],
            response_ids=[int(t) for t in responses[i, :n]],
            response_mask=[int(m) for m in mask[i, :n]],
            response_logprobs=None if logprobs is None else [float(x) for x in logprobs[i, :n]],
            reward=None if scores is None else float(scores[i].sum()),
        ))
    return rows


def turn_spans(response_mask: Sequence[int]) -> list[tuple[int, int]]:
    """The turns of a response: each starts where model-written tokens start after observation
    tokens (or at 0) and runs through the observation that follows them."""
    mask = [int(m) for m in response_mask]
    if not mask:
        return [(0, 0)]
    starts = [0] + [j for j in range(1, len(mask)) if mask[j] and not mask[j - 1]]
    return list(zip(starts, starts[1:] + [len(mask)], strict=True))


def _add_turns(tree: RolloutTree, traj: int, row: RowTokens, start: int, base: int) -> None:
    """Row ``row``'s response from ``start`` on, turn by turn, as ``traj``'s nodes; each node
    records where its turn ends in the row's response (``response_end``), ``base`` the offset of
    the row's response within the tree's."""
    own = row.response_mask[start:]
    logprobs = row.response_logprobs
    for a, b in turn_spans(own):
        ids, mask = row.response_ids[start + a:start + b], row.response_mask[start + a:start + b]
        lp = None if logprobs is None else [x if m else 0.0 for x, m in zip(logprobs[start + a:start + b], mask,
                                                                            strict=True)]
        tree.add_turn(traj, ids, mask, logprobs=lp, info={"response_end": base + start + b})


def trees_from_rows(rows: Sequence[RowTokens], groups: Sequence[tuple[str, Sequence[int]]]) -> list[RolloutTree]:
    """One tree per prompt: ``groups`` names each prompt (its uid) and its bare rows among ``rows``,
    each a bare rollout finished with its reward. A prompt's rows must share its prompt tokens."""
    trees = []
    for key, members in groups:
        members = list(members)
        if not members:
            raise ValueError(f"prompt {key!r} has no bare rows")
        tree = RolloutTree(key, rows[members[0]].prompt_ids)
        for i in members:
            row = rows[i]
            if row.prompt_ids != tree.root.token_ids:
                raise ValueError(f"prompt {key!r}: row {i}'s prompt tokens differ from its first row's")
            if row.reward is None:
                raise ValueError(f"prompt {key!r}: row {i} has no reward (rm_scores): TRACE places continuations "
                                 "by the bare rollouts' outcomes, so verl must score them as they end (its agent "
                                 "reward loop: no reward model, or one with its own resource pool)")
            traj = tree.start_trajectory("bare")
            _add_turns(tree, traj, row, 0, 0)
            tree.finish(traj, row.reward)
        trees.append(tree)
    return trees


def anchor_history(tree: RolloutTree, node: int) -> AnchorHistory:
    """The exact token history a continuation from ``node`` starts from."""
    path = tree.path(node)[1:]
    ids = [t for n in path for t in tree.nodes[n].token_ids]
    mask = [m for n in path for m in tree.nodes[n].loss_mask]
    logprobs = None
    if path and all(tree.nodes[n].logprobs is not None for n in path):
        logprobs = [x for n in path for x in tree.nodes[n].logprobs]
    return AnchorHistory(list(tree.root.token_ids), ids, mask, logprobs)


# ---------------------------------------------------------------------- placing continuations
def check_method(method: Method) -> None:
    """The methods this adapter runs: a trajectory budget and a prefix rule that reads no entropy."""
    if not method.expands:
        raise ValueError(f"method {method.name!r} has no prefix rule: run verl's own manager instead")
    if method.prices_tokens or method.samples_in_rounds or method.reads_entropy:
        raise ValueError(f"method {method.name!r} is not supported inside verl's rollout: it prices tokens, samples "
                         "in rounds or reads the policy's entropy at anchors")


def place_continuations(trees: Sequence[RolloutTree], budgets: Sequence[int], method: Method,
                        score_prefixes: PrefixScorer, rng: np.random.Generator) -> list[list[tuple[int, int]]]:
    """Each tree's continuations as ``(branch node, K)`` pairs: its anchors (the non-terminal turns
    of its bare rollouts) scored by ``score_prefixes``, and the method's prefix rule placing the
    tree's budget over them, as trace_core's executor does (a tree without anchors: all of it as
    fresh rollouts from the root)."""
    out = []
    for tree, budget in zip(trees, budgets, strict=True):
        anchors = tree.anchors()
        p = np.zeros(0)
        if anchors:
            p = np.asarray(score_prefixes(tree, anchors), dtype=np.float64)
            if p.shape != (len(anchors),):
                raise ValueError(f"score_prefixes returned shape {p.shape} for {len(anchors)} anchors")
        r = is_success([tree.trajectory_reward(tree.nodes[a].trajectory) for a in anchors]).astype(np.float64)
        turn = np.array([tree.nodes[a].depth for a in anchors], dtype=np.int64)
        rollout = np.array([tree.nodes[a].trajectory for a in anchors], dtype=np.int64)
        placement = method.place_prefixes(AnchorSignals(p, r, turn, rollout), int(budget), rng)
        pairs = [(int(a), int(k)) for a, k in zip(anchors, placement.K, strict=True) if k > 0]
        if placement.extra_roots:
            pairs.append((ROOT, int(placement.extra_roots)))
        out.append(pairs)
    return out


def predictor_scorer(predictor: Any) -> PrefixScorer:
    """The success predictor's ``score_trees`` as a prefix scorer."""
    def score(tree: RolloutTree, nodes: Sequence[int]) -> np.ndarray:
        return predictor.score_trees([tree], [list(nodes)])[0][list(nodes)]
    return score


def continuation_batch(prompts: Any, first_rows: Sequence[int], trees: Sequence[RolloutTree],
                       placements: Sequence[Sequence[tuple[int, int]]],
                       default_agent: str) -> tuple[Any, list[Continuation]]:
    """verl's request batch of the continuations: one row per continuation, tree by tree, each a
    copy of its prompt's row ``first_rows[t]`` of ``prompts`` (its data source, reward model, tools
    kwargs, uid...) whose ``agent_name`` is ``trace_continuation`` and whose ``trace_history`` is its
    anchor's :class:`AnchorHistory`; a fresh rollout from the root keeps the prompt's own agent
    (``default_agent`` where the prompts name none: verl's ``rollout.agent.default_agent_loop``).
    Returns None and no continuations when there are none."""
    picks, conts = [], []
    for t, pairs in enumerate(placements):
        for node, k in pairs:
            offset = 0 if node == ROOT else int(trees[t].nodes[node].info["response_end"])
            for _ in range(k):
                picks.append(first_rows[t])
                conts.append(Continuation(t, node, offset))
    if not conts:
        return None, []
    batch = prompts.select_idxs(np.asarray(picks, dtype=np.int64))
    agents = batch.non_tensor_batch.get("agent_name")
    names = np.empty(len(conts), dtype=object)
    histories = np.empty(len(conts), dtype=object)
    for j, c in enumerate(conts):
        if c.branch_node == ROOT:
            names[j] = default_agent if agents is None else agents[j]
        else:
            names[j], histories[j] = CONTINUATION_AGENT, anchor_history(trees[c.tree], c.branch_node)
    batch.non_tensor_batch["agent_name"] = names
    batch.non_tensor_batch[HISTORY_KEY] = histories
    return batch, conts


def attach_continuations(trees: Sequence[RolloutTree], conts: Sequence[Continuation],
                         rows: Sequence[RowTokens]) -> list[int]:
    """Each continuation's output row as a trajectory of its tree (its turns after the anchor's
    history, its reward); returns their trajectory ids. A row whose tokens do not start with its
    anchor's exact history is refused."""
    ids = []
    for c, row in zip(conts, rows, strict=True):
        tree = trees[c.tree]
        if row.prompt_ids != tree.root.token_ids:
            raise ValueError(f"prompt {tree.prompt_id!r}: a continuation came back with other prompt tokens")
        if c.branch_node != ROOT:
            h = anchor_history(tree, c.branch_node)
            if row.response_ids[:c.offset] != h.response_ids or row.response_mask[:c.offset] != h.response_mask:
                raise ValueError(f"prompt {tree.prompt_id!r}: the continuation from node {c.branch_node} does not "
                                 "start with its anchor's exact history")
        if row.reward is None:
            raise ValueError(f"prompt {tree.prompt_id!r}: a continuation has no reward (rm_scores)")
        traj = tree.start_trajectory("continuation", c.branch_node)
        _add_turns(tree, traj, row, c.offset, 0)
        tree.finish(traj, row.reward)
        ids.append(traj)
    return ids


# ---------------------------------------------------------------------- the rows verl trains on
def _aligned(parts: Sequence[Any]) -> list[Any]:
    """``parts`` with the same non-tensor keys (missing ones filled with None) and without
    the continuations' own fields."""
    keys = set().union(*(p.non_tensor_batch.keys() for p in parts)) - {HISTORY_KEY}
    for p in parts:
        p.non_tensor_batch.pop(HISTORY_KEY, None)
        for k in keys - set(p.non_tensor_batch):
            p.non_tensor_batch[k] = np.full(len(p), None, dtype=object)
    return list(parts)


def merge_rows(groups: Sequence[tuple[str, Sequence[int]]], trees: Sequence[RolloutTree], root_out: Any,
               root_rows: Sequence[Sequence[int]], cont_out: Any | None, conts: Sequence[Continuation],
               cont_trajs: Sequence[int]) -> tuple[Any, dict[str, list[TreeRowId]]]:
    """The step's output in the order of verl's request rows: prompt ``g``'s slots
    (``groups[g][1]``) take its bare rows (``root_rows[g]`` of ``root_out``, trajectories 0..m-1)
    then its continuations (rows of ``cont_out``), each continuation's shared history masked 0 in
    ``response_mask``. Returns the batch and each prompt's :class:`TreeRowId`\\ s in row order."""
    from verl import DataProto

    meta = dict(root_out.meta_info)
    if cont_out is None:
        merged = root_out
    else:
        parts = _aligned([root_out, cont_out])
        for part in parts:  # each call's timing is its own: the step's meta_info is the roots'
            part.meta_info = {}
        merged = DataProto.concat(parts)
        merged.meta_info = meta
    n_root = len(root_out)
    total = sum(len(slots) for _, slots in groups)
    order = np.full(total, -1, dtype=np.int64)
    issued: dict[str, list[TreeRowId]] = {}
    cont_of: dict[int, list[int]] = {}
    for j, c in enumerate(conts):
        cont_of.setdefault(c.tree, []).append(j)
    mask = merged.batch["response_mask"].clone()
    for g, (key, slots) in enumerate(groups):
        members = [(r, TreeRowId(key, trees[g], t)) for t, r in enumerate(root_rows[g])]
        for j in cont_of.get(g, []):
            c = conts[j]
            members.append((n_root + j, TreeRowId(key, trees[g], cont_trajs[j], c.offset)))
            mask[n_root + j, :c.offset] = 0
        if len(members) != len(slots):
            raise AssertionError(f"prompt {key!r}: {len(members)} trajectories for {len(slots)} rows")
        for slot, (row, _) in zip(slots, members, strict=True):
            order[slot] = row
        issued[key] = [rid for _, rid in members]
    if (order < 0).any():
        raise AssertionError("some request rows got no trajectory")
    merged.batch["response_mask"] = mask
    return merged.select_idxs(order), issued


def prompt_groups(uids: Sequence[Any]) -> list[tuple[str, list[int]]]:
    """Each prompt's rows among verl's request rows (by uid, in order of first appearance)."""
    groups: dict[str, list[int]] = {}
    for i, u in enumerate(uids):
        groups.setdefault(str(u), []).append(i)
    return list(groups.items())


def bare_counts(groups: Sequence[tuple[str, Sequence[int]]], expansion_N: int) -> list[int]:
    """Each prompt's bare rollouts ``m = n/(1+N)`` of its ``n`` rows (method §3: ``m·N`` more are
    continuations)."""
    out = []
    for key, slots in groups:
        n = len(slots)
        if n % (1 + expansion_N):
            raise ValueError(f"prompt {key!r} has {n} rows: rollout.n must be a multiple of 1 + N = "
                             f"{1 + expansion_N} (m bare rollouts and m·N continuations)")
        out.append(n // (1 + expansion_N))
    return out


def check_trainer_config(config: Any) -> None:
    """The trainer settings the manager's rows rely on; ValueError naming the one that is off."""
    trainer = config.get("trainer", {}) or {}
    if trainer.get("use_v1", False):
        raise ValueError("trace_core's agent-loop manager runs under verl's legacy trainer: set trainer.use_v1=false "
                         "(the V1 trainer hands its manager a TensorDict and reads rollouts from TransferQueue)")
    if trainer.get("balance_batch", True):
        raise ValueError("set trainer.balance_batch=false: the trace_tree estimator finds each row's trajectory by "
                         "its place among its prompt's rows, which balancing reorders")
    algorithm = config.get("algorithm", {}) or {}
    if algorithm.get("adv_estimator", None) != TRACE_ESTIMATOR:
        raise ValueError(f"set algorithm.adv_estimator={TRACE_ESTIMATOR}: a continuation's row masks its shared "
                         "history, and only the tree-aware advantage reads its trajectory's place in the tree")


# ---------------------------------------------------------------------- verl's classes
_CLASSES: dict[str, type] = {}


def verl_classes() -> dict[str, type]:
    """``ContinuationAgentLoop``, ``TraceAgentLoopWorker`` and ``TraceAgentLoopManager``, built
    once (importing verl) and registered as this module's attributes, so verl and Ray find them
    by name."""
    if _CLASSES:
        return _CLASSES
    import ray
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker, register
    from verl.experimental.agent_loop.tool_agent_loop import AgentState, ToolAgentLoop
    from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto
    from verl.utils.ray_utils import auto_await

    class ContinuationAgentLoop(ToolAgentLoop):
        """verl's tool loop started from a continuation row's ``trace_history`` (its anchor's exact
        token history) instead of the prompt's rendered messages; it then runs as verl's own: the
        next turn is generated from those tokens, its tool calls executed, to the episode's end.
        Its output is the prompt and the whole response (the history's, then its own), so its row
        has verl's widths; the history's turns count against ``multi_turn``'s turn limits and its
        tokens against ``response_length``. The conversation's ``messages`` hold the prompt's only:
        verl's Continuous Token builder renders each new tool result from the last assistant turn,
        which is the continuation's own."""

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            history = kwargs.pop(HISTORY_KEY, None)
            if not isinstance(history, AnchorHistory):
                raise ValueError(f"{CONTINUATION_AGENT}: a row needs its {HISTORY_KEY} (an AnchorHistory)")
            self._history = history
            self._logprobs = bool(sampling_params.get("logprobs"))
            return await super().run(sampling_params, **kwargs)

        async def _handle_pending_state(self, agent_data: Any, sampling_params: dict[str, Any]) -> Any:
            h = self._history
            agent_data.prompt_ids = list(h.prompt_ids) + list(h.response_ids)
            agent_data.response_mask = list(h.response_mask)
            if h.response_logprobs is not None:
                agent_data.response_logprobs = list(h.response_logprobs)
            elif self._logprobs:
                agent_data.response_logprobs = [0.0] * len(h.response_mask)
            spans = turn_spans(h.response_mask)
            agent_data.assistant_turns = sum(1 for a, b in spans if any(h.response_mask[a:b]))
            agent_data.user_turns = sum(1 for a, b in spans if not all(h.response_mask[a:b]))
            return AgentState.GENERATING

    class TraceAgentLoopWorker(AgentLoopWorker):
        """verl's agent-loop worker, in whose process ``trace_continuation`` is registered."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            register(CONTINUATION_AGENT)(ContinuationAgentLoop)
            super().__init__(*args, **kwargs)

    class TraceAgentLoopManager(AgentLoopManager):
        """verl's agent-loop manager whose step is TRACE's (this module's docstring). Set
        ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` to
        ``trace_core.integrations.verl_rollout.TraceAgentLoopManager``, with
        ``algorithm.adv_estimator=trace_tree``, ``trainer.balance_batch=false`` and
        ``trainer.use_v1=false``; the ``trace`` section (:class:`TraceVerlConfig`) names the method."""

        def __init__(self, config: Any, llm_client: Any, teacher_client: Any = None,
                     reward_loop_worker_handles: Any = None) -> None:
            from trace_core.methods import get_method

            check_trainer_config(config)
            self.agent_loop_workers_class = ray.remote(TraceAgentLoopWorker)
            super().__init__(config, llm_client, teacher_client, reward_loop_worker_handles)
            self.trace = TraceVerlConfig.from_verl(config)
            self.method = get_method(self.trace.method)
            check_method(self.method)
            self.predictor = _load_predictor(self.trace)
            self.rng = np.random.default_rng(self.trace.seed)
            self.last_trees: list[RolloutTree] = []

        async def _generate(self, batch: Any) -> Any:
            padded, pad = pad_dataproto_to_divisor(batch, len(self.agent_loop_workers))
            out = await AgentLoopManager.generate_sequences(self, padded)
            return unpad_dataproto(out, pad)

        @auto_await
        async def generate_sequences(self, prompts: Any) -> Any:
            if prompts.meta_info.get("validate", False):
                return await AgentLoopManager.generate_sequences(self, prompts)
            if "uid" not in prompts.non_tensor_batch:
                raise ValueError("TRACE groups a prompt's rows by their uid: the batch has none")
            groups = prompt_groups(prompts.non_tensor_batch["uid"])
            m = bare_counts(groups, self.trace.expansion_N)
            root_pick = np.concatenate([np.asarray(slots[:k]) for (_, slots), k in zip(groups, m, strict=True)])
            roots = prompts.select_idxs(root_pick)
            roots.non_tensor_batch["priority"] = np.arange(len(roots), dtype=np.int64)
            root_out = await self._generate(roots)
            starts = np.concatenate([[0], np.cumsum(m)])
            root_rows = [list(range(starts[g], starts[g + 1])) for g in range(len(groups))]
            trees = trees_from_rows(unpad_rows(root_out), [(key, rows) for (key, _), rows in
                                                           zip(groups, root_rows, strict=True)])
            budgets = [self.method.prefix_budget(k, self.trace.expansion_N) for k in m]
            placements = place_continuations(trees, budgets, self.method, predictor_scorer(self.predictor),
                                             self.rng)
            first = [int(slots[0]) for _, slots in groups]
            default_agent = self.rollout_config.agent.default_agent_loop
            cont_in, conts = continuation_batch(prompts, first, trees, placements, default_agent)
            cont_out, cont_trajs, timing = None, [], dict(root_out.meta_info.get("timing", {}))
            if cont_in is not None:
                cont_in.non_tensor_batch["priority"] = len(prompts) + np.arange(len(cont_in), dtype=np.int64)
                cont_out = await self._generate(cont_in)
                cont_trajs = attach_continuations(trees, conts, unpad_rows(cont_out))
                timing.update({f"trace_continuations/{k}": v for k, v in cont_out.meta_info.get("timing", {}).items()})
            out, issued = merge_rows(groups, trees, root_out, root_rows, cont_out, conts, cont_trajs)
            issue_row_ids(issued)
            self.last_trees = trees
            if self.trace.update_predictor:
                self.predictor.update(trees)
            out.meta_info["timing"] = {**timing, "trace/continuations": float(len(conts))}
            return out

    for cls in (ContinuationAgentLoop, TraceAgentLoopWorker, TraceAgentLoopManager):
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    register(CONTINUATION_AGENT)(ContinuationAgentLoop)
    _CLASSES.update(ContinuationAgentLoop=ContinuationAgentLoop, TraceAgentLoopWorker=TraceAgentLoopWorker,
                    TraceAgentLoopManager=TraceAgentLoopManager)
    return _CLASSES


def _load_predictor(trace: TraceVerlConfig) -> Any:
    from trace_core.predictor.config import PredictorConfig
    from trace_core.predictor.success_predictor import SuccessPredictor

    if trace.predictor_path:
        return SuccessPredictor.load(trace.predictor_path)
    return SuccessPredictor(PredictorConfig(**trace.predictor))


def __getattr__(name: str) -> Any:
    if name in ("ContinuationAgentLoop", "TraceAgentLoopWorker", "TraceAgentLoopManager"):
        return verl_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
