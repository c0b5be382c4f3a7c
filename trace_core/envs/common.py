"""Small pieces every task environment shares: observation truncation, error observations, and
the function schema of a tool in the chat template's format."""

from __future__ import annotations

from typing import Any

from trace_core.rollout.env import Action, Observation


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
