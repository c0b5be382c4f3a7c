"""Loaders from the published formats of the paper's datasets (method §9) into :class:`Example`.

Users bring the real files (downloaded once, versioned with DVC); nothing here downloads.
Supported file formats: ``.json`` (a JSON array, an object with a ``data`` list, or JSON lines),
``.jsonl``, ``.parquet`` and ``.csv`` (GPQA is published as CSV). Field names follow the
canonical release of each dataset, with the common re-uploads' spellings as fallbacks:

==============  ==========================================================================
name            fields read
==============  ==========================================================================
deepscaler      problem, answer, solution (agentica-org/DeepScaleR-Preview-Dataset)
aime24          id, problem, answer, solution, url (HuggingFaceH4/aime_2024; ID/Problem/Answer)
amc23           id, question, answer, url (math-ai/amc23; answers may be floats like 27.0)
math500         unique_id, problem, answer, solution, subject, level (HuggingFaceH4/MATH-500)
minervamath     question, answer (math-ai/minervamath; problem/solution also read)
olympiadbench   id, question, context, final_answer (list), unit, answer_type, subfield (Hothan)
mmlu_pro        question_id, question, options, answer (letter), category, src (TIGER-Lab)
arc_challenge   id, question, choices{text,label}, answerKey (allenai/ai2_arc; also AI2's original
                question{stem,choices} form; labels 1-4 too)
gpqa_diamond    Record ID, Question, Correct Answer, Incorrect Answer 1-3 (Idavidrein/gpqa)
hotpotqa        _id, question, answer, type, level, supporting_facts, context (both the
                original list form and the HF dict form of the last two)
2wikimultihopqa _id, question, answer, type, supporting_facts, evidences, context
musique         id, question, answer, answer_aliases, answerable, paragraphs, question_decomposition
bamboogle       Question, Answer (chiayewken/bamboogle)
bfcl            BFCL v4 multi-turn question file + possible_answer/<same name> (see bfcl.py)
==============  ==========================================================================

QA loaders also accept FlashRAG's ``golden_answers`` list. GPQA's options are shuffled with a
seed derived from the record id, so the correct letter is fixed per question but not always "A".
Every loader validates what it returns (``validate=False`` skips it), so nothing downstream runs
on invalid data.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_core.data.bfcl import load_bfcl_file
from trace_core.data.hashing import HashRng
from trace_core.data.reading import ReadConfig, check_row_sizes, read_json_lines, read_text
from trace_core.data.schema import LETTERS, Example

Row = dict[str, Any]


# ----------------------------------------------------------------------------------- file reading
def read_records(path: str | Path, read: ReadConfig | None = None) -> list[Row]:
    """The rows of a published dataset file, as plain Python dicts (nested lists/dicts kept).

    Text is decoded as strict UTF-8 and no row may exceed ``read.max_row_bytes``: a
    :class:`~trace_core.data.reading.DataValidationError` names every offending line or row.
    """
    path = Path(path)
    read = read or ReadConfig()
    if not path.is_file():
        raise ValueError(f"dataset file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # heavy: imported on use

        rows = pq.read_table(path).to_pylist()
        check_row_sizes(rows, str(path), read)
        return rows
    if suffix == ".csv":
        rows = list(csv.DictReader(io.StringIO(read_text(path), newline="")))
        check_row_sizes(rows, str(path), read)
        return rows
    if suffix not in (".json", ".jsonl"):
        raise ValueError(f"{path}: unsupported format {suffix!r}; use .json, .jsonl, .parquet or .csv")
    if suffix == ".json":
        try:
            data = json.loads(read_text(path))
        except (json.JSONDecodeError, RecursionError):
            data = None  # JSON lines under a .json name (BFCL, some HF exports)
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if isinstance(data, list):
            check_row_sizes(data, str(path), read)
            return _dict_rows(data, path)
    rows, _ = read_json_lines(path, read)
    return _dict_rows(rows, path)


def _dict_rows(rows: list[Any], path: Path) -> list[Row]:
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: record {i} is a {type(row).__name__}, expected a JSON object")
    return rows


# ----------------------------------------------------------------------------------- field helpers
def _get(row: Row, keys: tuple[str, ...], what: str, where: str) -> Any:
    for key in keys:
        if row.get(key) is not None:
            return row[key]
    raise ValueError(f"{where}: no {what} field (looked for {list(keys)})")


def _opt(row: Row, *keys: str) -> Any:
    return next((row[k] for k in keys if row.get(k) is not None), None)


def _text(value: Any) -> str:
    """Answer text: integral floats lose their ``.0`` (AMC23 stores 27.0), the rest is ``str``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def _unique(values: list[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def _paragraphs(value: Any) -> list[dict[str, Any]]:
    """HotpotQA/2Wiki context: ``[[title, [sentences]]]`` or ``{"title": [...], "sentences": [...]}``."""
    if isinstance(value, dict):
        return [
            {"title": t, "sentences": list(s)}
            for t, s in zip(value["title"], value["sentences"], strict=True)
        ]
    return [{"title": t, "sentences": list(s)} for t, s in value or []]


def _facts(value: Any) -> list[list[Any]]:
    """Supporting facts: ``[[title, sent_id]]`` or ``{"title": [...], "sent_id": [...]}``."""
    if isinstance(value, dict):
        return [[t, int(i)] for t, i in zip(value["title"], value["sent_id"], strict=True)]
    return [[t, int(i)] for t, i in value or []]


def _mc(name: str, rid: str, split: str, prompt: str, choices: list[str], letter: str, meta: Row) -> Example:
    return Example(
        id=rid,
        task="math",
        source=name,
        split=split,
        prompt=prompt.strip(),
        answers=[letter],
        choices=[_text(c) for c in choices],
        metadata=meta,
    )


# ----------------------------------------------------------------------------------- one per dataset
def _deepscaler(row: Row, i: int, split: str, where: str) -> Example:
    return Example(
        id=f"deepscaler-{i:06d}",
        task="math",
        source="deepscaler",
        split=split,
        prompt=_get(row, ("problem", "question"), "problem", where),
        answers=[_text(_get(row, ("answer",), "answer", where))],
        metadata={"solution": _opt(row, "solution")},
    )


def _aime24(row: Row, i: int, split: str, where: str) -> Example:
    rid = _opt(row, "id", "ID")
    return Example(
        id=f"aime24-{rid if rid is not None else i}",
        task="math",
        source="aime24",
        split=split,
        prompt=_get(row, ("problem", "Problem", "question"), "problem", where),
        answers=[_text(_get(row, ("answer", "Answer"), "answer", where))],
        metadata={
            "solution": _opt(row, "solution", "Solution"),
            "url": _opt(row, "url"),
            "year": _opt(row, "year"),
        },
    )


def _amc23(row: Row, i: int, split: str, where: str) -> Example:
    rid = _opt(row, "id")
    return Example(
        id=f"amc23-{rid if rid is not None else i}",
        task="math",
        source="amc23",
        split=split,
        prompt=_get(row, ("question", "problem"), "question", where),
        answers=[_text(_get(row, ("answer",), "answer", where))],
        metadata={"url": _opt(row, "url")},
    )


def _math500(row: Row, i: int, split: str, where: str) -> Example:
    return Example(
        id=str(_opt(row, "unique_id") or f"math500-{i}"),
        task="math",
        source="math500",
        split=split,
        prompt=_get(row, ("problem",), "problem", where),
        answers=[_text(_get(row, ("answer",), "answer", where))],
        metadata={
            "solution": _opt(row, "solution"),
            "subject": _opt(row, "subject"),
            "level": _opt(row, "level"),
        },
    )


def _minervamath(row: Row, i: int, split: str, where: str) -> Example:
    return Example(
        id=f"minervamath-{i:04d}",
        task="math",
        source="minervamath",
        split=split,
        prompt=_get(row, ("question", "problem"), "question", where),
        answers=[_text(_get(row, ("answer",), "answer", where))],
        metadata={"solution": _opt(row, "solution"), "type": _opt(row, "type")},
    )


def _olympiadbench(row: Row, i: int, split: str, where: str) -> Example:
    question = _get(row, ("question", "problem"), "question", where)
    context = _opt(row, "context")
    final = _get(row, ("final_answer", "answer"), "final_answer", where)
    answers = [_text(a) for a in (final if isinstance(final, list) else [final])]
    rid = _opt(row, "id")
    return Example(
        id=f"olympiadbench-{rid if rid is not None else i}",
        task="math",
        source="olympiadbench",
        split=split,
        prompt=f"{context}\n\n{question}" if context else question,
        answers=answers,
        metadata={
            "unit": _opt(row, "unit"),
            "answer_type": _opt(row, "answer_type"),
            "is_multiple_answer": _opt(row, "is_multiple_answer"),
            "subfield": _opt(row, "subfield"),
            "solution": _opt(row, "solution"),
        },
    )


def _mmlu_pro(row: Row, i: int, split: str, where: str) -> Example:
    options = list(_get(row, ("options",), "options", where))
    letter = _opt(row, "answer")
    if letter is None:
        letter = LETTERS[int(_get(row, ("answer_index",), "answer", where))]
    rid = _opt(row, "question_id")
    return _mc(
        "mmlu_pro",
        f"mmlu_pro-{rid if rid is not None else i}",
        split,
        _get(row, ("question",), "question", where),
        options,
        str(letter).strip(),
        {"category": _opt(row, "category"), "src": _opt(row, "src")},
    )


def _arc_challenge(row: Row, i: int, split: str, where: str) -> Example:
    question = _get(row, ("question",), "question", where)
    if isinstance(question, dict):  # AI2's original jsonl: {"stem": ..., "choices": [{"text", "label"}]}
        row = {
            **row,
            "question": question.get("stem"),
            "choices": {
                "text": [c["text"] for c in question["choices"]],
                "label": [c["label"] for c in question["choices"]],
            },
        }
    choices = _get(row, ("choices",), "choices", where)
    texts, labels = list(choices["text"]), [str(x) for x in choices["label"]]
    key = str(_get(row, ("answerKey",), "answerKey", where)).strip()
    if key not in labels:
        raise ValueError(f"{where}: answerKey {key!r} is not one of the labels {labels}")
    meta = {"original_labels": labels} if labels != list(LETTERS[: len(labels)]) else {}
    return _mc(
        "arc_challenge",
        str(_opt(row, "id") or f"arc_challenge-{i}"),
        split,
        _get(row, ("question",), "question", where),
        texts,
        LETTERS[labels.index(key)],
        meta,
    )


def _gpqa_diamond(row: Row, i: int, split: str, where: str) -> Example:
    rid = str(_opt(row, "Record ID", "id") or i)
    correct = _text(_get(row, ("Correct Answer",), "Correct Answer", where))
    wrong = [_text(_get(row, (f"Incorrect Answer {k}",), f"Incorrect Answer {k}", where)) for k in (1, 2, 3)]
    options = HashRng(f"gpqa-options/{rid}").shuffled([correct, *wrong])
    return _mc(
        "gpqa_diamond",
        f"gpqa_diamond-{rid}",
        split,
        _get(row, ("Question",), "Question", where),
        options,
        LETTERS[options.index(correct)],
        {"subdomain": _opt(row, "Subdomain"), "domain": _opt(row, "High-level domain")},
    )


def _qa_answers(row: Row, where: str, keys: tuple[str, ...] = ("answer", "Answer")) -> list[str]:
    golden = _opt(row, "golden_answers")
    if golden is not None:
        return _unique([_text(a) for a in golden])
    return [_text(_get(row, keys, "answer", where))]


def _hotpotqa(row: Row, i: int, split: str, where: str) -> Example:
    return Example(
        id=str(_get(row, ("_id", "id"), "_id", where)),
        task="qa",
        source="hotpotqa",
        split=split,
        prompt=_get(row, ("question",), "question", where),
        answers=_qa_answers(row, where),
        metadata={
            "type": _opt(row, "type"),
            "level": _opt(row, "level"),
            "supporting_facts": _facts(_opt(row, "supporting_facts")),
            "context": _paragraphs(_opt(row, "context")),
        },
    )


def _twowiki(row: Row, i: int, split: str, where: str) -> Example:
    return Example(
        id=str(_get(row, ("_id", "id"), "_id", where)),
        task="qa",
        source="2wikimultihopqa",
        split=split,
        prompt=_get(row, ("question",), "question", where),
        answers=_qa_answers(row, where),
        metadata={
            "type": _opt(row, "type"),
            "supporting_facts": _facts(_opt(row, "supporting_facts")),
            "evidences": _opt(row, "evidences") or [],
            "context": _paragraphs(_opt(row, "context")),
        },
    )


def _musique(row: Row, i: int, split: str, where: str) -> Example:
    answers = _qa_answers(row, where) + [_text(a) for a in _opt(row, "answer_aliases") or []]
    decomposition = _opt(row, "question_decomposition") or []
    return Example(
        id=str(_get(row, ("id",), "id", where)),
        task="qa",
        source="musique",
        split=split,
        prompt=_get(row, ("question",), "question", where),
        answers=_unique(answers),
        metadata={
            "answerable": _opt(row, "answerable"),
            "hops": len(decomposition),
            "question_decomposition": decomposition,
            "paragraphs": _opt(row, "paragraphs") or [],
        },
    )


def _bamboogle(row: Row, i: int, split: str, where: str) -> Example:
    return Example(
        id=str(_opt(row, "id") or f"bamboogle-{i:04d}"),
        task="qa",
        source="bamboogle",
        split=split,
        prompt=_get(row, ("Question", "question"), "Question", where),
        answers=_qa_answers(row, where),
        metadata={},
    )


@dataclass(frozen=True)
class DatasetSpec:
    """How to turn one published dataset's rows into examples."""

    name: str
    task: str  # "math" | "qa" | "fc"
    default_split: str  # the split label its usual file is used as (method §9: train or eval)
    convert: Callable[[Row, int, str, str], Example]  # (row, index, split, "file:row") -> Example
    multiple_choice: bool = False


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec("deepscaler", "math", "train", _deepscaler),
        DatasetSpec("aime24", "math", "test", _aime24),
        DatasetSpec("amc23", "math", "test", _amc23),
        DatasetSpec("math500", "math", "test", _math500),
        DatasetSpec("minervamath", "math", "test", _minervamath),
        DatasetSpec("olympiadbench", "math", "test", _olympiadbench),
        DatasetSpec("mmlu_pro", "math", "test", _mmlu_pro, multiple_choice=True),
        DatasetSpec("arc_challenge", "math", "test", _arc_challenge, multiple_choice=True),
        DatasetSpec("gpqa_diamond", "math", "test", _gpqa_diamond, multiple_choice=True),
        DatasetSpec("hotpotqa", "qa", "train", _hotpotqa),
        DatasetSpec("2wikimultihopqa", "qa", "test", _twowiki),
        DatasetSpec("musique", "qa", "test", _musique),
        DatasetSpec("bamboogle", "qa", "test", _bamboogle),
    )
}
BFCL = "bfcl"


