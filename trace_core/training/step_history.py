"""A run's per-step figures, kept as an append-only file beside its checkpoints.

Each finished step appends one line (``{"step": s, "metrics": {...}}``) before the checkpoint that
makes the step durable; a checkpoint holds no figures, so what it writes does not grow with the
step count. On resume the figures of the steps the checkpoint covers are read back, and any line
of a step past it (written before a crash that came ahead of its checkpoint) is cut off, so a
resumed run appends each step once.

A checkpoint written before this file existed carried the figures itself; :func:`write_base`
turns them into the file's first line (``{"base": {...}, "upto": S}``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

HISTORY_FILE = "step_history.jsonl"  # in output_dir


def append_step(path: Path, step: int, metrics: dict[str, float]) -> None:
    """One step's figures, appended and flushed to disk."""
    line = json.dumps({"step": int(step), "metrics": {k: float(v) for k, v in metrics.items()}})
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_base(path: Path, history: dict[str, list[float]], upto: int) -> None:
    """Start the file from figures a checkpoint carried itself (steps before ``upto``)."""
    _replace(path, [json.dumps({"base": history, "upto": int(upto)})])


def start_over(path: Path) -> None:
    """Empty the file of a run that starts from no checkpoint (a start that crashed before its
    first one left figures no resume will read)."""
    if path.is_file():
        _replace(path, [])


def read_history(path: Path, before: int, cut: bool = True) -> dict[str, list[float]]:
    """The figures of steps ``< before``, in step order, as lists per name (a name a step did not
    report is skipped for that step, as when the figures are gathered live); with ``cut`` the file
    is cut back to those steps (what a resume does). A torn last line (a crash mid-write) is
    dropped."""
    history: dict[str, list[float]] = {}
    kept: list[str] = []
    if not path.is_file():
        return history
    lines = path.read_text().splitlines()
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            break  # a torn line can only be the last one written
        if "base" in record:
            if int(record["upto"]) > before:
                raise ValueError(f"{path}: its base holds figures up to step {record['upto']}, past the "
                                 f"checkpoint's step {before}")
            history = {k: list(v) for k, v in record["base"].items()}
        elif int(record["step"]) >= before:
            break  # steps past the checkpoint: written before a crash, run again on resume
        else:
            for key, value in record["metrics"].items():
                history.setdefault(key, []).append(float(value))
        kept.append(line)
    if cut and len(kept) != len(lines):
        _replace(path, kept)
    return history


def run_history(run_dir: Path, state_file: str = "trainer_state.json") -> dict[str, list[float]]:
    """A run folder's per-step figures up to its last checkpoint (what a resume would read back),
    without touching the folder; empty when it has no checkpoint. A checkpoint of the old layout
    carries them itself."""
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return {}
    state_path = run_dir / "checkpoints" / pointer.read_text().strip() / state_file
    if not state_path.is_file():
        return {}
    state = json.loads(state_path.read_text())
    if state.get("history"):
        return state["history"]
    return read_history(run_dir / HISTORY_FILE, int(state["step"]), cut=False)


def _replace(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, path)
