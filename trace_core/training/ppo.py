"""Policy-gradient math over packed rollout trees (method §6): log-probs and the PPO-clip loss.

A packed tree (:mod:`trace_core.tree_packing.layout`) holds each distinct token once, so a shared
prefix is trained once and the number of loss tokens equals the number of distinct model-written
tokens. A token is predicted by the logits at its *predecessor* in its own history: the previous
packed token inside a node, or the last token of the parent node for a node's first token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from trace_core.training.policy_config import PPOLossConfig  # noqa: F401 - re-exported
from trace_core.tree import RolloutTree
from trace_core.tree_packing.layout import Pack, TokenTree, pack_token_trees


@dataclass(frozen=True)
class PackedTargets:
    """Per packed token: where its logits come from and what it is trained with."""

    predecessor: np.ndarray  # int64 (L,): packed index whose logits predict this token (-1: none)
    loss_mask: np.ndarray  # bool (L,): model-written token (trained)
    advantage: np.ndarray  # float32 (L,): its node's advantage (0 where not trained)
    old_logprob: np.ndarray  # float32 (L,): engine log-prob at sampling time (0 where not trained)


def packed_predecessors(pack: Pack) -> np.ndarray:
    """Index of the token whose logits predict each packed token (-1 for a history's first token)."""
    pred = np.arange(pack.num_tokens, dtype=np.int64) - 1
    for s in range(pack.segment_start.size):
        start = int(pack.segment_start[s])
        parent = int(pack.segment_parent[s])
        if parent >= 0:
            pred[start] = int(pack.segment_start[parent] + pack.segment_length[parent] - 1)
        else:
            pred[start] = -1
    return pred


def pack_trees_for_training(
    trees: Sequence[RolloutTree], advantages: Sequence[np.ndarray], max_tokens_per_forward: int
) -> list[tuple[Pack, PackedTargets]]:
    """Pack trees into forwards with per-token loss masks, advantages and old log-probs."""
    if len(trees) != len(advantages):
        raise ValueError(f"trees ({len(trees)}) and advantages ({len(advantages)}) must match")
    token_trees = [
        TokenTree(parents=np.array([n.parent for n in t.nodes], dtype=np.int64),
                  tokens=[np.asarray(n.token_ids, dtype=np.int64) for n in t.nodes])
        for t in trees
    ]
    out = []
    for pack in pack_token_trees(token_trees, None, max_tokens_per_forward):
        mask, adv, old = [], [], []
        for item in pack.items:
            tree, a = trees[item], np.asarray(advantages[item], dtype=np.float64)
            if a.shape != (len(tree.nodes),):
                raise ValueError(f"advantages[{item}] has shape {a.shape}, expected ({len(tree.nodes)},)")
            for node in tree.nodes:  # packed in node-id order, each node's tokens once
                if not node.token_ids:
                    continue
                m = np.asarray(node.loss_mask, dtype=bool)
                mask.append(m)
                adv.append(np.where(m, a[node.id], 0.0))
                lp = node.logprobs if node.logprobs is not None else [0.0] * len(node.token_ids)
                old.append(np.where(m, np.asarray(lp, dtype=np.float64), 0.0))
        targets = PackedTargets(
            predecessor=packed_predecessors(pack),
            loss_mask=np.concatenate(mask) if mask else np.zeros(0, dtype=bool),
            advantage=(np.concatenate(adv) if adv else np.zeros(0)).astype(np.float32),
            old_logprob=(np.concatenate(old) if old else np.zeros(0)).astype(np.float32),
        )
        if targets.loss_mask.size != pack.num_tokens:
            raise AssertionError("packed targets are misaligned with the packed tokens")
        if np.any(targets.loss_mask & (targets.predecessor < 0)):
            raise ValueError("a model-written token has no history to be predicted from")
        out.append((pack, targets))
    return out


def ppo_clip_token_losses(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantage: torch.Tensor,
    config: PPOLossConfig,
    ref_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss ``−min(ρA, clip(ρ)A) + β·KL`` (to be summed over the mask and divided by
    the step's token count), with ``ρ = exp(logp − old_logp)`` and the low-variance KL estimator
    ``exp(ref − logp) − (ref − logp) − 1`` (k3, as in GRPO)."""
    ratio = torch.exp(logp - old_logp)
    high = config.clip_eps if config.clip_eps_high is None else config.clip_eps_high
    clipped = torch.clamp(ratio, 1.0 - config.clip_eps, 1.0 + high)
    surrogate = torch.minimum(ratio * advantage, clipped * advantage)
    loss = -surrogate
    stats = {"clip_frac": ((ratio - clipped).abs() > 1e-9).float(), "ratio": ratio.detach()}
    if config.kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs the reference policy's log-probs")
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0
        loss = loss + config.kl_coef * kl
        stats["kl"] = kl.detach()
    return loss, stats
