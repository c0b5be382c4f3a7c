"""Shared test fixtures: the pinned tiny Qwen3 policies and one engine of each kind per session.

vLLM's start-up costs ~25 s, so every test module that needs an engine shares these; tests that
change an engine's weights put the original ones back."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override EngineConfig.kv_cache_bytes

import pytest  # noqa: E402

from trace_core.models import TinyQwen3Config, build_tiny_qwen3  # noqa: E402
from trace_core.rollout import EngineConfig  # noqa: E402

BLOCK = 32


def engine_config(path, **kw) -> EngineConfig:
    return EngineConfig(model_path=str(path), dtype="float32", block_size=BLOCK, max_model_len=1024,
                        kv_cache_bytes=64 << 20, seed=0, **kw)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Tiny models run fastest on one thread (per-step overhead dominates; OMP spin-waits hurt
    on a 2-core machine)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Two tiny Qwen3 policies with the same tokenizer and different weights (seeds 0 and 1)."""
    root = tmp_path_factory.mktemp("tiny_qwen3")
    return {seed: build_tiny_qwen3(root / f"seed{seed}", TinyQwen3Config(seed=seed)) for seed in (0, 1)}


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_models[0])


@pytest.fixture(scope="session")
def reference_models(tiny_models):
    import torch
    from transformers import AutoModelForCausalLM

    return {seed: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            for seed, path in tiny_models.items()}


@pytest.fixture(scope="session")
def vllm_engine(tiny_models):
    pytest.importorskip("vllm")
    from trace_core.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(engine_config(tiny_models[0]))
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def hf_engine(tiny_models):
    from trace_core.rollout.hf_engine import HFEngine

    engine = HFEngine(engine_config(tiny_models[0]))
    yield engine
    engine.close()
