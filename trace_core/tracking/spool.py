"""The spool on disk: every record a run logs is appended here first (whole lines, a torn last
line ended), so a store outage loses nothing and a later :func:`~trace_core.tracking.deliver` sends it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class SpoolMeta:
    """What delivering a spool needs without the process that wrote it (``run.json``)."""

    run_id: str | None = None  # None: the run is not created on the store yet
    tracking_uri: str | None = None
    experiment: str | None = None
    run_name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)  # the run's tags at creation


class Spool:
    """One run's records on local disk: ``journal.jsonl`` (every record, append-only),
    ``acked.txt`` (the seqs the store confirmed, or whose refused values were set aside),
    ``rejected.jsonl`` (those values, with the store's reason), ``run.json`` (:class:`SpoolMeta`)
    and ``files/`` (copies of the artifacts)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.journal = root / "journal.jsonl"
        self.acked = root / "acked.txt"
        self.rejected = root / "rejected.jsonl"
        self.meta_file = root / "run.json"
        self.files = root / "files"

    def exists(self) -> bool:
        return self.journal.is_file() or self.meta_file.is_file()

    def create(self) -> None:
        self.files.mkdir(parents=True, exist_ok=True)
        for path in (self.journal, self.acked):
            _end_torn_line(path)

    def read_meta(self) -> SpoolMeta:
        if not self.meta_file.is_file():
            return SpoolMeta()
        data = json.loads(self.meta_file.read_text())
        return SpoolMeta(**{k: data[k] for k in SpoolMeta.__dataclass_fields__ if k in data})

    def write_meta(self, meta: SpoolMeta) -> None:
        tmp = self.meta_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(meta)))
        tmp.replace(self.meta_file)

    def unacked(self) -> tuple[list[dict[str, Any]], int]:
        """The records the store has not confirmed, in order, and the next free seq."""
        acked = set(self.acked.read_text().split()) if self.acked.exists() else set()
        pending, seq = [], 0
        for rec in self.records():
            seq = max(seq, rec["seq"] + 1)
            if str(rec["seq"]) not in acked:
                pending.append(rec)
        return pending, seq

    def last_status(self) -> str | None:
        """The last run status spooled (None: none was)."""
        statuses = [r["status"] for r in self.records() if r["kind"] in ("status", "end")]
        return statuses[-1] if statuses else None

    def append(self, rec: dict[str, Any]) -> None:
        _append_lines(self.journal, [json.dumps(rec, allow_nan=True)])

    def ack(self, records: list[dict[str, Any]]) -> None:
        _append_lines(self.acked, [str(r["seq"]) for r in records])

    def reject(self, rec: dict[str, Any], reasons: dict[str | None, str]) -> None:
        _append_lines(self.rejected, [json.dumps({"seq": rec["seq"], "kind": rec["kind"], "key": key, "reason": why})
                                      for key, why in reasons.items()])

    def rejected_count(self) -> int:
        return len(self.rejected.read_text().splitlines()) if self.rejected.exists() else 0

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record in the journal, in order."""
        if not self.journal.exists():
            return
        for line in self.journal.read_text().splitlines():
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:  # a torn line from a kill: it was never acknowledged
                continue


def _append_lines(path: Path, lines: list[str]) -> None:
    try:
        with path.open("a") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        if err.filename is not None:
            raise
        # A failed write names no file (a full disk at flush): the error says which file it was.
        raise OSError(err.errno, err.strerror, str(path)) from err


def _end_torn_line(path: Path) -> None:
    # A process killed mid-write leaves a last line without its newline; the next line appended
    # would be glued to it and lost with it.
    if path.exists() and path.stat().st_size:
        with path.open("rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
