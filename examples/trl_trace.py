"""Plain TRL GRPO beside TRACE-in-TRL, on the embedded testbed's fitted policy, on the CPU.

Both runs start from a copy of the testbed's policy (``bench/results/learning/testbed/policy``: a
tiny Qwen3 fine-tuned on multi-hop QA demonstrations, right on some topics and wrong on others)
and train a few steps on the testbed's 128 pool questions with the QA environment (its ``search``
tool reads the testbed's retriever index), at the same rollouts per step, M(1+N) = 8 (the soak's
small step: M = 4, N = 1, G = 4). The environment and agent settings are the testbed's own
(``configs/testbed.yaml``, as ``bench/soak.py`` and ``bench/learning.py --testbed`` read them).
Each run prints per step

- the **effective ratio**: the share of the step's groups holding both a success and a failure
  (the groups GRPO learns from);
- **mixed groups per 1k tokens**: those groups per 1,000 generated tokens (what a mixed group costs).

Plain TRL is ``trl.GRPOTrainer`` as its users run it: G single-turn completions per prompt, scored
by the QA environment as a one-turn episode. Its prompt is the one the plug-in's rollouts start
from (system turn with the tool's schema, the question, the assistant header), and its figures
are read from TRL's own logs (``frac_reward_zero_std``, ``completions/mean_length``). The plug-in
is ``trace_core.integrations.trl.TraceGRPOTrainer``: the planner's roots, multi-turn rollouts
that call the retriever, continuations from anchors, tree advantages; its figures are its logged
``trace/effective_ratio`` and ``trace/contrast/mixed_per_1k_tokens``.

What a few steps of each show on this fitted policy. Its first turn is a search (every question
takes two or three hops), and past the ``</tool_call>`` where the agent stops a turn it writes
text it was never trained on; so each of plain TRL's single-turn completions is a search call
with no answer, scored 0, every group is uniform, the effective ratio is 0 and GRPO's update has
nothing to push. The plug-in's rollouts run the search, read the passages and answer, succeed
on some questions and fail on others, so its steps hold mixed groups (an effective ratio above
0: at the defaults, on two CPU cores, 0.5, 0.5 and 0 over the three steps, each step opening two
of its four candidates) whose tree advantages the update reads. A few steps are the contrast
each trainer gets per step, not a learning curve (that is ``bench/learning.py``'s). The plug-in's
predictor starts cold (TraceGRPOTrainer has no warm-up seam) and learns from each step's trees.
The three default steps of both runs take about a minute on two CPU cores.

    python examples/trl_trace.py --steps 3
    python examples/trl_trace.py --steps 3 --mlflow-uri sqlite:///mlruns-trl.db   # both runs into MLflow

Besides the table, ``<out>/figures.json`` holds each run's per-step figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

# what a run's table reads from a logged record: the plug-in's own figures
TRACE_RATIO, TRACE_PER_1K = "trace/effective_ratio", "trace/contrast/mixed_per_1k_tokens"
FIGURES_FILE = "figures.json"  # in --out: each run's per-step figures, as printed
# what a testbed folder holds (bench.testbed or `python -m trace_core.warmstart --testbed` writes it)
TESTBED_FILES = ("policy/config.json", "pool.jsonl", "qa_index")


@dataclass(frozen=True)
class ExampleSettings:
    """What both runs share."""

    out: Path  # the runs' folder (the policy's copy, TRL's output folders, figures.json)
    steps: int  # optimizer steps of each run (one generation batch each)
    testbed: Path  # a testbed folder: policy/ (never written), pool.jsonl (the prompts), qa_index/ (the retriever)
    config: Path  # the testbed's training config: task family, environment, agent and predictor settings
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
        description="Train the embedded testbed's fitted tiny policy (multi-hop QA with a retriever tool) for a few "
                    "steps with plain TRL GRPOTrainer (single-turn completions) and with TRACE's TraceGRPOTrainer "
                    "(multi-turn tool rollouts) side by side on the CPU, each from a copy of the policy; print each "
                    "run's effective ratio (share of groups with both outcomes) and mixed groups per 1k generated "
                    "tokens per step.",
        epilog="example: python examples/trl_trace.py --steps 3 --mlflow-uri sqlite:///mlruns-trl.db",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/trl_trace"),
                        help="folder for both runs, the policy's copy and figures.json")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps of each run")
    parser.add_argument("--testbed", type=Path, default=Path("bench/results/learning/testbed"),
                        help="a testbed folder: policy/ (copied, never written), pool.jsonl (the prompts), qa_index/ "
                             "(the QA environment's retriever index)")
    parser.add_argument("--config", type=Path, default=Path("configs/testbed.yaml"),
                        help="the testbed's training config (task family, environment, agent limits, predictor)")
    parser.add_argument("--method", default="trace", help="the plug-in's allocation method (trace_core registry)")
    parser.add_argument("--mlflow-uri", default=None,
                        help="log both runs to this MLflow tracking URI, e.g. a local store sqlite:///mlruns-trl.db "
                             "(MLflow 3 refuses plain file: stores); none: no MLflow")
    parser.add_argument("--seed", type=int, default=0, help="TRL's seed")
    a = parser.parse_args(argv)
    if a.steps < 1:
        parser.error(f"--steps must be >= 1, got {a.steps}")
    missing = [name for name in TESTBED_FILES if not (a.testbed / name).exists()]
    if missing:
        parser.error(f"--testbed {a.testbed}: {', '.join(missing)} missing (a testbed folder: "
                     "bench/results/learning/testbed, or one `python -m bench.testbed` built)")
    return ExampleSettings(a.out, a.steps, a.testbed, a.config, a.method, a.mlflow_uri, a.seed)


# ============================================================================ shared set-up
def policy_copy(s: ExampleSettings) -> Path:
    """The testbed's policy, copied afresh into ``out/policy``: both runs load it, and the committed
    folder is never a trainer's path."""
    path = s.out / "policy"
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(s.testbed / "policy", path)
    return path


