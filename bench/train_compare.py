"""GRPO vs TreePO vs TRACE (and the ablations) at equal rollout budget on the embedded tasks.

For each seed and method: train from the same warm-started tiny policy with the same per-step
budget M(1+N), evaluate held-out accuracy (greedy, the embedded test split) every few steps, and
record effective ratio and contrastive yield per step. Targets (issue 6): TRACE's effective
ratio ≥ 1.8× GRPO's; TRACE reaches GRPO's final held-out accuracy with ≤ 60% of GRPO's rollouts.
One process and one vLLM engine serve every run (weights are reloaded between runs).

    python bench/train_compare.py [--quick] [--policy runs/warm/policy] [--task math]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)

import numpy as np  # noqa: E402

METHODS = ("grpo", "treepo", "trace", "trace-root-only", "trace-prefix-only")


def run_one(method: str, seed: int, args, engine, eval_cfg) -> dict:
    from trace_core.config import load_config
    from trace_core.evaluation import evaluate
    from trace_core.training.config import TrainConfig
    from trace_core.training.trainer import Trainer

    out = Path(args.out_dir) / f"{method}-seed{seed}"
    overrides = [
        f"method={method}", f"seed={seed}", f"steps={args.steps}", f"policy_model={args.policy}",
        f"output_dir={out}", f"task.family={args.task}", f"task.data_dir={args.data}", "progress=false",
        f"tracking.tracking_uri=sqlite:///{Path(args.out_dir).resolve() / 'mlflow.db'}",
        "tracking.experiment=bench-train-compare", f"budget.roots_M={args.roots_M}",
        f"budget.expansion_N={args.expansion_N}", f"predictor.task_family={args.task}",
    ]
    if args.train_file:
        overrides.append(f"task.train_file={args.train_file}")
    if args.max_turns:
        overrides.append(f"agent.max_turns={args.max_turns}")
    cfg = load_config(TrainConfig, args.config, overrides)
    trainer = Trainer(cfg, engine=engine)
    per_step = cfg.budget.spec().total
    curve = []  # (rollouts consumed, held-out accuracy)

    def held_out() -> float:
        trainer.policy.save_pretrained(out / "eval_policy")
        trainer.tokenizer.save_pretrained(out / "eval_policy")
        res = evaluate(out / "eval_policy", eval_cfg, engine=engine)
        return float(np.mean([b.metrics[res.primary_metric] for b in res.benchmarks.values()]))

    curve.append((0, held_out()))
    eff, yld, spearman, reward = [], [], [], []
    for step in range(cfg.steps):
        metrics = trainer.train_step()
        trainer.profiler.end_step()
        eff.append(metrics["effective_ratio"])
        yld.append(metrics["contrastive_yield"])
        reward.append(metrics.get("reward/mean", float("nan")))
        # Out-of-sample predictor Spearman on these real trees (NaN when a step had no spread).
        spearman.append((metrics.get("predictor/oos_spearman_root", float("nan")),
                         metrics.get("predictor/oos_spearman_prefix", float("nan"))))
        if (step + 1) % args.eval_every == 0 or step + 1 == cfg.steps:
            engine.load_weights(trainer.policy.full_state_dict())
            curve.append(((step + 1) * per_step, held_out()))
    trainer.tracker.close()
    return {"method": method, "seed": seed, "effective_ratio": eff, "contrastive_yield": yld,
            "reward": reward, "predictor_spearman": spearman, "accuracy_curve": curve,
            "rollouts_per_step": per_step, "cost_fractions": trainer.profiler.fractions(),
            "cost_table": trainer.profiler.table()}


def rollouts_to_reach(curve: list[tuple[int, float]], target: float) -> float:
    for rollouts, acc in curve:
        if acc >= target - 1e-12:
            return float(rollouts)
    return float("inf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="grpo and trace, one seed, few steps")
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                    help="methods to compare (must include grpo and trace)")
    ap.add_argument("--policy", default="runs/warm/policy", help="warm-started policy directory")
    ap.add_argument("--config", default="configs/embedded.yaml")
    ap.add_argument("--task", default="math", choices=["math", "qa"])
    ap.add_argument("--data", default="data")
    ap.add_argument("--train-tasks", type=int, default=None,
                    help="train on the first N training tasks only (e.g. the ones a fitted warm start saw)")
    ap.add_argument("--max-turns", type=int, default=None, help="agent turns (QA needs 5 for 4 hops + the answer)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=2)
    ap.add_argument("--eval-examples", type=int, default=40)
    ap.add_argument("--roots-M", dest="roots_M", type=int, default=16)
    ap.add_argument("--expansion-N", dest="expansion_N", type=int, default=2)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out-dir", default="runs/bench_train_compare")
    ap.add_argument("--out", type=Path, default=Path("bench/results/train_compare.json"))
    args = ap.parse_args()
    methods = ("grpo", "trace") if args.quick else tuple(args.methods)
    if not {"grpo", "trace"} <= set(methods):
        raise SystemExit(f"--methods must include grpo and trace (the targets compare them), got {methods}")
    if args.quick:
        args.seeds, args.steps, args.eval_every = args.seeds[:1], min(args.steps, 4), 2
    if not Path(args.policy, "config.json").is_file():
        raise SystemExit(f"no warm-started policy at {args.policy}: run `python -m trace_core.warmstart` first")

    args.train_file = None
    if args.train_tasks:
        lines = Path(args.data, args.task, "train.jsonl").read_text(encoding="utf-8").splitlines()[: args.train_tasks]
        args.train_file = Path(args.out_dir) / "train.jsonl"
        args.train_file.parent.mkdir(parents=True, exist_ok=True)
        args.train_file.write_text("\n".join(lines) + "\n", encoding="utf-8")

    import torch

    from trace_core.evaluation import BenchmarkConfig, EvalConfig
    from trace_core.rollout.engine import EngineConfig
    from trace_core.rollout.vllm_engine import VLLMEngine

    torch.set_num_threads(1)
    engine = VLLMEngine(EngineConfig(model_path=args.policy, max_model_len=2048, kv_cache_bytes=256 << 20))
    embedded = {"math": "arith", "qa": "kbqa"}[args.task]  # the embedded held-out split
    eval_cfg = EvalConfig(benchmarks=[BenchmarkConfig(name=embedded, max_examples=args.eval_examples)],
                          data_dir=args.data, samples=0, greedy=True, output_dir=str(Path(args.out_dir) / "eval"))
    t0 = time.perf_counter()
    runs = [run_one(m, s, args, engine, eval_cfg) for s in args.seeds for m in methods]
    engine.close()

    def mean_over(method: str, key: str) -> float:
        return float(np.mean([np.mean(r[key]) for r in runs if r["method"] == method]))

    rows = []
    grpo_final = np.mean([r["accuracy_curve"][-1][1] for r in runs if r["method"] == "grpo"])
    grpo_rollouts = np.mean([r["accuracy_curve"][-1][0] for r in runs if r["method"] == "grpo"])
    for m in methods:
        mine = [r for r in runs if r["method"] == m]
        reach = [rollouts_to_reach(r["accuracy_curve"], grpo_final) for r in mine]
        rows.append({"method": m, "effective_ratio": mean_over(m, "effective_ratio"),
                     "contrastive_yield": mean_over(m, "contrastive_yield"),
                     "final_accuracy": float(np.mean([r["accuracy_curve"][-1][1] for r in mine])),
                     "rollouts_to_grpo_final": float(np.mean(reach)),
                     "share_of_grpo_rollouts": float(np.mean(reach) / grpo_rollouts) if grpo_rollouts else None})
    print(f"\nEqual budget M(1+N) = {runs[0]['rollouts_per_step']} per step, {args.steps} steps, "
          f"seeds {args.seeds}, task {args.task}")
    print(f"{'method':<20}{'eff ratio':>10}{'yield':>8}{'final acc':>10}{'rollouts→GRPO final':>21}{'share':>8}")
    for r in rows:
        print(f"{r['method']:<20}{r['effective_ratio']:>10.3f}{r['contrastive_yield']:>8.1f}"
              f"{r['final_accuracy']:>10.3f}{r['rollouts_to_grpo_final']:>21.0f}"
              f"{(r['share_of_grpo_rollouts'] or float('nan')):>8.2f}")
    by = {r["method"]: r for r in rows}
    targets = {
        "trace effective ratio >= 1.8x grpo": by["trace"]["effective_ratio"] >= 1.8 * by["grpo"]["effective_ratio"],
        "trace reaches grpo final accuracy with <= 60% of its rollouts":
            (by["trace"]["share_of_grpo_rollouts"] or np.inf) <= 0.6,
    }
    for name, ok in targets.items():
        print(f"  {'PASS' if ok else 'MISS'}  {name}")
    for m in methods:
        sp = np.array([x for r in runs if r["method"] == m for x in r["predictor_spearman"]], dtype=float)
        if sp.size and np.isfinite(sp).any():
            print(f"  {m}: predictor out-of-sample Spearman on real trees, mean over steps: "
                  f"roots {np.nanmean(sp[:, 0]):.3f}, prefixes {np.nanmean(sp[:, 1]):.3f}")
    trace_run = next(r for r in runs if r["method"] == "trace")
    print(f"\nCost breakdown (trace, seed {trace_run['seed']}):\n{trace_run['cost_table']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(["python", *sys.argv]),
                                    "rows": rows, "runs": runs, "targets": targets,
                                    "wall_s": time.perf_counter() - t0}, indent=2, default=float))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for m in methods:
        mine = [r for r in runs if r["method"] == m]
        eff = np.mean([r["effective_ratio"] for r in mine], axis=0)
        axes[0].plot(np.arange(1, len(eff) + 1), eff, marker="o", label=m)
        xs = [c[0] for c in mine[0]["accuracy_curve"]]
        ys = np.mean([[c[1] for c in r["accuracy_curve"]] for r in mine], axis=0)
        axes[1].plot(xs, ys, marker="o", label=m)
    axes[0].set(xlabel="step", ylabel="effective ratio", title="Effective ratio (equal budget)")
    axes[1].set(xlabel="rollouts consumed", ylabel="held-out accuracy", title="Held-out accuracy")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=110)
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
