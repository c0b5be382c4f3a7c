"""From dataset examples to running environments: ``example_to_task`` and ``make_env_factory``.

    factory = make_env_factory("qa", QAEnvConfig(index_dir="artifacts/qa_index"))
    executor = TreeRolloutExecutor(engine, tokenizer, factory, agent)
    executor.run([example_to_task(ex) for ex in examples], m, expansion_of(method, N, scorer), rng)

The factory builds what its environments share once — the verified Python sandbox (math), the
loaded retriever (qa) — and returns ``task -> Environment``, one fresh instance per trajectory
as the executor requires.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from trace_core.data.schema import LETTERS, RESERVED_METADATA_KEYS, TASKS, Example
from trace_core.envs.fc_env import FCEnvConfig, FCEnvironment
from trace_core.envs.math_env import MathEnvConfig, MathEnvironment, make_sandbox
from trace_core.envs.qa_env import QAEnvConfig, QAEnvironment
from trace_core.envs.sandbox import PythonSandbox
from trace_core.retrieval import Retriever
from trace_core.rollout.env import Environment, Task

TASK_FAMILIES = TASKS  # ("math", "qa", "fc")
EnvFactory = Callable[[Task], Environment]
_ADDED_KEYS = RESERVED_METADATA_KEYS  # the data's suite refuses a row whose metadata holds one


@dataclass(frozen=True)
class EnvsConfig:
    """Every task family's environment settings (one section per family)."""

    math: MathEnvConfig = field(default_factory=MathEnvConfig)
    qa: QAEnvConfig = field(default_factory=QAEnvConfig)
    fc: FCEnvConfig = field(default_factory=FCEnvConfig)


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
    config: EnvsConfig | MathEnvConfig | QAEnvConfig | FCEnvConfig | None = None,
    *,
    retriever: Retriever | None = None,
    sandbox: PythonSandbox | None = None,
) -> EnvFactory:
    """``task -> Environment`` for one task family; shared resources are built here, once.

    ``config`` is the family's own config, or an :class:`EnvsConfig` (its section is used), or
    None for the defaults (qa then expects an index at ``artifacts/qa_index``). ``retriever`` /
    ``sandbox`` share already loaded resources between factories (e.g. training and evaluation);
    given, the config's ``index_dir`` / ``sandbox`` settings are not read."""
    expected = {"math": MathEnvConfig, "qa": QAEnvConfig, "fc": FCEnvConfig}
    if task_family not in expected:
        raise ValueError(f"task_family={task_family!r} must be one of {TASK_FAMILIES}")
    if config is None:
        config = expected[task_family]()
    elif isinstance(config, EnvsConfig):
        config = getattr(config, task_family)
    if not isinstance(config, expected[task_family]):
        raise ValueError(f"config for task family {task_family!r} must be {expected[task_family].__name__} "
                         f"or EnvsConfig, got {type(config).__name__}")
    if isinstance(config, MathEnvConfig):
        shared_sandbox = sandbox if sandbox is not None else make_sandbox(config)
        math_config = config
        return lambda task: MathEnvironment(shared_sandbox, math_config)
    if isinstance(config, QAEnvConfig):
        shared_retriever = retriever if retriever is not None else Retriever.load(
            config.index_dir, model_path=config.model_path, device=config.device)
        qa_config = config
        return lambda task: QAEnvironment(shared_retriever, qa_config)
    fc_config = config
    return lambda task: FCEnvironment(task, fc_config)
