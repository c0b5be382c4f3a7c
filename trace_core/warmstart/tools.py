"""Cheap stand-ins for the environments' tools, for writing demonstrations: a trusted in-process
Python runner and a deterministic lexical passage search. (The tool schemas, observation layouts
and rewards are the environments' own: :mod:`trace_core.envs.math_env`, :mod:`trace_core.envs.qa_env`.)

Why in-process for math: every demonstration's code is the generator's own ``solution_code``
(possibly with one digit changed by the error injector), never model-written text, and the
sandbox costs ~0.25 s per call; 400 demonstrations would spend ~100 s there. The observation is
formatted exactly as :attr:`trace_core.envs.sandbox.SandboxResult.observation` formats a cell that
printed to stdout and raised nothing (stdout without its trailing newline). Model-written code is
never run in-process: evaluation uses the real math environment (the sandbox).

The search is lexical and deterministic so that a demonstration's observation is a pure function
of its query: passages of the entity named in the query (by id), then passages that mention that
entity, then the best word overlap, formatted by the QA environment's own ``format_hits``. For an
expert query (an entity name and a relation word) the supporting passage is always among the
first two results — which is also what the MiniLM retriever returns for such queries (its top 3
are the entity's own passages, then one that mentions it), in another order.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Sequence
from pathlib import Path

from trace_core.data.schema import Passage
from trace_core.envs.qa_env import QAEnvConfig, format_hits
from trace_core.retrieval import Hit

_WORD = re.compile(r"[a-z0-9]+")


class TrustedCodeError(ValueError):
    """The trusted code raised (the error injector produced an invalid program)."""


def run_trusted_python(code: str) -> str:
    """Run generator-written code in this process and return its observation text.

    Only for the dataset's own ``solution_code`` (and digit-level corruptions of it): it is exec'd
    with the host's builtins. Raises :class:`TrustedCodeError` if the code raises.
    """
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            exec(compile(code, "<solution_code>", "exec"), {"__name__": "__solution__"})  # noqa: S102
    except Exception as err:  # noqa: BLE001 - any failure means "pick another corruption"
        raise TrustedCodeError(f"{type(err).__name__}: {err}") from err
    out = buffer.getvalue().rstrip("\n")
    return out if out else "(no output)"


def format_passages(passages: Sequence[Passage], max_passage_chars: int = QAEnvConfig.max_passage_chars) -> str:
    """The search observation exactly as the QA environment writes it for these ranked passages."""
    return format_hits([Hit(rank, 0.0, p) for rank, p in enumerate(passages, 1)], max_passage_chars)


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


class PassageSearch:
    """Deterministic lexical top-k search over a passage corpus (see the module docstring)."""

    def __init__(self, passages: Sequence[Passage], k: int = QAEnvConfig.top_k,
                 max_passage_chars: int = QAEnvConfig.max_passage_chars) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if not passages:
            raise ValueError("passages must not be empty")
        self.k = k
        self.max_passage_chars = max_passage_chars
        self.passages = sorted(passages, key=lambda p: p.id)
        self._by_title: dict[str, list[Passage]] = {}
        for p in self.passages:
            self._by_title.setdefault(p.title.lower(), []).append(p)
        # Longest titles first, so "Zusfil University" wins over the city "Zusfil".
        self._titles = sorted(self._by_title, key=lambda t: (-len(t), t))
        self._words = [_words(f"{p.title} {p.text}") for p in self.passages]

    def entity_in(self, query: str) -> str | None:
        """The longest passage title contained in ``query`` (case-insensitive), or None."""
        q = query.lower()
        for title in self._titles:
            if re.search(rf"(?<![a-z0-9]){re.escape(title)}(?![a-z0-9])", q):
                return title
        return None

    def search(self, query: str) -> list[Passage]:
        ranked: list[Passage] = []
        title = self.entity_in(query)
        if title is not None:
            ranked += self._by_title[title]
            pattern = re.compile(rf"(?<![a-z0-9]){re.escape(title)}(?![a-z0-9])")
            ranked += [p for p in self.passages if p.title.lower() != title and pattern.search(p.text.lower())]
        if len(ranked) < self.k:
            seen = {p.id for p in ranked}
            q = _words(query)
            scored = sorted(
                ((-len(q & w), p.id, p) for p, w in zip(self.passages, self._words, strict=True) if p.id not in seen),
                key=lambda x: (x[0], x[1]),
            )
            ranked += [p for _, _, p in scored]
        return ranked[: self.k]

    def observation(self, query: str) -> str:
        return format_passages(self.search(query), self.max_passage_chars)


def load_passages(path: str | Path) -> list[Passage]:
    """The passages of a corpus JSONL file (``data/qa/corpus.jsonl``)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"corpus file {path} does not exist")
    return [Passage.from_record(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line]
