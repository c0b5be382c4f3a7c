"""Multi-hop QA environment: a dense-retrieval ``search`` tool and an exact-match reward.

Turn format (shared with the warm-start demonstrations)::

    <tool_call>{"name": "search", "arguments": {"query": "Nivia Thondre employer"}}</tool_call>
    <answer>Zusfil</answer>

The observation of a search is the top-``top_k`` passages of the faiss index
(:mod:`trace_core.retrieval`), one per line, best first::

    [1] Nivia Thondre: Nivia Thondre works as a chemist at Kemu Dynamics.
    [2] ...

Reward: normalized exact match (SQuAD's normalisation: lower case, punctuation and the articles
a/an/the removed, whitespace collapsed) of the answer against any alias in the task's answers.
Token F1 (the best over aliases) is reported by :meth:`QAEnvironment.metrics`.

The tool is stateless — the same query returns the same passages whatever came before — so a
snapshot is just the task and the queries so far, and restoring one re-runs nothing.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from trace_core.envs.common import SingleToolEnvironment, function_tool
from trace_core.retrieval import Hit, Retriever
from trace_core.rollout.env import Episode, Observation, Task

SEARCH_TOOL = function_tool(
    "search",
    "Search the knowledge base and return the most relevant passages, best first.",
    {"query": {"type": "string", "description": "What to look for, e.g. an entity's name and the fact wanted."}},
    ["query"],
)


@dataclass(frozen=True)
class QAEnvConfig:
    """The QA environment's retriever artifact and how much of it an observation shows."""

    index_dir: str = "artifacts/qa_index"  # built by `python -m trace_core.retrieval build`
    top_k: int = 3  # passages per search
    max_passage_chars: int = 400  # each passage's text is cut here
    max_query_chars: int = 300  # longer queries are cut before encoding
    model_path: str | None = None  # the index's encoder at another path (same model); None = as built
    device: str = "cpu"  # torch device of the query encoder

    def __post_init__(self) -> None:
        for name in ("top_k", "max_passage_chars", "max_query_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"QAEnvConfig.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class QASnapshot:
    task: Task
    queries: tuple[str, ...]


def format_hits(hits: Sequence[Hit], max_passage_chars: int) -> str:
    """``[rank] title: text`` lines, the observation of one search."""
    if not hits:
        return "No passages found."
    lines = []
    for h in hits:
        text = h.passage.text
        if len(text) > max_passage_chars:
            text = text[:max_passage_chars] + " …"
        lines.append(f"[{h.rank}] {h.passage.title}: {text}")
    return "\n".join(lines)


class QAEnvironment(SingleToolEnvironment):
    """The ``search`` tool of one QA episode and its reward (see the module docstring).

    ``retriever`` is shared by all instances (loaded once by the factory; thread-safe)."""

    tool = SEARCH_TOOL

    def __init__(self, retriever: Retriever, config: QAEnvConfig | None = None) -> None:
        super().__init__()
        self.retriever = retriever
        self.config = config or QAEnvConfig()
        self._queries: list[str] = []

    def _start(self, task: Task) -> None:
        self._queries = []

    def _call(self, query: str) -> Observation:
        query = query.strip()[: self.config.max_query_chars]
        self._queries.append(query)
        hits = self.retriever.search(query, self.config.top_k)
        return Observation(text=format_hits(hits, self.config.max_passage_chars))

    def reward(self, episode: Episode) -> float:
        return exact_match(episode.final_answer, answers_of(episode.task))

    def metrics(self, episode: Episode) -> dict[str, float]:
        """Exact match, token F1 (best alias), whether it answered, and how many searches it made."""
        answers = answers_of(episode.task)
        return {
            "em": exact_match(episode.final_answer, answers),
            "f1": f1_score(episode.final_answer, answers),
            "answered": float(episode.final_answer is not None),
            "searches": float(sum(a.tool == "search" for a in episode.actions)),
        }

    def snapshot(self) -> QASnapshot:
        if self._task is None:
            raise ValueError("snapshot() before reset()")
        return QASnapshot(self._task, tuple(self._queries))

    def restore(self, snapshot: QASnapshot) -> None:
        if not isinstance(snapshot, QASnapshot):
            raise ValueError(f"restore expects a QASnapshot, got {type(snapshot).__name__}")
        self._task = snapshot.task
        self._queries = list(snapshot.queries)


# ------------------------------------------------------------------------------------------ metrics
def answers_of(task: Task) -> list[str]:
    ref = task.answer
    if isinstance(ref, str):
        return [ref]
    if isinstance(ref, Sequence) and ref and all(isinstance(r, str) for r in ref):
        return list(ref)
    raise ValueError(f"task {task.id!r}: answer must be a string or a non-empty list of strings, got {ref!r}")


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1's normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str | None, answers: Sequence[str]) -> float:
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(a) for a in answers))


def f1_score(prediction: str | None, answers: Sequence[str]) -> float:
    """Token-level F1 of the normalized prediction, the best over ``answers`` (SQuAD)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction).split()
    best = 0.0
    for answer in answers:
        gold = normalize_answer(answer).split()
        if not pred or not gold:
            best = max(best, float(pred == gold))
            continue
        common = sum((Counter(pred) & Counter(gold)).values())
        if common:
            precision, recall = common / len(pred), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best
