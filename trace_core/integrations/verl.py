"""TRACE inside verl, as far as verl allows without a fork.

verl (0.9) trains on rows of (prompt, response) with an outcome reward at the last response token,
groups rows by their ``uid`` and computes advantages with an estimator chosen by name
(``algorithm.adv_estimator``) from its registry (``verl.trainer.ppo.core_algos.register_adv_est``).
Three seams carry TRACE through it:

1. **Roots per prompt**: verl's agent loop rolls a prompt out ``prompt["__rollout_n__"]`` times
   when the prompt carries that field (else ``rollout.n``). :func:`rollout_n_column` turns the
   planner's root plan (:meth:`trace_core.StepPlanner.plan_roots`) into that column.
2. **The tree-aware advantage** as a registered estimator, ``trace_tree``
   (:func:`compute_tree_advantage`): each row's ``uid`` is a :class:`TreeRowId` — the rollout
   tree the row belongs to and its trajectory — so the estimator reads the tree's structure from
   the rows themselves and its rewards from verl's ``token_level_rewards`` (the reward manager
   stays verl's). It is method §6's advantage (:func:`trace_core.advantages.tree_advantages`),
   per token, 0 on observation tokens; with ``algorithm.norm_adv_by_std_in_grpo=False`` the
   std divisor is dropped. On trees without continuations it equals verl's own ``grpo``.
3. **A plug-in**: the ``verl.plugins`` entry point ``trace`` (``trace_core.integrations.verl_plugin``)
   registers the estimator when verl is imported, so ``algorithm.adv_estimator=trace_tree``
   works in an unmodified verl.

:func:`data_proto` builds verl's batch (``DataProto``) from a step's trees — the rows of
:mod:`trace_core.integrations.rows`: a continuation's prompt is its anchor's exact token history.
Continuations inside verl's own rollout (the agent-loop manager class,
``actor_rollout_ref.rollout.agent.agent_loop_manager_class``) are
:mod:`trace_core.integrations.verl_rollout`'s: its rows keep verl's layout (the prompt, then the
whole response, the anchor's history masked), which :class:`TreeRowId`'s ``offset`` describes, and
verl's legacy trainer hands the estimator its own string uids, which :func:`issue_row_ids` maps
back to the rows' trees.

verl is imported inside the functions that need it: importing this module needs only numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trace_core.advantages import get_advantage_estimator
from trace_core.integrations.rows import trajectory_rows
from trace_core.tree import RolloutTree

TRACE_ESTIMATOR = "trace_tree"  # algorithm.adv_estimator's value for TRACE's tree-aware advantage


@dataclass(frozen=True, eq=False)
class TreeRowId:
    """verl's ``uid`` of one row: trajectory ``trajectory`` of the rollout tree ``tree``, whose
    step-unique name is ``key``. Rows are equal (and hash alike) when their key and trajectory are:
    after Ray has pickled rows apart, two rows of one tree may hold two copies of it."""

    key: str  # unique within a step: the tree's prompt id, or the caller's uid of the prompt
    tree: RolloutTree
    trajectory: int
    # response tokens before the trajectory's own: 0 for a row whose prompt is its branch point's
    # history (data_proto's rows); for a continuation row in verl's layout (the task's prompt, then
    # the whole response) the length of its anchor's history after the prompt, masked 0 in the row
    offset: int = 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TreeRowId) and (self.key, self.trajectory) == (other.key, other.trajectory)

    def __hash__(self) -> int:
        return hash((self.key, self.trajectory))

    def __str__(self) -> str:
        return f"{self.key}#{self.trajectory}"


def rollout_n_column(m: np.ndarray) -> np.ndarray:
    """verl's ``__rollout_n__`` column (an object array of ints) for a batch of prompts from the
    planner's root counts ``m`` (``RootPlan.m``, pool order). A prompt with ``m_i = 0`` is not
    rolled out: drop it from the batch first (verl rolls a prompt out at least once)."""
    m = np.asarray(m)
    if m.ndim != 1 or not np.issubdtype(m.dtype, np.integer):
        raise ValueError(f"m must be a 1-d integer array of root counts, got dtype {m.dtype} shape {m.shape}")
    if (m < 1).any():
        raise ValueError(f"every prompt handed to verl needs m_i >= 1 (drop the m_i = 0 prompts), "
                         f"got m = {m.tolist()}")
    return np.array([int(x) for x in m], dtype=object)


def _with_rewards(tree: RolloutTree, rewards: dict[int, float]) -> RolloutTree:
    """A copy of ``tree`` whose trajectories end with ``rewards`` (verl's reward manager's)."""
    copy = RolloutTree.from_dict(tree.to_dict())
    for traj, reward in rewards.items():
        leaf = copy.trajectories[traj].leaf
        if leaf is None:
            raise ValueError(f"trajectory {traj} of prompt {tree.prompt_id!r} is unfinished: it has no row to train")
        copy.nodes[leaf].reward = float(reward)
    return copy


# The rows the agent-loop manager of trace_core.integrations.verl_rollout handed verl's trainer
# last, per prompt uid in row order: verl's legacy trainer keeps its own string uid on every row
# (ray_trainer.fit unions the rollout's rows into its batch, and DataProto.union refuses a uid
# that differs), so the estimator maps the k-th row of uid u back to the k-th row issued for u.
_ISSUED_ROWS: dict[str, list[TreeRowId]] = {}


def issue_row_ids(rows: dict[str, list[TreeRowId]]) -> None:
    """Record a step's rows (each prompt uid's TreeRowIds, in the order of its rows in the batch)
    for the estimator to find from the trainer's plain string uids; replaces the last step's."""
    _ISSUED_ROWS.clear()
    _ISSUED_ROWS.update({str(k): list(v) for k, v in rows.items()})


def _issued(ids: list[Any]) -> list[TreeRowId] | None:
    """The issued TreeRowIds of a batch whose uids are the trainer's strings, or None where some
    uid has no issued rows or more rows than were issued for it."""
    if not _ISSUED_ROWS or not all(isinstance(x, str) for x in ids):
        return None
    seen: dict[str, int] = {}
    out = []
    for uid in ids:
        k = seen.get(uid, 0)
        rows = _ISSUED_ROWS.get(uid)
        if rows is None or k >= len(rows):
            return None
        out.append(rows[k])
        seen[uid] = k + 1
    return out


def _row_ids(index: Sequence[Any]) -> list[TreeRowId]:
    ids = list(index)
    wrong = next((i for i, x in enumerate(ids) if not isinstance(x, TreeRowId)), None)
    if wrong is not None:
        issued = _issued(ids)
        if issued is not None:
            return issued
        raise ValueError(f"{TRACE_ESTIMATOR}: row {wrong}'s uid is {type(ids[wrong]).__name__} "
                         f"{ids[wrong]!r}, not a TreeRowId: build the batch with "
                         "trace_core.integrations.verl.data_proto (or give each row a TreeRowId uid), or "
                         "roll out with trace_core.integrations.verl_rollout's agent-loop manager, which "
                         "issues each prompt's rows")
    return ids


def tree_advantage_rows(rewards: np.ndarray, response_mask: np.ndarray, index: Sequence[Any],
                        estimator: str = "tree") -> np.ndarray:
    """Per-token advantages (float64, the shape of ``response_mask``) of a verl batch: row ``i``
    is trajectory ``index[i].trajectory`` of tree ``index[i].tree``, with outcome reward
    ``rewards[i]``. Every trajectory of every tree must be in the batch once, and each row's
    response mask must be 1 exactly where its trajectory's tokens are model-written (after the
    row's ``offset`` history tokens, which it masks). ``index`` may also be the plain string uids
    of verl's legacy trainer over rows issued by :func:`issue_row_ids`."""
    rewards = np.asarray(rewards, dtype=np.float64)
    response_mask = np.asarray(response_mask)
    ids = _row_ids(index)
    if not (len(ids) == len(rewards) == len(response_mask)):
        raise ValueError(f"{len(ids)} uids, {len(rewards)} rewards and {len(response_mask)} mask rows differ")
    rows_of: dict[str, dict[int, int]] = {}
    for i, rid in enumerate(ids):
        seen = rows_of.setdefault(rid.key, {})
        if rid.trajectory in seen:
            raise ValueError(f"trajectory {rid.trajectory} of tree {rid.key!r} is in the batch twice "
                             f"(rows {seen[rid.trajectory]} and {i})")
        seen[rid.trajectory] = i
    keys = list(rows_of)
    trees = []
    for key in keys:
        tree = ids[next(iter(rows_of[key].values()))].tree
        missing = sorted(set(range(len(tree.trajectories))) - set(rows_of[key]))
        if missing:
            raise ValueError(f"tree {key!r}: trajectories {missing} have no row; the tree-aware advantage "
                             "compares every branch of a tree, so a tree trains whole or not at all")
        trees.append(_with_rewards(tree, {t: rewards[i] for t, i in rows_of[key].items()}))
    node_advantages = get_advantage_estimator(estimator)(trees)
    out = np.zeros(response_mask.shape, dtype=np.float64)
    for row in trajectory_rows(trees, node_advantages):
        i = rows_of[keys[row.tree]][row.trajectory]
        n, h = len(row.completion_ids), ids[i].offset
        mask = response_mask[i]
        if (h + n > mask.shape[0] or mask[:h].any() or mask[h + n:].any()
                or not np.array_equal(mask[h:h + n] != 0, np.asarray(row.tool_mask) == 1)):
            raise ValueError(f"row {i} ({ids[i]}): its response mask is not its trajectory's tool mask "
                             f"(1 on its {sum(row.tool_mask)} model-written tokens of {n} after {h} "
                             "history tokens, 0 elsewhere)")
        out[i, h:h + n] = row.advantages
    return out


