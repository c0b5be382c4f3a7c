"""CLI: ``python -m trace_core.evaluation --checkpoint DIR --benchmarks math,qa,fc [--k 4] [--data data]``.

Settings come from the :class:`~trace_core.evaluation.config.EvalConfig` defaults, then ``--config``
(YAML), then ``--set key=value`` overrides, then the flags below. The comparison table is printed
(with ``--compare NAME=result.json`` rows from earlier evaluations above this one), and
``result.json``, ``examples.jsonl`` and ``summary.md`` are written to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from trace_core.evaluation.benchmarks import FAMILY_DEFAULTS, KNOWN_BENCHMARKS, benchmark_list
from trace_core.evaluation.config import EvalConfig

FAMILIES = tuple(FAMILY_DEFAULTS)


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item or not item.split("=", 1)[0] or not item.split("=", 1)[1]:
            raise ValueError(f"{flag} {item!r} must look like NAME=PATH")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def build_parser() -> argparse.ArgumentParser:
    known = ", ".join(KNOWN_BENCHMARKS)
    p = argparse.ArgumentParser(
        prog="python -m trace_core.evaluation",
        description="Evaluate a policy checkpoint through the training agent loop on a list of benchmarks: "
        "pass@1 averaged over k samples, unbiased pass@k, greedy accuracy, EM/F1 (QA), tool calls, turns and "
        "lengths per benchmark, in-/out-of-domain averages; results to files, MLflow and a paper-style table. "
        "The untrained ReAct baseline is this command on the initial checkpoint (e.g. runs/warm/policy).",
        epilog=f"Benchmarks: a family ({', '.join(FAMILIES)}) stands for its embedded test sets; known names: "
        f"{known}. Those without embedded data need --file NAME=PATH (the published format).\n\n"
        "Example:\n  python -m trace_core.evaluation --checkpoint runs/warm/policy --benchmarks qa --samples 4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint", required=True, help="policy directory (save_pretrained: model + tokenizer)")
    p.add_argument("--benchmarks", default=None,
                   help="comma-separated families and/or benchmark names (default: the config's, i.e. math,qa,fc)")
    p.add_argument("--file", action="append", default=[], metavar="NAME=PATH",
                   help="a benchmark's file in its published format (repeatable; adds the benchmark)")
    p.add_argument("--data", default=None, help="embedded data directory (default: data)")
    p.add_argument("--k", type=int, default=None,
                   help="samples per example, k, for pass@1 averaged over k (0: greedy only)")
    p.add_argument("--pass-at", default=None, help="extra pass@j values to report, comma-separated (each <= k)")
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy pass")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (every family)")
    p.add_argument("--max-turns", type=int, default=None, help="model turns per episode (every family)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per model turn (every family)")
    p.add_argument("--max-total-tokens", type=int, default=None, help="tokens per episode history (every family)")
    p.add_argument("--max-examples", type=int, default=None,
                   help="evaluate only the first N examples of each benchmark")
    p.add_argument("--qa-index", default=None, help="QA retriever index directory (built from the corpus if empty)")
    p.add_argument("--engine", choices=("vllm", "hf"), default=None, help="rollout engine (default: vllm)")
    p.add_argument("--dtype", default=None, help="engine dtype (float32, bfloat16, float16)")
    p.add_argument("--max-model-len", type=int, default=None, help="engine context length (default: from the agents)")
    p.add_argument("--kv-cache-mb", type=int, default=None, help="engine KV cache on CPU, MiB")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--name", default=None, help="row name in the table (default: from the checkpoint path)")
    p.add_argument("--out", default=None, help="output directory (default: runs/eval/<name>)")
    p.add_argument("--tracking-uri", default=None, help="log to this MLflow tracking URI (http://... or sqlite:///...)")
    p.add_argument("--experiment", default="trace-rl-eval", help="MLflow experiment (with --tracking-uri)")
    p.add_argument("--config", default=None, help="EvalConfig YAML")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--compare", action="append", default=[], metavar="NAME=RESULT_JSON",
                   help="an earlier result.json to show as a row above this one (repeatable)")
    return p


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    from trace_core.config import load_config
    from trace_core.tracking import TrackingConfig

    cfg = load_config(EvalConfig, args.config, args.set)
    changes: dict = {}
    files = _pairs(args.file, "--file")
    if args.benchmarks is not None or files or args.max_examples is not None:
        items = args.benchmarks.split(",") if args.benchmarks is not None else (
            [] if files else [b.name for b in cfg.benchmarks])
        changes["benchmarks"] = benchmark_list(items, files, args.max_examples)
    for flag, key in (("data", "data_dir"), ("k", "samples"), ("seed", "seed"), ("name", "name"),
                      ("out", "output_dir")):
        if getattr(args, flag) is not None:
            changes[key] = getattr(args, flag)
    if args.pass_at is not None:
        changes["pass_at"] = [int(x) for x in args.pass_at.split(",") if x.strip()]
    if args.no_greedy:
        changes["greedy"] = False
    agent_changes = {k: v for k, v in (("temperature", args.temperature), ("max_turns", args.max_turns),
                                         ("max_new_tokens", args.max_new_tokens),
                                         ("max_total_tokens", args.max_total_tokens)) if v is not None}
    if agent_changes:
        changes["agents"] = dataclasses.replace(cfg.agents, **{
            f: dataclasses.replace(cfg.agents.of(f), **agent_changes) for f in FAMILIES})
    engine_changes = {k: v for k, v in (("kind", args.engine), ("dtype", args.dtype),
                                          ("max_model_len", args.max_model_len),
                                          ("kv_cache_mb", args.kv_cache_mb)) if v is not None}
    if engine_changes:
        changes["engine"] = dataclasses.replace(cfg.engine, **engine_changes)
    if args.qa_index is not None:
        changes["envs"] = dataclasses.replace(cfg.envs, qa=dataclasses.replace(cfg.envs.qa, index_dir=args.qa_index))
    if args.tracking_uri is not None:
        changes["tracking"] = TrackingConfig(tracking_uri=args.tracking_uri, experiment=args.experiment)
    return dataclasses.replace(cfg, **changes)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from trace_core.evaluation.report import EvalResult, comparison_table
    from trace_core.evaluation.runner import evaluate

    config = config_from_args(args)
    earlier = {name: EvalResult.load(path) for name, path in _pairs(args.compare, "--compare").items()}
    result = evaluate(Path(args.checkpoint), config)
    rows = {**earlier, result.name: result}
    print(comparison_table(rows, metric=result.primary_metric))
    print(f"results: {result.files.get('result')}  per-example: {result.files.get('examples')}  "
          f"summary: {result.files.get('summary')}  ({result.wall_s:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
