"""Settings of the tree-packed forward, torch-free (a configuration loads without torch)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_LOGITS = 1 << 24  # logits one chunk holds: 64 MiB in float32


@dataclass(frozen=True)
class TreeAttentionConfig:
    """How a pack's attention is cut into batched calls (exactness never depends on these)."""

    query_chunk: int = 256  # most query tokens of one unit: longer segments are split, bounding the causal waste
    max_pairs_per_call: int = 1 << 22  # padded query × key pairs of one sdpa call (its transient mask and scores)
    max_keys_per_call: int = 1 << 16  # padded keys one sdpa call gathers (its transient K/V copies)
    bucket: float = 1.25  # units share a call when their query and key counts are each within this ratio

    def __post_init__(self) -> None:
        if self.query_chunk < 1 or self.max_pairs_per_call < 1 or self.max_keys_per_call < 1:
            raise ValueError("query_chunk, max_pairs_per_call and max_keys_per_call must be >= 1")
        if self.bucket < 1.0:
            raise ValueError(f"bucket must be >= 1, got {self.bucket}")
