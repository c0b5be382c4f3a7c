"""Contrast benchmark on the simulator: at equal total budget M(1+N), the
effective ratio, prefix effective ratio and contrastive yield (SPEC §7) of GRPO (G = 8), PCL,
TreePO, TRACE with an oracle, a noisy and a learned predictor, and both ablations.

    python bench/contrast.py [--quick] [--workers 2] [--seed 0] [--out bench/results/contrast.json]

Protocol (fixed before any result was seen; the simulator's defaults are pinned in
``trace_core.sim.SimConfig`` and are not tuned here):

- Shapes (M, N) = (512, 2), (512, 6), (1024, 2); G = 8, M_max = 16, pool B = 4·M(1+N)/G.
- Every run lasts ``--total-steps`` (20) steps; the last ``--report-steps`` (8) are averaged.
  The learned predictor starts untrained and learns online from its own method's trees during
  the first 12 (warm-up) steps and keeps learning while reported; each of its figures is
  out-of-sample (scored before it trains on the step). Fixed predictors (oracle, noisy) and
  the uniform methods run only the reported steps.
- Step ``s`` of every row of a cell draws the same candidate pool (the generator of step ``s``
  is seeded by (seed, M, N, pool factor, Beta parameter, s)): common random numbers, so method
  differences are not pool noise.
- PCL and the ablations use the same predictor as the TRACE row they are listed with; GRPO and
  TreePO never read predictions.
- Noisy predictor: ``sigmoid(logit V + N(0, σ))``, σ = 2 by default; a sweep over σ reports the
  Spearman each σ achieves against the hidden V.
- Sensitivity: the Beta parameter a ∈ {0.1, 0.15, 0.3} × the pool factor ∈ {1, 2, 4}, for GRPO,
  TreePO, TRACE-oracle and TRACE-learned, at (M, N) = (512, 2).

Targets at the pinned defaults (every shape): TRACE-oracle ≥ 2.2× GRPO's effective ratio,
TRACE-learned ≥ 1.8×; both-active > each single ablation > neither (TreePO) on the effective
ratio. Prints tables; writes ``bench/results/contrast.json`` (``contrast_quick.json`` with
``--quick``) and a PNG next to it.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # small arrays: threads only add overhead on 2 cores

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from trace_core.allocation import BudgetSpec  # noqa: E402
from trace_core.sim import (  # noqa: E402
    DEFAULT_NOISE_STD,
    LearnedPredictorConfig,
    SimConfig,
    make_predictor,
    run_step,
)

# (label, method, predictor kind) — the order of the main table
ROWS: list[tuple[str, str, str]] = [
    ("grpo", "grpo", "none"),
    ("pcl / oracle", "pcl", "oracle"),
    ("pcl / learned", "pcl", "learned"),
    ("treepo", "treepo", "none"),
    ("trace / oracle", "trace", "oracle"),
    ("trace / noisy", "trace", "noisy"),
    ("trace / learned", "trace", "learned"),
    ("trace-root-only / oracle", "trace-root-only", "oracle"),
    ("trace-prefix-only / oracle", "trace-prefix-only", "oracle"),
    ("trace-root-only / learned", "trace-root-only", "learned"),
    ("trace-prefix-only / learned", "trace-prefix-only", "learned"),
]
SENS_ROWS = [r for r in ROWS if r[0] in ("grpo", "treepo", "trace / oracle", "trace / learned")]
BETAS = (0.1, 0.15, 0.3)
POOL_FACTORS = (1, 2, 4)
NOISE_STDS = (0.5, 1.0, 2.0, 4.0, 8.0)
METRICS = (
    "effective_ratio", "prefix_effective_ratio", "contrastive_yield", "activated_prompts", "skipped_share",
    "mean_m_selected", "mean_rollouts_selected", "turns_generated", "mean_reward",
    "spearman_root_vs_true", "spearman_anchor_vs_true", "spearman_root_vs_target", "spearman_prefix_vs_target",
)
TARGET_ORACLE, TARGET_LEARNED = 2.2, 1.8


@dataclasses.dataclass(frozen=True)
class Task:
    """One row of one cell: a method with a predictor, run for some steps."""

    group: str  # "main", "sensitivity" or "noise"
    label: str
    method: str
    predictor: str  # "none" (uniform methods), "oracle", "noisy", "learned"
    roots_M: int
    expansion_N: int
    pool_factor: int
    beta: float
    noise_std: float
    total_steps: int
    report_steps: int
    seed: int

    @property
    def steps(self) -> range:
        """Learned predictors run every step; fixed ones only the reported ones."""
        first = 0 if self.predictor == "learned" else self.total_steps - self.report_steps
        return range(first, self.total_steps)

    def cost(self) -> float:
        return len(self.steps) * self.roots_M * (1 + self.expansion_N)


def run_task(task: Task) -> dict:
    config = SimConfig(difficulty_beta=task.beta)
    spec = BudgetSpec(task.roots_M, task.expansion_N, pool_factor=task.pool_factor)
    kind = "oracle" if task.predictor == "none" else task.predictor
    predictor = make_predictor(kind, config, seed=task.seed, noise_std=task.noise_std)
    cell = [task.seed, task.roots_M, task.expansion_N, task.pool_factor, round(task.beta * 1000)]
    per_step, curve = [], []
    t0, c0 = time.perf_counter(), time.process_time()
    for s in task.steps:
        rng = np.random.default_rng([*cell, s])
        result = run_step(task.method, spec, predictor, rng, config)
        curve.append(result.metrics["effective_ratio"])
        if s >= task.total_steps - task.report_steps:
            per_step.append(result.metrics)
    return {
        "task": dataclasses.asdict(task),
        "steps_run": len(task.steps),
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
        "effective_ratio_by_step": curve,
        "reported": summarise(per_step),
    }


def summarise(per_step: list[dict]) -> dict:
    out = {}
    keys = list(METRICS) + sorted(k for k in per_step[0] if k.startswith("k_share_pos"))
    for k in keys:
        vals = np.array([m[k] for m in per_step], dtype=np.float64)
        finite = vals[np.isfinite(vals)]
        out[k] = {
            "mean": float(finite.mean()) if finite.size else None,
            "std": float(finite.std(ddof=1)) if finite.size > 1 else None,
        }
    return out


def build_tasks(args: argparse.Namespace) -> list[Task]:
    common = dict(total_steps=args.total_steps, report_steps=args.report_steps, seed=args.seed)
    tasks = []
    for M, N in args.shapes:
        for label, method, pred in ROWS:
            tasks.append(Task("main", label, method, pred, M, N, 4, 0.15, DEFAULT_NOISE_STD, **common))
    M, N = args.sensitivity_shape
    for beta in BETAS:
        for pf in POOL_FACTORS:
            for label, method, pred in SENS_ROWS:
                if beta == 0.15 and pf == 4 and (M, N) in args.shapes:
                    continue  # the main table's cell; reused below
                tasks.append(Task("sensitivity", label, method, pred, M, N, pf, beta, DEFAULT_NOISE_STD, **common))
    for sigma in NOISE_STDS:
        if sigma == DEFAULT_NOISE_STD and (M, N) in args.shapes:
            continue
        tasks.append(Task("noise", f"trace / noisy σ={sigma:g}", "trace", "noisy", M, N, 4, 0.15, sigma, **common))
    return tasks


def mean_of(res: dict, metric: str) -> float:
    v = res["reported"][metric]["mean"]
    return float("nan") if v is None else v


def fmt(x: float | None, digits: int = 3) -> str:
    return "   -  " if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True))))
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes and few steps: a smoke run")
    parser.add_argument("--workers", type=int, default=2, help="processes (results do not depend on it)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.shapes = [(128, 2), (128, 6), (256, 2)]
        args.sensitivity_shape = (128, 2)
        args.total_steps, args.report_steps = 6, 2
    else:
        args.shapes = [(512, 2), (512, 6), (1024, 2)]
        args.sensitivity_shape = (512, 2)
        args.total_steps, args.report_steps = 20, 8
    out = args.out or Path("bench/results") / ("contrast_quick.json" if args.quick else "contrast.json")

    t0 = time.perf_counter()
    tasks = build_tasks(args)
    order = sorted(range(len(tasks)), key=lambda i: -tasks[i].cost())  # longest first
    results: list[dict | None] = [None] * len(tasks)
    if args.workers > 1:
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            futures = {i: pool.submit(run_task, tasks[i]) for i in order}
            for i, fut in futures.items():
                results[i] = fut.result()
    else:
        for i in order:
            results[i] = run_task(tasks[i])
    wall = time.perf_counter() - t0

    by_key = {}
    for task, res in zip(tasks, results, strict=True):
        by_key[(task.group, task.label, task.roots_M, task.expansion_N, task.pool_factor, task.beta,
                task.noise_std)] = res

    def main_res(label: str, M: int, N: int) -> dict:
        return by_key[("main", label, M, N, 4, 0.15, DEFAULT_NOISE_STD)]

    # ------------------------------------------------------------------ main table
    summary: dict = {"shapes": {}}
    for M, N in args.shapes:
        grpo = mean_of(main_res("grpo", M, N), "effective_ratio")
        rows = []
        shape_out = {}
        for label, _, _ in ROWS:
            res = main_res(label, M, N)
            eff = mean_of(res, "effective_ratio")
            rows.append([
                label, fmt(eff), fmt(res["reported"]["effective_ratio"]["std"]),
                fmt(mean_of(res, "prefix_effective_ratio")), fmt(mean_of(res, "contrastive_yield"), 1),
                fmt(eff / grpo, 2), fmt(mean_of(res, "activated_prompts"), 0), fmt(mean_of(res, "skipped_share"), 2),
                fmt(mean_of(res, "mean_m_selected"), 2), fmt(mean_of(res, "mean_rollouts_selected"), 2),
                fmt(mean_of(res, "turns_generated"), 0),
                fmt(mean_of(res, "spearman_root_vs_true"), 2), fmt(mean_of(res, "spearman_anchor_vs_true"), 2),
            ])
            shape_out[label] = {"ratio_to_grpo": eff / grpo, **res}
        print_table(
            f"(M, N) = ({M}, {N}): {M * (1 + N)} trajectories per step, pool {4 * M * (1 + N) // 8}; "
            f"mean over the last {args.report_steps} of {args.total_steps} steps",
            ["method / predictor", "eff", "±sd", "prefix", "yield", "×GRPO", "prompts", "skip", "m", "m+K",
             "turns", "ρroot", "ρanch"],
            rows,
        )
        summary["shapes"][f"{M},{N}"] = shape_out

    # ------------------------------------------------------------------ targets
    targets, trows = {}, []
    for M, N in args.shapes:
        r = {lab: mean_of(main_res(lab, M, N), "effective_ratio") for lab, _, _ in ROWS}
        checks = {
            f"trace/oracle >= {TARGET_ORACLE}x grpo": r["trace / oracle"] / r["grpo"] >= TARGET_ORACLE,
            f"trace/learned >= {TARGET_LEARNED}x grpo": r["trace / learned"] / r["grpo"] >= TARGET_LEARNED,
        }
        for pred in ("oracle", "learned"):
            both = r[f"trace / {pred}"]
            root, prefix = r[f"trace-root-only / {pred}"], r[f"trace-prefix-only / {pred}"]
            checks[f"order ({pred}): both > each single > neither"] = (
                both > root and both > prefix and min(root, prefix) > r["treepo"]
            )
        targets[f"{M},{N}"] = {
            "trace_oracle_x_grpo": r["trace / oracle"] / r["grpo"],
            "trace_learned_x_grpo": r["trace / learned"] / r["grpo"],
            "checks": checks,
        }
        for name, ok in checks.items():
            trows.append([f"({M},{N})", name, "PASS" if ok else "MISS"])
    print_table("Targets (effective ratio, pinned defaults)", ["shape", "check", "result"], trows)
    summary["targets"] = targets

    # ------------------------------------------------------------------ K by position
    krows = []
    M, N = args.shapes[-1]
    kkeys = sorted(k for k in main_res("trace / oracle", M, N)["reported"] if k.startswith("k_share_pos"))
    for label in ("treepo", "trace / oracle", "trace / learned", "trace-prefix-only / oracle"):
        res = main_res(label, M, N)
        krows.append([label] + [fmt(mean_of(res, k), 2) for k in kkeys])
    print_table(f"Share of the prefix budget by relative turn position t/T, (M, N) = ({M}, {N})",
                ["method / predictor"] + [k.replace("k_share_pos_", "") for k in kkeys], krows)

    # ------------------------------------------------------------------ sensitivity
    Ms, Ns = args.sensitivity_shape
    sens_rows, sens_out = [], []
    for beta in BETAS:
        for pf in POOL_FACTORS:
            def cell(label: str, beta: float = beta, pf: int = pf) -> dict:
                key = ("sensitivity", label, Ms, Ns, pf, beta, DEFAULT_NOISE_STD)
                return by_key.get(key) or main_res(label, Ms, Ns)
            e = {lab: mean_of(cell(lab), "effective_ratio") for lab, _, _ in SENS_ROWS}
            y = {lab: mean_of(cell(lab), "contrastive_yield") for lab, _, _ in SENS_ROWS}
            sens_rows.append([
                f"a={beta:g} pool×{pf}", fmt(e["grpo"]), fmt(e["treepo"]), fmt(e["trace / oracle"]),
                fmt(e["trace / learned"]), fmt(e["trace / oracle"] / e["grpo"], 2),
                fmt(e["trace / learned"] / e["grpo"], 2), fmt(y["grpo"], 1), fmt(y["trace / oracle"], 1),
                fmt(y["trace / learned"], 1),
            ])
            sens_out.append({"beta": beta, "pool_factor": pf, "effective_ratio": e, "contrastive_yield": y})
    print_table(
        f"Sensitivity at (M, N) = ({Ms}, {Ns}): Beta(a, a) difficulty × pool factor (effective ratio; yield)",
        ["cell", "grpo", "treepo", "trace/or", "trace/lrn", "or×", "lrn×", "y grpo", "y or", "y lrn"],
        sens_rows,
    )
    summary["sensitivity"] = sens_out

    # ------------------------------------------------------------------ noise sweep
    grpo_s = mean_of(main_res("grpo", Ms, Ns), "effective_ratio")
    nrows, nout = [], []
    for sigma in NOISE_STDS:
        res = by_key.get(("noise", f"trace / noisy σ={sigma:g}", Ms, Ns, 4, 0.15, sigma))
        res = res or main_res("trace / noisy", Ms, Ns)
        row = {k: mean_of(res, k) for k in ("spearman_root_vs_true", "spearman_anchor_vs_true",
                                            "effective_ratio", "prefix_effective_ratio", "contrastive_yield")}
        nrows.append([f"σ={sigma:g}"] + [fmt(row[k], 3) for k in row] + [fmt(row["effective_ratio"] / grpo_s, 2)])
        nout.append({"noise_std": sigma, **row})
    for label in ("trace / oracle", "trace / learned"):
        res = main_res(label, Ms, Ns)
        row = [mean_of(res, k) for k in ("spearman_root_vs_true", "spearman_anchor_vs_true",
                                         "effective_ratio", "prefix_effective_ratio", "contrastive_yield")]
        nrows.append([label] + [fmt(x, 3) for x in row] + [fmt(row[2] / grpo_s, 2)])
    print_table(f"TRACE vs predictor quality at (M, N) = ({Ms}, {Ns}) (ρ: Spearman with the hidden V)",
                ["predictor", "ρroot", "ρanchor", "eff", "prefix", "yield", "×GRPO"], nrows)
    summary["noise_sweep"] = nout

    cpu = sum(r["cpu_s"] for r in results)
    print(f"\nwall time {wall:.1f} s with {args.workers} worker(s); {sum(len(t.steps) for t in tasks)} steps; "
          f"{cpu:.1f} CPU s in the workers (wall on idle cores ≈ CPU s / workers)")
    misses = [f"({s}) {n}" for s, t in targets.items() for n, ok in t["checks"].items() if not ok]
    note = " (--quick: tiny shapes and 2 reported steps; the targets are judged on the full run)" if args.quick else ""
    print(("targets: all met" if not misses else "targets MISSED: " + "; ".join(misses)) + note)

    payload = {
        "command": "python " + " ".join(sys.argv),
        "quick": args.quick,
        "wall_s": wall,
        "worker_cpu_s": cpu,
        "workers": args.workers,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "protocol": {
            "sim_config": dataclasses.asdict(SimConfig()),
            "learned_predictor": dataclasses.asdict(LearnedPredictorConfig(seed=args.seed)),
            "noise_std_default": DEFAULT_NOISE_STD,
            "shapes": args.shapes,
            "group_size_G": 8, "max_per_prompt": 16, "pool_factor": 4,
            "total_steps": args.total_steps, "report_steps": args.report_steps, "seed": args.seed,
            "targets": {"trace_oracle_x_grpo": TARGET_ORACLE, "trace_learned_x_grpo": TARGET_LEARNED},
        },
        **summary,
        "noise_tasks": [r for t, r in zip(tasks, results, strict=True) if t.group == "noise"],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_clean(payload), indent=1, allow_nan=False))
    plot(payload, by_key, args, out.with_suffix(".png"), main_res)
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def _clean(x: object) -> object:
    """JSON-able copy: NaN/inf become null (nothing to measure), numpy scalars Python ones."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    if isinstance(x, bool | np.bool_):
        return bool(x)
    if isinstance(x, int | np.integer):
        return int(x)
    if isinstance(x, float | np.floating):
        return float(x) if np.isfinite(x) else None
    return x


