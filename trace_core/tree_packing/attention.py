"""Tree attention over a packed tree, with memory linear in its tokens.

A packed tree (:mod:`trace_core.tree_packing.layout`) holds each distinct token once; token
``q`` may attend to token ``k`` iff ``k``'s segment (node) is ``q``'s or an ancestor of it and
``k <= q``. A dense ``L × L`` mask states that exactly, but at tens of thousands of tokens the
mask alone is ~10⁹ entries, and the kernels that take it keep a copy per layer for backward.

Why this design (segment-wise attention over gathered ancestor keys, recomputed in backward):

- The pattern is not block-local: a token attends to its *whole* root-to-node history, which is
  a union of a few long contiguous ranges (its ancestors' segments) plus a causal prefix of its
  own segment. So every segment is cut into query *units* of at most ``query_chunk`` tokens, and
  a unit attends to exactly its history's keys: its ancestors' tokens, then its own segment up
  to the unit's last token, causal. The work is ``Σ q·k``, the pairs separate per-path forwards
  would compute for the distinct tokens, with no cross-branch pair ever computed.
- Units of similar shape are batched into one ``scaled_dot_product_attention`` call (query and
  key counts each within ``bucket`` of the call's smallest), padded, with a causal-offset mask
  built on the fly: a call's transient memory is bounded by ``max_pairs_per_call`` and
  ``max_keys_per_call``, whatever the tree's size, and padding wastes at most ``bucket²``.
- Autograd keeps nothing of those calls: a custom function saves only the layer's ``q``, ``k``
  and ``v`` (which every attention keeps) and recomputes each call in backward (as
  flash-attention does), accumulating the gradients of the shared ancestor keys in float32.
  Saved memory is therefore ``O(L)`` per layer; without the recompute, the gathered keys would
  be saved per unit, ``O(L × depth)``.
- The plan is built once per pack from the segments' parents (numpy) and used by every layer.
  Its key index holds ``Σ_units k`` integers — a few per token per ``query_chunk`` of history.

Flex attention with a block mask would describe the same pattern, but it needs ``torch.compile``
for speed and differs across the torch builds this runs on (CPU here, CUDA elsewhere); the
segment-wise path uses only stock ``sdpa`` kernels and is exact against per-path forwards.

It plugs into transformers as a registered attention function (``"trace_tree"``): the plan is
passed as the prepared mask ``{"full_attention": plan}``, which transformers hands to every
layer unchanged. Without a plan (a plain causal call) the function defers to ``sdpa``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from trace_core.tree_packing.config import TreeAttentionConfig  # noqa: F401 - re-exported
from trace_core.tree_packing.layout import Pack

TREE_ATTENTION = "trace_tree"

@dataclass(frozen=True)
class UnitGroup:
    """Units batched into one attention call (``G`` units, padded to ``Q`` queries × ``K`` keys)."""

    query_index: torch.Tensor  # long (G, Q): packed token index of each query (padding: 0)
    key_index: torch.Tensor  # long (G, K): packed token index of each key, history order (padding: 0)
    limit: torch.Tensor  # long (G,): key j is visible to query i iff j <= limit + i
    query_valid: torch.Tensor  # bool (G, Q): real (not padding) queries
    query_flat: torch.Tensor  # long (n,): query_index[query_valid], where the call's outputs go


@dataclass(frozen=True)
class TreeAttentionPlan:
    """How to run one pack's attention sparsely; built once per forward, used by every layer."""

    groups: tuple[UnitGroup, ...]
    num_tokens: int
    pairs: int = 0  # visible (query, key) pairs: the dense mask's True entries
    padded_pairs: int = 0  # Σ G·Q·K over the calls: the pairs computed
    key_entries: int = 0  # Σ G·K: the plan's key-index size


def _history_keys(pack: Pack) -> list[np.ndarray]:
    """Per segment, the packed indices of its ancestors' tokens, root first."""
    start, length, parent = pack.segment_start, pack.segment_length, pack.segment_parent
    keys: list[np.ndarray] = []
    for s, p in enumerate(parent.tolist()):  # parents precede children
        if p < 0:
            keys.append(np.zeros(0, dtype=np.int64))
        else:
            keys.append(np.concatenate([keys[p], np.arange(start[p], start[p] + length[p], dtype=np.int64)]))
        if s and p >= s:
            raise ValueError("a segment's parent must precede it")
    return keys


