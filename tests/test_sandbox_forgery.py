"""The sandbox's accounting against code that writes the runner's report channel (fd 3) itself.

The cell's code runs in the runner process, so it can write any bytes on the channel where the
runner reports each cell. What must hold, checked here with the real sandbox:
- a forged report never buys time: a replay is granted at most `replay_time_factor` times what the
  host measured (its clock, the init's CPU figure) plus the fixed slack, and a cell that behaves
  differently when replayed is stopped by the same limits as any other;
- a malformed report (any field of the wrong type, missing, non-finite or huge, a wrong index, a
  line that is not JSON) voids the call: a tool error for the agent, never an exception in the host.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import textwrap

import psutil
import pytest

from trace_core.envs.math_env import MathEnvConfig, MathEnvironment
from trace_core.envs.sandbox import PythonSandbox, PythonToolSession, SandboxConfig, ToolSnapshot
from trace_core.rollout.env import Action, Task

TEST_UID = 61_236  # a uid of its own: other sandbox suites running at once are not our leftovers
UIDS = 2  # the pool from TEST_UID: one uid per concurrent call
LIMITS = dict(uid=TEST_UID, uid_count=UIDS, gid=TEST_UID, memory_bytes=512 << 20, max_output_bytes=4096,
              max_processes=16)
TIGHT = SandboxConfig(cpu_seconds=1, wall_seconds=2.0, **LIMITS)
CPU_BOUND = SandboxConfig(cpu_seconds=1, wall_seconds=20.0, **LIMITS)  # only the CPU limit can stop it
FACTOR, SLACK = 2.0, 0.5
REACTION_S = 1.0  # from a deadline to the host's stopping the call, on a loaded machine
VOID = "the sandbox's report channel held a forged or malformed report"

FAULT_AREA = "sandbox (forged reports)"  # the fault summary's area of the tests with `fault`
pytestmark = [pytest.mark.faults, pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="the sandbox needs root and util-linux unshare",
)]

# Replayed cells have their stdout on /dev/null: a hostile cell can tell a replay from its first run.
REPLAYING = "os.path.samefile('/proc/self/fd/1', '/dev/null')"


@pytest.fixture(scope="module")
def tight() -> PythonSandbox:
    return PythonSandbox(TIGHT)


@pytest.fixture(scope="module")
def cpu_bound() -> PythonSandbox:
    return PythonSandbox(CPU_BOUND)


@pytest.fixture(autouse=True)
def no_leftovers(fault):
    """Every test here forges reports or snapshots: each is a fault injection, and leaves no process."""
    yield
    left = [p.info["pid"] for p in psutil.process_iter(["pid", "uids"])
            if p.info["uids"] and any(TEST_UID <= u < TEST_UID + UIDS
                                      for u in (p.info["uids"].real, p.info["uids"].effective))]
    fault.check("calls without leftover processes", 1, int(left == []))
    assert left == []


def after_startup(result) -> float:
    """Seconds of a call after sandbox start-up, which counts against no limit (seconds when loaded)."""
    assert result.startup_seconds is not None, result.observation
    return result.wall_seconds - result.startup_seconds


def stopped_after_startup(result) -> float:
    """When the host stopped the call, in seconds after start-up: what its clocks granted, without
    the namespace's teardown, which takes seconds of its own on a loaded machine."""
    assert result.startup_seconds is not None and result.stopped_seconds is not None, result.observation
    return result.stopped_seconds - result.startup_seconds


def report(**overrides: object) -> str:
    """A well-formed report of cell 0 as the runner writes it, with `overrides` applied."""
    rec: dict[str, object] = {"from": "runner", "kind": "cell", "index": 0, "error": None,
                              "memory_error": False, "wall_seconds": 0.0, "cpu_seconds": 0.0}
    rec.update(overrides)
    return json.dumps(rec)


