"""Contrast benchmark on the simulator: at equal total budget M(1+N), the
effective ratio, prefix effective ratio, contrastive yield (method §7) and rollouts per mixed group
of GRPO (G = 8), PCL, TreePO, TRACE with an oracle, a noisy and a learned predictor, both
ablations, the history-based and round baselines GRESO, DAPO (both as their authors run them:
they spend what their rounds sample, reported as ``spent``) and our budget-capped DAPO
(``dapo-capped``), the posterior-aware TRACE roots (exact and Thompson) and Knapsack-RL's
history-based budgets (``knapsack-rl``; ARPO reads token entropies the simulator does not have, so
it is not here) — in both simulator modes: fresh i.i.d. prompts every step, and a persistent pool
whose prompts recur and drift. Both budget kinds (method §10): every row above at its trajectory
budget, and GRPO, PCL, Knapsack-RL and the token-priced ``trace-tokens`` at an equal budget of
generated tokens, with mixed groups per 1,000 generated tokens for all of them.

    python -m bench.contrast [--quick] [--workers 2] [--seed 0] [--out bench/results/contrast.json]
    python -m bench.contrast --posterior-sweep --seed 100     # how the posterior's defaults were fixed
    python -m bench.contrast --quick --token-budget-only      # only the two budget kinds' table

Protocol (fixed before any result was seen; the simulator's defaults are pinned in
``trace_core.sim.SimConfig`` and ``PersistentPoolConfig``, the methods' in
``trace_core.history`` and ``trace_core.allocation``, and none is tuned here):

- Shapes (M, N) = (512, 2), (512, 6), (1024, 2); G = 8, M_max = 16, pool B = 4·M(1+N)/G.
- Every run lasts ``--total-steps`` (20) steps; the last ``--report-steps`` (8) are averaged
  (rollouts per mixed group: pooled as counts over them). In the i.i.d. mode the learned
  predictor starts untrained and learns online from its own method's trees during the first 12
  (warm-up) steps and keeps learning while reported; each of its figures is out-of-sample
  (scored before it trains on the step). Fixed predictors (oracle, noisy) and the uniform
  methods run only the reported steps there. In the persistent mode every row runs every step
  (the pool drifts with what the method trains on, and histories accumulate).
- Step ``s`` of every row of a cell draws the same candidate pool (i.i.d.: the generator of step
  ``s`` is seeded by (seed, M, N, pool factor, Beta parameter, s); persistent: one dataset per
  cell, the same epoch order for every row): common random numbers, so method differences are
  not pool noise.
- PCL, the ablations and the posterior rows use the same predictor as the TRACE row they are
  listed with; GRPO, TreePO, GRESO and both DAPO rows never read predictions.
- Noisy predictor: ``sigmoid(logit V + N(0, σ))``, σ = 2 by default; a sweep over σ reports the
  Spearman each σ achieves against the hidden V.
- VIP (``vip``) reads the predictor's score as its Gaussian process's input (``trace_core.vip``):
  its rows use the noisy and the learned predictor of the TRACE rows; its batch is GRPO's draw of
  M(1+N)/G prompts and its budget GRPO's M(1+N).
- Sensitivity (i.i.d.): the Beta parameter a ∈ {0.1, 0.15, 0.3} × the pool factor ∈ {1, 2, 4},
  for GRPO, TreePO, TRACE-oracle and TRACE-learned, at (M, N) = (512, 2).
- Token budget (method §10): ``T = M(1+N)·E[rollout tokens]`` generated tokens a step (the
  simulator's expected root rollout, ``trace_core.sim.expected_rollout_tokens``: what a trajectory
  budget of M(1+N) root rollouts would generate). GRPO and PCL get the groups of G that T buys at
  the expected costs; ``trace-tokens`` plans its roots and reservation and spends each prompt's
  allowance. Each row keeps its own cost ledger (``trace_core.token_ledger.TokenLedger``) across its steps.
  Mixed groups per 1,000 tokens are pooled as counts over the reported steps, the trained mixed
  prompt groups alone and with the expanded anchors whose branch group holds both outcomes (the
  token budget's objective).
- ``--posterior-sweep`` (not part of the reported run): the posterior's prior strength ×
  discount × evidence window on the persistent pool at (M, N) = (256, 2), learned and noisy
  predictors; the pinned defaults are its argmin of pooled rollouts per mixed group (mean over
  the two predictors) on the tuning seed 100, fixed before any reported run.

Targets at the pinned defaults (every shape, i.i.d. mode): TRACE-oracle ≥ 2.2× GRPO's effective
ratio, TRACE-learned ≥ 1.8×; both-active > each single ablation > neither (TreePO) on the
effective ratio. Prints tables; writes ``bench/results/contrast.json`` (``contrast_quick.json``
with ``--quick``, ``contrast.posterior_sweep.json`` with ``--posterior-sweep``) and a PNG next to it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from bench.harness import save_figure

DEFAULT_NOISE_STD = 2.0  # trace_core.sim.DEFAULT_NOISE_STD (checked in main; the library loads after --help)

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
    ("greso", "greso", "none"),
    ("dapo", "dapo", "none"),
    ("dapo-capped", "dapo-capped", "none"),
    ("trace-posterior / oracle", "trace-posterior", "oracle"),
    ("trace-posterior / noisy", "trace-posterior", "noisy"),
    ("trace-posterior / learned", "trace-posterior", "learned"),
    ("trace-posterior-thompson / noisy", "trace-posterior-thompson", "noisy"),
    ("trace-posterior-thompson / learned", "trace-posterior-thompson", "learned"),
    ("vip / noisy", "vip", "noisy"),
    ("vip / learned", "vip", "learned"),
    ("knapsack-rl", "knapsack-rl", "none"),
]
MODES = ("iid", "persistent")
# At an equal budget of generated tokens (method §10): (label, method, predictor kind)
TOKEN_ROWS: list[tuple[str, str, str]] = [
    ("grpo", "grpo", "none"),
    ("pcl / oracle", "pcl", "oracle"),
    ("pcl / learned", "pcl", "learned"),
    ("trace-tokens / oracle", "trace-tokens", "oracle"),
    ("trace-tokens / noisy", "trace-tokens", "noisy"),
    ("trace-tokens / learned", "trace-tokens", "learned"),
    ("knapsack-rl", "knapsack-rl", "none"),
]
# Rows of the main table shown beside them at their trajectory budget (the --token-budget-only run runs them too)
TOKEN_REFERENCE_ROWS = [r for r in ROWS if r[0] in ("grpo", "pcl / oracle", "trace / oracle", "trace / learned")]
# --posterior-sweep: prior strength s × discount γ × evidence window W (trace-posterior, persistent pool)
SWEEP_STRENGTHS = (1.0, 2.0, 4.0, 8.0, 16.0)
SWEEP_DISCOUNTS = (0.5, 0.7, 0.9)
SWEEP_WINDOWS = (4, 8)
SWEEP_PREDICTORS = ("learned", "noisy")
SENS_ROWS = [r for r in ROWS if r[0] in ("grpo", "treepo", "trace / oracle", "trace / learned")]
BETAS = (0.1, 0.15, 0.3)
POOL_FACTORS = (1, 2, 4)
NOISE_STDS = (0.5, 1.0, 2.0, 4.0, 8.0)
METRICS = (  # the simulator's step metrics carry the trainer's names (trace_core.metrics.step_metrics)
    "effective_ratio", "prefix_effective_ratio", "contrastive_yield", "counts/activated", "alloc/skipped_share",
    "alloc/mean_m_selected", "alloc/mean_rollouts_selected", "turns_generated", "reward/mean",
    "spearman_root_vs_true", "spearman_anchor_vs_true", "spearman_root_vs_target", "spearman_prefix_vs_target",
    "rollouts_per_mixed_group", "counts/mixed_groups_trained", "mixed_groups_per_100_rollouts",
    "counts/dropped_groups", "alloc/rounds", "counts/rollouts", "pool_success",
    "budget/generated_tokens", "contrast/mixed_per_1k_tokens", "contrast/yield_per_1k_tokens",
    "mixed_groups_with_anchors_per_1k_tokens",
    "tokens/reservation_share", "tokens/rho", "tokens/extra_roots", "tokens/root_cost_error",
    "tokens/anchor_cost_error",
)
TARGET_ORACLE, TARGET_LEARNED = 2.2, 1.8


@dataclasses.dataclass(frozen=True)
class Task:
    """One row of one cell: a method with a predictor, run for some steps in one simulator mode."""

    group: str  # "main", "sensitivity", "noise" or "posterior_sweep"
    label: str
    method: str
    predictor: str  # "none" (methods that read no prediction), "oracle", "noisy", "learned"
    roots_M: int
    expansion_N: int
    pool_factor: int
    beta: float
    noise_std: float
    total_steps: int
    report_steps: int
    seed: int
    mode: str = "iid"  # "iid" (fresh prompts every step) or "persistent" (a recurring, drifting pool)
    posterior: tuple[float, float, int] | None = None  # (prior_strength, discount, evidence_window) override
    budget: str = "trajectories"  # "trajectories" (M(1+N) a step) or "tokens" (an equal budget of generated tokens)

    @property
    def steps(self) -> range:
        """Learned predictors and the persistent pool run every step; the rest only the reported ones."""
        every = self.predictor == "learned" or self.mode == "persistent"
        first = 0 if every else self.total_steps - self.report_steps
        return range(first, self.total_steps)

    def cost(self) -> float:
        return len(self.steps) * self.roots_M * (1 + self.expansion_N)


def run_task(task: Task) -> dict:
    from trace_core.allocation import BudgetSpec, PosteriorRoots
    from trace_core.history import PosteriorConfig, PromptHistory
    from trace_core.methods import get_method
    from trace_core.sim import PersistentPool, SimConfig, make_predictor, run_step, sim_token_ledger

    config = SimConfig(difficulty_beta=task.beta)
    spec = BudgetSpec(task.roots_M, task.expansion_N, pool_factor=task.pool_factor,
                      tokens_per_step=token_budget(task, config) if task.budget == "tokens" else None)
    ledger = sim_token_ledger(config)
    kind = "oracle" if task.predictor == "none" else task.predictor
    predictor = make_predictor(kind, config, seed=task.seed, noise_std=task.noise_std)
    cell = [task.seed, task.roots_M, task.expansion_N, task.pool_factor, round(task.beta * 1000)]
    method = get_method(task.method)
    if task.posterior is not None:  # the sweep: the same method with another posterior configuration
        rule = PosteriorRoots(PosteriorConfig(*task.posterior))
        method = dataclasses.replace(method, root_rule=rule)
    pool = history = None
    if task.mode == "persistent":  # one dataset per cell, shared by every row of it
        pool = PersistentPool(spec.pool_size, config, seed=int(np.random.SeedSequence([*cell, 7]).generate_state(1)[0]))
        history = PromptHistory()
    per_step, curve, pool_curve = [], [], []
    t0, c0 = time.perf_counter(), time.process_time()
    for s in task.steps:
        rng = np.random.default_rng([*cell, s])
        result = run_step(method, spec, predictor, rng, config, pool=pool, history=history, ledger=ledger)
        ledger = result.token_ledger
        curve.append(result.metrics["effective_ratio"])
        if pool is not None:
            pool_curve.append(result.pool_success)
        if s >= task.total_steps - task.report_steps:
            per_step.append(result.metrics)
    return {
        "task": dataclasses.asdict(task),
        "steps_run": len(task.steps),
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
        "effective_ratio_by_step": curve,
        "tokens_per_step": spec.tokens_per_step,
        "pool_success_by_step": pool_curve,
        "reported": summarise(per_step),
    }


def token_budget(task: Task, config: object) -> int:
    """The equal token budget of a task's shape: M(1+N) expected root rollouts' generated tokens."""
    from trace_core.sim import expected_rollout_tokens

    return int(round(task.roots_M * (1 + task.expansion_N) * expected_rollout_tokens(config)))


def summarise(per_step: list[dict]) -> dict:
    out = {}
    keys = list(METRICS) + sorted(k for k in per_step[0] if k.startswith("k_share_pos"))
    for k in keys:
        vals = np.array([m.get(k, np.nan) for m in per_step], dtype=np.float64)
        finite = vals[np.isfinite(vals)]
        out[k] = {
            "mean": float(finite.mean()) if finite.size else None,
            "std": float(finite.std(ddof=1)) if finite.size > 1 else None,
        }
    # ratios over several steps are pooled as counts
    mixed = sum(m["counts/mixed_groups_trained"] for m in per_step)
    out["rollouts_per_mixed_group_pooled"] = {
        "mean": sum(m["counts/rollouts"] for m in per_step) / mixed if mixed else None, "std": None,
    }
    tokens = sum(m["budget/generated_tokens"] for m in per_step)
    anchors = sum(m["counts/mixed_anchors"] for m in per_step)
    out["mixed_groups_per_1k_tokens_pooled"] = {"mean": 1000 * mixed / tokens if tokens else None, "std": None}
    out["mixed_groups_with_anchors_per_1k_tokens_pooled"] = {
        "mean": 1000 * (mixed + anchors) / tokens if tokens else None, "std": None,
    }
    return out


def build_tasks(args: argparse.Namespace) -> list[Task]:
    common = dict(total_steps=args.total_steps, report_steps=args.report_steps, seed=args.seed)
    tasks = []
    if args.posterior_sweep:
        M, N = args.sweep_shape
        for pred in SWEEP_PREDICTORS:
            tasks.append(Task("posterior_sweep", f"trace / {pred}", "trace", pred, M, N, 4, 0.15, DEFAULT_NOISE_STD,
                              mode="persistent", **common))
            for s in SWEEP_STRENGTHS:
                for g in SWEEP_DISCOUNTS:
                    for w in SWEEP_WINDOWS:
                        tasks.append(Task("posterior_sweep", f"s={s:g} γ={g:g} W={w} / {pred}", "trace-posterior",
                                          pred, M, N, 4, 0.15, DEFAULT_NOISE_STD, mode="persistent",
                                          posterior=(s, g, w), **common))
        return tasks
    for mode in MODES:
        for M, N in args.shapes:
            for label, method, pred in TOKEN_REFERENCE_ROWS if args.token_budget_only else ROWS:
                tasks.append(Task("main", label, method, pred, M, N, 4, 0.15, DEFAULT_NOISE_STD, mode=mode, **common))
            for label, method, pred in TOKEN_ROWS:
                tasks.append(Task("tokens", label, method, pred, M, N, 4, 0.15, DEFAULT_NOISE_STD, mode=mode,
                                  budget="tokens", **common))
    if args.token_budget_only:
        return tasks
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


def last_pool_success(res: dict) -> float | None:
    """The dataset's success after a persistent-pool run's last step (None for the i.i.d. mode)."""
    return res["pool_success_by_step"][-1] if res["pool_success_by_step"] else None


def k_share_keys(res: dict) -> list[str]:
    """The metrics of the prefix budget's share by relative turn position, in position order."""
    return sorted(k for k in res["reported"] if k.startswith("k_share_pos"))


