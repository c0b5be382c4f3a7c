"""Rollout generation: the engine contract (`engine`) and its vLLM and transformers implementations.

The implementations import vLLM/transformers lazily; import them from their modules:
``from trace_core.rollout.vllm_engine import VLLMEngine``, ``from trace_core.rollout.hf_engine import HFEngine``.
"""

from trace_core.rollout.engine import (
    Completion,
    EngineConfig,
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
    "GenerationRequest",
    "RolloutEngine",
    "Sample",
    "SamplingConfig",
    "generate",
    "iter_completions",
]
