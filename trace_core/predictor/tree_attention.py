"""Sparse tree attention: each packed node attends only to its own history.

The dense tree mask (:func:`~trace_core.predictor.scoring.tree_attention_mask`) is exact but
costs ``L²`` attention pairs for a pack of ``L`` tokens, most of them masked (siblings, other
trees). Here each *segment* (a node that adds tokens) computes attention between its own
``q`` tokens and the ``k`` tokens of its history — its ancestors' tokens, then its own, causal —
so the work is ``Σ q·k``, the pairs a per-prefix forward would compute for the node's new tokens,
while every token's projections and MLP still run once. Segments with similar ``(q, k)`` are
batched into one ``scaled_dot_product_attention`` call (sizes bucketed by powers of two, so
padding at most doubles each side).

It plugs into transformers as a registered attention function (``"trace_tree"``): the plan is
passed as the prepared mask ``{"full_attention": plan}``, which transformers hands to every
layer unchanged. Without a plan (a plain causal call) the function defers to ``sdpa``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from trace_core.predictor.packing import Pack

TREE_ATTENTION = "trace_tree"


@dataclass(frozen=True)
class SegmentGroup:
    """Segments batched into one attention call (``G`` segments, padded to ``Q × K``)."""

    query_index: torch.Tensor  # long (G, Q): packed token index of each query (padding repeats index 0)
    key_index: torch.Tensor  # long (G, K): packed token index of each key, history order (padding: 0)
    allowed: torch.Tensor  # bool (G, 1, Q, K): key visible to query (causal inside the segment)
    query_valid: torch.Tensor  # bool (G, Q): real (not padding) queries


@dataclass(frozen=True)
class TreeAttentionPlan:
    """How to run one pack's attention sparsely; built once per forward, used by every layer."""

    groups: list[SegmentGroup]
    inverse: torch.Tensor  # long (L,): position of each packed token among the groups' real queries
    num_tokens: int


def _pow2(x: np.ndarray) -> np.ndarray:
    return np.left_shift(1, np.ceil(np.log2(np.maximum(x, 1))).astype(np.int64))


def build_plan(pack: Pack, device: torch.device) -> TreeAttentionPlan:
    """The sparse plan of ``pack``: per segment, its history's key indices and a causal tail."""
    S = pack.segment_parent.size
    start, length, parent = pack.segment_start, pack.segment_length, pack.segment_parent
    history_len = np.zeros(S, dtype=np.int64)  # tokens before the segment in its own history
    for s in range(S):  # parents precede children
        p = parent[s]
        history_len[s] = history_len[p] + length[p] if p >= 0 else 0
    k_len = history_len + length
    key_q, key_k = _pow2(length), _pow2(k_len)
    order = np.lexsort((key_k, key_q))
    groups: list[SegmentGroup] = []
    query_order: list[np.ndarray] = []
    bounds = np.flatnonzero(np.diff(key_q[order]) | np.diff(key_k[order])) + 1
    for members in np.split(order, bounds):
        G, Q, K = members.size, int(length[members].max()), int(k_len[members].max())
        q_idx = np.zeros((G, Q), dtype=np.int64)
        k_idx = np.zeros((G, K), dtype=np.int64)
        allowed = np.zeros((G, Q, K), dtype=bool)
        valid = np.zeros((G, Q), dtype=bool)
        for g, s in enumerate(members.tolist()):
            chain = []
            a = s
            while a >= 0:
                chain.append(a)
                a = parent[a]
            keys = np.concatenate([np.arange(start[c], start[c] + length[c]) for c in reversed(chain)])
            n_q, n_hist = int(length[s]), int(history_len[s])
            q_idx[g, :n_q] = np.arange(start[s], start[s] + n_q)
            k_idx[g, : keys.size] = keys
            valid[g, :n_q] = True
            allowed[g, :n_q, :] = np.arange(K)[None, :] <= n_hist + np.arange(n_q)[:, None]
            allowed[g, n_q:, 0] = True  # padding queries see one key, so their softmax stays finite
        query_order.append(q_idx[valid])
        groups.append(SegmentGroup(
            query_index=torch.as_tensor(q_idx, device=device),
            key_index=torch.as_tensor(k_idx, device=device),
            allowed=torch.as_tensor(allowed, device=device)[:, None],
            query_valid=torch.as_tensor(valid, device=device),
        ))
    flat = np.concatenate(query_order)
    inverse = np.empty(flat.size, dtype=np.int64)
    inverse[flat] = np.arange(flat.size)
    return TreeAttentionPlan(groups, torch.as_tensor(inverse, device=device), int(flat.size))


def tree_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: TreeAttentionPlan | torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention over ``(1, heads, L, d)`` packed states following a :class:`TreeAttentionPlan`;
    returns ``(1, L, heads, d)`` like transformers' sdpa function."""
    if not isinstance(attention_mask, TreeAttentionPlan):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if query.shape[0] != 1:
        raise ValueError("tree attention runs one pack per forward (batch size 1)")
    q, k, v = query[0], key[0], value[0]  # (heads, L, d)
    rep = q.shape[0] // k.shape[0]  # GQA: query heads per key/value head
    outputs = []
    for grp in attention_mask.groups:
        qg = q[:, grp.query_index].transpose(0, 1)  # (G, H, Q, d)
        kg = k[:, grp.key_index].transpose(0, 1)  # (G, Hkv, K, d)
        vg = v[:, grp.key_index].transpose(0, 1)
        out = torch.nn.functional.scaled_dot_product_attention(
            qg, kg, vg, attn_mask=grp.allowed, dropout_p=dropout, scale=scaling, enable_gqa=rep > 1
        )  # (G, H, Q, d)
        outputs.append(out.transpose(1, 2)[grp.query_valid])  # (n_valid, H, d)
    packed = torch.cat(outputs)[attention_mask.inverse]  # (L, H, d), packed token order
    return packed[None], None


AttentionInterface.register(TREE_ATTENTION, tree_attention_forward)
