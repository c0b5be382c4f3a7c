"""A pinned tiny Qwen3 policy and its tokenizer, built locally (no hub downloads).

Tests and benchmarks need a real causal LM that both vLLM and transformers load from a directory,
with a real chat template and tool-call markers, yet builds in a second on a CPU. This module
builds one from a seed:

- a byte-level BPE tokenizer trained with the `tokenizers` library on a small corpus (a built-in
  one by default), with Qwen's ChatML specials ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``
  and the tool/thinking markers (``<tool_call>`` …) appended after the BPE vocabulary, as in Qwen;
- a ``Qwen3ForCausalLM`` (hidden 128, 2 layers by default) with **untied** input/output embeddings,
  randomly initialised from the seed;
- ``save_pretrained`` of both into one directory, which ``vllm`` and ``transformers`` load offline.

Everything is deterministic: the same :class:`TinyQwen3Config` gives byte-identical tokenizer
files and identical weights. Different ``seed`` values give different weights (and the same
tokenizer), which is what the weight-reload tests need.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

# Qwen3's ChatML specials, in Qwen's id order (special: stripped when decoding with skip_special_tokens).
CHATML_SPECIALS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Markers the model writes as text (not special: they survive decoding, so stop strings can see them).
TEXT_MARKERS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

# A Qwen-style ChatML template: an optional tool block in the system turn, tool results wrapped in
# <tool_response> inside a user turn, and the assistant header for generation.
CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_PROSE = """\
The agent reads the question, thinks about which tool to call, writes the call, and waits for
the observation. A tool returns a result or an error message. When the agent knows the answer it
writes the final answer and stops. Rollouts that share a prefix share the cached keys and values.
A tree of rollouts starts at the prompt; every node is one turn: a thought, an action and an
observation. The value of a node is the mean reward of the leaves below it. We spend the budget
where the outcome is most uncertain: prompts whose success rate is near one half, and prefixes
whose predicted value differs most from the reward of the rollout that went through them.
Search the web for the population of the city, then compute the ratio and round it to two places.
The function takes a list of numbers and returns their sum; the test checks the edge cases.
Weather, flights, hotels, files, messages, tickets, stocks and vehicles are simulated backends.
If the call is malformed, the environment answers with an error and the episode continues.
"""

_CODE = """\
def add(a, b):
    return a + b

import math
values = [math.sqrt(x) for x in range(10)]
print(sum(values) / len(values))
for i, row in enumerate(table):
    if row["score"] > best:
        best = row["score"]
