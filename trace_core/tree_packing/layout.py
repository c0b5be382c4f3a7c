"""Tree packing: many histories that share prefixes, as one token sequence per forward.

A *token tree* is a list of nodes, each adding some token ids to the history of its parent
(parents precede children). Packing lays the chosen nodes of one or more token trees out in
node-id order, each distinct token once, and describes the attention pattern that makes the
packed forward equal to running every history separately:

- token ``q`` may attend to token ``k`` iff ``k``'s node is an ancestor of (or is) ``q``'s node
  and ``k <= q`` (inside one node that is the causal order; an ancestor's tokens always come
  earlier, since parents precede children);
- a token's position id is its offset in its own history (its depth), not its offset in the
  packed sequence, so RoPE sees exactly what a separate forward would see.

A node is read out at the last token of its history: its own last token, or — for a node that
adds no tokens — its nearest ancestor's. Pure numpy, and every array of a :class:`Pack` is
linear in its tokens or its segments: the attention pattern is described by each segment's
parent, never by a token × token matrix (:mod:`trace_core.tree_packing.attention` turns it into
a sparse plan, or — for reference — a dense mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trace_core.tree import RolloutTree


@dataclass(frozen=True)
class TokenTree:
    """The token structure of a rollout tree (or of a lone history): ``parents[0] == -1``,
    ``parents[n] < n`` otherwise; ``tokens[n]`` are the ids node ``n`` appends."""

    parents: np.ndarray  # int64 (n_nodes,)
    tokens: list[np.ndarray]  # int64 arrays, one per node (may be empty)

    def __post_init__(self) -> None:
        if self.parents.ndim != 1 or self.parents.size == 0 or len(self.tokens) != self.parents.size:
            raise ValueError("a token tree needs one parent and one token array per node (at least a root)")
        later = self.parents[1:]
        if self.parents[0] != -1 or np.any(later < 0) or np.any(later >= np.arange(1, self.parents.size)):
            raise ValueError("parents must be -1 at node 0 and precede each other node")

    @property
    def num_tokens(self) -> int:
        return int(sum(t.size for t in self.tokens))


def tree_tokens(tree: RolloutTree) -> TokenTree:
    """A rollout tree's token structure (prompt tokens at the root, each turn's tokens below)."""
    if not isinstance(tree, RolloutTree):
        raise ValueError(f"expected a RolloutTree, got {type(tree).__name__}")
    return TokenTree(
        parents=np.array([n.parent for n in tree.nodes], dtype=np.int64),
        tokens=[np.asarray(n.token_ids, dtype=np.int64) for n in tree.nodes],
    )


def history_tokens(history: Sequence[int]) -> TokenTree:
    """A lone history as a one-node token tree (no sharing with anything else)."""
    tokens = np.asarray(list(history), dtype=np.int64)
    return TokenTree(parents=np.array([-1], dtype=np.int64), tokens=[tokens])


def path_tokens(tree: RolloutTree, leaf: int) -> TokenTree:
    """The root → ``leaf`` path of a rollout tree as a chain (node ``j`` = the path's ``j``-th node)."""
    path = tree.path(leaf)
    return TokenTree(
        parents=np.arange(-1, len(path) - 1, dtype=np.int64),
        tokens=[np.asarray(tree.nodes[n].token_ids, dtype=np.int64) for n in path],
    )


def ancestor_closure(parents: np.ndarray, nodes: Sequence[int] | np.ndarray | None) -> np.ndarray:
    """Boolean mask of ``nodes`` and all their ancestors (all nodes when ``nodes`` is None)."""
    keep = np.zeros(parents.size, dtype=bool)
    if nodes is None:
        keep[:] = True
        return keep
    for n in np.asarray(nodes, dtype=np.int64).ravel().tolist():
        if not 0 <= n < parents.size:
            raise ValueError(f"node {n} is not in the tree (it has {parents.size} nodes)")
        while n != -1 and not keep[n]:
            keep[n] = True
            n = int(parents[n])
    return keep


@dataclass(frozen=True)
class Pack:
    """One forward's worth of packed token trees."""

    items: list[int]  # indices (into the packed sequence of token trees) of the trees in this pack
    token_ids: np.ndarray  # int64 (L,): each distinct token of the chosen nodes, once, in node-id order
    position_ids: np.ndarray  # int64 (L,): offset of each token in its own history
    token_segment: np.ndarray  # int64 (L,): packed node (segment) of each token
    segment_parent: np.ndarray  # int64 (S,): nearest ancestor segment (-1 = none); segment = node w/ tokens
    segment_start: np.ndarray  # int64 (S,): first token index of each segment
    segment_length: np.ndarray  # int64 (S,): tokens of each segment
    readout: list[np.ndarray]  # per item: token index where each node is read (-1 = node not packed)

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.size)

    @property
    def segment_history(self) -> np.ndarray:
        """int64 (S,): tokens before each segment in its own history (its ancestors' tokens)."""
        hist = np.zeros(self.segment_parent.size, dtype=np.int64)
        for s, p in enumerate(self.segment_parent.tolist()):  # parents precede children
            if p >= 0:
                hist[s] = hist[p] + self.segment_length[p]
        return hist

    @property
    def segment_ancestors(self) -> np.ndarray:
        """bool (S, S): ``[s, a]`` = segment ``a`` is ``s`` or an ancestor of ``s``. Quadratic in the
        segments: only the dense reference mask reads it."""
        n = self.segment_parent.size
        anc = np.zeros((n, n), dtype=bool)
        for s, p in enumerate(self.segment_parent.tolist()):  # a parent's row is complete first
            if p >= 0:
                anc[s] = anc[p]
            anc[s, s] = True
        return anc


