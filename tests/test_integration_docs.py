"""docs/integration.md's snippets run as written, in order, in one namespace (as a reader would
paste them), and the README's library snippet with them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _snippets(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.parametrize("doc", ["docs/integration.md", "docs/training.md", "README.md"])
def test_the_python_snippets_run_as_written(doc):
    snippets = _snippets(REPO / doc)
    assert snippets, f"{doc} holds no python snippet"
    namespace: dict = {}
    for n, code in enumerate(snippets):
        try:
            exec(compile(code, f"{doc} snippet {n + 1}", "exec"), namespace)
        except Exception as err:
            raise AssertionError(f"{doc} snippet {n + 1} fails: {err!r}\n{code}") from err


def test_the_front_door_names_resolve_and_stay_light():
    import subprocess
    import sys

    probe = ("import sys, trace_core\n"
             "heavy = [m for m in ('torch', 'mlflow', 'vllm', 'transformers') if m in sys.modules]\n"
             "assert not heavy, heavy\n"
             "for name in trace_core.__all__[1:]:\n"
             "    getattr(trace_core, name)\n"
             "print(len(trace_core.__all__))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 12
