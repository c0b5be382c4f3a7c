"""Low-rank adapters (trace_core.lora) on the tiny random Qwen3: an untrained adapter changes
nothing, a trained one computes what its merged weights compute, only the adapters train, and an
adapter saved alone rebuilds the merged model bit for bit, whatever the thread count."""

from __future__ import annotations

import json

import pytest
import torch

from trace_core.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    LoraConfig,
    LoraLinear,
    adapter_state_dict,
    add_lora,
    load_adapter_state,
    merge_lora,
    read_adapter,
    save_adapter,
)

CONFIG = LoraConfig(rank=4, alpha=8.0)
IDS = torch.tensor([[5, 17, 301, 42, 9, 77, 123, 8]])


def fresh(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def trained_adapter(model, seed: int = 1) -> None:
    """Random B matrices, as training would leave them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoraLinear):
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.05)


def test_an_untrained_adapter_computes_exactly_the_base(tiny_models):
    base, adapted = fresh(tiny_models[0]), fresh(tiny_models[0])
    names = add_lora(adapted, CONFIG)
    assert len(names) == 7 * adapted.config.num_hidden_layers  # q k v o gate up down of each layer
    assert torch.equal(logits(adapted), logits(base))


def test_only_the_adapters_train(tiny_models):
    model = fresh(tiny_models[0])
    add_lora(model, CONFIG)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith((".lora_A", ".lora_B")) for n in trainable)
    model.train()
    model(input_ids=IDS, labels=IDS).loss.backward()
    assert all(p.grad is None for n, p in model.named_parameters() if n not in trainable)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if n in trainable)


def test_the_merged_model_computes_what_the_adapted_one_does_under_the_base_names(tiny_models):
    model = fresh(tiny_models[0])
    add_lora(model, CONFIG)
    trained_adapter(model)
    adapted = logits(model)
    assert not torch.allclose(adapted, logits(fresh(tiny_models[0])))
    merged = merge_lora(model)
    assert merged.state_dict().keys() == fresh(tiny_models[0]).state_dict().keys()
    assert not any(isinstance(m, LoraLinear) for m in merged.modules())
    torch.testing.assert_close(logits(merged), adapted, atol=1e-5, rtol=1e-5)


def test_a_saved_adapter_rebuilds_the_merged_bytes_whatever_the_thread_count(tiny_models, tmp_path):
    model = fresh(tiny_models[0])
    add_lora(model, CONFIG)
    trained_adapter(model)
    save_adapter(model, CONFIG, tmp_path, base={"sha256": "abc"})
    lora, state, described = read_adapter(tmp_path)
    assert lora == CONFIG and described["base"] == {"sha256": "abc"}
    assert state.keys() == adapter_state_dict(model).keys()
    threads = torch.get_num_threads()
    merged = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            rebuilt = fresh(tiny_models[0])
            add_lora(rebuilt, lora)
            load_adapter_state(rebuilt, state)
            merged.append(merge_lora(rebuilt).state_dict())
    finally:
        torch.set_num_threads(threads)
    expected = merge_lora(model).state_dict()
    assert all(torch.equal(expected[k], merged[0][k]) and torch.equal(expected[k], merged[1][k]) for k in expected)


def test_a_damaged_or_foreign_adapter_is_refused(tiny_models, tmp_path):
    model = fresh(tiny_models[0])
    add_lora(model, CONFIG)
    trained_adapter(model)
    save_adapter(model, CONFIG, tmp_path)
    described = json.loads((tmp_path / ADAPTER_CONFIG).read_text())
    (tmp_path / ADAPTER_CONFIG).write_text(json.dumps({**described, "digest": "0" * 16}))
    with pytest.raises(ValueError, match="digest"):
        read_adapter(tmp_path)
    (tmp_path / ADAPTER_WEIGHTS).unlink()
    with pytest.raises(ValueError, match=ADAPTER_WEIGHTS):
        read_adapter(tmp_path)
    other = fresh(tiny_models[0])
    add_lora(other, LoraConfig(rank=8, alpha=8.0))
    state = adapter_state_dict(model)
    with pytest.raises(ValueError, match="shape"):
        load_adapter_state(other, state)
    with pytest.raises(ValueError, match="missing"):
        load_adapter_state(other, {k: v for k, v in list(state.items())[:-1]})


@pytest.mark.parametrize(("changes", "field"), [({"rank": 0}, "rank"), ({"alpha": 0.0}, "alpha"),
                                               ({"targets": ()}, "targets")])
def test_bad_settings_are_refused_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        LoraConfig(**changes)


def test_a_model_without_the_targets_is_refused(tiny_models):
    with pytest.raises(ValueError, match="targets"):
        add_lora(fresh(tiny_models[0]), LoraConfig(targets=("no_such_proj",)))