def testbed_config(s: ExampleSettings) -> Any:
    """The testbed's training config with its paths pointed into ``--testbed`` (as bench/soak.py does)."""
    from trace_core.config import load_config
    from trace_core.training.config import TrainConfig

    # the plug-in's environments read their index from the QA settings (TraceTRLConfig.envs), not task.index_dir
    return load_config(TrainConfig, s.config, [f"task.train_file={s.testbed / 'pool.jsonl'}",
                                               f"task.envs.qa.index_dir={s.testbed / 'qa_index'}"])


def trace_config(s: ExampleSettings, cfg: Any) -> Any:
    """The plug-in's settings: the testbed's family, environment, agent and predictor; the soak's
    small step, M = 4 roots, N = 1, G = 4, a pool of 2·M(1+N)/G = 4 candidates (a step of 8
    trajectories takes seconds on a CPU)."""
    from trace_core.integrations.trl import TraceTRLConfig
    from trace_core.training.config import BudgetConfig

    return TraceTRLConfig(
        method=s.method, task_family=cfg.task.family,
        budget=BudgetConfig(roots_M=4, expansion_N=1, group_size_G=4, max_per_prompt=4, pool_factor=2),
        envs=cfg.task.envs, agent=cfg.agent, predictor=cfg.predictor, costs=cfg.costs,
        tool_workers=0)  # one core's work: a search beside generation would only contend with it


def grpo_args(s: ExampleSettings, name: str, num_generations: int, rows: int, completion_tokens: int,
              learning_rate: float) -> Any:
    """TRL's settings of one run: one generation batch of ``rows`` per optimizer step, on the CPU."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(s.out / name), run_name=name, use_cpu=True, bf16=False, max_steps=s.steps,
        per_device_train_batch_size=rows, num_generations=num_generations, max_completion_length=completion_tokens,
        learning_rate=learning_rate, logging_steps=1, save_strategy="no", gradient_checkpointing=False, seed=s.seed,
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


def run_plain_trl(s: ExampleSettings, policy: Path, trace: Any, dataset: Any, lr: float) -> list[StepFigures]:
    """Plain GRPOTrainer: M(1+N)/G prompts × G single-turn completions a step, each at most one
    agent turn's tokens, from the prompt the plug-in's rollouts start from (the tool's schema
    included: without it the fitted policy would read a prompt it never saw)."""
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from trace_core.envs.registry import make_env_factory
    from trace_core.integrations.trl import task_of_row

    spec = trace.spec()
    env_factory = make_env_factory(trace.task_family, trace.envs)
    tokenizer = AutoTokenizer.from_pretrained(str(policy))

    def rendered(row: dict[str, Any]) -> dict[str, str]:
        task = task_of_row(row)
        messages = [{"role": "system", "content": trace.agent.system_prompt},
                    {"role": "user", "content": task.question}]
        tools = env_factory(task).tool_descriptions() or None
        return {"prompt": tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                        tokenize=False)}

    args = grpo_args(s, "plain-trl", spec.group_size_G, spec.total, trace.agent.max_new_tokens, lr)
    trainer = GRPOTrainer(str(policy), reward_funcs=[one_turn_reward(env_factory)], args=args,
                          train_dataset=dataset.map(rendered), processing_class=tokenizer)
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
def run_trace(s: ExampleSettings, policy: Path, trace: Any, dataset: Any, lr: float) -> list[StepFigures]:
    """TraceGRPOTrainer: the planner's pool, roots and continuations, tree advantages."""
    from trace_core.integrations.trl import TraceGRPOTrainer

    spec = trace.spec()
    args = grpo_args(s, f"trace-{s.method}", spec.group_size_G // spec.pool_factor, spec.total,
                     trace.agent.max_new_tokens * trace.agent.max_turns, lr)
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


def write_figures(path: Path, runs: dict[str, list[StepFigures]]) -> None:
    """Each run's per-step figures as JSON (NaN written as null)."""
    def plain(f: StepFigures) -> dict[str, float | None]:
        return {k: (None if math.isnan(v) else v) for k, v in asdict(f).items()}

    path.write_text(json.dumps({name: [plain(f) for f in figures] for name, figures in runs.items()}, indent=1))


def main(argv: list[str] | None = None) -> int:
    s = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    use_mlflow(s.mlflow_uri)
    import torch

    torch.set_num_threads(1)  # a tiny model decodes fastest on one thread
    from trace_core.integrations.trl import task_dataset
    from trace_core.training.trainer import read_tasks

    s.out.mkdir(parents=True, exist_ok=True)
    cfg = testbed_config(s)
    policy = policy_copy(s)
    trace = trace_config(s, cfg)
    dataset = task_dataset(read_tasks(Path(cfg.task.train_file), family=cfg.task.family))
    lr = cfg.policy.lr  # the step size the testbed's own training runs take from this policy
    runs = {"plain TRL GRPO": run_plain_trl(s, policy, trace, dataset, lr),
            f"TRACE ({s.method})": run_trace(s, policy, trace, dataset, lr)}
    print(report(runs))
    write_figures(s.out / FIGURES_FILE, runs)
    if s.mlflow_uri:
        print(f"both runs logged to MLflow at {s.mlflow_uri} (experiment {os.environ['MLFLOW_EXPERIMENT_NAME']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
