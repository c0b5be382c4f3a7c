"""The real pretrained policy at its warm start: its own spread over the pool, its held-out pass@1.

Rolls every pool question out ``--pool-k`` times and every held-out question ``--heldout-k``
times at T = 1 through the real executor (vLLM, the sandboxed Python tool), with request seeds
derived from fixed names, so a trained policy measured later with the same seeds is compared
question by question. Reports:

- the pool's spread: the histogram of per-question successes, the shares never / always solved
  and mixed, GRPO's expected step-0 effective ratio at G = k (the mixed share) and the largest
  share of the mixed questions in one interior bin;
- held-out pass@1 with its standard error by question (``trace_core.metrics.pass_at_1``), and
  broken down by chain depth and by whether a part is in a wording the warm start never showed;
- the per-question success counts (what later paired comparisons read).

Aims (the task's calibration, reported, not tuned against): GRPO's expected effective ratio on
the pool in [0.15, 0.45]; no interior bin above half of the mixed questions.

Writes ``bench/results/real_policy.json`` and ``.png`` (the trees under ``OUT/measure/``). Example (the warm
start, then this
measurement)::

    python -m trace_core.warmstart.pretrained --out runs/smollm2   # the warm start (~25 min)
    python -m bench.real_policy --out runs/smollm2                 # this measurement (~40 min on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import use_every_core

ENGINE_KV_BYTES = 4 << 30


def rollout_counts(policy: Path, tasks: list, k: int, seed_name: str, agent,
                   trees_file: Path | None = None) -> tuple[dict[str, int], dict]:
    """Per-question successes of ``k`` rollouts each, and the run's cost figures; the trees go to
    ``trees_file`` when given (what a predictor is fitted and judged on)."""
    from transformers import AutoTokenizer

    from trace_core.envs.registry import make_env_factory
    from trace_core.evaluation.success import measure_success
    from trace_core.rollout import build_engine
    from trace_core.rollout.engine import EngineConfig
    from trace_core.rollout.executor import TreeRolloutExecutor
    from trace_core.seeding import derive_seed

    engine = build_engine(EngineConfig(model_path=str(policy), max_model_len=agent.max_total_tokens,
                                       kv_cache_bytes=ENGINE_KV_BYTES))
    try:
        executor = TreeRolloutExecutor(engine, AutoTokenizer.from_pretrained(policy), make_env_factory("math"), agent)
        t0 = time.perf_counter()
        measured = measure_success(executor, tasks, k, derive_seed(seed_name, 0))
        wall = time.perf_counter() - t0
    finally:
        engine.close()
    res = measured.rollouts
    if trees_file is not None:
        from trace_core.tree import save_trees

        trees_file.parent.mkdir(parents=True, exist_ok=True)
        save_trees(trees_file, res.trees)
    cost = {"wall_s": wall, "rollouts": res.stats.trajectories, "generated_tokens": res.stats.generated_tokens,
            "turns_per_rollout": res.stats.turns / max(1, res.stats.trajectories),
            "tool_errors": res.stats.tool_errors}
    return measured.successes, cost


def breakdown(counts: dict[str, int], k: int, tasks: list) -> dict[str, dict[str, Any]]:
    """pass@1 by chain depth and by unseen wordings (0 or at least one)."""
    from trace_core.metrics import pass_at_1

    groups: dict[str, dict[str, int]] = defaultdict(dict)
    for t in tasks:
        groups[f"depth {t.metadata['depth']}"][t.id] = counts[t.id]
        seen = "every part in a seen wording" if t.metadata["unseen_wordings"] == 0 else "an unseen wording"
        groups[seen][t.id] = counts[t.id]
    out = {}
    for name in sorted(groups):
        p = pass_at_1(groups[name], k)
        out[name] = {"pass_at_1": p.value, "se": p.se, "questions": p.questions}
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    pool = result["pool"]
    k = pool["samples"]
    axes[0].bar([f"{i}/{k}" for i in range(k + 1)], pool["histogram"], color=["#c44"] + ["#888"] * (k - 1) + ["#4a4"])
    sh = pool["shares"]
    axes[0].set(xlabel="successes out of k at T = 1", ylabel="pool questions",
                title=f"pool: never {sh['never']:.0%}, always {sh['always']:.0%}, mixed {sh['mixed']:.0%}")
    rows = result["heldout"]["breakdown"]
    names = list(rows)
    axes[1].barh(names, [rows[n]["pass_at_1"] for n in names], xerr=[rows[n]["se"] for n in names], color="#58a")
    h = result["heldout"]
    axes[1].set(xlabel="held-out pass@1 (± SE by question)", xlim=(0, 1),
                title=f"held-out pass@1 {h['pass_at_1']:.3f} ± {h['se']:.3f} "
                      f"({h['questions']} questions × {h['samples']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.real_policy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/smollm2"), help="the pretrained warm start's folder")
    ap.add_argument("--pool-k", type=int, default=8, help="rollouts per pool question (>= 8)")
    ap.add_argument("--heldout-k", type=int, default=4, help="rollouts per held-out question (>= 4)")
    ap.add_argument("--results", type=Path, default=Path("bench/results/real_policy.json"))
    args = ap.parse_args(argv)
    if args.pool_k < 8 or args.heldout_k < 4:
        raise SystemExit(f"--pool-k must be >= 8 and --heldout-k >= 4, got {args.pool_k} and {args.heldout_k}")
    policy = args.out / "policy"
    if not (policy / "config.json").is_file():
        raise SystemExit(f"{policy} holds no policy: run python -m trace_core.warmstart.pretrained --out {args.out}")
    use_every_core()  # before torch loads: the one heavy job on the machine

    from bench.harness import git_commit, tree_is_dirty, verdict
    from trace_core.metrics import pass_at_1
    from trace_core.pretrained import read_source
    from trace_core.warmstart.demos import load_tasks
    from trace_core.warmstart.pretrained import PRETRAINED_AGENT
    from trace_core.warmstart.testbed import Spread, file_digest

    t0 = time.perf_counter()
    report = json.loads((args.out / "report.json").read_text())
    pool_tasks = load_tasks(args.out / "tasks" / "pool.jsonl")
    held_tasks = load_tasks(args.out / "tasks" / "heldout.jsonl")
    pool_counts, pool_cost = rollout_counts(policy, pool_tasks, args.pool_k, "real-policy-pool", PRETRAINED_AGENT,
                                            args.out / "measure" / "pool_trees.jsonl.gz")
    spread = Spread(args.pool_k, pool_counts)
    held_counts, held_cost = rollout_counts(policy, held_tasks, args.heldout_k, "heldout", PRETRAINED_AGENT,
                                            args.out / "measure" / "heldout_trees.jsonl.gz")
    held = pass_at_1(held_counts, args.heldout_k)
    pool_break = breakdown(pool_counts, args.pool_k, pool_tasks)
    aims = {"grpo effective ratio (G = k) in [0.15, 0.45]": 0.15 <= spread.grpo_effective_ratio <= 0.45,
            "no interior bin above half the mixed": spread.largest_interior_bin_share <= 0.5}
    result = {
        "command": " ".join(["python -m bench.real_policy", *(argv if argv is not None else sys.argv[1:])]),
        "commit": git_commit(), "dirty": tree_is_dirty(),
        "policy": {"source": asdict(read_source(policy)), "weights_digest":
                   file_digest(sorted(policy.glob("*.safetensors")))},
        "task": report["config"]["chains"], "sft": report["sft"], "sft_config": report["config"]["sft"],
        "pool": {**spread.to_json(), "grpo_effective_ratio": spread.grpo_effective_ratio, "breakdown": pool_break,
                 **pool_cost},
        "heldout": {"samples": args.heldout_k, "pass_at_1": held.value, "se": held.se, "questions": held.questions,
                    "breakdown": breakdown(held_counts, args.heldout_k, held_tasks), "successes": held_counts,
                    **held_cost},
        "aims": aims, "wall_s": time.perf_counter() - t0, "threads": os.environ.get("OMP_NUM_THREADS"),
    }
    print(f"policy {result['policy']['weights_digest']} (from {result['policy']['source']['filename']}, "
          f"sha256 {result['policy']['source']['sha256'][:16]})")
    print(f"pool      histogram {spread.histogram}  never {spread.shares['never']:.3f}  always "
          f"{spread.shares['always']:.3f}  mixed {spread.shares['mixed']:.3f}  mean {spread.mean_success:.3f}  "
          f"largest interior bin {spread.largest_interior_bin_share:.2f} of the mixed ({pool_cost['wall_s']:.0f} s)")
    print(f"held-out  pass@1 {held.value:.3f} ± {held.se:.3f} (SE by question; {held.questions} × {args.heldout_k}, "
          f"{held_cost['wall_s']:.0f} s)")
    print(f"{'group':34s} {'pool pass@1':>12s} {'held-out pass@1':>16s}")
    for name, row in result["heldout"]["breakdown"].items():
        p = pool_break.get(name, {})
        print(f"{name:34s} {p.get('pass_at_1', float('nan')):12.3f} {row['pass_at_1']:10.3f} ± {row['se']:.3f}")
    for name, ok in aims.items():
        print(f"  {verdict(ok)}  {name}")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.results.with_suffix(".png"))
    print(f"wrote {args.results} and {args.results.with_suffix('.png')}")


if __name__ == "__main__":
    main()
