"""The real-policy learning benchmark's table, recomputed from its run records alone.

Pure functions of the records ``python -m bench.real_learning run`` writes (one JSON per method
and seed): numbers in, numbers out, so ``python -m bench.real_learning table`` on a fresh clone
gives the committed table back, and a test does exactly that.

**The measure** is held-out pass@1: k samples of each held-out question, under one request seed
for every method and measurement, so two policies are compared question by question. A record
holds the per-question success counts at every measurement, the shared start first.

**A curve** is pass@1 against the cumulative training cost (rollouts, or generated tokens) at the
measured steps; between two measurements each question's rate is interpolated linearly, so a
figure "at equal cost" is a mean over questions like every other.

**Standard errors.** Every figure is a mean over seeds of a mean over questions of a per-question
value x_{s,q} (a rate, a difference of two rates, an area). Two estimates of its variance:
across questions, var_q(mean_s x_{s,q}) / Q (the questions' own spread and the sampling within
each, which pairing by question keeps out of a difference's error); across seeds,
var_s(mean_q x_{s,q}) / n (the training's own spread). The error is the larger of the two: one
seed gives only the first, and adding the two would count the sampling noise twice.

**Comparisons** between two methods use the seeds both have; every verdict is taken on unrounded
values. The targets are fixed before any run (``judge``), and the gate comes first: the other
targets are judged only once GRPO's held-out gain exceeds 3 standard errors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bench.learning_table import cost_to_reach, in_se
from trace_core.metrics import paired_pass_difference, pass_at_1, wilson_interval

RECORD_FORMAT = "trace-rl/real-learning-run/1"
PEERS = ("pcl", "dapo", "trace-posterior-thompson", "knapsack-rl", "arpo")  # TRACE − each, on every measure
AXES = {"rollouts": "rollouts", "tokens": "generated_tokens"}  # a cost axis -> the per-step figure it sums

Record = Mapping[str, Any]


# ============================================================================ one run
def questions(measure: Mapping[str, Any]) -> list[str]:
    return sorted(measure["successes"])


def rates(measure: Mapping[str, Any], order: Sequence[str]) -> np.ndarray:
    """Per-question success rates of one measurement, in ``order``."""
    k = float(measure["samples"])
    return np.array([measure["successes"][q] / k for q in order], dtype=np.float64)


def spent(record: Record, axis: str, warmup: bool = False) -> np.ndarray:
    """Cumulative training cost on ``axis`` after each step (index 0: before the first); with
    ``warmup``, the predictor warm-up's cost is added from the start."""
    per_step = np.asarray(record["steps"][AXES[axis]], dtype=np.float64)
    out = np.concatenate([[0.0], np.cumsum(per_step)])
    if warmup:
        out = out + warmup_cost(record, axis)
    return out


def warmup_cost(record: Record, axis: str) -> float:
    """The predictor warm-up's cost on ``axis`` (0 for a method without one)."""
    return float((record.get("warmup") or {}).get(AXES[axis], 0.0))


def measured(record: Record, axis: str, warmup: bool = False) -> tuple[np.ndarray, list[Mapping[str, Any]]]:
    """(cumulative cost at each held-out measurement, the measurements), the start first."""
    costs = spent(record, axis, warmup)
    return np.array([costs[int(m["step"])] for m in record["heldout"]]), list(record["heldout"])


def rates_at(record: Record, axis: str, at: float, order: Sequence[str], warmup: bool = False) -> np.ndarray | None:
    """Per-question rates at cost ``at``, linear between the two measurements around it (None past
    the last measurement or before the first)."""
    x, measures = measured(record, axis, warmup)
    if at > x[-1] + 1e-9 or at < x[0] - 1e-9:
        return None
    i = int(np.searchsorted(x, at, side="left"))
    if i == 0 or abs(x[i] - at) <= 1e-9:
        return rates(measures[i], order)
    w = (at - x[i - 1]) / (x[i] - x[i - 1])
    return (1 - w) * rates(measures[i - 1], order) + w * rates(measures[i], order)


