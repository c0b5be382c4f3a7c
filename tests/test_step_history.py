"""The per-step figures as an append-only file: a resume reads back what its checkpoint covers,
cuts what came after it, and a checkpoint of the old layout still resumes."""

from __future__ import annotations

import json

import pytest

from trace_core.training.step_history import append_step, read_history, write_base


def test_a_resume_reads_the_covered_steps_and_cuts_the_rest(tmp_path):
    path = tmp_path / "step_history.jsonl"
    for step in range(5):
        append_step(path, step, {"loss": float(step), **({"extra": 1.0} if step == 1 else {})})
    with open(path, "a") as f:
        f.write('{"step": 5, "metr')  # torn by a crash mid-write
    history = read_history(path, before=3)  # the checkpoint covers steps 0, 1, 2
    assert history == {"loss": [0.0, 1.0, 2.0], "extra": [1.0]}
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2]
    append_step(path, 3, {"loss": 3.5})  # the resumed run appends step 3 once
    assert read_history(path, before=4)["loss"] == [0.0, 1.0, 2.0, 3.5]


def test_a_fresh_start_cuts_everything_and_a_missing_file_is_empty(tmp_path):
    path = tmp_path / "step_history.jsonl"
    assert read_history(path, before=0) == {}
    append_step(path, 0, {"loss": 1.0})
    assert read_history(path, before=0) == {} and path.read_text() == ""


def test_figures_an_old_checkpoint_carried_become_the_base(tmp_path):
    path = tmp_path / "step_history.jsonl"
    write_base(path, {"loss": [0.5, 0.25]}, upto=2)
    append_step(path, 2, {"loss": 0.125})
    assert read_history(path, before=3) == {"loss": [0.5, 0.25, 0.125]}
    with pytest.raises(ValueError, match="past the checkpoint's step 1"):
        read_history(path, before=1)


def test_a_run_folders_figures_are_read_up_to_its_last_checkpoint_without_touching_it(tmp_path):
    from trace_core.training.step_history import run_history

    for step in range(3):
        append_step(tmp_path / "step_history.jsonl", step, {"loss": float(step)})
    assert run_history(tmp_path) == {}  # no checkpoint yet
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest").write_text("step_000002")
    (tmp_path / "checkpoints" / "step_000002" / "trainer_state.json").write_text(json.dumps({"step": 2, "history": {}}))
    before = (tmp_path / "step_history.jsonl").read_text()
    assert run_history(tmp_path) == {"loss": [0.0, 1.0]}
    assert (tmp_path / "step_history.jsonl").read_text() == before  # a reader cuts nothing