def compute_tree_advantage(token_level_rewards: Any, response_mask: Any, index: Any = None, config: Any = None,
                           **kwargs: Any) -> tuple[Any, Any]:
    """verl's estimator signature for :func:`tree_advantage_rows` (tensors in and out; the
    advantages are also the returns, as verl's ``grpo`` does). ``config`` is verl's algorithm
    config: ``norm_adv_by_std_in_grpo=False`` drops the std divisor."""
    import torch

    if index is None:
        raise ValueError(f"{TRACE_ESTIMATOR} needs the batch's uids (non_tensor_batch['uid'], TreeRowId each)")
    scale = True if config is None else bool(_config_value(config, "norm_adv_by_std_in_grpo", True))
    rewards = token_level_rewards.detach().float().sum(dim=-1).cpu().numpy()
    advantages = tree_advantage_rows(rewards, response_mask.detach().cpu().numpy(), index,
                                     "tree" if scale else "tree-no-std")
    out = torch.as_tensor(advantages, dtype=token_level_rewards.dtype, device=token_level_rewards.device)
    return out, out


def _config_value(config: Any, name: str, default: Any) -> Any:
    getter = getattr(config, "get", None)
    return getter(name, default) if callable(getter) else getattr(config, name, default)


def register() -> None:
    """Register :func:`compute_tree_advantage` in verl's estimator registry as ``trace_tree``
    (again is harmless: verl accepts the same function twice)."""
    from verl.trainer.ppo.core_algos import register_adv_est

    register_adv_est(TRACE_ESTIMATOR)(compute_tree_advantage)


