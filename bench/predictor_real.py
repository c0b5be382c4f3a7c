"""Success estimates on the testbed's real rollouts: the learned predictor, the history alone, and
the Beta posterior that combines them — replayed offline over a finished training run.

A ``python -m bench.train_compare`` run directory holds everything a predictor saw and everything it
should have predicted: the warm-up split's trees (``warmup_trees.jsonl.gz``), every step's trees
(``trees/step*.jsonl.gz``), and the **pool success** of every pool prompt at a few steps
(``pool_success/step*.json``: k samples per prompt at T = 1 from the policy of that step). This
script replays the predictor over the run's steps — fitted on the warm-up trees, then updated on
each step's trees in order — and, at each step where pool success was measured, scores all pool
prompts with three estimates of their success probability:

(a) **learned**: the predictor's score of the prompt (it reads the question; it scores any prompt);
(b) **history**: the prompt's own earlier bare root outcomes, (S + 1)/(S + F + 2) — only for
    prompts the run has rolled out before ("seen");
(c) **posterior**: the Beta posterior of ``trace_core.history.beta_posterior`` — prior from (a)
    as recorded when the oldest counted outcome was made, evidence the discounted bare outcomes.

Against the measured pool success (k outcomes per prompt): out-of-sample Spearman, log-loss and
Brier score per outcome, the bias (mean estimate − mean success; a predictor that chases its last
batch shows here), separately on seen and unseen prompts; the coverage of (c)'s 80% predictive
interval for the k outcomes (Beta-binomial); the unbiased prefix Spearman (one uniformly random
anchor per bare rollout, scored before the update that trains on it, against that rollout's
reward); and the predictor's share of the run's step time (its cost breakdown).

``--replay W`` (several values allowed) replays a predictor whose update trains on the last W
steps' trees (``PredictorConfig.replay_steps``; W = 1 is the method as published, 4 our default).

Targets (fixed before any run): (c) ≥ max(a, b) in Spearman and log-loss on seen prompts; (c) no
worse than (a) in log-loss on unseen prompts; coverage within 70–90%; unbiased prefix Spearman ≥
0.25; the predictor's share ≤ 3% of the step.

Examples:

    python -m bench.predictor_real --run runs/bench_train_compare/trace-seed0
    python -m bench.predictor_real --run runs/bench_train_compare/trace-seed0 --replay 1 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

# CPU only, should the training code imported here load DeepSpeed (which reads this as it loads).
# Not a package default: the GPU check runs DeepSpeed on CUDA.
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.predictor_real", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example:\n  python -m bench.predictor_real --run "
                                        "runs/bench_train_compare/trace-seed0 --replay 1 4")
    ap.add_argument("--run", type=Path, default=Path("runs/bench_train_compare/trace-seed0"),
                    help="a training run directory with warmup_trees.jsonl.gz, trees/ and pool_success/")
    ap.add_argument("--config", default="configs/testbed.yaml", help="the run's TrainConfig YAML (its predictor)")
    ap.add_argument("--testbed", type=Path, default=None,
                    help="the testbed folder (pool.jsonl); default: the run's task.train_file's folder")
    ap.add_argument("--overrides", nargs="*", default=[], help="TrainConfig overrides the run used")
    ap.add_argument("--warmup-updates", type=int, default=None, help="default: the config's predictor_warmup")
    ap.add_argument("--replay", type=int, nargs="+", default=[1, 4], help="steps of trees per update (W)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/predictor_real.json"))
    return ap.parse_args()

CLIP = 1e-3


def outcome_scores(p: np.ndarray, successes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt: mean log-loss and mean Brier score of its ``k`` outcomes under probability ``p``."""
    q = np.clip(p, CLIP, 1 - CLIP)
    logloss = -(successes * np.log(q) + (k - successes) * np.log(1 - q)) / k
    brier = (successes * (1 - p) ** 2 + (k - successes) * p ** 2) / k
    return logloss, brier


def beta_binomial_interval(alpha: np.ndarray, beta: np.ndarray, k: int, mass: float = 0.8) -> tuple[np.ndarray,
                                                                                                      np.ndarray]:
    """The central ``mass`` predictive interval [lo, hi] of the number of successes in ``k`` draws."""
    from scipy import stats as sps  # here, not at the top: scipy.stats takes a while to load, --help needs none

    lo, hi = np.zeros(len(alpha), dtype=int), np.zeros(len(alpha), dtype=int)
    for i, (a, b) in enumerate(zip(alpha, beta, strict=True)):
        cdf = np.cumsum(sps.betabinom.pmf(np.arange(k + 1), k, a, b))
        lo[i] = int(np.searchsorted(cdf, (1 - mass) / 2 - 1e-12))
        hi[i] = int(np.searchsorted(cdf, 1 - (1 - mass) / 2 - 1e-12))
    return lo, hi