def print_figures(rows: list[dict], title: str, digits: dict[str, int] | int | None = None) -> None:
    """``rows`` through the benchmarks' one table printer, figures to ``digits`` decimal places (one
    count for every column, or per column; text as it is)."""
    from bench.bench_tables import cell, fixed, places, print_table

    fmt = cell if digits is None else fixed(digits) if isinstance(digits, int) else places(digits)
    print_table(rows, fmt=fmt, title=title)


class ResultGrid:
    """The finished runs, found by what defines a row of a table: group, label, shape, pool factor,
    Beta parameter, noise and simulator mode."""

    def __init__(self, tasks: list[Task], results: list[dict]) -> None:
        self.runs = {self.key(t.group, t.label, t.roots_M, t.expansion_N, t.pool_factor, t.beta, t.noise_std, t.mode): r
                     for t, r in zip(tasks, results, strict=True)}

    @staticmethod
    def key(group: str, label: str, M: int, N: int, pool_factor: int = 4, beta: float = 0.15,
            noise_std: float = DEFAULT_NOISE_STD, mode: str = "iid") -> tuple:
        return (group, label, M, N, pool_factor, beta, noise_std, mode)

    def main_run(self, label: str, M: int, N: int, mode: str = "iid") -> dict:
        """A row of the main table (pool factor 4, a = 0.15, the default noise)."""
        return self.runs[self.key("main", label, M, N, mode=mode)]

    def token_run(self, label: str, M: int, N: int, mode: str = "iid") -> dict:
        """A row run at the equal token budget (pool factor 4, a = 0.15, the default noise)."""
        return self.runs[self.key("tokens", label, M, N, mode=mode)]

    def get(self, group: str, label: str, M: int, N: int, pool_factor: int = 4, beta: float = 0.15,
            noise_std: float = DEFAULT_NOISE_STD, main_label: str | None = None) -> dict:
        """An i.i.d. run of ``group``; where its cell is the main table's (not run twice), the main
        table's run of ``main_label`` (default: ``label``)."""
        res = self.runs.get(self.key(group, label, M, N, pool_factor, beta, noise_std))
        return res or self.main_run(main_label or label, M, N)


