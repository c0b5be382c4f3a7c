"""From dataset examples to running environments: ``example_to_task`` and ``make_env_factory``.

    factory = make_env_factory("qa", QAEnvConfig(index_dir="artifacts/qa_index"))
    executor = TreeRolloutExecutor(engine, tokenizer, factory, agent)
    executor.run([example_to_task(ex) for ex in examples], m, expansion_of(method, N, scorer), rng)

The factory builds what its environments share once — the verified Python sandbox (math), the
loaded retriever (qa) — and returns ``task -> Environment``, one fresh instance per trajectory
as the executor requires.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_core.data.schema import LETTERS, RESERVED_METADATA_KEYS, TASKS, Example
from trace_core.envs.families import EnvFactory, SharedResources, get_family
from trace_core.envs.fc_env import FCEnvConfig
from trace_core.envs.math_env import MathEnvConfig
from trace_core.envs.qa_env import QAEnvConfig
from trace_core.envs.sandbox import PythonSandbox
from trace_core.retrieval import Retriever
from trace_core.rollout.env import FixedTurnsConfig, Task

TASK_FAMILIES = TASKS  # the families a data row can hold: ("math", "qa", "fc")
__all__ = ["EnvFactory", "EnvsConfig", "example_to_task", "family_env_factory", "format_choices", "make_env_factory"]
_ADDED_KEYS = RESERVED_METADATA_KEYS  # the data's suite refuses a row whose metadata holds one


@dataclass(frozen=True)
class EnvsConfig:
    """Every task family's environment settings (one section per family)."""

    math: MathEnvConfig = field(default_factory=MathEnvConfig)
    qa: QAEnvConfig = field(default_factory=QAEnvConfig)
    fc: FCEnvConfig = field(default_factory=FCEnvConfig)
    fixed_turns: FixedTurnsConfig = field(default_factory=FixedTurnsConfig)  # the synthetic test family


def format_choices(prompt: str, choices: list[str]) -> str:
    """A multiple-choice question as the model reads it: the stem, then ``A. option`` lines."""
    options = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))
    return f"{prompt}\n\n{options}\n\nAnswer with the letter of the correct option."


def example_to_task(example: Example) -> Task:
    """The rollout task of a normalized example.

    ``answer`` is the example's list of accepted answers (per-turn call lists for BFCL, whose
    checker reads ``metadata["ground_truth"]``); ``metadata`` is the example's metadata plus
    ``family`` (math/qa/fc), ``source``, ``split`` and ``choices``. Multiple-choice options are
    appended to the question."""
    if example.task not in TASK_FAMILIES:
        raise ValueError(f"example {example.id!r}: task {example.task!r} must be one of {TASK_FAMILIES}")
    clash = [k for k in _ADDED_KEYS if k in example.metadata]
    if clash:
        raise ValueError(f"example {example.id!r}: metadata keys {clash} are reserved for the task adapter")
    question = format_choices(example.prompt, example.choices) if example.choices else example.prompt
    metadata = {**example.metadata, "family": example.task, "source": example.source, "split": example.split,
                "choices": list(example.choices)}
    return Task(id=example.id, question=question, answer=list(example.answers), metadata=metadata)


def make_env_factory(
    task_family: str,
    config: Any = None,
    *,
    retriever: Retriever | None = None,
    sandbox: PythonSandbox | None = None,
    index_dir: str | Path | None = None,
) -> EnvFactory:
    """``task -> Environment`` for one registered task family; shared resources are built here, once.

    ``config`` is the family's own settings, or an :class:`EnvsConfig` (its section is used), or
    None for the defaults (qa then expects an index at ``artifacts/qa_index``). ``retriever`` /
    ``sandbox`` share already loaded resources between factories (e.g. training and evaluation);
    given, the settings' ``index_dir`` / ``sandbox`` are not read; ``index_dir`` points a family
    that reads an index at another one than its settings name."""
    family = get_family(task_family)
    settings = family.settings(config)
    if config is not None and not isinstance(config, EnvsConfig) and settings is not config:
        raise ValueError(f"config for task family {task_family!r} must be {family.config_type.__name__} "
                         f"or EnvsConfig, got {type(config).__name__}")
    shared = SharedResources(retriever=retriever, sandbox=sandbox,
                             index_dir=None if index_dir is None else str(index_dir))
    return family.make_factory(settings, shared)


def family_env_factory(task_family: str, config: Any = None, *, data_dir: str | Path,
                       index_dir: str | Path | None = None, quiet: bool = True) -> EnvFactory:
    """``task -> Environment`` for ``task_family`` as a run gets it: a family that reads a retriever
    index reads the one at ``index_dir`` (else its settings' ``index_dir``), built first from the
    family's corpus under ``data_dir`` when the folder holds none; other families ignore both.
    The trainer, the evaluator and the warm start all build their environments here."""
    family = get_family(task_family)
    if family.index_corpus is None:
        return make_env_factory(task_family, config)
    from trace_core.retrieval import ensure_index

    where = ensure_index(index_dir if index_dir is not None else family.settings(config).index_dir,
                         Path(data_dir) / family.index_corpus, quiet=quiet)
    return make_env_factory(task_family, config, index_dir=where)
