"""The library's boundary: every trace_core module imports in a clean interpreter without pulling
in the pipeline's stack (kfp, mlflow) or the layers above it (pipelines, components). An RL
engineer calls trace_core from their own trainer without installing or loading either."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = ("kfp", "mlflow", "pipelines", "components")
# The layers above the library: never imported by it, not even inside a function (kfp and mlflow
# may be, lazily, by the tracker; pipelines and components never).
ABOVE = ("pipelines", "components")

PROBE = """
import importlib, json, pathlib, sys
culprits = {}
import trace_core
if any(f in sys.modules for f in FORBIDDEN):
    culprits["trace_core"] = [f for f in FORBIDDEN if f in sys.modules]
# Module names from the files, not pkgutil.walk_packages: walking imports every package first, and
# what a package's __init__ pulls in would then be in sys.modules before any module is checked.
root = pathlib.Path(trace_core.__file__).parent
names = []
for path in sorted(root.rglob("*.py")):
    parts = path.relative_to(root).with_suffix("").parts
    packages = [root.joinpath(*parts[:i]) for i in range(1, len(parts))]
    if parts[-1] == "__main__" or not all((p / "__init__.py").is_file() for p in packages):
        continue
    names.append(".".join(("trace_core", *(parts[:-1] if parts[-1] == "__init__" else parts))))
for name in sorted(set(names) - {"trace_core"}):
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


def test_no_trace_core_source_imports_the_layers_above_it() -> None:
    """Also the imports inside functions, which importing a module does not run."""
    culprits = []
    for path in sorted((REPO / "trace_core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            culprits += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in ABOVE]
    assert culprits == [], "trace_core imports the pipeline layers: " + "; ".join(culprits)


def _module_files() -> dict[str, Path]:
    """trace_core's modules by dotted name (a package by its ``__init__``)."""
    files = {}
    for path in sorted((REPO / "trace_core").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _imported_modules(path: Path, files: dict[str, Path]) -> set[str]:
    """The trace_core modules a file imports, inside functions and TYPE_CHECKING blocks too (each is
    a dependency a reader follows): ``from a.b import c`` names the module ``a.b.c`` where that is
    one, else ``a.b``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in files else node.module)
    return {name for name in found if name in files}


def test_no_two_trace_core_modules_import_each_other_even_through_others() -> None:
    """The library's modules form layers: following imports from any module never leads back to it,
    so each can be read, tested and replaced from the bottom up."""
    files = _module_files()
    graph = {name: _imported_modules(path, files) - {name} for name, path in files.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (circle := visit(dep)):
                return circle
        path.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (circle := visit(name)):
            raise AssertionError("an import circle: " + " -> ".join(circle))
    assert len(graph) > 40 and sum(map(len, graph.values())) > 100  # the graph was read, not empty