def plot(payload: dict, by_key: dict, args: argparse.Namespace, path: Path, main_res) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    ax = axes[0, 0]
    labels = [r[0] for r in ROWS]
    width = 0.8 / len(args.shapes)
    for k, (M, N) in enumerate(args.shapes):
        vals = [mean_of(main_res(lab, M, N), "effective_ratio") for lab in labels]
        ax.bar(np.arange(len(labels)) + k * width, vals, width, label=f"M={M}, N={N}")
    ax.set_xticks(np.arange(len(labels)) + width * (len(args.shapes) - 1) / 2)
    ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("effective ratio")
    ax.set_title("Effective ratio at equal budget M(1+N)")
    ax.legend(fontsize=8)

    ax = axes[0, 1]
    for M, N in args.shapes:
        curve = main_res("trace / learned", M, N)["effective_ratio_by_step"]
        line, = ax.plot(curve, label=f"trace/learned M={M},N={N}")
        ax.axhline(mean_of(main_res("trace / oracle", M, N), "effective_ratio"), color=line.get_color(), ls=":")
        ax.axhline(mean_of(main_res("grpo", M, N), "effective_ratio"), color=line.get_color(), ls="--", lw=0.8)
    ax.axvline(args.total_steps - args.report_steps - 0.5, color="grey", lw=0.8)
    ax.set_xlabel("step (learned predictor online; reported steps right of the grey line)")
    ax.set_ylabel("effective ratio")
    ax.set_title("Learned predictor warm-up (dotted: oracle, dashed: GRPO)")
    ax.legend(fontsize=8)

    ax = axes[1, 0]
    for pf, color in zip(POOL_FACTORS, ("tab:blue", "tab:orange", "tab:green"), strict=True):
        cells = [c for c in payload["sensitivity"] if c["pool_factor"] == pf]
        betas = [c["beta"] for c in cells]
        for pred, style in (("oracle", "o-"), ("learned", "x--")):
            ratio = [c["effective_ratio"][f"trace / {pred}"] / c["effective_ratio"]["grpo"] for c in cells]
            ax.plot(betas, ratio, style, color=color, label=f"{pred}, pool×{pf}")
    ax.axhline(TARGET_ORACLE, color="grey", ls=":")
    ax.axhline(TARGET_LEARNED, color="grey", ls="--")
    ax.set_xlabel("difficulty Beta(a, a) parameter a")
    ax.set_ylabel("TRACE / GRPO effective ratio")
    ax.set_title(f"Sensitivity at (M, N) = {tuple(args.sensitivity_shape)}")
    ax.legend(fontsize=7, ncol=2)

    ax = axes[1, 1]
    M, N = args.shapes[-1]
    kkeys = sorted(k for k in main_res("trace / oracle", M, N)["reported"] if k.startswith("k_share_pos"))
    for j, label in enumerate(("treepo", "trace / oracle", "trace / learned", "trace-prefix-only / oracle")):
        res = main_res(label, M, N)
        ax.bar(np.arange(len(kkeys)) + j * 0.2, [mean_of(res, k) for k in kkeys], 0.2, label=label)
    ax.set_xticks(np.arange(len(kkeys)) + 0.3)
    ax.set_xticklabels([k.replace("k_share_pos_", "").replace("_", "–") for k in kkeys])
    ax.set_xlabel("relative turn position t/T of the anchor")
    ax.set_ylabel("share of continuations")
    ax.set_title(f"Prefix budget by position, (M, N) = ({M}, {N})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
