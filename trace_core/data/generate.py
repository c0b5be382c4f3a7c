"""The embedded default data: generate it, and verify it against ``data.dvc``.

``python -m trace_core.data.generate --out data/`` writes (and validates: an invalid file prints
its report, rows and rules, and exits with status 2)::

    data/MANIFEST.json          sizes, seeds, generator version, the bfcl-eval version used
    data/math/{train,test}.jsonl    arithmetic/algebra word problems (arith.py)
    data/qa/{train,test}.jsonl      2-4-hop questions over the fictional KB (kb.py)
    data/qa/corpus.jsonl            the KB's passages, the search tool's documents
    data/qa/kb.json                 the KB itself (entities, attributes, relations)
    data/fc/{train,test}.jsonl      the BFCL v4 multi-turn subset, all four categories (bfcl.py)

Everything is byte-for-byte deterministic (hash-seeded draws, fixed key order, no floats of our
own), so ``data/`` is tracked by ``data.dvc`` and a fresh clone without a DVC remote can run
``python -m trace_core.data.generate --verify``: it regenerates ``data/`` and checks the DVC
directory md5 against ``outs[0].md5`` of ``data.dvc``. The BFCL part copies bfcl-eval's shipped
files, so it is reproducible for the bfcl-eval version recorded in the manifest.

The md5 is computed by ``dvc_data`` (DVC's own hashing), imported only by :func:`dvc_dir_md5`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_core.data import arith, bfcl, kb
from trace_core.data.reading import DataValidationError, ReadConfig
from trace_core.data.schema import Example, Passage, jsonl_line

GENERATOR_VERSION = 1  # bump when the output of an unchanged config changes
MANIFEST = "MANIFEST.json"


@dataclass(frozen=True)
class GenerateConfig:
    """Everything that determines the embedded data."""

    arith: arith.ArithConfig = field(default_factory=arith.ArithConfig)
    kb: kb.KBConfig = field(default_factory=kb.KBConfig)
    bfcl_scenarios: int = 60  # BFCL scenarios kept (x4 categories), 80 % train / 20 % test


def write_jsonl(path: Path, rows: list[Example] | list[Passage]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        for row in rows:
            fh.write(jsonl_line(row.to_record()) + "\n")


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, ensure_ascii=False, indent=1, sort_keys=True, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8", newline="\n")


def _write_all(out: Path, config: GenerateConfig) -> dict[str, int]:
    counts: dict[str, int] = {}

    def put(rel: str, rows: list[Example] | list[Passage]) -> None:
        write_jsonl(out / rel, rows)
        counts[rel] = len(rows)

    math_splits = arith.generate(config.arith)
    for split, rows in math_splits.items():
        put(f"math/{split}.jsonl", rows)
    entities, passages, qa_splits = kb.generate(config.kb)
    for split, rows in qa_splits.items():
        put(f"qa/{split}.jsonl", rows)
    put("qa/corpus.jsonl", passages)
    write_json(out / "qa/kb.json", kb.kb_record(entities))
    counts["qa/kb.json"] = len(entities)
    subset = bfcl.bfcl_subset(config.bfcl_scenarios)
    for split in ("train", "test"):
        put(f"fc/{split}.jsonl", [ex for ex in subset if ex.split == split])
    write_json(
        out / MANIFEST,
        {
            "generator_version": GENERATOR_VERSION,
            "config": asdict(config),
            "bfcl_eval_version": bfcl.bfcl_version(),
            "counts": counts,
        },
    )
    return counts


def generate(out: str | Path, config: GenerateConfig = GenerateConfig()) -> dict[str, int]:
    """Write the embedded data to ``out`` (replacing an earlier generation); returns row counts.

    ``out`` must be absent, empty, or an earlier output (it has a MANIFEST.json): a directory of
    other files is never deleted. The data is written to a sibling temporary directory first, so
    a failure leaves ``out`` as it was.
    """
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise ValueError(f"--out {out} is a non-empty directory without {MANIFEST}; refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the data directory is not
    try:
        counts = _write_all(staging, config)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return counts


def validate_dir(root: str | Path, read: ReadConfig | None = None) -> dict[str, str]:
    """Run every generated file through its Great Expectations suite; returns file -> kind."""
    from trace_core.data.validation import load_validated  # lazy: GX takes seconds to import

    root = Path(root)
    kinds = {}
    for path in sorted(root.rglob("*.jsonl")):
        rows = load_validated(path, read=read)
        kinds[str(path.relative_to(root))] = (
            "corpus" if rows and isinstance(rows[0], Passage) else rows[0].task
        )
    return kinds


def dvc_dir_md5(path: str | Path) -> str:
    """The md5 DVC records for a directory output (``"<md5>.dir"``), computed by dvc_data."""
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs.local import LocalFileSystem

    fs = LocalFileSystem()
    with tempfile.TemporaryDirectory() as odb_dir:
        _, _, obj = build(HashFileDB(fs, odb_dir), str(Path(path).resolve()), fs, "md5")
    return obj.hash_info.value


def dvc_recorded_md5(dvc_file: str | Path) -> str:
    """``outs[0].md5`` of a ``.dvc`` file (a tiny YAML; read without a YAML parser)."""
    dvc_file = Path(dvc_file)
    if not dvc_file.is_file():
        raise ValueError(f"{dvc_file} not found; run `dvc add data` once to create it")
    for line in dvc_file.read_text(encoding="utf-8").splitlines():
        key, _, value = line.strip().lstrip("- ").partition(":")
        if key == "md5":
            return value.strip()
    raise ValueError(f"{dvc_file}: no outs md5 entry")


@dataclass(frozen=True)
class Verification:
    expected: str  # outs[0].md5 of data.dvc
    actual: str  # md5 of the regenerated directory
    seconds: float  # generation + hashing time

    @property
    def ok(self) -> bool:
        return self.expected == self.actual


def verify(
    data_dir: str | Path = "data",
    dvc_file: str | Path = "data.dvc",
    config: GenerateConfig = GenerateConfig(),
) -> Verification:
    """Regenerate ``data_dir`` and compare its DVC md5 with the one recorded in ``dvc_file``."""
    start = time.perf_counter()
    expected = dvc_recorded_md5(dvc_file)
    generate(data_dir, config)
    actual = dvc_dir_md5(data_dir)
    return Verification(expected, actual, time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trace_core.data.generate", description=__doc__.split("\n")[0],
        epilog="Example:\n  python -m trace_core.data.generate --out data --verify   # regenerate and check data.dvc",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="data", help="output directory (default: data)")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="regenerate --out and check its md5 against --dvc-file (exit 1 on mismatch)",
    )
    parser.add_argument(
        "--dvc-file", default="data.dvc", help="the .dvc file to verify against (default: data.dvc)"
    )
    parser.add_argument("--no-validate", action="store_true", help="skip the Great Expectations suites")
    parser.add_argument(
        "--max-row-bytes", type=int, default=ReadConfig.max_row_bytes,
        help=f"largest row the validation accepts, in bytes (default: {ReadConfig.max_row_bytes})",
    )
    args = parser.parse_args(argv)
    try:
        read = ReadConfig(max_row_bytes=args.max_row_bytes)
    except ValueError as err:
        parser.error(str(err))  # exits with status 2
    if args.verify:
        result = verify(args.out, args.dvc_file)
        status = "OK" if result.ok else "MISMATCH"
        print(
            f"{status}: regenerated {args.out} in {result.seconds:.2f} s; md5 {result.actual} "
            f"(recorded in {args.dvc_file}: {result.expected})"
        )
        if result.ok:
            print(f"to put it in the local DVC cache: dvc commit -f {args.dvc_file}")
        else:
            print(
                "the generators, their config or the bfcl-eval version differ from those that produced "
                f"{args.dvc_file}; see {Path(args.out) / MANIFEST}",
                file=sys.stderr,
            )
        return 0 if result.ok else 1
    start = time.perf_counter()
    counts = generate(args.out)
    elapsed = time.perf_counter() - start
    for rel, n in counts.items():
        print(f"{rel:22s} {n:6d}")
    print(f"generated {args.out} in {elapsed:.2f} s")
    if not args.no_validate:
        try:
            kinds = validate_dir(args.out, read)
        except DataValidationError as err:  # the report is the message: no traceback above it
            print(err, file=sys.stderr)
            return 2
        print(f"validated {len(kinds)} files: " + ", ".join(f"{k} ({v})" for k, v in kinds.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
