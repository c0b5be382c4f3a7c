"""The library's boundary: every trace_core module imports in a clean interpreter without pulling
in the pipeline's stack (kfp, mlflow) or the layers above it (pipelines, components). An RL
engineer calls trace_core from their own trainer without installing or loading either."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = ("kfp", "mlflow", "pipelines", "components")

PROBE = """
import importlib, json, pkgutil, sys
import trace_core
names = sorted(m.name for m in pkgutil.walk_packages(trace_core.__path__, "trace_core.")
               if not m.name.endswith("__main__"))
culprits = {}
for name in names:
    before = {f for f in FORBIDDEN if f in sys.modules}
    importlib.import_module(name)
    new = [f for f in FORBIDDEN if f in sys.modules and f not in before]
    if new:
        culprits[name] = new
print(json.dumps({"modules": len(names), "culprits": culprits}))
"""


def test_every_trace_core_module_imports_without_the_pipeline_stack() -> None:
    code = f"FORBIDDEN = {FORBIDDEN!r}\n" + PROBE
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
                              "DS_ACCELERATOR": "cpu"})
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["modules"] > 40, result
    assert result["culprits"] == {}, f"trace_core modules that import the pipeline stack: {result['culprits']}"
