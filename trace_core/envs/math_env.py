"""Math environment: a stateful sandboxed ``python`` tool and a final-answer equivalence reward.

Turn format (shared with the warm-start demonstrations)::

    <tool_call>{"name": "python", "arguments": {"code": "x = 6390 * 27\\nprint(x)"}}</tool_call>
    <answer>\\boxed{172530}</answer>        (a bare value, <answer>172530</answer>, also counts)

The observation of a ``python`` call is the sandbox's text: the cell's stdout and stderr (the
value of a final bare expression is echoed, as in a notebook), then one bracketed line per limit
that stopped it, cut at ``max_observation_chars``. Variables persist across the episode's turns;
a cell that was stopped (time, memory, output, crash) leaves them as they were. The tool runs in
:class:`~trace_core.envs.sandbox.PythonSandbox` (namespaces, dropped uid, limits) and keeps its
state by replay (:class:`~trace_core.envs.sandbox.PythonToolSession`), so the environment's
snapshot is plain data — the task and the completed cells — restorable on any instance, in any
process, as often as a prefix is expanded.

Reward (:func:`answer_is_correct`): 1 when the final answer is equivalent to any reference answer,
else 0. The answer is the content of the last ``\\boxed{…}`` in ``<answer>`` (or the whole answer
when there is none); both it and the reference are parsed by ``math_verify`` (HuggingFace's
maintained checker) and compared with its ``verify``. What that accepts, with its defaults:

- exact forms agree whatever their spelling: ``7/3``, ``\\frac{7}{3}``, ``\\dfrac73``;
  ``3175`` and ``3,175``; ``1/2`` and ``0.5``;
- a decimal matches a fraction when they agree after rounding to 6 decimal places
  (``float_rounding=6``): ``2.333333`` and ``2.3333333333`` match ``7/3``, ``2.3333`` and
  ``2.33`` do not — a truncated decimal is a wrong answer;
- symbolic answers compare as sympy expressions (``x+1`` = ``1+x``).

When math_verify parses nothing from either side, a restricted sympy comparison decides (plain
arithmetic over numbers, one-letter symbols and a few functions; anything else counts as wrong,
since parsing model text with sympy means ``eval``). A multiple-choice task (``choices`` in its
metadata) is right when the answer's option letter equals the reference letter.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trace_core.envs.common import SingleToolEnvironment, function_tool, truncate
from trace_core.envs.sandbox import PythonSandbox, PythonToolSession, SandboxConfig, ToolSnapshot
from trace_core.rollout.env import Episode, Observation, Task

PYTHON_TOOL = function_tool(
    "python",
    "Run Python code in a sandbox and return what it prints (the value of a final bare expression is "
    "shown too). Variables persist between calls within the task; numpy and sympy are available; no "
    "network, no files outside the working directory.",
    {"code": {"type": "string", "description": "The Python code to execute."}},
    ["code"],
)


@dataclass(frozen=True)
class MathEnvConfig:
    """The math environment's tool limits and observation size."""

    sandbox: SandboxConfig = field(default_factory=SandboxConfig)  # limits of every python cell
    max_observation_chars: int = 2000  # the tool's text is cut here before the model reads it
    # Replayed cells get this multiple of the time the host measured them to take (each cut at its
    # cell limits); nothing the sandboxed code reports can raise it.
    replay_time_factor: float = 2.0
    replay_slack_seconds: float = 0.5  # ... plus this, so a loaded machine does not time out a prefix

    def __post_init__(self) -> None:
        if self.max_observation_chars < 1:
            raise ValueError(f"max_observation_chars must be >= 1, got {self.max_observation_chars}")
        if not (math.isfinite(self.replay_time_factor) and self.replay_time_factor >= 1.0):
            raise ValueError(f"replay_time_factor must be a finite number >= 1, got {self.replay_time_factor}")
        if not (math.isfinite(self.replay_slack_seconds) and self.replay_slack_seconds >= 0):
            raise ValueError(
                f"replay_slack_seconds must be a finite number >= 0, got {self.replay_slack_seconds}"
            )


