"""Evaluation results: the result objects, their JSON form, the paper-style comparison table, the
markdown summary, and logging through :class:`~trace_core.tracking.Tracker`.

The comparison table is laid out like the paper's main table: one table per task family, rows =
methods or checkpoints, columns = benchmarks (in-domain first, then out-of-domain) and their
averages, values in percent with the best of each column in bold::

    | Method | Arith | KB-QA | ... | Avg |
"""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_core.evaluation.benchmarks import FAMILY_LABELS
from trace_core.evaluation.metrics import finite
from trace_core.tracking import Tracker

FAMILY_ORDER = ("math", "qa", "fc")
RESULT_FORMAT = "trace-eval-result/1"


@dataclass
class BenchmarkResult:
    """One benchmark's metrics (keys: ``pass_at_1``, ``pass_at_<j>``, ``greedy_acc``, the family's
    answer metrics and their greedy values (QA: ``em``, ``f1``, ``greedy_em``, ``greedy_f1``),
    ``tool_calls``, ``turns``, ``gen_tokens``, ``total_tokens``, ``answered``, ``tool_error_rate``,
    ``examples``, ``samples``, ``prompt_too_long``)."""

    name: str
    label: str
    family: str
    domain: str  # "in" | "out"
    source: str  # the file its examples came from
    metrics: dict[str, float]


