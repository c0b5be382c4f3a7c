"""Every method from the same policy at equal budget M(1+N) on the embedded testbed.

The testbed (``trace_core.warmstart.testbed``) is a QA pool of 128 questions whose success is
spread the way a pretrained model's is over a training set; its warm-up split is what the
informed predictor is fitted on before RL. For each seed and method: train from the testbed's
policy with the same per-step budget, log every step's contrast figures, and measure **pool
success** (mean success over the whole pool, k samples per prompt, one seed for every method) at
the start, at ``--pool-mid`` and at the end. ``trace`` is the informed TRACE (its predictor fitted
on the warm-up split first), ``trace-cold`` the same without the warm-up; PCL and the ablations
are informed. One process and one vLLM engine serve every run.

Targets (fixed before any run): TRACE's effective ratio >= 1.8x GRPO's; contrastive yield >=
1.5x GRPO's; on effective ratio trace > each single ablation > treepo; TRACE reaches GRPO's final
pool success with <= 70% of GRPO's rollouts, judged only if GRPO's pool-success gain exceeds 3
standard errors of the measurement.

Examples:

    python bench/train_compare.py --testbed runs/testbed            # the full run (~1-2 h)
    python bench/train_compare.py --testbed runs/testbed --quick    # grpo and trace, one seed
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

# name -> (registry method, predictor warm-up?)
VARIANTS = {"grpo": ("grpo", False), "pcl": ("pcl", True), "treepo": ("treepo", False), "trace": ("trace", True),
            "trace-cold": ("trace", False), "trace-root-only": ("trace-root-only", True),
            "trace-prefix-only": ("trace-prefix-only", True)}
ABLATIONS = ("trace-root-only", "trace-prefix-only")
ROW_KEYS = ("effective_ratio", "contrastive_yield", "mixed_groups_per_100_rollouts", "rollouts_per_mixed_group",
            "prefix_effective_ratio", "alloc/skipped_share", "budget/generated_tokens")


def run_one(variant: str, seed: int, args, engine, start_record: dict | None) -> dict:
    from trace_core.config import load_config
    from trace_core.training.config import TrainConfig
    from trace_core.training.trainer import Trainer

    method, informed = VARIANTS[variant]
    out = Path(args.out_dir) / f"{variant}-seed{seed}"
    at = [args.pool_mid] if start_record is not None else [0, args.pool_mid]
    overrides = [
        f"method={method}", f"seed={seed}", f"steps={args.steps}", f"policy_model={args.testbed}/policy",
        f"output_dir={out}", "task.family=qa", f"task.data_dir={args.data}",
        f"task.train_file={args.testbed}/pool.jsonl", f"task.index_dir={args.index}", "progress=false",
        f"tracking.tracking_uri=sqlite:///{Path(args.out_dir).resolve() / 'mlflow.db'}",
        "tracking.experiment=bench-train-compare", f"budget.roots_M={args.roots_M}",
        f"budget.expansion_N={args.expansion_N}", "budget.group_size_G=8", f"budget.max_per_prompt={args.max_m}",
        "predictor.task_family=qa", f"pool_success.samples={args.pool_k}", f"pool_success.at_steps={at}",
        f"predictor_warmup.task_file={f'{args.testbed}/warmup.jsonl' if informed else 'null'}",
    ]
    cfg = load_config(TrainConfig, args.config, overrides)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, engine=engine)
    summary = trainer.run()
    history = trainer.state.history or {}
    pool = sorted(([start_record] if start_record else []) + list(summary["pool_success"]), key=lambda r: r["step"])
    return {"variant": variant, "method": method, "seed": seed, "wall_s": time.perf_counter() - t0,
            "series": {k: history.get(k, []) for k in (*ROW_KEYS, "reward/mean", "counts/rollouts",
                                                        "counts/mixed_groups", "counts/activated")},
            "pool_success": pool, "warmup_rollouts": (summary["warmup"] or {}).get("rollouts", 0.0),
            "rollouts_per_step": cfg.budget.spec().total, "cost_fractions": summary["cost_fractions"]}


def pool_curve(run: dict) -> tuple[np.ndarray, np.ndarray]:
    """(training rollouts consumed, pool success) at the measured steps."""
    steps = np.array([r["step"] for r in run["pool_success"]], dtype=float)
    return steps * run["rollouts_per_step"], np.array([r["success"] for r in run["pool_success"]])


def rollouts_to_reach(run: dict, target: float) -> float | None:
    """Training rollouts at which the linearly interpolated pool-success curve first reaches
    ``target``; None if it never does."""
    x, y = pool_curve(run)
    for i in range(len(y)):
        if y[i] >= target:
            if i == 0:
                return 0.0
            return float(x[i - 1] + (target - y[i - 1]) / (y[i] - y[i - 1]) * (x[i] - x[i - 1]))
    return None


def summarise(runs: list[dict], variants: list[str], pool_k: int, pool_size: int) -> tuple[list[dict], dict]:
    rows = []
    grpo = [r for r in runs if r["variant"] == "grpo"]
    grpo_final = float(np.mean([r["pool_success"][-1]["success"] for r in grpo]))
    grpo_start = float(np.mean([r["pool_success"][0]["success"] for r in grpo]))
    grpo_rollouts = float(np.mean([pool_curve(r)[0][-1] for r in grpo]))
    # The measurement's standard error: a mean over pool_size prompts x k Bernoulli samples.
    se = float(np.sqrt(max(grpo_final * (1 - grpo_final), 1e-12) / (pool_size * pool_k)) * np.sqrt(2))
    for v in variants:
        mine = [r for r in runs if r["variant"] == v]
        row: dict = {"method": v}
        for key in (*ROW_KEYS, "wall_s"):
            per_seed = [float(np.nanmean(r["series"][key])) if key != "wall_s" else r["wall_s"] for r in mine]
            name = key.split("/")[-1]
            row[name] = float(np.mean(per_seed))
            row[f"{name}_std"] = float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else None
        row["pool_success_start"] = float(np.mean([r["pool_success"][0]["success"] for r in mine]))
        row["pool_success_end"] = float(np.mean([r["pool_success"][-1]["success"] for r in mine]))
        row["rollouts"] = float(np.mean([sum(r["series"]["counts/rollouts"]) for r in mine]))
        row["warmup_rollouts"] = float(np.mean([r["warmup_rollouts"] for r in mine]))
        reach = [rollouts_to_reach(r, grpo_final) for r in mine]
        row["rollouts_to_grpo_final"] = (None if any(x is None for x in reach) else
                                         {"warmup_excluded": float(np.mean(reach)),
                                          "warmup_included": float(np.mean(reach)) + row["warmup_rollouts"]})
        row["seeds"] = len(mine)
        rows.append(row)
    return rows, {"grpo_final": grpo_final, "grpo_start": grpo_start, "grpo_rollouts": grpo_rollouts,
                  "measurement_se": se, "grpo_gain_measurable": (grpo_final - grpo_start) > 3 * se}


def judge(rows: list[dict], pool: dict) -> dict[str, str]:
    by = {r["method"]: r for r in rows}
    tr, gr = by["trace"], by["grpo"]
    out = {"trace effective ratio >= 1.8x grpo":
           f"{tr['effective_ratio']:.3f} vs {gr['effective_ratio']:.3f} "
           f"({tr['effective_ratio'] / gr['effective_ratio']:.2f}x)",
           "trace contrastive yield >= 1.5x grpo":
           f"{tr['contrastive_yield']:.1f} vs {gr['contrastive_yield']:.1f} "
           f"({tr['contrastive_yield'] / gr['contrastive_yield']:.2f}x)"}
    for key, value in list(out.items()):
        ratio = float(value.rsplit("(", 1)[1].rstrip("x)"))
        out[key] = ("PASS " if ratio >= (1.8 if "effective" in key else 1.5) else "MISS ") + value
    if all(a in by for a in (*ABLATIONS, "treepo")):
        order = (all(tr["effective_ratio"] > by[a]["effective_ratio"] for a in ABLATIONS)
                 and all(by[a]["effective_ratio"] > by["treepo"]["effective_ratio"] for a in ABLATIONS))
        out["ablation order trace > each single > treepo"] = ("PASS " if order else "MISS ") + ", ".join(
            f"{m} {by[m]['effective_ratio']:.3f}" for m in ("trace", *ABLATIONS, "treepo"))
    if not pool["grpo_gain_measurable"]:
        out["trace reaches grpo final pool success with <= 70% of its rollouts"] = (
            f"not measurable at this size (grpo {pool['grpo_start']:.3f} -> {pool['grpo_final']:.3f}, "
            f"3 SE = {3 * pool['measurement_se']:.3f})")
    else:
        reach = tr["rollouts_to_grpo_final"]
        share = None if reach is None else reach["warmup_excluded"] / pool["grpo_rollouts"]
        out["trace reaches grpo final pool success with <= 70% of its rollouts"] = (
            ("PASS " if share is not None and share <= 0.7 else "MISS ")
            + ("never reached" if share is None else f"{100 * share:.0f}% of grpo's rollouts (warm-up excluded)"))
    return out


def plot(runs: list[dict], variants: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for v in variants:
        mine = [r for r in runs if r["variant"] == v]
        eff = np.nanmean([r["series"]["effective_ratio"] for r in mine], axis=0)
        axes[0].plot(np.arange(len(eff)), eff, marker="o", label=v)
        x, _ = pool_curve(mine[0])
        y = np.mean([pool_curve(r)[1] for r in mine], axis=0)
        axes[1].plot(x, y, marker="o", label=v)
    axes[0].set(xlabel="step", ylabel="effective ratio", ylim=(0, 1), title="Effective ratio (equal budget)")
    axes[1].set(xlabel="training rollouts", ylabel="pool success", title="Pool success (same seeds for all)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--testbed", default="runs/testbed",
                    help="a testbed warm start's folder (policy/, pool.jsonl, warmup.jsonl, testbed.json): "
                         "python -m trace_core.warmstart --testbed --out runs/testbed ...")
    ap.add_argument("--methods", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--quick", action="store_true", help="grpo and trace, one seed, 4 steps")
    ap.add_argument("--config", default="configs/testbed.yaml")
    ap.add_argument("--data", default="data")
    ap.add_argument("--index", default="artifacts/qa_index")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--pool-mid", type=int, default=5, help="pool success is also measured before this step")
    ap.add_argument("--pool-k", type=int, default=4, help="samples per pool prompt for pool success")
    ap.add_argument("--roots-M", dest="roots_M", type=int, default=32)
    ap.add_argument("--expansion-N", dest="expansion_N", type=int, default=1)
    ap.add_argument("--max-m", type=int, default=8, help="M_max")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--ablation-seeds", type=int, nargs="+", default=None,
                    help="seeds for the ablations and treepo (default: --seeds)")
    ap.add_argument("--out-dir", default="runs/bench_train_compare")
    ap.add_argument("--out", type=Path, default=Path("bench/results/train_compare.json"))
    args = ap.parse_args()
    variants = ["grpo", "trace"] if args.quick else list(args.methods)
    if not {"grpo", "trace"} <= set(variants):
        raise SystemExit(f"--methods must include grpo and trace (the targets compare them), got {variants}")
    if args.quick:
        args.seeds, args.steps, args.pool_mid = args.seeds[:1], 4, 2
    testbed = json.loads((Path(args.testbed) / "testbed.json").read_text())
    frozen = Path("bench/results/testbed.json")  # the committed spread, when it is this testbed's
    spread = json.loads(frozen.read_text()) if frozen.is_file() else {}
    testbed["spread"] = spread.get("spread") if spread.get("hash") == testbed["hash"] else None

    import torch

    from trace_core.rollout.engine import EngineConfig
    from trace_core.rollout.vllm_engine import VLLMEngine

    torch.set_num_threads(1)
    engine = VLLMEngine(EngineConfig(model_path=f"{args.testbed}/policy", max_model_len=2048,
                                     kv_cache_bytes=256 << 20))
    t0 = time.perf_counter()
    runs: list[dict] = []
    start: dict | None = None  # the pool success at step 0: the same policy and seeds for every run
    for seed in args.seeds:
        for v in variants:
            if v in (*ABLATIONS, "treepo") and args.ablation_seeds is not None and seed not in args.ablation_seeds:
                continue
            runs.append(run_one(v, seed, args, engine, start))
            start = start or runs[-1]["pool_success"][0]
            print(f"{v} seed {seed}: effective ratio {np.nanmean(runs[-1]['series']['effective_ratio']):.3f}, "
                  f"pool success {runs[-1]['pool_success'][0]['success']:.3f} -> "
                  f"{runs[-1]['pool_success'][-1]['success']:.3f} ({runs[-1]['wall_s']:.0f} s)", flush=True)
    engine.close()
    rows, pool = summarise(runs, variants, args.pool_k, len(testbed["pool"]))
    targets = judge(rows, pool)
    from bench_tables import print_table

    print_table(rows, ["method", "effective_ratio", "contrastive_yield", "mixed_groups_per_100_rollouts",
                       "rollouts_per_mixed_group", "prefix_effective_ratio", "skipped_share",
                       "pool_success_start", "pool_success_end", "rollouts", "warmup_rollouts"])
    for name, verdict in targets.items():
        print(f"  {name}: {verdict}")
    by = {r["method"]: r for r in rows}
    if "pcl" in by:
        print("  trace vs pcl: " + ", ".join(f"{k} {by['trace'][k]:.3f} vs {by['pcl'][k]:.3f}" for k in
                                          ("effective_ratio", "contrastive_yield", "rollouts_per_mixed_group",
                                           "pool_success_end")))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": " ".join(["python", *sys.argv]), "testbed": {"hash": testbed["hash"], "spread": testbed.get(
            "spread")}, "budget": {"M": args.roots_M, "N": args.expansion_N, "G": 8, "steps": args.steps,
                                   "seeds": args.seeds, "pool_k": args.pool_k},
        "rows": rows, "pool_success_measurement": pool, "targets": targets,
        "series": {f"{r['variant']}/seed{r['seed']}": {**r["series"], "pool_success": r["pool_success"]}
                   for r in runs}, "wall_s": time.perf_counter() - t0}, indent=1, default=float))
    plot(runs, variants, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
