"""Policy optimisation under DeepSpeed ZeRO (stages 0–3; gloo on CPU, NCCL on GPUs).

Every rank receives the same list of trees and advantages (the rollout result); the trees are
split deterministically into ``world_size × micro_batches`` groups balanced by token count, each
group one backward over one packed forward per tree (shared prefixes trained once; attention
never crosses trees, so trees are not packed together). A packed forward runs the shared tree
attention of :mod:`trace_core.tree_packing` — memory linear in the tree's tokens, the LM head in
vocabulary chunks — so a tree of tens of thousands of tokens never builds an ``L × L`` mask nor
its ``L × V`` logits. The loss of a group is its summed token losses divided by the step's total
number of model-written tokens, scaled so that DeepSpeed's division by the accumulation steps
and its averaging over ranks give exactly the gradient of the step's token-mean loss — the same
update whatever the number of processes or the ZeRO stage.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trace_core.lora import add_lora, merged_state_dict
from trace_core.training.policy_config import PolicyTrainConfig  # noqa: F401 - re-exported
from trace_core.training.ppo import (
    PackedTargets,
    pack_trees_for_training,
    ppo_clip_token_losses,
)
from trace_core.tree import RolloutTree
from trace_core.tree_packing.attention import model_attention
from trace_core.tree_packing.logprobs import install_logprob_head, packed_token_logprobs


def init_distributed(backend: str) -> tuple[int, int]:
    """Join (or, alone, create) the process group; returns (rank, world_size).

    Launched by torchrun/deepspeed the environment says who we are; a plain ``python`` process
    becomes rank 0 of 1 on a free local port."""
    import deepspeed
    import deepspeed.ops
    import torch.distributed as dist

    # DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce op on first use (a
    # minute of C++ on a fresh machine); gloo's all-reduce is all we need here.
    if backend == "gloo":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    if dist.is_initialized():  # e.g. by an in-process vLLM engine (a world of one, gloo)
        os.environ.setdefault("RANK", str(dist.get_rank()))
        os.environ.setdefault("WORLD_SIZE", str(dist.get_world_size()))
        os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    else:
        launched = all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
        if not launched or os.environ.get("WORLD_SIZE") == "1":  # alone: rank 0 of 1
            os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
        deepspeed.init_distributed(dist_backend=backend)
    return dist.get_rank(), dist.get_world_size()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def split_groups(token_counts: Sequence[int], n_groups: int) -> list[list[int]]:
    """Deterministic balanced split: largest first onto the lightest group (ties: lowest index)."""
    groups: list[list[int]] = [[] for _ in range(n_groups)]
    load = [0] * n_groups
    for i in sorted(range(len(token_counts)), key=lambda j: (-token_counts[j], j)):
        g = min(range(n_groups), key=lambda k: (load[k], k))
        groups[g].append(i)
        load[g] += token_counts[i]
    return [sorted(g) for g in groups]


class PolicyOptimizer:
    """A causal LM under DeepSpeed with a tree-packed PPO-clip update."""

    def __init__(self, model_dir: str | Path, config: PolicyTrainConfig) -> None:
        import deepspeed
        from transformers import AutoModelForCausalLM

        self.config = config
        self.rank, self.world_size = init_distributed(config.dist_backend)
        torch.manual_seed(config.seed)
        dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
        attention = model_attention(config.attn_implementation)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation=attention)
        # before DeepSpeed wraps (and under ZeRO-3 partitions) it: the head keeps its parameter
        install_logprob_head(model, config.max_logits_per_chunk)
        if config.lora is not None:  # the base frozen, only the adapters reach the optimizer
            add_lora(model, config.lora)
        self.ref_model = None
        if config.ppo.kl_coef > 0:  # frozen copy of the starting policy
            self.ref_model = AutoModelForCausalLM.from_pretrained(
                str(model_dir), dtype=dtype, attn_implementation=attention
            ).eval().requires_grad_(False)
            install_logprob_head(self.ref_model, config.max_logits_per_chunk)
        ds_config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": config.micro_batches,
            "gradient_clipping": config.grad_clip,
            "zero_optimization": {"stage": config.zero_stage},
            "optimizer": {"type": "AdamW", "params": {
                "lr": config.lr, "betas": list(config.betas), "weight_decay": config.weight_decay,
                "torch_adam": True}},
            "bf16": {"enabled": config.dtype == "bfloat16"},
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=ds_config
        )
        self.device = self.engine.device
        if self.ref_model is not None:  # DeepSpeed placed the policy; the frozen copy follows it
            self.ref_model.to(self.device)
        self.updates = 0
        self.skipped_nonfinite = 0  # micro-batches dropped for a non-finite loss, over the run

    # ------------------------------------------------------------------ forward pieces
    def _logprobs(self, model: torch.nn.Module, pack, targets: PackedTargets) -> torch.Tensor:
        """Log-probs of the pack's model-written tokens (0 elsewhere: nothing reads them). The
        LM head runs only at their predecessors, in vocabulary chunks."""
        return packed_token_logprobs(model, pack, targets.predecessor, targets.loss_mask, self.device,
                                     self.config.attn_implementation, self.config.tree_attention)

    def _my_groups(self, trees: Sequence[RolloutTree]) -> tuple[list[list[int]], list[int], int]:
        """This rank's groups, the number of forwards each of its micro-batches makes (the most
        trees any rank has in that micro-batch: under ZeRO-3 every forward gathers parameters
        collectively, so all ranks must make the same number), and the step's token count."""
        counts = [t.num_generated_tokens() for t in trees]
        mb = self.config.micro_batches
        groups = split_groups(counts, self.world_size * mb)
        mine = groups[self.rank * mb:(self.rank + 1) * mb]
        forwards = [max(len(groups[r * mb + j]) for r in range(self.world_size)) for j in range(mb)]
        return mine, forwards, int(sum(counts))

    def _step_without_moving(self) -> None:
        """The accumulation boundary's ``engine.step()`` with a learning rate of 0: DeepSpeed's
        counters advance as on every rank, the weights do not move (AdamW's decoupled decay is
        scaled by the learning rate too)."""
        groups = self.engine.optimizer.param_groups
        saved = [g["lr"] for g in groups]
        for g in groups:
            g["lr"] = 0.0
        try:
            self.engine.step()
        finally:
            for g, lr in zip(groups, saved, strict=True):
                g["lr"] = lr

    def _finite_everywhere(self, loss: torch.Tensor) -> bool:
        """Whether the loss is finite on every rank (one all-reduce when there are several)."""
        bad = torch.tensor(0.0 if bool(torch.isfinite(loss.detach()).all()) else 1.0, device=self.device)
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        return float(bad) == 0.0

    def _idle_forward(self, model: torch.nn.Module) -> torch.Tensor:
        """A one-token forward (its logits), for a rank with fewer trees than another."""
        return model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=self.device), use_cache=False).logits

    # ------------------------------------------------------------------ the update
    def update(self, trees: Sequence[RolloutTree], advantages: Sequence[np.ndarray]) -> dict[str, float]:
        """One training step on the trees: recompute old log-probs with the training model, then
        ``ppo_epochs`` optimizer steps of the clipped surrogate (token-mean)."""
        if len(trees) != len(advantages):
            raise ValueError(f"trees ({len(trees)}) and advantages ({len(advantages)}) must match")
        groups, forwards, total_tokens = self._my_groups(trees)
        if total_tokens == 0:
            raise ValueError("the trees hold no model-written tokens to train on")
        # One pack per tree: attention never crosses trees, so packing a group's trees together
        # would gain nothing (and grow the dense reference mask to (Σ L_i)²). A group is still one
        # backward (its trees' losses summed), so the update is the same.
        packed: list[list[tuple[Any, PackedTargets]] | None] = []
        for g in groups:
            if not g:
                packed.append(None)
                continue
            packed.append([pack_trees_for_training([trees[i]], [advantages[i]], max_tokens_per_forward=1 << 62)[0]
                           for i in g])
        # Old log-probs from the training model (the engine's may differ: kernels, dtype).
        old: list[list[torch.Tensor] | None] = []
        ref: list[list[torch.Tensor | None] | None] = []
        gap_sum, gap_n = 0.0, 0
        self.engine.eval()
        with torch.no_grad():
            for item, n_forwards in zip(packed, forwards, strict=True):
                for _ in range(n_forwards - len(item or [])):
                    self._idle_forward(self.engine)
                    if self.ref_model is not None:
                        self._idle_forward(self.ref_model)
                if item is None:
                    old.append(None)
                    ref.append(None)
                    continue
                old.append([])
                ref.append([])
                for pack, targets in item:
                    lp = self._logprobs(self.engine, pack, targets)
                    m = torch.as_tensor(targets.loss_mask, device=self.device)
                    engine_lp = torch.as_tensor(targets.old_logprob, device=self.device)
                    gap_sum += float((lp - engine_lp).abs()[m].sum())
                    gap_n += int(m.sum())
                    old[-1].append(lp)
                    ref[-1].append(self._logprobs(self.ref_model, pack, targets) if self.ref_model is not None
                                   else None)
        self.engine.train()
        # Scale: DeepSpeed divides by the accumulation steps and averages over ranks.
        scale = self.config.micro_batches * self.world_size / total_tokens
        stats = {"policy_loss": 0.0, "clip_frac": 0.0, "kl": 0.0}
        skipped = 0  # micro-batches dropped for a non-finite loss
        window_kept = 0  # finite micro-batches in the current gradient-accumulation window
        for _ in range(self.config.ppo_epochs):
            for item, old_lp, ref_lp, n_forwards in zip(packed, old, ref, forwards, strict=True):
                # A rank with fewer trees in this micro-batch (or none) still makes the same
                # forwards and joins the collective gradient reduction: one-token, zero-loss ones.
                loss = torch.zeros((), device=self.device)
                for _ in range(max(1, n_forwards) - len(item or [])):
                    loss = loss + self._idle_forward(self.engine).sum() * 0.0
                part = {"policy_loss": 0.0, "clip_frac": 0.0, "kl": 0.0}
                for (pack, targets), tree_old, tree_ref in zip(item or [], old_lp or [], ref_lp or [], strict=True):
                    lp = self._logprobs(self.engine, pack, targets)
                    m = torch.as_tensor(targets.loss_mask, device=self.device)
                    adv = torch.as_tensor(targets.advantage, device=self.device)
                    token_loss, s = ppo_clip_token_losses(lp, tree_old, adv, self.config.ppo, tree_ref)
                    loss = loss + (token_loss * m).sum() * scale
                    part["policy_loss"] += float((token_loss.detach() * m).sum()) / total_tokens
                    part["clip_frac"] += float((s["clip_frac"] * m).sum()) / total_tokens
                    if "kl" in s:
                        part["kl"] += float((s["kl"] * m).sum()) / total_tokens
                if not self._finite_everywhere(loss):  # every rank asks, an idle one too
                    # A non-finite loss (a NaN advantage, an overflowing log-ratio) would write NaN
                    # into every weight. Its micro-batch is dropped on every rank alike — a
                    # zero-loss forward keeps the collective reduction aligned — and counted.
                    loss = self._idle_forward(self.engine).sum() * 0.0
                    skipped += 1
                else:
                    window_kept += 1
                    for key, value in part.items():
                        stats[key] += value
                self.engine.backward(loss)
                boundary = self.engine.is_gradient_accumulation_boundary()
                if boundary and window_kept == 0:
                    self._step_without_moving()  # every micro-batch of the window dropped: no update
                else:
                    self.engine.step()
                if boundary:
                    window_kept = 0
            self.updates += 1
        epochs = self.config.ppo_epochs
        stats = {k: v / epochs for k, v in stats.items()}
        stats.update(
            logprob_gap_vs_engine=gap_sum / max(gap_n, 1), trained_tokens=float(total_tokens),
            grad_norm=float(self.engine.get_global_grad_norm() or 0.0), skipped_nonfinite=float(skipped),
        )
        self.skipped_nonfinite += skipped
        return _allreduce_mean(stats, self.world_size) if self.world_size > 1 else stats

    # ------------------------------------------------------------------ weights and state
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter, gathered (ZeRO-3 partitions them), on CPU — for the rollout engine;
        with adapters, the merged weights under the base model's names."""
        module = self.engine.module
        if self.config.zero_stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                return self._state_on_cpu(module)
        return self._state_on_cpu(module)

    def _state_on_cpu(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        state = merged_state_dict(module) if self.config.lora is not None else module.state_dict()
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def save_pretrained(self, out_dir: str | Path) -> None:
        """Save the current policy as a transformers model directory (rank 0 writes)."""
        state = self.full_state_dict()
        if self.rank == 0:
            self.engine.module.save_pretrained(str(out_dir), state_dict=state)

    def save_checkpoint(self, ckpt_dir: str | Path, tag: str) -> None:
        """Weights and optimizer state (all ranks participate); with adapters, only the trained
        ones: the frozen base is the starting model's, which a resume loads first."""
        self.engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={"updates": self.updates},
                                    exclude_frozen_parameters=self.config.lora is not None)
        if self.config.lora is not None and self.rank == 0:
            for states in sorted((Path(ckpt_dir) / tag).glob("*model_states.pt")):
                drop_untrained_weights(states)

    def load_checkpoint(self, ckpt_dir: str | Path, tag: str) -> None:
        _, client = self.engine.load_checkpoint(str(ckpt_dir), tag=tag,
                                                load_module_strict=self.config.lora is None)
        if client is None:
            raise ValueError(f"no policy checkpoint {tag!r} under {ckpt_dir}")
        self.updates = int(client.get("updates", 0))


