"""The success-rate measurement (trace_core.evaluation.success): its count against the success
threshold, and its rollouts against the executor run every measuring site made before it had one
function (the same request seeds, so the same rollouts and the same figures)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trace_core.evaluation.success import SuccessMeasurement, count_successes, measure_success
from trace_core.metrics import SUCCESS_THRESHOLD
from trace_core.rollout.agent import AgentConfig
from trace_core.rollout.env import FixedTurnsEnvironment, Task
from trace_core.rollout.executor import TreeRolloutExecutor
from trace_core.tree import RolloutTree


def _tree(name: str, rewards: list[float], unfinished: int = 0) -> RolloutTree:
    tree = RolloutTree(name)
    for r in rewards:
        traj = tree.start_trajectory("bare")
        tree.add_turn(traj, [1, 2], [1, 1])
        tree.finish(traj, r)
    for _ in range(unfinished):
        traj = tree.start_trajectory("bare")
        tree.add_turn(traj, [1, 2], [1, 1])
    return tree


def test_a_success_is_a_reward_above_the_threshold_and_only_finished_rollouts_count() -> None:
    trees = [_tree("a", [1.0, 0.0, SUCCESS_THRESHOLD, 0.75]), _tree("b", [0.0, 0.0], unfinished=1),
             _tree("c", [], unfinished=2)]
    successes, finished = count_successes(trees)
    assert successes == {"a": 2, "b": 0, "c": 0}  # the threshold itself is a failure
    assert finished == {"a": 4, "b": 2, "c": 0}
    measured = SuccessMeasurement(4, successes, finished, rollouts=None)  # type: ignore[arg-type]
    rates = measured.rates()
    assert rates["a"] == 0.5 and rates["b"] == 0.0 and math.isnan(rates["c"])
    assert list(rates) == ["a", "b", "c"]  # task order kept
    # the trainer's per-prompt figure, computed as it was (the mean of the success flags), is the same float
    assert [float(np.mean(np.asarray(t.outcomes()) > SUCCESS_THRESHOLD)) for t in trees[:2]] == [0.5, 0.0]


@pytest.fixture(scope="module")
def executor(hf_engine, tiny_tokenizer):
    agent = AgentConfig(max_turns=2, max_new_tokens=6, max_total_tokens=512, seed=5)
    return TreeRolloutExecutor(hf_engine, tiny_tokenizer, lambda task: FixedTurnsEnvironment(num_turns=2), agent,
                               tool_workers=0)


TASKS = [Task(id=f"t{i}", question=f"Synthetic task {i}: reply in 2 turns.") for i in range(3)]


def _tokens(trees: list[RolloutTree]) -> list[list[list[int]]]:
    return [[n.token_ids for n in t.nodes] for t in trees]


def test_the_measurement_draws_what_the_sites_drew_with_their_seeds(executor) -> None:
    """The trainer, the benchmarks and the testbed ran ``executor.run(..., default_rng(s),
    sampling_seed=s)``; the warm-start check and the evaluation left the sampling seed to the
    agent's. The measurement draws the same rollouts under both, and counts them."""
    measured = measure_success(executor, TASKS, 3, seed=11)
    before = executor.run(TASKS, [3] * len(TASKS), None, np.random.default_rng(11), sampling_seed=11)
    assert _tokens(measured.rollouts.trees) == _tokens(before.trees)
    assert measured.successes == {t.prompt_id: int((t.outcomes() > SUCCESS_THRESHOLD).sum()) for t in before.trees}
    assert measured.finished == dict.fromkeys(["t0", "t1", "t2"], 3) and measured.samples == 3
    assert measured.rollouts.stats.trajectories == 9

    by_agent = measure_success(executor, TASKS, 3)
    agent_before = executor.run(TASKS, [3] * len(TASKS), None, np.random.default_rng(0))
    assert _tokens(by_agent.rollouts.trees) == _tokens(agent_before.trees)
    assert _tokens(by_agent.rollouts.trees) == _tokens(measure_success(executor, TASKS, 3, seed=5).rollouts.trees)
    assert _tokens(by_agent.rollouts.trees) != _tokens(measured.rollouts.trees)  # another seed, other rollouts
    assert by_agent.mean_rate() == pytest.approx(np.mean([s / 3 for s in by_agent.successes.values()]))
    with pytest.raises(ValueError, match="m must hold"):
        measure_success(executor, TASKS, 1, seed=0)