def figures(est: np.ndarray, success: np.ndarray, k: int, mask: np.ndarray) -> dict[str, float]:
    from trace_core.metrics import spearman

    if mask.sum() < 3:
        return {"prompts": float(mask.sum())}
    e, c = est[mask], np.round(success[mask] * k)
    logloss, brier = outcome_scores(e, c, k)
    return {"prompts": float(mask.sum()), "spearman": float(spearman(e, c / k)), "logloss": float(logloss.mean()),
            "brier": float(brier.mean()), "bias": float(e.mean() - (c / k).mean())}


def bare_outcomes(tree) -> tuple[int, int]:
    rewards = [tree.trajectory_reward(t.id) for t in tree.bare_trajectories()]
    s = sum(r > 0.5 for r in rewards)
    return s, len(rewards) - s


class Replay:
    """One predictor replayed over the run: fitted on the warm-up trees, then one update per step
    on the last ``window`` steps' trees (``PredictorConfig.replay_steps``); it records every step's
    root predictions (before the update) into a PromptHistory, as a trainer does."""

    def __init__(self, cfg, warmup_trees, updates: int, window: int) -> None:
        from dataclasses import replace

        from trace_core.history import PromptHistory
        from trace_core.predictor import SuccessPredictor

        self.predictor = SuccessPredictor(replace(cfg, replay_steps=window))
        self.predictor.fit(warmup_trees, updates)
        self.history = PromptHistory()
        self.prefix_pairs: list[tuple[float, float]] = []

    def step(self, step: int, trees: list) -> None:
        from trace_core.predictor.diagnostics import random_anchor_nodes

        roots = self.predictor.score_trees(trees, [[0] for _ in trees])
        anchors = random_anchor_nodes(trees, np.random.default_rng([step, 7]))
        scored = self.predictor.score_trees(trees, [a.tolist() for a in anchors])
        for tree, a, s in zip(trees, anchors, scored, strict=True):
            for node in a.tolist():  # one anchor per bare rollout: its prediction vs that rollout's reward
                traj = next(t for t in tree.bare_trajectories() if node in tree.path(t.leaf))
                self.prefix_pairs.append((float(s[node]), tree.trajectory_reward(traj.id)))
        outs = np.array([bare_outcomes(t) for t in trees])
        self.history.record(step, [t.prompt_id for t in trees], outs[:, 0], outs[:, 1],
                            np.clip([float(r[0]) for r in roots], 0, 1))
        self.predictor.update(trees)  # it trains on the last `window` steps' trees (replay_steps)


def evaluate_at(replay: Replay, step: int, prompt_ids: list[str], tokens: list[list[int]], measured: dict,
                posterior) -> dict:
    from trace_core.history import beta_posterior, uniform_streak  # noqa: F401

    k = int(measured["samples"])
    success = np.array([measured["per_prompt"][pid] for pid in prompt_ids], dtype=float)
    learned = replay.predictor.score_histories(tokens).clip(0, 1)
    view = replay.history.view(prompt_ids, step)
    seen = view.valid.any(axis=1)
    s_ = (view.successes * view.valid).sum(axis=1)
    f_ = (view.failures * view.valid).sum(axis=1)
    history = (s_ + 1) / (s_ + f_ + 2)
    alpha, beta = beta_posterior(view, learned, posterior)
    post = alpha / (alpha + beta)
    lo, hi = beta_binomial_interval(alpha, beta, k)
    c = np.round(success * k)
    out = {"step": step, "k": k, "seen_prompts": int(seen.sum())}
    for name, est in (("learned", learned), ("history", history), ("posterior", post)):
        out[name] = {"seen": figures(est, success, k, seen), "unseen": figures(est, success, k, ~seen),
                     "all": figures(est, success, k, np.ones_like(seen))}
    out["history"]["unseen"] = {"prompts": float((~seen).sum()), "note": "no history: not an estimate"}
    out["posterior_coverage_80"] = float(np.mean((c >= lo) & (c <= hi)))
    return out


def load_run_config(args: argparse.Namespace):
    """The run's TrainConfig, its task file pointed at ``--testbed``'s pool where one is given."""
    from trace_core.config import load_config
    from trace_core.training.config import TrainConfig

    overrides = list(args.overrides)
    if args.testbed is not None:
        overrides += [f"task.train_file={args.testbed / 'pool.jsonl'}"]
    cfg = load_config(TrainConfig, args.config, ["task.family=qa", "task.index_dir=artifacts/qa_index",
                                                 *overrides])
    if args.testbed is None and cfg.task.train_file and not Path(cfg.task.train_file).is_file():
        raise SystemExit(f"{cfg.task.train_file} does not exist: pass --testbed (the folder with pool.jsonl)")
    return cfg


