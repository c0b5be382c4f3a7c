"""The learning benchmark's table, recomputed from its run records alone (no ``runs/`` folder).

Pure functions of the records that ``python -m bench.learning run`` writes under
``bench/results/learning/`` (one JSON per (method, seed), plus the shared step-0 measurement):
numbers in, numbers out, so a reviewer can rerun ``python -m bench.learning table`` on a fresh
clone and get the committed table back, and a test does exactly that.

**What is pooled and how.** Every ratio is pooled as counts over steps and seeds (Σ numerators /
Σ denominators), with its 90% Wilson interval (``trace_core.metrics.wilson_interval``); the
per-seed values stand beside it. Pool success at a measured step is Σ successes / (P·k) over the
pool's P prompts and k samples each.

**Standard errors of pool success.** A run's pool success is a mean of P·k Bernoulli draws with
per-prompt probabilities; its measurement variance is estimated unbiasedly as
Σᵢ p̂ᵢ(1 − p̂ᵢ)/(k − 1) / P² (a prompt always or never solved adds nothing: the pool is fixed,
only the draws within a prompt are random). A method's mean over n seeds has variance
max(s², m̄)/n, where s² is the across-seed sample variance (which holds the measurement noise
and the training's own spread) and m̄ the mean measurement variance — the floor keeps two seeds
that happen to agree from claiming a zero error. The start is one shared measurement of one
policy, so a gain's variance is the end's plus the start's measurement variance.

**Comparisons** between two methods use only the seeds both have (``matched``); every verdict is
taken on unrounded values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from trace_core.metrics import wilson_interval

RECORD_FORMAT = "trace-rl/learning-run/v1"
START_FORMAT = "trace-rl/learning-start/v1"
PAPER_METHODS = ("grpo", "pcl", "treepo")  # the paper's baselines (TRACE's AUC must top them)


# ============================================================================ one run
def pool_success(measure: Mapping[str, Any]) -> float:
    """Pool success of one measurement: Σ successes / (P·k)."""
    s = np.asarray(list(measure["successes"].values()), dtype=np.float64)
    return float(s.sum() / (s.size * measure["samples"]))


def measurement_variance(measure: Mapping[str, Any]) -> float:
    """Unbiased variance of one pool-success measurement (module docstring)."""
    k = int(measure["samples"])
    s = np.asarray(list(measure["successes"].values()), dtype=np.float64)
    p = s / k
    return float(np.sum(p * (1 - p) / (k - 1)) / s.size ** 2)


def curve(run: Mapping[str, Any], start: Mapping[str, Any], axis: str, warmup: bool = False
          ) -> tuple[np.ndarray, np.ndarray]:
    """(cumulative training cost, pool success) at each measured step, the shared start first.
    ``axis``: "rollouts" or "tokens" (generated tokens); ``warmup``: add the predictor warm-up's
    cost (the curve then starts at the warm-up's cost)."""
    per_step = np.asarray(run["steps"]["rollouts" if axis == "rollouts" else "generated_tokens"], dtype=np.float64)
    spent = np.concatenate([[0.0], np.cumsum(per_step)])
    if warmup:
        spent = spent + float(run["warmup"]["rollouts" if axis == "rollouts" else "generated_tokens"])
    measures = [start["measure"], *run["pool"]]
    steps = [int(m["step"]) for m in measures]
    return spent[steps], np.array([pool_success(m) for m in measures])


def value_at(x: np.ndarray, y: np.ndarray, at: float) -> float:
    """The linearly interpolated curve at ``at`` (NaN past its last point)."""
    if at > x[-1] + 1e-9:
        return float("nan")
    return float(np.interp(at, x, y))


def area_under(x: np.ndarray, y: np.ndarray, upto: float) -> float:
    """Mean pool success over [x₀, upto] (the trapezoid area divided by the range)."""
    keep = x < upto
    xs = np.concatenate([x[keep], [upto]])
    ys = np.concatenate([y[keep], [value_at(x, y, upto)]])
    return float(np.trapezoid(ys, xs) / (upto - xs[0]))


def cost_to_reach(x: np.ndarray, y: np.ndarray, target: float) -> float | None:
    """Cost at which the interpolated curve first reaches ``target``; None if it never does."""
    for i in range(len(y)):
        if y[i] >= target:
            if i == 0:
                return float(x[0])
            return float(x[i - 1] + (target - y[i - 1]) / (y[i] - y[i - 1]) * (x[i] - x[i - 1]))
    return None


# ============================================================================ pooled ratios
def pooled(numerators: Iterable[float], denominators: Iterable[float]) -> dict[str, Any]:
    """Σ numerators / Σ denominators with its 90% Wilson interval (counts rounded to integers)."""
    num, den = int(round(sum(numerators))), int(round(sum(denominators)))
    lo, hi = wilson_interval(num, den)
    return {"value": num / den if den else float("nan"), "ci90": [lo, hi], "count": num, "of": den}


def mean_se(values: Sequence[float], measurement_vars: Sequence[float]) -> tuple[float, float]:
    """Mean over seeds and its standard error, sqrt(max(s², m̄)/n) (module docstring)."""
    v = np.asarray(values, dtype=np.float64)
    floor = float(np.mean(measurement_vars)) if len(measurement_vars) else 0.0
    spread = float(np.var(v, ddof=1)) if v.size > 1 else 0.0
    return float(v.mean()), float(math.sqrt(max(spread, floor) / v.size))


# ============================================================================ the table
def by_method(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, Mapping[str, Any]]]:
    out: dict[str, dict[int, Mapping[str, Any]]] = {}
    for r in runs:
        out.setdefault(r["variant"], {})[int(r["seed"])] = r
    return out


