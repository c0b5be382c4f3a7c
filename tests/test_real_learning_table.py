"""bench/real_learning_table: the real-policy learning table from hand-made records, every figure
worked by hand — the errors over questions and seeds, a curve between measurements, the area, the
comparisons at equal rollouts and tokens, the targets and their gate, the reading beside the
testbed's — and its log in a real MLflow server."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from bench import real_learning as rl
from bench import real_learning_table as rt

QUESTIONS = [f"q{i:02d}" for i in range(20)]


def _measure(step: int, successes: list[int], samples: int = 4) -> dict:
    return {"step": step, "samples": samples, "successes": dict(zip(QUESTIONS, successes, strict=True))}


def _record(method: str, seed: int, curve: list[tuple[int, list[int]]], rollouts: float = 8.0,
            tokens: float = 100.0, steps: int = 4, warmup: dict | None = None, **extra_steps) -> dict:
    return {"format": rt.RECORD_FORMAT, "method": method, "seed": seed, "commit": "abc", "dirty": False,
            "settings": {"steps": steps}, "wall_s": 100.0, "warmup": warmup or {},
            "steps": {"rollouts": [rollouts] * steps, "generated_tokens": [tokens] * steps,
                      "effective_ratio": [0.25] * steps, "mixed_groups": [1.0] * steps,
                      "activated": [4.0] * steps, "reward": [0.5] * steps,
                      "expanded_anchors": [0.0] * steps, "mixed_anchors": [0.0] * steps, **extra_steps},
            "heldout": [_measure(step, s) for step, s in curve]}


START = [1] * 20  # every question 1 of 4 at the start: pass@1 0.25


def test_the_error_is_the_larger_of_the_spread_over_questions_and_over_seeds():
    got = rt.estimate([np.array([0.5, 0.0, 0.25]), np.array([0.25, 0.25, 0.5])])
    # by question (0.375, 0.125, 0.375): var 0.0208333 / 3 = 0.0069444; by seed (0.25, 0.3333): var 0.0034722 / 2
    assert got["value"] == pytest.approx(0.875 / 3)
    assert got["se"] == pytest.approx(np.sqrt(0.0208333333 / 3))
    assert got["per_seed"] == pytest.approx([0.25, 1 / 3])
    # two seeds far apart on every question: the seeds' spread is the larger
    apart = rt.estimate([np.array([0.0, 0.1, 0.0]), np.array([1.0, 1.0, 0.9])])
    by_seed = np.array([0.1 / 3, 2.9 / 3])
    assert apart["se"] == pytest.approx(np.sqrt(by_seed.var(ddof=1) / 2))
    # one seed: the questions' spread alone
    one = rt.estimate([np.array([0.0, 0.5, 1.0])])
    assert one["se"] == pytest.approx(0.5 / np.sqrt(3))


def test_a_curve_is_interpolated_between_measurements_question_by_question():
    r = _record("grpo", 0, [(0, START), (2, [3] * 10 + [1] * 10), (4, [4] * 20)])
    # costs after steps: 0, 8, 16, 24, 32; measured at 0, 16, 32
    x, y = rt.curve(r, "rollouts")
    assert x.tolist() == [0.0, 16.0, 32.0] and y.tolist() == pytest.approx([0.25, 0.5, 1.0])
    at24 = rt.rates_at(r, "rollouts", 24.0, QUESTIONS)
    assert at24.tolist() == pytest.approx([0.875] * 10 + [0.625] * 10)
    assert rt.rates_at(r, "rollouts", 33.0, QUESTIONS) is None
    # the area over [0, 16]: trapezoid of (0.25 -> 0.75) and (0.25 -> 0.25), over 16
    assert rt.area_rates(r, "rollouts", 16.0, QUESTIONS).tolist() == pytest.approx([0.5] * 10 + [0.25] * 10)
    # a warm-up of 40 rollouts moves the curve right, not the training figures
    warm = _record("trace", 0, [(0, START), (4, [4] * 20)], warmup={"rollouts": 40.0, "generated_tokens": 900.0})
    assert rt.curve(warm, "rollouts", warmup=True)[0].tolist() == [40.0, 72.0]
    assert rt.curve(warm, "tokens", warmup=True)[0].tolist() == [900.0, 1300.0]
    assert rt.cost_to_reach(np.array([0.0, 16.0, 32.0]), np.array([0.25, 0.5, 1.0]), 0.75) == pytest.approx(24.0)
    assert rt.cost_to_reach(np.array([0.0, 16.0]), np.array([0.25, 0.5]), 0.75) is None


def _table_records(trace_end: list[int], grpo_end: list[int], pcl_end: list[int]) -> list[dict]:
    half = [2] * 20
    return [_record("grpo", s, [(0, START), (2, half), (4, grpo_end)]) for s in (0, 1)] + [
        _record("trace", s, [(0, START), (2, half), (4, trace_end)], tokens=50.0,
                warmup={"rollouts": 16.0, "generated_tokens": 300.0},
                activated=[4.0] * 4, mixed_groups=[3.0] * 4, expanded_anchors=[2.0] * 4, mixed_anchors=[1.0] * 4,
                mean_m_selected=[2.0] * 4, mean_rollouts_selected=[4.0] * 4) for s in (0, 1)] + [
        _record("pcl", s, [(0, START), (2, half), (4, pcl_end)], mixed_groups=[2.0] * 4) for s in (0, 1)]


def test_the_table_judges_every_target_on_hand_made_records():
    grpo_end = [2] * 18 + [3, 1]  # 0.5 on average, every question but two moved by +1
    trace_end = [4] * 16 + [3] * 4  # 0.95
    runs = _table_records(trace_end, grpo_end, [3] * 20)
    table = rt.build_table(runs)
    gain = table["grpo_gain"]
    assert gain["value"] == pytest.approx(0.25) and gain["measurable"]
    d = table["differences"]["trace-grpo"]
    assert d["at"] == 32.0 and d["value"] == pytest.approx(0.95 - 0.5)
    per_question = np.array([4 / 4 - 2 / 4] * 16 + [3 / 4 - 2 / 4] * 2 + [3 / 4 - 3 / 4, 3 / 4 - 1 / 4])
    assert d["se"] == pytest.approx(per_question.std(ddof=1) / np.sqrt(20))  # the seeds agree: questions decide
    # at equal generated tokens: trace spent 200, grpo 400 -> compared at 200 tokens, trace's end
    t = table["differences_at_equal_tokens"]["trace-grpo"]
    assert t["at"] == 200.0
    assert t["value"] == pytest.approx(0.95 - 0.5)  # grpo at 200 of its 400 tokens: step 2, 0.5
    trace = table["methods"]["trace"]
    # grpo's final 0.5 is trace's at step 2 (16 rollouts): 50% of grpo's 32; 32 of 64 with the warm-up
    assert trace["rollouts_to_grpo_final"] == pytest.approx(16.0)
    assert trace["rollouts_to_grpo_final_with_warmup"] == pytest.approx(32.0)
    assert trace["effective_ratio"]["value"] == pytest.approx(0.75)
    assert trace["reading"]["continuation_share"] == pytest.approx(0.5)
    assert trace["reading"]["prefix_effective_ratio"] == pytest.approx(0.5)
    targets = table["targets"]
    assert targets["grpo's held-out gain > 3 SE"].startswith("PASS")
    assert targets["trace − grpo at equal rollouts > 2 SE"].startswith("PASS")
    assert targets["trace reaches grpo's final with <= 70% of its rollouts (warm-up not counted)"].startswith(
        "PASS 50.0%")
    assert targets["trace reaches grpo's final with <= 70% of its rollouts (warm-up counted)"].startswith("MISS 100.0%")
    # trace 0.75 >= 2 x grpo's 0.25 and above pcl's 0.5
    assert targets["trace's effective ratio >= 2x grpo's and above pcl's"].startswith("PASS")
    # pcl ends at 0.75 but spent grpo's tokens: at trace's 200 tokens it is at 0.5
    assert table["differences_at_equal_tokens"]["trace-pcl"]["value"] == pytest.approx(0.45)
    assert targets["trace ahead of grpo and pcl at equal generated tokens"].startswith("PASS")
    # a trace that ends below grpo misses what it must win
    worse = rt.build_table(_table_records([2] * 20, grpo_end, [3] * 20))["targets"]
    assert worse["trace − grpo at equal rollouts > 2 SE"].startswith("MISS")
    assert worse["trace ahead of grpo and pcl at equal generated tokens"].startswith("MISS")


def test_without_a_measurable_grpo_gain_no_other_target_is_judged():
    runs = _table_records([4] * 20, START, [3] * 20)  # grpo ends where it started
    targets = rt.build_table(runs)["targets"]
    assert list(targets) == ["grpo's held-out gain > 3 SE"]
    assert targets["grpo's held-out gain > 3 SE"].startswith("MISS")


def test_records_of_one_table_share_their_start_and_their_questions():
    a = _record("grpo", 0, [(0, START), (4, START)])
    other_start = _record("trace", 0, [(0, [2] * 20), (4, START)])
    with pytest.raises(ValueError, match="shared start"):
        rt.build_table([a, other_start])
    fewer = _record("trace", 0, [(0, START), (4, START)])
    del fewer["heldout"][1]["successes"]["q03"]
    with pytest.raises(ValueError, match="other held-out questions"):
        rt.build_table([a, fewer])


def test_the_testbeds_reading_is_computed_as_the_real_policys():
    tiny = [{"variant": "trace", "seed": s,
             "steps": {"rollouts": [8.0, 8.0], "activated": [2.0, 2.0], "mixed_groups": [1.0, 0.0],
                       "expanded_anchors": [3.0, 1.0], "mixed_anchors": [1.0, 0.0]},
             "opened": [{"prompt": "p", "bare": 2, "rollouts": 4, "both_outcomes": True},
                        {"prompt": "r", "bare": 4, "rollouts": 4, "both_outcomes": False}]} for s in (0, 1)]
    got = rt.testbed_reading(tiny)["trace"]
    assert got["continuation_share"] == pytest.approx(1 - 12 / 16)
    assert got["prefix_effective_ratio"] == pytest.approx(2 / 8)
    assert got["effective_ratio"] == pytest.approx(2 / 8)
    assert got["expanded_anchors_per_step"] == pytest.approx(8 / 4)


def test_the_table_command_writes_plots_and_logs_the_curves_to_mlflow(tmp_path, server):
    records = tmp_path / "records"
    (records / "runs").mkdir(parents=True)
    for r in _table_records([4] * 16 + [3] * 4, [2] * 18 + [3, 1], [3] * 20):
        (records / "runs" / f"{r['method']}-seed{r['seed']}.json").write_text(json.dumps(r))
    rl.main(["table", "--records", str(records), "--testbed", "", "--mlflow", server.uri])
    table = json.loads((records / "table.json").read_text())
    assert (records / "learning.png").stat().st_size > 10_000
    assert table["targets"]["grpo's held-out gain > 3 SE"].startswith("PASS")
    client = MlflowClient(server.uri)
    experiment = client.get_experiment_by_name("bench-real-learning")
    logged = client.search_runs([experiment.experiment_id])
    parent = next(r for r in logged if r.info.run_name == "real-learning-table")
    assert parent.data.metrics["trace/end"] == pytest.approx(table["methods"]["trace"]["end"]["value"], rel=1e-12)
    child = next(r for r in logged if r.info.run_name == "trace-seed1")
    history = sorted(client.get_metric_history(child.info.run_id, "heldout/pass_at_1"), key=lambda h: h.step)
    assert [(h.step, h.value) for h in history] == [(0, 0.25), (16, 0.5), (32, pytest.approx(0.95))]


def test_the_results_page_renders_the_table_its_targets_and_the_reading():
    from bench import report

    tiny = [{"variant": "trace", "seed": 0, "steps": {"rollouts": [8.0], "activated": [2.0], "mixed_groups": [1.0],
                                                      "expanded_anchors": [4.0], "mixed_anchors": [1.0]},
             "opened": [{"prompt": "p", "bare": 2, "rollouts": 4, "both_outcomes": True}]}]
    table = rt.build_table(_table_records([4] * 16 + [3] * 4, [2] * 18 + [3, 1], [3] * 20), rt.testbed_reading(tiny))
    page = "\n".join(report.real_learning_benchmark(json.loads(json.dumps(table))))
    assert "| trace | 2 | 0.2500 | 0.9500 ± " in page
    assert "| trace − pcl | 200 tokens | +0.4500 ± " in page
    assert "| trace | 0.500 / 0.500 | 0.500 / 0.250 | 2.00 / 4.00 | 0.750 / 0.500 |" in page
    for name in table["targets"]:
        assert f"- {name}: **" in page
    assert "in 6 sittings" in page
