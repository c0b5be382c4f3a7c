"""The real-policy run's CPU dry run on an emulated bare image, and its report's bookkeeping."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_gpu_check import CARRIED_DISTS, IMAGE, bare_site

from bench import gpu_real_policy as rp

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_real_policy.sh"
STAGE_NAMES = ["install", "env", "policy", "warm_start", "heldout_start", "learning_grpo", "learning_trace"]


def _budgets(mode_total: int) -> dict[str, int]:
    text = SCRIPT.read_text()
    block = re.search(rf'TOTAL={mode_total}\n  STAGES="([^"]+)"', text).group(1)
    return {e.split(":")[0]: int(e.split(":")[1]) for e in block.split()}


@pytest.mark.slow
def test_cpu_dry_run_on_a_bare_image_reports_every_stage(tmp_path: Path) -> None:
    from trace_core.pretrained import locate_gguf

    site = tmp_path / "site"
    present = bare_site(site, IMAGE + CARRIED_DISTS + tuple(rp.CARRIED_EXTRA))
    assert not {"mlflow", "matplotlib", "vllm"} & present
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON=str(python), PYTHONPATH=str(site), OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(SCRIPT), "--cpu", "--out", str(report), "--work", str(tmp_path / "work"),
                           "--gguf", str(locate_gguf())], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    data = json.loads(report.read_text())
    failed = [{k: s.get(k) for k in ("name", "status", "rc", "reason", "log_tail")}
              for s in data["stages"] if s["status"] != "ok"]
    assert proc.returncode == 0, json.dumps(failed, indent=1) + proc.stderr[-2000:]
    assert data["mode"] == "cpu" and data["check"] == "trace-rl real-policy run"
    by = {s["name"]: s for s in data["stages"]}
    assert list(by) == STAGE_NAMES
    assert all(s["status"] == "ok" for s in data["stages"])
    policy = by["policy"]
    assert policy["digest"] == policy["source"]["sha256"][:16] and policy["truncated"]["layers"] == 2
    warm = by["warm_start"]
    assert warm["demos"] == rp.CPU.n_warm and warm["sft"]["steps"] == 1
    start = by["heldout_start"]["heldout"]
    assert start["questions"] == rp.CPU.heldout_questions and start["samples"] == rp.CPU.heldout_samples
    for method in rp.METHODS:
        run = by[f"learning_{method}"]
        assert run["method"] == method and run["steps"] == rp.CPU.steps and len(run["step_s"]) == rp.CPU.steps
        assert run["policy"]["zero_stage"] == 2 and run["tracker"]["metric_records"] >= 1
        held = run["heldout"]
        assert held["end"]["questions"] == rp.CPU.heldout_questions
        assert held["end_minus_start"]["questions"] == rp.CPU.heldout_questions
    assert "trace_minus_grpo" in by["learning_trace"]["heldout"]
    for stage in data["stages"][1:]:  # nothing the bare image lacks was imported
        assert not {"mlflow", "matplotlib", "vllm", "faiss", "pandas"} & set(stage["imported_packages"])


def test_a_missing_policy_is_reported_unavailable_with_the_reason(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    assert rp.main(["init", "--report", str(report)]) == 0
    args = ["--report", str(report), "--work", str(tmp_path / "w")]
    assert rp.main(["policy", *args, "--gguf", str(tmp_path / "none.gguf")]) == rp.UNAVAILABLE_RC
    assert rp.main(["policy", *args, "--policy", str(tmp_path / "none")]) == rp.UNAVAILABLE_RC
    stages = json.loads(report.read_text())["stages"]
    assert [s["status"] for s in stages] == ["unavailable", "unavailable"]
    assert "none.gguf is not a file" in stages[0]["reason"] and "64 MiB" in stages[0]["reason"]
    assert "is not a folder" in stages[1]["reason"]
    assert not (tmp_path / "w" / "policy.json").exists()


def test_an_unfinished_stage_keeps_what_it_noted(tmp_path: Path) -> None:
    report, work = tmp_path / "r.json", tmp_path / "w"
    rp.main(["init", "--report", str(report)])
    tracker = work / "records.jsonl"
    tracker.parent.mkdir(parents=True)
    tracker.write_text("".join(json.dumps(r) + "\n" for r in [
        {"kind": "params", "params": {}},
        {"kind": "metrics", "step": 0, "metrics": {"cost/step_s": 31.5}},
        {"kind": "metrics", "step": 1, "metrics": {"cost/step_s": 29.0}}]))
    rp.note_progress(work, "learning_grpo", init_s=12.0, tracker_file=str(tracker))
    log = tmp_path / "stage.log"
    log.write_text("progress: train grpo step 3/3\n")
    assert rp.main(["record", "--report", str(report), "--work", str(work), "--name", "learning_grpo",
                    "--status", "timeout", "--rc", "124", "--seconds", "140", "--log", str(log)]) == 0
    assert rp.main(["record", "--report", str(report), "--work", str(work), "--name", "learning_trace",
                    "--status", "skipped", "--rc", "0", "--reason", "needs warm_start, which did not pass"]) == 0
    grpo, trace = json.loads(report.read_text())["stages"]
    assert grpo["status"] == "timeout" and grpo["log_tail"] == ["progress: train grpo step 3/3"]
    assert grpo["progress"]["init_s"] == 12.0 and grpo["progress"]["step_s"] == [31.5, 29.0]
    assert trace["status"] == "skipped" and trace["reason"].startswith("needs warm_start")
    assert not list(work.glob("*.tmp")) and not list(tmp_path.glob("*.tmp"))  # written atomically


def test_the_budgets_fit_the_deadlines_and_the_gpu_sizes_are_the_pipelines() -> None:
    for total in (540, 300):  # the GPU run (9 minutes of a lent machine's 15), the CPU dry run
        budgets = _budgets(total)
        assert list(budgets) == STAGE_NAMES and sum(budgets.values()) <= total
    gpu = rp.GPU
    assert gpu.device == "cuda" and gpu.policy_layers is None and gpu.dist_backend == "nccl"
    assert gpu.heldout_samples >= 2 and rp.CPU.heldout_samples >= 2  # the executor's smallest group
    overrides = rp.learning_overrides("trace", Path("w/warm"), Path("w/runs/trace"), gpu)
    assert "predictor.vocab_size=49152" in overrides and "predictor.task_family=math" in overrides
    assert "engine.kind=hf" in overrides and f"task.train_file={Path('w/warm/tasks/pool.jsonl')}" in overrides
