"""One row per trajectory: how a step's rollout trees become the rows of a trainer's batch.

TRL and verl both train on rows of (prompt ids, completion ids): one row per trajectory. A bare
rollout's prompt is the task's prompt; a continuation's is its anchor's exact token history, so
the row is the sequence the policy sampled. Each completion token carries its node's advantage
(method §6) and a tool mask that is 0 exactly on observation tokens. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trace_core.advantages import token_advantages
from trace_core.tree import RolloutTree


@dataclass(frozen=True)
class TrajectoryRow:
    """One row of a trainer's batch: one trajectory of one tree."""

    tree: int  # index of its tree among the step's trees
    trajectory: int  # its id in that tree
    kind: str  # "bare" or "continuation"
    branch_node: int  # the node it started from (the root for a bare rollout)
    prompt_ids: list[int]  # the exact history it started from: the prompt, or its anchor's history
    completion_ids: list[int]  # its own turns' tokens (model-written and observations)
    tool_mask: list[int]  # per completion token: 1 model-written (trained on), 0 observation
    advantages: np.ndarray  # float64 per completion token: its node's advantage, 0.0 on observations
    reward: float  # the trajectory's reward
    # per completion token: the log-prob the engine sampled it with (0.0 on observations); None
    # where a node of the trajectory carries none
    sampling_logprobs: list[float] | None = None


def trajectory_rows(trees: Sequence[RolloutTree], advantages: Sequence[np.ndarray]) -> list[TrajectoryRow]:
    """One row per trajectory, tree by tree and in trajectory order (a tree's bare rollouts first)."""
    rows = []
    for t, (tree, adv) in enumerate(zip(trees, advantages, strict=True)):
        per_token = token_advantages(tree, adv)  # the observation tokens masked
        start = np.concatenate([[0], np.cumsum([len(n.token_ids) for n in tree.nodes])])
        for traj in tree.trajectories:
            ids, mask, values, logprobs = [], [], [], []
            for node in traj.nodes:
                ids += tree.nodes[node].token_ids
                mask += tree.nodes[node].loss_mask
                values.append(per_token.advantage[start[node]:start[node + 1]])
                node_logprobs = tree.nodes[node].logprobs
                logprobs = None if logprobs is None or node_logprobs is None else logprobs + node_logprobs
            rows.append(TrajectoryRow(t, traj.id, traj.kind, traj.branch_node, tree.history_tokens(traj.branch_node),
                                      ids, mask, np.concatenate(values), tree.trajectory_reward(traj.id), logprobs))
    return rows
