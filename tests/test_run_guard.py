"""A run's guard: every bad input refused before any work, in one line with exit status 2 and no
tracking run left RUNNING; an error after the run exists ends it FAILED with the reason; one
writer per output_dir and per spool, with the holder's pid in the refusal; a resume refused when
the checkpoint is another configuration's; a new sqlite store created by one process at a time.

The one-writer cases run real processes side by side: two trainers started together on one
folder, a second started after the first's first checkpoint, another method on the finished
folder, two runs creating one new sqlite store, `trace-rl deliver` on a spool a live run writes."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import tiny_overrides

from trace_core.cli import main

REPO = Path(__file__).resolve().parents[1]
TRACE_RL = [sys.executable, "-m", "trace_core.cli"]
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return env


def _model_dir(tmp_path: Path) -> Path:
    """A folder that passes the path checks (a config.json) but holds no model: nothing can load it."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    return model


def _math_row(i: int, **kw) -> dict:
    row = {"id": f"m{i}", "task": "math", "source": "trace-arith", "split": "train",
           "prompt": f"What is {i} + 1?", "answers": [str(i + 1)], "choices": [], "metadata": {}}
    row.update(kw)
    return row


def _write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _refused(argv: list[str], capsys: pytest.CaptureFixture, tmp_path: Path) -> str:
    """Run `trace-rl train ARGV` in this process; it must exit 2 with one line on stderr, before any
    tracking run exists (the sqlite store the config names is never created)."""
    store = tmp_path / "never" / "mlflow.db"
    status = main(["train", *argv, f"tracking.tracking_uri=sqlite:///{store}"])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err and err.startswith("trace-rl: ") and err.count("\n") == 1, err
    assert not store.exists(), "a refused run must not reach the tracking store"
    return err