def build_plan(pack: Pack, device: torch.device, config: TreeAttentionConfig | None = None) -> TreeAttentionPlan:
    """The sparse plan of ``pack``: its units, batched into bounded calls."""
    cfg = config or TreeAttentionConfig()
    start, length = pack.segment_start, pack.segment_length
    hist = pack.segment_history
    counts = -(-length // cfg.query_chunk)  # units per segment (ceil)
    u_seg = np.repeat(np.arange(length.size), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    u_a = (np.arange(u_seg.size) - first) * cfg.query_chunk  # unit = tokens [a, b) of its segment
    u_b = np.minimum(u_a + cfg.query_chunk, length[u_seg])
    q_len = u_b - u_a
    k_len = hist[u_seg] + u_b
    # query buckets: [r^i, r^(i+1)) for bucket ratio r (exact counts when r == 1)
    q_bucket = (np.floor(np.log(q_len) / np.log(cfg.bucket) + 1e-9).astype(np.int64) if cfg.bucket > 1
                else q_len.astype(np.int64))
    order = np.lexsort((k_len, q_bucket))
    hist_keys = _history_keys(pack)

    groups: list[UnitGroup] = []
    pairs = padded = entries = 0

    def close(members: list[int], Q: int, K: int) -> None:
        nonlocal padded, entries
        G = len(members)
        q_idx = np.zeros((G, Q), dtype=np.int64)
        k_idx = np.zeros((G, K), dtype=np.int64)
        limit = np.zeros(G, dtype=np.int64)
        valid = np.zeros((G, Q), dtype=bool)
        for g, u in enumerate(members):
            s, a, b = int(u_seg[u]), int(u_a[u]), int(u_b[u])
            h = hist_keys[s]
            q_idx[g, : b - a] = np.arange(start[s] + a, start[s] + b)
            k_idx[g, : h.size] = h
            k_idx[g, h.size: h.size + b] = np.arange(start[s], start[s] + b)
            limit[g] = h.size + a
            valid[g, : b - a] = True
        padded += G * Q * K
        entries += G * K
        groups.append(UnitGroup(
            query_index=torch.as_tensor(q_idx, device=device),
            key_index=torch.as_tensor(k_idx, device=device),
            limit=torch.as_tensor(limit, device=device),
            query_valid=torch.as_tensor(valid, device=device),
            query_flat=torch.as_tensor(q_idx[valid], device=device),
        ))

    members: list[int] = []
    Q = K = K0 = qb = 0
    for u in order.tolist():
        q, k, b = int(q_len[u]), int(k_len[u]), int(q_bucket[u])
        pairs += q * k - q * (q - 1) // 2  # the causal tail of its own chunk is not needed
        if members:
            Q2, K2, G2 = max(Q, q), max(K, k), len(members) + 1
            fits = (b == qb and K2 <= K0 * cfg.bucket and G2 * Q2 * K2 <= cfg.max_pairs_per_call
                    and G2 * K2 <= cfg.max_keys_per_call)
            if fits:
                members.append(u)
                Q, K = Q2, K2
                continue
            close(members, Q, K)
        members, Q, K, K0, qb = [u], q, k, k, b
    if members:
        close(members, Q, K)
    return TreeAttentionPlan(tuple(groups), pack.num_tokens, pairs=pairs, padded_pairs=padded, key_entries=entries)


def tree_attention_mask(pack: Pack, device: torch.device, attn_implementation: str) -> torch.Tensor:
    """The dense reference: ``(1, 1, L, L)``, token q sees token k iff k's node is q's node or an
    ancestor, and k <= q. Boolean for ``sdpa`` (True = attend), additive float for ``eager``."""
    seg = torch.as_tensor(pack.token_segment, device=device)
    anc = torch.as_tensor(pack.segment_ancestors, device=device)
    n = seg.numel()
    allowed = anc[seg][:, seg] & torch.ones(n, n, dtype=torch.bool, device=device).tril_()
    if attn_implementation == "sdpa":
        return allowed[None, None]
    zero = torch.zeros((), dtype=torch.float32, device=device)
    return torch.where(allowed, zero, torch.finfo(torch.float32).min)[None, None]


def attention_inputs(
    pack: Pack, attn_implementation: str, device: torch.device, config: TreeAttentionConfig | None = None
) -> dict[str, TreeAttentionPlan | torch.Tensor]:
    """The prepared mask transformers takes for a pack: the sparse plan for ``"tree"``, the dense
    reference mask for ``"sdpa"`` / ``"eager"``."""
    if attn_implementation == "tree":
        return {"full_attention": build_plan(pack, device, config)}
    if attn_implementation in ("sdpa", "eager"):
        return {"full_attention": tree_attention_mask(pack, device, attn_implementation)}
    raise ValueError(f"attn_implementation must be 'tree', 'sdpa' or 'eager', got {attn_implementation!r}")


def model_attention(attn_implementation: str) -> str:
    """The name transformers dispatches on: the registered tree attention, or a stock kernel."""
    if attn_implementation == "tree":
        return register_tree_attention()
    return attn_implementation


# ---------------------------------------------------------------------------- the kernel
def _gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``(L, heads, d)`` rows at ``index`` ``(G, N)`` → ``(G, heads, N, d)``."""
    G, N = index.shape
    return x.index_select(0, index.reshape(-1)).view(G, N, x.shape[1], x.shape[2]).transpose(1, 2)


def _attend(qg: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor, grp: UnitGroup, scale: float | None) -> torch.Tensor:
    """One batched call: ``(G, H, Q, d)`` queries over ``(G, Hkv, K, d)`` keys, causal offsets."""
    Q, K = qg.shape[2], kg.shape[2]
    ar_q = torch.arange(Q, device=qg.device)
    ar_k = torch.arange(K, device=qg.device)
    allowed = ar_k[None, None, :] <= (grp.limit[:, None, None] + ar_q[None, :, None])  # padding rows see key 0
    rep = qg.shape[1] // kg.shape[1]
    gqa = rep > 1
    if gqa and qg.device.type != "cpu":  # CUDA's masked kernels do not all take grouped heads
        kg, vg, gqa = kg.repeat_interleave(rep, dim=1), vg.repeat_interleave(rep, dim=1), False
    return torch.nn.functional.scaled_dot_product_attention(
        qg, kg, vg, attn_mask=allowed[:, None], scale=scale, enable_gqa=gqa
    )


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype sdpa runs in: autocast's when it is on (as for a stock sdpa call), else the input's."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


class _TreeAttention(torch.autograd.Function):
    """Packed ``(L, H, d)`` queries, ``(L, Hkv, d)`` keys/values → ``(L, H, d)``; saves q, k, v only.

    The calls run in one fixed dtype with autocast off, so backward's recompute is the forward."""

    @staticmethod
    def forward(ctx, q, k, v, plan: TreeAttentionPlan, scale: float | None):
        dtype = _compute_dtype(q)
        out = torch.empty(q.shape, dtype=dtype, device=q.device)
        with torch.no_grad(), torch.autocast(q.device.type, enabled=False):
            qc, kc, vc = q.to(dtype), k.to(dtype), v.to(dtype)
            for grp in plan.groups:
                og = _attend(_gather(qc, grp.query_index), _gather(kc, grp.key_index), _gather(vc, grp.key_index),
                             grp, scale)
                out.index_copy_(0, grp.query_flat, og.transpose(1, 2)[grp.query_valid])
        ctx.save_for_backward(q, k, v)
        ctx.plan, ctx.scale, ctx.dtype = plan, scale, dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        plan: TreeAttentionPlan = ctx.plan
        # float32 accumulators: an ancestor's keys collect gradients from every unit below it
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        with torch.autocast(q.device.type, enabled=False):
            qc, kc, vc = q.to(ctx.dtype), k.to(ctx.dtype), v.to(ctx.dtype)
            for grp in plan.groups:
                qg = _gather(qc, grp.query_index).detach().requires_grad_(True)
                kg = _gather(kc, grp.key_index).detach().requires_grad_(True)
                vg = _gather(vc, grp.key_index).detach().requires_grad_(True)
                with torch.enable_grad():
                    og = _attend(qg, kg, vg, grp, ctx.scale)
                go = torch.zeros_like(og)  # og's own layout: the kernels' backward wants it
                go.transpose(1, 2)[grp.query_valid] = grad_out.index_select(0, grp.query_flat).to(og.dtype)
                gq, gk, gv = torch.autograd.grad(og, (qg, kg, vg), go)
                # padding queries carry no output gradient, so their rows (and keys only they see) add 0
                dq.index_add_(0, grp.query_index.reshape(-1), gq.transpose(1, 2).reshape(-1, *q.shape[1:]).float())
                dk.index_add_(0, grp.key_index.reshape(-1), gk.transpose(1, 2).reshape(-1, *k.shape[1:]).float())
                dv.index_add_(0, grp.key_index.reshape(-1), gv.transpose(1, 2).reshape(-1, *v.shape[1:]).float())
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


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
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if query.shape[0] != 1:
        raise ValueError("tree attention runs one pack per forward (batch size 1)")
    if dropout > 0:
        raise ValueError("tree attention recomputes attention in backward: attention dropout must be 0")
    if kwargs.get("sliding_window") is not None:
        raise ValueError("tree attention does not implement sliding-window layers")
    if query.shape[2] != attention_mask.num_tokens:
        raise ValueError(f"the plan is for {attention_mask.num_tokens} tokens, the forward has {query.shape[2]}")
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (L, heads, d)
    out = _TreeAttention.apply(q, k, v, attention_mask, scaling)
    return out[None], None


def register_tree_attention() -> str:
    """Register :func:`tree_attention_forward` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(TREE_ATTENTION, tree_attention_forward)
    return TREE_ATTENTION


def plan_summary(plan: TreeAttentionPlan) -> dict[str, float]:
    """Sizes of a plan: calls, needed and computed pairs (their ratio is the padding waste) and
    the key index's entries."""
    return {"calls": float(len(plan.groups)), "pairs": float(plan.pairs), "padded_pairs": float(plan.padded_pairs),
            "padding_waste": plan.padded_pairs / max(plan.pairs, 1) - 1.0, "key_entries": float(plan.key_entries)}
