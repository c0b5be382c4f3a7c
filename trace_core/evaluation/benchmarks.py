"""Which benchmarks exist, where their examples come from, and how a configured list is loaded.

A benchmark is named in :data:`KNOWN_BENCHMARKS` (method §9 plus the embedded data's test splits)
and configured by a :class:`BenchmarkConfig`:

* with ``file``: the published file, read by the dataset's loader in :mod:`trace_core.data.loaders`
  (AIME24 parquet, GPQA csv, a BFCL question file with its ``possible_answer/`` twin, ...), or a
  normalized JSONL when ``loader="jsonl"``;
* without ``file``: the embedded default test split under ``data_dir`` (``math/test.jsonl``,
  ``qa/test.jsonl``, ``fc/test.jsonl`` split by BFCL category). Benchmarks without embedded data
  (the real AIME24, HotpotQA, ...) need their file.

BFCL benchmarks keep only their category and, from a published file, only the test scenarios of
the 80/20 split (:func:`trace_core.data.bfcl.bfcl_split`), so training scenarios never leak in.
Any other name works too when ``family`` (and ``file``) are given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trace_core.data.schema import TASKS, Example
from trace_core.evaluation.metrics import DOMAINS

JSONL = "jsonl"  # loader name of a normalized JSONL file (trace_core.data.validation.load_validated)


@dataclass(frozen=True)
class KnownBenchmark:
    """A benchmark's defaults: family, domain, table label and where its examples come from."""

    name: str
    label: str  # column header in the comparison table
    family: str  # math | qa | fc
    domain: str  # "in" (the training distribution) | "out" (out-of-domain)
    loader: str  # trace_core.data.loaders dataset name, or "jsonl"
    embedded: str | None = None  # path under data_dir of the embedded default split, if any
    category: str | None = None  # BFCL category the benchmark keeps
    split: str | None = None  # keep only examples labelled with this split (BFCL: "test")


def _bfcl(name: str, label: str) -> KnownBenchmark:
    return KnownBenchmark(f"bfcl_{name}", label, "fc", "in", "bfcl", "fc/test.jsonl",
                          category=f"multi_turn_{name}", split="test")


KNOWN_BENCHMARKS: dict[str, KnownBenchmark] = {b.name: b for b in (
    # math with a Python tool (trained on DeepScaleR / the embedded arithmetic problems)
    KnownBenchmark("arith", "Arith", "math", "in", JSONL, "math/test.jsonl"),
    KnownBenchmark("aime24", "AIME24", "math", "in", "aime24"),
    KnownBenchmark("amc23", "AMC23", "math", "in", "amc23"),
    KnownBenchmark("math500", "MATH500", "math", "in", "math500"),
    KnownBenchmark("minervamath", "Minerva", "math", "in", "minervamath"),
    KnownBenchmark("olympiadbench", "Olympiad", "math", "in", "olympiadbench"),
    KnownBenchmark("mmlu_pro", "MMLU-Pro", "math", "out", "mmlu_pro"),
    KnownBenchmark("arc_challenge", "ARC-c", "math", "out", "arc_challenge"),
    KnownBenchmark("gpqa_diamond", "GPQA", "math", "out", "gpqa_diamond"),
    # multi-hop QA with a search tool (trained on HotpotQA / the embedded knowledge base)
    KnownBenchmark("kbqa", "KB-QA", "qa", "in", JSONL, "qa/test.jsonl"),
    KnownBenchmark("hotpotqa", "HotpotQA", "qa", "in", "hotpotqa"),
    KnownBenchmark("2wikimultihopqa", "2Wiki", "qa", "out", "2wikimultihopqa"),
    KnownBenchmark("musique", "MuSiQue", "qa", "out", "musique"),
    KnownBenchmark("bamboogle", "Bamboogle", "qa", "out", "bamboogle"),
    # BFCL v4 multi-turn (80/20 split per scenario; test subsets)
    _bfcl("base", "Base"),
    _bfcl("long_context", "Long-Context"),
    _bfcl("miss_func", "Miss-Func"),
    _bfcl("miss_param", "Miss-Param"),
)}

# What a family name means in a benchmark list: its embedded default test benchmarks.
FAMILY_DEFAULTS: dict[str, tuple[str, ...]] = {
    "math": ("arith",),
    "qa": ("kbqa",),
    "fc": ("bfcl_base", "bfcl_long_context", "bfcl_miss_func", "bfcl_miss_param"),
}
FAMILY_LABELS = {"math": "Math", "qa": "Multi-hop QA", "fc": "Function calling (BFCL v4 multi-turn)"}