def run_all(tasks: list[Task], workers: int) -> list[dict]:
    order = sorted(range(len(tasks)), key=lambda i: -tasks[i].cost())  # longest first
    results: list[dict | None] = [None] * len(tasks)
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {i: pool.submit(run_task, tasks[i]) for i in order}
            for i, fut in futures.items():
                results[i] = fut.result()
    else:
        for i in order:
            results[i] = run_task(tasks[i])
    return results  # type: ignore[return-value]


def protocol(args: argparse.Namespace) -> dict:
    from trace_core.allocation import DynamicSamplingConfig
    from trace_core.history import GresoConfig, PosteriorConfig
    from trace_core.methods import get_method
    from trace_core.sim import LearnedPredictorConfig, PersistentPoolConfig, SimConfig, sim_token_ledger
    from trace_core.vip import VipConfig

    def rounds(name: str) -> dict:
        rule = get_method(name).group_filter
        return dataclasses.asdict(rule.config if rule is not None else DynamicSamplingConfig())

    return {
        "sim_config": dataclasses.asdict(SimConfig()),
        "persistent_pool": dataclasses.asdict(PersistentPoolConfig()),
        "learned_predictor": dataclasses.asdict(LearnedPredictorConfig(seed=args.seed)),
        "greso": dataclasses.asdict(GresoConfig()),
        "greso_rounds": rounds("greso"),
        "dapo": rounds("dapo"),
        "dapo-capped": rounds("dapo-capped"),
        "posterior": dataclasses.asdict(PosteriorConfig()),
        "vip": dataclasses.asdict(VipConfig()),
        "one_budget": dataclasses.asdict(get_method("trace-tokens").token_rule.config),
        "cost_model": dataclasses.asdict(sim_token_ledger(SimConfig()).cost_model),
        "noise_std_default": DEFAULT_NOISE_STD,
        "group_size_G": 8, "max_per_prompt": 16, "pool_factor": 4,
        "total_steps": args.total_steps, "report_steps": args.report_steps, "seed": args.seed,
    }


