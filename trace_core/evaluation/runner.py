"""Run a checkpoint through the agent loop on the configured benchmarks and score it.

Evaluation is training's rollout without expansion: every example is a root with ``k`` bare
rollouts (the ``grpo`` method with ``N = 0``) on :class:`~trace_core.rollout.executor.TreeRolloutExecutor`,
so the ReAct loop, prompt rendering, stop strings and environments are exactly the ones RL
trains with. Per task family, all its benchmarks' examples go through the engine in one batch:

1. **sampled**: ``k`` trajectories per example at the family's agent temperature -> pass@1
   averaged over k, unbiased pass@j, EM/F1 (QA), tool calls, turns, lengths;
2. **greedy**: temperature 0 -> greedy accuracy. The executor samples groups of at least two;
   :class:`~trace_core.evaluation.greedy.GreedyOnce` decodes each greedy history once and hands
   the group identical trajectories, of which the first is scored.

An example whose prompt does not fit ``max_total_tokens`` is not run: it counts as failed in
every sample and is counted in ``prompt_too_long``. Rewards are the environments' own (math
answer equivalence, QA exact match, BFCL's official ``multi_turn_checker``); QA's token F1 is
computed from the same final answer with the same SQuAD normalisation.

The untrained ReAct baseline of the paper's tables is this evaluation run on the initial
checkpoint (the policy RL starts from, e.g. ``runs/warm/policy``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trace_core.envs.families import get_family
from trace_core.envs.registry import example_to_task, family_env_factory
from trace_core.evaluation.benchmarks import Benchmark, load_benchmarks
from trace_core.evaluation.config import EvalConfig
from trace_core.evaluation.greedy import GreedyOnce
from trace_core.evaluation.metrics import domain_averages, mean_or_nan, mean_pass_at_k, pass_at_1_avg
from trace_core.evaluation.report import BenchmarkResult, EvalResult, artifact_name, log_result, summary_markdown
from trace_core.evaluation.success import measure_success
from trace_core.metrics import is_success
from trace_core.rollout.agent import AgentConfig, render_prompt
from trace_core.rollout.build import build_engine
from trace_core.rollout.engine import RolloutEngine
from trace_core.rollout.env import Action, Environment, Episode, Observation, Task
from trace_core.tracking import Tracker
from trace_core.tree import RolloutTree

EnvFactory = Callable[[Task], Environment]
Verdicts = dict[tuple[int, tuple[str, ...]], str | None]  # (id(task), action texts) -> checker error type
GREEDY_GROUP = 2  # the executor's smallest group
MAX_TEXT = 500  # characters kept of a question, an answer or a turn in examples.jsonl


def evaluate(
    checkpoint_dir: str | Path,
    config: EvalConfig | None = None,
    engine: RolloutEngine | None = None,
    tracker: Tracker | None = None,
    *,
    load_weights: bool = True,
    env_factories: Mapping[str, EnvFactory] | None = None,
) -> EvalResult:
    """Evaluate the policy in ``checkpoint_dir`` (a ``save_pretrained`` directory with its tokenizer).

    ``engine``: an engine to reuse (not closed here); its weights are replaced by the
    checkpoint's unless ``load_weights`` is False. None builds one from ``config.engine``.
    ``tracker``: where results are logged; None logs to ``config.tracking`` if set, else nowhere.
    ``env_factories``: ready ``task -> Environment`` factories per family (shared resources, e.g.
    the trainer's retriever); missing families are built from ``config.envs``.

    Writes ``result.json``, ``examples.jsonl`` (one line per example) and ``summary.md`` to the
    output directory and returns the :class:`EvalResult`."""
    config = config if config is not None else EvalConfig()
    checkpoint = Path(checkpoint_dir)
    if not (checkpoint / "config.json").is_file():
        raise ValueError(f"checkpoint_dir {checkpoint} is not a model directory (no config.json): pass a "
                         "save_pretrained directory such as runs/warm/policy")
    name = config.name or default_name(checkpoint)
    out_dir = Path(config.output_dir or Path("runs/eval") / artifact_name(name))
    t0 = time.perf_counter()
    benchmarks = load_benchmarks(config.benchmarks, config.data_dir, config.validate)
    families = list(dict.fromkeys(b.family for b in benchmarks))
    agents = {f: config.agents.of(f) for f in families}
    max_model_len = _check_lengths(agents, config, engine)
    factories = _env_factories(families, config, env_factories)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    own_engine = engine is None
    if engine is None:
        engine = build_engine(config.engine.engine_config(str(checkpoint), config.seed, max_model_len))
    elif load_weights:
        engine.load_weights(checkpoint)
    try:
        rollouts = roll_out(benchmarks, engine, tokenizer, factories, agents, config)
    finally:
        if own_engine:
            engine.close()
    records, results = score(benchmarks, rollouts, config)
    from trace_core.config import to_dict

    result = EvalResult(
        name=name, checkpoint=str(checkpoint), primary_metric=config.primary_metric, samples=config.samples,
        greedy=config.greedy, benchmarks=results,
        averages=domain_averages([(b.family, b.domain, b.metrics) for b in results.values()]),
        wall_s=time.perf_counter() - t0, rollout=rollouts.stats, config=to_dict(config),
    )
    write_outputs(result, records, out_dir)
    _log(result, config, tracker, out_dir)
    return result


@dataclass
class Rollouts:
    """What the engine produced: per benchmark, each example's task and its trees."""

    tasks: dict[str, list[Task]]  # benchmark name -> its tasks, in example order
    sampled: dict[str, list[RolloutTree | None]]  # benchmark name -> k-sample tree per task (None: too long)
    greedy: dict[str, list[RolloutTree | None]]  # benchmark name -> greedy tree per task
    stats: dict[str, dict[str, float]]  # "<family>/<sampled|greedy>" -> executor and engine counts
    verdicts: Verdicts  # the checker's error type per scored episode (BFCL)


def roll_out(benchmarks: Sequence[Benchmark], engine: RolloutEngine, tokenizer: Any,
             factories: Mapping[str, EnvFactory], agents: Mapping[str, AgentConfig], config: EvalConfig) -> Rollouts:
    """Per family, one executor run over all its benchmarks' examples for each pass (sampled, greedy)."""
    tasks_of = {b.name: [example_to_task(ex) for ex in b.examples] for b in benchmarks}
    out = Rollouts(tasks=tasks_of, sampled={}, greedy={}, stats={}, verdicts={})
    for family in dict.fromkeys(b.family for b in benchmarks):
        mine = [b.name for b in benchmarks if b.family == family]
        tasks = [t for name in mine for t in out.tasks[name]]
        factory = _recording(factories[family], out.verdicts)
        passes = []
        if config.samples:
            passes.append((out.sampled, config.samples, agents[family], engine, "sampled"))
        if config.greedy:
            greedy_agent = dataclasses.replace(agents[family], temperature=0.0)
            passes.append((out.greedy, GREEDY_GROUP, greedy_agent, GreedyOnce(engine), "greedy"))
        for trees_of, m, agent, target, label in passes:
            agent = dataclasses.replace(agent, seed=config.seed)
            trees, stats = _rollouts_with_progress(target, tokenizer, factory, tasks, m, agent, config,
                                                   f"{config.name or 'evaluate'} {family}/{label}")
            if isinstance(target, GreedyOnce):
                stats.update(decoded_requests=target.decoded, reused_requests=target.reused)
            out.stats[f"{family}/{label}"] = stats
            for name in mine:  # split the family's trees back into its benchmarks
                n = len(out.tasks[name])
                trees_of[name], trees = trees[:n], trees[n:]
    return out


def score(benchmarks: Sequence[Benchmark], rollouts: Rollouts, config: EvalConfig
          ) -> tuple[list[dict[str, Any]], dict[str, BenchmarkResult]]:
    """The per-example records and each benchmark's metrics."""
    records: list[dict[str, Any]] = []
    results: dict[str, BenchmarkResult] = {}
    for bench in benchmarks:
        tasks = rollouts.tasks[bench.name]
        sampled = rollouts.sampled.get(bench.name, [None] * len(tasks))
        greedy = rollouts.greedy.get(bench.name, [None] * len(tasks))
        mine = [example_record(bench, task, s, g, config, rollouts.verdicts)
                for task, s, g in zip(tasks, sampled, greedy, strict=True)]
        records += mine
        results[bench.name] = BenchmarkResult(bench.name, bench.label, bench.family, bench.domain, bench.source,
                                              benchmark_metrics(mine, config))
    return records, results


def default_name(checkpoint: Path) -> str:
    """``runs/warm/policy`` -> ``warm-policy``: the last two path parts (checkpoints are often ``policy``)."""
    return "-".join(checkpoint.resolve().parts[-2:])


# ----------------------------------------------------------------------------------------- set-up
def _check_lengths(agents: Mapping[str, AgentConfig], config: EvalConfig, engine: RolloutEngine | None) -> int:
    longest = max(a.max_total_tokens for a in agents.values())
    if engine is not None:
        limit = getattr(getattr(engine, "config", None), "max_model_len", None)
        source = "the engine's max_model_len"
    else:
        limit = config.engine.max_model_len
        source = "engine.max_model_len"
    if limit is not None and longest > limit:
        worst = max(agents, key=lambda f: agents[f].max_total_tokens)
        raise ValueError(f"agents.{worst}.max_total_tokens ({longest}) exceeds {source} ({limit}): lower the "
                         "agent's limit or raise the engine's")
    return int(limit) if limit is not None else longest


def _env_factories(families: Sequence[str], config: EvalConfig,
                   given: Mapping[str, EnvFactory] | None) -> dict[str, EnvFactory]:
    out = dict(given or {})
    for name in families:
        if name in out:
            continue
        out[name] = family_env_factory(name, config.envs, data_dir=config.data_dir)
    return out


class _RecordingEnv:
    """Delegates to an environment and keeps the checker's verdict type of each scored episode
    (BFCL's ``last_check["error_type"]``), keyed by task object and action texts."""

    def __init__(self, inner: Environment, sink: Verdicts) -> None:
        self.inner = inner
        self.sink = sink

    def tool_descriptions(self) -> list[dict[str, Any]]:
        return self.inner.tool_descriptions()

    def reset(self, task: Task) -> None:
        self.inner.reset(task)

    def step(self, action: Action) -> Observation:
        return self.inner.step(action)

    def reward(self, episode: Episode) -> float:
        reward = self.inner.reward(episode)
        check = getattr(self.inner, "last_check", None)
        if isinstance(check, dict):
            self.sink[(id(episode.task), tuple(a.raw for a in episode.actions))] = check.get("error_type")
        return reward

    def snapshot(self) -> Any:
        return self.inner.snapshot()

    def restore(self, snapshot: Any) -> None:
        self.inner.restore(snapshot)


def _recording(factory: EnvFactory, sink: Verdicts) -> EnvFactory:
    return lambda task: _RecordingEnv(factory(task), sink)


# ----------------------------------------------------------------------------------------- rollouts
def _rollouts_with_progress(
    engine: RolloutEngine, tokenizer: Any, factory: EnvFactory, tasks: Sequence[Task], m: int,
    agent: AgentConfig, config: EvalConfig, label: str,
) -> tuple[list[RolloutTree | None], dict[str, float]]:
    """:func:`run_rollouts` in chunks of ``config.progress_every`` examples, with a ``progress:``
    line after each (examples done, seconds, an estimate of what is left). Every request's sampling
    seed comes from the agent's seed, the task and the trajectory, never from the batch it is in,
    so the chunks give the same rollouts as one run."""
    chunk = config.progress_every or len(tasks) or 1
    trees: list[RolloutTree | None] = []
    stats: dict[str, float] = {}
    t0 = time.perf_counter()
    for start in range(0, len(tasks), chunk):
        part, part_stats = run_rollouts(engine, tokenizer, factory, tasks[start:start + chunk], m, agent,
                                        config.tool_workers)
        trees += part
        for key, value in part_stats.items():
            stats[key] = stats.get(key, 0.0) + value
        done, elapsed = len(trees), time.perf_counter() - t0
        if config.progress_every and len(tasks) > chunk:
            print(f"progress: {label}: {done}/{len(tasks)} examples, {elapsed:.0f} s, "
                  f"~{elapsed / done * (len(tasks) - done):.0f} s left", flush=True)
    return trees, stats


def run_rollouts(
    engine: RolloutEngine, tokenizer: Any, factory: EnvFactory, tasks: Sequence[Task], m: int,
    agent: AgentConfig, tool_workers: int = 4,
) -> tuple[list[RolloutTree | None], dict[str, float]]:
    """``m`` bare rollouts per task (:func:`~trace_core.evaluation.success.measure_success`, its
    request seeds keyed by ``agent.seed``); one tree per task, None for a task whose prompt leaves
    no room to generate under ``agent.max_total_tokens``."""
    from trace_core.rollout.executor import TreeRolloutExecutor

    fits = [len(render_prompt(tokenizer, t, factory(t).tool_descriptions(), agent)) < agent.max_total_tokens
            for t in tasks]
    runnable = [t for t, ok in zip(tasks, fits, strict=True) if ok]
    trees: list[RolloutTree | None] = [None] * len(tasks)
    stats: dict[str, float] = {"tasks": float(len(tasks)), "prompt_too_long": float(len(tasks) - len(runnable))}
    if runnable:
        executor = TreeRolloutExecutor(engine, tokenizer, factory, agent, tool_workers=tool_workers)
        result = measure_success(executor, runnable, m).rollouts
        done = iter(result.trees)
        trees = [next(done) if ok else None for ok in fits]
        s = result.stats
        stats.update(trajectories=s.trajectories, generated_tokens=s.generated_tokens, turns=s.turns,
                     tool_errors=s.tool_errors, requests=s.requests, prompt_tokens=s.prompt_tokens_submitted,
                     cached_prompt_tokens=s.cached_prompt_tokens, rollout_s=s.rollout_s, tool_s=s.tool_s,
                     wall_s=s.wall_s)
    return trees, stats


# ----------------------------------------------------------------------------------------- scoring
def trajectory_record(tree: RolloutTree, trajectory: int, task: Task, family: str,
                      details: Verdicts, record_actions: bool) -> dict[str, Any]:
    """One trajectory's outcome and costs, read from its tree path."""
    traj = tree.trajectories[trajectory]
    nodes = [tree.nodes[n] for n in tree.path(traj.leaf)[1:]]
    reward = float(tree.trajectory_reward(trajectory))
    answers = [n.info["final_answer"] for n in nodes if "final_answer" in n.info]
    final = answers[-1] if answers else None
    actions = tuple(n.info.get("action", "") for n in nodes)
    rec: dict[str, Any] = {
        "reward": reward,
        "success": bool(is_success(reward)),
        "answer": None if final is None else final[:MAX_TEXT],
        "turns": len(nodes),
        "tool_calls": sum(n.info.get("tool") is not None for n in nodes),
        "tool_errors": sum(bool(n.info.get("tool_error")) for n in nodes),
        "gen_tokens": sum(sum(n.loss_mask) for n in nodes),
        "total_tokens": len(tree.history_tokens(traj.leaf)),
        "finish_reason": nodes[-1].info.get("finish_reason") if nodes else None,
    }
    answer_metrics = get_family(family).answer_metrics
    if answer_metrics is not None:
        rec.update(answer_metrics(final, task))
    key = (id(task), actions)
    if key in details:  # the checker's verdict (BFCL): None when valid, else e.g. "multi_turn:..."
        rec["error_type"] = details[key]
    if record_actions:
        rec["actions"] = [a[:MAX_TEXT] for a in actions]
    return rec


def example_record(bench: Benchmark, task: Task, sampled: RolloutTree | None, greedy: RolloutTree | None,
                   config: EvalConfig, details: Verdicts) -> dict[str, Any]:
    """The per-example line of examples.jsonl."""
    answers = task.answer if isinstance(task.answer, list) else [task.answer]
    rec: dict[str, Any] = {
        "benchmark": bench.name, "family": bench.family, "domain": bench.domain, "id": task.id,
        "question": task.question[:MAX_TEXT], "answers": [str(a)[:MAX_TEXT] for a in answers],
    }
    ran = (sampled is not None) if config.samples else (greedy is not None)
    rec["prompt_too_long"] = not ran
    if config.samples:
        samples = [] if sampled is None else [
            trajectory_record(sampled, t.id, task, bench.family, details, config.record_actions)
            for t in sampled.trajectories]
        rec["samples"] = samples
        rec["n"] = config.samples
        rec["c"] = sum(s["success"] for s in samples)
        rec["pass_at_1"] = rec["c"] / config.samples
    if config.greedy:
        if greedy is None:
            rec["greedy"] = None
        else:
            rec["greedy"] = trajectory_record(greedy, greedy.trajectories[0].id, task, bench.family, details,
                                              config.record_actions)
    return rec


def benchmark_metrics(records: Sequence[Mapping[str, Any]], config: EvalConfig) -> dict[str, float]:
    """A benchmark's metrics from its per-example records (see :class:`BenchmarkResult`).

    Lengths, turns and tool use are means over the sampled trajectories (the greedy ones when
    there are none); examples whose prompt did not fit count as failures and are not in them."""
    k = config.samples
    out: dict[str, float] = {"examples": float(len(records)), "samples": float(k),
                             "prompt_too_long": float(sum(r["prompt_too_long"] for r in records))}
    extras = get_family(records[0]["family"]).answer_metric_names if records else ()
    if k:
        success = np.array([[s["success"] for s in r["samples"]] if r["samples"] else [False] * k
                            for r in records], dtype=bool).reshape(len(records), k)
        out["pass_at_1"] = pass_at_1_avg(success)
        for j in config.pass_at_values():
            if j != 1:
                out[f"pass_at_{j}"] = mean_pass_at_k(success, j)
        for name in extras:  # an example whose prompt did not fit scores 0
            out[name] = mean_or_nan([s[name] for r in records for s in r["samples"]] + [0.0] * _missing(records, k))
    if config.greedy:
        greedy = [r["greedy"] for r in records]
        out["greedy_acc"] = mean_or_nan([g is not None and g["success"] for g in greedy])
        for name in extras:
            out[f"greedy_{name}"] = mean_or_nan([g[name] if g is not None else 0.0 for g in greedy])
    trajs = [s for r in records for s in r["samples"]] if k else [r["greedy"] for r in records if r["greedy"]]
    for key in ("tool_calls", "turns", "gen_tokens", "total_tokens"):
        out[key] = mean_or_nan([t[key] for t in trajs])
    out["answered"] = mean_or_nan([t["answer"] is not None for t in trajs])
    turns = sum(t["turns"] for t in trajs)
    out["tool_error_rate"] = sum(t["tool_errors"] for t in trajs) / turns if turns else float("nan")
    return out


def _missing(records: Sequence[Mapping[str, Any]], k: int) -> int:
    return sum(k for r in records if not r["samples"])


# ----------------------------------------------------------------------------------------- outputs
def write_outputs(result: EvalResult, records: Sequence[Mapping[str, Any]], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    examples = out_dir / "examples.jsonl"
    with examples.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    summary = out_dir / "summary.md"
    result.files = {"examples": str(examples), "summary": str(summary), "result": str(out_dir / "result.json")}
    summary.write_text(summary_markdown(result))
    result.save(out_dir / "result.json")


def _log(result: EvalResult, config: EvalConfig, tracker: Tracker | None, out_dir: Path) -> None:
    own = None
    if tracker is None and config.tracking is not None:
        from trace_core.tracking import MLflowTracker

        # Its own spool, next to the results: never a training run's (a spool names its run).
        tracking = dataclasses.replace(config.tracking, spool_dir=str(out_dir / "mlflow_spool"),
                                       run_name=config.tracking.run_name or result.name)
        tracker = own = MLflowTracker(tracking, tags={"trace.kind": "evaluation"})
    if tracker is None:
        return
    log_result(tracker, result, step=config.log_step, prefix=config.metric_prefix)
    if own is not None:
        own.close()
