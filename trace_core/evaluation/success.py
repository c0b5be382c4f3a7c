"""``k`` bare rollouts of every task, and how many succeeded: the one success-rate measurement.

Pool success and held-out pass@1 during training, the warm-start check, the evaluation's passes,
the testbed's spread and the benchmarks all measure a policy the same way: ``k`` bare rollouts of
each task through the training executor (no expansion, so exactly the ReAct loop RL trains with),
a rollout counting as a success when its reward is above
:data:`~trace_core.metrics.SUCCESS_THRESHOLD` (:func:`~trace_core.metrics.is_success`). Only
finished rollouts count. :func:`measure_success` is that measurement; :func:`count_successes` is
its count on trees already rolled out.

Every request's sampling seed is derived from the measurement's seed, the task, the trajectory and
the node (:meth:`~trace_core.rollout.executor.TreeRolloutExecutor.run`), never from the batch a
task is in: one seed gives the same rollouts of a task whatever else is measured with it, and two
measurements with one seed differ only by the policy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from trace_core.metrics import is_success

if TYPE_CHECKING:
    from trace_core.rollout.env import Task
    from trace_core.rollout.executor import RolloutResult, TreeRolloutExecutor
    from trace_core.tree import RolloutTree


def count_successes(trees: Sequence[RolloutTree]) -> tuple[dict[str, int], dict[str, int]]:
    """Per tree, keyed by its prompt id and in tree order: its successful finished rollouts, and
    its finished rollouts."""
    successes: dict[str, int] = {}
    finished: dict[str, int] = {}
    for tree in trees:
        outcomes = tree.outcomes()
        successes[tree.prompt_id] = int(is_success(outcomes).sum())
        finished[tree.prompt_id] = int(outcomes.size)
    return successes, finished


@dataclass(frozen=True)
class SuccessMeasurement:
    """A policy's successes on a set of tasks, ``samples`` rollouts each."""

    samples: int  # rollouts asked of every task (k)
    successes: dict[str, int]  # task id -> finished rollouts with reward > SUCCESS_THRESHOLD, in task order
    finished: dict[str, int]  # task id -> finished rollouts (``samples`` unless one was cut short)
    rollouts: RolloutResult  # the trees (one per task, in task order) and the run's costs

    def rates(self) -> dict[str, float]:
        """Per task, successes over finished rollouts (NaN for a task with none finished)."""
        return {t: s / self.finished[t] if self.finished[t] else math.nan for t, s in self.successes.items()}

    def mean_rate(self) -> float:
        """The success rate averaged over tasks (each task weighs the same)."""
        return float(np.mean(list(self.rates().values())))


def measure_success(
    executor: TreeRolloutExecutor, tasks: Sequence[Task], samples: int, seed: int | None = None
) -> SuccessMeasurement:
    """``samples`` bare rollouts of every task through ``executor`` and their successes.

    ``seed`` keys every request's sampling seed (module docstring); None: the executor's agent
    seed. Raises what :meth:`~trace_core.rollout.executor.TreeRolloutExecutor.run` raises (e.g.
    ``samples`` < 2: the executor samples groups; a task given twice)."""
    key = int(executor.agent.seed if seed is None else seed)
    # a bare run draws nothing from the generator (it places no prefixes); it is seeded all the same
    result = executor.run(list(tasks), [samples] * len(tasks), None, np.random.default_rng(key), sampling_seed=key)
    successes, finished = count_successes(result.trees)
    return SuccessMeasurement(int(samples), successes, finished, result)