def pool_prompts(run: Path, cfg) -> tuple[list[str], list[list[int]]]:
    """The pool prompts' ids and their rendered tokens, as the run's policy saw them."""
    from transformers import AutoTokenizer

    from trace_core.rollout.agent import render_prompt
    from trace_core.training.trainer import load_tasks

    tasks, factory = load_tasks(cfg)
    tokenizer = AutoTokenizer.from_pretrained(run / "policy")
    tokens = [render_prompt(tokenizer, t, factory(t).tool_descriptions(), cfg.agent) for t in tasks]
    return [t.id for t in tasks], tokens


def measured_pool_success(run: Path) -> dict[int, dict]:
    """Per step where it was measured, the pool success record of that step."""
    records = [json.loads(p.read_text()) for p in sorted(run.glob("pool_success/step*.json"))]
    return {int(r["step"]): r for r in records}


def print_point(window: int, p: dict) -> None:
    print(f"W={window} step {p['step']}: spearman learned {p['learned']['all'].get('spearman', np.nan):.3f} "
          f"(bias {p['learned']['all'].get('bias', np.nan):+.3f}), seen {p['seen_prompts']}: "
          f"history {p['history']['seen'].get('spearman', np.nan):.3f}, "
          f"posterior {p['posterior']['seen'].get('spearman', np.nan):.3f}", flush=True)


def replay_run(replay: Replay, step_files: list[Path], prompts: tuple[list[str], list[list[int]]],
               measured: dict[int, dict], posterior, window: int) -> dict:
    """Steps ``replay`` through the run, evaluated wherever pool success was measured (before that
    step's update); returns the evaluations and the unbiased prefix Spearman."""
    from trace_core.metrics import spearman
    from trace_core.tree import load_trees

    ids, tokens = prompts
    points = []
    for step in range(len(step_files) + 1):
        if step in measured:
            points.append(evaluate_at(replay, step, ids, tokens, measured[step], posterior))
            print_point(window, points[-1])
        if step < len(step_files):
            replay.step(step, load_trees(step_files[step]))
    pairs = np.array(replay.prefix_pairs)
    return {"points": points, "prefix_spearman_random_anchor": float(
        spearman(pairs[:, 0], pairs[:, 1])) if len(pairs) > 2 else None, "prefix_pairs": len(pairs)}


def predictor_share(run: Path) -> float:
    """The predictor's share (scoring and updates) of the run's step time."""
    frac = json.loads((run / "summary.json").read_text()).get("cost_fractions", {})
    return frac.get("predictor_scoring", 0.0) + frac.get("predictor_update", 0.0)


def judge_default(results: dict, share: float) -> dict[str, str]:
    """The targets, judged on the default replay window where it ran (else the first one), and printed."""
    from trace_core.predictor.config import PredictorConfig

    default = f"W={PredictorConfig().replay_steps}"
    chosen = results[default] if default in results else next(iter(results.values()))
    targets = judge(chosen["points"][-1], chosen, share)
    for name, verdict in targets.items():
        print(f"  {name}: {verdict}")
    return targets


def write_results(args: argparse.Namespace, posterior, updates: int, share: float, results: dict,
                  targets: dict) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m bench.predictor_real", *sys.argv[1:]])
    args.out.write_text(json.dumps({"command": command, "run": str(args.run),
                                    "posterior": posterior.__dict__, "warmup_updates": updates,
                                    "predictor_share_of_step": share, "results": results, "targets": targets},
                                   indent=1, default=float))
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def main(args: argparse.Namespace) -> None:
    import torch

    from trace_core.history import PosteriorConfig
    from trace_core.tree import load_trees

    torch.set_num_threads(1)
    cfg = load_run_config(args)
    prompts = pool_prompts(args.run, cfg)
    warmup = load_trees(args.run / "warmup_trees.jsonl.gz")
    step_files = sorted(args.run.glob("trees/step*.jsonl.gz"))
    measured = measured_pool_success(args.run)
    updates = args.warmup_updates or cfg.predictor_warmup.updates
    posterior = PosteriorConfig()
    results = {f"W={window}": replay_run(Replay(cfg.predictor, warmup, updates, window), step_files, prompts,
                                         measured, posterior, window) for window in args.replay}
    share = predictor_share(args.run)
    table(results)
    targets = judge_default(results, share)
    write_results(args, posterior, updates, share, results, targets)


