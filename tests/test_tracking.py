"""Tracking against a real `mlflow server`: buffering while it is down, resume after a crash."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import MlflowServer as Server

from trace_core.tracking import MLflowTracker, TrackingConfig, mlflow_name


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key))


def test_metric_names_are_made_valid() -> None:
    assert mlflow_name("eff ratio (roots)@step") == "eff ratio _roots__step"
    assert mlflow_name("predictor/spearman.root") == "predictor/spearman.root"
    with pytest.raises(ValueError, match="cannot be turned into an MLflow key"):
        mlflow_name("")


def test_run_goes_on_while_the_server_is_down_and_catches_up(server: Server, tmp_path: Path) -> None:
    cfg = TrackingConfig(tracking_uri=server.uri, experiment="t-buffer", spool_dir=str(tmp_path / "spool"),
                         retry_interval_s=0.0, request_timeout_s=2)
    tracker = MLflowTracker(cfg)
    tracker.log_params({"method": "trace", "budget": {"M": 16}})
    for step in range(3):
        tracker.log_metrics({"effective_ratio": step / 10}, step)
    assert tracker.pending == 0 and tracker.run_id
    server.stop()
    t0 = time.monotonic()
    for step in range(3, 6):
        tracker.log_metrics({"effective_ratio": step / 10}, step)  # must not raise or hang
    assert time.monotonic() - t0 < 30
    assert tracker.pending == 3
    server.start()
    assert tracker.flush()
    assert history(server.uri, tracker.run_id, "effective_ratio") == [(s, s / 10) for s in range(6)]


def test_a_killed_run_resumes_into_the_same_run_without_duplicates(server: Server, tmp_path: Path) -> None:
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
    assert history(server.uri, run_id, "loss") == [(s, 1.0 / (s + 1)) for s in range(6)]


def test_spool_of_another_run_is_refused(tmp_path: Path) -> None:
    cfg = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", spool_dir=str(tmp_path / "spool"))
    tracker = MLflowTracker(cfg)
    tracker.log_metrics({"x": 1.0}, 0)
    with pytest.raises(ValueError, match="belongs to run"):
        MLflowTracker(cfg, run_id="0123456789abcdef")
