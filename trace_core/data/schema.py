"""The one normalized example schema every dataset is loaded into, and the passage schema of a
retrieval corpus.

An :class:`Example` is a task instance, whatever dataset it came from:

* math (free form): ``answers`` holds the accepted final answers as strings, ``choices`` is empty;
* math (multiple choice, the out-of-domain MMLU-Pro / ARC-c / GPQA-diamond): ``choices`` holds
  the option texts in order and ``answers`` holds exactly one letter (``"A"`` is ``choices[0]``);
* qa: ``answers`` holds the gold answer and its aliases (any of them counts as exact match);
* fc (BFCL multi-turn): ``prompt`` is the first user turn, ``answers`` holds one JSON list of
  ground-truth call strings per turn, and ``metadata`` keeps everything the executable backend
  and checker need (``turns``, ``initial_config``, ``involved_classes``, ``ground_truth``, ...).

On disk an example is one JSON line whose keys are :data:`COLUMNS`; ``metadata`` is a JSON
object. In a pandas frame (for validation) ``metadata`` is kept as its JSON text.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, field
from typing import Any

TASKS = ("math", "qa", "fc")
SPLITS = ("train", "val", "test")
# Multiple-choice answer letters; MMLU-Pro has up to ten options (A..J).
LETTERS = tuple(string.ascii_uppercase[:10])

COLUMNS = ("id", "task", "source", "split", "prompt", "answers", "choices", "metadata")
PASSAGE_COLUMNS = ("id", "title", "text")
# Keys the task adapter (trace_core.envs.registry.example_to_task) adds to an example's metadata:
# a row's own metadata must not hold them.
RESERVED_METADATA_KEYS = ("family", "source", "split", "choices")


@dataclass(frozen=True)
class Example:
    """One task instance in the normalized schema (see the module docstring per task)."""

    id: str  # unique within its dataset file; stable across reloads of the same file
    task: str  # one of TASKS
    source: str  # dataset name, e.g. "math500", "hotpotqa", "bfcl-v4-multi-turn-base", "trace-arith"
    split: str  # one of SPLITS
    prompt: str  # the question / problem statement shown to the policy
    answers: list[str]  # accepted answers (aliases), a single letter for multiple choice
    choices: list[str] = field(default_factory=list)  # option texts, empty unless multiple choice
    metadata: dict[str, Any] = field(default_factory=dict)  # dataset-specific extras, JSON-serializable

    def to_record(self) -> dict[str, Any]:
        """The on-disk form: a plain dict with exactly :data:`COLUMNS` as keys."""
        return {
            "id": self.id,
            "task": self.task,
            "source": self.source,
            "split": self.split,
            "prompt": self.prompt,
            "answers": list(self.answers),
            "choices": list(self.choices),
            "metadata": self.metadata,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Example:
        """Inverse of :meth:`to_record`; raises ValueError naming a missing or unknown key."""
        missing = [c for c in COLUMNS if c not in record]
        extra = sorted(set(record) - set(COLUMNS))
        if missing or extra:
            raise ValueError(
                f"example record {record.get('id')!r}: missing keys {missing}, unknown keys {extra}"
            )
        return cls(**{c: record[c] for c in COLUMNS})

    @property
    def answer_index(self) -> int:
        """Index into ``choices`` of a multiple-choice answer; ValueError when not multiple choice."""
        if not self.choices:
            raise ValueError(f"example {self.id!r} has no choices; answer_index is for multiple choice")
        return LETTERS.index(self.answers[0])


@dataclass(frozen=True)
class Passage:
    """One retrievable passage of a corpus (the multi-hop QA search tool's documents)."""

    id: str  # unique within the corpus; QA examples cite these in metadata["supporting_passages"]
    title: str  # the entity the passage is about
    text: str  # the passage body

    def to_record(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "text": self.text}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Passage:
        missing = [c for c in PASSAGE_COLUMNS if c not in record]
        if missing:
            raise ValueError(f"passage record {record.get('id')!r}: missing keys {missing}")
        return cls(id=record["id"], title=record["title"], text=record["text"])


def jsonl_line(record: dict[str, Any]) -> str:
    """One record as a byte-stable JSON line (without the newline).

    The record's own keys and its ``metadata`` keys are sorted; deeper payloads keep their
    insertion order, because for BFCL that order is state (a directory listing follows the
    order of ``initial_config``'s file-system dict) and the generators build theirs in a fixed
    order. Floats use Python's shortest round-trip repr, which is platform independent.
    """
    ordered = {k: record[k] for k in sorted(record)}
    if isinstance(ordered.get("metadata"), dict):
        ordered["metadata"] = {k: ordered["metadata"][k] for k in sorted(ordered["metadata"])}
    return json.dumps(ordered, ensure_ascii=False, separators=(", ", ": "), allow_nan=False)
