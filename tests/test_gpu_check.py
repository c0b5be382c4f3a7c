"""The GPU check's CPU dry run, on an emulated bare image, and its report's bookkeeping."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check_stages as stages

REPO = Path(__file__).resolve().parents[1]

# the bare CUDA image: torch and transformers (and what they require); the check carries the rest
IMAGE = ("torch", "transformers")
CARRIED_DISTS = tuple(stages.CARRIED)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def bare_site(out: Path, roots: tuple[str, ...]) -> set[str]:
    """A directory of links to exactly ``roots`` and their requirements (no extras): run with
    ``python -S`` and this on PYTHONPATH, nothing else of this environment is importable."""
    import sysconfig

    from packaging.requirements import Requirement

    # Only this environment's site-packages: a path another test put on sys.path (a vendored or
    # temporary package folder) must not stand in for the environment's own distribution.
    where = list(dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]))
    dists = {_norm(d.metadata["Name"]): d for d in md.distributions(path=where)}
    seen: set[str] = set()
    stack = [_norm(r) for r in roots]
    while stack:
        name = stack.pop()
        if name in seen or name not in dists:
            continue
        seen.add(name)
        for text in dists[name].requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                stack.append(_norm(req.name))
    out.mkdir(parents=True)
    for name in seen:
        dist = dists[name]
        base = Path(str(dist.locate_file("")))
        for top in {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] != ".."}:
            if (base / top).exists() and not (out / top).exists():
                (out / top).symlink_to(base / top)
    return seen


@pytest.mark.slow
def test_cpu_dry_run_on_a_bare_image_reports_every_stage(tmp_path: Path) -> None:
    site = tmp_path / "site"
    present = bare_site(site, IMAGE + CARRIED_DISTS)
    assert "mlflow" not in present and "matplotlib" not in present and "vllm" not in present
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON=str(python), PYTHONPATH=str(site), OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh"), "--cpu", "--out", str(report),
                           "--work", str(tmp_path / "work")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=400)
    data = json.loads(report.read_text())
    failed = [{k: s.get(k) for k in ("name", "status", "rc", "log_tail")}
              for s in data["stages"] if s["status"] != "ok"]
    assert proc.returncode == 0, json.dumps(failed, indent=1) + proc.stderr[-2000:]
    assert data["mode"] == "cpu"
    by = {s["name"]: s for s in data["stages"]}
    assert list(by) == ["install", "env", "engine_tiny", "engine_0.5b", "trace_steps", "tree_training"]
    assert all(s["status"] == "ok" for s in data["stages"])
    for name in ("engine_tiny", "engine_0.5b"):
        assert by[name]["generated_tokens"] == 2 * 2 * 6
        assert by[name]["logprob_gap_vs_teacher_forcing"] < 1e-4
    trace = by["trace_steps"]
    assert trace["policy"]["zero_stage"] == 2 and trace["policy"]["attn_implementation"] == "tree"
    assert trace["steps"] == 2 and len(trace["step_s"]) == 2
    assert set(trace["cost_fractions"]) >= {"rollout", "policy_optimisation", "weight_sync"}
    assert trace["tracker"]["metric_records"] >= 2 and Path(trace["tracker"]["file"]).is_file()
    tree = by["tree_training"]
    assert {(r["size"], r["path"]) for r in tree["runs"]} == {(1024, "tree"), (2048, "tree"), (1024, "varlen"),
                                                              (1024, "dense")}
    assert all(r["sharing_ratio"] >= 2 for r in tree["runs"])
    for stage in data["stages"][1:]:  # nothing the bare image lacks was imported
        assert not {"mlflow", "matplotlib", "vllm", "faiss", "pandas"} & set(stage["imported_packages"])


def test_report_keeps_every_finished_stage_and_the_failures(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    stages.init_report(report, "gpu", "bench/gpu_check.sh")
    stages.append_stage(report, {"name": "env", "status": "ok", "seconds": 1.0})
    log = tmp_path / "engine.log"
    log.write_text("\n".join(f"line {i}" for i in range(40)))
    assert stages.main(["record", "--report", str(report), "--name", "engine_tiny", "--status", "timeout",
                        "--rc", "124", "--seconds", "25", "--log", str(log)]) == 0
    data = json.loads(report.read_text())
    assert [s["name"] for s in data["stages"]] == ["env", "engine_tiny"]
    failed = data["stages"][1]
    assert failed["status"] == "timeout" and failed["rc"] == 124 and failed["log_tail"][-1] == "line 39"
    assert not list(tmp_path.glob("*.tmp"))  # written atomically


def test_gpu_sizes_name_the_models_and_fit_the_budget() -> None:
    gpu = stages.GPU
    assert gpu.tree_sizes[-1] == 65536 and gpu.device == "cuda"
    assert "0.44B" in gpu.tree_model_name
    assert "policy.dist_backend=nccl" in gpu.trace_overrides
    budgets = dict(b.split(":") for b in re.search(r'TOTAL=240\n  BUDGETS="([^"]+)"',
                                                   (REPO / "bench" / "gpu_check.sh").read_text()).group(1).split())
    assert sum(int(v) for v in budgets.values()) <= 240
