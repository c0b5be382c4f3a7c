"""Great Expectations suites per dataset kind, and the validated load that guards every consumer.

Kinds and what their suite demands (besides: at least one row, ids present, whitespace-free and
unique, a JSON-object ``metadata`` without the keys the task adapter adds, no unknown keys):

``math``    task "math", a non-blank prompt of at most 8000 characters, >= 1 non-empty answer, no choices
``mc``      task "math", 2-10 choices, exactly one answer that is a letter naming one of the choices
``qa``      task "qa", a non-blank prompt of at most 2000 characters, >= 1 non-empty answer
``fc``      task "fc", a BFCL multi-turn category, one ground-truth entry and one answer per turn,
            >= 1 involved class, an ``initial_config`` object
``corpus``  passages: id, a title, a non-blank text of at most 8000 characters

Nested fields are checked through derived columns (``n_answers``, ``answer_index``, ``n_turns``,
...) that a lenient builder computes from each row; a missing or ill-typed field yields a value
the suite rejects, so every problem becomes a failed rule on identified rows. A failure raises
:class:`DataValidationError` (a ValueError) naming the file, the rule and each bad row's line
and id. Great Expectations is imported only when a validation runs (it takes seconds).

Before any suite a file is read by :mod:`trace_core.data.reading`: a line that is not UTF-8, not
JSON, or larger than ``ReadConfig.max_row_bytes`` (1 MiB by default) is named the same way.

    python -m trace_core.data.validation data/math/train.jsonl [--kind math] [--max-row-bytes N]

prints the report of each invalid file (without a traceback) and exits with status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trace_core.data.bfcl import CATEGORIES
from trace_core.data.reading import BadRow, DataValidationError, ReadConfig, read_json_lines
from trace_core.data.schema import (
    COLUMNS,
    LETTERS,
    PASSAGE_COLUMNS,
    RESERVED_METADATA_KEYS,
    SPLITS,
    Example,
    Passage,
)

KINDS = ("math", "mc", "qa", "fc", "corpus")
PROMPT_MAX_CHARS = {"math": 8000, "mc": 8000, "qa": 2000, "fc": 8000}
PASSAGE_MAX_CHARS = 8000
_KIND_TASK = {"math": "math", "mc": "math", "qa": "qa", "fc": "fc"}


# ----------------------------------------------------------------------------------- derived frame
def _str_or_empty(value: Any) -> str:
    """Missing or non-string values become "" so that one regex/set rule flags them."""
    return value if isinstance(value, str) else ""


def _str_list(value: Any) -> list[str] | None:
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def _example_row(record: Any, line: int) -> dict[str, Any]:
    """The columns the suites check, computed leniently from one raw record."""
    rec = record if isinstance(record, dict) else {}
    answers, choices = _str_list(rec.get("answers")), _str_list(rec.get("choices"))
    meta = rec.get("metadata")
    meta_ok = isinstance(meta, dict)
    meta = meta if meta_ok else {}
    letter = answers[0] if answers else None
    answer_index = LETTERS.index(letter) if letter in LETTERS else -1
    turns, truth, classes = meta.get("turns"), meta.get("ground_truth"), meta.get("involved_classes")
    return {
        "line": line,
        "id": _str_or_empty(rec.get("id")),
        "task": _str_or_empty(rec.get("task")),
        "source": _str_or_empty(rec.get("source")),
        "split": _str_or_empty(rec.get("split")),
        "prompt": _str_or_empty(rec.get("prompt")),
        "n_answers": len(answers) if answers is not None else 0,
        "min_answer_len": min((len(a.strip()) for a in answers), default=0) if answers is not None else 0,
        "n_choices": len(choices) if choices is not None else -1,
        "answer_letter": letter if isinstance(letter, str) else "",
        "answer_index": answer_index,
        "metadata_ok": meta_ok,
        "n_reserved_keys": sum(k in meta for k in RESERVED_METADATA_KEYS),
        "n_unknown_keys": len(set(rec) - set(COLUMNS)) if isinstance(record, dict) else -1,
        "category": _str_or_empty(meta.get("category")),
        "n_turns": len(turns) if isinstance(turns, list) else -1,
        "n_truth_turns": len(truth) if isinstance(truth, list) else -2,
        "n_classes": len(classes) if isinstance(classes, list) else 0,
        "has_initial_config": isinstance(meta.get("initial_config"), dict),
    }


def _passage_row(record: Any, line: int) -> dict[str, Any]:
    rec = record if isinstance(record, dict) else {}
    return {
        "line": line,
        "id": _str_or_empty(rec.get("id")),
        "title": rec.get("title") if isinstance(rec.get("title"), str) else None,
        "text": _str_or_empty(rec.get("text")),
        "n_unknown_keys": len(set(rec) - set(PASSAGE_COLUMNS)) if isinstance(record, dict) else -1,
    }


# ----------------------------------------------------------------------------------- suites
def _rules(kind: str, gxe: Any) -> list[tuple[str, Any]]:
    """(plain-language rule, GX expectation) pairs of one kind's suite.

    String columns arrive with a missing value as ``""`` (see the row builders), so one
    expectation covers "present and well-formed"; each expectation costs GX ~0.05-0.1 s.
    """
    rules: list[tuple[str, Any]] = [
        ("at least one row", gxe.ExpectTableRowCountToBeBetween(min_value=1)),
        (
            "id is present, without whitespace",
            gxe.ExpectColumnValuesToMatchRegex(column="id", regex=r"^\S+$"),
        ),
        ("id is unique", gxe.ExpectColumnValuesToBeUnique(column="id")),
        ("no unknown keys", gxe.ExpectColumnValuesToBeInSet(column="n_unknown_keys", value_set=[0])),
    ]
    if kind == "corpus":
        return rules + [
            ("title is present", gxe.ExpectColumnValuesToNotBeNull(column="title")),
            ("text is present and not blank", gxe.ExpectColumnValuesToMatchRegex(column="text", regex=r"\S")),
            (
                f"text is at most {PASSAGE_MAX_CHARS} characters",
                gxe.ExpectColumnValueLengthsToBeBetween(column="text", max_value=PASSAGE_MAX_CHARS),
            ),
        ]
    max_chars = PROMPT_MAX_CHARS[kind]
    rules += [
        (
            f"task is {_KIND_TASK[kind]!r}",
            gxe.ExpectColumnValuesToBeInSet(column="task", value_set=[_KIND_TASK[kind]]),
        ),
        (
            f"split is one of {list(SPLITS)}",
            gxe.ExpectColumnValuesToBeInSet(column="split", value_set=list(SPLITS)),
        ),
        ("source is present", gxe.ExpectColumnValuesToMatchRegex(column="source", regex=r"^\S+$")),
        ("prompt is present and not blank", gxe.ExpectColumnValuesToMatchRegex(column="prompt", regex=r"\S")),
        (
            f"prompt is at most {max_chars} characters",
            gxe.ExpectColumnValueLengthsToBeBetween(column="prompt", max_value=max_chars),
        ),
        (
            "answers is a non-empty list of strings",
            gxe.ExpectColumnValuesToBeBetween(column="n_answers", min_value=1),
        ),
        ("no answer is blank", gxe.ExpectColumnValuesToBeBetween(column="min_answer_len", min_value=1)),
        (
            "metadata is a JSON object",
            gxe.ExpectColumnValuesToBeInSet(column="metadata_ok", value_set=[True]),
        ),
        (
            f"metadata holds none of the keys the task adapter adds ({', '.join(RESERVED_METADATA_KEYS)})",
            gxe.ExpectColumnValuesToBeInSet(column="n_reserved_keys", value_set=[0]),
        ),
    ]
    if kind == "mc":
        rules += [
            (
                "2 to 10 choices",
                gxe.ExpectColumnValuesToBeBetween(column="n_choices", min_value=2, max_value=len(LETTERS)),
            ),
            (
                "exactly one answer",
                gxe.ExpectColumnValuesToBeBetween(column="n_answers", min_value=1, max_value=1),
            ),
            (
                f"answer is a letter {LETTERS[0]}-{LETTERS[-1]}",
                gxe.ExpectColumnValuesToBeInSet(column="answer_letter", value_set=list(LETTERS)),
            ),
            (
                "answer letter names one of the choices",
                gxe.ExpectColumnPairValuesAToBeGreaterThanB(column_A="n_choices", column_B="answer_index"),
            ),
        ]
    else:
        rules.append(
            ("choices is an empty list", gxe.ExpectColumnValuesToBeInSet(column="n_choices", value_set=[0]))
        )
    if kind == "fc":
        rules += [
            (
                f"metadata.category is one of {list(CATEGORIES)}",
                gxe.ExpectColumnValuesToBeInSet(column="category", value_set=list(CATEGORIES)),
            ),
            (
                "metadata.turns is a non-empty list",
                gxe.ExpectColumnValuesToBeBetween(column="n_turns", min_value=1),
            ),
            (
                "one ground-truth entry per turn",
                gxe.ExpectColumnPairValuesToBeEqual(column_A="n_turns", column_B="n_truth_turns"),
            ),
            (
                "one answer per turn",
                gxe.ExpectColumnPairValuesToBeEqual(column_A="n_turns", column_B="n_answers"),
            ),
            (
                "at least one involved class",
                gxe.ExpectColumnValuesToBeBetween(column="n_classes", min_value=1),
            ),
            (
                "metadata.initial_config is an object",
                gxe.ExpectColumnValuesToBeInSet(column="has_initial_config", value_set=[True]),
            ),
        ]
    return rules


def _run_suite(frame: Any, kind: str, origin: str) -> None:
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    import great_expectations as gx  # heavy: ~2 s
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)  # no tqdm bars on stderr
    batch = (
        ctx.data_sources.add_pandas("pandas")
        .add_dataframe_asset(name="rows")
        .add_batch_definition_whole_dataframe("whole")
    )
    suite = ctx.suites.add(gx.ExpectationSuite(name=f"trace-{kind}"))
    rules = _rules(kind, gxe)
    for i, (rule, expectation) in enumerate(rules):
        expectation.meta = {"rule": rule, "index": i}
        suite.add_expectation(expectation)
    definition = ctx.validation_definitions.add(
        gx.ValidationDefinition(name=f"trace-{kind}", data=batch, suite=suite)
    )
    result = definition.run(
        batch_parameters={"dataframe": frame},
        result_format={"result_format": "COMPLETE", "unexpected_index_column_names": ["line", "id"]},
    )
    if result.success:
        return
    bad: list[BadRow] = []
    table: list[str] = []
    for item in result.results:
        if item.success:
            continue
        rule = item.expectation_config.meta["rule"]
        raised = (
            (item.exception_info or {}).get("raised_exception")
            if isinstance(item.exception_info, dict)
            else None
        )
        indices = (item.result or {}).get("unexpected_index_list")
        if raised or indices is None:
            table.append(
                rule
                if not raised
                else f"{rule} (could not be checked: {item.exception_info.get('exception_message')})"
            )
            continue
        for entry in indices:
            row_id = entry.get("id")
            bad.append(
                BadRow(int(entry["line"]), row_id if isinstance(row_id, str) and row_id else None, rule)
            )
    bad.sort(key=lambda r: (r.line, r.rule))
    raise DataValidationError(origin, kind, bad, table)


def infer_kind(records: Sequence[Any]) -> str:
    """The suite for a file: ``corpus`` for passages, else by the most common task (``mc`` when
    a math file has choices)."""
    dicts = [r for r in records if isinstance(r, dict)]
    if dicts and all("text" in r and "prompt" not in r for r in dicts):
        return "corpus"
    tasks = [r.get("task") for r in dicts if r.get("task") in _KIND_TASK.values()]
    if not tasks:
        return "math"  # nothing recognisable: the suite will name the rows without a task
    task = max(sorted(set(tasks)), key=tasks.count)
    if task == "math" and any(isinstance(r.get("choices"), list) and r.get("choices") for r in dicts):
        return "mc"
    return task


def validate_records(
    records: Sequence[Any], origin: str, kind: str | None = None, lines: Sequence[int] | None = None
) -> str:
    """Run the suite of ``kind`` (inferred when None) on raw records; returns the kind used.

    ``lines`` gives each record's line in ``origin`` (default: 1, 2, ...).
    """
    import pandas as pd

    kind = kind or infer_kind(records)
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {KINDS}")
    lines = list(lines) if lines is not None else list(range(1, len(records) + 1))
    build = _passage_row if kind == "corpus" else _example_row
    frame = pd.DataFrame([build(r, n) for r, n in zip(records, lines, strict=True)])
    if frame.empty:
        raise DataValidationError(origin, kind, [], ["at least one row"])
    _run_suite(frame, kind, origin)
    return kind


def validate_examples(examples: Sequence[Example], origin: str, kind: str | None = None) -> None:
    """Validate in-memory examples (e.g. a loader's output); rows are numbered from 1."""
    validate_records([ex.to_record() for ex in examples], origin, kind)


def read_jsonl(path: str | Path, read: ReadConfig | None = None) -> tuple[list[Any], list[int]]:
    """The records of a JSONL file with their line numbers; a line that is not UTF-8, not JSON or
    over ``read.max_row_bytes`` raises a :class:`DataValidationError` naming it (and every other)."""
    return read_json_lines(path, read or ReadConfig())


def load_validated(
    path: str | Path, kind: str | None = None, read: ReadConfig | None = None
) -> list[Example] | list[Passage]:
    """Read a normalized JSONL file (examples or corpus passages), validate it, and only then
    return its rows as dataclasses. Raises :class:`DataValidationError` on any bad row."""
    records, lines = read_jsonl(path, read)
    kind = validate_records(records, str(path), kind, lines)
    if kind == "corpus":
        return [Passage.from_record(r) for r in records]
    return [Example.from_record(r) for r in records]


# ----------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    """``python -m trace_core.data.validation FILE...``: each file through its suite.

    Prints one line per valid file; for an invalid one, the report (file, rules, rows by line and
    id) on stderr, without a traceback. Exit status 0 when every file is valid, 2 otherwise.
    """
    parser = argparse.ArgumentParser(
        prog="python -m trace_core.data.validation",
        description="Validate normalized JSONL data files (examples or corpus passages).",
        epilog="Example:\n  python -m trace_core.data.validation data/qa/train.jsonl data/qa/corpus.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="+", type=Path, help="JSONL files to validate")
    parser.add_argument("--kind", choices=KINDS, help="the suite to apply (default: inferred per file)")
    parser.add_argument(
        "--max-row-bytes", type=int, default=ReadConfig.max_row_bytes,
        help=f"largest row accepted, in bytes (default: {ReadConfig.max_row_bytes})",
    )
    args = parser.parse_args(argv)
    try:
        read = ReadConfig(max_row_bytes=args.max_row_bytes)
    except ValueError as err:
        parser.error(str(err))  # exits with status 2
    failed = 0
    for path in args.files:
        try:
            rows = load_validated(path, args.kind, read)
        except DataValidationError as err:
            print(err, file=sys.stderr)
            failed += 1
            continue
        except OSError as err:  # a missing or unreadable file is a bad input too, named as such
            print(f"cannot read {path}: {err.strerror or err}", file=sys.stderr)
            failed += 1
            continue
        what = "passages" if rows and isinstance(rows[0], Passage) else "examples"
        print(f"valid: {path} ({len(rows)} {what})")
    return 2 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
