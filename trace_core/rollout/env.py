"""The environment contract of the ReAct agent loop, and a built-in test environment.

An environment owns the tools of one task family and the reward. The agent loop calls

    env.reset(task)                 # a fresh episode for one prompt
    obs = env.step(action)          # run one parsed action; obs.text goes back to the model
    r = env.reward(episode)         # the trajectory's terminal reward, in [0, 1]

and, to continue from a prefix of an episode (method §3), ``env.snapshot()`` after each step and
``env.restore(snapshot)`` on a *fresh* instance. :class:`ReplayEnvironment` implements both by
deterministic replay of the prefix's actions — always correct for deterministic tools, at the
cost of re-running them; environments whose state is cheap to copy override the pair.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Task:
    """One prompt: what the model is asked and what the environment needs to score it."""

    id: str  # unique prompt id
    question: str  # the user message
    answer: Any = None  # reference answer(s) for the reward
    metadata: dict[str, Any] = field(default_factory=dict)  # task-specific extras (initial state, ...)


@dataclass(frozen=True)
class Action:
    """What the model wrote in one turn, parsed."""

    raw: str  # the model-written text of the turn (thought + action)
    tool: str | None = None  # tool name of a well-formed tool call
    arguments: dict[str, Any] = field(default_factory=dict)  # its arguments
    final_answer: str | None = None  # set when the turn gives the final answer
    error: str | None = None  # why the action could not be parsed (malformed), else None


@dataclass(frozen=True)
class Observation:
    """What the environment answers to one action."""

    text: str  # returned to the model inside <tool_response> (empty when done)
    done: bool = False  # the episode is over (final answer, or the environment says so)
    tool_error: bool = False  # the action was malformed or the tool failed


@dataclass
class Episode:
    """What :meth:`Environment.reward` sees: the actions of one trajectory, root to leaf."""

    task: Task
    actions: list[Action]
    observations: list[Observation]

    @property
    def final_answer(self) -> str | None:
        for a in reversed(self.actions):
            if a.final_answer is not None:
                return a.final_answer
        return None


@runtime_checkable
class Environment(Protocol):
    """One episode's tools and reward. A new instance per concurrently running trajectory."""

    def tool_descriptions(self) -> list[dict[str, Any]]:
        """JSON-schema function descriptions put in the system prompt."""
        ...

    def reset(self, task: Task) -> None:
        """Start a fresh episode for ``task``."""
        ...

    def step(self, action: Action) -> Observation:
        """Execute one action. A malformed one (``action.error``) gets an error observation."""
        ...

    def reward(self, episode: Episode) -> float:
        """Terminal reward of a finished trajectory, in [0, 1]."""
        ...

    def snapshot(self) -> Any:
        """A token that lets a fresh instance stand where this one stands now."""
        ...

    def restore(self, snapshot: Any) -> None:
        """Stand at ``snapshot`` (taken from any instance of the same class)."""
        ...


class ReplayEnvironment:
    """Base class: snapshot = the task and the actions so far; restore = reset + replay.

    Subclasses implement :meth:`_reset`, :meth:`_execute` and :meth:`reward`; replay requires
    ``_execute`` to be deterministic given the same sequence of actions."""

    def __init__(self) -> None:
        self._task: Task | None = None
        self._actions: list[Action] = []

    def tool_descriptions(self) -> list[dict[str, Any]]:
        return []

    def reset(self, task: Task) -> None:
        self._task = task
        self._actions = []
        self._reset(task)

    def step(self, action: Action) -> Observation:
        if self._task is None:
            raise ValueError("step() before reset(): the environment has no episode")
        self._actions.append(action)
        return self._execute(action)

    def snapshot(self) -> tuple[Task, tuple[Action, ...]]:
        if self._task is None:
            raise ValueError("snapshot() before reset()")
        return (self._task, tuple(self._actions))

    def restore(self, snapshot: tuple[Task, Sequence[Action]]) -> None:
        task, actions = snapshot
        self.reset(task)
        for action in actions:
            self.step(action)

    # -- to implement
    def _reset(self, task: Task) -> None:
        pass

    def _execute(self, action: Action) -> Observation:
        raise NotImplementedError

    def reward(self, episode: Episode) -> float:
        raise NotImplementedError


@dataclass(frozen=True)
class FixedTurnsConfig:
    """The synthetic ``fixed-turns`` task family (for tests): how many tasks, how many turns each."""

    turns: int = 3  # turns per episode
    prompts: int = 64  # number of synthetic prompts

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise ValueError(f"fixed_turns.turns must be >= 1, got {self.turns}")
        if self.prompts < 1:
            raise ValueError(f"fixed_turns.prompts must be >= 1, got {self.prompts}")


class FixedTurnsEnvironment(ReplayEnvironment):
    """Test environment: every episode lasts exactly ``num_turns`` turns, whatever is written.

    A random tiny model writes no valid action, yet its trees still need anchors: here every turn
    counts (malformed or not), the observation echoes the turn number, and the reward is a
    deterministic coin flip on the trajectory's text, so trees hold both outcomes."""

    def __init__(self, num_turns: int = 3, success_rate: float = 0.5) -> None:
        super().__init__()
        if num_turns < 1:
            raise ValueError(f"num_turns must be >= 1, got {num_turns}")
        if not 0.0 <= success_rate <= 1.0:
            raise ValueError(f"success_rate must be in [0, 1], got {success_rate}")
        self.num_turns = num_turns
        self.success_rate = success_rate

    def tool_descriptions(self) -> list[dict[str, Any]]:
        return [{"type": "function", "function": {"name": "noop", "description": "Does nothing.",
                                                  "parameters": {"type": "object", "properties": {}}}}]

    def _execute(self, action: Action) -> Observation:
        turn = len(self._actions)
        done = turn >= self.num_turns
        return Observation(text="" if done else f"turn {turn} of {self.num_turns}", done=done,
                           tool_error=action.error is not None)

    def reward(self, episode: Episode) -> float:
        text = "\x1f".join(a.raw for a in episode.actions)
        digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64
        return 1.0 if digest < self.success_rate else 0.0


# ---------------------------------------------------------------------------- action format
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def parse_action(text: str) -> Action:
    """Parse one model turn: ``<answer>…</answer>`` ends the episode; otherwise exactly one
    ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` (Qwen's format); anything else is a
    malformed action whose ``error`` says what is wrong (the episode goes on)."""
    answer = ANSWER.search(text)
    if answer:
        return Action(raw=text, final_answer=answer.group(1).strip())
    calls = TOOL_CALL.findall(text)
    if not calls:
        return Action(raw=text, error="no <tool_call>…</tool_call> and no <answer>…</answer> found")
    try:
        call = json.loads(calls[0])
    except json.JSONDecodeError as err:
        return Action(raw=text, error=f"the tool call is not valid JSON ({err.msg} at char {err.pos})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return Action(raw=text, error='the tool call must be an object with a string "name"')
    args = call.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return Action(raw=text, error='"arguments" must be a JSON object')
    if not isinstance(args, dict):
        return Action(raw=text, error='"arguments" must be a JSON object')
    return Action(raw=text, tool=call["name"], arguments=args)