def area_rates(record: Record, axis: str, upto: float, order: Sequence[str]) -> np.ndarray:
    """Per question, the mean rate over training cost [0, upto] (the trapezoid area of its
    interpolated curve divided by the range)."""
    x, measures = measured(record, axis)
    keep = x < upto - 1e-9
    xs = np.concatenate([x[keep], [upto]])
    ys = np.stack([rates(m, order) for m, k in zip(measures, keep, strict=True) if k]
                  + [rates_at(record, axis, upto, order)])
    return np.trapezoid(ys, xs, axis=0) / (upto - xs[0])


def curve(record: Record, axis: str, warmup: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(cumulative cost, held-out pass@1) at each measurement, the start first."""
    x, measures = measured(record, axis, warmup)
    return x, np.array([pass_at_1(m["successes"], m["samples"]).value for m in measures])


def total(record: Record, key: str) -> float:
    return float(sum(record["steps"][key]))


# ============================================================================ means over seeds
def estimate(per_seed: Sequence[np.ndarray]) -> dict[str, Any]:
    """The mean over seeds of per-question values ``per_seed`` (one array per seed, the questions
    in one order) with its standard error (module docstring)."""
    x = np.stack(per_seed)
    n, q = x.shape
    by_question = x.mean(axis=0)
    by_seed = x.mean(axis=1)
    across_questions = float(by_question.var(ddof=1) / q) if q > 1 else float("nan")
    across_seeds = float(by_seed.var(ddof=1) / n) if n > 1 else 0.0
    value, se = float(by_question.mean()), math.sqrt(max(across_questions, across_seeds))
    return {"value": value, "se": se, "z": in_se(value, se), "per_seed": by_seed.tolist()}


def mean_curve(runs: Sequence[Record], axis: str, warmup: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The seeds' mean curve: pass@1 averaged over seeds at every cost one of them was measured at,
    up to the least any of them reached (each seed's curve interpolated there)."""
    curves = [curve(r, axis, warmup) for r in runs]
    end = min(float(x[-1]) for x, _ in curves)
    xs = np.unique(np.concatenate([x[x <= end + 1e-9] for x, _ in curves]))
    return xs, np.mean([np.interp(xs, x, y) for x, y in curves], axis=0)


# ============================================================================ a method
def by_method(runs: Sequence[Record]) -> dict[str, dict[int, Record]]:
    out: dict[str, dict[int, Record]] = {}
    for r in runs:
        out.setdefault(r["method"], {})[int(r["seed"])] = r
    return out


def effective_ratio(runs: Mapping[int, Record]) -> dict[str, Any]:
    """Mixed groups over the prompts that finished a trajectory, pooled as counts over steps and
    seeds, with its 90% Wilson interval; a record written before the prompt counts were kept gives
    the rollout-weighted mean of its steps' ratios, without an interval."""
    seeds = sorted(runs)
    if all("activated" in runs[s]["steps"] for s in seeds):
        mixed = int(round(sum(total(runs[s], "mixed_groups") for s in seeds)))
        activated = int(round(sum(total(runs[s], "activated") for s in seeds)))
        return {"value": mixed / activated if activated else float("nan"),
                "ci90": list(wilson_interval(mixed, activated)), "count": mixed, "of": activated}
    ratios = np.concatenate([runs[s]["steps"]["effective_ratio"] for s in seeds])
    weights = np.concatenate([runs[s]["steps"]["rollouts"] for s in seeds])
    return {"value": float(np.average(ratios, weights=weights)), "ci90": None}


def reading(steps: Sequence[Mapping[str, Sequence[float]]], opened: Sequence[Mapping[str, Any]] = ()
            ) -> dict[str, Any]:
    """Where a method's rollouts went, over its runs (``steps``: each run's per-step figures):

    - ``continuation_share``: the share of the selected prompts' rollouts spent on continuations
      (1 − bare rollouts / all rollouts), from the per-step allocation figures, or, for a record
      that kept the prompts it opened instead (the testbed benchmark's), from those;
    - ``prefix_effective_ratio``: of the anchors expanded, the share whose branch group met both
      outcomes — how often a continuation met the outcome its siblings did not (None: no anchor);
    - ``expanded_anchors_per_step`` and the roots' ``effective_ratio`` beside them."""
    if opened:
        bare = sum(o["bare"] for o in opened)
        every = sum(o["rollouts"] for o in opened)
        share = 1.0 - bare / every if every else float("nan")
    elif all(s.get("mean_rollouts_selected") for s in steps):
        parts = [(1.0 - np.asarray(s["mean_m_selected"]) / np.asarray(s["mean_rollouts_selected"]),
                  np.asarray(s["rollouts"])) for s in steps]
        share = float(np.average(np.concatenate([p for p, _ in parts]), weights=np.concatenate([w for _, w in parts])))
    else:
        share = None
    expanded = sum(float(sum(s.get("expanded_anchors", []))) for s in steps)
    mixed = sum(float(sum(s.get("mixed_anchors", []))) for s in steps)
    n_steps = sum(len(s["rollouts"]) for s in steps)
    return {"continuation_share": share, "prefix_effective_ratio": mixed / expanded if expanded else None,
            "expanded_anchors_per_step": expanded / n_steps if n_steps else float("nan"),
            "mixed_anchors": mixed, "expanded_anchors": expanded}


def method_row(runs: Mapping[int, Record], order: Sequence[str], equal: float, upto: float,
               grpo_final: float | None) -> dict[str, Any]:
    """A method's figures: held-out pass@1 at its end and at ``equal`` training rollouts, its gain
    from the start (paired by question), the area under its curve up to ``upto`` rollouts, the
    rollouts and tokens its seeds' mean curve took to reach ``grpo_final`` (warm-up not counted,
    and counted), its effective ratio, costs and the reading of where its rollouts went."""
    seeds = sorted(runs)
    start = rates(runs[seeds[0]]["heldout"][0], order)
    ends = [rates(runs[s]["heldout"][-1], order) for s in seeds]
    at_equal = [rates_at(runs[s], "rollouts", equal, order) for s in seeds]
    row: dict[str, Any] = {
        "seeds": seeds, "start": float(start.mean()),
        "end": estimate(ends), "gain": estimate([e - start for e in ends]),
        "at_equal_rollouts": None if any(a is None for a in at_equal) else estimate(at_equal),
        "area": estimate([area_rates(runs[s], "rollouts", upto, order) for s in seeds]),
        "effective_ratio": effective_ratio(runs),
        "rollouts": float(np.mean([total(runs[s], "rollouts") for s in seeds])),
        "generated_tokens": float(np.mean([total(runs[s], "generated_tokens") for s in seeds])),
        "warmup_rollouts": float(np.mean([warmup_cost(runs[s], "rollouts") for s in seeds])),
        "warmup_tokens": float(np.mean([warmup_cost(runs[s], "tokens") for s in seeds])),
        "wall_s": float(sum(runs[s]["wall_s"] for s in seeds)),
        # the sittings (sessions, machines) its runs took, each resumed from the last one's checkpoint
        "sittings": sum(len(runs[s].get("sittings") or [None]) for s in seeds),
        "reading": reading([runs[s]["steps"] for s in seeds]),
    }
    if grpo_final is not None:
        for axis in AXES:
            for warm in (False, True):
                key = f"{axis}_to_grpo_final" + ("_with_warmup" if warm else "")
                row[key] = cost_to_reach(*mean_curve([runs[s] for s in seeds], axis, warm), grpo_final)
    return row


def difference(a: Mapping[int, Record], b: Mapping[int, Record], order: Sequence[str], at: float,
               axis: str = "rollouts") -> dict[str, Any] | None:
    """a − b in held-out pass@1 at equal cost on ``axis``, paired by question, over the seeds both
    have, and in the area under the curve over the same range. The point is ``at``, or, where a
    matched run spent less, the most every matched run of both spent (compared where both curves
    exist, never extrapolated); it is returned as ``at``. None without a matched seed."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    at = min([at, *(total(runs[s], AXES[axis]) for runs in (a, b) for s in seeds)])
    diffs = [rates_at(a[s], axis, at, order) - rates_at(b[s], axis, at, order) for s in seeds]
    areas = [area_rates(a[s], axis, at, order) - area_rates(b[s], axis, at, order) for s in seeds]
    return {"seeds": seeds, "axis": axis, "at": at, **estimate(diffs), "area": estimate(areas)}


# ============================================================================ the table
def shared_questions(runs: Sequence[Record]) -> list[str]:
    """The held-out questions every measurement of every run covers (a ValueError otherwise: a run
    measured on other questions is not paired with the rest), checking the runs share one start."""
    order = questions(runs[0]["heldout"][0])
    for r in runs:
        for m in r["heldout"]:
            if questions(m) != order:
                raise ValueError(f"{r['method']} seed {r['seed']}: its measurement at step {m['step']} covers other "
                                 "held-out questions than the first run's start: records of one table are paired by "
                                 "question")
        if r["heldout"][0] != runs[0]["heldout"][0]:
            raise ValueError(f"{r['method']} seed {r['seed']} starts from another measurement than "
                             f"{runs[0]['method']} seed {runs[0]['seed']}: one table, one shared start")
    return order


def summarise(record: Record) -> dict[str, Any]:
    """One run's row: its held-out curve and its gain from the start, paired by question."""
    first, last = record["heldout"][0], record["heldout"][-1]
    gain = paired_pass_difference(last["successes"], last["samples"], first["successes"], first["samples"])
    x, y = curve(record, "rollouts")
    return {"method": record["method"], "seed": record["seed"], "steps": record["settings"]["steps"],
            "start": float(y[0]), "end": float(y[-1]), "gain": gain.value, "gain_se": gain.se,
            "gain_in_se": in_se(gain.value, gain.se),
            "effective_ratio": effective_ratio({0: record})["value"],
            "rollouts": total(record, "rollouts"), "generated_tokens": total(record, "generated_tokens"),
            "wall_s": record["wall_s"],
            **{k: v for k, v in reading([record["steps"]]).items() if k in ("continuation_share",
                                                                             "prefix_effective_ratio")},
            "curve": [{"step": int(m["step"]), "rollouts": float(c), "pass_at_1": float(v)}
                      for m, c, v in zip(record["heldout"], x, y, strict=True)]}


def build_table(runs: Sequence[Record], testbed: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Every figure of the benchmark from its records (a JSON-able dict). ``testbed``: the testbed
    benchmark's reading per method (:func:`testbed_reading`), set beside this policy's."""
    if not runs:
        raise ValueError("the table needs at least one record")
    order = shared_questions(runs)
    methods = by_method(runs)
    rows = [summarise(r) for r in runs]
    table: dict[str, Any] = {"runs": rows, "questions": len(order),
                             # each GRPO run's own verdict, the pilots' rule for choosing the protocol
                             "grpo_gain_above_3_se": {f"seed{r['seed']}": bool(r["gain_in_se"] > 3) for r in rows
                                                      if r["method"] == "grpo"}}
    if "grpo" not in methods:
        return table  # a folder without GRPO has rows, no comparisons: its final is every target's yardstick
    grpo = methods["grpo"]
    equal = float(np.mean([total(r, "rollouts") for r in grpo.values()]))
    upto = min(equal, *(total(r, "rollouts") for m in methods.values() for r in m.values()))
    grpo_row = method_row(grpo, order, equal, upto, None)
    grpo_final = grpo_row["end"]["value"]
    ordered = sorted(methods, key=lambda m: (m != "grpo", m))
    table.update({
        "equal_rollouts": equal, "area_upto_rollouts": upto,
        "grpo_gain": {**grpo_row["gain"], "start": grpo_row["start"], "end": grpo_final,
                      "measurable": bool(grpo_row["gain"]["z"] > 3)},
        "methods": {m: method_row(methods[m], order, equal, upto, grpo_final) for m in ordered},
    })
    tokens = float(np.mean([total(r, "generated_tokens") for r in grpo.values()]))
    table["equal_tokens"] = tokens
    pairs = [(m, "grpo") for m in ordered if m != "grpo"]
    if "trace" in methods:
        pairs += [("trace", m) for m in PEERS if m in methods]
    for key, at, axis in (("differences", equal, "rollouts"), ("differences_at_equal_tokens", tokens, "tokens")):
        found = {f"{a}-{b}": (a, b, difference(methods[a], methods[b], order, at, axis)) for a, b in pairs}
        table[key] = {pair: None if d is None else {"a": a, "b": b, **d} for pair, (a, b, d) in found.items()}
    if testbed is not None:
        table["testbed_reading"] = dict(testbed)
    table["targets"] = judge(table)
    return table


def testbed_reading(records: Sequence[Record]) -> dict[str, dict[str, Any]]:
    """The testbed benchmark's reading per method, from its records (``bench/results/learning/runs``),
    computed as this benchmark's is: the policy that learns its pool and nothing beyond it, beside
    the real one."""
    out: dict[str, dict[str, Any]] = {}
    for method in sorted({r["variant"] for r in records}):
        mine = [r for r in records if r["variant"] == method]
        out[method] = {**reading([r["steps"] for r in mine], [o for r in mine for o in r.get("opened", [])]),
                       "effective_ratio": effective_ratio({i: r for i, r in enumerate(mine)})["value"],
                       "seeds": sorted(int(r["seed"]) for r in mine)}
    return out


def judge(table: Mapping[str, Any]) -> dict[str, str]:
    """The fixed targets, judged on unrounded values over the seeds the compared methods both have."""
    gain, rows = table["grpo_gain"], table["methods"]
    out = {"grpo's held-out gain > 3 SE": (
        ("PASS " if gain["measurable"] else "MISS ") + f"{gain['value']:+.4f} ± {gain['se']:.4f} "
        f"({gain['z']:.2f} SE, seeds {rows['grpo']['seeds']})"
        + ("" if gain["measurable"] else ": the protocol does not measure learning; the targets below are not judged"))}
    if not gain["measurable"]:
        return out
    if "trace" not in rows:
        return {**out, "trace's targets": "not judged: no trace records yet"}
    d = table["differences"]["trace-grpo"]
    if d is None:
        return {**out, "trace's targets": "not judged: trace and grpo have no seed in common yet"}
    out["trace − grpo at equal rollouts > 2 SE"] = (
        ("PASS " if d["z"] > 2 else "MISS ") + f"{d['value']:+.4f} ± {d['se']:.4f} ({d['z']:.2f} SE, "
        f"at {d['at']:,.0f} rollouts, seeds {d['seeds']})")
    grpo_rollouts = rows["grpo"]["rollouts"]
    for suffix, counted in (("", "warm-up not counted"), ("_with_warmup", "warm-up counted")):
        reach = rows["trace"][f"rollouts_to_grpo_final{suffix}"]
        share = None if reach is None else reach / grpo_rollouts
        out[f"trace reaches grpo's final with <= 70% of its rollouts ({counted})"] = (
            ("PASS " if share is not None and share <= 0.7 else "MISS ")
            + ("never reached" if share is None else f"{100 * share:.1f}% of grpo's rollouts")
            + f" (grpo's final {table['grpo_gain']['end']:.4f})")
    ratio = {m: rows[m]["effective_ratio"]["value"] for m in rows}
    label = "trace's effective ratio >= 2x grpo's and above pcl's"
    if "pcl" not in rows:
        out[label] = "not judged: no pcl records yet"
    else:
        holds = ratio["trace"] >= 2 * ratio["grpo"] and ratio["trace"] > ratio["pcl"]
        out[label] = ("PASS " if holds else "MISS ") + (
            f"trace {ratio['trace']:.4f}, grpo {ratio['grpo']:.4f} (x{ratio['trace'] / ratio['grpo']:.2f}), "
            f"pcl {ratio['pcl']:.4f}")
    label = "trace ahead of grpo and pcl at equal generated tokens"
    tokens = table["differences_at_equal_tokens"]
    if "pcl" not in rows:
        out[label] = "not judged: no pcl records yet"
    else:
        ahead = [tokens[f"trace-{m}"] for m in ("grpo", "pcl")]
        if any(t is None for t in ahead):
            out[label] = "not judged: trace shares no seed with grpo or pcl yet"
        else:
            out[label] = ("PASS " if all(t["value"] > 0 for t in ahead) else "MISS ") + ", ".join(
                f"trace − {m} {t['value']:+.4f} ± {t['se']:.4f} ({t['z']:.2f} SE) at {t['at']:,.0f} tokens"
                for m, t in zip(("grpo", "pcl"), ahead, strict=True))
    return out
