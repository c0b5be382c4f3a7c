"""The learning benchmark and the honest train_compare table: committed tables recomputed from
their committed records, the table's statistics against hand computation, and a miniature of
the benchmark (two methods, two steps, a 16-question testbed) through the same code."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from bench import learning_table as lt
from trace_core.metrics import wilson_interval

ROOT = Path(__file__).resolve().parents[1]
LEARNING = [sys.executable, "-m", "bench.learning"]  # run from ROOT, as a user does


def _same(a, b, path="") -> None:
    """Deep equality, floats to 1e-12 relative (a JSON round trip keeps them exact; NaN == NaN)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys {sorted(a)} vs {sorted(b)}"
        for k in a:
            _same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: {a} vs {b}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float | int):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12, abs=1e-12), f"{path}: {a} vs {b}"
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


@pytest.mark.parametrize("name", ["train_compare.json", "train_compare_tokens.json", "train_compare_tokens_seed1.json"])
def test_the_committed_train_compare_tables_are_recomputed_from_their_own_series(name: str) -> None:
    """Both committed tables (at M(1+N) trajectories, and at an equal budget of generated tokens
    with its own targets) are what their per-run series give."""
    from bench import train_compare

    path = ROOT / "bench" / "results" / name
    committed = json.loads(path.read_text())
    again = json.loads(json.dumps(train_compare.retable(path), default=float))
    _same(again["rows"], committed["rows"], "rows")
    _same(again["targets"], committed["targets"], "targets")


def test_train_compare_ratios_are_pooled_counts_with_wilson_intervals() -> None:
    from bench import train_compare

    committed = json.loads((ROOT / "bench" / "results" / "train_compare.json").read_text())
    trace = next(r for r in committed["rows"] if r["method"] == "trace")
    mixed = sum(sum(committed["series"][f"trace/seed{s}"]["counts/mixed_groups"]) for s in trace["seeds"])
    activated = sum(sum(committed["series"][f"trace/seed{s}"]["counts/activated"]) for s in trace["seeds"])
    assert trace["effective_ratio"] == mixed / activated
    assert trace["effective_ratio_ci90"] == list(wilson_interval(int(mixed), int(activated)))
    assert "seeds [0, 1, 2]" in committed["targets"]["trace effective ratio >= 1.8x grpo"]
    # summarise gives these figures from the runs' series: the ratio pooled as counts, not a mean of ratios
    rows, _ = train_compare.summarise(train_compare.results_runs(committed), ["grpo", "trace"],
                                      committed["budget"]["pool_k"], committed.get("pool_size", 128))
    row = next(r for r in rows if r["method"] == "trace")
    assert row["seeds"] == trace["seeds"]
    assert row["effective_ratio"] == pytest.approx(mixed / activated, rel=1e-12)
    assert row["effective_ratio_ci90"] == pytest.approx(list(wilson_interval(int(mixed), int(activated))), rel=1e-12)


def _run(variant: str, seed: int, rollouts: list[int], tokens: list[int], pool: list[dict], mixed: list[int],
         activated: list[int], heldout: dict[str, int], warmup: float = 0.0) -> dict:
    return {"variant": variant, "seed": seed, "commit": "c", "dirty": False, "settings": {"testbed": {}},
            "steps": {"rollouts": rollouts, "generated_tokens": tokens, "mixed_groups": mixed,
                      "activated": activated, "mixed_groups_trained": mixed},
            "pool": pool, "warmup": {"rollouts": warmup, "generated_tokens": 10 * warmup},
            "heldout": {"samples": 2, "successes": heldout}, "opened": []}


def _measure(step: int, successes: list[int], k: int = 4) -> dict:
    return {"step": step, "samples": k, "successes": {f"p{i}": s for i, s in enumerate(successes)}}


