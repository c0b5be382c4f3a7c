"""Faults in the training loop: a run stopped at every phase boundary of a step resumes with every
step's metrics logged exactly once and every step's tree artifact present; a rollout engine that
crashes mid-step stops the run with a plain message, a FAILED tracking run and a consistent
checkpoint from which it resumes. Real trainer, real transformers engine, real MLflow server; the
faults are injected (a hard stop at a boundary, an engine that raises after some polls)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FaultyEngine

from trace_core.config import load_config
from trace_core.training.config import TrainConfig
from trace_core.training.trainer import Trainer

pytestmark = pytest.mark.faults  # selected by `make faults`; the tests with `fault` are its injections
FAULT_AREA = "training loop"

BOUNDARIES = ("trees_saved", "checkpointed", "logged")


class _HardStop(BaseException):
    """The injected kill: a BaseException, so no `except Exception` in the loop absorbs it."""


class _StopAt(Trainer):
    def __init__(self, cfg, engine, boundary: str, step: int) -> None:
        self.stop_at = (boundary, step)
        super().__init__(cfg, engine=engine)

    def _reached(self, boundary: str, step: int) -> None:
        if (boundary, step) == self.stop_at:
            raise _HardStop(f"{boundary} of step {step}")


def _overrides(model: Path, out: Path, uri: str, steps: int = 2) -> list[str]:
    return [
        "method=trace", f"steps={steps}", f"policy_model={model}", f"output_dir={out}", "task.family=fixed-turns",
        "task.envs.fixed_turns.turns=2", "task.envs.fixed_turns.prompts=8", "budget.roots_M=4", "budget.expansion_N=1",
        "budget.group_size_G=2", "budget.max_per_prompt=4", "budget.pool_factor=1", "agent.max_new_tokens=6",
        "agent.max_total_tokens=512", "engine.max_model_len=512", "policy.micro_batches=1",
        "predictor.tiny_hidden_size=32", "predictor.tiny_intermediate_size=64", "progress=false",
        "checkpoint_every=1", f"tracking.tracking_uri={uri}", "tracking.experiment=trainer-faults",
        "tracking.retry_interval_s=0",
    ]


def _the_run(client, out: Path):
    exp = client.get_experiment_by_name("trainer-faults")
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.params.get("output_dir") == str(out)]
    return runs


@pytest.mark.parametrize(("boundary", "step"), [(b, 1) for b in BOUNDARIES] + [("checkpointed", 0)])
def test_a_stop_at_every_phase_boundary_loses_and_doubles_nothing(boundary, step, hf_engine, tiny_models, server,
                                                                   tmp_path, fault) -> None:
    from mlflow.tracking import MlflowClient

    out = tmp_path / f"{boundary}-{step}"
    cfg = load_config(TrainConfig, None, _overrides(tiny_models[0], out, server.uri))
    try:
        with pytest.raises(_HardStop):
            _StopAt(cfg, hf_engine, boundary, step).run()
        summary = Trainer(cfg, engine=hf_engine).run()
    finally:
        hf_engine.load_weights(str(tiny_models[0]))
    client = MlflowClient(server.uri)
    run_id = summary["run_id"]
    assert [r.info.run_id for r in _the_run(client, out)] == [run_id], "the resume continues the same run"
    steps = sorted(m.step for m in client.get_metric_history(run_id, "effective_ratio"))
    fault.records([0, 1], steps)
    assert steps == [0, 1], f"stopped at {boundary} of step {step}: steps logged {steps}"
    trees = {a.path for a in client.list_artifacts(run_id, "trees")}
    fault.artifacts(2, len(trees & {"trees/step00000.jsonl.gz", "trees/step00001.jsonl.gz"}))
    assert trees == {"trees/step00000.jsonl.gz", "trees/step00001.jsonl.gz"}, trees
    allocations = {a.path for a in client.list_artifacts(run_id, "allocations")}
    assert len(allocations) == 2
    assert client.get_run(run_id).info.status == "FINISHED"


def test_an_engine_crash_mid_step_stops_with_a_clear_error_and_resumes(hf_engine, tiny_models, server,
                                                                       tmp_path, fault) -> None:
    from mlflow.tracking import MlflowClient

    from trace_core.failures import RunFailed

    out = tmp_path / "crash"
    cfg = load_config(TrainConfig, None, _overrides(tiny_models[0], out, server.uri, steps=3))
    probe = Trainer(cfg, engine=FaultyEngine(hf_engine, 10 ** 9, None))  # count the polls of one step
    try:
        probe.train_step()
        per_step = probe.engine.inner.polls
        probe.engine.stop_watchdog()
        # in the middle of step 1
        crashing = FaultyEngine(hf_engine, per_step + per_step // 2, RuntimeError("device lost (injected)"))
        with pytest.raises(RunFailed, match=r"during train trace step 2/3\n  cause: the rollout engine failed in poll: "
                                            r"RuntimeError: device lost \(injected\)\n  kept: the last complete "
                                            r"checkpoint, \S+/step_000001\n"):
            Trainer(load_config(TrainConfig, None, _overrides(tiny_models[0], out / "run", server.uri, steps=3)),
                    engine=crashing).run()
        client = MlflowClient(server.uri)
        (failed,) = _the_run(client, out / "run")
        assert failed.info.status == "FAILED"
        while hf_engine.num_pending:  # a new process would build a fresh engine; this one is shared
            hf_engine.poll()
        summary = Trainer(load_config(TrainConfig, None, _overrides(tiny_models[0], out / "run", server.uri,
                                                                    steps=3)), engine=hf_engine).run()
    finally:
        while hf_engine.num_pending:
            hf_engine.poll()
        hf_engine.load_weights(str(tiny_models[0]))
    assert summary["run_id"] == failed.info.run_id
    steps = sorted(m.step for m in client.get_metric_history(summary["run_id"], "effective_ratio"))
    fault.records([0, 1, 2], steps)
    assert steps == [0, 1, 2]
    assert client.get_run(summary["run_id"]).info.status == "FINISHED"
