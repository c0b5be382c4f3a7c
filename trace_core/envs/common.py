"""Small pieces every task environment shares: observation truncation, error observations, the
function schema of a tool in the chat template's format, and :class:`SingleToolEnvironment`, the
step guard of an environment with one tool."""

from __future__ import annotations

from typing import Any, ClassVar

from trace_core.rollout.env import Action, Episode, Observation, Task


def truncate(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, with a note saying so (the note is extra)."""
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n[observation truncated: showing {max_chars} of {len(text)} characters]"


def invalid_action(action: Action) -> Observation:
    """The observation for a turn whose action could not be parsed (the episode goes on)."""
    return Observation(text=f"Invalid action: {action.error}.", tool_error=True)


def tool_error(message: str) -> Observation:
    return Observation(text=f"Error: {message}", tool_error=True)


def function_tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """One tool in the OpenAI/Qwen function-calling schema that chat templates render."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


class SingleToolEnvironment:
    """Base of an :class:`~trace_core.rollout.env.Environment` whose one tool takes one string
    argument (math's ``python``, QA's ``search``): it owns the task and the step guard, so a
    subclass writes only its tool.

    :meth:`step` ends the episode on a final answer, answers a malformed action, a call of another
    tool and a missing or blank argument with an error observation, and passes the argument of a
    well-formed call to :meth:`_call`. A subclass sets ``tool`` (a :func:`function_tool` with one
    required string argument) and implements :meth:`_call`, :meth:`reward`, :meth:`snapshot` and
    :meth:`restore`, and :meth:`_start` when an episode has state of its own::

        class SQLEnvironment(SingleToolEnvironment):
            tool = function_tool("query", "Run one read-only SQL query.",
                                 {"sql": {"type": "string", "description": "The query."}}, ["sql"])

            def _call(self, sql: str) -> Observation:
                return Observation(text=truncate(run_query(self.db, sql), 2000))

    The function-calling environment (many tools; an answer ends a user turn, not the episode)
    keeps its own step."""

    tool: ClassVar[dict[str, Any]]  # the one tool's schema, as :func:`function_tool` writes it

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        tool = getattr(cls, "tool", None)
        if tool is None:  # an intermediate base; its concrete subclasses name the tool
            return
        required = tool["function"]["parameters"]["required"]
        if len(required) != 1:
            raise TypeError(f"{cls.__name__}.tool must have exactly one required argument, got {required}")

    def __init__(self) -> None:
        self._task: Task | None = None

    @property
    def tool_name(self) -> str:
        return self.tool["function"]["name"]

    @property
    def argument(self) -> str:
        """The name of the tool's one argument."""
        return self.tool["function"]["parameters"]["required"][0]

    def tool_descriptions(self) -> list[dict[str, Any]]:
        return [self.tool]

    def reset(self, task: Task) -> None:
        self._task = task
        self._start(task)

    def step(self, action: Action) -> Observation:
        if self._task is None:
            raise ValueError("step() before reset(): the environment has no episode")
        if action.final_answer is not None:
            return Observation(text="", done=True)
        if action.error is not None:
            return invalid_action(action)
        if action.tool != self.tool_name:
            return tool_error(f"unknown tool {action.tool!r}; the only tool is {self.tool_name!r}.")
        value = action.arguments.get(self.argument)
        if not isinstance(value, str) or not value.strip():
            return tool_error(f'the {self.tool_name} tool needs a non-empty string argument "{self.argument}".')
        return self._call(value)

    # -- to implement
    def _start(self, task: Task) -> None:
        """Set up the episode's own state (``self._task`` is already ``task``)."""

    def _call(self, argument: str) -> Observation:
        """Run the tool on a well-formed call's argument (a non-blank string)."""
        raise NotImplementedError

    def reward(self, episode: Episode) -> float:
        raise NotImplementedError

    def snapshot(self) -> Any:
        raise NotImplementedError

    def restore(self, snapshot: Any) -> None:
        raise NotImplementedError
