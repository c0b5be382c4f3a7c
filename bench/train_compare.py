"""Every method from the same policy at equal budget M(1+N) on the embedded testbed.

The testbed (``trace_core.warmstart.testbed``) is a QA pool of 128 questions whose success is
spread the way a pretrained model's is over a training set; its warm-up split is what the
informed predictor is fitted on before RL. For each seed and method: train from the testbed's
policy with the same per-step budget, log every step's contrast figures, and measure **pool
success** (mean success over the whole pool, k samples per prompt, one seed for every method) at
the start, at ``--pool-mid`` and at the end. ``trace`` is the informed TRACE (its predictor fitted
on the warm-up split first), ``trace-cold`` the same without the warm-up; PCL, the ablations and
the posterior-aware TRACE roots (``trace-posterior``, ``trace-posterior-thompson``) are informed;
GRESO (history filter) and DAPO (rounds with a group filter) read no predictor. One process and
one vLLM engine serve every run.

Every figure counts every rollout spent: DAPO's dropped groups are in its rollouts, its effective
ratio and its rollouts per mixed group (every rollout spent over the mixed groups trained on),
and pool success is plotted against the rollouts actually consumed (DAPO may stop a step short
of M(1+N)).

Beside the figures per rollout stand the same per 1,000 generated tokens (what generation time
follows with prefix caching) and per second of rollout wall time (the rollout phase's:
generation, tool steps and prefix scoring): mixed groups trained on, with 90% Poisson score
intervals (``trace_core.metrics.rate_interval``), and the contrastive yield per 1,000 tokens
(rollouts with a nonzero own-node advantage; no interval, they carry a signal together, group by
group), and, where the runs recorded their anchors, the groups method §10's token rule counts:
mixed prompt groups plus expanded anchors whose branch group holds both outcomes (with the same
interval). All are pooled as sums over steps and seeds. The per-second figure needs each step's
``budget/rollout_wall_s``, which runs record from this version on; a results file whose series
lack it shows "–" there, nothing reconstructed from other timings.

Each finished run writes ``<out-dir>/<variant>-seed<seed>/bench_record.json`` (what it measured,
the git commit and the settings). A rerun reuses a record whose commit and settings match, so
the benchmark resumes where it stopped and a new method is added without rerunning the others;
``--fresh`` reruns everything, and ``--any-commit`` also reuses records made at another commit
with the same settings (after a commit that added a method, say; the output lists each reused
record's commit). A run folder without a record resumes from its last checkpoint when it was
started with the same commit and settings, and starts over otherwise.

With ``--tokens-per-step T`` the step's budget is T generated tokens (method §10) for every method
that reads one (``trace-tokens``; GRPO, PCL and VIP as the groups of G it buys); TRACE and the
round rules have no token reading and run at M(1+N), so T is set to what TRACE spends there and
every row shows its tokens a step. That table judges its own targets (fixed before any run):
trace-tokens' mixed groups per 1,000 tokens >= 1.2x TRACE's and >= 3x GRPO's; its effective ratio
and its mixed groups per rollout above PCL's. Each row also says where its trajectories and
tokens went (continuations' share, the anchors' depth) and its cost estimates' error.

Targets (fixed before any run): TRACE's effective ratio >= 1.8x GRPO's; contrastive yield >=
1.5x GRPO's; on effective ratio trace > each single ablation > treepo; TRACE reaches GRPO's final
pool success with <= 70% of GRPO's rollouts, judged only if GRPO's pool-success gain exceeds 3
standard errors of the measurement.

Examples:

    python -m bench.train_compare --testbed runs/testbed            # the full run (~1-2 h)
    python -m bench.train_compare --testbed runs/testbed --quick    # grpo and trace, one seed
    python -m bench.train_compare --testbed runs/testbed --quick --methods grpo trace dapo greso
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bench.harness import VARIANTS, Provenance, SharedEngine

# The policy trains on the CPU; DeepSpeed reads this when the trainer loads it. Not a package
# default: the GPU check runs DeepSpeed on CUDA.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

ABLATIONS = ("trace-root-only", "trace-prefix-only")
ROW_KEYS = ("effective_ratio", "contrastive_yield", "mixed_groups_per_100_rollouts", "rollouts_per_mixed_group",
            "prefix_effective_ratio", "alloc/skipped_share", "budget/generated_tokens")
COUNT_KEYS = ("counts/rollouts", "counts/mixed_groups", "counts/mixed_groups_trained", "counts/activated",
              "counts/dropped_groups", "counts/dropped_rollouts", "counts/contrastive_rollouts",
              "budget/rollout_wall_s", "counts/expanded_anchors", "counts/mixed_anchors")
TABLE = ["method", "seeds", "effective_ratio", "effective_ratio_ci90", "contrastive_yield",
         "rollouts_per_mixed_group", "mixed_groups_per_100_rollouts", "mixed_groups_per_1000_tokens",
         "mixed_groups_per_1000_tokens_ci90", "contrast_groups_per_1000_tokens", "contrast_groups_per_1000_tokens_ci90",
         "contrastive_yield_per_1000_tokens", "mixed_groups_per_rollout_s",
         "mixed_groups_per_rollout_s_ci90",
         "prefix_effective_ratio", "skipped_share", "dropped_rollouts", "pool_success_start", "pool_success_end",
         "rollouts", "warmup_rollouts"]
PER_SECOND = ("mixed_groups_per_rollout_s", "mixed_groups_per_rollout_s_ci90")  # only where the series hold seconds
# Rows made at different commits share one table only because the golden test pins every
# method's steps (trees, allocations, metrics) across them; each reused row names its commit.
EQUIVALENCE = ("rows reused from records made at another commit (reused_records) are tabled with this commit's "
               "because tests/test_golden.py pins every method's first steps across those commits")
RECORD = "bench_record.json"  # a finished run's record: run_one's result, the commit and the settings
STARTED = "bench_settings.json"  # the commit and settings a run folder was started with


# ============================================================================ the record cache
def token_budget(variant: str, args) -> int | None:
    """The generated-token budget a run of ``variant`` gets: ``--tokens-per-step`` for the methods
    that read one (``trace-tokens``, and the methods without expansion or rounds, which spend it as
    groups of G); None for the rest (TRACE's stages and the round rules are counted in
    trajectories), which run at M(1+N) beside them: an equal-token table sets ``--tokens-per-step``
    to what such a method spends at M(1+N), and its rows show each method's tokens a step."""
    from trace_core.methods import get_method

    if args.tokens_per_step is None:
        return None
    rule = get_method(VARIANTS[variant][0])
    return args.tokens_per_step if rule.prices_tokens or not (rule.expands or rule.samples_in_rounds) else None


