"""The benchmarks' one table printer: rows of dicts as aligned columns (numbers to 3 places, or
to 3 significant figures with ``significant``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any


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


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
                 fmt: Callable[[Any], str] = cell) -> str:
    """``rows`` as a fixed-width table of ``columns`` (default: every key, in first-seen order;
    missing cells print as –), each value written by ``fmt``."""
    columns = list(dict.fromkeys(c for r in rows for c in r)) if columns is None else list(columns)
    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    def line(values: Sequence[str]) -> str:
        pairs = enumerate(zip(values, widths, strict=True))
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in pairs)

    return "\n".join([line(list(columns)), "  ".join("-" * w for w in widths), *(line(row) for row in cells)])


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
                fmt: Callable[[Any], str] = cell, title: str | None = None) -> None:
    if title:
        print(f"\n{title}")
    print(format_table(rows, columns, fmt))
