"""GRPO beside TRACE, both inside TRL's GRPOTrainer, on the embedded testbed's fitted policy, on the CPU.

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

Both runs are ``trace_core.integrations.trl.TraceGRPOTrainer`` (a ``trl.GRPOTrainer`` subclass)
and see the same multi-turn tool episodes: the agent searches, reads the passages the environment
returns and answers, and the environment scores the episode. They differ only in allocation
(which prompts get how many rollouts, and whether continuations branch off them) and in the
advantage that reads the result:

- **GRPO** (method ``grpo``, pool_factor 1): TRL's own step with multi-turn rollouts. TRL's
  ``num_generations`` is G, its sampler hands each step M(1+N)/G = 2 prompts, each gets G = 4
  rollouts, no continuations, and the advantages are TRL's own group advantages (the plug-in's
  tests check that they equal what ``GRPOTrainer`` computes from the same rewards);
- **TRACE** (``--method``, ``trace`` by default): the predictor scores a candidate pool of
  2·M(1+N)/G = 4 prompts, the planner spends the M = 4 roots on them, M·N = 4 continuations start
  from the anchors' token histories, and the advantages are the tree's.

The baseline is not single-turn GRPO (TRL generating one completion per sample, scored as a one-turn
episode): this policy's first turn is always a ``search`` call, so a single-turn completion never
reaches an answer, every reward is 0, every group is uniform and plain single-turn GRPO would
score nothing (an effective ratio of 0 at every step, a comparison that says nothing). Both runs'
figures are read the same way, from the plug-in's logged ``trace/effective_ratio`` and
``trace/contrast/mixed_per_1k_tokens``.

What a few steps show at the defaults (three steps, seed 0): the GRPO run's effective ratio is 0,
0.5 and 0 (its two prompts a step are mostly all-right or all-wrong), TRACE's 0.5, 0.5 and 0. A
few steps are the contrast each trainer gets per step, not a learning curve (that is
``bench/learning.py``'s). The plug-in's predictor starts cold (TraceGRPOTrainer has no warm-up
seam) and learns from each step's trees; the GRPO run's roots do not read it. The three default
steps of both runs take about a minute and a half on two CPU cores.

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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

# what a run's table reads from a logged record: the plug-in's own figures
TRACE_RATIO, TRACE_PER_1K = "trace/effective_ratio", "trace/contrast/mixed_per_1k_tokens"
GRPO_RUN = "GRPO (TRL's GRPOTrainer, multi-turn tool rollouts)"  # the baseline's name in the table
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
                    "steps with GRPO and with TRACE side by side on the CPU, each from a copy of the policy, both "
                    "inside TRL's GRPOTrainer (TraceGRPOTrainer with method grpo, then --method) on the same "
                    "multi-turn tool episodes and M(1+N) = 8 rollouts a step, so they differ only in allocation; "
                    "print each run's effective ratio (share of groups with both outcomes) and mixed groups per 1k "
                    "generated tokens per step. The GRPO baseline runs multi-turn because the policy's first turn "
                    "is always a search: a single-turn completion never reaches an answer, so plain single-turn "
                    "GRPO would score nothing.",
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


# ============================================================================ the two runs
def grpo_config(trace: Any) -> Any:
    """The baseline's settings: the plug-in's with method ``grpo`` (uniform roots, no
    continuations, TRL's own group advantage) and pool_factor 1, so that TRL's
    ``num_generations`` is G as in a plain GRPOTrainer run: each step TRL's sampler hands
    M(1+N)/G = 2 prompts and each gets G = 4 multi-turn rollouts, M(1+N) = 8 in all, TRACE's budget."""
    return replace(trace, method="grpo", budget=replace(trace.budget, pool_factor=1))


def run_plugin(s: ExampleSettings, name: str, policy: Path, trace: Any, dataset: Any, lr: float) -> list[StepFigures]:
    """TraceGRPOTrainer with ``trace``'s method: the planner's pool and roots (and, for TRACE, the
    continuations from anchors), multi-turn rollouts that call the retriever, the method's
    advantages; its figures are its logged ``trace/effective_ratio`` and
    ``trace/contrast/mixed_per_1k_tokens``."""
    from trace_core.integrations.trl import TraceGRPOTrainer

    spec = trace.spec()
    args = grpo_args(s, name, spec.group_size_G // spec.pool_factor, spec.total,
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
    w = max(len("run"), *(len(name) for name in runs)) + 2
    lines = [f"{'run':<{w}}{'step':>5}{'effective ratio':>18}{'mixed / 1k tokens':>20}"]
    for name, figures in runs.items():
        for i, f in enumerate(figures, start=1):
            lines.append(f"{name:<{w}}{i:>5}{f.effective_ratio:>18.3f}{f.mixed_per_1k_tokens:>20.3f}")
        ratio = np.nanmean([f.effective_ratio for f in figures]) if figures else float("nan")
        per_1k = np.nanmean([f.mixed_per_1k_tokens for f in figures]) if figures else float("nan")
        lines.append(f"{name:<{w}}{'mean':>5}{ratio:>18.3f}{per_1k:>20.3f}")
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
    runs = {GRPO_RUN: run_plugin(s, "grpo", policy, grpo_config(trace), dataset, lr),
            f"TRACE ({s.method})": run_plugin(s, f"trace-{s.method}", policy, trace, dataset, lr)}
    print(report(runs))
    write_figures(s.out / FIGURES_FILE, runs)
    if s.mlflow_uri:
        print(f"both runs logged to MLflow at {s.mlflow_uri} (experiment {os.environ['MLFLOW_EXPERIMENT_NAME']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
