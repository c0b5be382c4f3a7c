"""The progress heartbeat: a line while one activity runs silently, none while lines keep coming."""

from __future__ import annotations

import time

import pytest

from trace_core.training.heartbeat import Heartbeat
from trace_core.training.profiler import PhaseProfiler


def test_a_silent_activity_gets_heartbeat_lines_naming_it(capsys) -> None:
    profiler = PhaseProfiler()
    with Heartbeat(lambda: f"train trace step 1/2: {profiler.current or 'between phases'}", interval_s=0.2):
        with profiler.phase("rollout"):
            time.sleep(1.0)
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("progress: ")]
    assert len(lines) >= 2, lines
    assert all("train trace step 1/2: rollout (running for" in x for x in lines), lines
    assert profiler.current is None  # the phase is over


def test_lines_printed_through_it_reset_the_silence(capsys) -> None:
    with Heartbeat(lambda: "quiet work", interval_s=0.5) as beat:
        for i in range(8):
            beat.line(f"step {i}")
            time.sleep(0.1)
    out = capsys.readouterr().out
    assert out.count("progress: step") == 8 and "quiet work" not in out


def test_disabled_and_bad_interval() -> None:
    with Heartbeat(lambda: "x", interval_s=0.05, enabled=False):
        time.sleep(0.2)
    with pytest.raises(ValueError, match="interval_s"):
        Heartbeat(lambda: "x", interval_s=0)
