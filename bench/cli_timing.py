"""How fast the command-line entry points answer `--help`: the wall-clock figures that the tests
used to assert (``trace-rl deliver --help`` under 3 s) and now leave to this benchmark, since a
test checks what a command does, never how long a loaded machine takes to do it.

Rows: median / max wall seconds over the repeats, with the load average at the start.

Example:

    python -m bench.cli_timing --repeats 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = {
    "trace-rl --help": ["--help"],
    "trace-rl deliver --help": ["deliver", "--help"],
}


def time_command(argv: list[str], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.monotonic()
        subprocess.run(argv, capture_output=True, check=True, timeout=120)
        times.append(time.monotonic() - t0)
    return sorted(times)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cli_timing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command (the median and max are shown)")
    args = parser.parse_args()
    trace_rl = str(Path(sys.executable).with_name("trace-rl"))
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    print(f"{'command':28s} {'median s':>9s} {'max s':>7s}")
    for name, extra in COMMANDS.items():
        times = time_command([trace_rl, *extra], args.repeats)
        print(f"{name:28s} {times[len(times) // 2]:9.2f} {times[-1]:7.2f}")


if __name__ == "__main__":
    main()
