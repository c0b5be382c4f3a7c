"""The task-family registry: what each family of tasks needs and how its environments are made.

A family is one kind of task the policy can be trained and evaluated on (math with a sandboxed
``python`` tool, multi-hop QA over a retriever, BFCL function calling, the synthetic
``fixed-turns`` tasks the tests train on). Each family says, once, here:

- the type of its environment settings (its section of :class:`~trace_core.envs.registry.EnvsConfig`);
- which shared resources its environments read: a retriever **index** built from a corpus of
  the data folder, a **sandbox** for model-written code;
- how to make its ``task -> Environment`` factory from its settings and those resources;
- for a synthetic family, the tasks it makes itself (it reads no data file);
- the per-answer metrics an evaluation reports beside success (QA: exact match and F1).

The trainer, the evaluator and the warm start ask the registry (:func:`get_family`) for what a
family needs instead of testing its name; a new family is one :func:`register_family` call::

    register_family(TaskFamily("toy", ToyConfig, lambda config, shared: lambda task: ToyEnv(config)))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trace_core.envs.fc_env import FCEnvConfig, FCEnvironment
from trace_core.envs.math_env import MathEnvConfig, MathEnvironment, make_sandbox
from trace_core.envs.qa_env import QAEnvConfig, QAEnvironment, answers_of, exact_match, f1_score
from trace_core.retrieval import Retriever
from trace_core.rollout.env import Environment, FixedTurnsConfig, FixedTurnsEnvironment, Task

if TYPE_CHECKING:
    from trace_core.envs.sandbox import PythonSandbox

EnvFactory = Callable[[Task], Environment]


@dataclass(frozen=True)
class SharedResources:
    """What a family's environments share, loaded once per factory; None fields are made by the
    family from its settings (an index loaded from ``index_dir``, a sandbox from its limits)."""

    retriever: Retriever | None = None  # an already loaded retriever (training and evaluation share one)
    index_dir: str | None = None  # where the family's index is, overriding its settings' own path
    sandbox: PythonSandbox | None = None  # an already verified sandbox


@dataclass(frozen=True)
class TaskFamily:
    """One task family (module docstring). ``make_factory(settings, shared)`` returns the
    family's ``task -> Environment`` (one fresh environment per trajectory, as the executor
    requires); ``settings`` is an instance of ``config_type``."""

    name: str  # the family's name: the data rows' ``task`` field and ``task.family`` in a run's config
    config_type: type  # the family's environment settings (a dataclass with defaults for every field)
    make_factory: Callable[[Any, SharedResources], EnvFactory]  # (settings, shared) -> task -> Environment
    section: str | None = None  # its attribute of EnvsConfig (None: the settings' defaults are used)
    index_corpus: str | None = None  # the corpus, under the data folder, its retriever index is built from
    sandboxed: bool = False  # its environments run model-written code (in the sandbox)
    synthetic_tasks: Callable[[Any], list[Task]] | None = None  # settings -> its own tasks (no data file)
    # (final answer, task) -> {name: value} for each of answer_metric_names, averaged per benchmark
    answer_metrics: Callable[[str | None, Task], dict[str, float]] | None = None
    answer_metric_names: tuple[str, ...] = ()  # what answer_metrics returns (an evaluation's extra columns)

    @property
    def needs_index(self) -> bool:
        return self.index_corpus is not None

    def settings(self, envs: Any) -> Any:
        """This family's settings: ``envs`` itself when it is of ``config_type``, else its section
        of an :class:`EnvsConfig` (the defaults when ``envs`` is None or has no such section)."""
        if isinstance(envs, self.config_type):
            return envs
        section = getattr(envs, self.section, None) if envs is not None and self.section else None
        if section is None:
            return self.config_type()
        if not isinstance(section, self.config_type):
            raise ValueError(f"settings of task family {self.name!r} must be {self.config_type.__name__}, "
                             f"got {type(section).__name__}")
        return section


_FAMILIES: dict[str, TaskFamily] = {}


def register_family(family: TaskFamily) -> TaskFamily:
    """Add ``family`` to the registry (a name already registered is refused)."""
    if not family.name or not isinstance(family.name, str):
        raise ValueError(f"a task family needs a non-empty name, got {family.name!r}")
    if family.name in _FAMILIES:
        raise ValueError(f"task family {family.name!r} is already registered")
    _FAMILIES[family.name] = family
    return family


def unregister_family(name: str) -> None:
    """Remove a registered family (for tests that register a toy one)."""
    _FAMILIES.pop(name, None)


def family_names() -> tuple[str, ...]:
    """Every registered family's name, in registration order."""
    return tuple(_FAMILIES)


def get_family(name: str) -> TaskFamily:
    """The registered family called ``name`` (a ValueError naming the registered ones otherwise)."""
    if name not in _FAMILIES:
        raise ValueError(f"task family {name!r} is not one of {', '.join(_FAMILIES)}")
    return _FAMILIES[name]


# ============================================================================ the built-in families
def _math_factory(config: MathEnvConfig, shared: SharedResources) -> EnvFactory:
    sandbox = shared.sandbox if shared.sandbox is not None else make_sandbox(config)
    return lambda task: MathEnvironment(sandbox, config)


def _qa_factory(config: QAEnvConfig, shared: SharedResources) -> EnvFactory:
    retriever = shared.retriever
    if retriever is None:
        retriever = Retriever.load(shared.index_dir or config.index_dir, model_path=config.model_path,
                                   device=config.device)
    return lambda task: QAEnvironment(retriever, config)


def _qa_answer_metrics(final: str | None, task: Task) -> dict[str, float]:
    gold = answers_of(task)
    return {"em": exact_match(final, gold), "f1": f1_score(final, gold)}


def _fc_factory(config: FCEnvConfig, shared: SharedResources) -> EnvFactory:
    return lambda task: FCEnvironment(task, config)


def _fixed_turns_factory(config: FixedTurnsConfig, shared: SharedResources) -> EnvFactory:
    return lambda task: FixedTurnsEnvironment(num_turns=config.turns)


def _fixed_turns_tasks(config: FixedTurnsConfig) -> list[Task]:
    return [Task(id=f"synthetic-{i}", question=f"Synthetic task {i}: reply in {config.turns} turns.")
            for i in range(config.prompts)]


register_family(TaskFamily("math", MathEnvConfig, _math_factory, section="math", sandboxed=True))
register_family(TaskFamily("qa", QAEnvConfig, _qa_factory, section="qa", index_corpus="qa/corpus.jsonl",
                           answer_metrics=_qa_answer_metrics, answer_metric_names=("em", "f1")))
register_family(TaskFamily("fc", FCEnvConfig, _fc_factory, section="fc"))
register_family(TaskFamily("fixed-turns", FixedTurnsConfig, _fixed_turns_factory, section="fixed_turns",
                           synthetic_tasks=_fixed_turns_tasks))