def test_learning_statistics_by_hand() -> None:
    start = {"measure": _measure(0, [0, 2, 4, 4])}  # 10/16
    assert lt.pool_success(start["measure"]) == 10 / 16
    # per prompt p(1-p)/(k-1): 0, 0.25/3, 0, 0 -> over P^2 = 16
    assert lt.measurement_variance(start["measure"]) == pytest.approx(0.25 / 3 / 16)
    a = _run("grpo", 0, [10, 10], [100, 100], [_measure(1, [1, 2, 4, 4]), _measure(2, [2, 3, 4, 4])],
             [1, 2], [4, 4], {"q0": 1, "q1": 2})
    b = _run("grpo", 1, [10, 10], [100, 100], [_measure(1, [0, 2, 4, 4]), _measure(2, [4, 4, 4, 4])],
             [0, 1], [4, 4], {"q0": 0, "q1": 2})
    x, y = lt.curve(a, start, "rollouts")
    assert list(x) == [0, 10, 20] and list(y) == [10 / 16, 11 / 16, 13 / 16]
    xw, _ = lt.curve(a, start, "tokens", warmup=True)
    assert list(xw) == [0, 100, 200]
    # area: trapezoid over [0, 20] / 20
    assert lt.area_under(x, y, 20) == pytest.approx(((10 + 11) / 2 + (11 + 13) / 2) * 10 / 16 / 20)
    assert lt.cost_to_reach(x, y, 12 / 16) == pytest.approx(15.0)
    assert lt.cost_to_reach(x, y, 0.9) is None
    gain = lt.grpo_gain({0: a, 1: b}, start)
    ends = [13 / 16, 16 / 16]
    end_se2 = max(np.var(ends, ddof=1), np.mean([lt.measurement_variance(a["pool"][-1]), 0.0])) / 2
    assert gain["gain"] == pytest.approx(np.mean(ends) - 10 / 16)
    assert gain["se"] == pytest.approx(math.sqrt(end_se2 + 0.25 / 3 / 16))
    sig = lt.signal_row("grpo", {0: a, 1: b})
    assert sig["effective_ratio"]["value"] == 4 / 16 and sig["effective_ratio"]["ci90"] == list(wilson_interval(4, 16))
    assert sig["effective_ratio_per_seed"] == [3 / 8, 1 / 8]
    held = lt.heldout_row({0: a, 1: b})
    assert held["value"] == 5 / 8 and held["per_seed"] == [3 / 4, 2 / 4]
    table = lt.build_table([a, b], start)
    assert table["equal_rollouts"] == 20 and table["grpo_gain"]["measurable"] == gain["measurable"]


def test_comparisons_use_only_the_seeds_both_methods_have() -> None:
    start = {"measure": _measure(0, [0, 0, 4, 4])}
    g = {s: _run("grpo", s, [8], [80], [_measure(1, [1, 0, 4, 4])], [1], [2], {"q": 1}) for s in (0, 1)}
    t = {1: _run("trace", 1, [8], [50], [_measure(1, [3, 1, 4, 4])], [2], [2], {"q": 2}),
         2: _run("trace", 2, [8], [50], [_measure(1, [0, 0, 0, 0])], [0], [2], {"q": 0})}
    d = lt.difference(t, g, start, 8)
    assert d["seeds"] == [1]
    assert d["difference"] == pytest.approx(12 / 16 - 9 / 16)


def test_a_method_that_spends_less_is_compared_where_both_curves_exist() -> None:
    """A round rule may spend fewer rollouts than GRPO's budget: the pair is compared at the most
    both spent (interpolated on the longer curve), never extrapolated to NaN, and an undefined
    difference is NaN standard errors, not infinitely many."""
    start = {"measure": _measure(0, [0, 0, 0, 0])}
    g = {0: _run("grpo", 0, [10, 10], [100, 100], [_measure(1, [2, 0, 0, 0]), _measure(2, [3, 1, 0, 0])], [1, 1],
                 [2, 2], {"q": 1})}
    short = {0: _run("greso", 0, [5, 10], [50, 100], [_measure(1, [4, 0, 0, 0]), _measure(2, [4, 2, 2, 0])],
                     [1, 1], [2, 2], {"q": 1})}
    d = lt.difference(short, g, start, 20)
    assert d["at_rollouts"] == 15
    # at 15 rollouts: greso at its last point 8/16; grpo halfway between 2/16 and 4/16
    assert d["difference"] == pytest.approx(8 / 16 - 3 / 16)
    assert math.isfinite(d["z"])
    assert math.isnan(lt.in_se(float("nan"), float("nan"))) and lt.in_se(1.0, 0.0) == math.inf