FIGURE_COLUMNS = {  # column: (estimate, figure)
    "learned ρ": ("learned", "spearman"), "history ρ": ("history", "spearman"),
    "posterior ρ": ("posterior", "spearman"), "learned LL": ("learned", "logloss"),
    "history LL": ("history", "logloss"), "posterior LL": ("posterior", "logloss"), "learned bias": ("learned", "bias"),
}
TABLE_COLUMNS = ["replay", "step", "subset", "prompts", *FIGURE_COLUMNS, "coverage80"]
TABLE_DIGITS = {"prompts": 0, **{column: 3 for column in FIGURE_COLUMNS}, "coverage80": 2}  # decimal places


def point_row(window: str, p: dict, subset: str) -> dict:
    """One measured step's figures on the ``subset`` ("seen" or "unseen") of the pool prompts."""
    figures = {column: p[name][subset].get(key) for column, (name, key) in FIGURE_COLUMNS.items()}
    return {"replay": window, "step": p["step"], "subset": subset, "prompts": p["learned"][subset].get("prompts", 0),
            **figures, "coverage80": p["posterior_coverage_80"]}


def table(results: dict) -> None:
    """Every measured step's figures as a markdown table, and each window's unbiased prefix Spearman."""
    rows = []
    for w, r in results.items():
        rows += [point_row(w, p, subset) for p in r["points"] for subset in ("seen", "unseen")]
        rows.append({"replay": w, "step": "all steps", "subset": "prefix (random anchor) ρ",
                     "prompts": r["prefix_pairs"], "learned ρ": r["prefix_spearman_random_anchor"]})
    from bench.bench_tables import format_markdown, places

    print("\n" + format_markdown(rows, TABLE_COLUMNS, places(TABLE_DIGITS)))


def judge(point: dict, results: dict, share: float) -> dict[str, str]:
    """``results``: one replay setting's figures; ``point``: its last measured step."""
    def v(name, subset, key):
        return point[name][subset].get(key, float("nan"))

    out = {}
    best_rho = max(v("learned", "seen", "spearman"), v("history", "seen", "spearman"))
    best_ll = min(v("learned", "seen", "logloss"), v("history", "seen", "logloss"))
    ok = v("posterior", "seen", "spearman") >= best_rho and v("posterior", "seen", "logloss") <= best_ll
    out["posterior >= max(learned, history) on seen prompts (spearman and log-loss)"] = (
        ("PASS " if ok else "MISS ") + f"spearman {v('posterior', 'seen', 'spearman'):.3f} vs "
        f"{v('learned', 'seen', 'spearman'):.3f} / {v('history', 'seen', 'spearman'):.3f}; log-loss "
        f"{v('posterior', 'seen', 'logloss'):.3f} vs {v('learned', 'seen', 'logloss'):.3f} / "
        f"{v('history', 'seen', 'logloss'):.3f} (step {point['step']}, {point['seen_prompts']} seen)")
    ok = v("posterior", "unseen", "logloss") <= v("learned", "unseen", "logloss") + 1e-12
    out["posterior no worse than learned on unseen prompts (log-loss)"] = (
        ("PASS " if ok else "MISS ") + f"{v('posterior', 'unseen', 'logloss'):.3f} vs "
        f"{v('learned', 'unseen', 'logloss'):.3f}")
    cov = point["posterior_coverage_80"]
    out["posterior 80% interval coverage within 70-90%"] = ("PASS " if 0.7 <= cov <= 0.9 else "MISS ") + f"{cov:.2f}"
    first = results
    rho = first["prefix_spearman_random_anchor"]
    out["unbiased prefix spearman >= 0.25"] = ("PASS " if rho is not None and rho >= 0.25 else "MISS ") + (
        f"{rho:.3f} over {first['prefix_pairs']} bare rollouts" if rho is not None else "no anchors")
    out["predictor share <= 3% of the step"] = ("PASS " if share <= 0.03 else "MISS ") + f"{100 * share:.1f}%"
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for w, r in results.items():
        steps = [p["step"] for p in r["points"]]
        for name, style in (("learned", "-o"), ("posterior", "--s")):
            axes[0].plot(steps, [p[name]["seen"].get("spearman", np.nan) for p in r["points"]], style,
                         label=f"{name} seen ({w})")
        axes[1].plot(steps, [p["learned"]["all"].get("bias", np.nan) for p in r["points"]], "-o",
                     label=f"learned ({w})")
    axes[0].set(xlabel="step", ylabel="Spearman vs pool success", title="Root ranking (seen prompts)")
    axes[1].axhline(0, color="grey", lw=0.8)
    axes[1].set(xlabel="step", ylabel="mean estimate − mean success", title="Bias of the learned predictor")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main(parse_args())
