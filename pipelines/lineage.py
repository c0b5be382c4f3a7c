"""Lineage of pipeline steps: what produced an MLflow run, and content fingerprints for reuse.

Every MLflow run a pipeline step creates carries the same five tags (:func:`lineage_tags`), so a
run in the UI says exactly what made it:

    lineage.git_sha        the source revision (``TRACE_RL_GIT_SHA`` in an image, else ``git``;
                           ``-dirty`` when tracked files differ from it)
    lineage.dvc_data_hash  the DVC md5 of the data directory the step read (``data.dvc``)
    lineage.image          the container image (``TRACE_RL_IMAGE`` in an image, else ``local``)
    lineage.kfp_run_id     the Kubeflow Pipelines run (a ``kfp.local`` run id locally)
    lineage.config_hash    sha256 of the step's resolved configuration

:class:`StageCache` keeps each step's finished outputs under ``root/<stage>/<fingerprint>/``; a
step whose fingerprint (its configuration plus the fingerprints of its inputs) is already there
reuses them instead of recomputing. That is how a second local pipeline run skips what is up to
date (``kfp.local`` has no cache of its own), and on a cluster the root is a persistent volume.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

LINEAGE_KEYS = ("lineage.git_sha", "lineage.dvc_data_hash", "lineage.image", "lineage.kfp_run_id",
                "lineage.config_hash")
_DONE = "DONE.json"


def git_sha(repo: str | Path | None = None) -> str:
    """The source revision: ``TRACE_RL_GIT_SHA`` (set in images) or ``git rev-parse HEAD`` in
    ``repo`` (default: the current directory), with ``-dirty`` when tracked files changed."""
    env = os.environ.get("TRACE_RL_GIT_SHA")
    if env and env != "unknown":
        return env
    cwd = str(repo) if repo is not None else None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def image_ref() -> str:
    """The container image this process runs in (``TRACE_RL_IMAGE``), or ``local``."""
    ref = os.environ.get("TRACE_RL_IMAGE", "")
    return ref if ref and ref != "unset" else "local"


def canonical_json(obj: Any) -> str:
    """Deterministic JSON of plain data or dataclasses (sorted keys, no whitespace)."""
    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [plain(x) for x in v]
        if isinstance(v, Path):
            return str(v)
        return v

    return json.dumps(plain(obj), sort_keys=True, separators=(",", ":"), default=str)


def config_hash(config: Any) -> str:
    """sha256 (hex, 16 characters) of a configuration's canonical JSON."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()[:16]


def fingerprint(stage: str, *parts: Any) -> str:
    """The identity of a step's result: its name, configuration and the fingerprints of its inputs."""
    if not stage:
        raise ValueError("stage must be a non-empty name")
    return hashlib.sha256(canonical_json([stage, *parts]).encode()).hexdigest()[:20]