def forging(line: bytes, on_replay: str = "pass", exit_after: bool = True) -> str:
    """A cell that writes `line` as its own report and (exit_after) ends before the runner writes the
    genuine one, so the forged line is all the host gets; replayed, it runs `on_replay` instead."""
    ending = "os._exit(0)" if exit_after else "pass"
    return textwrap.dedent(f"""
        import os
        if {REPLAYING}:
            {on_replay}
        else:
            os.write(3, {line!r})
            {ending}
    """)


# --- forged reports never buy time -----------------------------------------------------------------


def test_a_well_formed_forgery_is_timed_by_the_host(tight):
    session = PythonToolSession(tight, FACTOR, SLACK)
    # The cell takes 0.2 s and claims none of it. The host stamps each line when it reads it: the
    # report came at least 0.2 s after the call started (a host descheduled past the ready line
    # stamps both late, which shortens the cell's figure, never lengthens it).
    cell = "import time\ntime.sleep(0.2)" + forging(report(wall_seconds=0.0, cpu_seconds=0.0).encode() + b"\n")
    first = session.execute(cell)
    assert first.completed  # harmless: it claims nothing the host did not measure
    (wall,), (cpu,) = session.snapshot().cell_wall_seconds, session.snapshot().cell_cpu_seconds
    assert wall == first.cell_wall_seconds[0] <= after_startup(first)
    assert first.startup_seconds + wall >= 0.2 and cpu <= (first.cpu_seconds or 0.0)


def test_a_sleep_hidden_in_a_forged_cell_is_killed_on_replay(tight):
    session = PythonToolSession(tight, FACTOR, SLACK)
    first = session.execute(forging(report().encode() + b"\n", on_replay="import time; time.sleep(40)"))
    assert first.completed
    granted_wall, _ = session.replay_grant(session.snapshot())
    assert granted_wall <= FACTOR * first.wall_seconds + SLACK
    replayed = session.execute("print('never reached')")
    assert replayed.timed_out and not replayed.completed
    assert stopped_after_startup(replayed) <= TIGHT.wall_seconds + granted_wall + REACTION_S
    assert len(session.snapshot().cells) == 1


def test_cpu_burnt_in_a_forged_cell_is_stopped_on_replay(cpu_bound):
    session = PythonToolSession(cpu_bound, FACTOR, SLACK)
    first = session.execute(forging(report().encode() + b"\n", on_replay="while True: pass"))
    assert first.completed
    _, granted_cpu = session.replay_grant(session.snapshot())
    assert granted_cpu <= FACTOR * (first.cpu_seconds or 0.0)
    replayed = session.execute("print('never reached')")
    assert replayed.killed_reason == "CPU time limit of 1 s exceeded"
    # the init's hard limit: the cell's second, the grant rounded up, one of start-up, one to SIGKILL
    assert replayed.cpu_seconds is not None
    assert replayed.cpu_seconds <= CPU_BOUND.cpu_seconds + math.ceil(granted_cpu) + 2 + 0.1


@pytest.mark.parametrize("claim", [{"wall_seconds": 40.0}, {"cpu_seconds": 15.0}, {"wall_seconds": 1e308}])
def test_claiming_more_time_than_the_host_measured_voids_the_cell(tight, claim):
    session = PythonToolSession(tight, FACTOR, SLACK)
    result = session.execute(forging(report(**claim).encode() + b"\n", on_replay="import time; time.sleep(40)"))
    assert not result.completed and VOID in (result.killed_reason or "")
    assert "more than the host measured" in result.observation
    assert session.snapshot() == ToolSnapshot()  # nothing to replay, so nothing granted


def test_a_later_cell_rewriting_an_earlier_report_voids_the_call(tight):
    session = PythonToolSession(tight, FACTOR, SLACK)
    session.execute("x = 1")
    before = session.snapshot()
    result = session.execute(forging(report(index=0, wall_seconds=0.01).encode() + b"\n"))
    assert not result.completed and "line 2: index 0 where the report of cell 1" in result.observation
    assert session.snapshot() == before


