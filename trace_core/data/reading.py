"""Reading data files before any suite runs: strict UTF-8, a maximum row size, JSON per line.

Every problem found here is a :class:`DataValidationError` that names the file and each bad
line (the line of a JSONL file, the row of a CSV, Parquet or JSON-array file) with the rule it
broke — a line that is not UTF-8, not JSON, too large, or whose escapes make a lone surrogate
(``\\ud800``: valid JSON, but text that no later stage can encode) — the same report the Great
Expectations suites give (``validation.py``). A file is read whole and every bad line is
reported, not only the first, so one run shows what to fix.
Stdlib only: the loaders, the BFCL reader and the suites all read through here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_ROWS_SHOWN = 20  # per rule in the error message
READ_STAGE = "read"  # the `kind` of an error found while reading, before any suite


@dataclass(frozen=True)
class ReadConfig:
    """How data files are read.

    max_row_bytes: the largest row accepted, in bytes of UTF-8: a JSONL line as it is on disk; a
        CSV, Parquet or JSON-array row as compact JSON. Default 1 MiB (1048576). The largest row
        of the embedded data (a BFCL scenario with its file system) is under 10 kB and the largest
        BFCL v4 source line is ~24 kB, so a row near the limit is a broken export, not data: it
        would be held by every rollout worker and rendered into prompts. Rows above it are named
        (file, line, id) and the file is rejected.
    """

    max_row_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        size = self.max_row_bytes
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"ReadConfig.max_row_bytes must be a whole number of bytes >= 1, got {size!r}")


@dataclass(frozen=True)
class BadRow:
    line: int  # 1-based line (JSONL) or row number of the example in its file
    id: str | None  # None when the id itself is missing (or the row could not be parsed)
    rule: str  # the rule it broke, in words
    detail: str | None = None  # what exactly, e.g. "byte 0xff at column 12"


class DataValidationError(ValueError):
    """A dataset broke its suite (or could not be read); ``bad_rows`` lists every (line, id, rule)."""

    def __init__(self, origin: str, kind: str, bad_rows: list[BadRow], table_rules: list[str]):
        self.origin, self.kind, self.bad_rows, self.table_rules = origin, kind, bad_rows, table_rules
        super().__init__(self._message())

    @property
    def bad_ids(self) -> list[str | None]:
        return list(dict.fromkeys(row.id for row in self.bad_rows))

    def _message(self) -> str:
        stage = "while reading" if self.kind == READ_STAGE else f"suite {self.kind!r}"
        lines = [
            f"invalid data in {self.origin} ({stage}): "
            f"{len({r.line for r in self.bad_rows})} bad row(s), {len(self.table_rules)} table rule(s) broken"
        ]
        lines += [f"  - {rule}" for rule in self.table_rules]
        by_rule: dict[str, list[BadRow]] = {}
        for row in self.bad_rows:
            by_rule.setdefault(row.rule, []).append(row)
        for rule, rows in by_rule.items():
            shown = ", ".join(_where(r) for r in rows[:MAX_ROWS_SHOWN])
            more = f", ... and {len(rows) - MAX_ROWS_SHOWN} more" if len(rows) > MAX_ROWS_SHOWN else ""
            lines.append(f"  - {rule}: {shown}{more}")
        return "\n".join(lines)


def _where(row: BadRow) -> str:
    text = f"line {row.line} (id {row.id!r})"
    return f"{text} [{row.detail}]" if row.detail else text


def _size_rule(config: ReadConfig) -> str:
    return f"a row is at most {config.max_row_bytes} bytes"


def _row_id(record: Any) -> str | None:
    row_id = record.get("id") if isinstance(record, dict) else None
    return row_id if isinstance(row_id, str) and row_id else None


def _decode(raw: bytes, lineno: int, bad: list[BadRow]) -> str | None:
    """One line as text, or None after recording why it is not UTF-8 (where, and which byte)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        bad.append(
            BadRow(lineno, None, "the line is valid UTF-8", f"byte 0x{raw[err.start]:02x} at column {err.start + 1}")
        )
        return None


SURROGATE_RULE = "the line's text is valid Unicode (no lone surrogate escape such as \\ud800)"


def _lone_surrogate(value: Any, where: str = "") -> str | None:
    """Where in a parsed JSON value a string holds a lone surrogate (a ``\\ud800``-style escape
    without its pair: valid JSON, but no UTF-8 text can hold it), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return f"{err.object[err.start]!r} at character {err.start + 1} of {where or 'the value'}"
        return None
    if isinstance(value, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
        items = [*((f"key {k!r}", k) for k in value), *items]
    elif isinstance(value, list):
        items = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
    else:
        return None
    for name, item in items:
        found = _lone_surrogate(item, name)
        if found is not None:
            return found
    return None


def read_text(path: str | Path) -> str:
    """A whole text file, decoded as UTF-8; every undecodable line is named in the error."""
    path = Path(path)
    raw_lines = path.read_bytes().split(b"\n")
    bad: list[BadRow] = []
    texts = [_decode(raw, n, bad) for n, raw in enumerate(raw_lines, 1)]
    if bad:
        raise DataValidationError(str(path), READ_STAGE, bad, [])
    return "\n".join(t for t in texts if t is not None)


def read_json_lines(path: str | Path, config: ReadConfig = ReadConfig()) -> tuple[list[Any], list[int]]:
    """The records of a JSON-lines file and their 1-based line numbers (blank lines skipped).

    Every line that is not UTF-8, not JSON or longer than ``config.max_row_bytes`` is named in
    one :class:`DataValidationError`.
    """
    path = Path(path)
    records: list[Any] = []
    numbers: list[int] = []
    bad: list[BadRow] = []
    for lineno, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        text = _decode(raw, lineno, bad)
        if text is None or not text.strip():
            continue
        try:
            record = json.loads(text)
        except (ValueError, RecursionError) as err:  # RecursionError: arrays nested thousands deep
            detail = f"{err.msg} at column {err.colno}" if isinstance(err, json.JSONDecodeError) else str(err)
            bad.append(BadRow(lineno, None, "the line is valid JSON", detail))
            continue
        if len(raw) > config.max_row_bytes:
            bad.append(BadRow(lineno, _row_id(record), _size_rule(config), f"{len(raw)} bytes"))
            continue
        surrogate = _lone_surrogate(record) if b"\\u" in raw else None  # only a \u escape can make one
        if surrogate is not None:
            bad.append(BadRow(lineno, _row_id(record), SURROGATE_RULE, surrogate))
            continue
        records.append(record)
        numbers.append(lineno)
    if bad:
        raise DataValidationError(str(path), READ_STAGE, bad, [])
    return records, numbers


def check_row_sizes(rows: Sequence[Any], origin: str, config: ReadConfig = ReadConfig()) -> None:
    """Rows of a format without one row per line (CSV, Parquet, a JSON array), each measured as
    compact JSON; raises a :class:`DataValidationError` naming every row over the limit."""
    bad = []
    for number, row in enumerate(rows, 1):
        size = len(json.dumps(row, ensure_ascii=False, separators=(",", ":"), default=str).encode("utf-8"))
        if size > config.max_row_bytes:
            bad.append(BadRow(number, _row_id(row), _size_rule(config), f"row {number}: {size} bytes as JSON"))
    if bad:
        raise DataValidationError(origin, READ_STAGE, bad, [])
