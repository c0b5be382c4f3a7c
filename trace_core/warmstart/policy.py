"""The warm-start policy's tokenizer corpus and its random initial model.

A 152k Qwen vocabulary would make a tiny policy almost all embedding, so the tokenizer is a small
byte-level BPE trained on what the policy will actually read and write: the rendered prompts
(system turn with the tool schemas, the questions), the expert turns, the observations and the
passage corpus. :func:`trace_core.models.build_tiny_qwen3` does the training and the model; this
module only prepares its corpus and picks a shape.

Digits: Qwen's pre-tokenizer splits numbers into single digits, and that matters here — the math
expert copies ``6,390`` from the prompt as ``6390`` into code and copies printed values into
``\\boxed{}``; with multi-digit merges the same number is segmented differently in each place.
``build_tiny_qwen3``'s BPE merges digits, so the corpus is passed with a space between adjacent
digits: the trainer then learns no digit-digit merge and every number is tokenised digit by digit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trace_core.data.schema import Passage
from trace_core.models import TinyQwen3Config, build_tiny_qwen3, train_tokenizer
from trace_core.rollout.agent import AgentConfig, observation_text
from trace_core.rollout.env import Task
from trace_core.warmstart.demos import ToolSchemas, tools_of
from trace_core.warmstart.experts import Script
from trace_core.warmstart.tools import format_passages

if TYPE_CHECKING:
    import torch

# Large enough to learn the turn format and to copy names and numbers, small enough for a few
# CPU minutes of SFT (~0.9M parameters, ~0.5M of them embeddings).
WARM_MODEL = TinyQwen3Config(
    seed=0,
    vocab_size=2048,
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    intermediate_size=384,
    max_position_embeddings=4096,
    init_std=0.02,
    isolate_words=True,  # a name is the same tokens in the question, the query and the passages
)

_DIGIT_PAIR = re.compile(r"(?<=\d)(?=\d)")


def split_digits(text: str) -> str:
    """``"6390"`` -> ``"6 3 9 0"``: keeps the BPE trainer from learning digit-digit merges."""
    return _DIGIT_PAIR.sub(" ", text)


def prompt_texts(tasks_and_tools: Iterable[tuple[Task, list[dict[str, Any]]]], agent: AgentConfig) -> list[str]:
    """The chat-template text of each task's prompt, exactly as ``render_prompt`` lays it out.

    Rendered with a throwaway tokenizer (the template is the same for every tokenizer that
    ``build_tiny_qwen3`` makes), since the real one is what the corpus is for.
    """
    bootstrap = train_tokenizer(["bootstrap corpus for the chat template"], vocab_size=300)
    out = []
    for task, tools in tasks_and_tools:
        messages = [{"role": "system", "content": agent.system_prompt}, {"role": "user", "content": task.question}]
        out.append(bootstrap.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True,
                                                 tokenize=False))
    return out


def tokenizer_corpus(
    scripts: dict[str, Sequence[Script]],
    tools: Mapping[str, ToolSchemas],
    agent: AgentConfig,
    passages: Sequence[Passage] = (),
) -> list[str]:
    """Prompts, expert turns with their observations, and passages, with digits split.

    ``scripts`` and ``tools`` map a task family ("math", "qa", ...) to its scripts and tool schemas
    (a list, or a function of the task: :func:`~trace_core.warmstart.demos.tools_of`).
    """
    missing = sorted(set(scripts) - set(tools))
    if missing:
        raise ValueError(f"tools has no schemas for task families {missing}")
    texts = prompt_texts(((s.task, tools_of(tools[name], s.task)) for name, group in scripts.items() for s in group),
                         agent)
    for group in scripts.values():
        for s in group:
            for step in s.steps:
                texts.append(step.text)
                if step.observation is not None:
                    texts.append(observation_text(step.observation))
    if passages:
        texts.append(format_passages(passages))
    return [split_digits(t) for t in texts]


def build_policy(out_dir: str | Path, corpus: Sequence[str], config: TinyQwen3Config = WARM_MODEL,
                 copy_init: bool = True) -> Path:
    """A random tiny Qwen3 with a tokenizer trained on ``corpus`` (see :func:`tokenizer_corpus`),
    optionally with :func:`copy_friendly_init` applied."""
    if not corpus:
        raise ValueError("corpus must not be empty")
    out = build_tiny_qwen3(out_dir, config, corpus=list(corpus))
    if copy_init:
        copy_friendly_init(out, config.seed, config.dtype)
    return out


def copy_friendly_init(model_dir: str | Path, seed: int = 0, dtype: str = "float32") -> None:
    """Re-initialise a saved tiny model so that copying a token from the context is easy to learn.

    The policy's content tokens (names, digits) are copies of tokens in its context, and a tiny
    model learns copying slowly from scratch. Two changes to the random init, then the model is
    saved back in place:

    - the output embedding starts as a copy of the input embedding (they stay untied), so a
      token's own embedding in the residual stream raises that token's logit;
    - in every layer, the value projection and the output projection of the first head of each
      KV group are an orthonormal projection and its transpose, so what a head attends to is
      passed on to the residual stream (its OV circuit is a rank-``head_dim`` projection).

    SFT then mostly has to learn *where* to attend. Measured on the embedded data (same steps):
    held-out content-token accuracy 0.60 instead of 0.54 after 200 turn-view steps.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = model.config
    if cfg.head_dim > cfg.hidden_size:
        raise ValueError(f"copy_friendly_init needs head_dim <= hidden_size, got {cfg.head_dim} > {cfg.hidden_size}")
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        for layer in model.model.layers:
            attn = layer.self_attn
            for kv in range(cfg.num_key_value_heads):
                rows = slice(kv * cfg.head_dim, (kv + 1) * cfg.head_dim)
                basis = orthonormal_basis(cfg.hidden_size, cfg.head_dim, gen)  # H x d
                attn.v_proj.weight[rows].copy_(basis.T)
                head = kv * group  # the first query head reading this KV group
                attn.o_proj.weight[:, head * cfg.head_dim : (head + 1) * cfg.head_dim].copy_(basis)
    model.to(getattr(torch, dtype)).save_pretrained(model_dir)


def orthonormal_basis(rows: int, cols: int, gen) -> torch.Tensor:
    """An orthonormal ``rows × cols`` basis (float32) from the seeded Gaussian draw ``gen`` gives.

    LAPACK's QR (MKL in torch's CPU build) rounds differently with the number of threads it runs
    on, and MKL lowers that number when the machine is busy, so one seed gave different weights
    from one run to the next — and a fine-tuned policy kept by its starting weights
    (:mod:`trace_core.warmstart.sft_cache`) was missed. One thread, in float64, rounded to float32
    at the end, makes the basis a function of the seed alone."""
    import torch

    draw = torch.randn(rows, cols, generator=gen)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return torch.linalg.qr(draw.double())[0].float()
    finally:
        torch.set_num_threads(threads)


def count_parameters(model_dir: str | Path) -> dict[str, int]:
    """Total, embedding (input + output) and non-embedding parameter counts of a saved model."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel() + model.get_output_embeddings().weight.numel()
    return {"total": total, "embedding": embed, "non_embedding": total - embed}
