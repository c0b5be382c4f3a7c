"""Expert scripts rendered to token ids exactly as the rollout executor stores a trajectory.

The executor (:mod:`trace_core.rollout.executor`) builds a trajectory as

    render_prompt(tokenizer, task, env.tool_descriptions(), agent)            # loss mask 0
    + for each turn: model tokens (mask 1) + observation_tokens(obs.text)      # mask 0
      (no observation tokens after the final turn)

and a demonstration is built the same way from a :class:`~trace_core.warmstart.experts.Script`:
the model tokens of a turn are the tokenisation of its text on its own (a turn is generated, and
stored, as its own token ids; nothing is re-tokenised across a turn boundary).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_core.data.schema import Example
from trace_core.envs.registry import example_to_task
from trace_core.rollout.agent import AgentConfig, observation_tokens, render_prompt
from trace_core.rollout.env import Environment, Task
from trace_core.warmstart.experts import Expert, Script


@dataclass(frozen=True)
class DemoConfig:
    """How demonstrations are drawn."""

    epsilon: float = 0.1  # probability that any one expert step is corrupted (independently per step)
    demos_per_task: int = 1  # scripts per task; each draws its own errors (seed + copy index)
    seed: int = 0  # seeds the error draws
    max_tokens: int = 2048  # a longer demonstration is an error (so is one over the agent's max_total_tokens)

    def __post_init__(self) -> None:
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {self.epsilon}")
        if self.demos_per_task < 1:
            raise ValueError(f"demos_per_task must be >= 1, got {self.demos_per_task}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class TurnView:
    """One model turn with a cropped context: a cheap training sequence for the copying skills.

    A tiny model has to learn to copy numbers and names from the question or the last
    observation into its action, and that signal is diluted in a full demonstration (the system
    turn and older observations are most of its tokens). A view keeps just the turn's immediate
    input, as the exact token ids of the demonstration (a contiguous slice of it), and the loss
    stays on the model-written tokens."""

    token_ids: tuple[int, ...]  # the context, then the turn's model-written tokens
    context_length: int  # tokens before the turn (loss mask 0)
    prompt_token_ids: tuple[int, ...] = ()  # empty: all views batch together

    @property
    def loss_mask(self) -> list[int]:
        return [0] * self.context_length + [1] * (len(self.token_ids) - self.context_length)


@dataclass(frozen=True)
class Demo:
    """One demonstration as token ids, segment by segment."""

    script: Script
    prompt_token_ids: tuple[int, ...]  # render_prompt(...)
    turn_token_ids: tuple[tuple[int, ...], ...]  # the model-written tokens of each turn
    observation_token_ids: tuple[tuple[int, ...], ...]  # observation_tokens(...) after each turn; () after the last

    @property
    def token_ids(self) -> list[int]:
        ids = list(self.prompt_token_ids)
        for turn, obs in zip(self.turn_token_ids, self.observation_token_ids, strict=True):
            ids += turn
            ids += obs
        return ids

    @property
    def loss_mask(self) -> list[int]:
        """1 on model-written tokens, 0 on the prompt and on observations (as the rollout tree stores it)."""
        mask = [0] * len(self.prompt_token_ids)
        for turn, obs in zip(self.turn_token_ids, self.observation_token_ids, strict=True):
            mask += [1] * len(turn) + [0] * len(obs)
        return mask

    def truncated(self, turns: int) -> Demo:
        """The first ``turns`` turns, the last one followed by its observation (a prefix of the trajectory)."""
        if not 1 <= turns <= len(self.turn_token_ids):
            raise ValueError(f"turns must be in [1, {len(self.turn_token_ids)}], got {turns}")
        return Demo(self.script, self.prompt_token_ids, self.turn_token_ids[:turns],
                    self.observation_token_ids[:turns])

    def turn_views(self, im_start_id: int) -> list[TurnView]:
        """Each turn with only its immediate input as context (see :class:`TurnView`).

        Turn 0 sees the user turn (the prompt from its ``<|im_start|>user``, without the system
        turn); turn ``i > 0`` sees turn ``i - 1`` and its observation. ``im_start_id`` is the
        tokenizer's ``<|im_start|>`` id."""
        starts = [i for i, t in enumerate(self.prompt_token_ids) if t == im_start_id]
        if len(starts) < 2:
            raise ValueError(f"demo of task {self.script.task.id!r}: the prompt has no user turn to crop at")
        context = list(self.prompt_token_ids[starts[-2]:])
        views = []
        for turn, obs in zip(self.turn_token_ids, self.observation_token_ids, strict=True):
            views.append(TurnView(tuple(context + list(turn)), len(context)))
            context = list(turn) + list(obs)
        return views

    def to_record(self) -> dict[str, Any]:
        s = self.script
        return {
            "task_id": s.task.id,
            "correct": s.correct,
            "corrupted_steps": s.corrupted_steps,
            "turns": [{"text": st.text, "observation": st.observation, "corrupted": st.corrupted} for st in s.steps],
            "num_tokens": len(self.token_ids),
            "num_model_tokens": sum(self.loss_mask),
            "token_ids": self.token_ids,
            "loss_mask": self.loss_mask,
        }