def test_the_visible_cell_is_not_lent_the_replay_grant(tight):
    session = PythonToolSession(tight, FACTOR, SLACK)
    slow_once = textwrap.dedent(f"""
        import os, time
        if not {REPLAYING}:
            time.sleep(1.0)
    """)
    assert session.execute(slow_once).completed
    result = session.execute("import time; time.sleep(40)")
    replay_end = result.cell_wall_seconds[0]
    assert result.timed_out
    assert stopped_after_startup(result) - replay_end <= TIGHT.wall_seconds + REACTION_S


def test_a_replay_report_forged_early_only_shortens_the_call(tight):
    session = PythonToolSession(tight, FACTOR, SLACK)
    early = report().encode() + b"\n"
    cell = textwrap.dedent(f"""
        import os, time
        if {REPLAYING}:
            os.write(3, {early!r})  # 'the replay is over', long before it is
            time.sleep(40)
        else:
            time.sleep(1.5)
    """)
    assert session.execute(cell).completed
    granted_wall, _ = session.replay_grant(session.snapshot())
    assert granted_wall > 3.0
    result = session.execute("print('never reached')")
    assert result.timed_out
    assert stopped_after_startup(result) <= TIGHT.wall_seconds + REACTION_S  # the grant was never used


def test_a_restored_snapshot_buys_at_most_the_factor_times_the_limits(tight):
    session = PythonToolSession(tight, FACTOR, SLACK)
    huge = ToolSnapshot.from_json({"cells": ["x = 1"], "cell_wall_seconds": [1e308], "cell_cpu_seconds": [1e308]})
    assert session.replay_grant(huge) == (FACTOR * TIGHT.wall_seconds + SLACK, FACTOR * TIGHT.cpu_seconds)
    for bad in (math.nan, math.inf, -1.0, None, "1"):
        with pytest.raises(ValueError, match="cell_wall_seconds"):
            ToolSnapshot.from_json({"cells": ["x = 1"], "cell_wall_seconds": [bad], "cell_cpu_seconds": [0.0]})


def test_a_forged_snapshot_of_many_cells_buys_at_most_the_snapshot_cap(tight):
    """The per-cell cap alone granted a forged snapshot of 1,000 cells 1,000 times a cell's limit;
    the grant is capped per snapshot, and a replay that needs more is stopped there."""
    cap = 3.0
    session = PythonToolSession(tight, FACTOR, SLACK, max_replay_seconds=cap)
    n = 1000
    forged = ToolSnapshot(("import time\ntime.sleep(0.5)",) * n, (TIGHT.wall_seconds,) * n,
                          (float(TIGHT.cpu_seconds),) * n)
    assert session.replay_grant(forged) == (cap, cap)
    assert PythonToolSession(tight, FACTOR, SLACK).replay_grant(forged) == (30.0, 30.0)  # the default cap
    session.restore(forged)
    result = session.execute("print('never reached')")
    assert result.timed_out and not result.completed
    assert stopped_after_startup(result) <= cap + TIGHT.wall_seconds + REACTION_S
    with pytest.raises(ValueError, match="max_replay_seconds"):
        PythonToolSession(tight, FACTOR, SLACK, max_replay_seconds=math.inf)


# --- malformed reports void the call, never raise ---------------------------------------------------

