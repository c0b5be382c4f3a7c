"""One way to get the QA index: built from the corpus when the folder holds none, reused when it
does, and a clear error naming both paths when there is neither."""

from __future__ import annotations

from pathlib import Path

import pytest

from trace_core.retrieval import RetrievalIndex, ensure_index

REPO = Path(__file__).resolve().parents[1]


def test_ensure_index_builds_once_then_reuses(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    lines = (REPO / "data" / "qa" / "corpus.jsonl").read_text().splitlines(keepends=True)[:12]
    corpus.write_text("".join(lines))
    built = ensure_index(tmp_path / "index", corpus)
    manifest = (built / "manifest.json").stat().st_mtime_ns
    assert len(RetrievalIndex.load(built).passages) == 12
    corpus.unlink()  # reused: the corpus is not read again
    assert ensure_index(tmp_path / "index", corpus) == built
    assert (built / "manifest.json").stat().st_mtime_ns == manifest
    with pytest.raises(ValueError, match=r"no retrieval index at .*elsewhere and no corpus at .*missing\.jsonl"):
        ensure_index(tmp_path / "elsewhere", tmp_path / "missing.jsonl")