def run_settings(variant: str, seed: int, args, testbed_hash: str) -> dict:
    """Everything a run's figures depend on besides the code: a record is reused only when these
    and the commit match. (Whether the run measured the shared step-0 pool success itself or was
    handed it does not change its record.) The testbed is named as given, like the data and the
    index: what it is — its settings, data, weights and warm-start code — is ``testbed_hash``, so
    a record is found again from another checkout of the same testbed."""
    method, informed = VARIANTS[variant]
    config = Path(args.config)
    tokens = token_budget(variant, args)
    return {"variant": variant, "method": method, "informed": informed, "seed": seed, "steps": args.steps,
            "pool_mid": args.pool_mid, "pool_k": args.pool_k, "roots_M": args.roots_M,
            "expansion_N": args.expansion_N, "group_size_G": 8, "max_m": args.max_m,
            "testbed": args.testbed, "testbed_hash": testbed_hash,
            "config": str(config),
            "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None,
            "data": args.data, "index": args.index,
            **({"tokens_per_step": tokens} if tokens is not None else {})}


def cached_run(folder: Path, commit: str | None, settings: dict, fresh: bool, any_commit: bool = False
               ) -> dict | None:
    """The record in ``folder`` if it may be reused (same settings, and the same commit unless
    ``any_commit``); otherwise None, and the folder is made ready for a run: kept when it was
    started with this commit and these settings and never finished (the trainer resumes from its
    checkpoint), emptied otherwise (and always with ``fresh``)."""
    def matches(path: Path, other_commits: bool) -> dict | None:
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        same_code = other_commits or (commit is not None and data.get("commit") == commit)
        return data if same_code and data.get("settings") == settings else None

    if not fresh:
        record = matches(folder / RECORD, any_commit)
        if record is not None:
            return record
        if not (folder / RECORD).is_file() and matches(folder / STARTED, False) is not None:
            return None  # an interrupted run with this commit and these settings: resume it
    shutil.rmtree(folder, ignore_errors=True)
    return None


def existing_record(folder: Path, commit: str | None, settings: dict, any_commit: bool) -> dict | None:
    """The reusable record in ``folder``, read only (nothing is removed)."""
    path = folder / RECORD
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    same_code = any_commit or (commit is not None and data.get("commit") == commit)
    return data if same_code and data.get("settings") == settings else None


# ============================================================================ one run
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
        f"budget.tokens_per_step={token_budget(variant, args) or 'null'}",
    ]
    cfg = load_config(TrainConfig, args.config, overrides)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, engine=engine)
    summary = trainer.run()
    history = trainer.state.history
    pool = sorted(([start_record] if start_record else []) + list(summary["pool_success"]), key=lambda r: r["step"])
    return {"variant": variant, "method": method, "seed": seed, "wall_s": time.perf_counter() - t0,
            "series": {k: history.get(k, []) for k in (*ROW_KEYS, "reward/mean", *COUNT_KEYS)},
            "pool_success": pool, "warmup_rollouts": (summary["warmup"] or {}).get("rollouts", 0.0),
            "rollouts_per_step": cfg.budget.spec().total, "cost_fractions": summary["cost_fractions"]}


