"""One way to build a rollout engine: :func:`build_engine` makes the implementation an
:class:`~trace_core.rollout.engine.EngineConfig` names.

    engine = build_engine(EngineConfig(model_path="runs/warm/policy", kind="hf", max_model_len=2048))

The trainer, the evaluator and the warm start's measurement all build their engine here, each
from its own settings turned into one ``EngineConfig``. The implementations are imported only
when built, so choosing ``hf`` never imports vLLM.
"""

from __future__ import annotations

from trace_core.rollout.engine import EngineConfig, RolloutEngine


def build_engine(config: EngineConfig) -> RolloutEngine:
    """The engine of ``config.kind`` (``vllm`` or ``hf``) on ``config.model_path``."""
    if config.kind == "vllm":
        from trace_core.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(config)
    from trace_core.rollout.hf_engine import HFEngine

    return HFEngine(config)


def kv_cache_bytes_on_cpu(kv_cache_mb: int) -> int | None:
    """``EngineConfig.kv_cache_bytes`` for a config's ``kv_cache_mb``: that many MiB when no GPU is
    visible; None on a GPU, where vLLM sizes the cache from ``gpu_memory_utilization`` (setting
    both is an error there)."""
    import torch

    return None if torch.cuda.is_available() else kv_cache_mb << 20
