"""Plain TRL GRPO beside TRACE-in-TRL, on the tiny random Qwen3, on the CPU.

Both runs train the same tiny policy (built locally, nothing downloaded) on the same prompts of a
task family for a few steps, at the same rollouts per step (M(1+N)), and print per step

- the **effective ratio**: the share of the step's groups holding both a success and a failure
  (the groups GRPO learns from);
- **mixed groups per 1k tokens**: those groups per 1,000 generated tokens (what a mixed group costs).

Plain TRL is ``trl.GRPOTrainer`` as its users run it: G single-turn completions per prompt, scored
by the family's environment on a one-turn episode. Its figures are read from TRL's own logs
(``frac_reward_zero_std``, ``completions/mean_length``). The plug-in is
``trace_core.integrations.trl.TraceGRPOTrainer``: the planner's roots, multi-turn rollouts with
the environment's tools, continuations from anchors, tree advantages; its figures are its logged
``trace/effective_ratio`` and ``trace/contrast/mixed_per_1k_tokens``.

    python examples/trl_trace.py --steps 3
    python examples/trl_trace.py --steps 3 --mlflow-uri sqlite:///mlruns-trl.db   # both runs into MLflow

A random policy is no learner: the example shows the plumbing and the bookkeeping, not a result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# what a run's table reads from a logged record: the plug-in's own figures
TRACE_RATIO, TRACE_PER_1K = "trace/effective_ratio", "trace/contrast/mixed_per_1k_tokens"


@dataclass(frozen=True)
class ExampleSettings:
    """What both runs share."""

    out: Path  # the runs' folder (the tiny policy is built into it)
    steps: int  # optimizer steps of each run (one generation batch each)
    family: str  # a task family of the registry; fixed-turns gives a random policy mixed rewards
    prompts: int  # synthetic prompts of the fixed-turns family
    method: str  # the plug-in's allocation method
    mlflow_uri: str | None  # an MLflow tracking URI (a local sqlite:/// store is fine); None: no MLflow
    seed: int  # TRL's seed (data order, sampling)


@dataclass(frozen=True)
class StepFigures:
    """One step of one run, as printed."""

    effective_ratio: float  # share of groups with both outcomes
    mixed_per_1k_tokens: float  # mixed groups per 1,000 generated tokens


def parse_args(argv: list[str] | None = None) -> ExampleSettings:
    parser = argparse.ArgumentParser(
        description="Train the tiny random Qwen3 for a few steps with plain TRL GRPOTrainer and with TRACE's "
                    "TraceGRPOTrainer side by side on the CPU; print each one's effective ratio (share of groups "
                    "with both outcomes) and mixed groups per 1k generated tokens.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/trl_trace"), help="folder for both runs and the policy")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps of each run")
    parser.add_argument("--family", default="fixed-turns",
                        help="task family (fixed-turns: synthetic, mixed rewards even for a random policy; "
                             "math reads data/math/train.jsonl)")
    parser.add_argument("--prompts", type=int, default=32, help="synthetic prompts (fixed-turns only)")
    parser.add_argument("--method", default="trace", help="the plug-in's allocation method (trace_core registry)")
    parser.add_argument("--mlflow-uri", default=None,
                        help="log both runs to this MLflow tracking URI, e.g. a local store sqlite:///mlruns-trl.db "
                             "(MLflow 3 refuses plain file: stores); none: no MLflow")
    parser.add_argument("--seed", type=int, default=0, help="TRL's seed")
    a = parser.parse_args(argv)
    return ExampleSettings(a.out, a.steps, a.family, a.prompts, a.method, a.mlflow_uri, a.seed)


# ============================================================================ shared set-up
def tiny_policy(out: Path) -> Path:
    """The tiny random Qwen3 (built once into ``out/policy``)."""
    from trace_core.models import TinyQwen3Config, build_tiny_qwen3

    path = out / "policy"
    if not (path / "config.json").is_file():
        build_tiny_qwen3(path, TinyQwen3Config(seed=0))
    return path


def trace_config(s: ExampleSettings) -> Any:
    """The plug-in's settings: M = 4 roots, N = 1, G = 4, a pool of 2·M(1+N)/G = 4 candidates."""
    from trace_core.envs.registry import EnvsConfig
    from trace_core.integrations.trl import TraceTRLConfig
    from trace_core.predictor.config import PredictorConfig
    from trace_core.rollout.agent import AgentConfig
    from trace_core.rollout.env import FixedTurnsConfig
    from trace_core.training.config import BudgetConfig

    return TraceTRLConfig(
        method=s.method, task_family=s.family,
        budget=BudgetConfig(roots_M=4, expansion_N=1, group_size_G=4, max_per_prompt=4, pool_factor=2),
        envs=EnvsConfig(fixed_turns=FixedTurnsConfig(turns=3, prompts=s.prompts)),
        agent=AgentConfig(max_turns=3, max_new_tokens=8, max_total_tokens=768),
        predictor=PredictorConfig(tiny_hidden_size=32, tiny_intermediate_size=64, tiny_max_positions=1024,
                                  min_prefix_examples=2),
        tool_workers=0)


def tasks_of(s: ExampleSettings, trace: Any) -> list[Any]:
    """The family's prompts: its own synthetic ones, or its data file's rows."""
    from trace_core.envs.families import get_family
    from trace_core.training.trainer import read_tasks

    family = get_family(s.family)
    if family.synthetic_tasks is not None:
        return family.synthetic_tasks(family.settings(trace.envs))
    return read_tasks(Path("data") / s.family / "train.jsonl", family=s.family)