def signal_row(variant: str, runs: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The learning signal of a method's runs: pooled ratios with intervals and per-seed values."""
    seeds = sorted(runs)

    def total(seed: int, key: str) -> float:
        return float(sum(runs[seed]["steps"][key]))

    def per_seed(num: str, den: str, scale: float = 1.0) -> list[float]:
        return [scale * total(s, num) / total(s, den) if total(s, den) else float("nan") for s in seeds]

    eff = pooled((total(s, "mixed_groups") for s in seeds), (total(s, "activated") for s in seeds))
    per_rollout = pooled((total(s, "mixed_groups_trained") for s in seeds), (total(s, "rollouts") for s in seeds))
    rollouts = [total(s, "rollouts") for s in seeds]
    tokens = [total(s, "generated_tokens") for s in seeds]
    mixed = [total(s, "mixed_groups_trained") for s in seeds]
    return {
        "method": variant, "seeds": seeds,
        "effective_ratio": eff, "effective_ratio_per_seed": per_seed("mixed_groups", "activated"),
        "mixed_groups_per_100_rollouts": {**per_rollout, "value": 100 * per_rollout["value"],
                                          "ci90": [100 * c for c in per_rollout["ci90"]]},
        "mixed_groups_per_1000_tokens": 1000 * sum(mixed) / sum(tokens) if sum(tokens) else float("nan"),
        "rollouts_per_mixed_group": sum(rollouts) / sum(mixed) if sum(mixed) else float("nan"),
        "rollouts_per_step": float(np.mean([np.mean(runs[s]["steps"]["rollouts"]) for s in seeds])),
        "generated_tokens_per_step": float(np.mean([np.mean(runs[s]["steps"]["generated_tokens"]) for s in seeds])),
        "warmup_rollouts": float(np.mean([runs[s]["warmup"]["rollouts"] for s in seeds])),
    }


def heldout_row(runs: Mapping[int, Mapping[str, Any]], start: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Held-out pass@1 of the final policies: pooled over questions, samples and seeds; beside it
    the starting policy's, where the start record holds one."""
    seeds = sorted(runs)
    succ = [float(sum(runs[s]["heldout"]["successes"].values())) for s in seeds]
    n = [float(len(runs[s]["heldout"]["successes"]) * runs[s]["heldout"]["samples"]) for s in seeds]
    row = {**pooled(succ, n), "per_seed": [a / b for a, b in zip(succ, n, strict=True)]}
    if start is not None and "heldout" in start:
        held = start["heldout"]
        row["start"] = sum(held["successes"].values()) / (len(held["successes"]) * held["samples"])
    return row


def pool_row(runs: Mapping[int, Mapping[str, Any]], start: Mapping[str, Any], at_rollouts: float,
             grpo_final: float | None, area_upto: float, axis: str = "rollouts") -> dict[str, Any]:
    """Pool-success figures of a method: final (at its last step and at ``at_rollouts``, the
    equal-cost point on ``axis`` — training rollouts, or generated tokens) with standard errors,
    the area under the curve up to ``area_upto`` on the same axis, and the cost to reach GRPO's
    final pool success (per seed; None where a seed never does)."""
    seeds = sorted(runs)
    mvar = [measurement_variance(runs[s]["pool"][-1]) for s in seeds]
    final, final_se = mean_se([pool_success(runs[s]["pool"][-1]) for s in seeds], mvar)
    equal = [value_at(*curve(runs[s], start, axis), at_rollouts) for s in seeds]
    eq_mean, eq_se = mean_se(equal, mvar) if all(math.isfinite(e) for e in equal) else (float("nan"), float("nan"))
    areas = [area_under(*curve(runs[s], start, axis), area_upto) for s in seeds]
    area, area_se = mean_se(areas, mvar)
    row: dict[str, Any] = {
        "final": final, "final_se": final_se, "final_per_seed": [pool_success(runs[s]["pool"][-1]) for s in seeds],
        "at_equal_rollouts": eq_mean, "at_equal_rollouts_se": eq_se, "area": area, "area_se": area_se,
        "area_per_seed": areas, "start": pool_success(start["measure"]),
    }
    if grpo_final is not None:
        for axis in ("rollouts", "tokens"):
            for warm in (False, True):
                reach = [cost_to_reach(*curve(runs[s], start, axis, warm), grpo_final) for s in seeds]
                key = f"{axis}_to_grpo_final" + ("_with_warmup" if warm else "")
                row[key] = None if any(r is None for r in reach) else float(np.mean(reach))
                row[key + "_per_seed"] = reach
    return row


def matched(a: Mapping[int, Any], b: Mapping[int, Any]) -> list[int]:
    return sorted(set(a) & set(b))


# the per-step record each cost axis sums
SPENT = {"rollouts": "rollouts", "tokens": "generated_tokens"}


def difference(a: Mapping[int, Mapping[str, Any]], b: Mapping[int, Mapping[str, Any]], start: Mapping[str, Any],
               at_rollouts: float, axis: str = "rollouts") -> dict[str, Any] | None:
    """a − b in pool success at equal cost on ``axis`` (training rollouts, or generated tokens)
    over the seeds both have, with its standard error (each side's, in quadrature), and in the
    area under the curve over the same range. The point is ``at_rollouts``, or, where a matched
    run spent less, the most every matched run of both spent (a method whose rounds sample less
    than the budget is compared where both curves exist, not extrapolated); it is returned as
    ``at_<axis>``. None without a matched seed."""
    seeds = matched(a, b)
    if not seeds:
        return None
    at = min([at_rollouts, *(float(sum(runs[s]["steps"][SPENT[axis]])) for runs in (a, b) for s in seeds)])
    rows = [pool_row({s: runs[s] for s in seeds}, start, at, None, at, axis) for runs in (a, b)]
    diff = rows[0]["at_equal_rollouts"] - rows[1]["at_equal_rollouts"]
    se = math.hypot(rows[0]["at_equal_rollouts_se"], rows[1]["at_equal_rollouts_se"])
    return {"seeds": seeds, f"at_{axis}": at, "difference": diff, "se": se, "z": in_se(diff, se),
            "area_difference": rows[0]["area"] - rows[1]["area"],
            "area_se": math.hypot(rows[0]["area_se"], rows[1]["area_se"])}


def grpo_gain(grpo: Mapping[int, Mapping[str, Any]], start: Mapping[str, Any]) -> dict[str, Any]:
    """GRPO's pool-success gain from the shared start to its final measurement, with the SE of
    the end over seeds and of the start's measurement; ``measurable`` when gain > 3 SE."""
    seeds = sorted(grpo)
    ends = [pool_success(grpo[s]["pool"][-1]) for s in seeds]
    end, end_se = mean_se(ends, [measurement_variance(grpo[s]["pool"][-1]) for s in seeds])
    begin = pool_success(start["measure"])
    se = math.sqrt(end_se ** 2 + measurement_variance(start["measure"]))
    gain = end - begin
    return {"seeds": seeds, "start": begin, "end": end, "gain": gain, "se": se, "measurable": bool(gain > 3 * se),
            "end_per_seed": ends}


def truly_mixed_reading(runs: Mapping[int, Mapping[str, Any]], truth: Mapping[str, int], samples: int
                        ) -> dict[str, Any] | None:
    """Against the testbed's measured spread (``truth``: prompt → successes of ``samples``): of
    the prompts the method opened (bare rollouts > 0), the share truly mixed (0 < s < k), and,
    given a truly mixed opened prompt, how often its tree showed both outcomes."""
    opened = [o for s in sorted(runs) for o in runs[s]["opened"] if o["prompt"] in truth]
    if not opened:
        return None
    truly = [o for o in opened if 0 < truth[o["prompt"]] < samples]
    both = sum(1 for o in truly if o["both_outcomes"])
    return {"opened": len(opened), "truly_mixed": len(truly), "truly_mixed_share": len(truly) / len(opened),
            "both_outcomes_given_truly_mixed": both / len(truly) if truly else float("nan")}


def in_se(value: float, se: float) -> float:
    """``value`` in standard errors (±inf for a zero error, NaN for 0/0 or an undefined value or error)."""
    if not (math.isfinite(value) and not math.isnan(se)):
        return float("nan")
    if se > 0:
        return value / se
    return math.copysign(math.inf, value) if value else float("nan")


def reach_over_matched(trace: Mapping[int, Mapping[str, Any]], grpo: Mapping[int, Mapping[str, Any]],
                       start: Mapping[str, Any]) -> dict[str, Any]:
    """TRACE's rollouts to reach GRPO's final pool success as a share of GRPO's rollouts, both
    over the seeds the two have: GRPO's final is the mean over those seeds."""
    seeds = matched(trace, grpo)
    final = float(np.mean([pool_success(grpo[s]["pool"][-1]) for s in seeds]))
    rollouts = float(np.mean([sum(grpo[s]["steps"]["rollouts"]) for s in seeds]))
    row = pool_row({s: trace[s] for s in seeds}, start, rollouts, final, rollouts)
    return {"seeds": seeds, "grpo_final": final, "grpo_rollouts": rollouts,
            **{f"share{suffix}": (None if row[f"rollouts_to_grpo_final{suffix}"] is None
                                  else row[f"rollouts_to_grpo_final{suffix}"] / rollouts)
               for suffix in ("", "_with_warmup")}}


def judge(table: Mapping[str, Any]) -> dict[str, str]:
    """The fixed targets, judged on unrounded values (docstring of bench/learning.py), each over
    the seeds the compared methods both have."""
    pool, gain = table["pool"], table["grpo_gain"]
    out: dict[str, str] = {}
    if "trace" not in pool or "grpo" not in pool:
        return out
    if gain["measurable"]:
        out["grpo gain measurable (> 3 SE)"] = (f"PASS gain {gain['gain']:.4f} = "
                                                f"{in_se(gain['gain'], gain['se']):.2f} SE (seeds {gain['seeds']})")
    else:
        out["grpo gain measurable (> 3 SE)"] = (f"MISS gain {gain['gain']:.4f}, SE {gain['se']:.4f}: the other "
                                                "pool-success targets are not judged")
    grpo_tokens = table.get("grpo_tokens_per_step")
    if grpo_tokens is not None:  # the targets below assume every method at M(1+N)
        out["trace against grpo on the rollout axis"] = (
            f"not judged: grpo spent a token budget ({grpo_tokens} generated tokens a step), "
            "not trace's M(1+N) trajectories; the comparisons at equal generated tokens stand instead")
    if not gain["measurable"] or grpo_tokens is not None:
        return out
    reach = table["reach"]
    for suffix, counted in (("", "warm-up not counted"), ("_with_warmup", "warm-up counted")):
        share = reach[f"share{suffix}"]
        label = f"trace reaches grpo's final with <= 70% of its rollouts ({counted})"
        out[label] = ("PASS " if share is not None and share <= 0.7 else "MISS ") + (
            "never reached" if share is None else f"{100 * share:.1f}% of grpo's rollouts") + (
            f" (grpo's final {reach['grpo_final']:.4f} over seeds {reach['seeds']})")
    d = table["differences"].get("trace-grpo")
    if d is not None:
        out["trace final at equal rollouts > grpo by > 2 SE"] = (
            ("PASS " if d["z"] > 2 else "MISS ") + f"{d['difference']:+.4f} ({d['z']:.2f} SE, seeds {d['seeds']})")
    peers = [m for m in PAPER_METHODS if f"{m}-grpo" in table["differences"] or m == "grpo"]
    areas = {m: (table["differences"]["trace-grpo"] if m == "grpo" else table["differences"].get(f"trace-{m}"))
             for m in peers}
    ahead = all(a is not None and a["area_difference"] > 0 for a in areas.values())
    out["trace area under the curve highest of " + "/".join(peers)] = ("PASS " if ahead else "MISS ") + ", ".join(
        f"trace - {m} {a['area_difference']:+.4f} (seeds {a['seeds']})" for m, a in areas.items() if a is not None)
    return out


def build_table(runs: Sequence[Mapping[str, Any]], start: Mapping[str, Any], truth: Mapping[str, int] | None = None,
                truth_samples: int = 8) -> dict[str, Any]:
    """Every figure of the benchmark from its records (a JSON-able dict)."""
    methods = by_method(runs)
    if "grpo" not in methods:
        raise ValueError("the learning table needs grpo's runs (its final pool success is the target)")
    grpo = methods["grpo"]
    equal = float(np.mean([sum(grpo[s]["steps"]["rollouts"]) for s in grpo]))
    upto = min(min(sum(r["steps"]["rollouts"]) for r in m.values()) for m in methods.values())
    upto = min(upto, equal)
    gain = grpo_gain(grpo, start)
    order = sorted(methods, key=lambda m: (m != "grpo", m))
    table: dict[str, Any] = {
        "equal_rollouts": equal, "area_upto_rollouts": upto, "grpo_gain": gain,
        "signal": {m: signal_row(m, methods[m]) for m in order},
        "pool": {m: pool_row(methods[m], start, equal, gain["end"], upto) for m in order},
        "heldout": {m: heldout_row(methods[m], start) for m in order},
        "differences": {f"{m}-grpo": difference(methods[m], grpo, start, equal) for m in order if m != "grpo"},
    }
    for m in ("dapo", "greso", "pcl", "treepo", "vip", "trace-posterior-thompson", "knapsack-rl", "arpo"):
        if m in methods and "trace" in methods:
            table["differences"][f"trace-{m}"] = difference(methods["trace"], methods[m], start, equal)
    if "trace" in methods:
        table["reach"] = reach_over_matched(methods["trace"], grpo, start)
    budgets = {r["settings"].get("tokens_per_step") for r in grpo.values()}
    if len(budgets) > 1:
        raise ValueError(f"grpo's records were made under different budgets ({sorted(budgets, key=str)}): "
                         "one folder, one grpo budget")
    table["grpo_tokens_per_step"] = budgets.pop()
    # at equal generated tokens (GRPO's mean spend, or the most both spent): a method that expands
    # or prices tokens generates less per rollout, so this is the axis its cost is paid on
    tokens = float(np.mean([sum(grpo[s]["steps"]["generated_tokens"]) for s in grpo]))
    table["equal_tokens"] = tokens
    pairs = [(m, "grpo") for m in order if m != "grpo"]
    for lead in ("trace-tokens", "trace"):  # the token rule leads where it ran (its own benchmark)
        if lead in methods:
            pairs += [(lead, m) for m in order if m not in ("grpo", lead) and (m, lead) not in pairs]
    table["differences_at_equal_tokens"] = {f"{a}-{b}": difference(methods[a], methods[b], start, tokens, "tokens")
                                            for a, b in pairs}
    if truth is not None:
        table["truly_mixed"] = {m: truly_mixed_reading(methods[m], truth, truth_samples) for m in order}
    table["targets"] = judge(table)
    return table
