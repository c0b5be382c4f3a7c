"""Scripted experts: the turns a competent agent would write for an embedded task, with errors.

An expert turns one :class:`~trace_core.rollout.env.Task` into a :class:`Script`: per turn, the
model-written text (a short thought, then ``<tool_call>{...}</tool_call>`` or
``<answer>...</answer>``, the fixed tool contract) and the tool's observation. With probability
``epsilon`` each step is corrupted independently, as a careless agent would corrupt it:

* math — turn 1 calls ``python`` with the problem's ``solution_code``; corrupted: one digit of one
  number literal changed (the observation is then the wrong program's output). Turn 2 answers
  ``\\boxed{<printed value>}``; corrupted: one digit of the value changed.
* fc — BFCL's ground-truth calls, one per turn, each user turn closed by ``<answer>``; corrupted:
  the user turn is closed early, before the call (see :class:`FCExpert`).
* qa — one ``search`` per hop, the query being the hop entity's name and the fact wanted
  (``"Nivia Thondre employer"``); corrupted: another entity of the same kind is searched, and the
  expert then follows the relation from *that* entity (a coherent but wrong trail through the
  knowledge base). The last turn answers with the attribute as the last passage writes it;
  corrupted: another entity's value for that attribute.

Observations come from cheap stand-ins of the tools (:mod:`trace_core.warmstart.tools`) or, when
an ``env`` is passed, from the real environment (``env.reset(task)``, then ``env.step`` of each
parsed turn), which reproduces the rollout byte for byte at the tools' cost. Correctness is the
environment's own reward function.

A script records which steps were corrupted and whether its final answer is right, so the error
rate of a demonstration set can be measured and wrong demonstrations kept apart if wanted.
Draws come from :class:`~trace_core.data.hashing.HashRng` keyed by ``(seed, task id, draw)``, so a
script depends on nothing but its task and seed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trace_core.data.hashing import HashRng
from trace_core.envs.math_env import answer_is_correct
from trace_core.envs.qa_env import answers_of, exact_match
from trace_core.rollout.env import Environment, Task, parse_action
from trace_core.warmstart.tools import PassageSearch, TrustedCodeError, run_trusted_python

_NUMBER_LITERAL = re.compile(r"(?<![\w.])\d+(?![\w.])")
_UNIT = 1 << 53


@dataclass(frozen=True)
class ExpertStep:
    """One expert turn: what the model writes, what it means, and what the tool answers."""

    text: str  # the model-written text: thought, then the action (ends with </tool_call> or </answer>)
    observation: str | None  # the tool's output; None on the final-answer turn
    tool: str | None = None  # the intended tool call's name (None on the final turn)
    arguments: dict[str, Any] = field(default_factory=dict)  # the intended call's arguments
    final_answer: str | None = None  # the intended final answer (the text inside <answer>)
    corrupted: bool = False  # the error injector changed this step


@dataclass(frozen=True)
class Script:
    """An expert episode for one task."""

    task: Task
    steps: tuple[ExpertStep, ...]
    correct: bool  # the final answer passes the task's check

    @property
    def corrupted_steps(self) -> int:
        return sum(s.corrupted for s in self.steps)


class Expert(Protocol):
    """Writes a (possibly corrupted) script for one task."""

    task_name: str

    def script(self, task: Task, epsilon: float, seed: int = 0, env: Environment | None = None) -> Script:
        """``env``: take observations from this environment instead of the cheap stand-ins."""
        ...


def tool_call_text(thought: str, name: str, arguments: dict[str, Any]) -> str:
    """A tool-call turn in Qwen's layout: thought, newline, the JSON call between the markers."""
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{thought}\n<tool_call>\n{call}\n</tool_call>"


def answer_text(thought: str, answer: str) -> str:
    return f"{thought}\n<answer>{answer}</answer>"


def _check_epsilon(epsilon: float) -> None:
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")