# ---------------------------------------------------------------------------------- the posterior sweep
SWEEP_DIGITS = {**{f"r/mix {p}": 2 for p in SWEEP_PREDICTORS}, **{f"eff {p}": 3 for p in SWEEP_PREDICTORS},
                "mean r/mix": 2}  # column: decimal places


def sweep_row(config: str, rpm: dict[str, float], eff: dict[str, float]) -> dict:
    return {"config": config, **{f"r/mix {p}": rpm[p] for p in SWEEP_PREDICTORS},
            **{f"eff {p}": eff[p] for p in SWEEP_PREDICTORS}, "mean r/mix": float(np.mean(list(rpm.values())))}


def posterior_sweep(args: argparse.Namespace, tasks: list[Task], results: list[dict], wall: float) -> int:
    """The tuning run that fixed PosteriorConfig's defaults (criterion stated in the docstring)."""
    by_label = {t.label: r for t, r in zip(tasks, results, strict=True)}
    rows, table = [], []
    for s, g, w in itertools.product(SWEEP_STRENGTHS, SWEEP_DISCOUNTS, SWEEP_WINDOWS):
        res = {p: by_label[f"s={s:g} γ={g:g} W={w} / {p}"] for p in SWEEP_PREDICTORS}
        rpm = {p: mean_of(r, "rollouts_per_mixed_group_pooled") for p, r in res.items()}
        eff = {p: mean_of(r, "effective_ratio") for p, r in res.items()}
        rows.append({"prior_strength": s, "discount": g, "evidence_window": w, "rollouts_per_mixed_group": rpm,
                     "effective_ratio": eff, "criterion": float(np.mean(list(rpm.values())))})
        table.append(sweep_row(f"s={s:g} γ={g:g} W={w}", rpm, eff))
    ref = {p: mean_of(by_label[f"trace / {p}"], "rollouts_per_mixed_group_pooled") for p in SWEEP_PREDICTORS}
    ref_eff = {p: mean_of(by_label[f"trace / {p}"], "effective_ratio") for p in SWEEP_PREDICTORS}
    table.append(sweep_row("trace (point roots)", ref, ref_eff))
    best = min(rows, key=lambda r: r["criterion"])
    M, N = args.sweep_shape
    print_figures(table, f"Posterior sweep, persistent pool, (M, N) = ({M}, {N}), seed {args.seed}: rollouts per mixed "
                         f"group (pooled over the last {args.report_steps} of {args.total_steps} steps) and effective "
                         "ratio", SWEEP_DIGITS)
    print(f"\nargmin of the mean r/mix: s={best['prior_strength']:g} γ={best['discount']:g} "
          f"W={best['evidence_window']} ({best['criterion']:.2f}); wall {wall:.1f} s")
    payload = {"command": command_line(), "wall_s": wall, "protocol": protocol(args),
               "shape": [M, N], "grid": rows, "trace_reference": {"rollouts_per_mixed_group": ref,
                                                                 "effective_ratio": ref_eff}, "argmin": best}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(_clean(payload), indent=1, allow_nan=False))
    print(f"wrote {args.out}")
    return 0