def tree_digest(path: str | Path) -> str:
    """sha256 over a file or a directory's files (relative paths and contents, in sorted order)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path} does not exist: nothing to fingerprint")
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        digest.update(str(f.relative_to(path) if path.is_dir() else f.name).encode() + b"\0")
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def code_digest(*modules: str) -> str:
    """sha256 over the Python source of ``modules`` (packages: every ``.py`` file under them), so
    that a step's fingerprint changes with the code that computes it."""
    import importlib.util

    digest = hashlib.sha256()
    for name in sorted(modules):
        spec = importlib.util.find_spec(name)  # located, not imported
        if spec is None or spec.origin is None:
            raise ValueError(f"module {name!r} not found")
        path = Path(spec.origin)
        root = path.parent if path.name == "__init__.py" else path
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        for f in files:
            digest.update(f"{name}:{f.relative_to(root.parent)}".encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


CODE_ROOTS = ("trace_core", "pipelines", "components")  # the project's own packages; others are pinned by the lock


def _package_dirs(roots: tuple[str, ...]) -> dict[str, Path]:
    """Where each top-level package of ``roots`` lives (a top-level lookup imports nothing)."""
    import importlib.util

    dirs = {}
    for root in roots:
        spec = importlib.util.find_spec(root)
        if spec is not None and spec.origin is not None and spec.origin.endswith("__init__.py"):
            dirs[root] = Path(spec.origin).parent
    return dirs


def _module_file(name: str, package_dirs: dict[str, Path]) -> Path | None:
    """Source file of module ``name`` under ``package_dirs``, found by path alone (a dotted
    ``find_spec`` would import the parent packages), or None for a name that is no module there
    (an attribute imported with ``from pkg import name``, or another project's module)."""
    top, *rest = name.split(".")
    if top not in package_dirs:
        return None
    path = package_dirs[top].joinpath(*rest)
    for candidate in (path / "__init__.py", path.with_suffix(".py") if rest else None):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def _imports_of(name: str, path: Path) -> set[str]:
    """Every module ``name``'s source may import: ``import x``/``from x import y`` anywhere in the
    file (inside functions too: this code base imports heavy parts lazily), relative ones
    resolved, and ``from pkg import y`` counted as ``pkg.y`` where that is a module; a string that
    names a module (``python -m pkg.mod``, ``import_module``) or a sibling file (a script the module
    runs by path, ``"_runner.py"``) counts as an import too. A package
    whose ``__init__`` defines a module-level ``__getattr__`` (PEP 562) can import any of its
    submodules on attribute access, so importing it brings the whole package."""
    import ast

    tree = ast.parse(path.read_bytes(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.endswith(".py") and (path.parent / node.value).is_file():  # a sibling run by path
                found.add(f"{package}.{node.value[:-3]}")
            elif "." in node.value and all(part.isidentifier() for part in node.value.split(".")):
                found.add(node.value)  # a module named in a string: ``python -m pkg.mod``, import_module
    if path.name == "__init__.py" and any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__"
                                          for n in tree.body):
        found.update(f"{name}.{f.stem}" if f.name != "__init__.py" else name
                     for f in path.parent.glob("*.py"))
    return found


def import_closure(*entries: str, roots: tuple[str, ...] = CODE_ROOTS) -> dict[str, Path]:
    """The modules of ``roots`` that ``entries`` import, directly or through one another, read
    statically from the source (nothing is imported); each with its file. A module's parent
    packages are in it too (importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``)."""
    package_dirs = _package_dirs(roots)
    for entry in entries:
        if _module_file(entry, package_dirs) is None:
            raise ValueError(f"module {entry!r} not found under {roots}")
    closure: dict[str, Path] = {}
    pending = list(entries)
    while pending:
        name = pending.pop()
        if name in closure:
            continue
        path = _module_file(name, package_dirs)
        if path is None:
            continue
        closure[name] = path
        parts = name.split(".")
        pending.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        pending.extend(_imports_of(name, path))
    return dict(sorted(closure.items()))


def closure_digest(*entries: str) -> str:
    """sha256 over the source of :func:`import_closure` of ``entries``: a step's code fingerprint
    follows every module its entry can run, and no other."""
    digest = hashlib.sha256()
    for name, path in import_closure(*entries).items():
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def lineage_tags(*, dvc_data_hash: str, kfp_run_id: str, config: Any, repo: str | Path | None = None) -> dict[str, str]:
    """The five lineage tags of an MLflow run (module docstring)."""
    return {
        "lineage.git_sha": git_sha(repo),
        "lineage.dvc_data_hash": dvc_data_hash or "unknown",
        "lineage.image": image_ref(),
        "lineage.kfp_run_id": kfp_run_id or "none",
        "lineage.config_hash": config_hash(config),
    }


def copy_tree(src: str | Path, dst: str | Path) -> Path:
    """Copy a file or directory to ``dst`` (replacing it); hard links where the filesystem allows."""
    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise ValueError(f"{src} does not exist")
    if dst.exists():
        shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_file():
        shutil.copy2(src, dst)
        return dst

    def link_or_copy(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link_or_copy)
    return dst


class StageCache:
    """Finished step outputs under ``root/<stage>/<fingerprint>/`` (module docstring).

    An entry is complete only once its ``DONE.json`` record is written (last, atomically), so a
    step killed half-way is redone, never reused."""

    def __init__(self, root: str | Path, enabled: bool = True) -> None:
        self.root = Path(root)
        self.enabled = enabled

    def entry(self, stage: str, fp: str) -> Path:
        if not stage or "/" in stage or not fp or "/" in fp:
            raise ValueError(f"stage {stage!r} and fingerprint {fp!r} must be non-empty names without '/'")
        return self.root / stage / fp

    def lookup(self, stage: str, fp: str) -> dict[str, Any] | None:
        """The record of a complete entry, or None (also when the cache is disabled)."""
        done = self.entry(stage, fp) / _DONE
        if not self.enabled or not done.is_file():
            return None
        return json.loads(done.read_text())

    def start(self, stage: str, fp: str, resume: bool = False) -> Path:
        """The working directory of a new entry: empty, or with ``resume`` what an interrupted
        (never committed) attempt left there, so that the trainer resumes from its checkpoints."""
        path = self.entry(stage, fp)
        if path.exists() and not (resume and not (path / _DONE).exists()):
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def commit(self, stage: str, fp: str, record: dict[str, Any]) -> dict[str, Any]:
        """Mark the entry complete with ``record`` (JSON-serialisable); returns the record."""
        path = self.entry(stage, fp)
        if not path.is_dir():
            raise ValueError(f"no working directory for {stage}/{fp}: call start() first")
        record = {**record, "stage": stage, "fingerprint": fp}
        fd, tmp = tempfile.mkstemp(dir=path, prefix=".done.")
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh, indent=1, default=str)
        os.replace(tmp, path / _DONE)
        return record