def run_or_reuse(variant: str, seed: int, args, engine: SharedEngine, start_record: dict | None,
                 provenance: Provenance, testbed_hash: str) -> tuple[dict, str | None]:
    """A run's result and, when it came from a record, the commit that record was made at (None:
    it ran now and wrote its record, stamped with ``provenance``: the checkout as the benchmark
    found it when it started, not as it is when the run ends)."""
    commit = provenance.commit
    folder = Path(args.out_dir) / f"{variant}-seed{seed}"
    settings = run_settings(variant, seed, args, testbed_hash)
    cached = cached_run(folder, commit, settings, args.fresh, args.any_commit)
    if cached is not None:
        return cached["run"], str(cached.get("commit"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STARTED).write_text(json.dumps({"commit": commit, "settings": settings}, indent=1))
    run = run_one(variant, seed, args, engine.get(), start_record)
    # kept in the record too, so a record copied without its trees (committed, say) still tables it
    run["allocation_shift"] = allocation_shift(folder)
    record = json.dumps({"commit": commit, "dirty": provenance.dirty, "settings": settings, "run": run}, indent=1,
                        default=float)
    (folder / f".{RECORD}.tmp").write_text(record)
    os.replace(folder / f".{RECORD}.tmp", folder / RECORD)  # a record is whole or absent
    return run, None


# ============================================================================ what a token budget shifted
SHIFT_KEYS = ("continuation_trajectory_share", "continuation_token_share", "mean_anchor_depth",
              "root_cost_error", "anchor_cost_error")


def allocation_shift(folder: Path) -> dict[str, float] | None:
    """What a run spent on roots and on continuations, read from its saved trees, and its cost
    estimates' mean relative error per step, read from its last checkpoint's history (method §10's
    ``tokens/*_cost_error``; NaN where the method estimates no cost): the continuations' share of
    the trajectories and of the generated tokens, and the mean depth (turns before the branch) of
    the anchors they branch from. None when the folder holds no trees (a run folder since
    removed: a results file keeps what was read while it was there)."""
    from trace_core.tree import load_trees

    files = sorted((folder / "trees").glob("step*.jsonl.gz"))
    if not files:
        return None
    count = {"bare": 0, "continuation": 0}
    tokens = {"bare": 0, "continuation": 0}
    depths: list[int] = []
    for path in files:
        for tree in load_trees(path):
            for traj in tree.trajectories:
                count[traj.kind] += 1
                if traj.kind == "continuation":
                    depths.append(tree.nodes[traj.branch_node].depth)
            for node in tree.nodes:
                if node.kind in tokens:
                    tokens[node.kind] += int(sum(node.loss_mask))
    history = checkpoint_history(folder)

    def mean_error(kind: str) -> float:
        return _mean_finite([float(x) for x in history.get(f"tokens/{kind}_cost_error", [])])

    return {"continuation_trajectory_share": count["continuation"] / max(sum(count.values()), 1),
            "continuation_token_share": tokens["continuation"] / max(sum(tokens.values()), 1),
            "mean_anchor_depth": float(np.mean(depths)) if depths else float("nan"),
            "root_cost_error": mean_error("root"), "anchor_cost_error": mean_error("anchor")}


def checkpoint_history(folder: Path) -> dict:
    """The per-step history a run folder's last checkpoint holds (every step's logged figures);
    empty when the folder has no checkpoint."""
    from trace_core.training.step_history import run_history

    return run_history(folder)


def complete_series(run: dict, folder: Path) -> dict:
    """``run`` with every count its record lacks (a record made before that count was recorded)
    taken from the same run's checkpointed history, where the folder still holds it and it has a
    value for every step; nothing is estimated, and a count found nowhere stays absent."""
    missing = [k for k in COUNT_KEYS if k not in run["series"]]
    if not missing:
        return run
    history = checkpoint_history(folder)
    steps = len(run["series"]["counts/rollouts"])
    found = {k: history[k] for k in missing if len(history.get(k, [])) == steps}
    return {**run, "series": {**run["series"], **found}} if found else run


def pool_curve(run: dict) -> tuple[np.ndarray, np.ndarray]:
    """(training rollouts consumed, pool success) at the measured steps: the rollouts the steps
    before each measurement actually spent (a round rule may spend less than M(1+N) a step)."""
    steps = [int(r["step"]) for r in run["pool_success"]]
    spent = np.concatenate([[0.0], np.cumsum(run["series"]["counts/rollouts"])])
    return spent[steps], np.array([r["success"] for r in run["pool_success"]])


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


def _totals(run: dict, key: str) -> float:
    return float(sum(run["series"][key]))


def _mean_finite(values: list[float]) -> float:
    finite = [x for x in values if np.isfinite(x)]
    return float(np.mean(finite)) if finite else float("nan")


def yield_count(run: dict) -> float:
    """Rollouts with a nonzero own-node advantage, summed over steps (each step's yield is that
    step's rollouts with one, per 100 rollouts; a run that logged the count itself gives the
    same number)."""
    from trace_core.training.summary import contrastive_rollouts

    return contrastive_rollouts(run["series"]["contrastive_yield"], run["series"]["counts/rollouts"])


def rollout_seconds(run: dict) -> float | None:
    """The rollout phase's wall time summed over steps; None when the series do not hold it for
    every step (runs recorded before it was logged)."""
    wall = run["series"].get("budget/rollout_wall_s") or []
    return float(sum(wall)) if len(wall) == len(run["series"]["counts/rollouts"]) and wall else None


def per_cost(runs: list[dict]) -> dict:
    """Mixed groups trained on and the contrastive yield, pooled over ``runs``, per 1,000
    generated tokens and per second of rollout wall time, with 90% Poisson score intervals for
    the mixed groups (the per-second figures None unless every run holds its seconds)."""
    from trace_core.metrics import per_exposure, rate_interval

    mixed = int(round(sum(_totals(r, "counts/mixed_groups_trained") for r in runs)))
    # method §10's objective: mixed prompt groups and mixed branch groups (expanded anchors whose
    # branch group holds both outcomes), only where every run recorded its anchors
    branch = [r["series"].get("counts/mixed_anchors") for r in runs]
    contrast = mixed + int(round(sum(sum(b) for b in branch))) if runs and all(b is not None for b in branch) else None
    tokens = sum(_totals(r, "budget/generated_tokens") for r in runs)
    seconds = [rollout_seconds(r) for r in runs]
    out: dict = {
        "mixed_groups_per_1000_tokens": per_exposure(mixed, tokens, 1000.0),
        "mixed_groups_per_1000_tokens_ci90": list(rate_interval(mixed, tokens, 1000.0)),
        "contrast_groups_per_1000_tokens": None if contrast is None else per_exposure(contrast, tokens, 1000.0),
        "contrast_groups_per_1000_tokens_ci90": None if contrast is None else list(rate_interval(contrast, tokens,
                                                                                                1000.0)),
        "contrastive_yield_per_1000_tokens": per_exposure(round(sum(yield_count(r) for r in runs)), tokens, 1000.0),
        "mixed_groups_per_rollout_s": None, "mixed_groups_per_rollout_s_ci90": None,
    }
    if runs and all(x is not None for x in seconds):
        out["mixed_groups_per_rollout_s"] = per_exposure(mixed, sum(seconds))
        out["mixed_groups_per_rollout_s_ci90"] = list(rate_interval(mixed, sum(seconds)))
    return out


def summarise(runs: list[dict], variants: list[str], pool_k: int, pool_size: int) -> tuple[list[dict], dict]:
    """One row per method: every ratio pooled as counts over steps and seeds with its 90% Wilson
    interval (``learning_table.pooled``), the per-seed values beside it. The prefix effective
    ratio is the mean over steps (the series hold no per-step anchor counts)."""
    from bench.learning_table import pooled

    rows = []
    grpo = [r for r in runs if r["variant"] == "grpo"]
    grpo_final = float(np.mean([r["pool_success"][-1]["success"] for r in grpo]))
    grpo_start = float(np.mean([r["pool_success"][0]["success"] for r in grpo]))
    grpo_rollouts = float(np.mean([pool_curve(r)[0][-1] for r in grpo]))
    # The measurement's standard error: a mean over pool_size prompts x k Bernoulli samples.
    se = float(np.sqrt(max(grpo_final * (1 - grpo_final), 1e-12) / (pool_size * pool_k)) * np.sqrt(2))
    for v in variants:
        mine = sorted((r for r in runs if r["variant"] == v), key=lambda r: r["seed"])
        eff = pooled((_totals(r, "counts/mixed_groups") for r in mine), (_totals(r, "counts/activated") for r in mine))
        yld = pooled((yield_count(r) for r in mine), (_totals(r, "counts/rollouts") for r in mine))
        per_rollout = pooled((_totals(r, "counts/mixed_groups_trained") for r in mine),
                             (_totals(r, "counts/rollouts") for r in mine))
        rollouts = [_totals(r, "counts/rollouts") for r in mine]
        mixed = [_totals(r, "counts/mixed_groups_trained") for r in mine]
        tokens = [_totals(r, "budget/generated_tokens") for r in mine]
        row: dict = {
            "method": v, "seeds": [int(r["seed"]) for r in mine],
            "effective_ratio": eff["value"], "effective_ratio_ci90": eff["ci90"],
            "effective_ratio_per_seed": [_totals(r, "counts/mixed_groups") / _totals(r, "counts/activated")
                                         for r in mine],
            "contrastive_yield": 100 * yld["value"], "contrastive_yield_ci90": [100 * c for c in yld["ci90"]],
            "mixed_groups_per_100_rollouts": 100 * per_rollout["value"],
            "mixed_groups_per_100_rollouts_ci90": [100 * c for c in per_rollout["ci90"]],
            **per_cost(mine),
            "rollouts_per_mixed_group": sum(rollouts) / sum(mixed) if sum(mixed) else float("nan"),
            "prefix_effective_ratio": _mean_finite([x for r in mine for x in r["series"]["prefix_effective_ratio"]]),
            "skipped_share": float(np.mean([x for r in mine for x in r["series"]["alloc/skipped_share"]])),
            "generated_tokens": float(np.mean(tokens)) / len(mine[0]["series"]["counts/rollouts"]),
            "dropped_rollouts": float(np.mean([sum(r["series"]["counts/dropped_rollouts"]) for r in mine])),
            "pool_success_start": float(np.mean([r["pool_success"][0]["success"] for r in mine])),
            "pool_success_end": float(np.mean([r["pool_success"][-1]["success"] for r in mine])),
            "rollouts": float(np.mean(rollouts)),
            "warmup_rollouts": float(np.mean([r["warmup_rollouts"] for r in mine])),
        }
        shifts = [r["allocation_shift"] for r in mine if r.get("allocation_shift")]
        row["allocation_shift"] = ({k: _mean_finite([x[k] for x in shifts]) for k in SHIFT_KEYS}
                                   if len(shifts) == len(mine) else None)
        reach = [rollouts_to_reach(r, grpo_final) for r in mine]
        row["rollouts_to_grpo_final"] = (None if any(x is None for x in reach) else
                                         {"warmup_excluded": float(np.mean(reach)),
                                          "warmup_included": float(np.mean(reach)) + row["warmup_rollouts"]})
        rows.append(row)
    return rows, {"grpo_final": grpo_final, "grpo_start": grpo_start, "grpo_rollouts": grpo_rollouts,
                  "measurement_se": se, "grpo_gain_measurable": (grpo_final - grpo_start) > 3 * se}


def matched_ratio(runs: list[dict], a: str, b: str, num: str | tuple[str, ...], den: str
                  ) -> tuple[float, float, list[int]]:
    """Pooled ``num/den`` of methods ``a`` and ``b`` over the seeds both have, and those seeds
    (``num``: a series, a tuple of series summed, or "yield")."""
    seeds = sorted({r["seed"] for r in runs if r["variant"] == a} & {r["seed"] for r in runs if r["variant"] == b})

    def ratio(v: str) -> float:
        mine = [r for r in runs if r["variant"] == v and r["seed"] in seeds]
        keys = (num,) if isinstance(num, str) else num
        top = sum(yield_count(r) if num == "yield" else sum(_totals(r, k) for k in keys) for r in mine)
        return top / sum(_totals(r, den) for r in mine)

    return ratio(a), ratio(b), seeds


def per_token_ratio(runs: list[dict], a: str, b: str) -> tuple[float, float, list[int]]:
    """Mixed groups trained on per 1,000 generated tokens of methods ``a`` and ``b``, pooled over
    the seeds both have, and those seeds."""
    tr, gr, seeds = matched_ratio(runs, a, b, "counts/mixed_groups_trained", "budget/generated_tokens")
    return 1000 * tr, 1000 * gr, seeds


def judge_tokens(rows: list[dict], runs: list[dict]) -> dict[str, str]:
    """The equal-token targets (method §10, fixed before any run), each over the seeds both
    compared methods have: trace-tokens' mixed groups per 1,000 generated tokens >= 1.2x trace's and
    >= 3x grpo's; its effective ratio and its mixed groups per rollout above pcl's."""
    by = {r["method"]: r for r in rows}
    out: dict[str, str] = {}
    if "trace-tokens" not in by:
        return out
    for other, target in (("trace", 1.2), ("grpo", 3.0)):
        if other in by:
            mine, theirs, seeds = per_token_ratio(runs, "trace-tokens", other)
            out[f"trace-tokens mixed groups per 1k tokens >= {target}x {other}"] = (
                ("PASS " if mine >= target * theirs else "MISS ")
                + f"{mine:.3f} vs {theirs:.3f} ({mine / theirs:.2f}x, seeds {seeds})")
    if "pcl" in by:
        for label, num, den in (("effective ratio", "counts/mixed_groups", "counts/activated"),
                                ("mixed groups per rollout", "counts/mixed_groups_trained", "counts/rollouts")):
            mine, theirs, seeds = matched_ratio(runs, "trace-tokens", "pcl", num, den)
            out[f"trace-tokens {label} above pcl"] = (("PASS " if mine > theirs else "MISS ")
                                                      + f"{mine:.4f} vs {theirs:.4f} (seeds {seeds})")
    out.update(per_token_signal(runs, [m for m in ("trace", "grpo", "pcl") if m in by]))
    return out


def _times(a: float, b: float) -> str:
    """``a`` as a multiple of ``b`` ("–" where ``b`` is 0)."""
    return f"{a / b:.2f}x" if b else "–"


def per_token_signal(runs: list[dict], others: list[str]) -> dict[str, str]:
    """Reported beside the targets, no verdict: trace-tokens against each of ``others`` per 1,000
    generated tokens on the token rule's own scale (method §10: mixed prompt groups plus mixed
    branch groups, where both methods' runs recorded their anchors) and in rollouts with a nonzero
    own-node advantage (the contrastive yield), over the seeds both have."""
    out = {}
    contrast = ("counts/mixed_groups_trained", "counts/mixed_anchors")
    for other in others:
        pair = [r for r in runs if r["variant"] in ("trace-tokens", other)]
        figures = []
        if all("counts/mixed_anchors" in r["series"] for r in pair):
            mine, theirs, seeds = matched_ratio(runs, "trace-tokens", other, contrast, "budget/generated_tokens")
            figures.append(f"mixed prompt + branch groups {1000 * mine:.3f} vs {1000 * theirs:.3f} "
                           f"({_times(mine, theirs)})")
        mine, theirs, seeds = matched_ratio(runs, "trace-tokens", other, "yield", "budget/generated_tokens")
        figures.append(f"yield {1000 * mine:.2f} vs {1000 * theirs:.2f} ({_times(mine, theirs)})")
        out[f"trace-tokens vs {other} per 1k tokens (reported, no target)"] = ", ".join(figures) + f" (seeds {seeds})"
    return out


def judge(rows: list[dict], pool: dict, runs: list[dict]) -> dict[str, str]:
    """The fixed targets, each over the seeds both compared methods have, on unrounded values."""
    by = {r["method"]: r for r in rows}
    out = {}
    for name, num, den, target in (("trace effective ratio >= 1.8x grpo", "counts/mixed_groups", "counts/activated",
                                    1.8),
                                   ("trace contrastive yield >= 1.5x grpo", "yield", "counts/rollouts", 1.5)):
        tr, gr, seeds = matched_ratio(runs, "trace", "grpo", num, den)
        out[name] = ("PASS " if tr / gr >= target else "MISS ") + (
            f"{tr:.4f} vs {gr:.4f} ({tr / gr:.3f}x, seeds {seeds})")
    if all(a in by for a in (*ABLATIONS, "treepo")):
        seeds = sorted(set.intersection(*({r["seed"] for r in runs if r["variant"] == m}
                                          for m in ("trace", *ABLATIONS, "treepo"))))
        eff = {m: matched_ratio([r for r in runs if r["seed"] in seeds], m, m, "counts/mixed_groups",
                                "counts/activated")[0] for m in ("trace", *ABLATIONS, "treepo")}
        order = (all(eff["trace"] > eff[a] for a in ABLATIONS) and all(eff[a] > eff["treepo"] for a in ABLATIONS))
        out["ablation order trace > each single > treepo"] = ("PASS " if order else "MISS ") + ", ".join(
            f"{m} {eff[m]:.4f}" for m in eff) + f" (seeds {seeds})"
    if "pcl" in by:
        figures = []
        for label, num, den in (("effective ratio", "counts/mixed_groups", "counts/activated"),
                                ("yield", "yield", "counts/rollouts"),
                                ("mixed groups per rollout", "counts/mixed_groups_trained", "counts/rollouts")):
            tr, pc, seeds = matched_ratio(runs, "trace", "pcl", num, den)
            figures.append(f"{label} {tr:.4f} vs {pc:.4f}")
        out["trace vs pcl (reported, no target)"] = ", ".join(figures) + f" (seeds {seeds})"
    if not pool["grpo_gain_measurable"]:
        out["trace reaches grpo final pool success with <= 70% of its rollouts"] = (
            f"not measurable at this size (grpo {pool['grpo_start']:.3f} -> {pool['grpo_final']:.3f}, "
            f"3 SE = {3 * pool['measurement_se']:.3f})")
    else:
        reach = by["trace"]["rollouts_to_grpo_final"]
        share = None if reach is None else reach["warmup_excluded"] / pool["grpo_rollouts"]
        out["trace reaches grpo final pool success with <= 70% of its rollouts"] = (
            ("PASS " if share is not None and share <= 0.7 else "MISS ")
            + ("never reached" if share is None else f"{100 * share:.0f}% of grpo's rollouts (warm-up excluded)"))
    return out


def results_runs(data: dict) -> list[dict]:
    """The runs of a results file, rebuilt from its per-run series in the shape ``make_runs``
    returns (what :func:`summarise`, the targets and :func:`plot` read)."""
    old_rows = {r["method"]: r for r in data["rows"]}
    runs = []
    for name, series in data["series"].items():
        variant, seed = name.rsplit("/seed", 1)
        warmup = series.get("warmup_rollouts", old_rows[variant]["warmup_rollouts"])
        runs.append({"variant": variant, "seed": int(seed), "series": series, "pool_success": series["pool_success"],
                     "warmup_rollouts": warmup, "allocation_shift": series.get("allocation_shift")})
    return runs


def retable(path: Path) -> dict:
    """The table of a results file recomputed from its own per-run series (nothing else read):
    rows, pool-success measurement and targets. Returns the recomputed file."""
    data = json.loads(path.read_text())
    runs = results_runs(data)
    variants = [r["method"] for r in data["rows"]]
    rows, pool = summarise(runs, variants, data["budget"]["pool_k"], data.get("pool_size", 128))
    targets = (judge_tokens(rows, runs) if data["budget"].get("tokens_per_step") is not None
               else judge(rows, pool, runs))
    return {**data, "rows": rows, "pool_success_measurement": pool, "targets": targets, "provenance": EQUIVALENCE}


def plot(runs: list[dict], variants: list[str], path: Path) -> None:
    """Three panels: each method's effective ratio (mean over steps, a dot per seed), the same per
    step, and pool success against the rollouts spent. Eleven methods need more colours than the
    default cycle's ten: tab20 gives each its own."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), gridspec_kw={"width_ratios": [1.2, 1, 1]})
    colours = plt.get_cmap("tab20")
    for i, v in enumerate(variants):
        mine = [r for r in runs if r["variant"] == v]
        colour = colours(i % 20)
        per_seed = [_totals(r, "counts/mixed_groups") / _totals(r, "counts/activated") for r in mine]
        axes[0].bar(i, np.mean(per_seed), color=colour)
        axes[0].scatter([i] * len(per_seed), per_seed, color="black", s=10, zorder=3)
        eff = np.nanmean([r["series"]["effective_ratio"] for r in mine], axis=0)
        axes[1].plot(np.arange(len(eff)), eff, marker="o", ms=3, color=colour, label=v)
        x, _ = pool_curve(mine[0])
        y = np.mean([pool_curve(r)[1] for r in mine], axis=0)
        axes[2].plot(x, y, marker="o", ms=3, color=colour, label=v)
    axes[0].set_xticks(range(len(variants)), variants, rotation=45, ha="right", fontsize=8)
    axes[0].set(ylabel="effective ratio (pooled over steps)", ylim=(0, 1),
                title="Effective ratio per method (dots: seeds)")
    axes[1].set(xlabel="step", ylabel="effective ratio", ylim=(0, 1), title="Per step (mean over seeds)")
    axes[2].set(xlabel="training rollouts", ylabel="pool success", title="Pool success (same seeds for all)")
    axes[2].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.train_compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--testbed", default="runs/testbed",
                    help="a testbed warm start's folder (policy/, pool.jsonl, warmup.jsonl, testbed.json): "
                         "python -m trace_core.warmstart --testbed --out runs/testbed ...")
    ap.add_argument("--methods", nargs="+", choices=list(VARIANTS), default=None,
                    help="variants to run (default: all of them; with --quick: grpo and trace)")
    ap.add_argument("--quick", action="store_true", help="one seed, 4 steps (grpo and trace unless --methods)")
    ap.add_argument("--fresh", action="store_true", help="rerun every run, ignoring the records of earlier ones")
    ap.add_argument("--any-commit", action="store_true",
                    help="reuse records with the same settings made at another commit too")
    ap.add_argument("--runs-only", action="store_true",
                    help="run (or reuse) the runs and write their records, no table: for runs split over "
                         "processes, combined afterwards with --reuse-only")
    ap.add_argument("--reuse-only", action="store_true",
                    help="run nothing: the table of every requested run that has a matching record")
    ap.add_argument("--config", default="configs/testbed.yaml")
    ap.add_argument("--data", default="data")
    ap.add_argument("--index", default="artifacts/qa_index")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--pool-mid", type=int, default=5, help="pool success is also measured before this step")
    ap.add_argument("--pool-k", type=int, default=4, help="samples per pool prompt for pool success")
    ap.add_argument("--roots-M", dest="roots_M", type=int, default=32)
    ap.add_argument("--expansion-N", dest="expansion_N", type=int, default=1)
    ap.add_argument("--max-m", type=int, default=8, help="M_max")
    ap.add_argument("--tokens-per-step", type=int, default=None,
                    help="a budget of generated tokens per step (method §10) instead of M(1+N) trajectories: for "
                         "trace-tokens and the methods without expansion or rounds (grpo, pcl, vip), at equal tokens")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--ablation-seeds", type=int, nargs="+", default=None,
                    help="seeds for the ablations and treepo (default: --seeds)")
    ap.add_argument("--out-dir", default="runs/bench_train_compare")
    ap.add_argument("--out", type=Path, default=Path("bench/results/train_compare.json"))
    ap.add_argument("--retable", type=Path, default=None, metavar="RESULTS",
                    help="run nothing: recompute a results file's table (and its plot) from its own per-run "
                         "series and rewrite them")
    return ap


def parse_args() -> tuple[argparse.Namespace, list[str]]:
    """The arguments (``--quick``'s seeds and steps applied) and the variants to run."""
    args = build_parser().parse_args()
    variants = list(args.methods) if args.methods else (["grpo", "trace"] if args.quick else list(VARIANTS))
    if not args.runs_only and not {"grpo", "trace"} <= set(variants):
        raise SystemExit(f"--methods must include grpo and trace (the targets compare them), got {variants}")
    if args.quick:
        args.seeds, args.steps, args.pool_mid = args.seeds[:1], 4, 2
    return args, variants


def load_testbed(folder: str) -> dict:
    """The testbed's description, with the committed success spread only where it was measured on
    this very policy (the same :func:`~trace_core.warmstart.testbed.testbed_identity`: settings,
    data, warm-start code and weights)."""
    from trace_core.warmstart.testbed import testbed_identity

    testbed = json.loads((Path(folder) / "testbed.json").read_text())
    frozen = Path("bench/results/testbed.json")
    spread = json.loads(frozen.read_text()) if frozen.is_file() else {}
    testbed["identity"] = testbed_identity(folder)
    testbed["spread"] = spread.get("spread") if spread.get("identity") == testbed["identity"] else None
    return testbed


def requested_runs(args: argparse.Namespace, variants: list[str], commit: str | None,
                   testbed_hash: str) -> Iterator[tuple[str, int]]:
    """(variant, seed) of every run to make or reuse: the ablations and treepo only at
    ``--ablation-seeds``; with ``--reuse-only``, only the runs that have a matching record."""
    for seed in args.seeds:
        for v in variants:
            if v in (*ABLATIONS, "treepo") and args.ablation_seeds is not None and seed not in args.ablation_seeds:
                continue
            if args.reuse_only and existing_record(Path(args.out_dir) / f"{v}-seed{seed}", commit,
                                                   run_settings(v, seed, args, testbed_hash), args.any_commit) is None:
                print(f"{v} seed {seed}: no matching record, left out", flush=True)
                continue
            yield v, seed


def print_run(variant: str, seed: int, run: dict, made_at: str | None) -> None:
    print(f"{variant} seed {seed}: effective ratio {np.nanmean(run['series']['effective_ratio']):.3f}, "
          f"pool success {run['pool_success'][0]['success']:.3f} -> "
          f"{run['pool_success'][-1]['success']:.3f} ({run['wall_s']:.0f} s"
          f"{'' if made_at is None else f', from its record (commit {made_at[:10]})'})", flush=True)


def make_runs(args: argparse.Namespace, variants: list[str], provenance: Provenance,
              testbed_hash: str) -> tuple[list[dict], dict[str, str]]:
    """Every requested run, made now or reused from its record, and the commit of each reused one."""
    engine = SharedEngine(f"{args.testbed}/policy")
    runs: list[dict] = []
    reused: dict[str, str] = {}  # run -> the commit its record was made at
    start: dict | None = None  # the pool success at step 0: the same policy and seeds for every run
    for v, seed in requested_runs(args, variants, provenance.commit, testbed_hash):
        run, made_at = run_or_reuse(v, seed, args, engine, start, provenance, testbed_hash)
        folder = Path(args.out_dir) / f"{v}-seed{seed}"
        shift = allocation_shift(folder) or run.get("allocation_shift")
        run = {**complete_series(run, folder), "allocation_shift": shift}
        runs.append(run)
        if made_at is not None:
            reused[f"{v}-seed{seed}"] = made_at
        start = start or run["pool_success"][0]
        print_run(v, seed, run, made_at)
    engine.close()
    return runs, reused


def _interval(ci: list[float] | None, digits: int = 3) -> str | None:
    return None if ci is None else "[{:.{d}f}, {:.{d}f}]".format(*ci, d=digits)


def print_comparison(rows: list[dict], targets: dict[str, str], pool_k: int) -> None:
    """The table (aligned columns; the per-second ones only where some run holds its seconds),
    the targets, then the table as README quotes it (markdown)."""
    from bench.bench_tables import print_table

    timed = any(r.get("mixed_groups_per_rollout_s") is not None for r in rows)
    shown = [{**r, "seeds": len(r["seeds"]), "effective_ratio_ci90": _interval(r["effective_ratio_ci90"]),
              "mixed_groups_per_1000_tokens_ci90": _interval(r.get("mixed_groups_per_1000_tokens_ci90")),
              "contrast_groups_per_1000_tokens_ci90": _interval(r.get("contrast_groups_per_1000_tokens_ci90")),
              "mixed_groups_per_rollout_s_ci90": _interval(r.get("mixed_groups_per_rollout_s_ci90"))} for r in rows]
    print_table(shown, [c for c in TABLE if timed or c not in PER_SECOND])
    if not timed:
        print("  mixed groups per rollout second: no run here recorded its rollout wall time (budget/rollout_wall_s)")
    for name, verdict in targets.items():
        print(f"  {name}: {verdict}")
    shifted = [{"method": r["method"], **r["allocation_shift"]} for r in rows if r.get("allocation_shift")]
    if shifted:
        print("\nWhere the trajectories and tokens went (from the runs' trees; cost errors: mean relative, per step)")
        print_table(shifted, ["method", *SHIFT_KEYS])
    print()
    print(markdown_table(rows, pool_k))


def markdown_table(rows: list[dict], pool_k: int) -> str:
    """The table as README quotes it: pooled ratios with their 90% intervals, the per-seed
    effective ratios, and the per-rollout, per-token and (where recorded) per-second figures."""
    from bench.bench_tables import fixed, format_markdown, places

    def with_ci(value: float | None, ci: list[float] | None, digits: int) -> str | None:
        if value is None or not np.isfinite(value):
            return None
        return f"{value:.{digits}f}" + ("" if ci is None else " " + _interval(ci, digits))

    timed = any(r.get("mixed_groups_per_rollout_s") is not None for r in rows)
    contrasted = any(r.get("contrast_groups_per_1000_tokens") is not None for r in rows)
    shown = []
    for r in rows:
        row = {
            "method": r["method"], "seeds": len(r["seeds"]),
            "eff. ratio [90% CI]": with_ci(r["effective_ratio"], r["effective_ratio_ci90"], 3),
            "per seed": " / ".join(f"{x:.3f}" for x in r["effective_ratio_per_seed"]),
            "yield /100 [90% CI]": with_ci(r["contrastive_yield"], r["contrastive_yield_ci90"], 1),
            "mixed /100 rollouts": r["mixed_groups_per_100_rollouts"],
            "mixed /1k tokens [90% CI]": with_ci(r["mixed_groups_per_1000_tokens"],
                                                 r.get("mixed_groups_per_1000_tokens_ci90"), 2),
            "yield /1k tokens": r.get("contrastive_yield_per_1000_tokens"),
        }
        if contrasted:
            row["mixed + branch /1k tokens [90% CI]"] = with_ci(r.get("contrast_groups_per_1000_tokens"),
                                                                r.get("contrast_groups_per_1000_tokens_ci90"), 2)
        if timed:
            row["mixed / rollout s [90% CI]"] = with_ci(r["mixed_groups_per_rollout_s"],
                                                        r["mixed_groups_per_rollout_s_ci90"], 3)
        row.update({"rollouts / mixed group": r["rollouts_per_mixed_group"],
                    "prefix eff. (step mean)": r["prefix_effective_ratio"],
                    "gen. tokens / step": r["generated_tokens"],
                    f"pool start → end (k={pool_k})": f"{r['pool_success_start']:.3f} → {r['pool_success_end']:.3f}"})
        shown.append(row)
    digits = places({"mixed /100 rollouts": 2, "yield /1k tokens": 2, "rollouts / mixed group": 1,
                     "prefix eff. (step mean)": 3, "gen. tokens / step": 0})
    return format_markdown(shown, list(shown[0]) if shown else None, {**digits, "seeds": fixed(0)})


def write_results(args: argparse.Namespace, provenance: Provenance, reused: dict[str, str], testbed: dict,
                  rows: list[dict], pool: dict, targets: dict[str, str], runs: list[dict], wall: float) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": " ".join(["python -m bench.train_compare", *sys.argv[1:]]), "commit": provenance.commit,
        "dirty": provenance.dirty, "reused_records": reused,
        "testbed": {"hash": testbed["hash"], "identity": testbed["identity"], "spread": testbed.get("spread")},
        "budget": {"M": args.roots_M, "N": args.expansion_N, "G": 8, "steps": args.steps, "seeds": args.seeds,
                   "pool_k": args.pool_k, "tokens_per_step": args.tokens_per_step},
        "rows": rows, "pool_success_measurement": pool, "targets": targets,
        "pool_size": len(testbed["pool"]), "provenance": EQUIVALENCE,
        "series": {f"{r['variant']}/seed{r['seed']}": {**r["series"], "pool_success": r["pool_success"],
                                                       "warmup_rollouts": r["warmup_rollouts"],
                                                       "allocation_shift": r.get("allocation_shift")}
                   for r in runs}, "wall_s": wall}, indent=1, default=float))


def main() -> None:
    args, variants = parse_args()
    if args.retable is not None:
        data = retable(args.retable)
        print_comparison(data["rows"], data["targets"], data["budget"]["pool_k"])
        args.retable.write_text(json.dumps(data, indent=1, default=float))
        plot(results_runs(data), [r["method"] for r in data["rows"]], args.retable.with_suffix(".png"))
        print(f"recomputed {args.retable} and {args.retable.with_suffix('.png')} from its own series")
        return
    testbed = load_testbed(args.testbed)
    t0 = time.perf_counter()
    provenance = Provenance.now()  # once, before any run: a later edit does not relabel this run's records
    # a record is reused only on the same testbed policy: its settings carry the whole identity
    runs, reused = make_runs(args, variants, provenance, json.dumps(testbed["identity"], sort_keys=True))
    if args.runs_only:
        print(f"{len(runs)} run records in {args.out_dir} ({time.perf_counter() - t0:.0f} s)")
        return
    variants = [v for v in variants if any(r["variant"] == v for r in runs)]
    rows, pool = summarise(runs, variants, args.pool_k, len(testbed["pool"]))
    targets = judge_tokens(rows, runs) if args.tokens_per_step is not None else judge(rows, pool, runs)
    print_comparison(rows, targets, args.pool_k)
    write_results(args, provenance, reused, testbed, rows, pool, targets, runs, time.perf_counter() - t0)
    plot(runs, variants, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