result = {"name": "python", "arguments": {"code": "print(2 ** 10)"}}
"""

_WORDS = (
    "answer question tool call result error search compute python file read write list open close "
    "number value reward policy model token prefix cache tree node branch root leaf turn step "
    "budget sample group advantage variance mean ratio probability success failure observation "
    "action thought final state environment episode trajectory city country river mountain year "
    "price flight hotel weather message ticket vehicle stock order user assistant system function "
    "arguments name code print return import sum range length sort filter map string integer"
).split()

_TOOLS = ("python", "search", "calculator", "read_file", "get_weather", "book_flight")


def _lcg(seed: int) -> Iterable[int]:
    """A tiny fixed LCG: unlike `random`/`numpy`, its stream can never change between versions."""
    state = seed & 0xFFFFFFFF
    while True:
        state = (1103515245 * state + 12345) & 0x7FFFFFFF
        yield state


def builtin_corpus(n_dialogues: int = 1000, seed: int = 0) -> list[str]:
    """The default tokenizer corpus: prose, code and procedurally generated ReAct dialogues.

    The dialogues mix words, numbers, JSON tool calls and ChatML layout so that the BPE learns the
    pieces the tests and benchmarks actually emit. Deterministic for a given ``(n_dialogues, seed)``.
    """
    if n_dialogues < 0:
        raise ValueError(f"n_dialogues must be >= 0, got {n_dialogues}")
    rng = _lcg(seed)
    texts = [_PROSE, _CODE]
    for _ in range(n_dialogues):
        words = " ".join(_WORDS[next(rng) % len(_WORDS)] for _ in range(6 + next(rng) % 10))
        a, b = next(rng) % 1000, next(rng) % 1000
        tool = _TOOLS[next(rng) % len(_TOOLS)]
        call = json.dumps({"name": tool, "arguments": {"query": words.split()[0], "x": a, "y": b}})
        texts.append(
            f"<|im_start|>user\nWhat is {a} + {b}? {words.capitalize()}.<|im_end|>\n"
            f"<|im_start|>assistant\n<think>\nI should use {tool} on {words}.\n</think>\n"
            f"<tool_call>\n{call}\n</tool_call><|im_end|>\n"
            f"<|im_start|>user\n<tool_response>\n{a + b}\n</tool_response><|im_end|>\n"
            f"<|im_start|>assistant\nThe answer is {a + b}.<|im_end|>\n"
        )
    return texts


@dataclass(frozen=True)
class TinyQwen3Config:
    """Shape and seed of the tiny policy; every field is pinned so a config names one model."""

    seed: int = 0  # seeds the weight initialisation (the tokenizer does not depend on it)
    vocab_size: int = 2048  # BPE target size, specials and markers included (the trainer may stop early)
    hidden_size: int = 128  # model width
    num_hidden_layers: int = 2  # decoder layers
    num_attention_heads: int = 2  # query heads
    num_key_value_heads: int = 1  # KV heads (GQA, as in Qwen3)
    head_dim: int = 64  # per-head width
    intermediate_size: int = 384  # MLP width
    max_position_embeddings: int = 4096  # longest sequence the model accepts
    init_std: float = 0.1  # weight init std; larger than Qwen's 0.02 so a random model is not near-uniform
    dtype: str = "float32"  # dtype the weights are saved in ("float32" or "bfloat16")
    vocab_pad_multiple: int = 64  # the embedding rows are padded to a multiple of this (as Qwen pads)
    # Pre-tokenize words on their own (no leading space or quote attached), so that a name is the same
    # token ids wherever it appears: after a space in a question, after `"` in a JSON argument, at
    # the start of a passage. A tiny policy can then copy names by attention alone.
    isolate_words: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings",
                     "vocab_pad_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size < 256 + len(CHATML_SPECIALS) + len(TEXT_MARKERS):
            raise ValueError(f"vocab_size must cover the 256 byte tokens and the markers, got {self.vocab_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads, got "
                             f"{self.num_attention_heads} and {self.num_key_value_heads}")
        if self.init_std <= 0:
            raise ValueError(f"init_std must be > 0, got {self.init_std}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")


def train_tokenizer(corpus: Sequence[str] | None = None, vocab_size: int = 2048, isolate_words: bool = False):
    """Train a byte-level BPE on ``corpus`` (default: :func:`builtin_corpus`) and wrap it for transformers.

    Returns a ``PreTrainedTokenizerFast`` with the ChatML template, ``eos_token="<|im_end|>"`` and
    ``pad_token="<|endoftext|>"`` (Qwen3's instruct convention). The BPE vocabulary comes first
    (the 256 byte symbols, then merges); the specials and markers follow it, as in Qwen.

    ``isolate_words``: split runs of letters and single digits from everything around them before
    byte-level BPE (GPT-2's regex glues a leading space or punctuation mark to a word, so
    ``" Kaivin"`` and ``'"Kaivin'`` would be different tokens); spaces and punctuation between
    words still merge among themselves (``'": "'``).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = list(builtin_corpus() if corpus is None else corpus)
    if not texts or not any(t.strip() for t in texts):
        raise ValueError("corpus must contain at least one non-blank text")
    n_added = len(CHATML_SPECIALS) + len(TEXT_MARKERS)
    if vocab_size < 256 + n_added:
        raise ValueError(f"vocab_size must be >= {256 + n_added} (bytes + markers), got {vocab_size}")

    bpe = Tokenizer(models.BPE())
    if isolate_words:
        bpe.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\p{L}+|\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - n_added,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # Markers are split out before training so that no merge crosses them.
    marker_free = [_strip_markers(t) for t in texts]
    bpe.train_from_iterator(marker_free, trainer=trainer)
    bpe.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in CHATML_SPECIALS])
    bpe.add_tokens([AddedToken(s, special=False, normalized=False) for s in TEXT_MARKERS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def _strip_markers(text: str) -> str:
    for marker in CHATML_SPECIALS + TEXT_MARKERS:
        text = text.replace(marker, " ")
    return text


def build_tiny_qwen3(out_dir: str | Path, config: TinyQwen3Config = TinyQwen3Config(),
                     corpus: Sequence[str] | None = None) -> Path:
    """Build the tokenizer and the random model and ``save_pretrained`` both into ``out_dir``.

    ``out_dir`` then loads with ``AutoModelForCausalLM.from_pretrained``, ``AutoTokenizer`` and
    ``vllm``. A ``tiny_qwen3.json`` file records the config that built it.
    """
    import torch
    from transformers import GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(corpus, config.vocab_size, isolate_words=config.isolate_words)
    n_tokens = len(tok)
    padded_vocab = -(-n_tokens // config.vocab_pad_multiple) * config.vocab_pad_multiple
    im_end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    model_config = tiny_qwen3_config(
        vocab_size=padded_vocab,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        init_std=config.init_std,
        bos_token_id=eot,
        eos_token_id=im_end,
        pad_token_id=eot,
    )
    model = init_tiny_qwen3(model_config, config.seed).to(getattr(torch, config.dtype))
    model.generation_config = GenerationConfig(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "tiny_qwen3.json").write_text(json.dumps(asdict(config), indent=2, sort_keys=True) + "\n")
    return out


def tiny_qwen3_config(*, vocab_size: int, hidden_size: int, intermediate_size: int, num_hidden_layers: int,
                      num_attention_heads: int, num_key_value_heads: int, head_dim: int,
                      max_position_embeddings: int, init_std: float, bos_token_id: int | None = None,
                      eos_token_id: int | None = None, pad_token_id: int | None = None):
    """The ``transformers.Qwen3Config`` of every tiny random Qwen3 here: the policy of
    :func:`build_tiny_qwen3` and the predictor's tiny backbone. Embeddings are untied (as in the
    Qwen3 family, and as the policy's tests of the LM head need), attention has no dropout, and
    ``init_std`` is the std the weights are drawn with."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        initializer_range=init_std,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


def init_tiny_qwen3(model_config, seed: int):
    """A ``Qwen3ForCausalLM`` with every weight drawn from ``seed`` (float32, eval mode).

    Embeddings and linear weights ~ N(0, initializer_range), norms = 1, no biases (Qwen3 has none),
    drawn by :func:`init_tiny_weights` rather than transformers' ``_init_weights``.
    """
    from transformers import Qwen3ForCausalLM

    if model_config.tie_word_embeddings:
        raise ValueError("the tiny policy must have untied embeddings (tie_word_embeddings=False)")
    model = Qwen3ForCausalLM(model_config).eval()
    init_tiny_weights(model, seed, model_config.initializer_range)
    return model


def init_tiny_weights(model, seed: int, std: float):
    """Draw every parameter of a tiny random Qwen3 in place from ``seed``; returns ``model``.

    The one weight init of this project's tiny Qwen3s (the policy of :func:`init_tiny_qwen3` and
    the predictor's tiny backbone): parameters are visited in sorted-name order, RMSNorm weights
    (names ending ``norm.weight``) are set to 1, and every other parameter is replaced by
    ``N(0, std)`` drawn in float32 from a private ``torch.Generator`` seeded with ``seed``. So the
    weights depend only on ``seed``, ``std`` and the parameter names and shapes, not on
    transformers' ``_init_weights`` or the global torch RNG. The names include any module prefix
    (``model.`` / ``lm_head`` of a ``Qwen3ForCausalLM``), so a bare ``Qwen3Model`` and a causal LM
    of the same config get different weights from the same seed.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * std)
    return model
