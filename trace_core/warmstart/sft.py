"""Supervised fine-tuning on demonstrations: next-token loss on the model-written tokens only.

A demonstration's loss mask (1 on the model's turns, 0 on the prompt and the observations) is the
rollout tree's, so SFT trains exactly the tokens RL will later train. The loss of a batch is the
mean cross-entropy over its masked-in target tokens.

Shared-prefix batching: every prompt of a task family starts with the same system turn (the
instructions and the tool schemas, ~200 of a demonstration's 300-600 tokens). A batch is drawn
from one family, its longest common prefix is run once with batch size 1 and its keys/values are
broadcast to the batch (gradients flow back through the broadcast), so the prefix costs one
sequence instead of ``batch_size``. :func:`masked_lm_loss` computes the same number as an
unshared forward pass (checked by the tests).

With ``SFTConfig.lora`` the base weights stay frozen and low-rank adapters are trained instead
(:mod:`trace_core.lora`): the output folder then holds the adapter (a few megabytes, committable)
beside the merged model every reader loads.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from trace_core.lora_config import LoraConfig

# Without a progress bar (a pipeline step, a log file), a line of progress this often.
PROGRESS_LINE_S = 20.0


class TrainingSequence(Protocol):
    """What the trainer reads: a token sequence, its loss mask, and the prompt (for batching).
    :class:`~trace_core.warmstart.demos.Demo` is one."""

    @property
    def token_ids(self) -> list[int]: ...

    @property
    def loss_mask(self) -> list[int]: ...

    @property
    def prompt_token_ids(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class SFTConfig:
    """Optimisation settings of :func:`sft`."""

    lr: float = 3e-3  # peak AdamW learning rate
    epochs: float = 2.0  # passes over the demonstrations (fractions allowed: the last one is cut)
    batch_size: int = 16  # demonstrations per optimizer step
    max_length: int = 1024  # a demonstration is cut to its first max_length tokens
    seed: int = 0  # seeds batch order (and nothing else: the weights come from the model dir)
    warmup_steps: int = 10  # linear warm-up steps
    min_lr_ratio: float = 0.1  # cosine decay ends at lr * min_lr_ratio
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    share_prefix: bool = True  # run a batch's common prefix once (module docstring)
    # Train with the output embedding tied to the input embedding, then save them untied (equal).
    # Copying a name from the context needs its output row to match its input row; untied, the
    # rows of names that are rarely targets drift apart and a tiny model never learns to copy
    # (measured: a toy copy task, 300 steps, 69% tied vs 5% untied). The saved model stays
    # untied, as the engines and the trainer expect.
    tie_embeddings: bool = False
    threads: int | None = None  # torch intra-op threads; None keeps torch's setting
    progress: bool = True  # show a tqdm progress bar
    # Forward and backward under bfloat16 autocast ("bfloat16"), weights and optimizer state kept in
    # float32: ~2.5x faster for a pretrained 135M model on a CPU that computes bfloat16 natively,
    # and tens of times slower on one that does not (AVX2 only), where autocast falls back to a
    # reference path. "auto": bfloat16 where the CPU computes it natively (native_bf16), else
    # float32. None trains in float32 throughout.
    autocast: str | None = None
    # train low-rank adapters on the frozen model (trace_core.lora) instead of every weight; the
    # adapter is saved beside the merged model (None: full fine-tuning)
    lora: LoraConfig | None = None

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.epochs <= 0:
            raise ValueError(f"epochs must be > 0, got {self.epochs}")
        for name in ("batch_size", "max_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {self.max_length}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("weight_decay and grad_clip must be >= 0")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1 or None, got {self.threads}")
        if self.autocast not in (None, "bfloat16", "auto"):
            raise ValueError(f"autocast must be None, 'bfloat16' or 'auto', got {self.autocast!r}")

    def uses_bf16(self) -> bool:
        """Whether the forward and backward run under bfloat16 autocast on this machine."""
        return self.autocast == "bfloat16" or (self.autocast == "auto" and native_bf16())


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 matrix products natively (oneDNN's own test: AVX-512 with
    its bfloat16 support, or AMX). False where torch cannot tell."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


@dataclass(frozen=True)
class Batch:
    """Demonstrations as tensors: an optional shared prefix and right-padded suffixes."""

    prefix: Any  # LongTensor [P] (P may be 0)
    input_ids: Any  # LongTensor [B, T]: the tokens after the prefix, padded
    attention_mask: Any  # LongTensor [B, T]
    loss_mask: Any  # FloatTensor [B, T]: 1 where the token is a target the loss counts

    @property
    def num_targets(self) -> int:
        return int(self.loss_mask.sum())


def collate(demos: Sequence[TrainingSequence], max_length: int, pad_id: int, share_prefix: bool = True) -> Batch:
    """Cut, split off the common prefix (it ends before the first model-written token) and pad."""
    import torch

    if not demos:
        raise ValueError("collate needs at least one demonstration")
    seqs = [d.token_ids[:max_length] for d in demos]
    masks = [d.loss_mask[:max_length] for d in demos]
    p = 0
    if share_prefix:
        first_target = min((m.index(1) if 1 in m else len(m)) for m in masks)
        limit = min(min(len(s) for s in seqs) - 1, first_target - 1)
        while p < limit and all(s[p] == seqs[0][p] for s in seqs):
            p += 1
    rest = [s[p:] for s in seqs]
    width = max(len(r) for r in rest)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    loss = torch.zeros((len(seqs), width), dtype=torch.float32)
    for i, (r, m) in enumerate(zip(rest, masks, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
        loss[i, : len(r)] = torch.tensor(m[p:], dtype=torch.float32)
    return Batch(torch.tensor(seqs[0][:p], dtype=torch.long), ids, attn, loss)


def masked_lm_loss(model: Any, batch: Batch, reduction: str = "mean") -> Any:
    """Cross-entropy of the masked-in targets: ``mean`` over them, or their ``sum``.

    A target at position ``t`` of the suffix is predicted from the logits at ``t - 1``; the first
    suffix token is never a target (``collate`` ends the prefix before the first model token).
    """
    import torch
    import torch.nn.functional as F

    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    bsz, width = batch.input_ids.shape
    p = int(batch.prefix.numel())
    # The backbone runs on every position, the LM head only where a target is masked in: most
    # tokens of a demonstration are prompt and observations, and the head's vocabulary-wide
    # product is a large share of a tiny model's cost. Same number as full logits.
    if p:
        cache = model.model(input_ids=batch.prefix[None], use_cache=True).past_key_values
        for layer in cache.layers:
            layer.keys = layer.keys.expand(bsz, -1, -1, -1)
            layer.values = layer.values.expand(bsz, -1, -1, -1)
        attn = torch.cat([torch.ones((bsz, p), dtype=torch.long), batch.attention_mask], dim=1)
        positions = torch.arange(p, p + width)[None].expand(bsz, -1)
        hidden = model.model(input_ids=batch.input_ids, attention_mask=attn, position_ids=positions,
                             past_key_values=cache, use_cache=True).last_hidden_state
    else:
        hidden = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    targets = batch.input_ids[:, 1:]
    weights = batch.loss_mask[:, 1:]
    selected = weights > 0
    logits = model.lm_head(hidden[:, :-1][selected])
    nll = F.cross_entropy(logits.float(), targets[selected], reduction="none")
    weights = weights[selected]
    total = (nll * weights).sum()
    if reduction == "sum":
        return total
    return total / weights.sum().clamp_min(1.0)


def _group_key(demo: TrainingSequence) -> tuple[int, ...]:
    """Demonstrations that share this key (their prompt's first 64 tokens) are batched together."""
    return tuple(demo.prompt_token_ids[:64])


def batch_order(demos: Sequence[TrainingSequence], batch_size: int, rng: np.random.Generator) -> list[list[int]]:
    """One epoch of batches (indices): per group, shuffled and length-sorted within windows of
    eight batches (less padding); then all batches shuffled."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, d in enumerate(demos):
        groups.setdefault(_group_key(d), []).append(i)
    batches: list[list[int]] = []
    for key in sorted(groups):
        idx = [groups[key][j] for j in rng.permutation(len(groups[key]))]
        window = batch_size * 8
        for w in range(0, len(idx), window):
            chunk = sorted(idx[w : w + window], key=lambda i: len(demos[i].token_ids))
            batches += [chunk[b : b + batch_size] for b in range(0, len(chunk), batch_size)]
    return [batches[j] for j in rng.permutation(len(batches))]


def _lr_at(step: int, total: int, config: SFTConfig) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, total - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass
class SFTLog:
    """What :func:`sft` did, written next to the model as ``sft_log.json``."""

    config: dict[str, Any]
    steps: int
    demos: int
    target_tokens: int  # masked-in target tokens seen (over all epochs)
    processed_tokens: int  # tokens run through the model (shared prefixes counted once per batch)
    losses: list[float]  # per optimizer step
    wall_seconds: float
    cpu_seconds: float  # process CPU time (all threads)
    bf16: bool = False  # ran under bfloat16 autocast (SFTConfig.autocast as resolved on this machine)


def sft(model_dir: str | Path, demos: Sequence[TrainingSequence], config: SFTConfig = SFTConfig(),
        out_dir: str | Path | None = None) -> Path:
    """Fine-tune the model in ``model_dir`` on ``demos`` and ``save_pretrained`` it (with its
    tokenizer) to ``out_dir`` (default: ``model_dir`` itself). Returns the output directory, which
    also holds ``sft_log.json`` (:class:`SFTLog`)."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_core.lora import ADAPTER_SUBDIR, add_lora, merge_lora, save_adapter

    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ValueError(f"model_dir {model_dir} is not a directory")
    if not demos:
        raise ValueError("demos must not be empty")
    out = Path(out_dir) if out_dir is not None else model_dir
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    if config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight  # one Parameter, for the duration of SFT
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rng = np.random.default_rng(config.seed)
    per_epoch = len(batch_order(demos, config.batch_size, np.random.default_rng(config.seed)))
    total = max(1, math.ceil(per_epoch * config.epochs))
    if config.lora is not None:
        add_lora(model, config.lora)
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
    losses: list[float] = []
    targets = processed = 0
    t0, c0 = time.perf_counter(), time.process_time()
    bar = tqdm(total=total, desc="sft", unit="step", disable=not config.progress)
    step = 0
    last_line = t0
    bf16 = config.uses_bf16()
    if not config.progress:  # no bar (a pipeline step): say what starts, then a line every PROGRESS_LINE_S
        print(f"progress: SFT: {total} steps of {config.batch_size} on {len(demos)} demonstrations"
              f"{' under bfloat16 autocast' if bf16 else ''}", flush=True)
    while step < total:
        for idx in batch_order(demos, config.batch_size, rng):
            if step >= total:
                break
            batch = collate([demos[i] for i in idx], config.max_length, pad_id, config.share_prefix)
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, total, config)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = masked_lm_loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(trained, config.grad_clip)
            opt.step()
            losses.append(float(loss.detach()))
            targets += batch.num_targets
            processed += int(batch.prefix.numel()) + int(batch.attention_mask.sum())
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if not config.progress and time.perf_counter() - last_line >= PROGRESS_LINE_S:
                last_line = time.perf_counter()
                elapsed = last_line - t0
                print(f"progress: SFT step {step}/{total}, loss {np.mean(losses[-20:]):.3f}, {elapsed:.0f} s, "
                      f"~{elapsed / step * (total - step):.0f} s left", flush=True)
    bar.close()
    log = SFTLog(asdict(config), step, len(demos), targets, processed, losses,
                 time.perf_counter() - t0, time.process_time() - c0, bf16)
    model.eval()
    if config.tie_embeddings:  # untie again: equal rows, separate tensors
        model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone())
    out.mkdir(parents=True, exist_ok=True)
    if config.lora is not None:
        source = model_dir / "policy_source.json"  # the wheel's model: which file the adapter adapts
        base = json.loads(source.read_text()) if source.is_file() else None
        save_adapter(model, config.lora, out / ADAPTER_SUBDIR, base=base)
        merge_lora(model)
    model.save_pretrained(out)
    if out.resolve() != model_dir.resolve():
        tokenizer.save_pretrained(out)
        for extra in ("tiny_qwen3.json",):
            if (model_dir / extra).is_file():
                shutil.copy2(model_dir / extra, out / extra)
    (out / "sft_log.json").write_text(json.dumps(asdict(log), indent=1) + "\n")
    return out


def read_sft_log(model_dir: str | Path) -> SFTLog:
    return SFTLog(**json.loads((Path(model_dir) / "sft_log.json").read_text()))
