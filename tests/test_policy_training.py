"""Tree-packed policy log-probs, the PPO-clip loss, and ZeRO-2/3 equivalence across processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trace_core.predictor.scoring import tree_attention_mask
from trace_core.training.ppo import (
    PPOLossConfig,
    pack_trees_for_training,
    ppo_clip_token_losses,
)

sys.path.insert(0, str(Path(__file__).parent / "workers"))
from zero_update import synthetic_trees  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def dense_token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, predecessor: torch.Tensor) -> torch.Tensor:
    """The reference the policy's chunked head is held to: ``log p(token_j | history)`` for every
    packed token from the full (L, V) logits, in float32 (0 where there is no predecessor)."""
    idx = predecessor.clamp(min=0)
    logp = torch.log_softmax(logits[idx].float(), dim=-1).gather(-1, token_ids[:, None]).squeeze(-1)
    return torch.where(predecessor >= 0, logp, torch.zeros_like(logp))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trace_core.models import TinyQwen3Config, build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("policy"), TinyQwen3Config(vocab_size=512, seed=3))


def test_packed_logprobs_equal_per_path_logprobs(model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    trees, adv = synthetic_trees(512)
    (pack, targets), *rest = pack_trees_for_training(trees, adv, max_tokens_per_forward=1 << 30)
    assert not rest and pack.num_tokens == sum(sum(len(n.token_ids) for n in t.nodes) for t in trees)
    with torch.no_grad():
        ids = torch.as_tensor(pack.token_ids)
        mask = tree_attention_mask(pack, torch.device("cpu"), "sdpa")
        out = model(input_ids=ids[None], position_ids=torch.as_tensor(pack.position_ids)[None],
                    attention_mask={"full_attention": mask}, use_cache=False)
        packed = dense_token_logprobs(out.logits[0], ids, torch.as_tensor(targets.predecessor)).numpy()
        # Reference: each root-to-leaf path on its own, plain causal attention.
        offset = 0
        for tree in trees:
            node_offset = {}
            for node in tree.nodes:
                node_offset[node.id] = offset
                offset += len(node.token_ids)
            for leaf in tree.leaves():
                path = tree.path(leaf)
                hist = torch.as_tensor(tree.history_tokens(leaf))
                logits = model(input_ids=hist[None]).logits[0]
                ref = torch.log_softmax(logits[:-1], -1).gather(-1, hist[1:, None]).squeeze(-1).numpy()
                pos = len(tree.nodes[0].token_ids)
                for n in path[1:]:
                    k = len(tree.nodes[n].token_ids)
                    np.testing.assert_allclose(packed[node_offset[n]: node_offset[n] + k], ref[pos - 1: pos - 1 + k],
                                               atol=2e-5)
                    pos += k
    # Loss tokens = distinct model-written tokens (shared prefixes once).
    assert int(targets.loss_mask.sum()) == sum(t.num_generated_tokens() for t in trees)


@pytest.mark.parametrize("attn", ["tree", "sdpa"])
def test_policy_logprobs_of_each_attention_equal_the_reference(model_dir: Path, attn: str) -> None:
    """The policy's log-prob path (chunked head) under the tree kernel and the dense mask gives
    the per-token log-probs of the full-logits reference above."""
    from transformers import AutoModelForCausalLM

    from trace_core.tree_packing.attention import model_attention
    from trace_core.tree_packing.logprobs import install_logprob_head, packed_token_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation=model_attention(attn)).eval()
    install_logprob_head(model, max_logits_per_chunk=4 * 512)
    trees, adv = synthetic_trees(512)
    (pack, targets), = pack_trees_for_training(trees, adv, max_tokens_per_forward=1 << 30)
    ids = torch.as_tensor(pack.token_ids)
    with torch.no_grad():
        got = packed_token_logprobs(model, pack, targets.predecessor, targets.loss_mask, torch.device("cpu"), attn)
        mask = tree_attention_mask(pack, torch.device("cpu"), "sdpa")
        model.config._attn_implementation = "sdpa"
        logits = model(input_ids=ids[None], position_ids=torch.as_tensor(pack.position_ids)[None],
                       attention_mask={"full_attention": mask}, use_cache=False).logits[0]
    ref = dense_token_logprobs(logits, ids, torch.as_tensor(targets.predecessor)) * torch.as_tensor(targets.loss_mask)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=0)


def test_ppo_clip_loss() -> None:
    cfg = PPOLossConfig(clip_eps=0.2)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.0, 1.0, 1.5, 0.5]))
    loss, stats = ppo_clip_token_losses(logp, old, adv, cfg)
    # ratio 1: −A; ratio 1.5 with A>0: clipped at 1.2; ratio 0.5 with A<0: clipped at 0.8 → −(0.8·−1)
    np.testing.assert_allclose(loss.numpy(), [-1.0, 1.0, -1.2, 0.8], atol=1e-6)
    assert stats["clip_frac"].tolist() == [0.0, 0.0, 1.0, 1.0]
    kl_cfg = PPOLossConfig(kl_coef=0.5)
    loss_kl, stats_kl = ppo_clip_token_losses(logp, old, adv, kl_cfg, ref_logp=logp.clone())
    assert torch.allclose(stats_kl["kl"], torch.zeros(4), atol=1e-7)
    with pytest.raises(ValueError, match="reference policy"):
        ppo_clip_token_losses(logp, old, adv, kl_cfg)
    with pytest.raises(ValueError, match="clip_eps"):
        PPOLossConfig(clip_eps=0)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(args: list[str], timeout: int = 420) -> None:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow
def test_zero2_and_zero3_on_two_processes_match_one_process(model_dir: Path, tmp_path: Path) -> None:
    worker = str(REPO / "tests" / "workers" / "zero_update.py")
    _launch([sys.executable, worker, str(model_dir), "2", str(tmp_path / "one_")])
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    port = _free_port()
    _launch([torchrun, "--nproc_per_node=2", f"--master_port={port}", worker, str(model_dir), "2,3",
             str(tmp_path / "two_")])
    base = np.load(tmp_path / "one_2.npz")
    norm = np.sqrt(sum((base[k] ** 2).sum() for k in base))
    assert norm > 0
    for stage in (2, 3):
        other = np.load(tmp_path / f"two_{stage}.npz")
        assert set(other) == set(base)
        diff = np.sqrt(sum(((base[k] - other[k]) ** 2).sum() for k in base))
        assert diff <= 0.01 * norm, f"ZeRO-{stage} on 2 processes differs by {diff / norm:.2%} of the update"


def test_a_non_finite_loss_is_skipped_and_counted_never_written_into_the_weights(model_dir: Path) -> None:
    from trace_core.training.policy import PolicyOptimizer, PolicyTrainConfig

    opt = PolicyOptimizer(str(model_dir), PolicyTrainConfig(lr=1e-3, zero_stage=2, micro_batches=2, grad_clip=0.0))
    try:
        trees, adv = synthetic_trees(int(opt.engine.module.config.vocab_size))
        before = opt.full_state_dict()
        poisoned = [np.where(np.arange(len(a)) == 1, np.nan, a) if i == 0 else a for i, a in enumerate(adv)]
        stats = opt.update(trees, poisoned)  # the micro-batch holding tree 0 has a NaN advantage
        after = opt.full_state_dict()
        assert stats["skipped_nonfinite"] == 1 and opt.skipped_nonfinite == 1
        assert all(torch.isfinite(v).all() for v in after.values())
        assert any(not torch.equal(before[k], after[k]) for k in before)  # the finite micro-batch was applied
        everything = opt.update(trees, [np.full_like(a, np.nan) for a in adv])
        assert everything["skipped_nonfinite"] == 2 and opt.skipped_nonfinite == 3
        assert all(torch.equal(after[k], v) for k, v in opt.full_state_dict().items())  # nothing moved
    finally:
        opt.engine.destroy()


def test_with_adapters_only_they_train_the_engine_gets_merged_weights_and_a_checkpoint_holds_them_alone(
        model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from trace_core.lora import LoraConfig, LoraLinear
    from trace_core.training.policy import PolicyOptimizer, PolicyTrainConfig

    config = PolicyTrainConfig(lr=1e-2, zero_stage=2, micro_batches=2, lora=LoraConfig(rank=4, alpha=8.0))
    # tied input and output embeddings, as SmolLM2's: a tied frozen weight must stay out of the checkpoint too
    tied = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tied.config.tie_word_embeddings = True
    tied.tie_weights()
    tied.save_pretrained(tmp_path / "tied")
    model_dir = tmp_path / "tied"
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    assert base["lm_head.weight"].data_ptr() == base["model.embed_tokens.weight"].data_ptr()
    opt = PolicyOptimizer(str(model_dir), config)
    try:
        trees, adv = synthetic_trees(int(opt.engine.module.config.vocab_size))
        assert all(torch.equal(base[k], v) for k, v in opt.full_state_dict().items())  # B = 0: the base
        opt.update(trees, adv)
        merged = opt.full_state_dict()
        assert merged.keys() == base.keys()  # what the rollout engine loads: the base's names
        moved = {k for k in base if not torch.equal(base[k], merged[k])}
        assert moved and all(k.rsplit(".", 2)[-2] in config.lora.targets for k in moved)
        # the merged weights compute what the adapted policy computes
        plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        plain.load_state_dict(merged)
        ids = torch.tensor([[3, 17, 200, 42, 9]])
        adapted = opt.engine.module.eval()
        with torch.no_grad():
            torch.testing.assert_close(plain(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
        opt.engine.train()
        opt.save_pretrained(tmp_path / "final")  # the run's policy folder: the merged model
        final = AutoModelForCausalLM.from_pretrained(tmp_path / "final", dtype=torch.float32).state_dict()
        assert final.keys() == base.keys() and all(torch.equal(merged[k], final[k]) for k in final)
        # a checkpoint holds the adapters and their optimizer state, not the frozen base
        opt.save_checkpoint(tmp_path / "ckpt", tag="policy")
        saved = sum(f.stat().st_size for f in (tmp_path / "ckpt").rglob("*") if f.is_file())
        full = sum(v.numel() * v.element_size() for v in base.values())
        adapters = sum(p.numel() * p.element_size() for m in adapted.modules() if isinstance(m, LoraLinear)
                       for p in (m.lora_A, m.lora_B))
        assert saved < full and saved < 6 * adapters + (1 << 16)  # weights + two Adam moments, and headers
        (states,) = (tmp_path / "ckpt" / "policy").glob("*model_states.pt")
        trained = {n for n, p in opt.engine.module.named_parameters() if p.requires_grad}
        assert set(torch.load(states, map_location="cpu", weights_only=False)["module"]) == trained
    finally:
        opt.engine.destroy()
    resumed = PolicyOptimizer(str(model_dir), config)
    try:
        resumed.load_checkpoint(tmp_path / "ckpt", tag="policy")
        assert all(torch.equal(merged[k], v) for k, v in resumed.full_state_dict().items())
        assert resumed.updates == 1
    finally:
        resumed.engine.destroy()
