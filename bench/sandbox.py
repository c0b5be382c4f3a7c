"""Sandbox benchmark: what one `python` tool call costs beyond the code itself.

Rows: wall seconds (median / p90 / max over the repeats) and the median CPU seconds of the call
(this process + all waited-for descendants), which other load on a shared machine does not
inflate; the load average at the start is recorded with the figures.
- namespaces: ``unshare --net --pid --mount --ipc --uts --fork --mount-proc --kill-child true``;
- interpreter: the sandbox interpreter starting and exiting (``python -s -P -B -c pass``);
- call `pass`: one full sandboxed call of an empty cell = the per-call overhead;
- call `import numpy`: the same with the heaviest import a math cell usually makes;
- session turn k: a `PythonToolSession` turn after k-1 trivial cells (replay cost grows with k);
- stop latency: a cell sleeping past a 1 s wall clock, minus that 1 s (kill + namespace teardown).

    python -m bench.sandbox [--repeats 30] [--out bench/results/sandbox.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from trace_core.envs.sandbox import PythonSandbox, PythonToolSession, SandboxConfig
from trace_core.envs.sandbox.confinement import _UNSHARE_FLAGS


def stats(samples: list[tuple[float, float]]) -> dict:
    wall = np.asarray([w for w, _ in samples])
    cpu = np.asarray([c for _, c in samples])
    return {
        "n": len(wall),
        "median_s": float(np.median(wall)),
        "p90_s": float(np.quantile(wall, 0.9)),
        "max_s": float(wall.max()),
        "median_cpu_s": float(np.median(cpu)),
    }


def _cpu() -> float:
    """CPU seconds of this process plus every descendant it (or they) waited for."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn, repeats: int) -> list[tuple[float, float]]:
    """(wall, cpu) per call; CPU time is what load on a shared machine does not inflate."""
    out = []
    for _ in range(repeats):
        c0, t0 = _cpu(), time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0, _cpu() - c0))
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.sandbox", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Example:\n  python -m bench.sandbox --repeats 30")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "sandbox.json"))
    return parser


def time_calls(box: PythonSandbox, n: int) -> dict[str, dict]:
    """The namespaces, the interpreter, and whole sandboxed calls of an empty and a numpy cell."""
    def must_complete(code: str) -> None:
        result = box.run(code)
        assert result.completed, result.observation

    return {
        "namespaces (unshare ... true)": stats(
            timed(lambda: subprocess.run(["unshare", *_UNSHARE_FLAGS, "true"], check=True), n)),
        "interpreter start (python -c pass)": stats(
            timed(lambda: subprocess.run([sys.executable, "-s", "-P", "-B", "-c", "pass"], check=True), n)),
        "call: pass": stats(timed(lambda: must_complete("pass"), n)),
        "call: import numpy": stats(timed(lambda: must_complete("import numpy"), max(3, n // 3))),
    }


def time_session_turn(box: PythonSandbox, k: int, repeats: int) -> dict:
    """A session's k-th turn, timed alone: its k - 1 earlier cells are set up untimed."""
    samples = []
    for _ in range(repeats):
        session = PythonToolSession(box)
        for i in range(k - 1):
            session.restore(session.snapshot())
            session.execute(f"x{i} = {i}")
        c0, t0 = _cpu(), time.perf_counter()
        result = session.execute("y = 1")
        samples.append((time.perf_counter() - t0, _cpu() - c0))
        assert result.completed, result.observation
    return stats(samples)


def time_stop_latency(n: int) -> dict:
    """How long past its 1 s wall clock a sleeping cell takes to be stopped."""
    stopper = PythonSandbox(SandboxConfig(wall_seconds=1.0))
    return stats([(t - 1.0, c) for t, c in timed(lambda: stopper.run("import time\ntime.sleep(60)"), max(3, n // 6))])


def print_rows(rows: dict[str, dict], load: tuple[float, float, float]) -> None:
    from bench.bench_tables import places, print_table

    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    table = [{"what": name, "n": row["n"], "median s": row["median_s"], "p90 s": row["p90_s"],
              "max s": row["max_s"], "CPU s": row["median_cpu_s"]} for name, row in rows.items()]
    print_table(table, fmt=places({"median s": 3, "p90 s": 3, "max s": 3, "CPU s": 3}))


def write_report(rows: dict[str, dict], load: tuple[float, float, float], out: Path) -> None:
    report = {
        "rows": rows,
        "load_average": load,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "command": " ".join(["python -m bench.sandbox", *sys.argv[1:]]),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


def main() -> None:
    args = build_parser().parse_args()
    n = args.repeats
    load = os.getloadavg()
    box = PythonSandbox(SandboxConfig())
    rows = time_calls(box, n)
    for k in (1, 5, 10):
        rows[f"session turn {k} (replays {k - 1})"] = time_session_turn(box, k, max(3, n // 3))
    rows["stop latency past a 1 s wall clock"] = time_stop_latency(n)
    print_rows(rows, load)
    write_report(rows, load, Path(args.out))


if __name__ == "__main__":
    main()
