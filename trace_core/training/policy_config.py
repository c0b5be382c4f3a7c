"""The policy update's settings, torch-free: a configuration (and every ``--help``) loads without
importing torch. :mod:`trace_core.training.policy` and :mod:`trace_core.training.ppo` use them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trace_core.lora_config import LoraConfig
from trace_core.tree_packing.config import DEFAULT_MAX_LOGITS, TreeAttentionConfig


@dataclass(frozen=True)
class PPOLossConfig:
    """The PPO-clip surrogate (token-mean over model-written tokens)."""

    clip_eps: float = 0.2  # ratio clip range: [1 − eps, 1 + eps]
    clip_eps_high: float | None = None  # upper clip (DAPO's clip-higher); None = clip_eps
    kl_coef: float = 0.0  # weight of the KL penalty to the reference policy (0 = off)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip_eps) and self.clip_eps > 0):
            raise ValueError(f"clip_eps must be finite and > 0, got {self.clip_eps}")
        if self.clip_eps_high is not None and not (math.isfinite(self.clip_eps_high) and self.clip_eps_high > 0):
            raise ValueError(f"clip_eps_high must be finite and > 0 (or None), got {self.clip_eps_high}")
        if not (math.isfinite(self.kl_coef) and self.kl_coef >= 0):
            raise ValueError(f"kl_coef must be finite and >= 0, got {self.kl_coef}")


@dataclass
class PolicyTrainConfig:
    """How the policy is updated each step."""

    lr: float = 1e-5  # AdamW learning rate (tiny random policies want ~1e-4; 0 freezes the policy)
    weight_decay: float = 0.0  # AdamW weight decay
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas
    grad_clip: float = 1.0  # global gradient-norm clip (0 = off)
    zero_stage: int = 2  # DeepSpeed ZeRO stage, 0–3
    micro_batches: int = 2  # packed forwards per rank per optimizer step (gradient accumulation)
    ppo_epochs: int = 1  # optimizer steps over the same trees (the clip matters from the 2nd on)
    ppo: PPOLossConfig = field(default_factory=PPOLossConfig)  # surrogate and KL settings
    dist_backend: str = "gloo"  # "gloo" on CPU, "nccl" on GPUs
    dtype: str = "float32"  # "float32" or "bfloat16" (bf16 mixed precision on GPUs)
    # "tree": sparse tree attention, memory linear in the packed tokens; "sdpa" / "eager": the dense
    # L × L tree mask (the reference it is tested against; quadratic memory)
    attn_implementation: str = "tree"
    tree_attention: TreeAttentionConfig = field(default_factory=TreeAttentionConfig)  # how "tree" batches its calls
    max_logits_per_chunk: int = DEFAULT_MAX_LOGITS  # LM-head logits materialised at once when scoring tokens
    seed: int = 0  # torch seed for anything stochastic in the update
    # train low-rank adapters on the frozen policy (trace_core.lora) instead of every weight: the
    # engine still receives merged full weights, and a checkpoint holds only the adapters and their
    # optimizer state (megabytes, where the full policy's is gigabytes). None: every weight trains
    lora: LoraConfig | None = None

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.micro_batches < 1 or self.ppo_epochs < 1:
            raise ValueError("micro_batches and ppo_epochs must be >= 1")
        if not (math.isfinite(self.lr) and self.lr >= 0):
            raise ValueError(f"lr must be finite and >= 0 (0 freezes the policy), got {self.lr}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be finite and >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {list(self.betas)}")
        if not (math.isfinite(self.grad_clip) and self.grad_clip >= 0):
            raise ValueError(f"grad_clip must be finite and >= 0 (0 = off), got {self.grad_clip}")
        if self.dist_backend not in ("gloo", "nccl"):
            raise ValueError(f"dist_backend must be 'gloo' or 'nccl', got {self.dist_backend!r}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        if self.attn_implementation not in ("tree", "sdpa", "eager"):
            raise ValueError(f"attn_implementation must be 'tree', 'sdpa' or 'eager', got {self.attn_implementation!r}")
        if self.max_logits_per_chunk < 1:
            raise ValueError(f"max_logits_per_chunk must be >= 1, got {self.max_logits_per_chunk}")