@dataclass(frozen=True)
class MathSnapshot:
    """Where a math episode stands: the task and the python cells that completed, in order."""

    task: Task
    tool: ToolSnapshot

    def to_json(self) -> dict[str, Any]:
        t = self.task
        return {"task": {"id": t.id, "question": t.question, "answer": t.answer, "metadata": t.metadata},
                "tool": self.tool.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MathSnapshot:
        return cls(Task(**data["task"]), ToolSnapshot.from_json(data["tool"]))


class MathEnvironment(SingleToolEnvironment):
    """The ``python`` tool of one math episode and its reward (see the module docstring).

    ``sandbox`` is shared by all instances (it is thread-safe and verified once)."""

    tool = PYTHON_TOOL

    def __init__(self, sandbox: PythonSandbox, config: MathEnvConfig | None = None) -> None:
        super().__init__()
        self.sandbox = sandbox
        self.config = config or MathEnvConfig()
        self._session: PythonToolSession | None = None

    def _start(self, task: Task) -> None:
        self._session = PythonToolSession(self.sandbox, self.config.replay_time_factor,
                                          self.config.replay_slack_seconds)

    def _call(self, code: str) -> Observation:
        assert self._session is not None
        text = self._session.run(code)
        result = self._session.last_result
        failed = result is None or not result.completed or result.error is not None
        return Observation(text=truncate(text, self.config.max_observation_chars), tool_error=failed)

    def reward(self, episode: Episode) -> float:
        return 1.0 if answer_is_correct(episode.final_answer, episode.task) else 0.0

    def metrics(self, episode: Episode) -> dict[str, float]:
        """Per-trajectory numbers for logging: correctness, whether it answered, tool use."""
        calls = [a for a in episode.actions if a.tool is not None]
        return {
            "correct": self.reward(episode),
            "answered": float(episode.final_answer is not None),
            "tool_calls": float(len(calls)),
            "tool_errors": float(sum(o.tool_error for o in episode.observations)),
        }

    def snapshot(self) -> MathSnapshot:
        if self._task is None or self._session is None:
            raise ValueError("snapshot() before reset()")
        return MathSnapshot(self._task, self._session.snapshot())

    def restore(self, snapshot: MathSnapshot | dict[str, Any]) -> None:
        if isinstance(snapshot, dict):
            snapshot = MathSnapshot.from_json(snapshot)
        if not isinstance(snapshot, MathSnapshot):
            raise ValueError(f"restore expects a MathSnapshot (or its JSON), got {type(snapshot).__name__}")
        self.reset(snapshot.task)
        assert self._session is not None
        self._session.restore(snapshot.tool)


# ------------------------------------------------------------------------------------------ answer checking
def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` (or ``\\fbox{…}``) in ``text``, braces balanced; None if none."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    start = starts[-1]
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i].strip()
    return None  # unbalanced: treat as no answer


def final_answer_text(answer: str) -> str:
    """What is graded of an ``<answer>``: its last boxed content, else the whole answer."""
    boxed = last_boxed(answer)
    return (boxed if boxed is not None else answer).strip()


def _references(task: Task) -> list[str]:
    ref = task.answer
    if isinstance(ref, str):
        return [ref]
    if isinstance(ref, Sequence) and all(isinstance(r, str) for r in ref) and ref:
        return list(ref)
    raise ValueError(f"task {task.id!r}: answer must be a string or a non-empty list of strings, got {ref!r}")


def answer_is_correct(answer: str | None, task: Task) -> bool:
    """True when ``answer`` (the ``<answer>`` content) matches any reference of ``task``."""
    references = _references(task)
    if answer is None:
        return False
    choices = task.metadata.get("choices") or []
    if choices:
        return choice_letter(answer, len(choices)) == references[0].strip().upper()
    predicted = final_answer_text(answer)
    if not predicted:
        return False
    return any(math_equal(predicted, ref) for ref in references)


_LETTER = re.compile(r"^\(?([A-Za-z])\)?[.:)]?(?:\s|$)")


def choice_letter(answer: str, n_choices: int) -> str | None:
    """The option letter an answer gives (``B``, ``(B)``, ``\\boxed{B}``, ``B. text``), or None."""
    text = final_answer_text(answer).replace("\\text{", "").replace("}", "").strip()
    match = _LETTER.match(text)
    if not match:
        return None
    letter = match.group(1).upper()
    return letter if ord(letter) - ord("A") < n_choices else None


def math_equal(predicted: str, reference: str) -> bool:
    """Equivalence of two final answers (strings without ``\\boxed``), per the module docstring."""
    from math_verify import parse, verify

    # math_verify's timeouts use SIGALRM, which only the main thread may set; elsewhere it runs
    # without one (the answers are short and our sympy fallback is restricted).
    main = threading.current_thread() is threading.main_thread()
    timeout = 5 if main else None
    gold = parse(f"\\boxed{{{reference}}}", parsing_timeout=timeout)
    pred = parse(f"\\boxed{{{predicted}}}", parsing_timeout=timeout)
    if gold and pred:
        return bool(verify(gold, pred, timeout_seconds=timeout))
    return _sympy_equal(predicted, reference)


_SAFE_CHARS = re.compile(r"[0-9A-Za-z+\-*/^()., ]+")
_SAFE_NAMES = ("sqrt", "pi", "exp", "log", "sin", "cos", "tan", "E")


def _sympy_expr(text: str) -> Any:
    """A sympy expression of plain arithmetic ``text``, or None when it is anything else.

    ``parse_expr`` evaluates Python, so only numbers, one-letter symbols, + - * / ^ and the
    functions of ``_SAFE_NAMES`` pass; at most one power (a tower like 9^9^9 would never finish)."""
    import sympy
    from sympy.parsing.sympy_parser import convert_xor, parse_expr, standard_transformations

    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text.strip())  # thousands separators
    if not text or len(text) > 200 or not _SAFE_CHARS.fullmatch(text) or "__" in text:
        return None
    if text.count("^") + text.count("**") > 1:
        return None
    names = set(re.findall(r"[A-Za-z]+", text))
    if any(len(n) > 1 and n not in _SAFE_NAMES for n in names):
        return None
    global_dict: dict[str, Any] = {k: getattr(sympy, k) for k in ("Integer", "Float", "Rational", "Symbol",
                                                                   *_SAFE_NAMES)}
    global_dict["__builtins__"] = {}
    local_dict = {n: sympy.Symbol(n) for n in names if len(n) == 1 and n != "E"}
    try:
        return parse_expr(text, local_dict=local_dict, global_dict=global_dict,
                          transformations=(*standard_transformations, convert_xor))
    except Exception:  # noqa: BLE001 - any parse failure means "not an expression we accept"
        return None


def _sympy_equal(predicted: str, reference: str) -> bool:
    import sympy

    a, b = _sympy_expr(predicted), _sympy_expr(reference)
    if a is None or b is None:
        return False
    try:
        diff = sympy.simplify(a - b)
        if diff == 0:
            return True
        if not diff.free_symbols:
            return abs(complex(sympy.N(diff))) < 1e-9
    except Exception:  # noqa: BLE001 - an expression sympy cannot compare is not a match
        return False
    return False


def make_sandbox(config: MathEnvConfig) -> PythonSandbox:
    """The shared sandbox of a math environment factory (runs its isolation self-test once)."""
    return PythonSandbox(config.sandbox)
