"""Run-time failures as an operator meets them: real faults in real `trace-rl train` processes.

A checkpoint folder too small for the next checkpoint, a trees folder and a tracking spool filled
mid-run (each a small tmpfs the test mounts), a rollout engine process killed mid-run: each run
ends with one plain message on stderr (what failed and where, the cause in words, the last
complete checkpoint, the command that resumes, the log with the traceback), exit status 1, its
MLflow run FAILED with that message as its tag; rerunning the command it names completes the run
with every step logged once. A tracking store whose disk fills mid-run is two warnings (its start,
its end with the records spooled and delivered) and no traceback. Nothing is mocked: the
file systems are full, the process is dead."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults
FAULT_AREA = "run-time failures"

REPO = Path(__file__).resolve().parents[1]
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
EXPERIMENT = "run-failures"


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A tmpfs of ``size`` mounted on ``path`` for the block (root only: skipped otherwise)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)  # lazy: a store may still hold a file open


def fill(folder: Path) -> Path:
    """Fill ``folder``'s file system to the last byte with one file; returns it."""
    filler = folder / "filler"
    with contextlib.suppress(OSError), filler.open("wb", buffering=0) as f:
        while True:  # a write that does not fit writes what fits; the next one fails
            f.write(b"\0" * 65536)
    return filler


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    return env


def _args(model: Path, out: Path, uri: str, steps: int, engine: str = "hf") -> list[str]:
    return [
        "method=trace", f"steps={steps}", f"policy_model={model}", f"output_dir={out}", "task.family=fixed-turns",
        "task.envs.fixed_turns.turns=2", "task.envs.fixed_turns.prompts=8", "budget.roots_M=4",
        "budget.expansion_N=1", "budget.group_size_G=2", "budget.max_per_prompt=4", "budget.pool_factor=1",
        "agent.max_new_tokens=6", "agent.max_total_tokens=512", "engine.max_model_len=512", "engine.kv_cache_mb=64",
        f"engine.kind={engine}", "policy.micro_batches=1", "predictor.tiny_hidden_size=32",
        "predictor.tiny_intermediate_size=64", "progress=false", "checkpoint_every=1",
        f"tracking.tracking_uri={uri}", f"tracking.experiment={EXPERIMENT}", "tracking.retry_interval_s=0",
    ]


def _start(argv: list[str], cwd: Path) -> subprocess.Popen:
    """`trace-rl ARGV` in its own process, its output in files (a pipe nobody reads would block it)."""
    n = len(list(cwd.glob("stderr-*.txt")))
    with (cwd / f"stdout-{n}.txt").open("w") as out, (cwd / f"stderr-{n}.txt").open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "trace_core.cli", *argv], cwd=cwd, env=_env(),
                                stdout=out, stderr=err)
    proc.stderr_file = cwd / f"stderr-{n}.txt"
    return proc


def _finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str]:
    proc.wait(timeout=timeout)
    return proc.returncode, proc.stderr_file.read_text()


