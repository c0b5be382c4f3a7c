"""The task-family registry: a family registered from outside the package is trained, checked
and evaluated through the same calls as the built-in ones, with no name tested anywhere."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from trace_core.envs.families import (
    SharedResources,
    TaskFamily,
    family_names,
    get_family,
    register_family,
    unregister_family,
)
from trace_core.envs.registry import EnvsConfig, make_env_factory
from trace_core.evaluation.config import EvalConfig
from trace_core.evaluation.runner import benchmark_metrics
from trace_core.rollout.env import FixedTurnsEnvironment, Task
from trace_core.training.config import TaskConfig, TrainConfig
from trace_core.training.run_guard import index_dir_of, train_file
from trace_core.training.trainer import load_task_rows


@dataclass(frozen=True)
class ToyConfig:
    turns: int = 2
    prompts: int = 3


class ToyEnvironment(FixedTurnsEnvironment):
    def __init__(self, config: ToyConfig, shared: SharedResources) -> None:
        super().__init__(num_turns=config.turns)
        self.shared = shared


def _toy_tasks(config: ToyConfig) -> list[Task]:
    return [Task(id=f"toy-{i}", question=f"toy {i}", answer=["yes"]) for i in range(config.prompts)]


def _length_metric(final: str | None, task: Task) -> dict[str, float]:
    return {"letters": float(len(final or ""))}


@pytest.fixture
def toy() -> TaskFamily:
    family = register_family(TaskFamily("toy", ToyConfig, lambda c, shared: lambda task: ToyEnvironment(c, shared),
                                        synthetic_tasks=_toy_tasks, answer_metrics=_length_metric,
                                        answer_metric_names=("letters",)))
    yield family
    unregister_family("toy")


def test_the_built_in_families_say_what_they_need() -> None:
    assert family_names()[:4] == ("math", "qa", "fc", "fixed-turns")
    assert get_family("qa").needs_index and get_family("qa").index_corpus == "qa/corpus.jsonl"
    assert get_family("math").sandboxed and not get_family("math").needs_index
    assert not get_family("fc").needs_index and not get_family("fc").sandboxed
    assert get_family("fixed-turns").synthetic_tasks is not None
    assert get_family("qa").answer_metric_names == ("em", "f1")
    with pytest.raises(ValueError, match="already registered"):
        register_family(get_family("math"))


def test_a_registered_family_is_configured_trained_and_scored_by_the_same_calls(toy, tmp_path) -> None:
    assert "toy" in family_names()
    with pytest.raises(ValueError, match="task.family 'chess' is not one of math, qa, fc, fixed-turns, toy"):
        TaskConfig(family="chess")
    cfg = TrainConfig(task=TaskConfig(family="toy"), output_dir=str(tmp_path / "out"))
    assert train_file(cfg) is None  # a synthetic family reads no data file
    assert index_dir_of(cfg) == tmp_path / "out" / "toy_index"
    tasks, factory, where = load_task_rows(cfg)
    assert [t.id for t in tasks] == ["toy-0", "toy-1", "toy-2"] and where["toy-1"] == "synthetic prompt 1"
    env = factory(tasks[0])
    assert isinstance(env, ToyEnvironment) and env.num_turns == 2  # no EnvsConfig section: its defaults
    own = make_env_factory("toy", ToyConfig(turns=5), index_dir=tmp_path / "idx")(tasks[0])
    assert own.num_turns == 5 and own.shared.index_dir == str(tmp_path / "idx")
    assert make_env_factory("toy", EnvsConfig())(tasks[0]).num_turns == 2
    with pytest.raises(ValueError, match="must be ToyConfig or EnvsConfig"):
        make_env_factory("toy", get_family("qa").config_type())
    # the evaluation averages the family's own answer metrics, greedy ones included
    trajectory = {"success": True, "tool_calls": 0, "turns": 2, "gen_tokens": 4, "total_tokens": 9, "answer": "yes",
                  "tool_errors": 0}
    records = [{"family": "toy", "prompt_too_long": False, "samples": [{**trajectory, "letters": 3.0},
                                                                        {**trajectory, "letters": 1.0}],
                "greedy": {**trajectory, "letters": 2.0}}]
    metrics = benchmark_metrics(records, EvalConfig(samples=2, pass_at=[1]))
    assert metrics["letters"] == 2.0 and metrics["greedy_letters"] == 2.0 and "em" not in metrics


def test_the_synthetic_family_reads_its_section_of_the_environment_settings(tmp_path) -> None:
    from trace_core.config import load_config

    cfg = load_config(TrainConfig, None, ["task.family=fixed-turns", "task.envs.fixed_turns.turns=4",
                                          "task.envs.fixed_turns.prompts=5", f"output_dir={tmp_path}"])
    tasks, factory, _ = load_task_rows(cfg)
    assert len(tasks) == 5 and factory(tasks[0]).num_turns == 4
    with pytest.raises(ValueError, match="fixed_turns.prompts must be >= 1"):
        load_config(TrainConfig, None, ["task.family=fixed-turns", "task.envs.fixed_turns.prompts=0"])
    assert Path(index_dir_of(cfg)).name == "fixed-turns_index"
