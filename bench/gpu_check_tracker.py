"""A file-based :class:`~trace_core.tracking.Tracker` for machines without MLflow.

The GPU check runs on a bare image (no mlflow): every record the trainer logs goes, in order, to
``records.jsonl`` in one directory, artifacts are copied next to it, and figures are saved as
PNG when matplotlib is there. Nothing is sent anywhere; the file is the record.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trace_core.tracking import NullTracker


class JsonlTracker(NullTracker):
    """Tracker protocol over an append-only JSON-lines file (a :class:`NullTracker` for whatever
    the protocol gains later: nothing to write for it here)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        (self.dir / "artifacts").mkdir(parents=True, exist_ok=True)
        self.run_id: str | None = uuid.uuid4().hex
        self._file = self.dir / "records.jsonl"
        self._closed: str | None = None

    def _write(self, kind: str, **payload: Any) -> None:
        with self._file.open("a") as f:
            f.write(json.dumps({"kind": kind, "time": time.time(), **payload}, default=str) + "\n")

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._write("params", params=dict(params))

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp: int | None = None) -> None:
        self._write("metrics", step=int(step), timestamp=timestamp, metrics={k: float(v) for k, v in metrics.items()})

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._write("tags", tags={k: str(v) for k, v in tags.items()})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        src = Path(path)
        dst = self.dir / "artifacts" / (artifact_path or "") / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, dirs_exist_ok=True)
        elif src.exists():
            shutil.copy2(src, dst)
        self._write("artifact", path=str(dst.relative_to(self.dir)))

    def log_dict(self, data: Any, artifact_file: str) -> None:
        dst = self.dir / "artifacts" / artifact_file
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(json.dumps(data, indent=1, default=str))
        self._write("artifact", path=str(dst.relative_to(self.dir)))

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        dst = self.dir / "artifacts" / artifact_file
        dst.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(dst, dpi=100)
        self._write("artifact", path=str(dst.relative_to(self.dir)))

    def flush(self) -> bool:
        return True  # every record is on disk when its call returns

    def mark_running(self) -> None:
        self._closed = None
        self._write("status", status="RUNNING")

    def close(self, status: str = "FINISHED") -> int:
        if self._closed != status:  # closing again with the same status changes nothing
            self._closed = status
            self._write("end", status=status)
        return 0  # nothing is left undelivered

    def metrics(self) -> list[dict[str, Any]]:
        """The metric records written so far, in order."""
        lines = self._file.read_text().splitlines() if self._file.exists() else []
        return [r for r in map(json.loads, lines) if r["kind"] == "metrics"]
