"""Function-calling environment: BFCL v4 multi-turn, on bfcl-eval's executable backends and checker.

An episode is one BFCL entry. The task's question is the first user turn; the tools are the
function docs of the entry's involved classes (``bfcl_eval/data/multi_turn_func_doc``), in the
OpenAI schema BFCL itself sends (types cast with BFCL's ``GORILLA_TO_OPENAPI``). Turn format
(shared with the warm-start demonstrations)::

    <tool_call>{"name": "cd", "arguments": {"folder": "document"}}</tool_call>
    <answer>Done: I moved the report.</answer>      (the reply that ends the current user turn)

- a tool call runs the function, with keyword arguments, on this episode's own backend instances
  (``GorillaFileSystem``, ``TwitterAPI``, … loaded from the entry's ``initial_config``); the
  observation is BFCL's execution result string (a dict as JSON, an exception as
  ``"Error during execution: …"``), cut at ``max_observation_chars``;
- ``<answer>`` ends the current user turn, as a text reply without calls ends a turn in BFCL's
  inference loop: the observation is the next user turn's message (not done); after the last
  turn the episode is done;
- missing-function entries (``missed_function: {"3": ["sort"]}``): as BFCL does, the held-out
  docs are removed from the tools at the start and given back at their turn, whose (empty) user
  message becomes BFCL's prompt-mode message — the new function docs as JSON lines, then
  "I have updated some more functions you can choose from. What about now?". A held-out
  function cannot be called before then (it is not a tool yet);
- ``excluded_function`` is ignored, as BFCL v4's own pipeline does (nothing in bfcl-eval reads
  it); ``FCEnvConfig.drop_excluded_functions`` removes those docs instead.

Reward: 1 when BFCL's ``multi_turn_checker`` accepts the per-turn call lists, else 0 — each call
is one step, as a model emitting one call per message would produce. The checker re-executes the
calls itself on fresh backends (state and response checks per turn). A trajectory that did not
reach the end of the last user turn scores 0, like BFCL's ``force_terminated``. The reward reads
the calls this instance recorded (restored prefixes included), not ``episode.actions``, which for
a continuation holds only the actions after its branch point.

State: snapshot = a deep copy of the backend instances plus the turn index, the calls per turn
and the tools offered; restore deep-copies again, so one snapshot can seed any number of
continuations (a copy costs well under 10 ms, even for long-context file systems). Deep copy
rather than replay because the backends seed their own ``random.Random`` and read the clock:
a copy carries their exact state.

The checker keeps backend instances in its module's globals, keyed by model name and entry id
(the checker's own design, not ours): every check here uses a fresh model name and deletes its instances afterwards.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trace_core.envs.common import invalid_action, tool_error, truncate
from trace_core.rollout.env import Action, Episode, Observation, Task

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class FCEnvConfig:
    """The function-calling environment's tool list and observation size."""

    max_observation_chars: int = 2000  # an execution result is cut here before the model reads it
    include_response_schema: bool = False  # keep BFCL's "response" schema in each tool (long prompts)
    drop_excluded_functions: bool = False  # remove the entry's excluded_function docs (BFCL v4 keeps them)

    def __post_init__(self) -> None:
        if self.max_observation_chars < 1:
            raise ValueError(f"max_observation_chars must be >= 1, got {self.max_observation_chars}")


# ------------------------------------------------------------------------------------------ BFCL pieces
@functools.cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's function docs of one backend class (``multi_turn_func_doc/<file>.json``)."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    from trace_core.data.bfcl import bfcl_data_dir

    if class_name not in MULTI_TURN_FUNC_DOC_FILE_MAPPING:
        raise ValueError(f"unknown BFCL class {class_name!r}; known: {sorted(MULTI_TURN_FUNC_DOC_FILE_MAPPING)}")
    path = bfcl_data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    with path.open(encoding="utf-8") as fh:
        return tuple(json.loads(line) for line in fh if line.strip())