def load_tasks(path: str | Path, limit: int | None = None) -> list[Task]:
    """The first ``limit`` (all if None) tasks of a generated JSONL file, via the environments' adapter."""
    examples = load_examples(path)
    return [example_to_task(e) for e in (examples if limit is None else examples[:limit])]


def load_examples(path: str | Path) -> list[Example]:
    """Examples of a JSONL file written by ``trace_core.data.generate``."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"example file {path} does not exist")
    return [Example.from_record(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line]


def render_demo(tokenizer: Any, script: Script, tools: list[dict[str, Any]], agent: AgentConfig) -> Demo:
    """Token ids of ``script`` in the executor's layout (module docstring)."""
    if not script.steps or script.steps[-1].final_answer is None:
        raise ValueError(f"script of task {script.task.id!r} must end with a final answer")
    if len(script.steps) > agent.max_turns:
        raise ValueError(f"script of task {script.task.id!r} has {len(script.steps)} turns; "
                         f"the agent allows max_turns={agent.max_turns}")
    prompt = render_prompt(tokenizer, script.task, tools, agent)
    turns, observations = [], []
    for i, step in enumerate(script.steps):
        last = i == len(script.steps) - 1
        if (step.observation is None) != last:
            raise ValueError(f"script of task {script.task.id!r}: turn {i} must have an observation "
                             "exactly when it is not the final answer")
        turns.append(tuple(int(t) for t in tokenizer.encode(step.text, add_special_tokens=False)))
        observations.append(() if last else tuple(observation_tokens(tokenizer, step.observation)))
    return Demo(script, tuple(prompt), tuple(turns), tuple(observations))


def build_scripts(
    expert: Expert,
    tasks: Iterable[Task],
    config: DemoConfig | None = None,
    env_factory: Callable[[Task], Environment] | None = None,
) -> list[Script]:
    """``config.demos_per_task`` expert scripts per task, in task order.

    With ``env_factory`` the observations come from a fresh real environment per script (exact,
    at the tools' cost); without, from the expert's cheap stand-ins."""
    config = config if config is not None else DemoConfig()
    scripts = []
    for task in tasks:
        for copy in range(config.demos_per_task):
            env = env_factory(task) if env_factory is not None else None
            scripts.append(expert.script(task, config.epsilon, seed=config.seed * 1_000_003 + copy, env=env))
    return scripts


ToolSchemas = list[dict[str, Any]] | Callable[[Task], list[dict[str, Any]]]  # one list, or per task


def tools_of(tools: ToolSchemas, task: Task) -> list[dict[str, Any]]:
    """The tool schemas ``task``'s prompt shows: a family's fixed list, or a per-task function
    (BFCL: the entry's involved classes)."""
    return tools(task) if callable(tools) else tools


def render_demos(
    tokenizer: Any,
    scripts: Iterable[Script],
    tools: ToolSchemas,
    agent: AgentConfig | None = None,
    max_tokens: int | None = None,
) -> list[Demo]:
    """:func:`render_demo` of each script; a demo longer than ``max_tokens`` (default: the agent's
    ``max_total_tokens``) is an error, since the executor could never produce it."""
    agent = agent if agent is not None else AgentConfig()
    limit = agent.max_total_tokens if max_tokens is None else min(max_tokens, agent.max_total_tokens)
    demos = []
    for script in scripts:
        demo = render_demo(tokenizer, script, tools_of(tools, script.task), agent)
        if len(demo.token_ids) > limit:
            raise ValueError(f"demo of task {script.task.id!r} has {len(demo.token_ids)} tokens, "
                             f"over the limit {limit}")
        demos.append(demo)
    return demos


def build_demos(
    tokenizer: Any,
    expert: Expert,
    tasks: Iterable[Task],
    tools: ToolSchemas,
    agent: AgentConfig | None = None,
    config: DemoConfig | None = None,
    env_factory: Callable[[Task], Environment] | None = None,
) -> list[Demo]:
    """:func:`build_scripts` then :func:`render_demos`."""
    config = config if config is not None else DemoConfig()
    return render_demos(tokenizer, build_scripts(expert, tasks, config, env_factory), tools, agent, config.max_tokens)


def corruption_rate(scripts: Sequence[Script]) -> float:
    """Share of corrupted steps over all steps of ``scripts``."""
    steps = sum(len(s.steps) for s in scripts)
    if steps == 0:
        raise ValueError("scripts must hold at least one step")
    return sum(s.corrupted_steps for s in scripts) / steps


def write_demos(path: str | Path, demos: Sequence[Demo]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for demo in demos:
            fh.write(json.dumps(demo.to_record(), ensure_ascii=False) + "\n")