# ---------------------------------------------------------------------------------- the tables
# per table, its columns' decimal places
MAIN_DIGITS = {"eff": 3, "±sd": 3, "prefix": 3, "yield": 1, "r/mix": 1, "spent": 0, "×GRPO": 2, "prompts": 0,
               "skip": 2,
               "m": 2, "m+K": 2, "turns": 0, "tok/step": 0, "mix/1k tok": 3, "ρroot": 2, "ρanch": 2, "pool": 3}
TOKEN_DIGITS = {"tok/step": 0, "budget": 0, "mix/1k tok": 3, "+anch/1k tok": 3, "eff": 3, "rollouts": 0,
                "reserve": 2, "ρ": 2, "root err": 2, "anchor err": 2}
BOTH_MODES_DIGITS = {"eff iid": 3, "eff pers": 3, "r/mix iid": 1, "r/mix pers": 1, "yield iid": 1,
                     "yield pers": 1, "pool": 3}
SENS_DIGITS = {"grpo": 3, "treepo": 3, "trace/or": 3, "trace/lrn": 3, "or×": 2, "lrn×": 2, "y grpo": 1,
               "y or": 1, "y lrn": 1}
NOISE_DIGITS = {"ρroot": 3, "ρanchor": 3, "eff": 3, "prefix": 3, "yield": 3, "×GRPO": 2}
NOISE_COLUMNS = {"ρroot": "spearman_root_vs_true", "ρanchor": "spearman_anchor_vs_true", "eff": "effective_ratio",
                 "prefix": "prefix_effective_ratio", "yield": "contrastive_yield"}  # column: metric
K_LABELS = ("treepo", "trace / oracle", "trace / learned", "trace-prefix-only / oracle")  # K by position rows


def main_row(label: str, res: dict, grpo_eff: float, persistent: bool) -> dict:
    """One method's line of a main table: its figures, and its effective ratio over GRPO's."""
    eff = mean_of(res, "effective_ratio")
    row = {
        "method / predictor": label, "eff": eff, "±sd": res["reported"]["effective_ratio"]["std"],
        "prefix": mean_of(res, "prefix_effective_ratio"), "yield": mean_of(res, "contrastive_yield"),
        "r/mix": mean_of(res, "rollouts_per_mixed_group_pooled"), "spent": mean_of(res, "counts/rollouts"),
        "×GRPO": eff / grpo_eff,
        "prompts": mean_of(res, "counts/activated"), "skip": mean_of(res, "alloc/skipped_share"),
        "m": mean_of(res, "alloc/mean_m_selected"), "m+K": mean_of(res, "alloc/mean_rollouts_selected"),
        "turns": mean_of(res, "turns_generated"), "tok/step": mean_of(res, "budget/generated_tokens"),
        "mix/1k tok": mean_of(res, "mixed_groups_per_1k_tokens_pooled"), "ρroot": mean_of(res, "spearman_root_vs_true"),
        "ρanch": mean_of(res, "spearman_anchor_vs_true"),
    }
    if persistent:
        row["pool"] = last_pool_success(res)
    return row


def print_main_table(args: argparse.Namespace, grid: ResultGrid, mode: str, M: int, N: int) -> dict:
    """Every method at one shape in one mode; returns its runs, each with its ratio to GRPO."""
    grpo = mean_of(grid.main_run("grpo", M, N, mode), "effective_ratio")
    rows, shape_out = [], {}
    for label, _, _ in ROWS:
        res = grid.main_run(label, M, N, mode)
        rows.append(main_row(label, res, grpo, persistent=mode == "persistent"))
        shape_out[label] = {"ratio_to_grpo": mean_of(res, "effective_ratio") / grpo, **res}
    title = (f"[{mode}] (M, N) = ({M}, {N}): {M * (1 + N)} trajectories per step, pool {4 * M * (1 + N) // 8}"
             f"; mean over the last {args.report_steps} of {args.total_steps} steps (r/mix: rollouts per mixed"
             " group, pooled; spent: rollouts a step, what a round method's rounds sampled)")
    if mode == "persistent":
        title += "; pool: dataset success after the last step"
    print_figures(rows, title, MAIN_DIGITS)
    return shape_out


def print_main_tables(args: argparse.Namespace, grid: ResultGrid) -> dict:
    """One table per mode and shape; returns the results' "shapes" (i.i.d.) and "persistent_shapes"."""
    summary: dict = {"shapes": {}, "persistent_shapes": {}}
    for mode in MODES:
        for M, N in args.shapes:
            shape_out = print_main_table(args, grid, mode, M, N)
            summary["shapes" if mode == "iid" else "persistent_shapes"][f"{M},{N}"] = shape_out
    return summary


def token_row(label: str, kind: str, res: dict, budget: float | None) -> dict:
    """One line of the two budget kinds' table."""
    return {
        "method / predictor": label, "budget kind": kind, "budget": budget,
        "tok/step": mean_of(res, "budget/generated_tokens"),
        "mix/1k tok": mean_of(res, "mixed_groups_per_1k_tokens_pooled"),
        "+anch/1k tok": mean_of(res, "mixed_groups_with_anchors_per_1k_tokens_pooled"),
        "eff": mean_of(res, "effective_ratio"), "rollouts": mean_of(res, "counts/rollouts"),
        "reserve": mean_of(res, "tokens/reservation_share"), "ρ": mean_of(res, "tokens/rho"),
        "root err": mean_of(res, "tokens/root_cost_error"), "anchor err": mean_of(res, "tokens/anchor_cost_error"),
    }