def _wait_for_checkpoint(out: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not (out / "checkpoints" / "latest").is_file():
        assert proc.poll() is None, f"the run ended before its first checkpoint: {_finish(proc)[1][-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.1)


MESSAGE_LINES = 5  # the failure, its cause, what was kept, the command that resumes, the traceback's file


def _message(stderr: str, after_ok: str | None = None) -> str:
    """The failure message: the last thing on stderr (``after_ok``: but for lines that hold it,
    printed by other processes as this one exits)."""
    start = stderr.rfind("trace-rl: the run failed during ")
    assert start >= 0, stderr[-3000:]
    lines = stderr[start:].rstrip("\n").splitlines()
    after = lines[MESSAGE_LINES:]
    assert not after or (after_ok is not None and all(after_ok in line or "warnings.warn(" in line
                                                      for line in after)), after
    return "\n".join(lines[:MESSAGE_LINES])


def _the_run(uri: str, out: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    (run,) = [r for r in client.search_runs([exp.experiment_id]) if r.data.params.get("output_dir") == str(out)]
    return client, run


def _check_failure(stderr: str, rc: int, uri: str, out: Path, argv: list[str], cause: str,
                   debug: bool = False, after_ok: str | None = None) -> str:
    """The failed run's plain message (returned): exit status 1, the message last on stderr (the
    traceback before it only with --debug), the cause, the last complete checkpoint, the command that
    resumes and the log holding the traceback; its MLflow run FAILED with the message as its tag."""
    assert rc == 1, stderr[-3000:]
    message = _message(stderr, after_ok)
    lines = message.splitlines()
    assert lines[1].startswith("  cause: "), message
    assert re.search(cause, lines[1]), (cause, message)
    latest = (out / "checkpoints" / "latest").read_text().strip()
    assert lines[2] == f"  kept: the last complete checkpoint, {out / 'checkpoints' / latest}", message
    assert lines[3].startswith(f"  resume: {shlex.join(['trace-rl', *argv])} "), message
    assert lines[4] == f"  traceback: {out / 'failure.log'} (or rerun with --debug)", message
    assert "Traceback (most recent call last)" in (out / "failure.log").read_text()
    assert ("Traceback" in stderr) == debug, stderr[-3000:]
    _, run = _the_run(uri, out)
    assert run.info.status == "FAILED"
    assert run.data.tags["tracking.failure"] == message.removeprefix("trace-rl: "), run.data.tags
    return message


def _check_resumed(argv: list[str], cwd: Path, uri: str, out: Path, steps: int, failed_run: str,
                   fault) -> None:
    """The command the message names completes the run: the same MLflow run, FINISHED, every step once."""
    rc, err = _finish(_start(argv, cwd))
    assert rc == 0, err[-3000:]
    client, run = _the_run(uri, out)
    assert run.info.run_id == failed_run and run.info.status == "FINISHED"
    logged = sorted(m.step for m in client.get_metric_history(run.info.run_id, "effective_ratio"))
    fault.records(list(range(steps)), logged)
    assert logged == list(range(steps))


def test_a_checkpoint_folder_too_small_fails_plainly_and_resumes(tiny_models, tmp_path, fault) -> None:
    out, uri = tmp_path / "out", f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["train", *_args(tiny_models[0], out, uri, steps=3)]
    with tmpfs(out / "checkpoints", "24m"):  # one checkpoint of the tiny policy (~16 MB) and part of the next
        rc, err = _finish(_start(argv, tmp_path))
        _check_failure(err, rc, uri, out, argv,
                       rf"^  cause: writing checkpoint step_000002 \({re.escape(str(out / 'checkpoints'))}\): "
                       r"no space left on device \(\d+ bytes free on its file system\)$")
        _, failed = _the_run(uri, out)
        subprocess.run(["mount", "-o", "remount,size=64m", str(out / "checkpoints")], check=True)
        _check_resumed(argv, tmp_path, uri, out, 3, failed.info.run_id, fault)


@pytest.mark.parametrize("folder", ["trees", "spool"])
def test_a_folder_filled_mid_run_fails_plainly_and_resumes(folder, tiny_models, tmp_path, fault) -> None:
    """``trees``: the step's trees cannot be written (with --debug: the traceback before the
    message). ``spool``: the tracker's spool cannot take the step's records; the run still ends
    FAILED with the message, sent to the store without the spool."""
    out, uri = tmp_path / "out", f"sqlite:///{tmp_path / 'mlflow.db'}"
    debug = folder == "trees"
    argv = ["train", *(["--debug"] if debug else []), *_args(tiny_models[0], out, uri, steps=6)]
    with tmpfs(out / folder, "8m") as mounted:
        proc = _start(argv, tmp_path)
        try:
            _wait_for_checkpoint(out, proc)
            filler = fill(mounted)
            rc, err = _finish(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
        where = re.escape(str(mounted))
        cause = (rf"^  cause: writing the step's trees \({where}/step\d+\.jsonl\.gz\): no space left on device$"
                 if folder == "trees" else
                 # the file the spool could not write; a copied artifact names its source too ("src -> dst")
                 rf"^  cause: spooling the step's records \({where}\): no space left on device "
                 rf"\((\S+ -> )?{where}/\S+\)$")
        _check_failure(err, rc, uri, out, argv, cause, debug=debug)
        _, failed = _the_run(uri, out)
        filler.unlink()
        _check_resumed(argv, tmp_path, uri, out, 6, failed.info.run_id, fault)


def _engine_core(parent: int) -> int | None:
    """The pid of vLLM's engine core process among ``parent``'s children."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent and "EngineCor" in (stat.parent / "comm").read_text():
                return int(stat.parent.name)
    return None


def test_a_killed_engine_process_fails_plainly_and_resumes(tiny_models, tmp_path, fault) -> None:
    pytest.importorskip("vllm")
    out, uri = tmp_path / "out", f"sqlite:///{tmp_path / 'mlflow.db'}"
    argv = ["train", *_args(tiny_models[0], out, uri, steps=4, engine="vllm"), "engine.multiprocess=true"]
    proc = _start(argv, tmp_path)
    try:
        _wait_for_checkpoint(out, proc)
        core = _engine_core(proc.pid)
        assert core is not None, "no engine core process"
        os.kill(core, signal.SIGKILL)
        rc, err = _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The killed process leaves a shared memory block behind, which multiprocessing's resource
    # tracker (a process of its own) reports as this one exits, after the message.
    _check_failure(err, rc, uri, out, argv, rf"^  cause: the rollout engine failed in \w+: its engine core process "
                   rf"died: EngineCore \(pid {core}\) was killed by SIGKILL$", after_ok="resource_tracker")
    _, failed = _the_run(uri, out)
    _check_resumed(argv, tmp_path, uri, out, 4, failed.info.run_id, fault)


def test_a_full_tracking_store_is_two_warnings_and_no_traceback(tmp_path, capfd, monkeypatch, fault) -> None:
    from mlflow.tracking import MlflowClient

    from trace_core.tracking import MLflowTracker, TrackingConfig

    monkeypatch.chdir(tmp_path)  # a sqlite store's artifacts go under the working folder
    with tmpfs(tmp_path / "store", "4m") as store:
        uri = f"sqlite:///{store / 'mlflow.db'}"
        tracker = MLflowTracker(TrackingConfig(tracking_uri=uri, experiment=EXPERIMENT,
                                               spool_dir=str(tmp_path / "spool"), retry_interval_s=0))
        tracker.log_metrics({"loss": 0.0}, 0)
        capfd.readouterr()
        filler = fill(store)
        for step in range(1, 6):  # the store's disk is full: every write fails, and is retried at each log
            tracker.log_metrics({"loss": float(step)}, step)
        assert tracker.pending == 5
        filler.unlink()
        tracker.log_metrics({"loss": 6.0}, 6)
        assert tracker.close() == 0
        captured = capfd.readouterr()
        said = [line for line in captured.err.splitlines() if line.strip()]
        assert "Traceback" not in captured.err + captured.out, captured.err
        assert len(said) == 2, said
        assert said[0].startswith(f"trace-rl tracking: cannot deliver to {uri} (") and "disk is full" in said[0], said
        assert re.fullmatch(rf"trace-rl tracking: {re.escape(uri)} takes records again after \d+ s: 6 records were "
                            rf"spooled meanwhile, and 6 waiting records are delivered from the spool "
                            rf"{re.escape(str(tmp_path / 'spool'))}", said[1]), said
        client = MlflowClient(uri)
        logged = sorted(m.step for m in client.get_metric_history(tracker.run_id, "loss"))
        fault.records(list(range(7)), logged)
        assert logged == list(range(7))
        assert client.get_run(tracker.run_id).info.status == "FINISHED"