def drop_untrained_weights(model_states: str | Path) -> int:
    """Rewrite a DeepSpeed model-states file with only the weights its optimizer trains (the names
    in its ``param_shapes``); the bytes dropped. A tied weight (SmolLM2's ``lm_head`` is its
    embedding) escapes ``exclude_frozen_parameters``, whose filter walks ``named_parameters()``,
    which lists a tied tensor once: with adapters it would put the 113 MB embedding in every
    checkpoint. A resume loads the module non-strictly, so the base's own weights stay."""
    path = Path(model_states)
    state = torch.load(path, map_location="cpu", weights_only=False)
    trained = {name for group in state.get("param_shapes") or [] for name in group}
    dropped = [k for k in state["module"] if k not in trained]
    if not trained or not dropped:
        return 0
    size = sum(state["module"][k].numel() * state["module"][k].element_size() for k in dropped)
    state["module"] = {k: v for k, v in state["module"].items() if k in trained}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return size


def _allreduce_mean(stats: dict[str, float], world: int) -> dict[str, float]:
    import torch.distributed as dist

    keys = sorted(stats)
    t = torch.tensor([stats[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    # Sums of per-rank shares (loss, clip_frac, kl, tokens) add up; the rest are averaged.
    additive = {"policy_loss", "clip_frac", "kl"}
    return {k: float(v) if k in additive else float(v) / world for k, v in zip(keys, t.tolist(), strict=True)}