def print_token_tables(args: argparse.Namespace, grid: ResultGrid) -> dict:
    """Per mode and shape: the reference rows at their trajectory budget and the token rows at the
    equal token budget; returns the results' "token_budget"."""
    out: dict = {}
    for mode in MODES:
        for M, N in args.shapes:
            rows, shape_out = [], {}
            budget = None
            for label, _, _ in TOKEN_REFERENCE_ROWS:
                rows.append(token_row(label, f"{M * (1 + N)} traj.", grid.main_run(label, M, N, mode), None))
            for label, _, _ in TOKEN_ROWS:
                res = grid.token_run(label, M, N, mode)
                budget = res["tokens_per_step"]
                rows.append(token_row(label, "tokens", res, budget))
                shape_out[label] = res
            print_figures(rows, f"[{mode}] (M, N) = ({M}, {N}): both budget kinds — trajectories M(1+N), or "
                                f"{budget} generated tokens a step (M(1+N) expected root rollouts); mixed groups per "
                                "1,000 generated tokens pooled over the reported steps (+anch: with the mixed "
                                "expanded anchors); reserve: trace-tokens' reserved share; ρ: its calibration; err: "
                                "relative error of the cost estimates", TOKEN_DIGITS)
            out[f"{mode}/{M},{N}"] = shape_out
    return out


def print_both_modes(args: argparse.Namespace, grid: ResultGrid) -> None:
    rows = []
    for M, N in args.shapes:
        for label, _, _ in ROWS:
            a, b = grid.main_run(label, M, N, "iid"), grid.main_run(label, M, N, "persistent")
            rows.append({
                "shape / method": f"({M},{N}) {label}",
                "eff iid": mean_of(a, "effective_ratio"), "eff pers": mean_of(b, "effective_ratio"),
                "r/mix iid": mean_of(a, "rollouts_per_mixed_group_pooled"),
                "r/mix pers": mean_of(b, "rollouts_per_mixed_group_pooled"),
                "yield iid": mean_of(a, "contrastive_yield"), "yield pers": mean_of(b, "contrastive_yield"),
                "pool": last_pool_success(b),
            })
    print_figures(rows, "Both simulator modes: effective ratio, rollouts per mixed group, contrastive yield; pool "
                        "success (persistent)", BOTH_MODES_DIGITS)


def shape_targets(grid: ResultGrid, M: int, N: int) -> dict:
    """The targets at one shape (i.i.d. mode): TRACE's ratios to GRPO and the ablation order."""
    r = {lab: mean_of(grid.main_run(lab, M, N), "effective_ratio") for lab, _, _ in ROWS}
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
    return {
        "trace_oracle_x_grpo": r["trace / oracle"] / r["grpo"],
        "trace_learned_x_grpo": r["trace / learned"] / r["grpo"],
        "checks": checks,
    }


def print_targets(args: argparse.Namespace, grid: ResultGrid) -> dict:
    """The targets per shape, as judged and as the results' "targets"."""
    targets = {f"{M},{N}": shape_targets(grid, M, N) for M, N in args.shapes}
    rows = [{"shape": f"({shape})", "check": name, "result": "PASS" if ok else "MISS"}
            for shape, t in targets.items() for name, ok in t["checks"].items()]
    print_figures(rows, "Targets (effective ratio, pinned defaults, i.i.d. mode)")
    return targets


def print_k_by_position(args: argparse.Namespace, grid: ResultGrid) -> None:
    M, N = args.shapes[-1]
    keys = k_share_keys(grid.main_run("trace / oracle", M, N))
    rows = [{"method / predictor": label, **{k.replace("k_share_pos_", ""): mean_of(grid.main_run(label, M, N), k)
                                             for k in keys}} for label in K_LABELS]
    print_figures(rows, f"Share of the prefix budget by relative turn position t/T, (M, N) = ({M}, {N})", 2)


def print_sensitivity(args: argparse.Namespace, grid: ResultGrid) -> list[dict]:
    """Beta parameter × pool factor at the sensitivity shape; returns the results' "sensitivity"."""
    M, N = args.sensitivity_shape
    rows, out = [], []
    for beta, pf in itertools.product(BETAS, POOL_FACTORS):
        runs = {lab: grid.get("sensitivity", lab, M, N, pool_factor=pf, beta=beta) for lab, _, _ in SENS_ROWS}
        e = {lab: mean_of(res, "effective_ratio") for lab, res in runs.items()}
        y = {lab: mean_of(res, "contrastive_yield") for lab, res in runs.items()}
        rows.append({
            "cell": f"a={beta:g} pool×{pf}", "grpo": e["grpo"], "treepo": e["treepo"], "trace/or": e["trace / oracle"],
            "trace/lrn": e["trace / learned"], "or×": e["trace / oracle"] / e["grpo"],
            "lrn×": e["trace / learned"] / e["grpo"], "y grpo": y["grpo"], "y or": y["trace / oracle"],
            "y lrn": y["trace / learned"],
        })
        out.append({"beta": beta, "pool_factor": pf, "effective_ratio": e, "contrastive_yield": y})
    print_figures(rows, f"Sensitivity at (M, N) = ({M}, {N}): Beta(a, a) difficulty × pool factor (effective ratio; "
                        "yield)", SENS_DIGITS)
    return out


def noise_figures(res: dict) -> dict[str, float]:
    return {metric: mean_of(res, metric) for metric in NOISE_COLUMNS.values()}


