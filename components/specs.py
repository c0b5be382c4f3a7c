"""The components compiled to their KFP specs, the files the DAG is built from.

The DAG (:mod:`pipelines.dag`) composes the components without importing them: it loads each one
from ``components/specs/<name>.yaml``, the component compiled by KFP's own compiler. So the imports
run one way, components → ``pipelines.steps``, and the pipeline layer never loads this package.
The files are written by ``python -m components.specs`` (``make specs``) and a test recompiles
each component and compares, so a spec never lags the function it was compiled from.

    python -m components.specs            # rewrite every spec
    python -m components.specs --check    # exit 1 naming each stale or missing spec
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

SPECS = Path(__file__).resolve().parent / "specs"
# each component: the function components.<name>.<name>, compiled to specs/<name>.yaml
NAMES = ("prepare_data", "build_retriever_index", "warm_start", "train", "evaluate", "profile", "register",
         "compare")


def component(name: str) -> Any:
    """The component function ``name`` (its module is ``components.<name>``)."""
    import importlib

    if name not in NAMES:
        raise ValueError(f"no component {name!r}; the components are {', '.join(NAMES)}")
    return getattr(importlib.import_module(f"components.{name}"), name)


def spec_text(name: str) -> str:
    """Component ``name`` compiled to its YAML spec by KFP's compiler."""
    from kfp import compiler

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.yaml"
        compiler.Compiler().compile(component(name), package_path=str(path))
        return path.read_text()


def stale(folder: Path = SPECS) -> list[str]:
    """The components whose spec in ``folder`` is missing or differs from a fresh compile."""
    return [n for n in NAMES if not (folder / f"{n}.yaml").is_file()
            or (folder / f"{n}.yaml").read_text() != spec_text(n)]


def write_specs(folder: Path = SPECS) -> list[Path]:
    """Compile every component into ``folder``; returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in NAMES:
        path = folder / f"{name}.yaml"
        path.write_text(spec_text(name))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m components.specs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a spec is stale or missing")
    args = ap.parse_args(argv)
    if args.check:
        out = stale()
        for name in out:
            print(f"components/specs/{name}.yaml is stale: run `python -m components.specs`", file=sys.stderr)
        return 1 if out else 0
    for path in write_specs():
        print(f"wrote {path.relative_to(SPECS.parents[1])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