@dataclass
class _Laid:
    tokens: np.ndarray
    positions: np.ndarray
    segment_of_token: np.ndarray  # local segment index per token
    segment_parent: np.ndarray  # local parent segment per segment (-1 = none)
    readout: np.ndarray  # local token index per node (-1 = not packed)


def _lay_out(tt: TokenTree, keep: np.ndarray, max_length: int | None, item: int) -> _Laid:
    n = tt.parents.size
    hist_len = np.zeros(n, dtype=np.int64)
    readout = np.full(n, -1, dtype=np.int64)
    segment_of_node = np.full(n, -1, dtype=np.int64)
    seg_parent: list[int] = []
    toks: list[np.ndarray] = []
    pos: list[np.ndarray] = []
    segs: list[np.ndarray] = []
    offset = 0
    for node in np.flatnonzero(keep).tolist():
        parent = int(tt.parents[node])
        if parent != -1 and not keep[parent]:
            raise ValueError(f"token tree {item}: node {node} is packed without its parent {parent}")
        t = tt.tokens[node]
        start = hist_len[parent] if parent != -1 else 0
        hist_len[node] = start + t.size
        if max_length is not None and hist_len[node] > max_length:
            raise ValueError(
                f"token tree {item}: the history ending at node {node} has {hist_len[node]} tokens, "
                f"more than max_length={max_length}"
            )
        if t.size:
            segment_of_node[node] = len(seg_parent)
            # the parent segment is the nearest ancestor that has tokens
            seg_parent.append(int(segment_of_node[parent]) if parent != -1 else -1)
            toks.append(t)
            pos.append(start + np.arange(t.size, dtype=np.int64))
            segs.append(np.full(t.size, segment_of_node[node], dtype=np.int64))
            offset += t.size
            readout[node] = offset - 1
        else:
            segment_of_node[node] = segment_of_node[parent] if parent != -1 else -1
            readout[node] = readout[parent] if parent != -1 else -1
        if readout[node] < 0:
            raise ValueError(f"token tree {item}: the history ending at node {node} holds no tokens")
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64))  # noqa: E731
    return _Laid(cat(toks), cat(pos), cat(segs), np.array(seg_parent, dtype=np.int64), readout)


def pack_token_trees(
    token_trees: Sequence[TokenTree],
    selections: Sequence[np.ndarray | None] | None = None,
    max_tokens_per_forward: int = 8192,
    max_length: int | None = None,
) -> list[Pack]:
    """Pack token trees greedily, in order, into forwards of at most ``max_tokens_per_forward``
    tokens (a tree larger than that gets a forward of its own: packs never split a tree, so
    every distinct token is processed exactly once).

    ``selections[i]`` is a boolean mask of tree ``i``'s nodes to pack (ancestor-closed, see
    :func:`ancestor_closure`); None packs every node. Trees with nothing selected are skipped.
    """
    if max_tokens_per_forward < 1:
        raise ValueError(f"max_tokens_per_forward must be >= 1, got {max_tokens_per_forward}")
    if selections is None:
        selections = [None] * len(token_trees)
    if len(selections) != len(token_trees):
        raise ValueError(
            f"selections must have one entry per token tree ({len(token_trees)}), got {len(selections)}"
        )
    laid: list[tuple[int, _Laid]] = []
    for i, (tt, sel) in enumerate(zip(token_trees, selections, strict=True)):
        keep = np.ones(tt.parents.size, dtype=bool) if sel is None else np.asarray(sel, dtype=bool)
        if keep.shape != tt.parents.shape:
            raise ValueError(f"selections[{i}] needs one flag per node ({tt.parents.size}), got {keep.shape}")
        if keep.any():
            laid.append((i, _lay_out(tt, keep, max_length, i)))
    groups: list[list[tuple[int, _Laid]]] = []
    size = 0
    for entry in laid:
        n = entry[1].tokens.size
        if not groups or size + n > max_tokens_per_forward:
            groups.append([])
            size = 0
        groups[-1].append(entry)
        size += n
    return [_merge(g) for g in groups]


def _merge(group: list[tuple[int, _Laid]]) -> Pack:
    tok_off = seg_off = 0
    toks, pos, segs, seg_parents, readouts = [], [], [], [], []
    for _, lay in group:
        toks.append(lay.tokens)
        pos.append(lay.positions)
        segs.append(lay.segment_of_token + seg_off)
        seg_parents.append(np.where(lay.segment_parent >= 0, lay.segment_parent + seg_off, -1))
        readouts.append(np.where(lay.readout >= 0, lay.readout + tok_off, -1))
        tok_off += lay.tokens.size
        seg_off += lay.segment_parent.size
    parent = np.concatenate(seg_parents)
    segment = np.concatenate(segs)
    length = np.bincount(segment, minlength=seg_off).astype(np.int64)
    return Pack(
        items=[i for i, _ in group],
        token_ids=np.concatenate(toks),
        position_ids=np.concatenate(pos),
        token_segment=segment,
        segment_parent=parent,
        segment_start=np.cumsum(length) - length,
        segment_length=length,
        readout=readouts,
    )