def noise_row(name: str, figures: dict[str, float], grpo_eff: float) -> dict:
    return {"predictor": name, **{column: figures[metric] for column, metric in NOISE_COLUMNS.items()},
            "×GRPO": figures["effective_ratio"] / grpo_eff}


def print_noise_sweep(args: argparse.Namespace, grid: ResultGrid) -> list[dict]:
    """TRACE with the noisy predictor at each σ, beside the oracle and the learned one; returns the
    results' "noise_sweep"."""
    M, N = args.sensitivity_shape
    grpo = mean_of(grid.main_run("grpo", M, N), "effective_ratio")
    rows, out = [], []
    for sigma in NOISE_STDS:
        res = grid.get("noise", f"trace / noisy σ={sigma:g}", M, N, noise_std=sigma, main_label="trace / noisy")
        figures = noise_figures(res)
        rows.append(noise_row(f"σ={sigma:g}", figures, grpo))
        out.append({"noise_std": sigma, **figures})
    for label in ("trace / oracle", "trace / learned"):
        rows.append(noise_row(label, noise_figures(grid.main_run(label, M, N)), grpo))
    print_figures(rows, f"TRACE vs predictor quality at (M, N) = ({M}, {N}) (ρ: Spearman with the hidden V)",
                  NOISE_DIGITS)
    return out


def print_run_summary(args: argparse.Namespace, tasks: list[Task], results: list[dict], targets: dict,
                      wall: float) -> None:
    cpu = sum(r["cpu_s"] for r in results)
    print(f"\nwall time {wall:.1f} s with {args.workers} worker(s); {sum(len(t.steps) for t in tasks)} steps; "
          f"{cpu:.1f} CPU s in the workers (wall on idle cores ≈ CPU s / workers)")
    misses = [f"({s}) {n}" for s, t in targets.items() for n, ok in t["checks"].items() if not ok]
    note = " (--quick: tiny shapes and 2 reported steps; the targets are judged on the full run)" if args.quick else ""
    print(("targets: all met" if not misses else "targets MISSED: " + "; ".join(misses)) + note)


# ---------------------------------------------------------------------------------- the run
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.contrast", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Examples:\n  python -m bench.contrast --quick\n"
                                            "  python -m bench.contrast --posterior-sweep --seed 100")
    parser.add_argument("--quick", action="store_true", help="small shapes and few steps: a smoke run")
    parser.add_argument("--workers", type=int, default=2, help="processes (results do not depend on it)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--posterior-sweep", action="store_true",
                        help="only the posterior's tuning sweep (how its pinned defaults were chosen)")
    parser.add_argument("--token-budget-only", action="store_true",
                        help="only the two budget kinds' table (a few reference rows at M(1+N) trajectories, GRPO, "
                             "PCL and trace-tokens at the equal token budget)")
    return parser


def command_line() -> str:
    """The command that reproduces this run from the repository root."""
    return " ".join(["python -m bench.contrast", *sys.argv[1:]])


def set_scale(args: argparse.Namespace) -> None:
    """The shapes and step counts of the full run, or of ``--quick``'s smoke run."""
    if args.quick:
        args.shapes = [(128, 2), (128, 6), (256, 2)]
        args.sensitivity_shape = (128, 2)
        args.sweep_shape = (128, 2)
        args.total_steps, args.report_steps = 6, 2
    else:
        args.shapes = [(512, 2), (512, 6), (1024, 2)]
        args.sensitivity_shape = (512, 2)
        args.sweep_shape = (256, 2)
        args.total_steps, args.report_steps = 20, 8


def parse_args() -> argparse.Namespace:
    args = build_parser().parse_args()
    from trace_core import sim  # after parsing, so that --help does not load the library

    if sim.DEFAULT_NOISE_STD != DEFAULT_NOISE_STD:
        raise SystemExit(f"DEFAULT_NOISE_STD here ({DEFAULT_NOISE_STD}) differs from the simulator's")
    set_scale(args)
    name = ("contrast.posterior_sweep" if args.posterior_sweep else "contrast.token_budget" if args.token_budget_only
            else "contrast")
    args.out = args.out or Path("bench/results") / (f"{name}_quick.json" if args.quick else f"{name}.json")
    return args


def results_payload(args: argparse.Namespace, tasks: list[Task], results: list[dict], summary: dict,
                    wall: float) -> dict:
    return {
        "command": command_line(),
        "quick": args.quick,
        "wall_s": wall,
        "worker_cpu_s": sum(r["cpu_s"] for r in results),
        "workers": args.workers,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "protocol": {
            **protocol(args),
            "shapes": args.shapes, "modes": list(MODES),
            "targets": {"trace_oracle_x_grpo": TARGET_ORACLE, "trace_learned_x_grpo": TARGET_LEARNED},
        },
        **summary,
        "noise_tasks": [r for t, r in zip(tasks, results, strict=True) if t.group == "noise"],
    }


