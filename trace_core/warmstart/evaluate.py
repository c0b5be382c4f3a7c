"""Success rate of a policy on a task family, through the same rollout path RL uses.

The policy runs in :class:`~trace_core.rollout.hf_engine.HFEngine` under the ReAct loop of
:class:`~trace_core.rollout.executor.TreeRolloutExecutor` (bare rollouts only: the ``grpo``
method with no expansion), against the real environments of :mod:`trace_core.envs` (the math
sandbox, the QA retriever). Every trajectory's reward is the environment's; the success rate is
their mean, and a task counts as *mixed* when its samples got different rewards (what RL needs).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trace_core.rollout.agent import AgentConfig
from trace_core.rollout.env import Environment, Task


@dataclass(frozen=True)
class WarmStartEvalConfig:
    """How the warm-start pipeline measures a policy on each task family."""

    samples: int = 2  # trajectories per task (the executor's group; >= 2)
    temperature: float = 1.0  # sampling temperature (0 = greedy; the samples are then identical)
    seed: int = 0  # seeds the engine and the per-request sampling seeds
    tool_workers: int = 4  # threads that run environment steps while the engine generates

    def __post_init__(self) -> None:
        if self.samples < 2:
            raise ValueError(f"samples must be >= 2 (the executor samples groups), got {self.samples}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.tool_workers < 0:
            raise ValueError(f"tool_workers must be >= 0, got {self.tool_workers}")


@dataclass
class FamilySuccess:
    """A policy's success on one task family, as the warm-start pipeline reports it."""

    family: str
    tasks: int
    trajectories: int
    success_rate: float  # mean trajectory reward
    task_success_rate: float  # share of tasks with at least one successful sample
    mixed_tasks: float  # share of tasks whose samples disagree (0 < mean reward < 1)
    answered_rate: float  # share of trajectories that gave a final answer
    mean_turns: float
    tool_errors: int  # malformed actions and failed tool calls, over all turns
    generated_tokens: int
    wall_seconds: float
    examples: list[dict[str, Any]]  # a few trajectories as text, for reading

    def row(self) -> str:
        return (f"{self.family:5s} {self.tasks:5d} {self.trajectories:6d} {self.success_rate:8.3f} "
                f"{self.task_success_rate:9.3f} {self.mixed_tasks:6.3f} {self.answered_rate:8.3f} "
                f"{self.mean_turns:6.2f} {self.wall_seconds:7.1f}")


TABLE_HEADER = "task  tasks  trajs  success  any-succ  mixed answered  turns  wall_s"


def evaluate_policy(
    model_dir: str | Path,
    family: str,
    tasks: Sequence[Task],
    env_factory: Callable[[Task], Environment],
    agent: AgentConfig | None = None,
    config: WarmStartEvalConfig | None = None,
    keep_examples: int = 3,
) -> FamilySuccess:
    """Roll out ``config.samples`` trajectories per task and score them with the environments."""
    from transformers import AutoTokenizer

    from trace_core.evaluation.success import measure_success
    from trace_core.rollout.build import build_engine
    from trace_core.rollout.engine import EngineConfig
    from trace_core.rollout.executor import TreeRolloutExecutor

    if not tasks:
        raise ValueError("tasks must not be empty")
    config = config if config is not None else WarmStartEvalConfig()
    agent = dataclasses.replace(agent if agent is not None else AgentConfig(), temperature=config.temperature,
                                seed=config.seed)
    engine = build_engine(EngineConfig(model_path=str(model_dir), kind="hf", seed=config.seed,
                                       max_model_len=agent.max_total_tokens + agent.max_new_tokens))
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        t0 = time.perf_counter()
        executor = TreeRolloutExecutor(engine, tokenizer, env_factory, agent, tool_workers=config.tool_workers)
        measured = measure_success(executor, tasks, config.samples, config.seed)
    finally:
        engine.close()
    wall = time.perf_counter() - t0
    rewards, per_task, answered, turns, examples = [], [], [], [], []
    for tree in measured.rollouts.trees:
        task_rewards = []
        for traj in tree.trajectories:
            r = tree.trajectory_reward(traj.id)
            task_rewards.append(r)
            nodes = [tree.nodes[n] for n in tree.path(traj.leaf)]
            answered.append(any("final_answer" in n.info for n in nodes))
            turns.append(len([n for n in nodes if n.kind != "root"]))
            if len(examples) < keep_examples:
                examples.append({"task_id": tree.prompt_id, "reward": r,
                                 "turns": [n.info.get("action", "") for n in nodes if n.kind != "root"]})
        rewards += task_rewards
        per_task.append(task_rewards)
    return FamilySuccess(
        family=family,
        tasks=len(per_task),
        trajectories=len(rewards),
        success_rate=float(np.mean(rewards)),
        task_success_rate=float(np.mean([s > 0 for s in measured.successes.values()])),
        mixed_tasks=float(np.mean([0 < np.mean(r) < 1 for r in per_task])),
        answered_rate=float(np.mean(answered)),
        mean_turns=float(np.mean(turns)),
        tool_errors=measured.rollouts.stats.tool_errors,
        generated_tokens=measured.rollouts.stats.generated_tokens,
        wall_seconds=wall,
        examples=examples,
    )
