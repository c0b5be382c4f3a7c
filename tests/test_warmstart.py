"""Warm start: expert demonstrations in the executor's exact format, error rates, masked SFT."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from trace_core.data import arith, kb
from trace_core.envs.math_env import PYTHON_TOOL, MathEnvironment
from trace_core.envs.qa_env import SEARCH_TOOL, QAEnvironment
from trace_core.envs.registry import example_to_task
from trace_core.models import TinyQwen3Config
from trace_core.rollout.agent import AgentConfig, observation_tokens, render_prompt
from trace_core.rollout.env import parse_action
from trace_core.warmstart.demos import DemoConfig, build_scripts, corruption_rate, render_demos
from trace_core.warmstart.experts import MathExpert, QAExpert, load_kb
from trace_core.warmstart.policy import build_policy, split_digits, tokenizer_corpus
from trace_core.warmstart.sft import SFTConfig, collate, masked_lm_loss, read_sft_log, sft
from trace_core.warmstart.tools import PassageSearch

DATA = Path(__file__).resolve().parents[1] / "data"  # the embedded default

AGENT = AgentConfig()
TINY = TinyQwen3Config(seed=3, vocab_size=700, hidden_size=64, num_hidden_layers=1, num_attention_heads=1,
                       num_key_value_heads=1, head_dim=32, intermediate_size=128, init_std=0.02)


@pytest.fixture(scope="module")
def math_tasks():
    return [example_to_task(e) for e in arith.generate_split("train", 30, seed=0)]


@pytest.fixture(scope="module")
def qa_world(tmp_path_factory):
    config = kb.KBConfig(n_train=40, n_test=0)
    entities, passages, splits = kb.generate(config)
    path = tmp_path_factory.mktemp("kb") / "kb.json"
    path.write_text(json.dumps(kb.kb_record(entities)))
    expert = QAExpert(load_kb(path), PassageSearch(passages))
    return expert, [example_to_task(e) for e in splits["train"]], passages


@pytest.fixture(scope="module")
def scripts(math_tasks, qa_world):
    expert, qa_tasks, _ = qa_world
    config = DemoConfig(epsilon=0.3, seed=1)
    return {"math": build_scripts(MathExpert(), math_tasks[:10], config),
            "qa": build_scripts(expert, qa_tasks[:12], config)}


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, scripts, qa_world):
    corpus = tokenizer_corpus(scripts, {"math": [PYTHON_TOOL], "qa": [SEARCH_TOOL]}, AGENT, qa_world[2])
    return build_policy(tmp_path_factory.mktemp("policy"), corpus, TINY)


@pytest.fixture(scope="module")
def tokenizer(policy_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(policy_dir)


@pytest.fixture(scope="module")
def demos(tokenizer, scripts):
    return {"math": render_demos(tokenizer, scripts["math"], [PYTHON_TOOL], AGENT),
            "qa": render_demos(tokenizer, scripts["qa"], [SEARCH_TOOL], AGENT)}


# ---------------------------------------------------------------------------------- demo format
def test_every_model_turn_parses_to_the_intended_action(scripts) -> None:
    for family, group in scripts.items():
        assert any(s.corrupted_steps for s in group), f"{family}: epsilon=0.3 should corrupt some steps"
        for script in group:
            *calls, last = script.steps
            assert calls and last.final_answer is not None and last.observation is None
            for step in script.steps:
                action = parse_action(step.text)
                assert action.error is None, (script.task.id, step.text)
                assert (action.tool, action.arguments, action.final_answer) == (
                    step.tool, step.arguments, step.final_answer), (script.task.id, step.text)
            assert all(parse_action(s.text).tool == ("python" if family == "math" else "search") for s in calls)


def test_demo_token_ids_are_the_executors_rendering(tokenizer, demos) -> None:
    tools = {"math": [PYTHON_TOOL], "qa": [SEARCH_TOOL]}
    for family, group in demos.items():
        for demo in group:
            script = demo.script
            assert list(demo.prompt_token_ids) == render_prompt(tokenizer, script.task, tools[family], AGENT)
            for step, turn, obs in zip(script.steps, demo.turn_token_ids, demo.observation_token_ids, strict=True):
                assert tokenizer.decode(turn) == step.text
                expected = [] if step.observation is None else observation_tokens(tokenizer, step.observation)
                assert list(obs) == expected
            ids, mask = demo.token_ids, demo.loss_mask
            assert len(ids) == len(mask)
            model_tokens = [t for t, m in zip(ids, mask, strict=True) if m]
            assert model_tokens == [t for turn in demo.turn_token_ids for t in turn]


def test_turn_views_are_slices_of_the_demo_with_the_turns_mask(tokenizer, demos) -> None:
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    for demo in demos["qa"][:4] + demos["math"][:4]:
        views = demo.turn_views(im_start)
        assert len(views) == len(demo.turn_token_ids)
        full = demo.token_ids
        text = tokenizer.decode(list(views[0].token_ids))
        assert text.startswith("<|im_start|>user\n" + demo.script.task.question) and "<|im_start|>system" not in text
        for view, turn in zip(views, demo.turn_token_ids, strict=True):
            ids = list(view.token_ids)
            starts = [i for i in range(len(full) - len(ids) + 1) if full[i : i + len(ids)] == ids]
            assert starts, "a view must be a contiguous slice of the demonstration"
            assert [t for t, m in zip(ids, view.loss_mask, strict=True) if m] == list(turn)
            assert view.loss_mask[-len(turn):] == [1] * len(turn) and sum(view.loss_mask) == len(turn)


def test_copy_friendly_init(policy_dir) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)  # equal values ...
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()  # ... not tied
    d = model.config.head_dim
    for layer in model.model.layers:
        with torch.no_grad():
            ov = layer.self_attn.o_proj.weight[:, :d] @ layer.self_attn.v_proj.weight[:d]  # first head's OV circuit
        assert torch.allclose(ov @ ov, ov, atol=1e-5) and abs(float(torch.trace(ov)) - d) < 1e-3  # a rank-d projection


def test_the_pipeline_prompts_with_the_environments_tool_schemas() -> None:
    from trace_core.warmstart.pipeline import TOOLS

    # tool_descriptions() reads neither the sandbox nor the retriever
    assert MathEnvironment(sandbox=None).tool_descriptions() == TOOLS["math"]  # type: ignore[arg-type]
    assert QAEnvironment(retriever=None).tool_descriptions() == TOOLS["qa"]  # type: ignore[arg-type]


def test_numbers_are_tokenised_digit_by_digit(tokenizer) -> None:
    assert split_digits("x = 6390 * 27, 1,972") == "x = 6 3 9 0 * 2 7, 1,9 7 2"
    pieces = tokenizer.tokenize("total = 6390 * 27")
    assert [p for p in pieces if any(ch.isdigit() for ch in p)] == ["Ġ6", "3", "9", "0", "Ġ2", "7"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="the sandbox needs root + unshare")
def test_in_process_math_observations_equal_the_sandboxed_environment(math_tasks) -> None:
    from trace_core.envs.math_env import MathEnvConfig
    from trace_core.envs.registry import make_env_factory

    factory = make_env_factory("math", MathEnvConfig())
    expert = MathExpert()
    for task in math_tasks[:3]:  # three templates; the sandbox costs ~0.3 s a call
        standin = expert.script(task, epsilon=0.0)
        real = expert.script(task, epsilon=0.0, env=factory(task))
        assert standin == real
        assert standin.correct


# ---------------------------------------------------------------------------------- error rate
def test_the_error_rate_is_honoured(math_tasks, qa_world) -> None:
    qa_expert, qa_tasks, _ = qa_world
    math_expert = MathExpert()
    for epsilon in (0.0, 1.0):
        ms = [math_expert.script(t, epsilon) for t in math_tasks[:10]]
        qs = [qa_expert.script(t, epsilon) for t in qa_tasks]
        assert corruption_rate(ms) == epsilon and corruption_rate(qs) == epsilon
        if epsilon == 0.0:  # the expert is right on every task
            assert all(s.correct for s in ms + qs)
        else:  # every step corrupted: (almost) never right
            assert sum(s.correct for s in ms + qs) <= 0.1 * len(ms + qs)
    epsilon = 0.25
    qs = build_scripts(qa_expert, qa_tasks, DemoConfig(epsilon=epsilon, demos_per_task=4, seed=7))
    ms = build_scripts(math_expert, math_tasks, DemoConfig(epsilon=epsilon, demos_per_task=2, seed=7))
    for group in (qs, ms):
        steps = sum(len(s.steps) for s in group)
        rate = corruption_rate(group)
        assert abs(rate - epsilon) < 4 * np.sqrt(epsilon * (1 - epsilon) / steps), (rate, steps)
        # corrupted scripts are the wrong ones
        assert all(s.correct for s in group if s.corrupted_steps == 0)
    # the same seed gives the same scripts; another seed other errors
    again = build_scripts(qa_expert, qa_tasks, DemoConfig(epsilon=epsilon, demos_per_task=4, seed=7))
    other = build_scripts(qa_expert, qa_tasks, DemoConfig(epsilon=epsilon, demos_per_task=4, seed=8))
    assert again == qs and other != qs


def test_bad_inputs_are_value_errors(math_tasks) -> None:
    with pytest.raises(ValueError, match="epsilon"):
        MathExpert().script(math_tasks[0], epsilon=1.5)
    with pytest.raises(ValueError, match="epsilon"):
        DemoConfig(epsilon=-0.1)
    with pytest.raises(ValueError, match="lr"):
        SFTConfig(lr=0.0)
    with pytest.raises(ValueError, match="solution_code"):
        MathExpert().script(dataclasses.replace(math_tasks[0], metadata={}), epsilon=0.0)


# ---------------------------------------------------------------------------------- SFT
def _loss(model_dir: Path, demos) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        return float(masked_lm_loss(model, collate(demos, 1024, 0)))


def test_sft_reduces_the_loss_and_saves_a_loadable_policy(policy_dir, demos, tmp_path) -> None:
    from trace_core.rollout.engine import EngineConfig, GenerationRequest, SamplingConfig, generate
    from trace_core.rollout.hf_engine import HFEngine

    train = demos["math"][:4] + demos["qa"][:4]
    before = _loss(policy_dir, demos["math"][:4]) + _loss(policy_dir, demos["qa"][:4])
    out = sft(policy_dir, train, SFTConfig(lr=1e-2, epochs=6, batch_size=4, warmup_steps=2, progress=False),
              out_dir=tmp_path / "sft")
    after = _loss(out, demos["math"][:4]) + _loss(out, demos["qa"][:4])
    assert after < 0.8 * before, (before, after)
    log = read_sft_log(out)
    assert log.steps == 12 and len(log.losses) == 12 and log.target_tokens == 6 * sum(sum(d.loss_mask) for d in train)
    engine = HFEngine(EngineConfig(model_path=str(out), max_model_len=2048))
    prompt = demos["math"][0].prompt_token_ids
    done = generate(engine, [GenerationRequest("r", prompt, SamplingConfig(max_new_tokens=4, temperature=0))])
    assert len(done[0].samples[0].token_ids) >= 1


def test_only_model_written_tokens_contribute_to_the_loss(policy_dir, demos) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    # Demos cut after their first observation: nothing the model writes comes after it.
    cut = [d.truncated(1) for d in demos["qa"][:3]]
    rng = np.random.default_rng(0)

    def with_observation(demo, ids):
        return dataclasses.replace(demo, observation_token_ids=(tuple(ids),))

    swapped = [with_observation(d, rng.integers(10, 600, size=len(d.observation_token_ids[0]) + 5)) for d in cut]
    with torch.no_grad():
        base = float(masked_lm_loss(model, collate(cut, 1024, 0)))
        assert float(masked_lm_loss(model, collate(swapped, 1024, 0))) == pytest.approx(base, abs=1e-6)
        # ... while changing a model-written token does change it (the check can fail)
        turn = list(cut[0].turn_token_ids[0])
        turn[3] = (turn[3] + 1) % 600
        changed = [dataclasses.replace(cut[0], turn_token_ids=(tuple(turn),))] + cut[1:]
        assert float(masked_lm_loss(model, collate(changed, 1024, 0))) != pytest.approx(base, abs=1e-4)
        # shared-prefix batching computes the same loss as plain batching
        full = demos["math"][:3]
        shared, plain = collate(full, 1024, 0, share_prefix=True), collate(full, 1024, 0, share_prefix=False)
        assert shared.prefix.numel() > 100 and plain.prefix.numel() == 0
        assert float(masked_lm_loss(model, shared)) == pytest.approx(float(masked_lm_loss(model, plain)), rel=1e-5)


def test_cli_parses_into_a_typed_config() -> None:
    from trace_core.warmstart.__main__ import parse_args

    config = parse_args(["--data", "d", "--out", "o", "--tasks", "math", "--epsilon", "0.2", "--epochs", "0.5",
                         "--hidden", "96", "--layers", "2", "--heads", "2"])
    assert config.families == ("math",) and config.demos.epsilon == 0.2 and config.sft.epochs == 0.5
    assert (config.model.hidden_size, config.model.num_hidden_layers, config.model.num_key_value_heads) == (96, 2, 1)
    with pytest.raises(ValueError, match="families"):
        parse_args(["--tasks", "math,chess"])


def test_tied_sft_trains_one_embedding_and_saves_it_untied(policy_dir, demos, tmp_path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    out = sft(policy_dir, demos["qa"][:4], SFTConfig(lr=1e-2, epochs=1, batch_size=4, warmup_steps=1,
                                                     progress=False, tie_embeddings=True), out_dir=tmp_path / "tied")
    before = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    embed, head = model.model.embed_tokens.weight, model.lm_head.weight
    assert embed.data_ptr() != head.data_ptr() and not model.config.tie_word_embeddings  # saved untied ...
    assert torch.equal(embed, head)  # ... with equal rows, trained as one
    assert not torch.equal(embed, before.model.embed_tokens.weight)  # and it did train


def test_autocast_auto_is_bfloat16_only_where_the_cpu_computes_it_natively(policy_dir, demos, tmp_path) -> None:
    """On a CPU without native bfloat16 (AVX2 only) autocast falls back to a path far slower than
    float32; "auto" then trains in float32, and the log says which ran."""
    from trace_core.warmstart.sft import native_bf16

    assert SFTConfig(autocast="bfloat16").uses_bf16() and not SFTConfig(autocast=None).uses_bf16()
    assert SFTConfig(autocast="auto").uses_bf16() == native_bf16()
    with pytest.raises(ValueError, match="autocast must be None, 'bfloat16' or 'auto'"):
        SFTConfig(autocast="float16")
    out = sft(policy_dir, demos["qa"][:4], SFTConfig(lr=1e-3, epochs=1, batch_size=4, warmup_steps=1,
                                                     progress=False, autocast="auto"), out_dir=tmp_path / "auto")
    assert read_sft_log(out).bf16 == native_bf16()
    out = sft(policy_dir, demos["qa"][:4], SFTConfig(lr=1e-3, epochs=1, batch_size=4, warmup_steps=1,
                                                     progress=False, autocast="bfloat16"), out_dir=tmp_path / "bf16")
    assert read_sft_log(out).bf16


def test_synthetic_knowledge_bases_give_new_names_and_valid_scripts() -> None:
    from trace_core.warmstart.pipeline import synthetic_qa_scripts

    scripts, passages = synthetic_qa_scripts(2, 5, DemoConfig(epsilon=0.0, seed=0))
    assert len(scripts) == 10 and all(s.correct for s in scripts)  # epsilon 0: the expert is right
    task_names = {e.name for e in kb.build_kb(kb.KBConfig()).values()}
    synthetic = {p.title for p in passages}
    assert synthetic and not synthetic & task_names  # other seeds, other made-up names


# ---------------------------------------------------------------------------------- BFCL expert
def test_bfcl_expert_replays_the_ground_truth_and_closes_turns_early_when_corrupted() -> None:
    from trace_core.envs.fc_env import FCEnvironment, ground_truth_tool_calls
    from trace_core.warmstart.experts import FCExpert
    from trace_core.warmstart.pipeline import WarmStartConfig, bfcl_tools, training_tasks

    config = WarmStartConfig(data_dir=str(DATA), families=("fc",), train_task_ids=("multi_turn_base_64",))
    (task,) = training_tasks(config, "fc")
    truth = ground_truth_tool_calls(task)
    clean = FCExpert().script(task, epsilon=0.0)
    # Every ground-truth call in order, one per turn, then one answer per user turn; BFCL's checker accepts it.
    calls = [(parse_action(s.text).tool, parse_action(s.text).arguments) for s in clean.steps if s.tool]
    assert calls == [(c["name"], c["arguments"]) for turn in truth for c in turn]
    assert sum("<answer>" in s.text for s in clean.steps) == len(truth) and clean.correct
    assert all(s.observation for s in clean.steps[:-1]) and clean.steps[-1].observation is None
    # The answer closing user turn 1 is followed by user turn 2's message.
    first_answer = next(s for s in clean.steps if "<answer>" in s.text)
    assert first_answer.observation == task.metadata["turns"][1][0]["content"]
    # Always corrupted: every user turn closed before its first call, which the checker rejects.
    broken = FCExpert().script(task, epsilon=1.0)
    assert [s.tool for s in broken.steps] == [None] * len(truth) and not broken.correct
    assert broken.corrupted_steps == len(truth)
    assert bfcl_tools(task) == FCEnvironment(task).tool_descriptions()
    with pytest.raises(ValueError, match="FCEnvironment"):
        FCExpert().script(task, 0.0, env=object())  # type: ignore[arg-type]


def test_warm_start_task_selection_and_length_rules(tmp_path) -> None:
    from trace_core.warmstart.pipeline import WarmStartConfig, run_warm_start, training_tasks

    config = WarmStartConfig(data_dir=str(DATA), families=("math",), train_task_ids=("multi_turn_base_64",))
    with pytest.raises(ValueError, match="train_task_ids names no math training task"):
        training_tasks(config, "math")
    with pytest.raises(ValueError, match="eval_split"):
        WarmStartConfig(eval_split="dev")
    # A BFCL demonstration (~3.7k tokens) is longer than SFT's default max_length: an error, not a silent cut.
    config = WarmStartConfig(data_dir=str(DATA), out_dir=str(tmp_path), families=("fc",), eval_tasks=0,
                             train_task_ids=("multi_turn_base_64",), view_sft=None)
    with pytest.raises(ValueError, match="over sft.max_length=1024"):
        run_warm_start(config)


# ---------------------------------------------------------------------------------- the SFT cache
def test_an_sft_is_reused_only_for_the_same_model_demonstrations_and_settings(policy_dir, demos, tmp_path) -> None:
    """fine_tune keeps a fresh SFT's policy by its inputs' key; a second warm start with the same
    starting model, demonstrations and settings copies it instead of fine-tuning; another learning
    rate, another demonstration or another starting model is another key."""
    from trace_core.warmstart.demos import write_demos
    from trace_core.warmstart.pipeline import WarmStartConfig, fine_tune
    from trace_core.warmstart.sft_cache import sft_key

    train = demos["math"][:4]
    sft_settings = SFTConfig(lr=1e-2, epochs=2, batch_size=4, warmup_steps=1, progress=False)
    cache = tmp_path / "cache"

    def warm_start(name: str, settings: SFTConfig, keep: bool, shown=train):
        out = tmp_path / name
        out.mkdir()
        write_demos(out / "demos.jsonl", shown)
        config = WarmStartConfig(data_dir=str(DATA), view_sft=None, sft=settings, sft_cache=str(cache), keep_sft=keep)
        return out, fine_tune(config, Path(policy_dir), out, [], shown)

    out1, (stages1, policy1, key1, reused1) = warm_start("first", sft_settings, keep=True)
    assert not reused1 and (cache / key1 / "policy" / "sft_log.json").is_file()
    assert json.loads((cache / key1 / "inputs.json").read_text())["sft"]["lr"] == 1e-2
    out2, (stages2, policy2, key2, reused2) = warm_start("second", sft_settings, keep=False)
    assert reused2 and key2 == key1 and policy2 == out2 / "policy"
    for f in (policy1).iterdir():
        assert (policy2 / f.name).read_bytes() == f.read_bytes()
    assert [s[1].losses for s in stages2] == [s[1].losses for s in stages1]  # the log of the SFT that made it
    _, (_, _, key3, reused3) = warm_start("other-lr", dataclasses.replace(sft_settings, lr=5e-3), keep=False)
    assert not reused3 and key3 != key1
    _, (_, _, key4, reused4) = warm_start("other-demos", sft_settings, keep=False, shown=train[:3])
    assert not reused4 and key4 != key1
    other_model = tmp_path / "other-model"
    shutil.copytree(policy_dir, other_model)
    (other_model / "config.json").write_text((other_model / "config.json").read_text().replace("\n", "\n ", 1))
    assert sft_key(other_model, out1 / "demos.jsonl", [None, sft_settings]) != key1
    assert sft_key(policy_dir, out1 / "demos.jsonl", [None, dataclasses.replace(sft_settings, progress=True)]) == key1


def test_keeping_an_sft_needs_a_cache_folder() -> None:
    from trace_core.warmstart.pipeline import WarmStartConfig

    with pytest.raises(ValueError, match="keep_sft needs sft_cache"):
        WarmStartConfig(keep_sft=True)


def test_the_copy_friendly_init_is_the_same_bytes_whatever_the_thread_count(tmp_path, policy_dir):
    """The same seed must give the same starting weights on a busy machine and an idle one: the SFT
    cache keys a fine-tuned policy by them. MKL's QR rounds by its thread count (which it lowers
    under load); the basis is drawn on one thread, so the count outside does not matter."""
    import shutil

    import torch

    from trace_core.warmstart.policy import WARM_MODEL, copy_friendly_init, orthonormal_basis

    # the shapes of the main job's policy, where the multi-threaded QR differed
    bases = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            gen = torch.Generator().manual_seed(1)
            bases.append([orthonormal_basis(WARM_MODEL.hidden_size, WARM_MODEL.head_dim, gen) for _ in range(4)])
            copy = shutil.copytree(policy_dir, tmp_path / f"threads{threads}")
            copy_friendly_init(copy, seed=0)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*bases, strict=True))
    basis = bases[0][0]
    assert basis.dtype == torch.float32 and basis.shape == (WARM_MODEL.hidden_size, WARM_MODEL.head_dim)
    assert torch.allclose(basis.T @ basis, torch.eye(WARM_MODEL.head_dim), atol=1e-5)
    assert (tmp_path / "threads1" / "model.safetensors").read_bytes() == \
        (tmp_path / "threads2" / "model.safetensors").read_bytes()


def test_sft_with_lora_trains_only_the_adapters_and_saves_them_beside_the_merged_model(policy_dir, demos,
                                                                                        tmp_path) -> None:
    """...and out of the folder's top level: vLLM and the weights digest read every top-level
    ``*.safetensors`` as the model's weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from trace_core.lora import ADAPTER_SUBDIR, LoraConfig, add_lora, load_adapter_state, merge_lora, read_adapter

    train = demos["math"][:4]
    before = _loss(policy_dir, train)
    config = SFTConfig(lr=1e-2, epochs=6, batch_size=4, warmup_steps=2, progress=False, lora=LoraConfig(rank=4))
    out = sft(policy_dir, train, config, out_dir=tmp_path / "sft")
    assert _loss(out, train) < 0.98 * before, before  # a random tiny model learns little through its projections alone
    base = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).state_dict()
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    assert merged.keys() == base.keys()  # a plain folder of full weights, the base's names
    for name in base:  # only the adapted projections moved; embeddings, norms and the head did not
        adapted = name.rsplit(".", 2)[-2] in config.lora.targets
        assert torch.equal(merged[name], base[name]) != adapted, name
    # the adapter alone rebuilds the merged model from the base, bit for bit
    assert [p.name for p in out.glob("*.safetensors")] == ["model.safetensors"]
    lora, state, described = read_adapter(out / ADAPTER_SUBDIR)
    assert lora == config.lora and described["modules"] and read_sft_log(out).config["lora"]["rank"] == 4
    rebuilt = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    add_lora(rebuilt, lora)
    load_adapter_state(rebuilt, state)
    assert all(torch.equal(merged[k], v) for k, v in merge_lora(rebuilt).state_dict().items())