def grpo_args(s: ExampleSettings, name: str, num_generations: int, rows: int, completion_tokens: int) -> Any:
    """TRL's settings of one run: one generation batch of ``rows`` per optimizer step, on the CPU."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(s.out / name), run_name=name, use_cpu=True, bf16=False, max_steps=s.steps,
        per_device_train_batch_size=rows, num_generations=num_generations, max_completion_length=completion_tokens,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", gradient_checkpointing=False, seed=s.seed,
        report_to=["mlflow"] if s.mlflow_uri else "none", disable_tqdm=True, dataloader_num_workers=0)


def use_mlflow(uri: str | None) -> None:
    """TRL's MLflow callback reads its store from the environment."""
    if uri:
        os.environ["MLFLOW_TRACKING_URI"] = uri
        os.environ.setdefault("MLFLOW_EXPERIMENT_NAME", "trl-trace-example")


# ============================================================================ plain TRL
def one_turn_reward(env_factory: Any) -> Any:
    """TRL's reward function: the family's environment scores each completion as a one-turn episode."""
    from trace_core.integrations.trl import TASK_COLUMN
    from trace_core.rollout.env import Episode, Task, parse_action

    def environment_one_turn(completions: list[Any], **columns: Any) -> list[float]:
        rewards = []
        for completion, task_json in zip(completions, columns[TASK_COLUMN], strict=True):
            text = completion if isinstance(completion, str) else completion[-1]["content"]
            task = Task(**json.loads(task_json))
            env = env_factory(task)
            env.reset(task)
            action = parse_action(text)
            rewards.append(float(env.reward(Episode(task, [action], [env.step(action)]))))
        return rewards

    return environment_one_turn


def run_plain_trl(s: ExampleSettings, policy: Path, trace: Any, dataset: Any) -> list[StepFigures]:
    """Plain GRPOTrainer: M(1+N)/G prompts × G single-turn completions a step."""
    from trl import GRPOTrainer

    from trace_core.envs.registry import make_env_factory

    spec = trace.spec()
    system = trace.agent.system_prompt
    chat = dataset.map(lambda row: {"prompt": [{"role": "system", "content": system},
                                               {"role": "user", "content": row["prompt"]}]})
    args = grpo_args(s, "plain-trl", spec.group_size_G, spec.total, trace.agent.max_new_tokens * trace.agent.max_turns)
    trainer = GRPOTrainer(str(policy), reward_funcs=[one_turn_reward(make_env_factory(s.family, trace.envs))],
                          args=args, train_dataset=chat)
    trainer.train()
    groups, rows = spec.total // spec.group_size_G, spec.total
    figures = []
    for rec in trainer.state.log_history:
        if "frac_reward_zero_std" in rec:
            mixed = (1.0 - rec["frac_reward_zero_std"]) * groups  # binary rewards: nonzero std = both outcomes
            tokens = rec["completions/mean_length"] * rows
            figures.append(StepFigures(mixed / groups, 1000.0 * mixed / tokens if tokens else float("nan")))
    return figures


# ============================================================================ TRACE in TRL
def run_trace(s: ExampleSettings, policy: Path, trace: Any, dataset: Any) -> list[StepFigures]:
    """TraceGRPOTrainer: the planner's pool, roots and continuations, tree advantages."""
    from trace_core.integrations.trl import TraceGRPOTrainer

    spec = trace.spec()
    args = grpo_args(s, f"trace-{s.method}", spec.group_size_G // spec.pool_factor, spec.total,
                     trace.agent.max_new_tokens * trace.agent.max_turns)
    trainer = TraceGRPOTrainer(str(policy), trace, args, dataset)
    trainer.train()
    return [StepFigures(_number(rec[TRACE_RATIO]), _number(rec.get(TRACE_PER_1K)))
            for rec in trainer.state.log_history if TRACE_RATIO in rec]


def _number(value: float | None) -> float:
    """A logged figure (TRL logs None where a step's figure was NaN)."""
    return float("nan") if value is None else float(value)


# ============================================================================ report
def report(runs: dict[str, list[StepFigures]]) -> str:
    """Per step and on average, each run's effective ratio and mixed groups per 1k tokens."""
    lines = [f"{'run':<16}{'step':>5}{'effective ratio':>18}{'mixed / 1k tokens':>20}"]
    for name, figures in runs.items():
        for i, f in enumerate(figures, start=1):
            lines.append(f"{name:<16}{i:>5}{f.effective_ratio:>18.3f}{f.mixed_per_1k_tokens:>20.3f}")
        ratio = np.nanmean([f.effective_ratio for f in figures]) if figures else float("nan")
        per_1k = np.nanmean([f.mixed_per_1k_tokens for f in figures]) if figures else float("nan")
        lines.append(f"{name:<16}{'mean':>5}{ratio:>18.3f}{per_1k:>20.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    s = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    use_mlflow(s.mlflow_uri)
    import torch

    torch.set_num_threads(1)  # a tiny model decodes fastest on one thread
    from trace_core.integrations.trl import task_dataset

    s.out.mkdir(parents=True, exist_ok=True)
    policy = tiny_policy(s.out)
    trace = trace_config(s)
    dataset = task_dataset(tasks_of(s, trace))
    runs = {"plain TRL GRPO": run_plain_trl(s, policy, trace, dataset),
            f"TRACE ({s.method})": run_trace(s, policy, trace, dataset)}
    print(report(runs))
    if s.mlflow_uri:
        print(f"both runs logged to MLflow at {s.mlflow_uri} (experiment {os.environ['MLFLOW_EXPERIMENT_NAME']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