def test_runs_are_compared_at_equal_generated_tokens_too() -> None:
    """Every method is compared with GRPO, and TRACE with every other, at equal generated tokens
    (GRPO's mean spend, or the most both spent) beside the equal-rollouts comparisons, with a token
    budget or without one."""
    start = {"measure": _measure(0, [0, 0, 4, 4])}  # 8/16
    g = _run("grpo", 0, [10, 10], [100, 100], [_measure(1, [1, 0, 4, 4]), _measure(2, [2, 0, 4, 4])], [1, 1],
             [2, 2], {"q": 1})
    t = _run("trace-tokens", 0, [30, 30], [50, 50], [_measure(1, [2, 1, 4, 4]), _measure(2, [3, 1, 4, 4])], [2, 2],
             [3, 3], {"q": 1})
    unbudgeted = lt.build_table([g, t], start)
    assert unbudgeted["equal_tokens"] == 200
    assert unbudgeted["differences_at_equal_tokens"]["trace-tokens-grpo"]["at_tokens"] == 100
    for r in (g, t):
        r["settings"] = {**r["settings"], "tokens_per_step": 100}
    table = lt.build_table([g, t], start)
    assert table["equal_tokens"] == 200
    d = table["differences_at_equal_tokens"]["trace-tokens-grpo"]
    assert d["at_tokens"] == 100  # trace-tokens spent only 100 tokens: compared where both curves exist
    assert d["difference"] == pytest.approx(12 / 16 - 9 / 16)
    # areas over [0, 100] tokens / 100: (8 + 11)/2 * 50 + (11 + 12)/2 * 50 against (8 + 9)/2 * 100, over 16
    assert d["area_difference"] == pytest.approx((1050 - 850) / 16 / 100)
    # trace at M(1+N) beside grpo at a token budget: the rollout-axis targets are not judged
    tr = {**t, "variant": "trace", "settings": {k: v for k, v in t["settings"].items() if k != "tokens_per_step"}}
    targets = lt.build_table([g, tr], start)["targets"]
    assert "trace against grpo on the rollout axis" in targets and not any("PASS" in v for k, v in targets.items()
                                                                           if k.startswith("trace "))
    g2 = {**g, "seed": 1, "settings": {**g["settings"], "tokens_per_step": 200}}
    with pytest.raises(ValueError, match="different budgets"):
        lt.build_table([g, g2, t], start)


@pytest.fixture(scope="module")
def mini_testbed(kb_qa_index, tmp_path_factory):
    """A 16-question testbed warm start (the pipeline's recipe), its held-out split from the
    embedded QA test questions on its topics."""
    import dataclasses

    from conftest import batched_threads

    from trace_core.warmstart.pipeline import TESTBED_SFT, WarmStartConfig, run_warm_start
    from trace_core.warmstart.testbed import TestbedConfig

    out = tmp_path_factory.mktemp("mini_testbed")
    index_dir, _ = kb_qa_index
    config = WarmStartConfig(data_dir=str(ROOT / "data"), out_dir=str(out), families=("qa",), eval_tasks=0,
                             qa_index=str(index_dir), view_sft=None,
                             testbed=TestbedConfig(pool_size=16, grpo_ratio_range=(0.0, 1.0)),
                             sft=dataclasses.replace(TESTBED_SFT, progress=False, epochs=20))
    with batched_threads():
        run_warm_start(config)
    return out, index_dir


