"""The rollout tree of one prompt (method §1, §5, §6).

A tree holds the prompt as its root (depth 0) and one node per ReAct turn. Each node stores the
token ids it adds to the history — the model-written thought/action tokens followed by the
observation tokens — with a loss mask (1 = written by the model and trained on, 0 = observation
or prompt). A history ``H_t`` is the concatenation of the tokens on the path root → node, so a
prefix is never re-rendered from text.

Every non-root node belongs to exactly one *trajectory*: a bare rollout (started at the root) or
a continuation (started at an anchor of a bare rollout). A trajectory's own nodes are those it
generated after its branching point; it ends at a terminal node carrying its reward.

Node ids are assigned in creation order, so a parent's id is always smaller than its children's;
the recursive quantities below are computed in one reverse sweep over the ids.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

NodeKind = Literal["root", "bare", "continuation"]
ROOT = 0


@dataclass
class TurnNode:
    """One turn ``<thought, action, observation>`` (or the prompt, at the root)."""

    id: int
    parent: int  # -1 at the root
    depth: int  # 0 at the root, t for the t-th turn
    kind: NodeKind  # kind of the trajectory that generated this node
    trajectory: int  # id of that trajectory; -1 at the root
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1 = model-written, 0 = observation/prompt
    logprobs: list[float] | None = None  # engine log-probs, aligned with token_ids (0.0 where masked)
    terminal: bool = False
    reward: float | None = None  # set on terminal nodes only
    children: list[int] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # JSON-able extras (action text, tool error, …)


@dataclass
class Trajectory:
    """A bare rollout or a continuation: a branching node plus the nodes it generated."""

    id: int
    kind: NodeKind  # "bare" or "continuation"
    branch_node: int  # the node it continues from (the root for a bare rollout)
    nodes: list[int] = field(default_factory=list)
    leaf: int | None = None  # terminal node once finished

    @property
    def finished(self) -> bool:
        return self.leaf is not None


class RolloutTree:
    """Rollout tree of one prompt. Build it with :meth:`start_trajectory`, :meth:`add_turn`
    and :meth:`finish`; read it with the accessors and the value functions below."""

    def __init__(
        self,
        prompt_id: str,
        prompt_token_ids: list[int] | None = None,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.prompt_id = str(prompt_id)
        ids = list(prompt_token_ids or [])
        root = TurnNode(
            id=ROOT, parent=-1, depth=0, kind="root", trajectory=-1,
            token_ids=ids, loss_mask=[0] * len(ids), info=dict(info or {}),
        )
        self.nodes: list[TurnNode] = [root]
        self.trajectories: list[Trajectory] = []

    # ------------------------------------------------------------------ building
    def start_trajectory(self, kind: NodeKind, branch_node: int = ROOT) -> int:
        """Open a new trajectory branching from ``branch_node``; returns its id.

        A bare rollout branches from the root; a continuation from an anchor (or, for a prompt
        without anchors, from the root: method §3's extra root rollouts)."""
        if kind not in ("bare", "continuation"):
            raise ValueError(f"trajectory kind must be 'bare' or 'continuation', got {kind!r}")
        self._check_node(branch_node, "branch_node")
        if self.nodes[branch_node].terminal:
            raise ValueError(f"branch_node {branch_node} is terminal: nothing can follow it")
        if kind == "bare" and branch_node != ROOT:
            raise ValueError(f"a bare rollout starts at the root, got branch_node={branch_node}")
        traj = Trajectory(id=len(self.trajectories), kind=kind, branch_node=branch_node)
        self.trajectories.append(traj)
        return traj.id

    def add_turn(
        self,
        trajectory: int,
        token_ids: list[int],
        loss_mask: list[int],
        logprobs: list[float] | None = None,
        info: dict[str, Any] | None = None,
    ) -> int:
        """Append one turn to ``trajectory`` (after its last node, or its branch node)."""
        traj = self._traj(trajectory)
        if traj.finished:
            raise ValueError(f"trajectory {trajectory} is finished; it takes no more turns")
        if len(token_ids) != len(loss_mask):
            raise ValueError(
                f"token_ids ({len(token_ids)}) and loss_mask ({len(loss_mask)}) differ in length"
            )
        if any(m not in (0, 1) for m in loss_mask):
            raise ValueError("loss_mask values must be 0 or 1")
        if logprobs is not None and len(logprobs) != len(token_ids):
            raise ValueError(f"logprobs ({len(logprobs)}) and token_ids ({len(token_ids)}) differ in length")
        parent = traj.nodes[-1] if traj.nodes else traj.branch_node
        node = TurnNode(
            id=len(self.nodes), parent=parent, depth=self.nodes[parent].depth + 1,
            kind=traj.kind, trajectory=traj.id, token_ids=[int(t) for t in token_ids],
            loss_mask=[int(m) for m in loss_mask],
            logprobs=None if logprobs is None else [float(x) for x in logprobs],
            info=dict(info or {}),
        )
        self.nodes.append(node)
        self.nodes[parent].children.append(node.id)
        traj.nodes.append(node.id)
        return node.id

    def finish(self, trajectory: int, reward: float) -> int:
        """Mark the trajectory's last node terminal with ``reward``; returns that node's id."""
        traj = self._traj(trajectory)
        if not traj.nodes:
            raise ValueError(f"trajectory {trajectory} has no turns; it cannot finish")
        if traj.finished:
            raise ValueError(f"trajectory {trajectory} is already finished")
        reward = float(reward)
        if not np.isfinite(reward):
            raise ValueError(f"reward must be finite, got {reward}")
        leaf = self.nodes[traj.nodes[-1]]
        leaf.terminal, leaf.reward = True, reward
        traj.leaf = leaf.id
        return leaf.id

    # ------------------------------------------------------------------ structure
    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def root(self) -> TurnNode:
        return self.nodes[ROOT]

    def path(self, node: int) -> list[int]:
        """Node ids from the root to ``node`` inclusive."""
        self._check_node(node, "node")
        out = []
        while node != -1:
            out.append(node)
            node = self.nodes[node].parent
        return out[::-1]

    def history_tokens(self, node: int) -> list[int]:
        """Token ids of the history ``H`` ending at ``node`` (prompt + turns)."""
        return [t for n in self.path(node) for t in self.nodes[n].token_ids]

    def history_loss_mask(self, node: int) -> list[int]:
        return [m for n in self.path(node) for m in self.nodes[n].loss_mask]

    def leaves(self) -> list[int]:
        """Terminal nodes (one per finished trajectory)."""
        return [n.id for n in self.nodes if n.terminal]

    def bare_trajectories(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t.kind == "bare"]

    def anchors(self) -> list[int]:
        """method §1's ``A_i``: non-root, non-terminal nodes generated by a bare rollout."""
        return [n.id for n in self.nodes if n.kind == "bare" and not n.terminal]

    def bare_length(self, node: int) -> int:
        """Number of turns ``T`` of the bare rollout that generated ``node``."""
        traj = self._traj(self.nodes[node].trajectory)
        return self.nodes[traj.nodes[-1]].depth

    def relative_position(self, node: int) -> float:
        """``t / T`` for an anchor at turn ``t`` of a bare rollout with ``T`` turns."""
        return self.nodes[node].depth / self.bare_length(node)

    def branching_nodes(self) -> list[int]:
        """The root and every node with ≥ 2 children (method §6)."""
        return [n.id for n in self.nodes if n.id == ROOT or len(n.children) >= 2]

    def expanded_anchors(self) -> list[int]:
        """Anchors from which at least one continuation was started."""
        starts = {t.branch_node for t in self.trajectories if t.kind == "continuation"}
        return [a for a in self.anchors() if a in starts]

    def branch_group(self, node: int) -> list[int]:
        """Trajectories whose outcomes form ``node``'s group: those that pass through ``node``'s
        children and branched at ``node`` or above (for an expanded anchor: the bare rollout
        through it and its K continuations)."""
        out = []
        for c in self.nodes[node].children:
            out.append(self.nodes[c].trajectory)
        return out

    def trajectory_reward(self, trajectory: int) -> float:
        traj = self._traj(trajectory)
        if traj.leaf is None:
            raise ValueError(f"trajectory {trajectory} of prompt {self.prompt_id!r} is not finished")
        return float(self.nodes[traj.leaf].reward)  # type: ignore[arg-type]

    def num_generated_tokens(self) -> int:
        """Model-written tokens of all trajectories (each distinct node counted once)."""
        return sum(sum(n.loss_mask) for n in self.nodes[1:])

    # ------------------------------------------------------------------ values
    def _require_complete(self) -> None:
        for n in self.nodes[1:]:
            if not n.children and not n.terminal:
                raise ValueError(
                    f"prompt {self.prompt_id!r}: node {n.id} is a leaf without a reward "
                    f"(trajectory {n.trajectory} unfinished)"
                )

    def leaf_counts(self) -> np.ndarray:
        """method §5's ``n_y``: number of leaves below each node (1 at a leaf)."""
        self._require_complete()
        n = np.zeros(len(self.nodes), dtype=np.int64)
        for node in reversed(self.nodes):
            if node.terminal and not node.children:
                n[node.id] = 1
            else:
                n[node.id] = sum(n[c] for c in node.children) + (1 if node.terminal else 0)
        return n

    def tree_values(self) -> np.ndarray:
        """method §5's tree-backed targets ``V̂(y)``: the mean reward of the leaves below ``y``
        (recursively ``Σ_c n_c V̂(c) / n_y``). NaN for a root with no leaves."""
        self._require_complete()
        n = np.zeros(len(self.nodes), dtype=np.int64)
        s = np.zeros(len(self.nodes), dtype=np.float64)
        for node in reversed(self.nodes):
            if node.terminal:
                n[node.id], s[node.id] = 1, float(node.reward)  # type: ignore[arg-type]
            for c in node.children:
                n[node.id] += n[c]
                s[node.id] += s[c]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, s / np.maximum(n, 1), np.nan)

    def branch_uniform_values(self) -> np.ndarray:
        """method §6's ``U(y)``: ``r_y`` at a leaf, else the plain mean of the children's ``U``
        (each child counts once, however many leaves it holds). NaN for an empty root."""
        self._require_complete()
        u = np.full(len(self.nodes), np.nan, dtype=np.float64)
        for node in reversed(self.nodes):
            if node.terminal:
                u[node.id] = float(node.reward)  # type: ignore[arg-type]
            elif node.children:
                u[node.id] = float(np.mean([u[c] for c in node.children]))
        return u

    def outcomes(self) -> np.ndarray:
        """Rewards of all finished trajectories."""
        return np.array([self.nodes[t.leaf].reward for t in self.trajectories if t.leaf is not None])

    # ------------------------------------------------------------------ serialization
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "trace-rl/rollout-tree/v1",
            "prompt_id": self.prompt_id,
            "nodes": [
                {
                    "id": n.id, "parent": n.parent, "depth": n.depth, "kind": n.kind,
                    "trajectory": n.trajectory, "token_ids": n.token_ids, "loss_mask": n.loss_mask,
                    "logprobs": n.logprobs, "terminal": n.terminal, "reward": n.reward,
                    "children": n.children, "info": n.info,
                }
                for n in self.nodes
            ],
            "trajectories": [
                {"id": t.id, "kind": t.kind, "branch_node": t.branch_node, "nodes": t.nodes, "leaf": t.leaf}
                for t in self.trajectories
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutTree:
        if data.get("format") != "trace-rl/rollout-tree/v1":
            raise ValueError(f"not a rollout tree (format={data.get('format')!r})")
        tree = cls.__new__(cls)
        tree.prompt_id = data["prompt_id"]
        tree.nodes = [TurnNode(**n) for n in data["nodes"]]
        tree.trajectories = [Trajectory(**t) for t in data["trajectories"]]
        tree.validate()
        return tree

    def to_json(self) -> str:
        # json writes floats with repr(), which round-trips every float64 exactly.
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> RolloutTree:
        return cls.from_dict(json.loads(text))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RolloutTree) and self.to_dict() == other.to_dict()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Check the structural invariants; raises ValueError naming the first broken one."""
        for i, n in enumerate(self.nodes):
            if n.id != i:
                raise ValueError(f"node at position {i} has id {n.id}")
            if i == ROOT:
                if n.parent != -1 or n.depth != 0:
                    raise ValueError("the root must have parent -1 and depth 0")
                continue
            if not 0 <= n.parent < i:
                raise ValueError(f"node {i}: parent {n.parent} must precede it")
            if i not in self.nodes[n.parent].children:
                raise ValueError(f"node {i} is missing from its parent's children")
            if n.depth != self.nodes[n.parent].depth + 1:
                raise ValueError(f"node {i}: depth {n.depth} != parent depth + 1")
            if len(n.token_ids) != len(n.loss_mask):
                raise ValueError(f"node {i}: token_ids and loss_mask differ in length")
            if n.terminal != (n.reward is not None):
                raise ValueError(f"node {i}: terminal nodes, and only they, carry a reward")
            if n.terminal and n.children:
                raise ValueError(f"node {i} is terminal but has children")

    def _check_node(self, node: int, name: str) -> None:
        if not 0 <= node < len(self.nodes):
            raise ValueError(f"{name}={node} is not a node of prompt {self.prompt_id!r} (0..{len(self.nodes) - 1})")

    def _traj(self, trajectory: int) -> Trajectory:
        if not 0 <= trajectory < len(self.trajectories):
            raise ValueError(f"trajectory {trajectory} does not exist in prompt {self.prompt_id!r}")
        return self.trajectories[trajectory]


# ---------------------------------------------------------------------- files of trees
def save_trees(path: str | Path, trees: Sequence[RolloutTree]) -> Path:
    """Write ``trees`` as gzip-compressed JSON lines, one tree per line in its lossless format
    (:meth:`RolloutTree.to_json`). Written to a temporary name and renamed, so a reader never
    sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        for tree in trees:
            f.write(tree.to_json() + "\n")
    os.replace(tmp, path)
    return path


def load_trees(path: str | Path) -> list[RolloutTree]:
    """The trees of a :func:`save_trees` file, in order (each validated)."""
    with gzip.open(Path(path), "rt", encoding="utf-8") as f:
        return [RolloutTree.from_json(line) for line in f if line.strip()]
