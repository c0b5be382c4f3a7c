"""The soak benchmark: its judge on samples made by hand, a short real run that resumes, and the
committed record recomputed from its own samples."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from bench import soak
from bench.soak import Sample, judge, tenths

REPO = Path(__file__).resolve().parents[1]


def _samples(n: int, grow: float = 0.0, restart_at: int | None = None) -> list[Sample]:
    """``n`` steps of 1 s, 500 MiB, 2 MiB written, 10 KiB of state; the last step ``grow`` above the first."""
    out = []
    for i in range(n):
        f = 1.0 + grow * i / (n - 1)
        process = 0 if restart_at is None or i < restart_at else 1
        out.append(Sample(step=i, process=process, wall_s=1.0 * f, rss_mib=500.0 * f, written_mib=2.0 * f,
                          state_kib=10.0 * f))
    return [replace(out[0], wall_s=math.nan, written_mib=math.nan)] + out[1:]


def test_tenths_are_the_means_of_the_first_and_last_tenth_ignoring_undefined_values() -> None:
    assert tenths([math.nan, 2.0, *[9.0] * 16, 4.0, 6.0]) == (2.0, 5.0)  # 20 values: tenths of two
    assert tenths([3.0]) == (3.0, 3.0)


def test_a_flat_run_passes_and_a_growing_one_misses_every_target() -> None:
    flat = judge(_samples(100))
    assert all(t["verdict"].startswith("PASS") for t in flat.values()), flat
    grown = judge(_samples(100, grow=0.5))  # the last tenth ~45% above the first
    assert all(t["verdict"].startswith("MISS") for t in grown.values()), grown
    assert grown["wall_s"]["drift"] == pytest.approx(
        (grown["wall_s"]["last_tenth"] - grown["wall_s"]["first_tenth"]) / grown["wall_s"]["first_tenth"])


def test_memory_is_not_judged_across_a_restart() -> None:
    targets = judge(_samples(100, restart_at=50))
    assert targets["rss_mib"]["verdict"].startswith("not judged: the run restarted")
    assert targets["wall_s"]["verdict"].startswith("PASS")


def test_a_short_soak_samples_every_step_once_and_resumes(tmp_path) -> None:
    """A real run (the committed testbed, vLLM, a checkpoint every step; no predictor warm-up, to
    keep it short): one sample per step, each with its memory, writes and checkpoint state; a
    rerun with more steps resumes the run and appends the new steps' samples as a second process."""
    work, out = tmp_path / "work", tmp_path / "soak.json"
    quick = ["predictor_warmup.task_file=null"]
    base = ["--work", str(work), "--out", str(out), "--data", str(REPO / "data")]
    soak.main([*base, "--steps", "10", *quick])
    first = json.loads(out.read_text())
    assert [s["step"] for s in first["samples"]] == list(range(10))
    assert first["processes"] == 1 and first["settings"]["overrides"] == quick
    rows = first["samples"]
    assert math.isnan(rows[0]["wall_s"]) and all(r["wall_s"] > 0 for r in rows[1:])
    assert all(r["rss_mib"] > 50 for r in rows) and all(r["written_mib"] > 0 for r in rows[1:])
    assert all(r["state_kib"] > 0 for r in rows[1:])  # a checkpoint exists from the first step on
    assert set(first["targets"]) == {"wall_s", "rss_mib", "written_mib", "state_kib"}
    assert out.with_suffix(".png").is_file()

    soak.main([*base, "--steps", "12", *quick])
    second = json.loads(out.read_text())
    assert [s["step"] for s in second["samples"]] == list(range(12))
    assert [s["process"] for s in second["samples"]] == [0] * 10 + [1] * 2
    assert second["targets"]["rss_mib"]["verdict"].startswith("not judged")


def test_a_testbed_folder_without_its_files_is_refused_by_name(tmp_path) -> None:
    with pytest.raises(SystemExit, match=r"--testbed .*: policy/config.json, pool.jsonl, warmup.jsonl, qa_index "
                                         r"missing"):
        soak.main(["--testbed", str(tmp_path), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o.json")])


def test_the_committed_soak_record_holds_a_thousand_steps_and_its_targets_recompute() -> None:
    path = REPO / "bench" / "results" / "soak.json"
    assert path.is_file(), f"{path} is missing: run `python -m bench.soak` and commit its record"
    record = json.loads(path.read_text())
    samples = [Sample(**s) for s in record["samples"]]
    assert len(samples) >= 1000 and [s.step for s in samples] == list(range(len(samples)))
    recomputed = json.loads(json.dumps(judge(samples), default=float))
    assert recomputed == json.loads(json.dumps(record["targets"], default=float))