# --------------------------------------------------------------------------- inputs, exit status 2
@pytest.mark.parametrize(("override", "words"), [
    ("policy.lr=nan", ["policy.lr", "'nan'", "finite"]),
    ("policy.lr=inf", ["policy.lr", "'inf'", "finite"]),
    ("agent.temperature=nan", ["agent.temperature", "finite"]),
    ("policy.grad_clip=nan", ["policy.grad_clip", "finite"]),
    ("policy.grad_clip=-1", ["policy.grad_clip must be finite and >= 0", "-1"]),
    ("policy.ppo.kl_coef=.nan", ["policy.ppo.kl_coef", "finite"]),
    ("predictor.prefix_share=nan", ["predictor.prefix_share", "finite"]),
    ("engine.dtype=float64", ["engine.dtype must be one of float32, bfloat16, float16", "'float64'"]),
    ("engine.kv_cache_mb=-1", ["engine.kv_cache_mb must be >= 1", "-1"]),
    ("engine.gpu_memory_utilization=1.5", ["engine.gpu_memory_utilization must lie in (0, 1]", "1.5"]),
    ("tracking.tracking_uri=bogus://x", ["tracking.tracking_uri 'bogus://x' is not an MLflow store"]),
    ("policy_model=", ["policy_model must be a non-empty path"]),
    ("agent.top_p=0", ["agent.top_p must lie in (0, 1]"]),
])
def test_a_bad_setting_is_refused_at_load_naming_key_value_and_rule(override, words, capsys, tmp_path) -> None:
    status = main(["train", override, f"output_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("trace-rl: configuration error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, (word, err)
    assert not (tmp_path / "out").exists()


def test_the_exit_status_is_2_from_a_real_process(tmp_path) -> None:
    done = subprocess.run([*TRACE_RL, "train", "policy.lr=nan", f"output_dir={tmp_path / 'out'}"], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "trace-rl: configuration error: policy.lr: 'nan' is not a finite number (every number setting must be "
        "finite)"]


def test_the_pipeline_cli_refuses_a_bad_setting_in_one_line_with_exit_2(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-m", "pipelines", "params", "-o", str(tmp_path / "p.yaml"),
                           "train.policy.lr=inf"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "train.policy.lr: 'inf' is not a finite number" in done.stderr


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _loop(path: Path) -> Path:
    os.symlink(path.with_name("loop-b"), path)
    os.symlink(path, path.with_name("loop-b"))
    return path


@pytest.mark.parametrize(("make", "words"), [
    (lambda p: p.mkdir() or p, ["task.train_file", "is a folder; it must be a regular file"]),
    (_fifo, ["task.train_file", "is not a regular file (a FIFO"]),
    (_loop, ["task.train_file", "cannot be opened: Too many levels of symbolic links"]),
    (lambda p: p, ["task.train_file", "does not exist"]),
], ids=["folder", "fifo", "symlink-loop", "missing"])
def test_a_training_file_that_is_not_a_readable_file_is_refused(make, words, capsys, tmp_path) -> None:
    path = make(tmp_path / "train.jsonl")
    err = _refused(["task.family=math", f"task.train_file={path}", f"policy_model={_model_dir(tmp_path)}",
                    f"output_dir={tmp_path / 'out'}"], capsys, tmp_path)
    for word in words:
        assert word in err, (word, err)
    assert str(path) in err


def _check_as_nobody(path: str, conn) -> None:
    """In a forked process turned into user nobody: the training file's check, its message sent back."""
    from trace_core.config import ConfigError
    from trace_core.training.run_guard import check_readable_file

    os.setgid(65534)
    os.setuid(65534)
    try:
        check_readable_file("task.train_file", Path(path))
        conn.send("accepted")
    except ConfigError as err:
        conn.send(str(err))


def test_an_unreadable_training_file_is_refused(tmp_path) -> None:
    """As a user who cannot read it (root reads every file, so the check runs as nobody, in a fork
    of this process: the interpreter is loaded already)."""
    import multiprocessing

    if os.geteuid() != 0:
        path = _write_rows(tmp_path / "train.jsonl", [_math_row(0)])
        path.chmod(0o000)
        from trace_core.config import ConfigError
        from trace_core.training.run_guard import check_readable_file

        with pytest.raises(ConfigError, match="cannot be read"):
            check_readable_file("task.train_file", path)
        return
    root = Path(__import__("tempfile").mkdtemp(dir="/tmp"))  # pytest's own tmp folders are root's only
    try:
        root.chmod(0o755)
        path = _write_rows(root / "train.jsonl", [_math_row(i) for i in range(4)])
        path.chmod(0o000)
        ctx = multiprocessing.get_context("fork")
        ours, theirs = ctx.Pipe()
        child = ctx.Process(target=_check_as_nobody, args=(str(path), theirs))
        child.start()
        message = ours.recv() if ours.poll(60) else "no answer"
        child.join(30)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert message == f"task.train_file: {path} cannot be read (Permission denied)"


@pytest.mark.parametrize("case", ["missing", "a file", "no config.json"])
def test_a_policy_model_that_is_not_a_model_folder_is_refused(case, capsys, tmp_path) -> None:
    path = tmp_path / "policy"
    if case == "a file":
        path.write_text("weights")
    elif case == "no config.json":
        path.mkdir()
    err = _refused([f"policy_model={path}", "task.family=fixed-turns", f"output_dir={tmp_path / 'out'}"],
                   capsys, tmp_path)
    assert f"policy_model {path}" in err


def test_an_output_dir_under_a_file_is_refused(capsys, tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    err = _refused([f"policy_model={_model_dir(tmp_path)}", "task.family=fixed-turns",
                    f"output_dir={tmp_path / 'file' / 'out'}"], capsys, tmp_path)
    assert f"output_dir {tmp_path / 'file' / 'out'} cannot be a folder: {tmp_path / 'file'} is a file" in err


def _read_only_run(folder: Path, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`trace-rl train ARGV` with ``folder`` mounted read-only (a private mount namespace)."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"]).returncode != 0:
        pytest.skip("no private mount namespace here (unshare -m)")
    command = " ".join(shlex.quote(a) for a in [*TRACE_RL, "train", *argv])
    script = f"mount --bind -o ro {shlex.quote(str(folder))} {shlex.quote(str(folder))} && exec {command}"
    return subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=120)


def test_an_output_dir_on_a_read_only_location_is_refused(tmp_path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    done = _read_only_run(ro, [f"policy_model={_model_dir(tmp_path)}", "task.family=fixed-turns",
                               f"output_dir={ro / 'out'}", f"tracking.tracking_uri=sqlite:///{tmp_path / 'm.db'}"],
                          tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"output_dir {ro / 'out'} must be writable, but {ro} is on a read-only file system" in done.stderr
    assert not (tmp_path / "m.db").exists()


def test_an_unwritable_tracking_store_is_refused(tmp_path) -> None:
    from mlflow.tracking import MlflowClient

    ro = tmp_path / "store"
    ro.mkdir()
    MlflowClient(f"sqlite:///{ro / 'mlflow.db'}").search_experiments()  # an existing store, then read-only
    done = _read_only_run(ro, [f"policy_model={_model_dir(tmp_path)}", "task.family=fixed-turns",
                               f"output_dir={tmp_path / 'out'}", f"tracking.tracking_uri=sqlite:///{ro / 'mlflow.db'}"],
                          tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert (f"tracking.tracking_uri sqlite:///{ro / 'mlflow.db'} must be a store this run can write to, but "
            f"{ro / 'mlflow.db'} is read-only") in done.stderr
    assert "autoflush" not in done.stderr


def test_a_store_folder_under_a_file_is_refused(capsys, tmp_path) -> None:
    (tmp_path / "file").write_text("x")
    status = main(["train", f"tracking.tracking_uri=sqlite:///{tmp_path / 'file' / 'mlflow.db'}",
                   f"policy_model={_model_dir(tmp_path)}", "task.family=fixed-turns", f"output_dir={tmp_path / 'o'}"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "tracking.tracking_uri" in err and "is a file" in err


@pytest.mark.parametrize(("rows", "words"), [
    ([_math_row(0), _math_row(1, metadata={"source": "mine"})],
     ["metadata holds none of the keys the task adapter adds (family, source, split, choices)", "line 2 (id 'm1')"]),
    ([_math_row(0), _math_row(1, prompt="broken \ud800 text")],
     ["no lone surrogate", "line 2 (id 'm1')", "'\\ud800' at character 8 of prompt"]),
], ids=["reserved-metadata-key", "lone-surrogate"])
def test_bad_rows_are_named_with_file_and_line(rows, words, capsys, tmp_path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # json.dumps writes the surrogate as \ud800
    err = _refused(["task.family=math", f"task.train_file={path}", f"policy_model={_model_dir(tmp_path)}",
                    f"output_dir={tmp_path / 'out'}"], capsys, tmp_path)
    assert f"invalid data in {path}" in err
    for word in words:
        assert word in err, (word, err)


def test_rows_of_another_family_are_refused(capsys, tmp_path) -> None:
    qa = REPO / "data" / "qa" / "train.jsonl"
    if not qa.is_file():
        pytest.skip("the embedded data is not generated (`make data`)")
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(qa.read_text().splitlines(keepends=True)[:20]))
    err = _refused(["task.family=math", f"task.train_file={path}", f"policy_model={_model_dir(tmp_path)}",
                    f"output_dir={tmp_path / 'out'}"], capsys, tmp_path)
    assert f"task.family = 'math', but task.train_file {path} holds 'qa' rows (20 of 20; the first at line 1" in err


def test_a_prompt_too_long_in_tokens_is_refused_naming_its_row(tiny_models, capsys, tmp_path) -> None:
    rows = [_math_row(i) for i in range(8)]
    rows[5]["prompt"] = "Add these numbers: " + " + ".join(str(i) for i in range(700)) + "."  # < 8000 characters
    path = _write_rows(tmp_path / "train.jsonl", rows)
    err = _refused(["task.family=math", f"task.train_file={path}", f"policy_model={tiny_models[0]}",
                    "budget.roots_M=4", "budget.group_size_G=2", "budget.max_per_prompt=4", "budget.pool_factor=1",
                    "agent.max_new_tokens=8", "agent.max_total_tokens=1024", "engine.max_model_len=1024",
                    f"output_dir={tmp_path / 'out'}"], capsys, tmp_path)
    assert "1 prompt(s) leave the model no room to answer" in err
    assert f"shorter than agent.max_total_tokens = 1024 tokens: {path} line 6 (id 'm5'):" in err


def test_fixed_turn_prompts_are_measured_too(tiny_models, capsys, tmp_path) -> None:
    err = _refused([*tiny_overrides(tiny_models[0], tmp_path / "out", "unused", "trace"),
                    "agent.max_total_tokens=40", "agent.max_new_tokens=8"], capsys, tmp_path)
    assert "prompt(s) leave the model no room to answer" in err and "synthetic prompt 0" in err


def test_an_engine_longer_than_the_model_is_refused(tiny_models, capsys, tmp_path) -> None:
    err = _refused([*tiny_overrides(tiny_models[0], tmp_path / "out", "unused", "trace"),
                    "engine.max_model_len=100000", "agent.max_total_tokens=100000"], capsys, tmp_path)
    assert "engine.max_model_len = 100000 exceeds the model's max_position_embeddings = 4096" in err


def test_an_error_after_the_run_exists_ends_it_failed_with_the_reason(tiny_models, tmp_path, monkeypatch) -> None:
    from mlflow.tracking import MlflowClient

    from trace_core.config import load_config
    from trace_core.failures import RunFailed
    from trace_core.training.config import TrainConfig
    from trace_core.training.trainer import Trainer

    monkeypatch.chdir(tmp_path)  # a sqlite store's artifacts go under the working folder
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_config(TrainConfig, None, tiny_overrides(tiny_models[0], tmp_path / "out", uri, "trace"))

    def no_engine(self):
        raise RuntimeError("no device for the engine (injected)")

    monkeypatch.setattr(Trainer, "_build_engine", no_engine)
    with pytest.raises(RunFailed, match=r"cause: RuntimeError: no device for the engine \(injected\)") as failed:
        Trainer(cfg)
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("trainer-tests").experiment_id])
    assert run.info.status == "FAILED"
    assert run.data.tags["tracking.failure"] == str(failed.value)  # the plain message, as the console shows it


def test_a_caller_s_run_ends_failed_when_the_trainer_refuses_its_inputs(tmp_path, monkeypatch) -> None:
    """A pipeline step builds its tracker (and so its run) before the trainer: a refused input ends
    that run FAILED, with the reason, rather than leaving it RUNNING."""
    from mlflow.tracking import MlflowClient

    from trace_core.config import ConfigError, load_config
    from trace_core.tracking import MLflowTracker, TrackingConfig
    from trace_core.training.config import TrainConfig
    from trace_core.training.trainer import Trainer

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MLflowTracker(TrackingConfig(tracking_uri=uri, experiment="caller", spool_dir=str(tmp_path / "spool")))
    cfg = load_config(TrainConfig, None, [f"policy_model={tmp_path / 'missing'}", "task.family=fixed-turns",
                                          f"output_dir={tmp_path / 'out'}", f"tracking.tracking_uri={uri}"])
    with pytest.raises(ConfigError, match="policy_model .* does not exist"):
        Trainer(cfg, tracker=tracker)
    run = MlflowClient(uri).get_run(tracker.run_id)
    assert run.info.status == "FAILED" and "policy_model" in run.data.tags["tracking.failure"]


# --------------------------------------------------------------------------- one writer per run
def _train_args(model: Path, out: Path, uri: str, method: str = "trace", steps: int = 3) -> list[str]:
    return [*TRACE_RL, "train", "engine.kind=hf", *tiny_overrides(model, out, uri, method, steps=steps)]


def _start(args: list[str], log: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=cwd, env=_env(), stdout=log.open("w"), stderr=subprocess.STDOUT)


def _runs_of(uri: str, out: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("trainer-tests")
    return [] if exp is None else [r for r in client.search_runs([exp.experiment_id])
                                   if r.data.params.get("output_dir") == str(out)]


def test_two_trainers_started_together_on_one_folder(tiny_models, tmp_path) -> None:
    """Both start at once: one trains, the other is refused at once naming the first's pid; one
    MLflow run for the folder, every step once."""
    out, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = _train_args(tiny_models[0], out, uri, steps=2)
    procs = [_start(args, tmp_path / f"p{i}.log", tmp_path) for i in range(2)]
    codes = [p.wait(timeout=1200) for p in procs]
    logs = [(tmp_path / f"p{i}.log").read_text() for i in range(2)]
    assert sorted(codes) == [0, 2], logs
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    refusal = logs[loser].strip().splitlines()[-1]
    held = f"trace-rl: output_dir {out} is in use: process {procs[winner].pid} holds its lock"
    assert refusal.startswith(held), refusal
    (run,) = _runs_of(uri, out)
    from mlflow.tracking import MlflowClient

    steps = sorted(m.step for m in MlflowClient(uri).get_metric_history(run.info.run_id, "effective_ratio"))
    assert steps == [0, 1] and run.info.status == "FINISHED"


@pytest.fixture(scope="module")
def contested_run(tiny_models, tmp_path_factory):
    """A TRACE run (4 steps, 2 checkpoints kept) and a second trainer started on its folder once
    its first checkpoint is written; then the folder, finished."""
    root = tmp_path_factory.mktemp("contested")
    out, uri = root / "run", f"sqlite:///{root / 'mlflow.db'}"
    first = _start([*_train_args(tiny_models[0], out, uri, steps=4), "keep_checkpoints=1"], root / "first.log", root)
    latest = out / "checkpoints" / "latest"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and first.poll() is None and not latest.is_file():
        time.sleep(0.05)
    assert first.poll() is None, "the first run ended before its first checkpoint: " + (root / "first.log").read_text()
    # The first run is paused while the second starts (its lock stays held): the second meets a
    # live writer however fast the first would have finished.
    first.send_signal(signal.SIGSTOP)
    try:
        second = subprocess.run(_train_args(tiny_models[0], out, uri, steps=4), cwd=root, env=_env(),
                                capture_output=True, text=True, timeout=600)
    finally:
        first.send_signal(signal.SIGCONT)
    first_code = first.wait(timeout=1200)
    return {"out": out, "uri": uri, "root": root, "first": first, "first_code": first_code, "second": second,
            "first_log": (root / "first.log").read_text()}


def test_a_second_trainer_after_the_first_checkpoint_is_refused(contested_run) -> None:
    """The second writer never loads a checkpoint: the output_dir lock refuses it before it reads
    one, so rotation (keep_checkpoints=1 deletes every older one) cannot delete one under it."""
    from mlflow.tracking import MlflowClient

    r = contested_run
    second = r["second"]
    assert second.returncode == 2, second.stderr[-2000:]
    assert second.stderr.strip().splitlines() == [
        line for line in second.stderr.strip().splitlines() if line.startswith("trace-rl: ")]
    assert f"output_dir {r['out']} is in use: process {r['first'].pid} holds its lock" in second.stderr
    assert r["first_code"] == 0, r["first_log"][-3000:]
    (run,) = _runs_of(r["uri"], r["out"])
    steps = sorted(m.step for m in MlflowClient(r["uri"]).get_metric_history(run.info.run_id, "effective_ratio"))
    assert steps == [0, 1, 2, 3] and run.info.status == "FINISHED"
    kept = sorted(p.name for p in (r["out"] / "checkpoints").glob("step_*"))
    assert kept == ["step_000004"] and (r["out"] / "checkpoints" / "latest").read_text() == "step_000004"


@pytest.mark.parametrize(("override", "words"), [
    ("method=grpo", ["method = 'trace' in the checkpoint, 'grpo' here"]),
    ("seed=1", ["seed = 0 in the checkpoint, 1 here"]),
    ("budget.roots_M=4", ["budget.roots_M = 8 in the checkpoint, 4 here"]),
    ("costs.initial_tokens=100", ["costs.initial_tokens = 512.0 in the checkpoint, 100"]),
], ids=["method", "seed", "budget", "costs"])
def test_another_configuration_on_a_finished_folder_is_refused(contested_run, tiny_models, override, words) -> None:
    r = contested_run
    assert r["first_code"] == 0
    before = (r["out"] / "checkpoints" / "latest").read_text()
    done = subprocess.run([*_train_args(tiny_models[0], r["out"], r["uri"], steps=4), override], cwd=r["root"],
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"trace-rl: output_dir {r['out']} holds a checkpoint (step_000004) of another run: ")
    for word in words:
        assert word in line, line
    assert len(_runs_of(r["uri"], r["out"])) == 1, "nothing was logged into the finished run's store"
    assert (r["out"] / "checkpoints" / "latest").read_text() == before


def test_the_same_configuration_on_the_finished_folder_resumes_it(contested_run, tiny_models) -> None:
    """More steps extend the run (steps is not result-defining): the same MLflow run goes on."""
    from mlflow.tracking import MlflowClient

    r = contested_run
    done = subprocess.run(_train_args(tiny_models[0], r["out"], r["uri"], steps=5), cwd=r["root"], env=_env(),
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = _runs_of(r["uri"], r["out"])
    steps = sorted(m.step for m in MlflowClient(r["uri"]).get_metric_history(run.info.run_id, "effective_ratio"))
    assert steps == [0, 1, 2, 3, 4] and run.info.status == "FINISHED"


KILLED_BEFORE_CHECKPOINT = """
import os, sys
from trace_core.config import load_config
from trace_core.training.config import TrainConfig
from trace_core.training.trainer import Trainer
Trainer(load_config(TrainConfig, None, sys.argv[1:]))  # the tracking run and its spool exist now
os._exit(9)  # killed before its first step: no checkpoint
"""


def test_a_run_killed_before_its_first_checkpoint_is_refused_to_another_configuration(tiny_models, tmp_path) -> None:
    """No checkpoint to compare with, but a spool whose tracking run the tracker would resume:
    another method on the folder is refused, naming the field; the same configuration resumes that
    very run and finishes it."""
    from mlflow.tracking import MlflowClient

    out, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = ["engine.kind=hf", *tiny_overrides(tiny_models[0], out, uri, "trace", steps=2)]
    killed = subprocess.run([sys.executable, "-c", KILLED_BEFORE_CHECKPOINT, *args], cwd=tmp_path, env=_env(),
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == 9, killed.stderr[-3000:]
    assert (out / "spool").is_dir() and not (out / "checkpoints" / "latest").exists()
    (run,) = _runs_of(uri, out)
    other = subprocess.run([*TRACE_RL, "train", *args, "method=grpo"], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=600)
    assert other.returncode == 2, other.stderr[-3000:]
    line = other.stderr.strip().splitlines()[-1]
    assert line.startswith(f"trace-rl: output_dir {out} holds the tracking spool of a run stopped before its "
                           "first checkpoint of another run: "), line
    assert "method = 'trace' in the spool, 'grpo' here" in line, line
    assert [r.info.run_id for r in _runs_of(uri, out)] == [run.info.run_id]
    assert MlflowClient(uri).get_run(run.info.run_id).data.params["method"] == "trace"
    same = subprocess.run([*TRACE_RL, "train", *args], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=1200)
    assert same.returncode == 0, same.stderr[-3000:]
    (resumed,) = _runs_of(uri, out)
    steps = sorted(m.step for m in MlflowClient(uri).get_metric_history(run.info.run_id, "effective_ratio"))
    assert resumed.info.run_id == run.info.run_id and steps == [0, 1] and resumed.info.status == "FINISHED"


NEW_STORE = """
import sys, time
from pathlib import Path
from trace_core.tracking import MLflowTracker, TrackingConfig
uri, spool, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
while not go.exists():
    time.sleep(0.005)
tracker = MLflowTracker(TrackingConfig(tracking_uri=uri, experiment="new-store", spool_dir=spool, retry_interval_s=0))
tracker.log_metrics({"x": 1.0}, 0)
assert tracker.close() == 0, "records left in the spool"
print(tracker.run_id)
"""


def test_two_runs_creating_one_new_sqlite_store_at_once(tmp_path) -> None:
    from mlflow.tracking import MlflowClient

    uri, go = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}", tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", NEW_STORE, uri, str(tmp_path / f"spool{i}"), str(go)],
                              cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(3)]
    time.sleep(3)  # every process has imported MLflow and waits for the start
    go.write_text("go")
    try:
        outs = [p.communicate(timeout=900) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-2000:] for o in outs]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("new-store").experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted(o[0].strip().splitlines()[-1] for o in outs)


HOLD_SPOOL = """
import sys, time
from trace_core.tracking import MLflowTracker, TrackingConfig
tracker = MLflowTracker(TrackingConfig(tracking_uri=sys.argv[1], experiment="held", spool_dir=sys.argv[2],
                                       retry_interval_s=0))
tracker.log_metrics({"x": 1.0}, 0)
print("holding", flush=True)
time.sleep(120)
"""


def test_a_spool_a_live_run_writes_is_refused_to_another_process(tmp_path) -> None:
    uri, spool = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "spool"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_SPOOL, uri, str(spool)], cwd=tmp_path, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding", holder.stderr.read()[-2000:]
        done = subprocess.run([*TRACE_RL, "deliver", str(spool)], cwd=tmp_path, env=_env(), capture_output=True,
                              text=True, timeout=120)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"tracking.spool_dir {spool} is in use: process {holder.pid} holds its lock" in done.stderr
    after = subprocess.run([*TRACE_RL, "deliver", str(spool), "--status", "KILLED"], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=120)
    assert after.returncode == 0, after.stderr[-2000:]  # the holder is gone: the kernel dropped its lock
