"""Allocation benchmark: exactness against brute force / the DP / the greedy heap, and speed.

Targets: exact everywhere; ``allocate_roots`` ≥ 100× faster than the DP at B = 4,096,
budget 8,192, max 16; B = 100,000 with budget 200,000 in ≤ 1 s on one core; the posterior-aware
``allocate_roots_beta`` at B = 100,000, budget 200,000 in ≤ 0.2 s; ``allocate_prefixes`` on
1,000,000 anchors in ≤ 1 s. Runs single-threaded (BLAS/OpenMP threads pinned to 1); times
(``*_s``) are the process's CPU seconds, best of a few runs, so that other load on a shared
2-core machine does not distort them; ``fast_wall_s`` is the wall time of the same run.

    python -m bench.allocation [--quick] [--only SECTION ...] [--out bench/results/allocation.json]

``--only roots_beta`` re-measures one section and keeps the others from the existing file (each
section records the command that produced it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import time
from pathlib import Path

import numpy as np

from trace_core.allocation import (
    allocate_prefixes,
    allocate_prefixes_greedy,
    allocate_roots,
    allocate_roots_beta,
    allocate_roots_beta_dp,
    allocate_roots_dp,
    allocate_roots_thompson,
    check_root_budget,
    prefix_objective,
    root_objective,
    root_objective_beta,
)


def timed(fn, *args, repeat: int = 1):
    """Best-of-``repeat`` CPU time of this process (one thread), which other load on a shared
    machine does not inflate; the wall time of that run is recorded too."""
    best, wall, out = np.inf, np.inf, None
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn(*args)
        c, w = time.process_time() - c0, time.perf_counter() - w0
        if c < best:
            best, wall = c, w
    timed.last_wall = wall
    return out, best


def brute_roots(v: np.ndarray, budget: int, k: int) -> float:
    choices = [0, *range(2, k + 1)]
    return max(root_objective(v, c) for c in itertools.product(choices, repeat=len(v)) if sum(c) == budget)


def brute_roots_beta(alpha: np.ndarray, beta: np.ndarray, budget: int, k: int) -> float:
    choices = [0, *range(2, k + 1)]
    combos = (c for c in itertools.product(choices, repeat=len(alpha)) if sum(c) == budget)
    return max(root_objective_beta(alpha, beta, np.array(c)) for c in combos)


def brute_prefixes(p: np.ndarray, r: np.ndarray, budget: int) -> float:
    combos = (c for c in itertools.product(range(budget + 1), repeat=len(p)) if sum(c) == budget)
    return max(prefix_objective(p, r, c) for c in combos)


def bench_brute_force(rng: np.random.Generator, n_instances: int) -> list[dict]:
    rows = []
    worst_r = worst_p = 0.0
    done_r = done_p = 0
    while done_r < n_instances:
        b, k = int(rng.integers(1, 5)), int(rng.integers(2, 6))
        v = rng.choice([0.0, 0.5, 1.0, rng.random()], size=b) if rng.random() < 0.4 else rng.random(b)
        budget = int(rng.integers(0, b * k + 1))
        try:
            check_root_budget(b, budget, k)
        except ValueError:
            continue
        worst_r = max(worst_r, abs(root_objective(v, allocate_roots(v, budget, k)) - brute_roots(v, budget, k)))
        done_r += 1
    while done_p < n_instances:
        a, budget = int(rng.integers(1, 5)), int(rng.integers(0, 7))
        p = rng.choice([0.0, 0.5, 1.0, rng.random()], size=a) if rng.random() < 0.4 else rng.random(a)
        r = rng.integers(0, 2, size=a)
        gap = prefix_objective(p, r, allocate_prefixes(p, r, budget)) - brute_prefixes(p, r, budget)
        worst_p = max(worst_p, abs(gap))
        done_p += 1
    rows.append({"solver": "allocate_roots", "reference": "brute force", "instances": n_instances,
                 "max_abs_gap": worst_r})
    rows.append({"solver": "allocate_prefixes", "reference": "brute force", "instances": n_instances,
                 "max_abs_gap": worst_p})
    return rows


def bench_brute_force_beta(rng: np.random.Generator, n_instances: int) -> list[dict]:
    worst_b = 0.0
    done_b = 0
    while done_b < n_instances:
        b, k = int(rng.integers(1, 5)), int(rng.integers(2, 6))
        alpha, beta = rng.choice([0.0, 0.5, 2.0, 10.0], size=b), rng.choice([0.5, 1.0, 3.0], size=b) + rng.random(b)
        budget = int(rng.integers(0, b * k + 1))
        try:
            check_root_budget(b, budget, k)
        except ValueError:
            continue
        m = allocate_roots_beta(alpha, beta, budget, k)
        worst_b = max(worst_b, abs(root_objective_beta(alpha, beta, m) - brute_roots_beta(alpha, beta, budget, k)))
        done_b += 1
    return [{"solver": "allocate_roots_beta", "reference": "brute force", "instances": n_instances,
             "max_abs_gap": worst_b}]


def bench_roots(rng: np.random.Generator, sizes: list[int], k: int, dp_max: int) -> list[dict]:
    rows = []
    for b in sizes:
        v = rng.beta(0.15, 0.15, size=b)
        budget = 2 * b
        m, t_fast = timed(allocate_roots, v, budget, k, repeat=5)
        row = {"B": b, "budget": budget, "max_per_prompt": k, "fast_s": t_fast, "fast_wall_s": timed.last_wall,
               "activated": int((m > 0).sum())}
        if b <= dp_max:
            d, t_dp = timed(allocate_roots_dp, v, budget, k)
            row.update(dp_s=t_dp, speedup=t_dp / t_fast,
                       gap=abs(root_objective(v, m) - root_objective(v, d)))
        rows.append(row)
    return rows


def posterior_parameters(rng: np.random.Generator, b: int) -> tuple[np.ndarray, np.ndarray]:
    """A pool's Beta posteriors as the posterior methods form them: a prior mean from a
    U-shaped Beta(0.15, 0.15) with a strength of 2, 8 or 32 pseudo-rollouts, plus 0..8 observed
    rollouts of the prompt drawn from its true value."""
    v = rng.beta(0.15, 0.15, size=b)
    strength = rng.choice([2.0, 8.0, 32.0], size=b)
    n = rng.integers(0, 9, size=b)
    wins = rng.binomial(n, rng.beta(0.15, 0.15, size=b))
    return v * strength + wins, (1 - v) * strength + (n - wins)


def bench_roots_beta(rng: np.random.Generator, sizes: list[int], k: int, dp_max: int) -> list[dict]:
    rows = []
    for b in sizes:
        alpha, beta = posterior_parameters(rng, b)
        budget = 2 * b
        m, t_fast = timed(allocate_roots_beta, alpha, beta, budget, k, repeat=5)
        row = {"B": b, "budget": budget, "max_per_prompt": k, "fast_s": t_fast, "fast_wall_s": timed.last_wall,
               "activated": int((m > 0).sum())}
        _, t_ts = timed(allocate_roots_thompson, alpha, beta, budget, k, np.random.default_rng(0), repeat=3)
        row["thompson_s"] = t_ts
        if b <= dp_max:
            d, t_dp = timed(allocate_roots_beta_dp, alpha, beta, budget, k)
            row.update(dp_s=t_dp, speedup=t_dp / t_fast,
                       gap=abs(root_objective_beta(alpha, beta, m) - root_objective_beta(alpha, beta, d)))
        rows.append(row)
    return rows


def bench_prefixes(rng: np.random.Generator, sizes: list[int], greedy_max: int) -> list[dict]:
    rows = []
    for a in sizes:
        p, r = rng.random(a), rng.integers(0, 2, size=a)
        turn = rng.integers(1, 8, size=a)
        budget = 2 * a
        K, t_fast = timed(allocate_prefixes, p, r, budget, turn, repeat=3)
        row = {"anchors": a, "budget": budget, "fast_s": t_fast, "fast_wall_s": timed.last_wall}
        if a <= greedy_max:
            G, t_g = timed(allocate_prefixes_greedy, p, r, budget, turn)
            row.update(greedy_s=t_g, speedup=t_g / t_fast,
                       gap=abs(prefix_objective(p, r, K) - prefix_objective(p, r, G)))
        rows.append(row)
    return rows


def print_table(title: str, rows: list[dict]) -> None:
    from bench.bench_tables import print_table as shared
    from bench.bench_tables import significant

    shared(rows, fmt=significant, title=title)


def plot(roots: list[dict], roots_beta: list[dict], prefixes: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    b = [r["B"] for r in roots]
    axes[0].loglog(b, [r["fast_s"] for r in roots], "o-", label="allocate_roots (threshold + repair)")
    axes[0].loglog([r["B"] for r in roots_beta], [r["fast_s"] for r in roots_beta], "^-",
                   label="allocate_roots_beta (same solver, Beta gains)")
    dp = [r for r in roots if "dp_s" in r]
    axes[0].loglog([r["B"] for r in dp], [r["dp_s"] for r in dp], "s--", label="DP (reference)")
    axes[0].set(xlabel="pool size B (budget 2B, max 16)", ylabel="seconds", title="Root allocation")
    axes[0].legend()
    a = [r["anchors"] for r in prefixes]
    axes[1].loglog(a, [r["fast_s"] for r in prefixes], "o-", label="allocate_prefixes (vectorised)")
    gr = [r for r in prefixes if "greedy_s" in r]
    axes[1].loglog([r["anchors"] for r in gr], [r["greedy_s"] for r in gr], "s--", label="heap greedy")
    axes[1].set(xlabel="anchors (budget 2A)", ylabel="seconds", title="Prefix allocation")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


SECTIONS = ("brute_force", "roots", "roots_beta", "prefixes")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.allocation", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example:\n  python -m bench.allocation --only roots_beta")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=None,
                    help="run only these sections and keep the others from the existing --out file")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/results/allocation.json"))
    return ap


def command_line(args: argparse.Namespace) -> str:
    return "python -m bench.allocation" + (" --quick" if args.quick else "") + (
        " --only " + " ".join(args.only) if args.only else "")


def kept_commands(previous: dict, run: set[str]) -> dict[str, str]:
    """The command that made each section kept from the previous file."""
    commands = dict(previous.get("commands", {}))
    for section in SECTIONS:  # a file from before per-section commands: its one command made every section
        if section not in run and section in previous and section not in commands and "command" in previous:
            commands[section] = previous["command"]
    return commands


def run_section(section: str, args: argparse.Namespace) -> list[dict]:
    rng = np.random.default_rng([args.seed, SECTIONS.index(section)])  # one stream per section: --only reproduces it
    if section == "brute_force":
        return bench_brute_force(rng, 100 if args.quick else 500)
    if section == "roots":
        root_sizes = [64, 256, 1024] if args.quick else [64, 256, 1024, 4096, 100_000]
        return bench_roots(rng, root_sizes, 16, dp_max=1024 if args.quick else 4096)
    if section == "roots_beta":
        return bench_brute_force_beta(rng, 100 if args.quick else 300) + bench_roots_beta(
            rng, [64, 256, 1024, 100_000], 16, dp_max=1024)
    pref_sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000, 1_000_000]
    return bench_prefixes(rng, pref_sizes, greedy_max=100_000)


def split_roots_beta(results: dict[str, list[dict]]) -> tuple[list[dict], list[dict]]:
    """The roots_beta section's exactness rows (against brute force) and its timing rows."""
    rows = results["roots_beta"]
    return [r for r in rows if "solver" in r], [r for r in rows if "solver" not in r]


