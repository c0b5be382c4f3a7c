"""Tracking against a real `mlflow server`: buffering while it is down, resume after a crash, a
store that cannot be written refused at start, nothing acknowledged that the store did not confirm,
the run's status through exceptions, signals and resumes, and `trace-rl deliver`."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MlflowServer as Server

from trace_core.tracking import (
    REJECTED_TAG,
    MLflowTracker,
    Spool,
    TrackingConfig,
    TrackingStoreError,
    mlflow_name,
    tracked_run,
)

pytestmark = pytest.mark.faults  # selected by `make faults`; the tests with `fault` are its injections
FAULT_AREA = "tracking store"

REPO = Path(__file__).resolve().parents[1]
TRACE_RL = str(Path(sys.executable).with_name("trace-rl"))


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key))


def get_run(uri: str, run_id: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri).get_run(run_id)


def config(uri: str, spool: Path, experiment: str, **kw) -> TrackingConfig:
    return TrackingConfig(tracking_uri=uri, experiment=experiment, spool_dir=str(spool), retry_interval_s=0.0, **kw)


def test_metric_names_are_made_valid() -> None:
    assert mlflow_name("eff ratio (roots)@step") == "eff ratio _roots__step"
    assert mlflow_name("predictor/spearman.root") == "predictor/spearman.root"
    with pytest.raises(ValueError, match="cannot be turned into an MLflow key"):
        mlflow_name("")


def test_run_goes_on_while_the_server_is_down_and_catches_up(server: Server, tmp_path: Path, fault) -> None:
    cfg = TrackingConfig(tracking_uri=server.uri, experiment="t-buffer", spool_dir=str(tmp_path / "spool"),
                         retry_interval_s=0.0)
    tracker = MLflowTracker(cfg)
    tracker.log_params({"method": "trace", "budget": {"M": 16}})
    for step in range(3):
        tracker.log_metrics({"effective_ratio": step / 10}, step)
    assert tracker.pending == 0 and tracker.run_id
    server.stop()
    for step in range(3, 6):
        tracker.log_metrics({"effective_ratio": step / 10}, step)  # must not raise or hang
    assert tracker.pending == 3
    server.start()
    assert tracker.flush()
    fault.records([(s, s / 10) for s in range(6)], history(server.uri, tracker.run_id, "effective_ratio"))
    assert history(server.uri, tracker.run_id, "effective_ratio") == [(s, s / 10) for s in range(6)]


def test_a_killed_run_resumes_into_the_same_run_without_duplicates(server: Server, tmp_path: Path, fault) -> None:
    spool = str(tmp_path / "spool")
    cfg = TrackingConfig(tracking_uri=server.uri, experiment="t-resume", spool_dir=spool, retry_interval_s=0.0)
    first = MLflowTracker(cfg)
    run_id = first.run_id
    for step in range(4):
        first.log_metrics({"loss": 1.0 / (step + 1)}, step)
    # Simulate a crash after steps 2-3 reached the server but before their acknowledgement.
    acked = Path(spool, "acked.txt")
    acked.write_text("".join(line + "\n" for line in acked.read_text().split()[:2]))
    del first
    second = MLflowTracker(cfg, run_id=run_id)
    assert second.run_id == run_id and second.flush()
    for step in range(4, 6):
        second.log_metrics({"loss": 1.0 / (step + 1)}, step)
    second.close()
    fault.records([(s, 1.0 / (s + 1)) for s in range(6)], history(server.uri, run_id, "loss"))
    assert history(server.uri, run_id, "loss") == [(s, 1.0 / (s + 1)) for s in range(6)]


def test_spool_of_another_run_is_refused(tmp_path: Path) -> None:
    cfg = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", spool_dir=str(tmp_path / "spool"))
    tracker = MLflowTracker(cfg)
    tracker.log_metrics({"x": 1.0}, 0)
    with pytest.raises(ValueError, match="belongs to run"):
        MLflowTracker(cfg, run_id="0123456789abcdef")


# ---------------------------------------------------------------- stores that fail
@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_a_local_store_that_cannot_be_written_is_an_error_before_any_work(kind, tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("a regular file, where the store needs a folder\n")
    if kind == "file":
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow refuses file stores without it
        uri = f"file://{blocker}/mlruns"
    else:
        uri = f"sqlite:///{blocker}/mlflow.db"
    expected = rf"tracking.tracking_uri {re.escape(uri)} must be a store this run can write to: \w+Error: .*a-file"
    with pytest.raises(TrackingStoreError, match=expected):
        MLflowTracker(config(uri, tmp_path / "spool", "t-unwritable"))
    assert Spool(tmp_path / "spool").unacked() == ([], 0)  # nothing was logged, let alone acknowledged


def test_a_local_store_failing_mid_run_keeps_its_records(tmp_path, monkeypatch, capsys, fault) -> None:
    # A connection per request (a real MLflow setting), so that losing the database is seen at once.
    monkeypatch.setenv("MLFLOW_SQLALCHEMYSTORE_POOLCLASS", "NullPool")
    store = tmp_path / "store"
    store.mkdir()
    uri = f"sqlite:///{store / 'mlflow.db'}"
    tracker = MLflowTracker(config(uri, tmp_path / "spool", "t-local"))
    tracker.log_metrics({"loss": 1.0}, 0)
    assert tracker.pending == 0
    store.rename(tmp_path / "away")
    store.write_text("")  # the database's folder is now a regular file: the store cannot be opened
    for step in (1, 2):
        tracker.log_metrics({"loss": 1.0 / (step + 1)}, step)
    assert tracker.pending == 2  # kept, not acknowledged as "rejected"
    assert f"cannot deliver to {uri}" in capsys.readouterr().err
    store.unlink()
    (tmp_path / "away").rename(store)
    assert tracker.close() == 0
    fault.records([(s, 1.0 / (s + 1)) for s in range(3)], history(uri, tracker.run_id, "loss"))
    assert history(uri, tracker.run_id, "loss") == [(s, 1.0 / (s + 1)) for s in range(3)]
    assert get_run(uri, tracker.run_id).info.status == "FINISHED"


def test_a_value_the_store_refuses_is_set_aside_counted_and_reported(server: Server, tmp_path, capsys, fault) -> None:
    tracker = MLflowTracker(config(server.uri, tmp_path / "spool", "t-refused"))
    tracker.log_params({"lr": 0.1, "seed": 1})
    tracker.log_params({"lr": 0.2, "method": "trace"})  # MLflow refuses to change a logged param
    tracker.log_metrics({"loss": 0.5}, 0)
    assert tracker.pending == 0 and tracker.rejected == 1
    err = capsys.readouterr().err
    assert "refused 1 params values" in err and "'lr'" in err and "Changing param values" in err
    assert tracker.close() == 0
    assert "1 values of run" in capsys.readouterr().err
    run = get_run(server.uri, tracker.run_id)
    assert run.data.params == {"lr": "0.1", "seed": "1", "method": "trace"}  # "method" is not lost with "lr"
    fault.records([("loss", 0.5)], list(run.data.metrics.items()))
    fault.check("refused values set aside", 1, tracker.rejected)
    assert run.data.tags[REJECTED_TAG] == "1" and run.data.metrics == {"loss": 0.5}
    rejected = [json.loads(line) for line in (tmp_path / "spool" / "rejected.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["key"]) for r in rejected] == [("params", "lr")]


def test_an_outage_at_start_mid_run_and_at_the_end_loses_nothing(server: Server, tmp_path, capsys, fault) -> None:
    """One outage, seen by run A (server killed mid-run, still down as it ends) and by run B (server
    down from its start); afterwards `trace-rl deliver` delivers A and B's next run delivers B."""
    a = MLflowTracker(config(server.uri, tmp_path / "a", "t-outage"))
    a.log_params({"method": "trace"})
    for step in range(3):
        a.log_metrics({"loss": 1.0 / (step + 1)}, step)
    assert a.pending == 0
    b_cfg = config(server.uri, tmp_path / "b", "t-outage", run_name="b")
    server.stop()
    try:
        for step in range(3, 6):
            a.log_metrics({"loss": 1.0 / (step + 1)}, step)  # must not raise
        assert a.pending == 3
        assert a.close() == 4  # the three steps and the final status
        err = capsys.readouterr().err
        assert "4 records (the final status FINISHED among them) are still in the spool" in err
        assert f"still shows run {a.run_id} as RUNNING" in err and f"trace-rl deliver {a.spool}" in err
        b = MLflowTracker(b_cfg, tags={"method": "grpo"})  # down at start: a warning, not an error
        assert b.run_id is None and f"tracking server {server.uri} is down" in capsys.readouterr().err
        b.log_params({"method": "grpo"})
        for step in range(2):
            b.log_metrics({"loss": float(step)}, step)
        assert b.close("FAILED") == 4
        assert "the run is not created" in capsys.readouterr().err
    finally:
        server.start()
    assert get_run(server.uri, a.run_id).info.status == "RUNNING"  # the store lags: nothing is lost yet
    done = subprocess.run([TRACE_RL, "deliver", str(a.spool)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "delivered 4 records" in done.stdout and "0 still spooled" in done.stdout
    fault.records([(s, 1.0 / (s + 1)) for s in range(6)], history(server.uri, a.run_id, "loss"))
    assert history(server.uri, a.run_id, "loss") == [(s, 1.0 / (s + 1)) for s in range(6)]
    assert get_run(server.uri, a.run_id).info.status == "FINISHED"
    b = MLflowTracker(b_cfg)  # the next run on B's spool delivers it, creating the run
    assert b.pending == 0 and b.run_id is not None
    run = get_run(server.uri, b.run_id)
    assert run.info.status == "FAILED" and run.info.run_name == "b" and run.data.tags["method"] == "grpo"
    assert run.data.params == {"method": "grpo"}
    with tracked_run(b):  # a resume reopens the run
        assert get_run(server.uri, b.run_id).info.status == "RUNNING"
        b.log_metrics({"loss": 2.0}, 2)
    fault.records([(0, 0.0), (1, 1.0), (2, 2.0)], history(server.uri, b.run_id, "loss"))
    assert history(server.uri, b.run_id, "loss") == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert get_run(server.uri, b.run_id).info.status == "FINISHED"


# ---------------------------------------------------------------- run status
def test_an_exception_ends_the_run_failed(server: Server, tmp_path, fault) -> None:
    tracker = MLflowTracker(config(server.uri, tmp_path / "spool", "t-failed"))
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(RuntimeError, match="loss diverged"), tracked_run(tracker):
        tracker.log_metrics({"loss": 1.0}, 0)
        raise RuntimeError("loss diverged")
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # handlers put back
    run = get_run(server.uri, tracker.run_id)
    fault.records([("loss", 1.0)], list(run.data.metrics.items()))
    assert run.info.status == "FAILED" and run.data.metrics == {"loss": 1.0}


LOGGER = """
import signal, sys, time
from trace_core.tracking import MLflowTracker, TrackingConfig, tracked_run
# A test runner may start us as a background job, with SIGINT ignored: act as if run from a terminal.
signal.signal(signal.SIGINT, signal.default_int_handler)
tracker = MLflowTracker(TrackingConfig(tracking_uri=sys.argv[1], experiment="t-killed", spool_dir=sys.argv[2],
                                       retry_interval_s=0.0))
with tracked_run(tracker):
    for step in range(100_000):
        tracker.log_metrics({"loss": 1.0 / (step + 1)}, step)
        if step == 2:
            print("logging", flush=True)
        time.sleep(0.01)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_the_run_killed_with_every_step_delivered(sig, server: Server, tmp_path, fault) -> None:
    spool = tmp_path / "spool"
    log = tmp_path / "stderr.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", LOGGER, server.uri, str(spool)], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert proc.stdout.readline().strip() == "logging", log.read_text()[-2000:]
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.stdout.close()
    # SIGTERM: exit status 128 + 15 after the cleanup; SIGINT: KeyboardInterrupt, as without us.
    expected = (128 + sig,) if sig == signal.SIGTERM else (-sig, 128 + sig)
    assert proc.returncode in expected, log.read_text()[-2000:]
    run_id = Spool(spool).read_meta().run_id
    assert get_run(server.uri, run_id).info.status == "KILLED"
    pending, _ = Spool(spool).unacked()
    logged = [r["step"] for r in Spool(spool).records() if r["kind"] == "metrics"]
    assert pending == [] and len(logged) >= 3
    fault.records(logged, [s for s, _ in history(server.uri, run_id, "loss")])
    assert [s for s, _ in history(server.uri, run_id, "loss")] == logged  # every step logged is in MLflow


# ---------------------------------------------------------------- the deliver command
def test_deliver_help_answers_at_once_and_says_what_it_does(tmp_path) -> None:
    shown = subprocess.run([TRACE_RL, "deliver", "--help"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0  # how fast: bench/cli_timing.py prints it
    for part in ("spooled tracking records", "final status", "spool_dir", "--tracking-uri", "--status", "--wait",
                 "example:", "trace-rl deliver runs/"):
        assert part in shown.stdout, part
    wrong = subprocess.run([TRACE_RL, "deliver", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert wrong.returncode == 2 and f"spool_dir {tmp_path} is not a tracking spool" in wrong.stderr
