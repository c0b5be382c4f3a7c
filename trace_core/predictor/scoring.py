"""Forward passes over :class:`~trace_core.tree_packing.layout.Pack` objects.

One pack is one forward with batch size 1 and no padding, so the tokens entering the backbone
are exactly the pack's distinct tokens. The attention pattern is handed to transformers as a
prepared mask (``{"full_attention": mask}`` skips its own mask construction) by
:func:`~trace_core.tree_packing.attention.attention_inputs` — the one tree-attention path the
policy update uses too: a sparse, linear-memory
:class:`~trace_core.tree_packing.attention.TreeAttentionPlan` for ``"tree"`` (the default), or
the dense 4D reference mask for ``sdpa`` (boolean) and ``eager`` (additive float).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import torch

from trace_core.predictor.model import PrefixValueModel
from trace_core.tree_packing.attention import attention_inputs, tree_attention_mask
from trace_core.tree_packing.layout import Pack, TokenTree, pack_token_trees

__all__ = ["autocast_context", "pack_logits", "score_token_trees", "tree_attention_mask"]


def autocast_context(device: torch.device, compute_dtype: str):
    if compute_dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def pack_logits(
    model: PrefixValueModel, pack: Pack, device: torch.device, attn_implementation: str, compute_dtype: str
) -> torch.Tensor:
    """Logits ``(L,)`` of every packed token (grad flows if enabled by the caller)."""
    if pack.token_ids.size and int(pack.token_ids.max()) >= model.vocab_size:
        raise ValueError(f"token id {int(pack.token_ids.max())} is outside the predictor's vocabulary "
                         f"(vocab_size={model.vocab_size}); the predictor must share the policy's tokenizer")
    if pack.token_ids.size and int(pack.token_ids.min()) < 0:
        raise ValueError("token ids must be >= 0")
    ids = torch.as_tensor(pack.token_ids, device=device)[None]
    pos = torch.as_tensor(pack.position_ids, device=device)[None]
    mask = attention_inputs(pack, attn_implementation, device)
    with autocast_context(device, compute_dtype):
        return model(ids, pos, mask)[0]


@torch.no_grad()
def score_token_trees(
    model: PrefixValueModel,
    token_trees: Sequence[TokenTree],
    selections: Sequence[np.ndarray | None] | None,
    device: torch.device,
    attn_implementation: str = "sdpa",
    compute_dtype: str = "float32",
    max_tokens_per_forward: int = 8192,
    max_length: int | None = None,
) -> list[np.ndarray]:
    """Values in [0, 1] of the selected nodes of each token tree (float64, NaN elsewhere),
    every distinct selected token processed once."""
    was_training = model.training
    model.eval()
    out = [np.full(tt.parents.size, np.nan) for tt in token_trees]
    try:
        for pack in pack_token_trees(token_trees, selections, max_tokens_per_forward, max_length):
            values = torch.sigmoid(pack_logits(model, pack, device, attn_implementation, compute_dtype))
            values = values.double().cpu().numpy()
            for item, readout in zip(pack.items, pack.readout, strict=True):
                read = readout >= 0
                out[item][read] = values[readout[read]]
    finally:
        model.train(was_training)
    return out
