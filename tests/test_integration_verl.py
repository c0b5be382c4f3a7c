"""TRACE inside verl: the adapter's tests run in verl's own environment (verl 0.9.1 pins an older
transformers than ours), `.venv-verl`, which `make test` builds first (`make verl-venv`). This
test runs them there and asks that every one ran and passed."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERL_PYTHON = REPO / ".venv-verl" / "bin" / "python"


def test_the_verl_adapter_passes_its_tests_against_the_real_verl() -> None:
    assert VERL_PYTHON.is_file(), f"{VERL_PYTHON} is missing: build verl's environment with `make verl-venv`"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([str(VERL_PYTHON), "-m", "pytest", "-p", "no:cacheprovider", "--confcutdir",
                           "tests/verl_env", "-rA", "tests/verl_env"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    summary = re.search(r"(\d+) passed", out)
    assert summary and int(summary.group(1)) >= 17, out[-3000:]
    assert not re.search(r"\d+ (skipped|xfailed|deselected)", out), out[-3000:]