def data_proto(trees: Sequence[RolloutTree], pad_token_id: int, keys: Sequence[str] | None = None) -> Any:
    """verl's ``DataProto`` of a step's trees, one row per trajectory (tree by tree, a tree's bare
    rollouts first): ``prompts`` (left-padded: the prompt, or a continuation's anchor history),
    ``responses`` (right-padded: the trajectory's own turns, observations included),
    ``response_mask`` (1 on model-written tokens), ``input_ids``/``attention_mask``/``position_ids``
    (prompt then response), ``token_level_rewards`` (the trajectory's reward at its last
    response token) and ``non_tensor_batch['uid']`` (a :class:`TreeRowId` per row). ``keys``
    names the trees (default: their prompt ids, which must then be distinct)."""
    import torch
    from verl import DataProto

    keys = [t.prompt_id for t in trees] if keys is None else list(keys)
    if len(keys) != len(trees) or len(set(keys)) != len(keys):
        raise ValueError(f"each tree needs a distinct key; got {keys} for {len(trees)} trees")
    rows = trajectory_rows(trees, [np.zeros(len(t.nodes)) for t in trees])
    if not rows:
        raise ValueError("no trajectories: nothing to put in a DataProto")
    width_p = max(len(r.prompt_ids) for r in rows)
    width_r = max(len(r.completion_ids) for r in rows)
    b = len(rows)
    prompts = torch.full((b, width_p), pad_token_id, dtype=torch.long)
    responses = torch.full((b, width_r), pad_token_id, dtype=torch.long)
    prompt_attn = torch.zeros((b, width_p), dtype=torch.long)
    response_mask = torch.zeros((b, width_r), dtype=torch.long)
    response_attn = torch.zeros((b, width_r), dtype=torch.long)
    rewards = torch.zeros((b, width_r), dtype=torch.float32)
    for i, r in enumerate(rows):
        p, n = len(r.prompt_ids), len(r.completion_ids)
        prompts[i, width_p - p:] = torch.tensor(r.prompt_ids, dtype=torch.long)
        prompt_attn[i, width_p - p:] = 1
        responses[i, :n] = torch.tensor(r.completion_ids, dtype=torch.long)
        response_attn[i, :n] = 1
        response_mask[i, :n] = torch.tensor(r.tool_mask, dtype=torch.long)
        rewards[i, n - 1] = r.reward
    attention = torch.cat([prompt_attn, response_attn], dim=1)
    uids = np.empty(b, dtype=object)
    uids[:] = [TreeRowId(keys[r.tree], trees[r.tree], r.trajectory) for r in rows]
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "response_mask": response_mask,
                 "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention,
                 "position_ids": (attention.cumsum(dim=1) - 1).clamp_min(0), "token_level_rewards": rewards},
        non_tensors={"uid": uids})