def print_results(results: dict[str, list[dict]]) -> None:
    beta_brute, roots_beta = split_roots_beta(results)
    print_table("Exactness on random small instances (objective gap to brute force)",
                results["brute_force"] + beta_brute)
    print_table("Root allocation (method §2), Beta(0.15, 0.15) values, budget 2B", results["roots"])
    print_table("Posterior-aware root allocation (allocate_roots_beta; thompson_s: allocate_roots_thompson), "
                "Beta posteriors, budget 2B", roots_beta)
    print_table("Prefix allocation (method §3), uniform p, budget 2A", results["prefixes"])


def judge(results: dict[str, list[dict]]) -> tuple[float, dict[str, bool | None]]:
    """The largest objective gap anywhere, and each target (None where its size did not run)."""
    brute, roots, prefixes = results["brute_force"], results["roots"], results["prefixes"]
    beta_brute, roots_beta = split_roots_beta(results)
    at4096 = next((r for r in roots if r["B"] == 4096), None)
    at100k = next((r for r in roots if r["B"] == 100_000), None)
    beta100k = next((r for r in roots_beta if r["B"] == 100_000), None)
    at1m = next((r for r in prefixes if r["anchors"] == 1_000_000), None)
    max_gap = max([r["max_abs_gap"] for r in brute + beta_brute]
                  + [r.get("gap", 0.0) for r in roots + roots_beta + prefixes])
    return max_gap, {
        "exact_everywhere (max objective gap <= 1e-9)": max_gap <= 1e-9,
        "roots speedup vs DP at B=4096 >= 100x": None if at4096 is None else at4096["speedup"] >= 100,
        "roots B=100k budget 200k <= 1 s": None if at100k is None else at100k["fast_s"] <= 1.0,
        "roots_beta B=100k budget 200k <= 0.2 s": None if beta100k is None else beta100k["fast_s"] <= 0.2,
        "prefixes 1M anchors <= 1 s": None if at1m is None else at1m["fast_s"] <= 1.0,
    }