def _cast_types(properties: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """BFCL's ``_cast_to_openai_type`` (model_handler/utils.py), which cannot be imported here
    without tree_sitter: Gorilla types -> OpenAPI types, floats flagged, nested schemas cast."""
    for value in properties.values():
        if "type" not in value:
            value["type"] = "string"
        else:
            var_type = value["type"]
            if var_type == "float":
                value["format"] = "float"
                value["description"] = value.get("description", "") + " This is a float type value."
            value["type"] = mapping.get(var_type, "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _cast_types(value["properties"], mapping)
            elif "items" in value:
                items = value["items"]
                items["type"] = mapping[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = mapping[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _cast_types(items["properties"], mapping)
    return properties


def to_openai_tool(doc: dict[str, Any], include_response_schema: bool = False) -> dict[str, Any]:
    """One BFCL function doc as the ``{"type": "function", "function": …}`` tool a chat template renders."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    item = copy.deepcopy(doc)
    item["parameters"]["type"] = "object"
    item["parameters"]["properties"] = _cast_types(item["parameters"].get("properties", {}), GORILLA_TO_OPENAPI)
    if not include_response_schema:
        item.pop("response", None)
    return {"type": "function", "function": item}


def backend_class(class_name: str) -> type:
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)


def load_backends(metadata: dict[str, Any]) -> dict[str, Any]:
    """Fresh backend instances of an entry, loaded from its initial_config as BFCL's executor does."""
    from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

    long_context = "long_context" in metadata["category"] or "composite" in metadata["category"]
    instances = {}
    for class_name in metadata["involved_classes"]:
        instance = backend_class(class_name)()
        if class_name not in STATELESS_CLASSES:
            config = copy.deepcopy(metadata["initial_config"].get(class_name, {}))
            instance._load_scenario(config, long_context=long_context)  # noqa: SLF001 - BFCL's loader
        instances[class_name] = instance
    return instances


def method_owners(instances: dict[str, Any]) -> dict[str, str]:
    """Public method name -> class name, later classes winning a clash (BFCL's executor rule)."""
    owners: dict[str, str] = {}
    for class_name, instance in instances.items():
        for name, _ in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                owners[name] = class_name
    return owners


def result_text(result: Any) -> str:
    """BFCL's rendering of a function's return value (multi_turn_utils.execute_multi_turn_func_call)."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """A call as BFCL's checker executes it: keyword arguments as Python literals
    (BFCL's ``convert_to_function_call``). Names and keys must be identifiers — the checker
    ``eval``s this string, and repr of JSON values is always a plain literal."""
    if not _IDENTIFIER.match(name) or not all(_IDENTIFIER.match(k) for k in arguments):
        raise ValueError(f"function and argument names must be identifiers: {name}({list(arguments)})")
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


def _metadata(task: Task) -> dict[str, Any]:
    md = task.metadata
    missing = [k for k in ("category", "turns", "initial_config", "involved_classes", "ground_truth") if k not in md]
    if missing:
        raise ValueError(f"task {task.id!r} is not a BFCL multi-turn task: metadata lacks {missing}")
    return md


def _held_out(md: dict[str, Any]) -> dict[int, list[str]]:
    return {int(turn): list(names) for turn, names in (md.get("missed_function") or {}).items()}


def initial_functions(task: Task, config: FCEnvConfig | None = None) -> list[str]:
    """Names of the functions offered at the start, in doc order (held-out ones removed)."""
    config = config or FCEnvConfig()
    md = _metadata(task)
    held = {n for names in _held_out(md).values() for n in names}
    excluded = set(md.get("excluded_function") or []) if config.drop_excluded_functions else set()
    names = [d["name"] for c in md["involved_classes"] for d in function_docs(c)]
    return [n for n in names if n not in held and n not in excluded]


def _doc(task: Task, name: str) -> dict[str, Any]:
    for class_name in _metadata(task)["involved_classes"]:
        for doc in function_docs(class_name):
            if doc["name"] == name:
                return doc
    raise ValueError(f"task {task.id!r}: no function doc named {name!r}")


def check_call_turns(task: Task, turns: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """BFCL's ``multi_turn_checker`` on per-turn calls; returns its result dict (``valid``, …).

    ``turns[i]`` holds turn ``i``'s calls, each either a call string (one call per step) or a
    list of call strings (one step with several calls)."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    md = _metadata(task)
    ground_truth = md["ground_truth"]
    if len(turns) != len(ground_truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error_message": f"{len(turns)} turns answered of {len(ground_truth)}"}
    decoded = [[[s] if isinstance(s, str) else list(s) for s in turn] for turn in turns]
    entry = {"id": task.id, "initial_config": md["initial_config"], "involved_classes": md["involved_classes"]}
    model_name = f"trace_{uuid.uuid4().hex}"
    try:
        return multi_turn_checker(decoded, ground_truth, entry, md["category"], model_name)
    finally:  # the checker caches instances in its module globals under this model name
        module_globals = vars(multi_turn_utils)
        for key in [k for k in module_globals if k.startswith(model_name)]:
            del module_globals[key]


def ground_truth_tool_calls(task: Task) -> list[list[dict[str, Any]]]:
    """Per user turn, the ground-truth calls as tool-call objects ``{"name", "arguments"}`` with
    keyword arguments only (positional ones in BFCL's ground truth, like ``sort('a.pdf')``, are
    named from the backend method's signature) — what an expert writes in ``<tool_call>``."""
    md = _metadata(task)
    classes = {c: backend_class(c) for c in md["involved_classes"]}
    owners: dict[str, type] = {}
    for cls in classes.values():
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction):
            if not name.startswith("_"):
                owners[name] = cls
    out = []
    for turn in md["ground_truth"]:
        calls = []
        for text in turn:
            node = ast.parse(text, mode="eval").body
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                raise ValueError(f"task {task.id!r}: ground truth {text!r} is not a plain function call")
            name = node.func.id
            if name not in owners:
                raise ValueError(f"task {task.id!r}: ground truth calls unknown function {name!r}")
            params = [p for p in inspect.signature(getattr(owners[name], name)).parameters if p != "self"]
            arguments = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
            arguments.update({kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg})
            calls.append({"name": name, "arguments": arguments})
        out.append(calls)
    return out


# ------------------------------------------------------------------------------------------ environment
@dataclass(frozen=True)
class FCSnapshot:
    """Where a BFCL episode stands (instances are a private deep copy; restore copies again)."""

    task: Task
    instances: dict[str, Any]
    turn: int
    calls: tuple[tuple[str, ...], ...]
    available: tuple[str, ...]
    done: bool = False


@dataclass
class _State:
    instances: dict[str, Any]
    owners: dict[str, str]
    turn: int = 0
    calls: list[list[str]] = field(default_factory=lambda: [[]])
    available: list[str] = field(default_factory=list)
    done: bool = False


class FCEnvironment:
    """One BFCL multi-turn episode (see the module docstring).

    ``task`` is needed before :meth:`reset` because the executor renders the prompt, tools
    included, before it resets the environment; the factory passes it."""

    def __init__(self, task: Task | None = None, config: FCEnvConfig | None = None) -> None:
        self.config = config or FCEnvConfig()
        self._task = task
        self._state: _State | None = None
        self.last_check: dict[str, Any] | None = None  # the checker's verdict of the last reward()

    # -- tools
    def tool_descriptions(self) -> list[dict[str, Any]]:
        if self._task is None:
            raise ValueError("FCEnvironment needs its task (constructor or reset) to list its tools")
        names = self._state.available if self._state is not None else initial_functions(self._task, self.config)
        return [self._tool(name) for name in names]

    def _tool(self, name: str) -> dict[str, Any]:
        assert self._task is not None
        return to_openai_tool(_doc(self._task, name), self.config.include_response_schema)

    # -- episode
    def reset(self, task: Task) -> None:
        md = _metadata(task)
        self._task = task
        instances = load_backends(md)
        self._state = _State(instances=instances, owners=method_owners(instances),
                             available=initial_functions(task, self.config))
        self._give_back_held_out(0)

    def _give_back_held_out(self, turn: int) -> list[str]:
        assert self._state is not None and self._task is not None
        added = [n for n in _held_out(self._task.metadata).get(turn, []) if n not in self._state.available]
        self._state.available.extend(added)
        return added

    def _user_message(self, turn: int, added: list[str]) -> str:
        from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC

        assert self._task is not None
        messages = self._task.metadata["turns"][turn]
        text = "\n".join(m["content"] for m in messages if m.get("role") == "user")
        if added:  # BFCL's prompt-mode message for a missing-function turn: the docs, then the note
            docs = "\n".join(json.dumps(self._tool(n)) for n in added)
            text = f"{docs}\n{DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC}" + (f"\n{text}" if text else "")
        return text

    def step(self, action: Action) -> Observation:
        if self._state is None or self._task is None:
            raise ValueError("step() before reset(): the environment has no episode")
        state = self._state
        if state.done:
            return Observation(text="", done=True)
        if action.final_answer is not None:
            state.turn += 1
            if state.turn >= len(self._task.metadata["turns"]):
                state.done = True
                return Observation(text="", done=True)
            state.calls.append([])
            added = self._give_back_held_out(state.turn)
            return Observation(text=self._user_message(state.turn, added))
        if action.error is not None:
            return invalid_action(action)
        name, arguments = action.tool or "", action.arguments
        if name not in state.available or name not in state.owners:
            return tool_error(f"unknown function {name!r}; call one of the listed tools.")
        try:
            call = call_string(name, arguments)
        except ValueError as err:
            return tool_error(str(err))
        state.calls[-1].append(call)
        instance = state.instances[state.owners[name]]
        try:
            text, failed = result_text(getattr(instance, name)(**arguments)), False
        except Exception as err:  # noqa: BLE001 - any backend failure is the model's observation
            text, failed = f"Error during execution: {err}", True
        failed = failed or text.startswith('{"error"')
        return Observation(text=truncate(text, self.config.max_observation_chars), tool_error=failed)

    # -- reward
    def call_turns(self) -> list[list[str]]:
        """The calls made so far, per user turn (the turns reached so far)."""
        if self._state is None:
            raise ValueError("call_turns() before reset()")
        return [list(t) for t in self._state.calls]

    def check(self) -> dict[str, Any]:
        """BFCL's verdict on this episode's calls (force-terminated unless every turn was answered)."""
        if self._state is None or self._task is None:
            raise ValueError("check() before reset()")
        if not self._state.done:
            n = len(self._task.metadata["turns"])
            return {"valid": False, "error_type": "multi_turn:force_terminated",
                    "error_message": f"the episode ended in user turn {self._state.turn + 1} of {n}"}
        return check_call_turns(self._task, self._state.calls)

    def reward(self, episode: Episode) -> float:
        if self._task is None or episode.task.id != self._task.id:
            raise ValueError("reward() scores this instance's own episode; the task ids differ")
        self.last_check = self.check()
        return 1.0 if self.last_check.get("valid") else 0.0

    def metrics(self, episode: Episode) -> dict[str, float]:
        """Success, user turns completed, and calls made (this instance's episode)."""
        reward = self.reward(episode)
        assert self._state is not None
        return {
            "success": reward,
            "turns_completed": float(self._state.turn),
            "calls": float(sum(len(t) for t in self._state.calls)),
        }

    # -- prefixes
    def snapshot(self) -> FCSnapshot:
        if self._state is None or self._task is None:
            raise ValueError("snapshot() before reset()")
        s = self._state
        return FCSnapshot(self._task, copy.deepcopy(s.instances), s.turn,
                          tuple(tuple(t) for t in s.calls), tuple(s.available), s.done)

    def restore(self, snapshot: FCSnapshot) -> None:
        if not isinstance(snapshot, FCSnapshot):
            raise ValueError(f"restore expects an FCSnapshot, got {type(snapshot).__name__}")
        instances = copy.deepcopy(snapshot.instances)
        self._task = snapshot.task
        self._state = _State(instances=instances, owners=method_owners(instances), turn=snapshot.turn,
                             calls=[list(t) for t in snapshot.calls], available=list(snapshot.available),
                             done=snapshot.done)

    def backend_state(self) -> dict[str, dict[str, Any]]:
        """The public attributes of each backend — what BFCL's state checker compares."""
        if self._state is None:
            raise ValueError("backend_state() before reset()")
        return {c: {k: v for k, v in vars(i).items() if not k.startswith("_")}
                for c, i in self._state.instances.items()}
