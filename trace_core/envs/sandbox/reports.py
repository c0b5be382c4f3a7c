"""The runner's report channel, parsed defensively, and the accounting built on it.

Accounting the code cannot inflate. The runner reports each cell on a pipe (fd 3) that the cell's
own code can write to as well, so nothing on it is believed. The host accounts from what it
measures itself: a cell's wall time is the host clock between reading the report that ends the
cell before it and the report that ends it; its CPU time is at most the call's CPU as the init
measured it (wait4 of the runner), and the runner's own figure can only lower it; each is also cut
at the cell's own limit. A replay is granted `replay_time_factor` times the sum of those figures
(plus a fixed slack for the wall clock), so no grant exceeds a fixed factor of host-measured time,
nor `replay_time_factor` x the cells' limits, whatever the code writes; and the whole snapshot's
grant is capped at `max_replay_seconds`, however many cells it holds (a forged snapshot of 1,000
cells buys no more than one of three); both are `PythonToolSession`'s.
No clock of the call starts before the runner's first line, written before any cell runs (so
before any code could write the channel): sandbox start-up, which takes ~0.1 s on an idle host and
seconds on a loaded one, is bounded by `startup_seconds` of its own and never counts against a
cell or a replay. The visible cell's wall clock starts when the replay's last report is read, so a
replay that finishes early lends it nothing, and a report forged early only shortens it (the
deadlines are kept by `PythonSandbox._collect`). Reports are parsed defensively: a line that is not
a well-formed report of the next cell, with finite times no larger than the host measured for the
whole call, voids the call (a stopped cell and a tool error for the agent, never an exception in
the host and never extra time).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

_RUNNER_CHANNEL_CAP = 1 << 20  # bytes of bookkeeping records read from the runner before ignoring it
_MAX_REPORT_BYTES = 16 << 10  # a genuine report is < 4 kB (its error text is cut at 500 characters)
_MAX_ERROR_CHARS = 500
_READY_LINE = b'{"from": "runner", "kind": "ready"}'  # the runner's first line, before any cell
_REPORT_TOLERANCE_S = 0.05  # clock granularity between the runner's figures and the host's
_REPORT_KEYS = ("kind", "index", "error", "memory_error", "wall_seconds", "cpu_seconds")


class _ReportChannel:
    """The runner's report lines, each stamped with the host clock at the moment the host read it.

    The first line is the runner's `_READY_LINE`, written before any cell runs: it ends start-up,
    and is trusted because no code of the call has run yet. `lines` holds the lines after it.
    Bytes past `_RUNNER_CHANNEL_CAP` are drained but not kept (the code could write forever).
    """

    def __init__(self, start: float) -> None:
        self.start = start
        self.ready: float | None = None  # seconds since the call started that the ready line was read
        self.lines: list[tuple[float, bytes]] = []  # (seconds since the call started, line)
        self.size = 0
        self._first: bytes | None = None  # the first line, whatever it was
        self._partial = bytearray()

    def feed(self, chunk: bytes, now: float) -> None:
        self.size += len(chunk)
        if self.size > _RUNNER_CHANNEL_CAP:
            return
        self._partial += chunk
        *complete, rest = self._partial.split(b"\n")
        self._partial = bytearray(rest)
        for line in complete:
            if self._first is None:
                self._first = bytes(line)
                if self._first == _READY_LINE:
                    self.ready = now - self.start
                continue
            self.lines.append((now - self.start, bytes(line)))

    def problem(self) -> str | None:
        """What makes the channel as a whole unreadable, if anything."""
        if self.size > _RUNNER_CHANNEL_CAP:
            return f"more than {_RUNNER_CHANNEL_CAP} bytes of reports"
        if self._first is not None and self.ready is None:
            return "its first line is not the runner's start-up line"
        if self._partial:
            return f"an unterminated line after line {len(self.lines)}"
        return None


@dataclass(frozen=True)
class _CellReport:
    """One well-formed report from the runner; `arrived` is the host's own clock."""

    index: int
    error: str | None
    memory_error: bool
    cpu_seconds: float  # the runner's own figure: informational, only ever lowers what is granted
    arrived: float  # seconds after the call started that the host read it


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _finite_seconds(value: object) -> float | None:
    """`value` as seconds if it is a finite number >= 0 (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an integer with hundreds of digits
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _parse_report(
    raw: bytes, arrived: float, expected: int, n_cells: int, host_wall: float, host_cpu: float
) -> _CellReport | str:
    """The report of cell `expected` read at `arrived`, or what is wrong with the line, in words.

    host_wall / host_cpu: what the host measured for the whole call; no cell can have used more.
    """
    if len(raw) > _MAX_REPORT_BYTES:
        return f"a line of {len(raw)} bytes (a report has at most {_MAX_REPORT_BYTES})"
    try:
        rec = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return f"not JSON ({type(exc).__name__})"
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    for key in _REPORT_KEYS:
        if key not in rec:
            return f"no {key!r}"
    if rec["kind"] != "cell":
        return f"kind {_show(rec['kind'])}, not 'cell'"
    index = rec["index"]
    if isinstance(index, bool) or not isinstance(index, int) or index != expected:
        return f"index {_show(index)} where the report of cell {expected} (of 0..{n_cells - 1}) was due"
    for key, measured in (("wall_seconds", host_wall), ("cpu_seconds", host_cpu)):
        seconds = _finite_seconds(rec[key])
        if seconds is None:
            return f"{key} {_show(rec[key])}, not a finite number >= 0"
        if seconds > measured + _REPORT_TOLERANCE_S:
            return f"{key} {seconds:.6g}, more than the host measured for the whole call ({measured:.3f})"
    error = rec["error"]
    if error is not None and not isinstance(error, str):
        return f"error {_show(error)}, not a string or null"
    if not isinstance(rec["memory_error"], bool):
        return f"memory_error {_show(rec['memory_error'])}, not a bool"
    return _CellReport(
        index=index,
        error=None if error is None else error[:_MAX_ERROR_CHARS],
        memory_error=rec["memory_error"],
        cpu_seconds=float(rec["cpu_seconds"]),
        arrived=arrived,
    )


def _read_reports(
    channel: _ReportChannel, n_cells: int, host_wall: float, host_cpu: float
) -> tuple[list[_CellReport], str | None]:
    """The well-formed reports, in order, and the first thing wrong with the channel (None if nothing).

    Reports must be those of cells 0, 1, ... in order, one each: a duplicate, a gap or a line
    after the last cell is as wrong as a malformed one.
    """
    reports: list[_CellReport] = []
    if channel.ready is None:
        return reports, channel.problem()
    for number, (arrived, raw) in enumerate(channel.lines, 1):  # numbered after the ready line
        if len(reports) == n_cells:
            return reports, f"line {number}: a report after the last cell's"
        report = _parse_report(raw, arrived, len(reports), n_cells, host_wall, host_cpu)
        if isinstance(report, str):
            return reports, f"line {number}: {report}"
        reports.append(report)
    return reports, channel.problem()


def _cell_walls(reports: Sequence[_CellReport], ready: float) -> list[float]:
    """Host-clock seconds of each cell: from reading the report before it (or the runner's ready
    line, which ends start-up) to reading its own."""
    walls, previous = [], ready
    for report in reports:
        walls.append(max(0.0, report.arrived - previous))
        previous = report.arrived
    return walls
