"""The main job's benchmark: reading the pipeline's log, judging its targets, and its committed records."""

import json
from pathlib import Path

import pytest

from bench.main_job import MEMORY_TARGET_MIB, WALL_TARGET_S, judge, task_times

# the main job's record must be there; the real policy's run takes hours on a CPU and is checked
# once it is committed
RECORDS = [Path("bench/results/main_job.json"),
           *(p for p in [Path("bench/results/main_job-smollm2.json")] if p.is_file())]


def _line(t: str, text: str) -> str:
    return f"{t} - INFO - {text}"


def test_task_times_read_kfp_local_log_lines_with_their_colours_and_name_each_method():
    colour = "\x1b[96m'{}'\x1b[0m"
    log = "\n".join([
        _line("23:50:00.000", "Running pipeline: 'trace-rl'"),
        _line("23:50:00.000", f"Executing task {colour.format('prepare-data')}"),
        "some output of the task",
        _line("23:50:30.500", f"Task {colour.format('prepare-data')} finished with status \x1b[92mSUCCESS\x1b[0m"),
        _line("23:50:31.000", f"Executing task {colour.format('train')}"),
        _line("23:59:31.000", f"Task {colour.format('train')} finished with status \x1b[92mSUCCESS\x1b[0m"),
        _line("23:59:32.000", f"Executing task {colour.format('train')}"),
        # past midnight: the next day
        _line("00:01:32.000", f"Task {colour.format('train')} finished with status \x1b[92mSUCCESS\x1b[0m"),
        _line("00:01:33.000", f"Executing task {colour.format('compare')}"),
        _line("00:01:43.000", f"Task {colour.format('compare')} finished with status FAILURE"),
    ])
    tasks = task_times(log, ["grpo", "trace"])
    assert [(t.task, t.seconds, t.status) for t in tasks] == [
        ("prepare-data", 30.5, "SUCCESS"), ("train grpo", 540.0, "SUCCESS"), ("train trace", 120.0, "SUCCESS"),
        ("compare", 10.0, "FAILURE")]


def test_a_task_that_did_not_run_once_per_method_keeps_its_plain_name():
    log = "\n".join([_line("01:00:00.000", "Executing task 'train'"),
                     _line("01:00:10.000", "Task 'train' finished with status SUCCESS"),
                     _line("01:00:11.000", "Executing task 'evaluate'")])  # cut short: never finished
    assert [(t.task, t.seconds) for t in task_times(log, ["grpo", "trace"])] == [("train", 10.0)]


def test_the_targets_are_twenty_minutes_and_twelve_gib():
    assert judge(WALL_TARGET_S, MEMORY_TARGET_MIB)["wall"]["verdict"].startswith("PASS")
    assert judge(WALL_TARGET_S + 1, 100)["wall"]["verdict"].startswith("MISS")
    assert judge(60, 100, MEMORY_TARGET_MIB + 1)["memory"]["verdict"].startswith("MISS")
    # memory is judged on the PSS sum, however large the RSS sum (shared pages counted in each process)
    assert judge(60, 4 * MEMORY_TARGET_MIB, MEMORY_TARGET_MIB)["memory"]["verdict"].startswith("PASS")
    # a record with the RSS sum only: an upper bound, so it can pass, never miss
    assert judge(60, MEMORY_TARGET_MIB)["memory"]["verdict"].startswith("PASS")
    assert judge(60, MEMORY_TARGET_MIB + 1)["memory"]["verdict"].startswith("not judged")


def test_the_memory_sampler_reads_the_proportional_and_the_resident_sums():
    from bench.main_job import PeakMemory

    memory = PeakMemory()
    memory.sample()
    assert 0 < memory.peak_pss_mib <= memory.peak_mib


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_the_committed_record_is_a_whole_run_whose_verdicts_recompute(path):
    record = json.loads(path.read_text())
    tasks = record["tasks"]
    assert all(t["status"] == "SUCCESS" for t in tasks)
    names = [t["task"] for t in tasks]
    for step in ("prepare-data", "build-retriever-index", "warm-start", "compare"):
        assert step in names
    for method in record["methods"]:  # every method trained, evaluated and profiled
        for step in ("train", "evaluate", "profile"):
            assert f"{step} {method}" in names or len(record["methods"]) == 1
    assert 0 < sum(t["seconds"] for t in tasks) <= record["wall_s"]
    assert record["peak_rss_mib"] > 0
    assert judge(record["wall_s"], record["peak_rss_mib"], record.get("peak_pss_mib")) == record["targets"]
    for method in record["methods"]:  # the table it printed has a row per method
        assert f"| {method} " in record["table"]
    assert record["commit"] and record["dirty"] is False
