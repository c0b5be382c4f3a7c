"""Rollout generation: the engine contract (`engine`), its vLLM and transformers implementations,
and the one function that builds either (`build_engine`).

The implementations import vLLM/transformers lazily; ``build_engine(EngineConfig(..., kind="hf"))``
makes one, or import them from their modules:
``from trace_core.rollout.vllm_engine import VLLMEngine``, ``from trace_core.rollout.hf_engine import HFEngine``.
"""

from trace_core.rollout.build import build_engine, kv_cache_bytes_on_cpu
from trace_core.rollout.engine import (
    Completion,
    EngineConfig,
    EngineKind,
    GenerationRequest,
    RolloutEngine,
    Sample,
    SamplingConfig,
    generate,
    iter_completions,
)

__all__ = [
    "Completion",
    "EngineConfig",
    "EngineKind",
    "GenerationRequest",
    "RolloutEngine",
    "Sample",
    "SamplingConfig",
    "build_engine",
    "generate",
    "iter_completions",
    "kv_cache_bytes_on_cpu",
]