def write_results(payload: dict, grid: ResultGrid, args: argparse.Namespace) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(_clean(payload), indent=1, allow_nan=False))
    plot(payload, grid, args, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def main() -> int:
    args = parse_args()
    t0 = time.perf_counter()
    tasks = build_tasks(args)
    results = run_all(tasks, args.workers)
    wall = time.perf_counter() - t0
    if args.posterior_sweep:
        return posterior_sweep(args, tasks, results, wall)

    grid = ResultGrid(tasks, results)
    if args.token_budget_only:
        payload = {"command": command_line(), "quick": args.quick, "wall_s": wall,
                   "protocol": {**protocol(args), "shapes": args.shapes, "modes": list(MODES)},
                   "token_budget": print_token_tables(args, grid),
                   "reference": {f"{t.mode}/{t.roots_M},{t.expansion_N}/{t.label}": r
                                 for t, r in zip(tasks, results, strict=True) if t.group == "main"}}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(_clean(payload), indent=1, allow_nan=False))
        print(f"\nwall {wall:.1f} s; wrote {args.out}")
        return 0
    summary = print_main_tables(args, grid)
    print_both_modes(args, grid)
    summary["token_budget"] = print_token_tables(args, grid)
    summary["targets"] = print_targets(args, grid)
    print_k_by_position(args, grid)
    summary["sensitivity"] = print_sensitivity(args, grid)
    summary["noise_sweep"] = print_noise_sweep(args, grid)
    print_run_summary(args, tasks, results, summary["targets"], wall)
    write_results(results_payload(args, tasks, results, summary, wall), grid, args)
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


# ---------------------------------------------------------------------------------- the figure
def plot_effective_ratio(ax, grid: ResultGrid, args: argparse.Namespace) -> None:
    labels = [r[0] for r in ROWS]
    width = 0.8 / len(args.shapes)
    for k, (M, N) in enumerate(args.shapes):
        vals = [mean_of(grid.main_run(lab, M, N), "effective_ratio") for lab in labels]
        ax.bar(np.arange(len(labels)) + k * width, vals, width, label=f"M={M}, N={N}")
    ax.set_xticks(np.arange(len(labels)) + width * (len(args.shapes) - 1) / 2)
    ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("effective ratio")
    ax.set_title("Effective ratio at equal budget M(1+N)")
    ax.legend(fontsize=8)


def plot_warmup(ax, grid: ResultGrid, args: argparse.Namespace) -> None:
    for M, N in args.shapes:
        curve = grid.main_run("trace / learned", M, N)["effective_ratio_by_step"]
        line, = ax.plot(curve, label=f"trace/learned M={M},N={N}")
        ax.axhline(mean_of(grid.main_run("trace / oracle", M, N), "effective_ratio"), color=line.get_color(), ls=":")
        ax.axhline(mean_of(grid.main_run("grpo", M, N), "effective_ratio"), color=line.get_color(), ls="--", lw=0.8)
    ax.axvline(args.total_steps - args.report_steps - 0.5, color="grey", lw=0.8)
    ax.set_xlabel("step (learned predictor online; reported steps right of the grey line)")
    ax.set_ylabel("effective ratio")
    ax.set_title("Learned predictor warm-up (dotted: oracle, dashed: GRPO)")
    ax.legend(fontsize=8)


def plot_sensitivity(ax, sensitivity: list[dict], args: argparse.Namespace) -> None:
    for pf, color in zip(POOL_FACTORS, ("tab:blue", "tab:orange", "tab:green"), strict=True):
        cells = [c for c in sensitivity if c["pool_factor"] == pf]
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


def plot_k_by_position(ax, grid: ResultGrid, args: argparse.Namespace) -> None:
    M, N = args.shapes[-1]
    keys = k_share_keys(grid.main_run("trace / oracle", M, N))
    for j, label in enumerate(K_LABELS):
        res = grid.main_run(label, M, N)
        ax.bar(np.arange(len(keys)) + j * 0.2, [mean_of(res, k) for k in keys], 0.2, label=label)
    ax.set_xticks(np.arange(len(keys)) + 0.3)
    ax.set_xticklabels([k.replace("k_share_pos_", "").replace("_", "–") for k in keys])
    ax.set_xlabel("relative turn position t/T of the anchor")
    ax.set_ylabel("share of continuations")
    ax.set_title(f"Prefix budget by position, (M, N) = ({M}, {N})")
    ax.legend(fontsize=8)


def plot_mixed_group_price(ax, grid: ResultGrid, args: argparse.Namespace) -> None:
    M, N = args.sensitivity_shape
    labels = [r[0] for r in ROWS]
    for k, mode in enumerate(MODES):
        vals = [mean_of(grid.main_run(lab, M, N, mode), "rollouts_per_mixed_group_pooled") for lab in labels]
        ax.bar(np.arange(len(labels)) + k * 0.4, vals, 0.4, label=mode)
    ax.set_xticks(np.arange(len(labels)) + 0.2)
    ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("rollouts per mixed group (log)")
    ax.set_title(f"The price of one mixed group, both simulator modes, (M, N) = ({M}, {N})")
    ax.legend(fontsize=8)


def plot_persistent_curves(ax, grid: ResultGrid, args: argparse.Namespace) -> None:
    M, N = args.sensitivity_shape
    for label in ("grpo", "greso", "dapo", "dapo-capped", "trace / learned", "trace-posterior / learned",
                  "trace-posterior-thompson / learned"):
        ax.plot(grid.main_run(label, M, N, "persistent")["effective_ratio_by_step"], label=f"{label}: eff")
    ax.set_xlabel("step (persistent pool)")
    ax.set_ylabel("effective ratio")
    ax.set_title(f"Persistent pool: effective ratio by step, (M, N) = ({M}, {N})")
    ax.legend(fontsize=7)


def plot(payload: dict, grid: ResultGrid, args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(14, 14))
    plot_effective_ratio(axes[0, 0], grid, args)
    plot_warmup(axes[0, 1], grid, args)
    plot_sensitivity(axes[1, 0], payload["sensitivity"], args)
    plot_k_by_position(axes[1, 1], grid, args)
    plot_mixed_group_price(axes[2, 0], grid, args)
    plot_persistent_curves(axes[2, 1], grid, args)
    save_figure(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())