def load_dataset(
    name: str, path: str | Path, split: str | None = None, validate: bool = True,
    read: ReadConfig | None = None,
) -> list[Example]:
    """Load a published dataset file as validated examples.

    ``split`` labels the examples (default: the dataset's usual role, e.g. DeepScaleR "train",
    the benchmarks "test"; BFCL: the per-scenario 80/20 split). With ``validate`` the rows go
    through the dataset kind's Great Expectations suite and a
    :class:`~trace_core.data.validation.DataValidationError` names the bad rows. ``read`` sets
    how the file is read (the maximum row size); undecodable or oversized rows fail even
    without ``validate``.
    """
    if name == BFCL:
        examples, kind = load_bfcl_file(path, split, read), "fc"
    else:
        spec = DATASETS.get(name)
        if spec is None:
            raise ValueError(f"unknown dataset {name!r}; known: {sorted(DATASETS) + [BFCL]}")
        rows = read_records(path, read)
        label = split or spec.default_split
        examples = [spec.convert(row, i, label, f"{path}: row {i + 1}") for i, row in enumerate(rows)]
        kind = "mc" if spec.multiple_choice else spec.task
    if validate:
        from trace_core.data.validation import validate_examples  # lazy: GX takes seconds to import

        validate_examples(examples, origin=str(path), kind=kind)
    return examples
