"""The predictor network: a causal Qwen3 backbone, a scalar head, a sigmoid (method §5).

Input is the policy's token ids of a history (prompt + turns), never re-rendered text, so the
predictor must share the policy's tokenizer (Qwen3-0.6B and Qwen3-8B do). The head reads the
final hidden state (after the backbone's last RMSNorm) at any position; the value of a history is
``sigmoid(head(h_last))`` at its last token.
"""

from __future__ import annotations

import torch
from torch import nn

from trace_core.predictor.config import PredictorConfig


def tiny_backbone_config(config: PredictorConfig):
    """The ``Qwen3Config`` of a tiny random backbone (:func:`trace_core.models.tiny_qwen3_config`)."""
    from trace_core.models import tiny_qwen3_config

    return tiny_qwen3_config(
        vocab_size=config.vocab_size,
        hidden_size=config.tiny_hidden_size,
        intermediate_size=config.tiny_intermediate_size,
        num_hidden_layers=config.tiny_num_layers,
        num_attention_heads=config.tiny_num_heads,
        num_key_value_heads=config.tiny_num_kv_heads,
        head_dim=config.tiny_head_dim,
        max_position_embeddings=config.tiny_max_positions,
        init_std=config.init_std,
    )


def backbone_attention(attn_implementation: str) -> str:
    """The name transformers dispatches on: our registered sparse tree attention, or a stock kernel."""
    from trace_core.tree_packing.attention import register_tree_attention

    return register_tree_attention() if attn_implementation == "tree" else attn_implementation


def build_backbone(config: PredictorConfig) -> nn.Module:
    """A ``transformers.Qwen3Model``: loaded from ``config.backbone_path`` (local files only; a
    ``Qwen3ForCausalLM`` checkpoint loads too, its LM head is dropped) or tiny and random.

    Tiny weights are drawn from ``config.seed`` by :func:`trace_core.models.init_tiny_weights`
    (parameter-name order, norms = 1), so they do not depend on transformers' init code or on the
    global torch RNG."""
    from transformers import Qwen3Model

    from trace_core.models import init_tiny_weights

    if config.pretrained:
        backbone = Qwen3Model.from_pretrained(
            config.backbone_path, local_files_only=True, attn_implementation="sdpa", dtype=torch.float32,
        )
        if getattr(backbone.config, "model_type", None) != "qwen3":
            raise ValueError(f"backbone_path {config.backbone_path!r} is not a Qwen3 checkpoint")
        backbone.config._attn_implementation = backbone_attention(config.attn_implementation)
        return backbone
    backbone = Qwen3Model(tiny_backbone_config(config))
    backbone.config._attn_implementation = backbone_attention(config.attn_implementation)
    return init_tiny_weights(backbone, config.seed, config.init_std)


class PrefixValueModel(nn.Module):
    """Backbone + ``Linear(hidden, 1)``; :meth:`forward` returns one logit per token."""

    def __init__(self, backbone: nn.Module, init_std: float, seed: int) -> None:
        super().__init__()
        self.backbone = backbone
        hidden = int(backbone.config.hidden_size)
        self.head = nn.Linear(hidden, 1)
        gen = torch.Generator().manual_seed(seed + 1)  # distinct from the backbone's stream
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(self.head.weight.shape, generator=gen) * init_std)
            self.head.bias.zero_()

    @property
    def vocab_size(self) -> int:
        return int(self.backbone.config.vocab_size)

    @property
    def max_positions(self) -> int:
        return int(self.backbone.config.max_position_embeddings)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits ``(batch, length)``; ``sigmoid`` of one is the value of the history ending there.

        ``attention_mask`` may be a prepared 4D mask wrapped as ``{"full_attention": mask}``,
        which transformers passes to every layer unchanged (the tree mask), or None (causal)."""
        hidden = self.backbone(
            input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        return self.head(hidden).squeeze(-1).float()
