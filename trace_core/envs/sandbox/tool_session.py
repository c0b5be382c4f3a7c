"""The `python` tool of one episode, whose variables persist across turns, and its state as data.

Tool state across turns. `PythonToolSession` keeps variables between the cells of one episode by
deterministic replay: the state after a prefix of turns *is* the list of cells that completed in
it, and every call runs those cells again (output discarded) before the new one, in a fresh sandbox.
Why replay rather than a long-lived interpreter with snapshots:
- a snapshot is a tuple of strings: JSON-serialisable, storable in a rollout-tree node, restorable
  in any worker process or machine, and free to branch K ways from one anchor (TRACE's prefix
  expansion restores the same prefix many times);
- every call gets a fresh sandbox, so no process outlives a call and a crash or kill costs only
  that cell; pickling an interpreter's state (dill) fails on modules, generators, open files;
- the price is re-running the prefix: O(turns) per call, small for math cells (milliseconds each).
Replay is exact when cells are deterministic. `random` is seeded and PYTHONHASHSEED fixed; code that
reads the clock, os.urandom or an unseeded numpy Generator gets fresh values on replay. Cells that
were stopped (wall clock, CPU, output cap, crash) are not part of the state, as if a notebook kernel
had been restarted with the cells that did finish.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trace_core.envs.sandbox.config import SandboxResult
from trace_core.envs.sandbox.python_sandbox import PythonSandbox
from trace_core.envs.sandbox.reports import _finite_seconds


@dataclass(frozen=True)
class ToolSnapshot:
    """The state of a `python` tool after some turns: the cells that completed, in order.

    cell_wall_seconds / cell_cpu_seconds: what the host measured each cell to cost when it ran as
    the visible cell (see "Accounting" in `trace_core.envs.sandbox.reports`), which bounds the
    time granted to replay them.
    Plain data: store it with `to_json()` in a rollout-tree node and restore anywhere.
    """

    cells: tuple[str, ...] = ()
    cell_wall_seconds: tuple[float, ...] = ()
    cell_cpu_seconds: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not (len(self.cells) == len(self.cell_wall_seconds) == len(self.cell_cpu_seconds)):
            raise ValueError(
                "ToolSnapshot: cells, cell_wall_seconds and cell_cpu_seconds must have equal lengths"
            )
        if not all(isinstance(cell, str) for cell in self.cells):
            raise ValueError("ToolSnapshot.cells must be strings")
        for name in ("cell_wall_seconds", "cell_cpu_seconds"):
            for i, value in enumerate(getattr(self, name)):
                if _finite_seconds(value) is None:
                    raise ValueError(f"ToolSnapshot.{name}[{i}] must be a finite number >= 0, got {value!r}")

    def to_json(self) -> dict:
        return {
            "cells": list(self.cells),
            "cell_wall_seconds": list(self.cell_wall_seconds),
            "cell_cpu_seconds": list(self.cell_cpu_seconds),
        }

    @classmethod
    def from_json(cls, data: dict) -> ToolSnapshot:
        try:
            return cls(tuple(data["cells"]), tuple(data["cell_wall_seconds"]), tuple(data["cell_cpu_seconds"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"ToolSnapshot.from_json: not a snapshot ({type(exc).__name__}: {exc})") from exc


class PythonToolSession:
    """The `python` tool of one episode: variables persist across `run` calls, by replay.

    replay_time_factor: replayed cells get this multiple of their measured time (plus
    `replay_slack_seconds` of wall clock) on top of the new cell's limits, so a loaded machine does
    not turn a finished prefix into a timeout. Each cell's figure is cut at its own limit first.
    max_replay_seconds: the most wall-clock seconds, and the most CPU seconds, a whole snapshot's
    replay is granted (slack included), whatever its number of cells: a snapshot from anywhere
    buys at most this on top of one cell's limits. A genuine episode's prefix of math cells
    replays in well under a second; one whose replay needs more is stopped as a failed replay.
    """

    def __init__(
        self,
        sandbox: PythonSandbox | None = None,
        replay_time_factor: float = 2.0,
        replay_slack_seconds: float = 0.5,
        max_replay_seconds: float = 30.0,
    ) -> None:
        if not (math.isfinite(replay_time_factor) and replay_time_factor >= 1.0):
            raise ValueError(f"replay_time_factor must be a finite number >= 1, got {replay_time_factor}")
        if _finite_seconds(replay_slack_seconds) is None:
            raise ValueError(f"replay_slack_seconds must be a finite number >= 0, got {replay_slack_seconds}")
        if _finite_seconds(max_replay_seconds) is None or max_replay_seconds < replay_slack_seconds:
            raise ValueError(
                f"max_replay_seconds must be a finite number >= replay_slack_seconds, got {max_replay_seconds}"
            )
        self.sandbox = sandbox or PythonSandbox()
        self.replay_time_factor = replay_time_factor
        self.replay_slack_seconds = replay_slack_seconds
        self.max_replay_seconds = max_replay_seconds
        self._state = ToolSnapshot()
        self.last_result: SandboxResult | None = None

    def replay_grant(self, snapshot: ToolSnapshot) -> tuple[float, float]:
        """(wall, CPU) seconds granted to replay `snapshot`'s cells on top of the new cell's limits."""
        if not snapshot.cells:
            return 0.0, 0.0
        c = self.sandbox.config
        wall = sum(min(w, c.wall_seconds) for w in snapshot.cell_wall_seconds)
        cpu = sum(min(x, float(c.cpu_seconds)) for x in snapshot.cell_cpu_seconds)
        cap = self.max_replay_seconds
        return (min(self.replay_time_factor * wall + self.replay_slack_seconds, cap),
                min(self.replay_time_factor * cpu, cap))

    def execute(self, cell: str) -> SandboxResult:
        """Runs `cell` on top of the current state; keeps it in the state if it ran to its end."""
        s = self._state
        replay_wall, replay_cpu = self.replay_grant(s)
        result = self.sandbox.run(
            cell, history=s.cells, replay_seconds=replay_wall, replay_cpu_seconds=replay_cpu
        )
        if result.completed and len(result.cell_wall_seconds) == len(s.cells) + 1:
            c = self.sandbox.config
            self._state = ToolSnapshot(
                s.cells + (cell,),
                s.cell_wall_seconds + (min(result.cell_wall_seconds[-1], c.wall_seconds),),
                s.cell_cpu_seconds + (min(result.cell_cpu_seconds[-1], float(c.cpu_seconds)),),
            )
        self.last_result = result
        return result

    def run(self, cell: str) -> str:
        """Runs `cell` and returns the observation the agent reads."""
        result = self.execute(cell)
        text = result.observation
        if not result.completed:
            text += "\n[variables are as they were before this cell]"
        return text

    def snapshot(self) -> ToolSnapshot:
        return self._state

    def restore(self, snapshot: ToolSnapshot) -> None:
        if not isinstance(snapshot, ToolSnapshot):
            raise ValueError(f"restore expects a ToolSnapshot, got {type(snapshot).__name__}")
        self._state = snapshot
