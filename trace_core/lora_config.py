"""The adapters' settings, torch-free: a configuration (and every ``--help``) loads without
importing torch. :mod:`trace_core.lora` builds, saves and merges the adapters."""

from __future__ import annotations

import math
from dataclasses import dataclass

ADAPTER_WEIGHTS = "adapter.safetensors"  # A and B of every adapted layer
ADAPTER_CONFIG = "adapter.json"  # the LoraConfig, the adapted modules and the base's identity
# Inside a model folder the adapter sits in this subfolder: a reader that loads every top-level
# ``*.safetensors`` (vLLM, the weights digest) sees only the merged model.
ADAPTER_SUBDIR = "adapter"
ATTENTION_AND_MLP = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraConfig:
    """Where adapters go and how large they are."""

    rank: int = 16  # r: the adapters' inner dimension
    alpha: float = 32.0  # the update is scaled by alpha / rank
    # the last component of the names of the nn.Linear modules to adapt (Llama's and Qwen3's
    # attention and MLP projections by default; the embeddings and the LM head stay frozen)
    targets: tuple[str, ...] = ATTENTION_AND_MLP
    seed: int = 0  # seeds A's initialisation (B starts at zero)

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"rank must be >= 1, got {self.rank}")
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"alpha must be finite and > 0, got {self.alpha}")
        if not self.targets:
            raise ValueError("targets must name at least one module")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank
