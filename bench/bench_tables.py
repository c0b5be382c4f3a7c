"""The benchmarks' one table printer: rows of dicts as aligned columns (``format_table``) or as a
markdown table (``format_markdown``).

A value is written by ``fmt``: one formatter for every column, or a mapping from column to
formatter (columns it leaves out use ``cell``). Formatters: ``cell`` (numbers to 3 places),
``significant`` (3 significant figures) and ``fixed(digits)`` (a fixed number of places);
``places`` makes the mapping from each column's number of places.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Formatter = Callable[[Any], str]


def cell(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "–" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "–" if not math.isfinite(value) else (f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}")
    return str(value)


def significant(value: Any) -> str:
    """3 significant figures (for figures spanning magnitudes: timings, gaps, ratios)."""
    if isinstance(value, float) and math.isfinite(value) and not isinstance(value, bool):
        return f"{value:.3g}" if (value == 0 or 1e-3 <= abs(value) < 1e4) else f"{value:.2e}"
    return cell(value)


def fixed(digits: int) -> Formatter:
    """Numbers to ``digits`` places whatever their size (a column of like figures); the rest as ``cell``."""
    def write(value: Any) -> str:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return f"{value:.{digits}f}"
        return cell(value)

    return write


def places(digits: Mapping[str, int]) -> dict[str, Formatter]:
    """Per column, ``fixed`` to its number of decimal places (a ``fmt`` mapping)."""
    return {column: fixed(d) for column, d in digits.items()}


def _columns(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None) -> list[str]:
    return list(dict.fromkeys(c for r in rows for c in r)) if columns is None else list(columns)


def _formatters(columns: Sequence[str], fmt: Formatter | Mapping[str, Formatter]) -> list[Formatter]:
    return [fmt.get(c, cell) for c in columns] if isinstance(fmt, Mapping) else [fmt] * len(columns)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
                 fmt: Formatter | Mapping[str, Formatter] = cell) -> str:
    """``rows`` as a fixed-width table of ``columns`` (default: every key, in first-seen order;
    missing cells print as –), the first column left-aligned and the rest right-aligned."""
    columns = _columns(rows, columns)
    writers = _formatters(columns, fmt)
    cells = [[w(r.get(c)) for c, w in zip(columns, writers, strict=True)] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    def line(values: Sequence[str]) -> str:
        pairs = enumerate(zip(values, widths, strict=True))
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in pairs)

    return "\n".join([line(list(columns)), "  ".join("-" * w for w in widths), *(line(row) for row in cells)])


def format_markdown(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
                    fmt: Formatter | Mapping[str, Formatter] = cell) -> str:
    """``rows`` as a markdown table of ``columns``: a column of text only is left-aligned, the rest
    right-aligned. A key a row lacks is an empty cell (the figure does not apply there), None is –."""
    columns = _columns(rows, columns)
    writers = _formatters(columns, fmt)
    def textual(column: str) -> bool:
        values = [r[column] for r in rows if r.get(column) is not None]
        return bool(values) and all(isinstance(v, str) for v in values)

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(values) + " |"

    body = [line([w(r[c]) if c in r else "" for c, w in zip(columns, writers, strict=True)]) for r in rows]
    return "\n".join([line(list(columns)), "|" + "|".join("---" if textual(c) else "---:" for c in columns) + "|",
                      *body])


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
                fmt: Formatter | Mapping[str, Formatter] = cell, title: str | None = None) -> None:
    if title:
        print(f"\n{title}")
    print(format_table(rows, columns, fmt))