def test_a_miniature_learning_benchmark_runs_and_its_table_is_recomputed_from_the_records(
        mini_testbed, tmp_path) -> None:
    """Two methods, two steps each, through ``python -m bench.learning run`` and ``table``: the records
    hold every count the table needs, the table recomputed from them alone is the written one,
    and a second ``run`` finds every record and runs nothing."""
    testbed, index_dir = mini_testbed
    records, work = tmp_path / "records", tmp_path / "work"
    cmd = [*LEARNING, "run", "--testbed", str(testbed), "--methods", "grpo", "trace",
           "--seeds", "0", "--steps", "2", "--pool-k", "2", "--heldout-k", "2", "--roots-M", "8", "--data",
           str(ROOT / "data"), "--index", str(index_dir), "--work", str(work), "--records", str(records)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    grpo = json.loads((records / "runs" / "grpo-seed0.json").read_text())
    trace = json.loads((records / "runs" / "trace-seed0.json").read_text())
    assert [m["step"] for m in grpo["pool"]] == [1, 2]
    assert len(grpo["pool"][0]["successes"]) == 16 and grpo["settings"]["measure_at"] == [1, 2]
    assert sum(grpo["steps"]["rollouts"]) == 32 and len(trace["steps"]["rollouts"]) == 2
    assert trace["warmup"]["rollouts"] > 0 and grpo["warmup"]["rollouts"] == 0
    assert grpo["heldout"]["samples"] == 2 and len(grpo["heldout"]["successes"]) > 0
    assert {o["prompt"] for o in grpo["opened"]} and isinstance(grpo["dirty"], bool)
    shown = subprocess.run([*LEARNING, "table", "--records", str(records), "--no-plot"], capture_output=True,
                           text=True, cwd=ROOT, timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    table = json.loads((records / "table.json").read_text())
    start = json.loads((records / "start.json").read_text())
    again = json.loads(json.dumps(lt.build_table([grpo, trace], start), default=float))
    _same({k: again[k] for k in again}, {k: table[k] for k in again})
    sig = table["signal"]["trace"]["effective_ratio"]
    assert sig["value"] == sum(trace["steps"]["mixed_groups"]) / sum(trace["steps"]["activated"])
    rerun = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert rerun.returncode == 0 and rerun.stdout.count("record present, skipped") == 2, rerun.stdout[-2000:]


def committed_record_folders() -> list[Path]:
    """Every committed learning benchmark (one folder per testbed policy: the live one, and any
    earlier one kept because its policy can no longer be rebuilt bit for bit)."""
    return sorted(p for p in (ROOT / "bench" / "results").glob("learning*") if (p / "start.json").is_file()
                  or (p / "runs").is_dir())


@pytest.mark.parametrize("records", committed_record_folders(), ids=lambda p: p.name)
def test_the_committed_learning_table_is_recomputed_from_its_records(records: Path, tmp_path) -> None:
    """``python -m bench.learning table`` on the committed records reproduces the committed table.
    (Until the first records are committed there is nothing to recompute: the records folder
    then holds no table either, which is checked.)"""
    if not (records / "table.json").is_file():
        assert not list((records / "runs").glob("*.json")) if (records / "runs").is_dir() else True
        return
    copy = tmp_path / "learning"
    copy.mkdir()
    (copy / "runs").mkdir()
    for p in (records / "runs").glob("*.json"):
        (copy / "runs" / p.name).write_text(p.read_text())
    (copy / "start.json").write_text((records / "start.json").read_text())
    if (records / "spread.json").is_file():  # the spread measured on this benchmark's policy
        (copy / "spread.json").write_text((records / "spread.json").read_text())
    done = subprocess.run([*LEARNING, "table", "--records", str(copy), "--no-plot"], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    _same(json.loads((copy / "table.json").read_text()), json.loads((records / "table.json").read_text()))


def test_the_learning_table_is_logged_to_mlflow_with_one_curve_per_record(tmp_path, server) -> None:
    """``table --mlflow`` on the committed records (the benchmark with the most), against a real
    MLflow server: a parent run with the table and the plot, one nested run per record whose
    ``pool/success`` history is the record's curve (step: cumulative training rollouts); logging
    the same table again logs nothing."""
    records = max(committed_record_folders(), key=lambda p: len(list((p / "runs").glob("*.json"))))
    copy = tmp_path / "learning"
    (copy / "runs").mkdir(parents=True)
    for p in (records / "runs").glob("*.json"):
        (copy / "runs" / p.name).write_text(p.read_text())
    (copy / "start.json").write_text((records / "start.json").read_text())
    cmd = [*LEARNING, "table", "--records", str(copy), "--mlflow", server.uri]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    client = MlflowClient(server.uri)
    experiment = client.get_experiment_by_name("bench-learning")
    logged = client.search_runs([experiment.experiment_id])
    parent = next(r for r in logged if r.info.run_name == "learning-table")
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} == {"table.json", "learning.png"}
    table = json.loads((copy / "table.json").read_text())
    for method, row in table["pool"].items():
        assert parent.data.metrics[f"{method}/pool_final"] == pytest.approx(row["final"], rel=1e-12)
    start = json.loads((copy / "start.json").read_text())
    children = {r.info.run_name: r for r in logged if r.info.run_id != parent.info.run_id}
    names = {p.stem for p in (copy / "runs").glob("*.json")}
    assert set(children) == names
    for name in names:
        x, y = lt.curve(json.loads((copy / "runs" / f"{name}.json").read_text()), start, "rollouts")
        history = sorted(client.get_metric_history(children[name].info.run_id, "pool/success"), key=lambda h: h.step)
        assert [(h.step, h.value) for h in history] == [(int(round(a)), float(b)) for a, b in zip(x, y, strict=True)]
        assert children[name].data.tags["mlflow.parentRunId"] == parent.info.run_id
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert again.returncode == 0 and "logged already" in again.stdout, again.stdout[-2000:]
    assert len(client.search_runs([experiment.experiment_id])) == len(logged)
