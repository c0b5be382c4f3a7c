"""The learning benchmark: does a method's learning signal become a better policy for the same
rollouts? Learning curves of every method from the same testbed policy, pool and seeds.

Each run trains one method from the embedded testbed's policy (``trace_core.warmstart.testbed``)
for ``--steps`` steps at the per-step budget M(1+N) and measures **pool success** — k ≥ 8
samples of every pool prompt, the same request seeds for every method and measurement — at every
tenth of the run. The start (step 0) is one shared measurement of the testbed policy
(``start.json``), so no two methods start from different draws of the same policy. After the last
step the final policy's **held-out pass@1** is measured on the testbed's held-out questions (QA
test-split questions on the testbed's topics: in neither the pool nor the warm-up split).

**One policy, committed.** The testbed's SFT is reproducible on one machine but not bit for bit
across CPUs (the same data and code gave another weight digest on another CPU), so the policy
every run starts from is committed with the records (``testbed/``: its weights, tokenizer, pool,
warm-up split and retriever index, 3.5 MB), and ``run`` refuses a start record measured on any
other policy. A later session on another machine continues the same benchmark from those files.

**Records anyone can recompute.** Each finished run writes one small JSON record under
``--records`` (per-step counts, the pool-success samples per prompt, the prompts it opened and
whether their trees showed both outcomes, its held-out samples, the commit with a dirty flag, the
settings); ``python -m bench.learning table`` recomputes the whole table and the plots from those
records alone (``bench/learning_table.py``: pooled counts with 90% Wilson intervals, per-seed
values, matched-seed comparisons, verdicts on unrounded values). A rerun skips every run whose
record has the same settings, so the benchmark continues across processes and sessions; a run
folder under ``--work`` with no record resumes from its last checkpoint.

**The protocol, frozen before any other method ran**: the run length and the policy's RL
learning rate were chosen on GRPO alone (``pilot`` records, ``--records
bench/results/learning_pilot``) and are the defaults below (``STEPS``, ``LEARNING_RATE``); the
README says how. Changing them makes new records (their settings differ).

**Targets** (fixed before the runs): GRPO's pool-success gain from start to end exceeds 3
standard errors (measurement sampling and the spread over seeds); TRACE reaches GRPO's final pool
success with ≤ 70% of GRPO's rollouts (warm-up counted and not counted); TRACE's final pool
success at equal rollouts exceeds GRPO's by more than 2 standard errors; TRACE's area under the
curve is the highest of the paper's methods (GRPO, PCL, TreePO).

**Cost.** A 100-step run with 11 measurements at k = 8 took 43–48 min on two cores with two or
three runs side by side (measured: the GRPO pilots and the first runs); runs are independent, so
they split over processes (each ``run --methods ... --seeds ...`` in its own process with its own
``--work`` folder and ``OMP_NUM_THREADS=1``), and every finished record is kept.

Examples:

    python -m bench.learning run --methods grpo --seeds 0 1 2      # from the committed testbed
    python -m bench.learning run --methods trace pcl --seeds 0
    python -m bench.learning table                      # from bench/results/learning/ alone
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from bench.harness import VARIANTS, Provenance, SharedEngine, claim_run_folder, save_figure, write_json
from bench.learning_table import RECORD_FORMAT, START_FORMAT, build_table, curve, in_se

# The policy trains on the CPU; DeepSpeed reads this when the trainer loads it. Not a package
# default: the GPU check runs DeepSpeed on CUDA.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

RECORDS = "bench/results/learning"  # the committed records, and the committed testbed under testbed/
STEPS = 100  # the run length, chosen on GRPO alone (module docstring)
LEARNING_RATE = 1e-4  # the policy's RL learning rate, chosen on GRPO alone
POOL_K = 8  # samples per pool prompt of every pool-success measurement
HELDOUT_K = 8  # samples per held-out question
STEP_KEYS = {"rollouts": "counts/rollouts", "generated_tokens": "budget/generated_tokens",
             "activated": "counts/activated", "mixed_groups": "counts/mixed_groups",
             "mixed_groups_trained": "counts/mixed_groups_trained", "dropped_rollouts": "counts/dropped_rollouts",
             "expanded_anchors": "counts/expanded_anchors", "mixed_anchors": "counts/mixed_anchors",
             "contrastive_yield": "contrastive_yield", "skipped_share": "alloc/skipped_share",
             "reward": "reward/mean"}


# ============================================================================ settings
def measure_steps(steps: int) -> list[int]:
    """Every tenth of the run (rounded), and the last step; step 0 is the shared start."""
    return sorted({max(1, round(steps * i / 10)) for i in range(1, 11)} | {steps})


def run_settings(variant: str, seed: int, args: argparse.Namespace, identity: dict) -> dict:
    """Everything a run's figures depend on besides the code (a record is reused only when its
    settings are these)."""
    method, informed = VARIANTS[variant]
    return {"variant": variant, "method": method, "informed": informed, "seed": seed, "steps": args.steps,
            "lr": args.lr, "pool_k": args.pool_k, "measure_at": measure_steps(args.steps),
            "heldout_k": args.heldout_k, "roots_M": args.roots_M, "expansion_N": args.expansion_N,
            "group_size_G": 8, "max_m": args.max_m, "testbed": identity,
            "config": Path(args.config).name,
            **({"tokens_per_step": args.tokens_per_step} if args.tokens_per_step is not None else {})}


def record_path(records: Path, variant: str, seed: int) -> Path:
    return records / "runs" / f"{variant}-seed{seed}.json"


def overrides(args: argparse.Namespace, variant: str, seed: int, out: Path, at: list[int]) -> list[str]:
    method, informed = VARIANTS[variant]
    tb = Path(args.testbed)
    return [
        f"method={method}", f"seed={seed}", f"steps={args.steps}", f"policy_model={tb / 'policy'}",
        f"output_dir={out}", "task.family=qa", f"task.data_dir={args.data}", f"task.train_file={tb / 'pool.jsonl'}",
        f"task.index_dir={args.index}", "progress=false", f"policy.lr={args.lr}",
        f"tracking.tracking_uri=sqlite:///{Path(args.work).resolve() / 'mlflow.db'}",
        "tracking.experiment=bench-learning", f"budget.roots_M={args.roots_M}",
        f"budget.expansion_N={args.expansion_N}", "budget.group_size_G=8", f"budget.max_per_prompt={args.max_m}",
        "predictor.task_family=qa", f"pool_success.samples={args.pool_k}", f"pool_success.at_steps={at}",
        f"predictor_warmup.task_file={tb / 'warmup.jsonl' if informed else 'null'}",
        f"budget.tokens_per_step={'null' if args.tokens_per_step is None else args.tokens_per_step}",
    ]


# ============================================================================ measuring
def per_prompt_successes(path: Path, k: int) -> dict[str, int]:
    data = json.loads(path.read_text())
    return {pid: int(round(float(v) * k)) for pid, v in data["per_prompt"].items()}


def measure_start(args: argparse.Namespace, engine: SharedEngine, identity: dict, provenance: Provenance,
                  start: dict | None = None) -> dict:
    """The shared starting point of every run, measured once on the testbed policy: its pool
    success at step 0 through the trainer's own measurement (same request seeds as every run's)
    and its held-out pass@1 (the same request seed as every final policy's). ``start``: an
    earlier start record without the held-out figure, completed here."""
    from trace_core.config import load_config
    from trace_core.tracking import tracked_run
    from trace_core.training.config import TrainConfig
    from trace_core.training.trainer import Trainer

    out = Path(args.work) / "start"
    cfg = load_config(TrainConfig, args.config, overrides(args, "grpo", 0, out, []))
    trainer = Trainer(cfg, engine=engine.get())
    with tracked_run(trainer.tracker):  # its own MLflow run, FINISHED when measured
        if start is None:
            record = trainer.measure_pool_success(0)
            trainer.tracker.log_metrics({"pool/success": record["success"]}, 0)
        heldout = measure_heldout(trainer, heldout_tasks(args), args.heldout_k)
    if start is not None:  # completed later, perhaps by other code: the figure names its own commit
        return {**start, "heldout": {**heldout, "commit": provenance.commit, "dirty": provenance.dirty}}
    measure = {"step": 0, "samples": args.pool_k,
               "successes": per_prompt_successes(out / "pool_success" / "step00000.json", args.pool_k)}
    return {"format": START_FORMAT, "commit": provenance.commit, "dirty": provenance.dirty, "testbed": identity,
            "pool_k": args.pool_k, "measure": measure, "heldout": heldout}


def heldout_tasks(args: argparse.Namespace):
    from trace_core.training.trainer import read_tasks
    from trace_core.warmstart.testbed import heldout_rows, read_rows, write_split

    rows, _ = read_rows(Path(args.data) / "qa" / "test.jsonl")
    bed = json.loads((Path(args.testbed) / "testbed.json").read_text())
    held = heldout_rows(rows, bed)
    path = write_split(rows, [r["id"] for r in held], Path(args.work) / "heldout.jsonl")
    return read_tasks(path)


def measure_heldout(trainer, tasks, k: int) -> dict:
    """k samples of every held-out question by the trained policy (the engine holds its final
    weights), one request seed for every method."""
    from trace_core.evaluation.success import measure_success
    from trace_core.rollout.executor import TreeRolloutExecutor
    from trace_core.seeding import derive_seed

    executor = TreeRolloutExecutor(trainer.engine, trainer.tokenizer, trainer.env_factory, trainer.cfg.agent)
    return {"samples": k, "successes": measure_success(executor, tasks, k, derive_seed("heldout", 0)).successes}


def opened_prompts(out: Path) -> list[dict]:
    """Every prompt each step opened: its bare rollouts and whether its tree showed both outcomes."""
    from trace_core.metrics import is_success
    from trace_core.tree import load_trees

    opened = []
    for path in sorted((out / "trees").glob("step*.jsonl.gz")):
        step = int(path.name[4:9])
        for tree in load_trees(path):
            wins = is_success(tree.outcomes())
            opened.append({"step": step, "prompt": tree.prompt_id, "bare": len(tree.bare_trajectories()),
                           "rollouts": int(wins.size), "both_outcomes": bool(wins.any() and not wins.all())})
    return opened


def run_one(variant: str, seed: int, args: argparse.Namespace, engine: SharedEngine, settings: dict,
            provenance: Provenance, tasks_heldout) -> dict:
    from trace_core.config import load_config
    from trace_core.training.config import TrainConfig
    from trace_core.training.trainer import Trainer

    out = Path(args.work) / f"{variant}-seed{seed}"
    claim_run_folder(out, provenance.commit, settings)
    cfg = load_config(TrainConfig, args.config, overrides(args, variant, seed, out, settings["measure_at"]))
    t0 = time.perf_counter()
    trainer = Trainer(cfg, engine=engine.get())
    summary = trainer.run()
    history = trainer.state.history
    heldout = measure_heldout(trainer, tasks_heldout, args.heldout_k)
    pool = [{"step": s, "samples": args.pool_k,
             "successes": per_prompt_successes(out / "pool_success" / f"step{s:05d}.json", args.pool_k)}
            for s in settings["measure_at"]]
    return {"format": RECORD_FORMAT, "variant": variant, "method": settings["method"], "seed": seed,
            "commit": provenance.commit, "dirty": provenance.dirty, "settings": settings,
            "steps": {name: [float(x) for x in history.get(key, [])] for name, key in STEP_KEYS.items()},
            "pool": pool, "warmup": {"rollouts": float((summary["warmup"] or {}).get("rollouts", 0.0)),
                                     "generated_tokens": float((summary["warmup"] or {}).get("generated_tokens", 0.0))},
            "heldout": heldout, "opened": opened_prompts(out), "wall_s": time.perf_counter() - t0}


# ============================================================================ commands
def cmd_run(args: argparse.Namespace) -> None:
    from trace_core.warmstart.testbed import testbed_identity

    identity = testbed_identity(args.testbed)
    provenance = Provenance.now()  # the code this process runs is the code it loaded now
    records = Path(args.records)
    engine = SharedEngine(str(Path(args.testbed) / "policy"))
    start_file = records / "start.json"
    if start_file.is_file():
        start = json.loads(start_file.read_text())
        if start["testbed"] != identity or start["pool_k"] != args.pool_k:
            raise SystemExit(f"{start_file} was measured on testbed {start['testbed']} at k = {start['pool_k']}, "
                             f"not on {identity} at k = {args.pool_k}: use another --records folder")
        if "heldout" not in start:  # a start recorded before the starting policy's held-out pass@1 was
            write_json(start_file, measure_start(args, engine, identity, provenance, start))
    else:
        t0 = time.perf_counter()
        write_json(start_file, measure_start(args, engine, identity, provenance))
        print(f"start: measured in {time.perf_counter() - t0:.0f} s -> {start_file}", flush=True)
    start = json.loads(start_file.read_text())
    tasks = None
    try:
        for seed in args.seeds:
            for variant in args.methods:
                path = record_path(records, variant, seed)
                settings = run_settings(variant, seed, args, identity)
                if path.is_file() and json.loads(path.read_text())["settings"] == settings:
                    print(f"{variant} seed {seed}: record present, skipped", flush=True)
                    continue
                tasks = tasks if tasks is not None else heldout_tasks(args)
                record = run_one(variant, seed, args, engine, settings, provenance, tasks)
                write_json(path, record)
                _, y = curve(record, start, "rollouts")
                print(f"{variant} seed {seed}: pool success {y[0]:.3f} -> {y[-1]:.3f}, held-out "
                      f"{np.mean(list(record['heldout']['successes'].values())) / args.heldout_k:.3f} "
                      f"({record['wall_s']:.0f} s) -> {path}", flush=True)
    finally:
        engine.close()


def load_records(records: Path) -> tuple[list[dict], dict]:
    runs = [json.loads(p.read_text()) for p in sorted((records / "runs").glob("*.json"))]
    start = json.loads((records / "start.json").read_text())
    for r in runs:
        if r["settings"]["testbed"] != start["testbed"]:
            raise SystemExit(f"{r['variant']} seed {r['seed']} ran on testbed {r['settings']['testbed']}, the start "
                             f"was measured on {start['testbed']}")
    return runs, start


def testbed_truth(start: dict, spread_files: list[Path]) -> tuple[dict[str, int] | None, int]:
    """The committed per-prompt spread of the first of ``spread_files`` measured on this testbed
    policy (None when none was)."""
    for spread_file in spread_files:
        if not spread_file.is_file():
            continue
        frozen = json.loads(spread_file.read_text())
        if frozen.get("identity") == start["testbed"]:
            pool = frozen["spread"]["pool"]
            return pool["successes"], int(pool["samples"])
    return None, 0


def provenance(runs: list[dict], start: dict) -> dict:
    commits: dict[str, list[str]] = {}
    for r in [start, *runs]:
        name = "start" if r is start else f"{r['variant']}-seed{r['seed']}"
        commits.setdefault(f"{r['commit']}{' (dirty)' if r['dirty'] else ''}", []).append(name)
    return {"commits": commits,
            "equivalence": "rows made at different commits are compared as one table because tests/test_golden.py "
                           "pins every method's steps (trees, allocations, metrics) across those commits"}


def cmd_table(args: argparse.Namespace) -> dict:
    records = Path(args.records)
    runs, start = load_records(records)
    if args.seeds is not None:  # a view over these seeds only, so every method's figures share them
        if not args.out:
            raise SystemExit("table --seeds: give --out (a view over some seeds must not replace the committed table)")
        runs = [r for r in runs if r["seed"] in args.seeds]
    spreads = [Path(args.spread)] if args.spread else [records / "spread.json", Path("bench/results/testbed.json")]
    truth, k = testbed_truth(start, spreads)
    table = build_table(runs, start, truth, k or 8)
    table["provenance"] = provenance(runs, start)
    table["settings"] = {key: runs[0]["settings"][key] for key in ("steps", "lr", "pool_k", "measure_at",
                                                                    "roots_M", "expansion_N", "max_m")} if runs else {}
    out = Path(args.out) if args.out else records / "table.json"
    figure = out.with_suffix(".png") if args.out else records / "learning.png"
    write_json(out, table)
    print_table(table)
    if not args.no_plot:
        plot(runs, start, figure)
    if args.mlflow:
        log_to_mlflow(args.mlflow, out, figure, runs, start)
    print(f"wrote {out}" + ("" if args.no_plot else f" and {figure}"))
    return table


def print_table(table: dict) -> None:
    from bench.bench_tables import print_table as show

    rows = []
    for m, sig in table["signal"].items():
        pool, held = table["pool"][m], table["heldout"][m]
        lo, hi = sig["effective_ratio"]["ci90"]
        rows.append({"method": m, "seeds": len(sig["seeds"]), "eff. ratio": sig["effective_ratio"]["value"],
                     "90% CI": f"[{lo:.3f}, {hi:.3f}]", "mixed/100": sig["mixed_groups_per_100_rollouts"]["value"],
                     "mixed/1k tok": sig["mixed_groups_per_1000_tokens"], "rollouts/step": sig["rollouts_per_step"],
                     "pool start": pool["start"], "pool final": pool["final"], "± SE": pool["final_se"],
                     "at equal rollouts": pool["at_equal_rollouts"], "AUC": pool["area"],
                     "to grpo final": pool.get("rollouts_to_grpo_final"), "held-out": held["value"]})
    show(rows, list(rows[0]))
    g = table["grpo_gain"]
    print(f"  grpo gain {g['start']:.4f} -> {g['end']:.4f} = {g['gain']:+.4f}, SE {g['se']:.4f} "
          f"({in_se(g['gain'], g['se']):.2f} SE)")
    for name, verdict in table["targets"].items():
        print(f"  {name}: {verdict}")
    for pair, d in (table.get("differences_at_equal_tokens") or {}).items():
        if d is not None:
            print(f"  {pair} at {d['at_tokens']:,.0f} generated tokens: {d['difference']:+.4f} "
                  f"({in_se(d['difference'], d['se']):.2f} SE), area {d['area_difference']:+.4f} (seeds {d['seeds']})")


def plot(runs: list[dict], start: dict, path: Path) -> None:
    """Pool success against cumulative training rollouts and generated tokens, warm-up not
    counted (top) and counted (bottom): a line per method (mean over its seeds), its seeds' range
    as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = sorted({r["variant"] for r in runs}, key=lambda m: (m != "grpo", m))
    fig, axes = plt.subplots(2, 2, figsize=(13, 8), sharey=True)
    colours = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")  # tab20's pairs are too alike for few lines
    for i, m in enumerate(methods):
        mine = [r for r in runs if r["variant"] == m]
        for row, warm in enumerate((False, True)):
            for col, axis in enumerate(("rollouts", "tokens")):
                curves = [curve(r, start, axis, warm) for r in mine]
                x = np.mean([c[0] for c in curves], axis=0)
                ys = np.array([c[1] for c in curves])
                ax = axes[row, col]
                ax.plot(x, ys.mean(axis=0), marker="o", ms=3, color=colours(i), label=f"{m} ({len(mine)})")
                if len(mine) > 1:
                    ax.fill_between(x, ys.min(axis=0), ys.max(axis=0), color=colours(i), alpha=0.15)
    for row, warm in enumerate(("warm-up not counted", "warm-up counted")):
        axes[row, 0].set(xlabel="cumulative training rollouts", ylabel="pool success", title=f"per rollout ({warm})")
        axes[row, 1].set(xlabel="cumulative generated tokens", title=f"per generated token ({warm})")
    axes[0, 1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    save_figure(fig, path)


def log_to_mlflow(uri: str, table: Path, figure: Path, runs: list[dict], start: dict) -> str:
    """Log the table to the MLflow tracking server at ``uri`` (experiment ``bench-learning``,
    :func:`bench.harness.log_benchmark_table`): each method's final pool success, area and
    effective ratio on the parent run; one nested run per record whose ``pool/success`` metric is
    the learning curve, its step the cumulative training rollouts (``pool/success_by_tokens``: the
    same curve, its step the cumulative generated tokens), and its final held-out pass@1."""
    from bench.harness import CurveRun, log_benchmark_table

    data = json.loads(table.read_text())
    summary = {name: value for m, row in data["pool"].items()
               for name, value in ((f"{m}/pool_final", row["final"]), (f"{m}/auc", row["area"]),
                                   (f"{m}/effective_ratio", data["signal"][m]["effective_ratio"]["value"]))}
    curves = [CurveRun(name=f"{r['variant']}-seed{r['seed']}",
                       params={"method": r["variant"], "seed": r["seed"], "commit": r["commit"], "dirty": r["dirty"]},
                       curves={"pool/success": curve(r, start, "rollouts"),
                               "pool/success_by_tokens": curve(r, start, "tokens")},
                       metrics={"heldout/pass_at_1": float(np.mean(list(r["heldout"]["successes"].values())))
                                / r["heldout"]["samples"]})
              for r in runs]
    return log_benchmark_table(uri, "bench-learning", "learning-table", table, figure, summary, curves)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.learning", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="make every missing record (resumable)")
    run.add_argument("--testbed", default=f"{RECORDS}/testbed", help="a testbed warm start's folder: by default "
                     "the benchmark's committed one (its policy's weights and its retriever index), so a run on "
                     "any machine starts from the same policy; python -m bench.testbed --out DIR builds another")
    run.add_argument("--methods", nargs="+", choices=list(VARIANTS), default=["grpo", "trace"])
    run.add_argument("--seeds", type=int, nargs="+", default=[0])
    run.add_argument("--steps", type=int, default=STEPS)
    run.add_argument("--lr", type=float, default=LEARNING_RATE, help="the policy's RL learning rate")
    run.add_argument("--pool-k", type=int, default=POOL_K, help="samples per pool prompt (>= 2; the benchmark: 8)")
    run.add_argument("--heldout-k", type=int, default=HELDOUT_K, help="samples per held-out question (>= 2)")
    run.add_argument("--roots-M", dest="roots_M", type=int, default=32)
    run.add_argument("--expansion-N", dest="expansion_N", type=int, default=1)
    run.add_argument("--max-m", type=int, default=8, help="M_max")
    run.add_argument("--tokens-per-step", type=int, default=None,
                     help="a budget of generated tokens per step (method §10) instead of M(1+N) trajectories, for "
                          "trace-tokens and the methods without expansion or rounds (grpo, pcl, vip); give such runs "
                          "their own --records folder, so that their table compares them at equal tokens")
    run.add_argument("--config", default="configs/testbed.yaml")
    run.add_argument("--data", default="data")
    run.add_argument("--index", default=None, help="the QA retriever index (default: the testbed folder's "
                     "qa_index, else artifacts/qa_index)")
    run.add_argument("--work", default="runs/bench_learning", help="run folders (checkpoints, trees; not committed)")
    run.add_argument("--records", default=RECORDS, help="the committed records")
    table = sub.add_parser("table", help="recompute the table and plots from the records alone")
    table.add_argument("--records", default=RECORDS)
    table.add_argument("--spread", default=None,
                       help="the testbed's measured spread (truth for the truly-mixed reading); default: the "
                       "records' own spread.json, else bench/results/testbed.json, whichever was measured on "
                       "the records' testbed policy")
    table.add_argument("--no-plot", action="store_true")
    table.add_argument("--seeds", type=int, nargs="+", default=None,
                       help="only the records of these seeds (e.g. the seeds every compared method has); "
                            "write the view with --out, not over the committed table")
    table.add_argument("--out", default=None, help="where to write the table JSON (default: RECORDS/table.json)")
    table.add_argument("--mlflow", default=None, help="also log the table and plot to this MLflow tracking URI")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        if args.pool_k < 2 or args.heldout_k < 2 or args.steps < 1:  # a prompt's rollouts form a group: >= 2
            raise SystemExit(f"--pool-k and --heldout-k must be >= 2 and --steps >= 1, got {args.pool_k}, "
                             f"{args.heldout_k}, {args.steps}")
        if args.index is None:
            committed = Path(args.testbed) / "qa_index"
            args.index = str(committed if committed.is_dir() else Path("artifacts/qa_index"))
        cmd_run(args)
    else:
        cmd_table(args)


if __name__ == "__main__":
    sys.exit(main())
