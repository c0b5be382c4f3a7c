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

    python bench/sandbox.py [--repeats 30] [--out bench/results/sandbox.json]
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

from trace_core.envs.sandbox import _UNSHARE_FLAGS, PythonSandbox, PythonToolSession, SandboxConfig


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Example:\n  python bench/sandbox.py --repeats 30")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "sandbox.json"))
    args = parser.parse_args()
    n = args.repeats
    load = os.getloadavg()
    box = PythonSandbox(SandboxConfig())
    rows: dict[str, dict] = {}

    def must_complete(code: str, **kw) -> None:
        result = box.run(code, **kw)
        assert result.completed, result.observation

    rows["namespaces (unshare ... true)"] = stats(
        timed(lambda: subprocess.run(["unshare", *_UNSHARE_FLAGS, "true"], check=True), n)
    )
    rows["interpreter start (python -c pass)"] = stats(
        timed(lambda: subprocess.run([sys.executable, "-s", "-P", "-B", "-c", "pass"], check=True), n)
    )
    rows["call: pass"] = stats(timed(lambda: must_complete("pass"), n))
    rows["call: import numpy"] = stats(timed(lambda: must_complete("import numpy"), max(3, n // 3)))
    for k in (1, 5, 10):
        samples = []
        for _ in range(max(3, n // 3)):
            session = PythonToolSession(box)
            for i in range(k - 1):
                session.restore(session.snapshot())
                session.execute(f"x{i} = {i}")
            c0, t0 = _cpu(), time.perf_counter()
            result = session.execute("y = 1")
            samples.append((time.perf_counter() - t0, _cpu() - c0))
            assert result.completed, result.observation
        rows[f"session turn {k} (replays {k - 1})"] = stats(samples)
    stopper = PythonSandbox(SandboxConfig(wall_seconds=1.0))
    rows["stop latency past a 1 s wall clock"] = stats(
        [(t - 1.0, c) for t, c in timed(lambda: stopper.run("import time\ntime.sleep(60)"), max(3, n // 6))]
    )

    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    print(f"{'what':<40}{'n':>4}{'median s':>11}{'p90 s':>9}{'max s':>9}{'CPU s':>9}")
    for name, row in rows.items():
        print(
            f"{name:<40}{row['n']:>4}{row['median_s']:>11.3f}{row['p90_s']:>9.3f}{row['max_s']:>9.3f}"
            f"{row['median_cpu_s']:>9.3f}"
        )
    report = {
        "rows": rows,
        "load_average": load,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "command": "python bench/sandbox.py " + " ".join(sys.argv[1:]),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
