"""Shared test fixtures: the pinned tiny Qwen3 policies and one engine of each kind per session.

vLLM's start-up costs ~25 s, so every test module that needs an engine shares these; tests that
change an engine's weights put the original ones back."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override EngineConfig.kv_cache_bytes

import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from trace_core.models import TinyQwen3Config, build_tiny_qwen3  # noqa: E402
from trace_core.rollout import EngineConfig  # noqa: E402

BLOCK = 32
MLFLOW = str(Path(sys.executable).with_name("mlflow"))


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """A real MLflow tracking server (sqlite backend, local artifact store) we can stop and restart."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port, self.proc = root, port, None
        self.uri = f"http://127.0.0.1:{port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [MLFLOW, "server", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("mlflow server did not start in 90 s")

    def stop(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
            self.proc = None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """A real MLflow tracking server for one test module."""
    srv = MlflowServer(tmp_path_factory.mktemp("mlflow"), free_port())
    srv.start()
    yield srv
    srv.stop()