class _Observer:
    """Observations from a real environment (reset on the task) or from a stand-in function."""

    def __init__(self, task: Task, env: Environment | None, standin: Callable[[str], str]) -> None:
        self.env, self.standin = env, standin
        if env is not None:
            env.reset(task)

    def __call__(self, text: str, argument: str) -> str:
        if self.env is None:
            return self.standin(argument)
        return self.env.step(parse_action(text)).text


def _coin(rng: HashRng, p: float) -> bool:
    return rng.randint(0, _UNIT - 1) < p * _UNIT


def change_one_digit(text: str, rng: HashRng, span: tuple[int, int] | None = None) -> str:
    """``text`` with one digit (inside ``span`` if given) replaced by a different digit; a leading
    digit of a number never becomes 0."""
    lo, hi = span if span is not None else (0, len(text))
    positions = [i for i in range(lo, hi) if text[i].isdigit()]
    if not positions:
        raise ValueError(f"no digit to change in {text[lo:hi]!r}")
    i = rng.choice(positions)
    leading = i == 0 or not text[i - 1].isdigit()
    choices = [d for d in ("123456789" if leading else "0123456789") if d != text[i]]
    return text[:i] + rng.choice(choices) + text[i + 1 :]


# ------------------------------------------------------------------------------------------- math
class MathExpert:
    """Calls ``python`` with the problem's ``solution_code``, then boxes the printed value.

    A chained problem (``metadata["solution_steps"]``, :mod:`trace_core.data.chains`) is solved one
    call per part instead: part k's program with ``{prev}`` replaced by what part k − 1 printed,
    so each later call copies a tool result, as an agent working step by step would. Corruption
    (``epsilon``) applies to the first call and to the answer, as for a one-call problem.

    ``run_code`` maps code to the observation text; the default runs the (trusted) code in-process
    (:func:`~trace_core.warmstart.tools.run_trusted_python`); pass a sandbox-backed one to reproduce
    the real tool byte for byte.
    """

    task_name = "math"
    THOUGHT_CALL = "I will compute this with Python."
    THOUGHT_ANSWER = "The program printed the answer."
    THOUGHT_NEXT = "I will use that result in the next part."

    def __init__(self, run_code: Callable[[str], str] = run_trusted_python, max_attempts: int = 20) -> None:
        self.run_code = run_code
        self.max_attempts = max_attempts

    def script(self, task: Task, epsilon: float, seed: int = 0, env: Environment | None = None) -> Script:
        _check_epsilon(epsilon)
        code, *later_steps = self._programs(task)
        rng = HashRng(f"{seed}/warmstart/math/{task.id}")
        bad_code = _coin(rng, epsilon)
        if bad_code:
            code = self._corrupt_code(task, code, rng)
        text = tool_call_text(self.THOUGHT_CALL, "python", {"code": code})
        observe = _Observer(task, env, self.run_code)
        output = observe(text, code)
        calls = [ExpertStep(text, output, tool="python", arguments={"code": code}, corrupted=bad_code)]
        for later in later_steps:
            code = later.replace("{prev}", output.strip())
            text = tool_call_text(self.THOUGHT_NEXT, "python", {"code": code})
            output = observe(text, code)
            calls.append(ExpertStep(text, output, tool="python", arguments={"code": code}))
        value = output.strip()
        bad_answer = _coin(rng, epsilon) and any(ch.isdigit() for ch in value)
        if bad_answer:
            value = change_one_digit(value, rng)
        final = f"\\boxed{{{value}}}"
        answer = ExpertStep(answer_text(self.THOUGHT_ANSWER, final), None, final_answer=final, corrupted=bad_answer)
        return Script(task, (*calls, answer), answer_is_correct(final, task))

    @staticmethod
    def _programs(task: Task) -> list[str]:
        """The programs the expert runs: a chained problem's parts, else its one ``solution_code``."""
        steps = task.metadata.get("solution_steps")
        if steps is not None:
            if not (isinstance(steps, list) and steps and all(isinstance(c, str) and c.strip() for c in steps)):
                raise ValueError(f"math task {task.id!r}: metadata['solution_steps'] must be a non-empty "
                                 "list of programs")
            return list(steps)
        code = task.metadata.get("solution_code")
        if not isinstance(code, str) or not code.strip():
            raise ValueError(f"math task {task.id!r}: metadata['solution_code'] must be a non-empty string")
        return [code]

    def _corrupt_code(self, task: Task, code: str, rng: HashRng) -> str:
        """One digit of one literal changed, such that the program still runs (checked in-process)."""
        literals = [m.span() for m in _NUMBER_LITERAL.finditer(code)]
        if not literals:
            raise ValueError(f"math task {task.id!r}: solution_code has no number literal to corrupt")
        for _ in range(self.max_attempts):
            candidate = change_one_digit(code, rng, rng.choice(literals))
            try:
                run_trusted_python(candidate)
                return candidate
            except TrustedCodeError:
                continue  # e.g. a zero determinant: draw another corruption
        raise ValueError(f"math task {task.id!r}: no runnable corruption in {self.max_attempts} attempts")


