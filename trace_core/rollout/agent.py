"""The ReAct turn format: how a prompt and an observation become token ids.

A turn is what the model writes — a thought and then either ``<tool_call>{json}</tool_call>`` or
``<answer>…</answer>`` — followed by the environment's observation. Token ids are produced once
and stored in the tree; a history is never re-rendered from text (re-tokenising a concatenation
can merge tokens across the boundary and silently change the prefix the policy is trained on).

The prompt goes through the policy tokenizer's own chat template (with the tool schemas); an
observation is the template's rendering of a tool message, closing the assistant turn and opening
the next one, tokenised on its own::

    <|im_end|>\\n<|im_start|>user\\n<tool_response>\\n{text}\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from trace_core.rollout.env import Task

DEFAULT_SYSTEM_PROMPT = (
    "You solve the user's task step by step. In each turn, think briefly, then either call one tool "
    "with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> or give the final answer as "
    "<answer>...</answer>."
)


@dataclass(frozen=True)
class AgentConfig:
    """The ReAct loop's limits and sampling settings."""

    max_turns: int = 6  # a trajectory ends after this many turns even without an answer
    max_new_tokens: int = 128  # tokens the model may write in one turn
    max_total_tokens: int = 2048  # a trajectory ends when its history could exceed this
    temperature: float = 1.0  # sampling temperature of every turn
    top_p: float = 1.0  # nucleus sampling mass
    stop: tuple[str, ...] = ("</tool_call>", "</answer>")  # a turn ends at the end of its action
    system_prompt: str = DEFAULT_SYSTEM_PROMPT  # put before the tool schemas in the system turn
    seed: int = 0  # base seed; each request's seed is derived from it, the prompt and the turn

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_total_tokens <= self.max_new_tokens:
            raise ValueError(
                f"max_total_tokens ({self.max_total_tokens}) must exceed max_new_tokens ({self.max_new_tokens})"
            )
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")


def render_prompt(tokenizer: Any, task: Task, tools: list[dict[str, Any]], config: AgentConfig) -> list[int]:
    """Token ids of the system turn (with tool schemas), the user turn and the assistant header."""
    messages = [{"role": "system", "content": config.system_prompt}, {"role": "user", "content": task.question}]
    ids = tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # a BatchEncoding from newer transformers
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def observation_text(text: str) -> str:
    """The chat-template rendering of a tool result that follows an assistant turn."""
    return f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{text}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


_OBSERVATION_HEAD, _OBSERVATION_TAIL = observation_text("\0").split("\0")
_ADDED_TOKENS: dict[int, tuple[Any, re.Pattern | None, frozenset[int]]] = {}


def _added_tokens(tokenizer: Any) -> tuple[re.Pattern | None, frozenset[int]]:
    """A pattern matching every added token's text (specials and chat markers alike), and their ids."""
    cached = _ADDED_TOKENS.get(id(tokenizer))
    if cached is None or cached[0] is not tokenizer:
        vocab = tokenizer.get_added_vocab()
        strings = sorted((t for t in vocab if t), key=len, reverse=True)
        pattern = re.compile("|".join(map(re.escape, strings))) if strings else None
        cached = _ADDED_TOKENS[id(tokenizer)] = (tokenizer, pattern, frozenset(int(i) for i in vocab.values()))
    return cached[1], cached[2]


def _plain_tokens(tokenizer: Any, text: str, pattern: re.Pattern, added: frozenset[int]) -> list[int]:
    """`text` as ordinary tokens: an added token's text (``<|im_end|>``) is split so that it can only
    encode as the characters it is made of, never as the control id."""
    def encode(piece: str) -> list[int]:
        return [int(t) for t in tokenizer.encode(piece, add_special_tokens=False)] if piece else []

    ids: list[int] = []
    pos = 0
    for match in pattern.finditer(text):
        ids += encode(text[pos : match.start()])
        ids += encode(match.group()[0]) + _plain_tokens(tokenizer, match.group()[1:], pattern, added)
        pos = match.end()
    ids += encode(text[pos:])
    if added.intersection(ids):  # a normaliser recomposed one: fall back to one character at a time
        ids = [i for ch in text for i in encode(ch)]
    return ids


def observation_tokens(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` framed as a tool result (`observation_text`).

    The frame's chat markers are control tokens; the tool's own text never is: a cell that prints
    ``<|im_end|>`` or ``<|im_start|>assistant`` reaches the policy as those characters, so it cannot
    forge a turn boundary. Text holding no added token's string is encoded in one piece, as before.
    """
    pattern, added = _added_tokens(tokenizer)
    if pattern is None or pattern.search(text) is None:
        return [int(t) for t in tokenizer.encode(observation_text(text), add_special_tokens=False)]
    head = tokenizer.encode(_OBSERVATION_HEAD, add_special_tokens=False)
    tail = tokenizer.encode(_OBSERVATION_TAIL, add_special_tokens=False)
    return [int(t) for t in head] + _plain_tokens(tokenizer, text, pattern, added) + [int(t) for t in tail]