@dataclass(frozen=True)
class BenchmarkConfig:
    """One benchmark to evaluate (see the module docstring)."""

    name: str  # a KNOWN_BENCHMARKS key, or any name when family is given; unique in a list
    file: str | None = None  # published-format file (or normalized JSONL); None = the embedded split
    family: str | None = None  # math | qa | fc; None = the known benchmark's
    loader: str | None = None  # trace_core.data.loaders name or "jsonl"; None = the known one's
    domain: str | None = None  # "in" | "out"; None = the known one's ("in" for unknown names)
    label: str | None = None  # table column; None = the known one's (the name for unknown names)
    max_examples: int | None = None  # evaluate only the first N examples (after filtering); None = all

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("BenchmarkConfig.name must be non-empty")
        known = KNOWN_BENCHMARKS.get(self.name)
        if known is None and self.family is None:
            raise ValueError(f"benchmark {self.name!r} is not known ({', '.join(KNOWN_BENCHMARKS)}): "
                             "give its family (and file)")
        if self.family is not None and self.family not in TASKS:
            raise ValueError(f"benchmark {self.name!r}: family {self.family!r} must be one of {TASKS}")
        if known is not None and self.family not in (None, known.family):
            raise ValueError(f"benchmark {self.name!r} is a {known.family} benchmark, not {self.family}")
        if self.domain is not None and self.domain not in DOMAINS:
            raise ValueError(f"benchmark {self.name!r}: domain {self.domain!r} must be one of {DOMAINS}")
        if self.max_examples is not None and self.max_examples < 1:
            raise ValueError(f"benchmark {self.name!r}: max_examples must be >= 1 or None, got {self.max_examples}")
        if known is None and self.file is None:
            raise ValueError(f"benchmark {self.name!r} has no embedded data: give its file")
        if self.file is None and known is not None and known.embedded is None:
            raise ValueError(f"benchmark {self.name!r} has no embedded data: give its file (the published "
                             f"{known.loader} format)")


@dataclass
class Benchmark:
    """A loaded benchmark: its resolved settings and examples."""

    name: str
    label: str
    family: str
    domain: str
    source: str  # where the examples came from (file path)
    examples: list[Example] = field(default_factory=list)


def benchmark_list(items: Iterable[str], files: Mapping[str, str] | None = None,
                   max_examples: int | None = None) -> list[BenchmarkConfig]:
    """Benchmark configs from names: a family name (``math``, ``qa``, ``fc``) stands for its
    embedded defaults; ``files`` maps benchmark names to their files (named benchmarks that are
    not in ``items`` are added)."""
    files = dict(files or {})
    names: list[str] = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        names += FAMILY_DEFAULTS.get(item, (item,))
    names += [n for n in files if n not in names]
    if not names:
        raise ValueError("the benchmark list is empty")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"benchmarks listed twice: {dupes}")
    return [BenchmarkConfig(n, file=files.get(n), max_examples=max_examples) for n in names]


def default_benchmarks() -> list[BenchmarkConfig]:
    """Every embedded default test benchmark (math, qa, fc)."""
    return benchmark_list(FAMILY_DEFAULTS)


def load_benchmarks(configs: Sequence[BenchmarkConfig], data_dir: str | Path = "data",
                    validate: bool = True) -> list[Benchmark]:
    """Load every configured benchmark (a file shared by several is read once)."""
    names = [c.name for c in configs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"benchmark names must be unique, got {dupes} more than once")
    if not configs:
        raise ValueError("the benchmark list is empty")
    cache: dict[tuple[str, str], list[Example]] = {}
    return [_load_one(c, Path(data_dir), validate, cache) for c in configs]


def _load_one(config: BenchmarkConfig, data_dir: Path, validate: bool,
              cache: dict[tuple[str, str], list[Example]]) -> Benchmark:
    known = KNOWN_BENCHMARKS.get(config.name)
    family = config.family or (known.family if known else "")
    loader = config.loader or (known.loader if known else JSONL)
    if config.file is not None:
        path = Path(config.file)
    else:
        assert known is not None and known.embedded is not None  # checked in BenchmarkConfig
        path = data_dir / known.embedded
        loader = JSONL
    if not path.is_file():
        hint = "" if config.file else " (generate the embedded data: python -m trace_core.data.generate --out data)"
        raise ValueError(f"benchmark {config.name!r}: file {path} does not exist{hint}")
    key = (loader, str(path.resolve()))
    if key not in cache:
        cache[key] = _read(loader, path, validate)
    examples = list(cache[key])
    if known is not None and known.category is not None:
        examples = [e for e in examples if e.metadata.get("category") == known.category]
    if known is not None and known.split is not None and config.file is not None:
        examples = [e for e in examples if e.split == known.split]
    wrong = [e.id for e in examples if e.task != family]
    if wrong:
        raise ValueError(f"benchmark {config.name!r} is a {family} benchmark but {path} holds "
                         f"{len(wrong)} examples of another task (e.g. {wrong[0]!r})")
    if config.max_examples is not None:
        examples = examples[: config.max_examples]
    if not examples:
        raise ValueError(f"benchmark {config.name!r}: no examples left in {path}"
                         + (f" for category {known.category}" if known and known.category else ""))
    return Benchmark(
        name=config.name,
        label=config.label or (known.label if known else config.name),
        family=family,
        domain=config.domain or (known.domain if known else "in"),
        source=str(path),
        examples=examples,
    )


def _read(loader: str, path: Path, validate: bool) -> list[Example]:
    if loader == JSONL:
        if validate:
            from trace_core.data.validation import load_validated

            rows = load_validated(path)
        else:
            from trace_core.data.validation import read_jsonl

            rows = [Example.from_record(r) for r in read_jsonl(path)[0]]
        if rows and not isinstance(rows[0], Example):
            raise ValueError(f"{path} holds corpus passages, not examples")
        return list(rows)  # type: ignore[arg-type]
    from trace_core.data.loaders import BFCL, load_dataset

    # Benchmarks are test data; BFCL keeps its per-scenario split labels (filtered by the caller).
    return load_dataset(loader, path, split=None if loader == BFCL else "test", validate=validate)