# --------------------------------------------------------------------------------------------- qa
@dataclass(frozen=True)
class KBEntity:
    id: str
    kind: str
    name: str
    attrs: Mapping[str, Any]


def load_kb(path: str | Path) -> dict[str, KBEntity]:
    """The knowledge base written by the data generator (``data/qa/kb.json``), by entity id."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"knowledge-base file {path} does not exist")
    data = json.loads(path.read_text(encoding="utf-8"))
    return {e["id"]: KBEntity(e["id"], e["kind"], e["name"], e["attrs"]) for e in data["entities"]}


# The fact a query asks for, as a retriever-friendly word (the knowledge base's attribute names).
RELATION_WORDS = {
    "alma_mater": "university",
    "ceo": "chief executive",
    "birth_year": "birth year",
}


class QAExpert:
    """Searches each hop's entity by name and answers from the last passage (module docstring)."""

    task_name = "qa"
    THOUGHT_FIRST = "I will look up the entity named in the question."
    THOUGHT_NEXT = "The passage names the next entity. I will look it up."
    THOUGHT_ANSWER = "The passage gives the answer."

    def __init__(self, kb: Mapping[str, KBEntity], search: PassageSearch) -> None:
        if not kb:
            raise ValueError("kb must not be empty")
        self.kb = dict(kb)
        self.search = search
        self._by_kind: dict[str, list[KBEntity]] = {}
        for e in sorted(self.kb.values(), key=lambda e: e.id):
            self._by_kind.setdefault(e.kind, []).append(e)

    def value_text(self, entity: KBEntity, attr: str) -> str:
        """An attribute as its passage writes it: a related entity's name, a population with commas."""
        value = entity.attrs[attr]
        if isinstance(value, str) and value in self.kb:
            return self.kb[value].name
        if attr == "population":
            return f"{int(value):,}"
        return str(value)

    def script(self, task: Task, epsilon: float, seed: int = 0, env: Environment | None = None,
               corrupt_at: int | None = None) -> Script:
        """``corrupt_at``: corrupt exactly this step (0 .. hops − 1: that hop's search; hops: the
        answer) and no other, instead of drawing each with probability ``epsilon``."""
        _check_epsilon(epsilon)
        path = task.metadata.get("path")
        if not isinstance(path, list) or not path:
            raise ValueError(f"qa task {task.id!r}: metadata['path'] must be a non-empty list of hops")
        if corrupt_at is not None and not 0 <= corrupt_at <= len(path):
            raise ValueError(f"qa task {task.id!r}: corrupt_at must be in [0, {len(path)}], got {corrupt_at}")

        def corrupted(step: int) -> bool:
            return _coin(rng, epsilon) if corrupt_at is None else step == corrupt_at

        rng = HashRng(f"{seed}/warmstart/qa/{task.id}")
        start = path[0]["entity_id"]
        if start not in self.kb:
            raise ValueError(f"qa task {task.id!r}: entity {start!r} is not in the knowledge base")
        current = self.kb[start]
        observe = _Observer(task, env, self.search.observation)
        steps = []
        for i, hop in enumerate(path):
            target = current
            bad = corrupted(i)
            if bad:
                others = [e for e in self._by_kind[current.kind] if e.id != current.id]
                target = rng.choice(others) if others else current
            thought = self.THOUGHT_FIRST if i == 0 else self.THOUGHT_NEXT
            relation = hop["relation"]
            query = f"{target.name} {RELATION_WORDS.get(relation, relation.replace('_', ' '))}"
            text = tool_call_text(thought, "search", {"query": query})
            steps.append(ExpertStep(text, observe(text, query), tool="search", arguments={"query": query},
                                    corrupted=bad))
            if relation not in target.attrs:
                raise ValueError(f"qa task {task.id!r}: entity {target.id!r} has no attribute {relation!r}")
            if i < len(path) - 1:
                current = self.kb[target.attrs[relation]]
            else:
                current = target
        relation = path[-1]["relation"]
        answer = self.value_text(current, relation)
        bad = corrupted(len(path))
        if bad:
            wrong = sorted({self.value_text(e, relation) for e in self._by_kind[current.kind]} - {answer})
            if wrong:
                answer = rng.choice(wrong)
            else:
                bad = False
        steps.append(ExpertStep(answer_text(self.THOUGHT_ANSWER, answer), None, final_answer=answer, corrupted=bad))
        return Script(task, tuple(steps), exact_match(answer, answers_of(task)) == 1.0)


