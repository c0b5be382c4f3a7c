"""Success predictor on real rollout trees (the second part of the predictor benchmark).

``bench/predictor.py`` measures the predictor on simulator trees; this script measures it where
it will live: TRACE training steps of a warm-started tiny policy on the embedded multi-hop QA
tasks, through the real executor, retriever and trainer. The policy is frozen by default
(``--policy-lr 0``): the predictor is then measured against a fixed target; with a learning rate
it has to track a moving policy. Per step it records the predictor's out-of-sample Spearman
between its predictions and the tree-backed targets at roots and at prefixes (predictions made
before the update that trains on those nodes), the ECE, the loss, the mean reward and the
predictor's share of the step's wall time (scoring + update).

Reference, at roots: a per-prompt memory, the mean reward of the prompt's earlier trajectories
(0.5 before any). The training prompts repeat every step here, so this lookup table is a strong,
cheap baseline; the predictor has to read the question to match it, and is what generalises to
prompts it has never seen.

The policy must have mixed rewards on the training prompts, or every target is 0 and no rank
correlation exists. ``--policy`` is a policy warm-started on the first ``--train-tasks`` QA
training tasks until it reproduces their demonstrations:

Examples:

    python -m trace_core.warmstart --tasks qa --train-tasks 16 --view-epochs 0 --epochs 50 \\
        --lr 5e-3 --batch-size 4 --threads 2 --real-observations --eval-split train --eval-tasks 16 \\
        --eval-samples 4 --qa-index artifacts/qa_index --out runs/warm_fit16r
    python bench/predictor_real.py      # the defaults: that policy, 16 tasks, M = 16, N = 1, 30 steps
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

from trace_core.metrics import spearman  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="runs/warm_fit16r/policy", help="warm-started policy directory")
    ap.add_argument("--config", default="configs/embedded.yaml", help="trainer config the run starts from")
    ap.add_argument("--data", default="data")
    ap.add_argument("--train-tasks", type=int, default=16, help="train on the first N QA training tasks")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--roots-M", dest="roots_M", type=int, default=16)
    ap.add_argument("--expansion-N", dest="expansion_N", type=int, default=1)
    ap.add_argument("--group-G", dest="group_G", type=int, default=4, help="with --pool-factor, sets the pool size")
    ap.add_argument("--pool-factor", type=int, default=2,
                    help="candidate pool = pool_factor·M(1+N)/G prompts (at most --train-tasks)")
    ap.add_argument("--policy-lr", type=float, default=0.0,
                    help="policy learning rate; 0 (default) freezes the policy, so the predictor chases a fixed "
                         "target (the fitted policy collapses under RL updates within a few steps at 1e-4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default="runs/bench_predictor_real")
    ap.add_argument("--out", type=Path, default=Path("bench/results/predictor_real.json"))
    args = ap.parse_args()
    if not Path(args.policy, "config.json").is_file():
        raise SystemExit(f"no policy at {args.policy}: build it with the warm-start command in --help")

    import torch

    from trace_core.config import load_config
    from trace_core.training.config import TrainConfig
    from trace_core.training.trainer import Trainer

    torch.set_num_threads(1)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = Path(args.data, "qa", "train.jsonl").read_text(encoding="utf-8").splitlines()[: args.train_tasks]
    train_file = out / "train.jsonl"
    train_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    overrides = [
        "method=trace", f"seed={args.seed}", f"steps={args.steps}", f"policy_model={args.policy}",
        f"output_dir={out / 'run'}", "task.family=qa", f"task.data_dir={args.data}", f"task.train_file={train_file}",
        "progress=false", f"tracking.tracking_uri=sqlite:///{out.resolve() / 'mlflow.db'}",
        "tracking.experiment=bench-predictor-real", f"budget.roots_M={args.roots_M}",
        f"budget.expansion_N={args.expansion_N}", f"budget.group_size_G={args.group_G}",
        f"budget.pool_factor={args.pool_factor}", "predictor.task_family=qa", f"policy.lr={args.policy_lr}",
        "agent.max_turns=6",  # 2-4 hops + the answer (the embedded config's 4 turns are for math)
    ]
    cfg = load_config(TrainConfig, args.config, overrides)
    trainer = Trainer(cfg)
    policy_params = sum(int(t.numel()) for t in trainer.policy.full_state_dict().values())
    predictor_params = sum(p.numel() for p in trainer.predictor.model.parameters())
    memory: dict[str, list[float]] = {}
    steps = []
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        tic = time.perf_counter()
        metrics = trainer.train_step()
        wall = time.perf_counter() - tic
        phases = trainer.profiler.end_step()
        trees = metrics["_trees"]
        rewards = {t.prompt_id: [t.trajectory_reward(tr.id) for tr in t.trajectories] for t in trees}
        target = [float(np.mean(r)) for r in rewards.values()]
        remembered = [float(np.mean(memory[p])) if memory.get(p) else 0.5 for p in rewards]
        for p, r in rewards.items():
            memory.setdefault(p, []).extend(r)
        row = {
            "step": step + 1,
            "wall_s": wall,
            "reward": metrics["reward/mean"],
            "prompts": len(trees),
            "mixed_prompts": int(sum(0 < np.mean(r) < 1 for r in rewards.values())),
            "spearman_root": metrics.get("predictor/oos_spearman_root", float("nan")),
            "spearman_prefix": metrics.get("predictor/oos_spearman_prefix", float("nan")),
            "num_roots": metrics.get("predictor/oos_num_roots", float("nan")),
            "num_prefixes": metrics.get("predictor/oos_num_prefixes", float("nan")),
            "ece_root": metrics.get("predictor/ece_root", float("nan")),
            "loss": metrics.get("predictor/loss", float("nan")),
            "memory_spearman_root": spearman(remembered, target),
            "phases_s": phases,
        }
        steps.append(row)
        print(f"step {row['step']:3d}  reward {row['reward']:.3f}  "
              f"mixed {row['mixed_prompts']:2d}/{row['prompts']:2d}  "
              f"spearman root {row['spearman_root']:+.3f} (memory {row['memory_spearman_root']:+.3f})  "
              f"prefix {row['spearman_prefix']:+.3f} ({row['num_prefixes']:.0f})  loss {row['loss']:.4f}  "
              f"{wall:.1f} s", flush=True)
    trainer.tracker.close()
    fractions = trainer.profiler.fractions()
    predictor_share = fractions.get("predictor_scoring", 0.0) + fractions.get("predictor_update", 0.0)

    def nanmean(key: str, rows=steps) -> float:
        v = np.array([r[key] for r in rows], float)
        return float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")

    half = steps[len(steps) // 2:]
    summary = {
        "spearman_root_mean": nanmean("spearman_root"), "spearman_prefix_mean": nanmean("spearman_prefix"),
        "spearman_root_second_half": nanmean("spearman_root", half),
        "spearman_prefix_second_half": nanmean("spearman_prefix", half),
        "memory_spearman_root_mean": nanmean("memory_spearman_root"),
        "memory_spearman_root_second_half": nanmean("memory_spearman_root", half),
        "steps_with_root_spearman": int(sum(np.isfinite(r["spearman_root"]) for r in steps)),
        "steps_with_prefix_spearman": int(sum(np.isfinite(r["spearman_prefix"]) for r in steps)),
        "reward_mean": nanmean("reward"), "predictor_share_of_step": predictor_share,
        "policy_parameters": policy_params, "predictor_parameters": predictor_params,
    }
    print("\n| quantity | all steps | second half |\n|---|---:|---:|")
    print(f"| predictor Spearman, roots | {summary['spearman_root_mean']:.3f} | "
          f"{summary['spearman_root_second_half']:.3f} |")
    print(f"| per-prompt memory Spearman, roots | {summary['memory_spearman_root_mean']:.3f} | "
          f"{summary['memory_spearman_root_second_half']:.3f} |")
    print(f"| predictor Spearman, prefixes | {summary['spearman_prefix_mean']:.3f} | "
          f"{summary['spearman_prefix_second_half']:.3f} |")
    print(f"Steps with a defined Spearman: roots {summary['steps_with_root_spearman']}/{len(steps)}, "
          f"prefixes {summary['steps_with_prefix_spearman']}/{len(steps)}; mean reward {summary['reward_mean']:.3f}")
    print(f"Predictor share of the step's wall time (scoring + update): {100 * predictor_share:.1f}% "
          f"(predictor {predictor_params:,} parameters; policy {policy_params:,})")
    print(f"\nCost breakdown over the run:\n{trainer.profiler.table()}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "summary": summary, "steps": steps,
                                    "cost_fractions": fractions, "wall_s": time.perf_counter() - t0},
                                   indent=2, default=float))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    x = [r["step"] for r in steps]
    ax.plot(x, [r["spearman_root"] for r in steps], marker="o", label="predictor, roots")
    ax.plot(x, [r["spearman_prefix"] for r in steps], marker="s", label="predictor, prefixes")
    ax.plot(x, [r["memory_spearman_root"] for r in steps], ls="--", label="per-prompt memory, roots")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set(xlabel="training step", ylabel="out-of-sample Spearman", title="Success predictor on real QA trees")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=110)
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