@dataclass
class EvalResult:
    """A checkpoint's evaluation: per-benchmark metrics, family averages, where the files are."""

    name: str
    checkpoint: str
    primary_metric: str  # the comparison table's metric: "pass_at_1" or "greedy_acc"
    samples: int  # k
    greedy: bool
    benchmarks: dict[str, BenchmarkResult]  # in configured order
    averages: dict[str, float]  # "<family>/<in_domain|out_of_domain|all>/<metric>" -> value
    wall_s: float = 0.0
    rollout: dict[str, dict[str, float]] = field(default_factory=dict)  # "<family>/<sampled|greedy>" -> stats
    files: dict[str, str] = field(default_factory=dict)  # "examples" / "result" / "summary" -> path
    config: dict[str, Any] = field(default_factory=dict)  # the EvalConfig as plain data

    def flat_metrics(self, prefix: str = "") -> dict[str, float]:
        """Every finite metric as ``{prefix}<benchmark>/<key>`` and ``{prefix}avg/<family>/<scope>/<key>``."""
        out = {}
        for b in self.benchmarks.values():
            out.update({f"{prefix}{b.name}/{k}": v for k, v in finite(b.metrics).items()})
        out.update({f"{prefix}avg/{k}": v for k, v in finite(self.averages).items()})
        return out

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["format"] = RESULT_FORMAT
        data["benchmarks"] = [asdict(b) for b in self.benchmarks.values()]
        return _json_safe(data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EvalResult:
        if data.get("format") != RESULT_FORMAT:
            raise ValueError(f"not an evaluation result: format {data.get('format')!r}, expected {RESULT_FORMAT!r}")
        fields = dict(data)
        fields.pop("format")
        fields["benchmarks"] = {b["name"]: BenchmarkResult(**{**b, "metrics": _floats(b["metrics"])})
                                for b in data["benchmarks"]}
        fields["averages"] = _floats(data["averages"])
        return cls(**fields)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> EvalResult:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"evaluation result {path} does not exist")
        return cls.from_json(json.loads(path.read_text()))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no NaN; read back as NaN by _floats
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _floats(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {k: float("nan") if v is None else float(v) for k, v in metrics.items()}


# ----------------------------------------------------------------------------------------- tables
def metric_label(metric: str) -> str:
    """``pass_at_1`` -> ``pass@1``; ``greedy_acc`` -> ``greedy accuracy``."""
    if metric.startswith("pass_at_"):
        return "pass@" + metric[len("pass_at_"):]
    labels = {"greedy_acc": "greedy accuracy", "em": "EM", "f1": "F1", "greedy_em": "greedy EM",
              "greedy_f1": "greedy F1"}
    return labels.get(metric, metric)


def _fmt(value: float | None, percent: bool) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{100 * value:.1f}" if percent else f"{value:.3f}"


def comparison_table(results: Mapping[str, EvalResult], metric: str | None = None, percent: bool = True,
                     bold_best: bool = True) -> str:
    """The paper's main-table layout, in markdown: per task family, rows = ``results`` (method or
    checkpoint names, in the given order) and columns = benchmarks, in-domain first, then
    out-of-domain, with averages (``ID Avg`` / ``OOD Avg`` over two or more benchmarks of a scope,
    ``Avg`` over all when both scopes are present or the family has one scope). Averages are each
    row's own (its :attr:`EvalResult.averages`); a benchmark a row lacks shows ``–``. With two or more
    rows the best value of a column is bold (unless the whole column ties).

    ``metric``: the metric key to show (default: each result's primary metric, which must agree)."""
    if not results:
        raise ValueError("results must not be empty")
    if metric is None:
        primaries = {r.primary_metric for r in results.values()}
        if len(primaries) != 1:
            raise ValueError(f"results have different primary metrics {sorted(primaries)}: pass metric=...")
        metric = primaries.pop()
    sections = []
    for family in FAMILY_ORDER:
        columns: dict[str, tuple[str, str]] = {}  # benchmark name -> (label, domain), first-seen order
        for r in results.values():
            for b in r.benchmarks.values():
                if b.family == family and b.name not in columns:
                    columns[b.name] = (b.label, b.domain)
        if not columns:
            continue
        ins = [n for n, (_, d) in columns.items() if d == "in"]
        outs = [n for n, (_, d) in columns.items() if d == "out"]
        header: list[tuple[str, Any]] = [(columns[n][0], n) for n in ins]
        both = bool(ins) and bool(outs)
        if len(ins) >= 2 and both:
            header.append(("ID Avg", ("in_domain",)))
        header += [(columns[n][0], n) for n in outs]
        if len(outs) >= 2 and both:
            header.append(("OOD Avg", ("out_of_domain",)))
        if both or len(columns) >= 2:
            header.append(("Avg", ("all",)))
        rows = []
        for name, r in results.items():
            values = []
            for _, key in header:
                if isinstance(key, tuple):
                    values.append(r.averages.get(f"{family}/{key[0]}/{metric}"))
                else:
                    b = r.benchmarks.get(key)
                    values.append(b.metrics.get(metric) if b is not None else None)
            rows.append((name, values))
        cells = [[_fmt(v, percent) for v in values] for _, values in rows]
        if bold_best and len(rows) >= 2:
            for j in range(len(header)):
                col = [v[j] for _, v in rows]
                finite_vals = [v for v in col if v is not None and math.isfinite(v)]
                if finite_vals and max(finite_vals) > min(finite_vals):  # a column of ties marks nothing
                    best = max(finite_vals)
                    for i, v in enumerate(col):
                        if v is not None and math.isfinite(v) and math.isclose(v, best, abs_tol=1e-12):
                            cells[i][j] = f"**{cells[i][j]}**"
        unit = " (%)" if percent else ""
        lines = [f"### {FAMILY_LABELS[family]}: {metric_label(metric)}{unit}", "",
                 "| Method | " + " | ".join(h for h, _ in header) + " |",
                 "|---|" + "---:|" * len(header)]
        lines += [f"| {name} | " + " | ".join(c) + " |" for (name, _), c in zip(rows, cells, strict=True)]
        sections.append("\n".join(lines))
    if not sections:
        raise ValueError("the results hold no benchmarks")
    return "\n\n".join(sections) + "\n"


DETAIL_COLUMNS = (
    ("examples", "n"), ("pass_at_1", "pass@1"), ("greedy_acc", "greedy"), ("em", "EM"), ("f1", "F1"),
    ("tool_calls", "tool calls"), ("turns", "turns"), ("gen_tokens", "gen tokens"),
    ("total_tokens", "total tokens"), ("answered", "answered"), ("tool_error_rate", "tool errors/turn"),
    ("prompt_too_long", "too long"),
)
_COUNTS = ("examples", "prompt_too_long")
_RATES = ("pass_at_1", "greedy_acc", "em", "f1", "answered", "tool_error_rate")


def detail_table(result: EvalResult) -> str:
    """Every benchmark's metrics, one row each (rates in %, means of tool calls/turns/tokens)."""
    extra = sorted({k for b in result.benchmarks.values() for k in b.metrics
                    if k.startswith("pass_at_") and k != "pass_at_1"}, key=lambda k: int(k.rsplit("_", 1)[1]))
    columns = list(DETAIL_COLUMNS[:2]) + [(k, metric_label(k)) for k in extra] + list(DETAIL_COLUMNS[2:])
    lines = ["| Benchmark | family | domain | " + " | ".join(h for _, h in columns) + " |",
             "|---|---|---|" + "---:|" * len(columns)]
    for b in result.benchmarks.values():
        cells = []
        for key, _ in columns:
            v = b.metrics.get(key)
            if key in _COUNTS:
                cells.append("–" if v is None else str(int(v)))
            elif key in _RATES or key.startswith("pass_at_"):
                cells.append(_fmt(v, True))
            else:
                cells.append("–" if v is None or not math.isfinite(v) else f"{v:.1f}")
        lines.append(f"| {b.label} | {b.family} | {b.domain} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def summary_markdown(result: EvalResult) -> str:
    """The markdown summary logged with a run: settings, the comparison row, the detail table."""
    sampling = f"k = {result.samples} samples" if result.samples else "no sampled runs"
    parts = [
        f"# Evaluation: {result.name}",
        "",
        f"- checkpoint: `{result.checkpoint}`",
        f"- {sampling}; greedy: {'yes' if result.greedy else 'no'}; "
        f"table metric: {metric_label(result.primary_metric)}",
        f"- wall time: {result.wall_s:.1f} s",
        "",
        comparison_table({result.name: result}),
        "### Details (rates in %)",
        "",
        detail_table(result),
    ]
    return "\n".join(parts)


# ----------------------------------------------------------------------------------------- logging
def artifact_name(name: str) -> str:
    """A result name as a file/folder name."""
    out = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")
    return out or "eval"


def evaluation_params(result: EvalResult, prefix: str = "eval/") -> dict[str, Any]:
    """The evaluation's settings as MLflow parameters, ``{prefix}<dotted key>``: only the agent and
    environment settings of the families it evaluated (a QA evaluation logs no math or fc agent), and
    no result name in the key, so that the runs of different methods share their parameter names in
    the MLflow compare view."""
    from trace_core.config import flatten

    families = {key.split("/", 1)[0] for key in result.averages}
    out = {}
    for key, value in flatten(result.config).items():
        head, _, rest = key.partition(".")
        if head in ("agents", "envs") and rest.partition(".")[0] not in families:
            continue
        if key == "name":
            continue
        out[f"{prefix}{key}"] = value
    return out


def log_result(tracker: Tracker, result: EvalResult, step: int = 0, prefix: str = "eval/") -> None:
    """Metrics, the result JSON, the per-example table and the markdown summary, via ``tracker``."""
    folder = f"{prefix.strip('/') or 'eval'}/{artifact_name(result.name)}"
    tracker.set_tags({"trace.kind": "evaluation", f"trace.eval.{artifact_name(result.name)}": result.checkpoint})
    params = evaluation_params(result, prefix)
    if params:
        tracker.log_params(params)
    tracker.log_metrics(result.flat_metrics(prefix), step=step)
    tracker.log_dict(result.to_json(), f"{folder}/result.json")
    # Logged as one directory: the tracker's spool copy of a single file carries a sequence prefix
    # in its name, a directory's contents keep theirs.
    with tempfile.TemporaryDirectory() as tmp:
        for key in ("examples", "summary"):
            path = result.files.get(key)
            if path and Path(path).is_file():
                shutil.copy2(path, Path(tmp) / Path(path).name)
        if any(Path(tmp).iterdir()):
            tracker.log_artifact(tmp, folder)
    tracker.flush()