# --------------------------------------------------------------------------------------------- fc
class FCExpert:
    """Replays a BFCL entry's ground-truth calls, one call per turn, each user turn closed by an answer.

    Observations always come from a real :class:`~trace_core.envs.fc_env.FCEnvironment` (BFCL's
    backends run in-process and cost microseconds, so there is no stand-in); the answer that closes
    a user turn is followed by the next user message, as in a rollout. Corrupted (probability
    ``epsilon`` per call): the user turn is closed early, before that call and the rest of the
    turn's calls, as a careless agent that thinks it is done would; the closing answer is the
    corrupted step. Correctness is BFCL's multi-turn checker.
    """

    task_name = "fc"
    THOUGHT_CALL = "I will call the function."
    THOUGHT_ANSWER = "The request is done."
    ANSWER = "Done."

    def __init__(self, config: Any = None) -> None:
        self.config = config  # FCEnvConfig of the environment the observations come from (None: default)

    def script(self, task: Task, epsilon: float, seed: int = 0, env: Environment | None = None) -> Script:
        from trace_core.envs.fc_env import FCEnvironment, ground_truth_tool_calls

        _check_epsilon(epsilon)
        rng = HashRng(f"{seed}/warmstart/fc/{task.id}")
        env = env if env is not None else FCEnvironment(task, self.config)
        if not isinstance(env, FCEnvironment):
            raise ValueError(f"fc task {task.id!r}: the expert needs an FCEnvironment, got {type(env).__name__}")
        env.reset(task)
        turns = ground_truth_tool_calls(task)
        steps: list[ExpertStep] = []
        for i, calls in enumerate(turns):
            early = False
            for call in calls:
                if _coin(rng, epsilon):
                    early = True
                    break
                text = tool_call_text(self.THOUGHT_CALL, call["name"], call["arguments"])
                steps.append(ExpertStep(text, env.step(parse_action(text)).text, tool=call["name"],
                                        arguments=call["arguments"]))
            text = answer_text(self.THOUGHT_ANSWER, self.ANSWER)
            observation = env.step(parse_action(text))
            last = i == len(turns) - 1
            steps.append(ExpertStep(text, None if last else observation.text,
                                    final_answer=self.ANSWER if last else None, corrupted=early))
        return Script(task, tuple(steps), bool(env.check().get("valid")))