def test_a_kept_adapter_replaces_the_fine_tuning_of_the_same_inputs(policy_dir, demos, tmp_path, capsys) -> None:
    """The pretrained warm start's adapter folder: a first LoRA SFT keeps its adapter under the key
    of its inputs; a second warm start of the same inputs merges it into the base instead of
    fine-tuning, and gets the same policy bytes; other settings miss it."""
    from dataclasses import replace

    from safetensors.torch import load_file

    from trace_core.lora import LoraConfig
    from trace_core.warmstart.demos import write_demos
    from trace_core.warmstart.pretrained import PretrainedWarmStartConfig, _fine_tune

    train = demos["math"][:4]
    sft_config = SFTConfig(lr=1e-2, epochs=2, batch_size=4, warmup_steps=1, progress=False, lora=LoraConfig(rank=2))
    config = PretrainedWarmStartConfig(sft=sft_config, adapters=str(tmp_path / "adapters"))
    runs = []
    for name in ("first", "second"):
        out = tmp_path / name
        out.mkdir()
        write_demos(out / "demos.jsonl", train)
        runs.append(_fine_tune(policy_dir, train, out, config))
    assert "kept adapter" in capsys.readouterr().out
    (entry,) = (tmp_path / "adapters").iterdir()
    assert {p.name for p in entry.iterdir()} == {"adapter.safetensors", "adapter.json", "sft_log.json"}
    first, second = (load_file(str(r / "model.safetensors")) for r in runs)
    assert first.keys() == second.keys() and all(first[k].equal(second[k]) for k in first)
    assert read_sft_log(runs[1]).losses == read_sft_log(runs[0]).losses
    # other settings: another key, a fresh fine-tuning
    out = tmp_path / "third"
    out.mkdir()
    write_demos(out / "demos.jsonl", train)
    _fine_tune(policy_dir, train, out, replace(config, sft=replace(sft_config, lr=2e-2)))
    assert len(list((tmp_path / "adapters").iterdir())) == 2
    with pytest.raises(ValueError, match="sft.lora"):
        _fine_tune(policy_dir, train, out, replace(config, sft=replace(sft_config, lora=None)))
