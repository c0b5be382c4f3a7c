"""The soak benchmark: its judge on samples made by hand, and a short real run that resumes."""

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
    assert tenths([math.nan, 2.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 4.0, 6.0]) == (2.0, 6.0)
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


def test_a_short_soak_samples_every_step_once_and_resumes(tiny_models, tmp_path) -> None:
    """A real run (tiny policy, fixed-turns task, transformers engine, a checkpoint every step):
    one sample per step, each with its memory, writes and checkpoint state; a rerun with more
    steps resumes the run and appends the new steps' samples as a second process."""
    work, out = tmp_path / "work", tmp_path / "soak.json"
    tiny = ["task.family=fixed-turns", "task.envs.fixed_turns.turns=2", "task.envs.fixed_turns.prompts=8",
            "budget.roots_M=4", "budget.expansion_N=1", "budget.group_size_G=2", "budget.max_per_prompt=4",
            "budget.pool_factor=1", "agent.max_new_tokens=6", "agent.max_total_tokens=512",
            "engine.max_model_len=512", "engine.kind=hf", "policy.micro_batches=1", "predictor.tiny_hidden_size=32",
            "predictor.tiny_intermediate_size=64"]
    base = ["--policy", str(tiny_models[0]), "--work", str(work), "--out", str(out)]
    soak.main([*base, "--steps", "10", *tiny])
    first = json.loads(out.read_text())
    assert [s["step"] for s in first["samples"]] == list(range(10))
    assert first["processes"] == 1 and first["settings"]["overrides"] == tiny
    rows = first["samples"]
    assert math.isnan(rows[0]["wall_s"]) and all(r["wall_s"] > 0 for r in rows[1:])
    assert all(r["rss_mib"] > 50 for r in rows) and all(r["written_mib"] > 0 for r in rows[1:])
    assert all(r["state_kib"] > 0 for r in rows[1:])  # a checkpoint exists from the first step on
    assert set(first["targets"]) == {"wall_s", "rss_mib", "written_mib", "state_kib"}
    assert out.with_suffix(".png").is_file()

    soak.main([*base, "--steps", "12", *tiny])
    second = json.loads(out.read_text())
    assert [s["step"] for s in second["samples"]] == list(range(12))
    assert [s["process"] for s in second["samples"]] == [0] * 10 + [1] * 2
    assert second["targets"]["rss_mib"]["verdict"].startswith("not judged")
