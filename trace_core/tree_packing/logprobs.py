"""Token log-probs of a packed forward, computed in vocabulary chunks.

A policy update needs ``log p(token | history)`` at each model-written token, i.e. one row of
the LM head's logits per predecessor — ``n × V`` floats (64k tokens × 152k vocab ≈ 39 GB in
fp32) if materialised, and autograd would keep the ``log_softmax`` of all of them. Here the head
runs over at most ``max_logits_per_chunk`` logits at a time: each chunk gives its tokens'
``logit[target] − logsumexp`` and is dropped; backward recomputes each chunk's logits from the
saved hidden states (``softmax − onehot`` is its gradient) and accumulates the head's weight
gradient in float32. Memory is the hidden states plus one chunk.

Under DeepSpeed the LM head's weight may be partitioned (ZeRO-3) and is only whole inside the
head module's own forward (and its backward), so the chunked computation runs *as* the head:
:func:`install_logprob_head` swaps the model's ``lm_head`` for a :class:`LogProbHead` holding the
same weight (same parameter, same state-dict name, ties kept), which returns log-probs instead of
logits while a request is set (:meth:`LogProbHead.scoring`), and is an ordinary linear otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from trace_core.tree_packing.attention import TreeAttentionConfig, attention_inputs
from trace_core.tree_packing.config import DEFAULT_MAX_LOGITS  # noqa: F401 - re-exported
from trace_core.tree_packing.layout import Pack


class _ChunkedTokenLogProbs(torch.autograd.Function):
    """``hidden (N, D)``, ``weight (V, D)``; token ``j`` is read at row ``rows[j]`` and is
    ``targets[j]`` → float32 ``(n,)`` log-probs. Saves the hidden states and per-token logsumexp."""

    @staticmethod
    def forward(ctx, hidden, weight, rows, targets, chunk: int):
        n = rows.numel()
        out = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        for a in range(0, n, chunk):
            r, t = rows[a:a + chunk], targets[a:a + chunk]
            logits = (hidden.index_select(0, r) @ weight.t()).float()  # the head's dtype, then fp32 as before
            lse[a:a + chunk] = torch.logsumexp(logits, dim=-1)
            out[a:a + chunk] = logits.gather(1, t[:, None]).squeeze(1) - lse[a:a + chunk]
        ctx.save_for_backward(hidden, weight, rows, targets, lse)
        ctx.chunk = chunk
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, rows, targets, lse = ctx.saved_tensors
        dh = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for a in range(0, rows.numel(), ctx.chunk):
            r, t, g = rows[a:a + ctx.chunk], targets[a:a + ctx.chunk], grad[a:a + ctx.chunk].float()
            h = hidden.index_select(0, r)
            logits = (h @ weight.t()).float()
            # d(logit[t] − lse)/d logits = onehot(t) − softmax, in place: one chunk of logits alive
            dlogits = logits.sub_(lse[a:a + ctx.chunk, None]).exp_().mul_(-g[:, None])
            dlogits.scatter_add_(1, t[:, None], g[:, None])
            dl = dlogits.to(hidden.dtype)
            dh.index_add_(0, r, (dl @ weight).float())
            dw.add_((dl.t() @ h).float())
        return dh.to(hidden.dtype), dw.to(weight.dtype), None, None, None


def chunked_token_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor,
    max_logits_per_chunk: int = DEFAULT_MAX_LOGITS,
) -> torch.Tensor:
    """``log softmax(hidden[rows] @ weight.T)[targets]`` (float32) without all the logits at once."""
    chunk = max(1, int(max_logits_per_chunk) // int(weight.shape[0]))
    return _ChunkedTokenLogProbs.apply(hidden, weight, rows, targets, chunk)


@dataclass(frozen=True)
class _Request:
    rows: torch.Tensor  # long (n,): row of the head's input that predicts each target
    targets: torch.Tensor  # long (n,): the token ids to score


class LogProbHead(nn.Linear):
    """An LM head that, inside :meth:`scoring`, returns the requested tokens' log-probs
    ``(batch=1, n)`` instead of logits; outside it, an ordinary ``nn.Linear``."""

    max_logits_per_chunk: int = DEFAULT_MAX_LOGITS
    _request: _Request | None = None

    @contextlib.contextmanager
    def scoring(self, rows: torch.Tensor, targets: torch.Tensor) -> Iterator[None]:
        self._request = _Request(rows, targets)
        try:
            yield
        finally:
            self._request = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._request is None:
            return super().forward(hidden)
        if self.bias is not None:
            raise ValueError("the chunked log-prob head has no bias term")
        if hidden.shape[0] != 1:
            raise ValueError("the log-prob head scores one pack per forward (batch size 1)")
        req = self._request
        return chunked_token_logprobs(hidden[0], self.weight, req.rows, req.targets, self.max_logits_per_chunk)[None]


def install_logprob_head(model: nn.Module, max_logits_per_chunk: int = DEFAULT_MAX_LOGITS) -> LogProbHead:
    """Swap ``model``'s output embedding for a :class:`LogProbHead` on the same weight (before
    DeepSpeed wraps the model); idempotent."""
    head = model.get_output_embeddings()
    if isinstance(head, LogProbHead):
        head.max_logits_per_chunk = max_logits_per_chunk
        return head
    if not isinstance(head, nn.Linear):
        raise ValueError(f"the model's LM head is a {type(head).__name__}, not a linear layer")
    new = LogProbHead(head.in_features, head.out_features, bias=False, device="meta")
    new.weight = head.weight  # the same parameter: its name, its ties and its ZeRO partition stay
    if head.bias is not None:
        new.bias = head.bias
    new.max_logits_per_chunk = max_logits_per_chunk
    model.set_output_embeddings(new)
    return new


def packed_token_logprobs(
    model: nn.Module,
    pack: Pack,
    predecessor: np.ndarray,
    wanted: np.ndarray,
    device: torch.device,
    attn_implementation: str = "tree",
    attention: TreeAttentionConfig | None = None,
) -> torch.Tensor:
    """``log p(token | history)`` (float32, ``(L,)``) of the pack's ``wanted`` tokens, 0 elsewhere.

    ``model`` is a causal LM (or the DeepSpeed engine around one) with a :class:`LogProbHead`;
    ``predecessor[j]`` is the packed index whose logits predict token ``j``. The backbone runs
    once over the distinct tokens; the head only at the wanted tokens' predecessors, chunked."""
    module = getattr(model, "module", model)  # the DeepSpeed engine wraps the model
    head = module.get_output_embeddings()
    if not isinstance(head, LogProbHead):
        raise ValueError("install_logprob_head(model) first: the model's head returns full logits")
    ids = torch.as_tensor(pack.token_ids, device=device)
    pos = torch.as_tensor(pack.position_ids, device=device)[None]
    pred = torch.as_tensor(predecessor, device=device)
    want = torch.as_tensor(wanted, dtype=torch.bool, device=device) & (pred >= 0)
    keep, rows = torch.unique(pred[want], return_inverse=True)
    with head.scoring(rows, ids[want]):
        out = model(input_ids=ids[None], position_ids=pos, use_cache=False, logits_to_keep=keep,
                    attention_mask=attention_inputs(pack, attn_implementation, device, attention))
    logp = out.logits[0]
    return torch.zeros(ids.shape, dtype=logp.dtype, device=device).masked_scatter(want, logp)