def print_targets(targets: dict[str, bool | None]) -> None:
    print("\nTargets")
    for name, ok in targets.items():
        print(f"  {'PASS' if ok else ('n/a ' if ok is None else 'MISS')}  {name}")


def write_results(out: Path, command: str, commands: dict[str, str], results: dict[str, list[dict]],
                  max_gap: float, targets: dict[str, bool | None]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "command": command,
        "commands": commands,  # the command that produced each section
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "threads": 1},
        **results,
        "max_objective_gap": max_gap, "targets": targets,
    }
    out.write_text(json.dumps(result, indent=2))
    drawn = bool(results["roots"] and results["prefixes"])  # the figure needs both
    if drawn:
        plot(results["roots"], split_roots_beta(results)[1], results["prefixes"], out.with_suffix(".png"))
    print(f"\nwrote {out}" + (f" and {out.with_suffix('.png')}" if drawn else ""))


def main() -> None:
    args = build_parser().parse_args()
    run = set(args.only or SECTIONS)
    previous = json.loads(args.out.read_text()) if args.only and args.out.is_file() else {}
    commands = kept_commands(previous, run)
    command = command_line(args)
    results: dict[str, list[dict]] = {}
    for section in SECTIONS:
        if section in run:
            results[section] = run_section(section, args)
            commands[section] = command
        else:
            results[section] = previous.get(section, [])
    print_results(results)
    max_gap, targets = judge(results)
    print_targets(targets)
    write_results(args.out, command, commands, results, max_gap, targets)


if __name__ == "__main__":
    main()