NESTED = b"[" * 5000 + b"]" * 5000  # deep enough to exhaust the JSON decoder's recursion
MALFORMED = {
    "wall null": report(wall_seconds=None),
    "wall string": report(wall_seconds="0.5"),
    "wall list": report(wall_seconds=[0.5]),
    "wall bool": report(wall_seconds=True),
    "wall missing": json.dumps({k: v for k, v in json.loads(report()).items() if k != "wall_seconds"}),
    "wall negative": report(wall_seconds=-1.0),
    "wall nan": report().replace('"wall_seconds": 0.0', '"wall_seconds": NaN'),
    "wall inf": report().replace('"wall_seconds": 0.0', '"wall_seconds": Infinity'),
    "wall 1e308": report(wall_seconds=1e308),
    "wall 1e400": report().replace('"wall_seconds": 0.0', '"wall_seconds": 1e400'),
    "cpu null": report(cpu_seconds=None),
    "cpu string": report(cpu_seconds="fast"),
    "cpu list": report(cpu_seconds=[]),
    "cpu bool": report(cpu_seconds=False),
    "cpu missing": json.dumps({k: v for k, v in json.loads(report()).items() if k != "cpu_seconds"}),
    "cpu nan": report().replace('"cpu_seconds": 0.0', '"cpu_seconds": NaN'),
    "cpu 1e308": report(cpu_seconds=1e308),
    "cpu 400-digit int": report().replace('"cpu_seconds": 0.0', '"cpu_seconds": 1' + "0" * 400),
    "index null": report(index=None),
    "index string": report(index="0"),
    "index list": report(index=[0]),
    "index bool": report(index=False),
    "index float": report(index=0.0),
    "index 1e400": report().replace('"index": 0', '"index": 1e400'),
    "index wrong": report(index=1),
    "index negative": report(index=-1),
    "index missing": json.dumps({k: v for k, v in json.loads(report()).items() if k != "index"}),
    "error not a string": report(error=5),
    "memory_error not a bool": report(memory_error="yes"),
    "kind wrong": report(kind="exit"),
    "a second ready line": '{"from": "runner", "kind": "ready"}',  # would restart start-up's clock
    "a list": "[0, 0.0, 0.0]",
    "a number": "7",
    "a string": '"cell"',
    "null": "null",
    "not JSON": "garbage",
    "empty line": "",
}
RAW = {
    "nested arrays": NESTED + b"\n",
    "invalid UTF-8": b'{"kind": "cell\xff\xfe"}\n',
    "oversized line": b'{"pad": "' + b"x" * (64 << 10) + b'"}\n',
    "unterminated line": report().encode(),
    "a report after the last": (report() + "\n" + report(index=1) + "\n").encode(),
}


@pytest.mark.parametrize(
    "line", [v.encode() + b"\n" for v in MALFORMED.values()] + list(RAW.values()), ids=[*MALFORMED, *RAW]
)
def test_a_malformed_report_voids_the_call(tight, line):
    session = PythonToolSession(tight, FACTOR, SLACK)
    text = session.run(forging(line))
    result = session.last_result
    assert result is not None and not result.completed and VOID in (result.killed_reason or "")
    assert f"[execution stopped: {VOID}" in text and text.endswith("[variables are as they were before this cell]")
    assert session.snapshot() == ToolSnapshot()


def test_a_forged_line_before_the_genuine_report_voids_the_call(tight):
    result = tight.run(forging(report(wall_seconds=None).encode() + b"\n", exit_after=False))
    assert not result.completed and "line 1: wall_seconds None" in result.observation


@pytest.mark.parametrize("name", ["wall null", "wall string", "index 1e400", "wall 1e308", "nested arrays"])
def test_math_env_step_turns_a_malformed_report_into_a_tool_error(tight, name):
    line = RAW[name] if name in RAW else MALFORMED[name].encode() + b"\n"
    env = MathEnvironment(tight, MathEnvConfig(sandbox=TIGHT, replay_time_factor=FACTOR, replay_slack_seconds=SLACK))
    env.reset(Task(id="t", question="q", answer="1"))
    obs = env.step(Action(raw="", tool="python", arguments={"code": forging(line)}))
    assert obs.tool_error and not obs.done and VOID in obs.text
    after = env.step(Action(raw="", tool="python", arguments={"code": "print(6 * 7)"}))
    assert after.text == "42" and not after.tool_error
