"""Every entry point answers ``--help`` with what it does, its main options and an example, without
loading the heavy stack first (torch, transformers, vLLM, DeepSpeed, MLflow, kfp): heavy imports
come after argument parsing, which is what keeps ``--help`` fast."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "vllm", "deepspeed", "mlflow", "kfp")

# (module, argv after it): each run as `python -m MODULE`, the benchmarks as `python -m bench.<name>`.
MODULES = [
    ("trace_core.cli", []), ("trace_core.cli", ["train"]), ("trace_core.cli", ["show-config"]),
    ("trace_core.cli", ["methods"]),
    ("pipelines", []), *[("pipelines", [c]) for c in ("compile", "run", "submit", "schedule", "params", "stage",
                                                      "ui")],
    ("trace_core.warmstart", []), ("trace_core.evaluation", []), ("trace_core.retrieval", []),
    ("trace_core.data.generate", []), ("trace_core.data.validation", []),
]
MODULES += [(f"bench.{p.stem}", []) for p in sorted((REPO / "bench").glob("*.py")) if "__main__" in p.read_text()]
if (REPO / "trace_core" / "cli.py").read_text().count('"deliver"'):
    MODULES.append(("trace_core.cli", ["deliver"]))

PROBE = """
import json, runpy, sys
target, argv, heavy = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
sys.argv = [target, *argv, "--help"]
try:
    runpy.run_module(target, run_name="__main__", alter_sys=True)
except SystemExit as done:
    code = done.code
else:
    code = None
print("\\n@@" + json.dumps({"code": code, "heavy": [m for m in heavy if m in sys.modules]}))
"""


def _help(target: str, argv: list[str]) -> tuple[str, dict]:
    out = subprocess.run([sys.executable, "-c", PROBE, target, json.dumps(argv), json.dumps(HEAVY)],
                         cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    text, _, tail = out.stdout.rpartition("\n@@")
    assert tail, f"{target} {argv} --help crashed:\n{out.stderr[-2000:]}"
    return text, json.loads(tail)


@pytest.mark.parametrize(("target", "argv"), MODULES, ids=[" ".join([m, *a]) for m, a in MODULES])
def test_help_says_what_it_does_with_an_example_before_any_heavy_import(target, argv) -> None:
    text, result = _help(target, argv)
    assert result["code"] in (0, None), f"--help exited {result['code']}"
    assert "usage:" in text.lower(), text[:500]
    assert "example" in text.lower(), f"no example in the help of {target} {argv}:\n{text[:1500]}"
    assert not result["heavy"], f"--help of {target} {argv} imported {result['heavy']} before parsing"


def test_every_registered_method_is_listed_by_the_cli_and_has_a_row_in_the_methods_table() -> None:
    """``trace-rl methods`` names every method of the registry with its rule, and docs/method.md's
    table of what each method decides, from what signal, at what cost has a row for each (a method
    registered without one fails here)."""
    from trace_core.methods import METHODS

    out = subprocess.run([sys.executable, "-m", "trace_core.cli", "methods"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    listed = {line.split()[0]: line.split(None, 1)[1] for line in out.stdout.splitlines() if line.strip()}
    assert listed == {name: m.description for name, m in METHODS.items()}
    rows = {line.split("|")[1].strip().strip("`") for line in (REPO / "docs" / "method.md").read_text().splitlines()
            if line.startswith("| `")}
    assert set(METHODS) <= rows, f"methods without a row in docs/method.md's table: {sorted(set(METHODS) - rows)}"
