"""The TRACE step loop. One loop for every method; it reads like the method:

    sample a candidate pool → predictor scores the roots → root allocation → bare rollouts →
    prompt-local prefix expansion → rewards → tree-backed targets → predictor update →
    tree-aware advantages → policy update → weights to the rollout engine → checkpoint → log

Two method properties change the middle of that line, never the method's name: a root rule that
reads history (``method.reads_history``: GRESO, the posterior-aware roots) is handed the run's
:class:`~trace_core.history.PromptHistory` of bare root outcomes, which every step records and
every checkpoint keeps; a group filter (``method.samples_in_rounds``: DAPO) replaces allocation
and expansion by rounds of bare groups, whose dropped groups are paid for (budget, rollouts,
effective ratio) but not trained on; a token rule (``method.prices_tokens``: ``trace-tokens``)
plans the roots and each prompt's reservation in generated tokens (``budget.tokens_per_step``) and
its expansion spends each prompt's allowance. Every step prices its rollouts in expected
generated tokens from the run's :class:`~trace_core.token_ledger.TokenLedger` (kept by every
checkpoint) and logs the estimates beside what the rollouts generated.

A step is logged only after its checkpoint is written, and the tracker's spool resends what a
crash left unsent, so a resumed run continues the same MLflow run with no step missing or twice.
Any error once the tracking run exists leaves as one :class:`~trace_core.failures.RunFailed`
(the step, what it was writing, the cause in words, the last complete checkpoint, the command that
resumes), which is also the run's failure tag.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trace_core.config import ConfigError, flatten
from trace_core.costs import expected_root_tokens
from trace_core.evaluation.success import measure_success
from trace_core.failures import RunFailed, doing, refused_before_work, run_failed
from trace_core.history import PromptHistory
from trace_core.methods import get_method
from trace_core.metrics import AllocationStats, allocation_stats, anchor_allocation, pass_at_1, step_metrics
from trace_core.planner import RootPlan, StepPlanner
from trace_core.rollout.agent import render_prompt
from trace_core.rollout.env import Task
from trace_core.rollout.executor import (
    RolloutResult,
    TreeRolloutExecutor,
    expansion_of,
    merge_results,
)
from trace_core.rollout.guard import EngineGuardConfig, GuardedEngine
from trace_core.seeding import derive_seed, predictor_seed, step_sampling_seed
from trace_core.token_budget import uniform_groups_for_tokens, uniform_spec_for_tokens
from trace_core.token_ledger import TokenLedger, ledger_after_rollouts
from trace_core.tracking import MLflowTracker, Tracker, end_after, tracked_run
from trace_core.training.config import TrainConfig
from trace_core.training.heartbeat import Heartbeat
from trace_core.training.policy import PolicyOptimizer
from trace_core.training.profiler import PhaseProfiler
from trace_core.training.run_guard import (
    RUN_IDENTITY_FILE,
    check_inputs,
    check_resume,
    hold_output_dir,
    index_dir_of,
    run_identity,
)
from trace_core.training.step_history import HISTORY_FILE, append_step, read_history, start_over, write_base
from trace_core.tree import ROOT, RolloutTree, save_trees

STATE_FILE = "trainer_state.json"
SPOOL_DIR = "spool"  # in output_dir: the tracker's records not yet confirmed by the store


# ============================================================================ tasks
def load_tasks(cfg: TrainConfig) -> tuple[list[Task], Any]:
    """The training prompts and an environment factory for them."""
    tasks, factory, _ = load_task_rows(cfg)
    return tasks, factory


def load_task_rows(cfg: TrainConfig) -> tuple[list[Task], Any, dict[str, str]]:
    """The training prompts, an environment factory for them, and where each prompt comes from
    (``"<file> line <n>"`` by task id, for the errors that name a row). The file's rows must be of
    ``task.family``: QA rows under ``task.family=math`` are refused, not trained on. A family that
    reads a retriever index gets it from ``task.index_dir``, built from its corpus if missing."""
    from trace_core.envs.families import get_family
    from trace_core.envs.registry import family_env_factory, make_env_factory

    t = cfg.task
    family = get_family(t.family)
    if family.synthetic_tasks is not None:
        tasks = family.synthetic_tasks(family.settings(t.envs))
        return tasks, make_env_factory(t.family, t.envs), {
            task.id: f"synthetic prompt {i}" for i, task in enumerate(tasks)}
    path = Path(t.train_file or Path(t.data_dir) / t.family / "train.jsonl")
    if not path.is_file():
        raise ConfigError(f"task.train_file {path} does not exist (generate the embedded data with "
                          "`python -m trace_core.data.generate --out data`)")
    tasks, lines = read_task_rows(path, family=t.family)
    factory = family_env_factory(t.family, t.envs, data_dir=t.data_dir, index_dir=index_dir_of(cfg))
    return tasks, factory, {task.id: f"{path} line {line}" for task, line in zip(tasks, lines, strict=True)}


def read_tasks(path: Path, family: str | None = None) -> list[Task]:
    """The tasks of a normalized question file, validated first (nothing trains on invalid data)."""
    return read_task_rows(path, family)[0]


def read_task_rows(path: Path, family: str | None = None) -> tuple[list[Task], list[int]]:
    """The tasks of a normalized question file and their lines, validated first; with ``family``,
    the rows must be of that task family (a ConfigError naming the file, the first other row and
    the key otherwise)."""
    from trace_core.data.schema import Example
    from trace_core.data.validation import read_jsonl, validate_records
    from trace_core.envs.registry import example_to_task

    records, lines = read_jsonl(path)
    kind = validate_records(records, str(path), None, lines)
    if kind == "corpus":
        raise ConfigError(f"task.train_file {path} holds corpus passages, not questions")
    examples = [Example.from_record(r) for r in records]
    if family is not None:
        other = [(e, n) for e, n in zip(examples, lines, strict=True) if e.task != family]
        if other:
            e, n = other[0]
            raise ConfigError(f"task.family = {family!r}, but task.train_file {path} holds {e.task!r} rows "
                              f"({len(other)} of {len(examples)}; the first at line {n}, id {e.id!r}): set "
                              f"task.family={e.task} or point task.train_file at {family} rows")
    return [example_to_task(e) for e in examples], lines


# ============================================================================ state
@dataclass
class TrainerState:
    step: int = 0  # next step to run
    epoch: int = 0  # data cursor: pass over the prompts
    position: int = 0  # data cursor: index in this epoch's order
    order: list[int] | None = None  # this epoch's prompt order (None: not drawn yet)
    run_id: str | None = None  # MLflow run
    history: dict[str, list[float]] = field(default_factory=dict)  # per-step metrics kept for the plots
    pending: list[dict[str, Any]] = field(default_factory=list)  # steps checkpointed, not yet logged
    # files under the output dir that checkpointed steps wrote and the tracker has not yet taken
    # (each step's trees, its allocation record), as [relative path, artifact folder]
    pending_files: list[list[str]] = field(default_factory=list)
    # pool success measured so far: {"step": s (after s updates), "success", "rollouts", "generated_tokens"}
    pool_success: list[dict[str, float]] = field(default_factory=list)
    # held-out pass@1 measured so far: {"step", "pass_at_1", "se", "questions", "rollouts", "generated_tokens"}
    heldout: list[dict[str, float]] = field(default_factory=list)
    warmup: dict[str, float] | None = None  # the predictor warm-up's figures, once it ran
    # every prompt's bare root outcomes so far, with the predictions used (PromptHistory.to_dict):
    # read by the history rules (GRESO, the posterior roots), kept for every method
    root_outcomes: dict[str, Any] | None = None
    # the run's result-defining fields (run_guard.run_identity): a resume with others is refused
    identity: dict[str, Any] | None = None
    # the token budget's ledger (TokenLedger.to_dict): the cost estimates' state and the one-budget
    # rule's calibration, kept for every method (None: no step has run)
    token_ledger: dict[str, Any] | None = None


@dataclass
class StepOutput:
    """What one training step hands the loop: its trees (every sampled one, in the lossless tree
    format), the bare rollouts per candidate, the allocation record written to ``allocations/``,
    and the step's metrics (names as logged)."""

    trees: list[RolloutTree]
    m: np.ndarray  # bare rollouts per candidate of the pool
    allocation: dict[str, Any]  # pool ids, scores v, m, K by position, dropped groups, rounds
    metrics: dict[str, float]


class Trainer:
    """Builds everything from a :class:`TrainConfig` and runs (or resumes) the step loop."""

    def __init__(self, cfg: TrainConfig, tracker: Tracker | None = None, engine: Any = None,
                 resume_command: str | None = None) -> None:
        """``engine``: an already running rollout engine to reuse (its weights are replaced by the
        policy's); None builds one from ``cfg.engine``. ``resume_command``: the command that
        resumes this run, named when it fails (None: "rerun the same command").

        Every check comes before any work (:mod:`~trace_core.training.run_guard`): the paths, then
        the output_dir's writer lock (held until :meth:`run` ends), then whether its checkpoint is
        of this configuration, the data, the prompts' lengths in tokens, the tracking store; only
        then the engine and the policy. An error after the tracking run exists ends it FAILED,
        with the reason."""
        self.cfg = cfg
        self.out = Path(cfg.output_dir)
        self.resume_command = resume_command
        self._lock = None
        try:
            check_inputs(cfg)
            self._lock = hold_output_dir(self.out)
            self._prepare(cfg)
            # The tracking store is checked (and the run created or resumed) before anything heavy
            # is loaded: a store that cannot be written is an error before any model exists.
            self.tracker = tracker if tracker is not None else self._build_tracker()
        except BaseException as err:
            if tracker is not None:  # a caller's run exists already: it ends FAILED too, with the reason
                end_after(tracker, err)
            self._release_output_dir()
            raise
        try:
            try:
                self._build(cfg, engine)
            except Exception as err:
                if isinstance(err, refused_before_work()):
                    raise
                raise self._run_failed(err, "start-up (the engine, the policy)") from err
        except BaseException as err:
            end_after(self.tracker, err)  # the run exists: it ends FAILED (KILLED on a signal), with the reason
            self._release_output_dir()
            raise

    def _prepare(self, cfg: TrainConfig) -> None:
        """Everything before the tracking run: the method, the resume check, the data, the
        tokenizer and the prompts' lengths, the state of the last checkpoint."""
        if not cfg.progress:  # a pipeline step: say what the first silent seconds are spent on
            print(f"progress: train {cfg.method}: loading the data, the policy and the rollout engine", flush=True)
        self.method = get_method(cfg.method)
        self.spec = cfg.budget.spec()
        self.estimator = self.method.advantage_estimator(cfg.advantage)
        self._ckpt_root = self.out / "checkpoints"
        self.identity = run_identity(cfg)
        self._check_resume()
        self.tasks, self.env_factory, where = load_task_rows(cfg)
        if len(self.tasks) < self.spec.pool_size:
            source = cfg.task.train_file or f"the {cfg.task.family} default"
            raise ConfigError(f"the candidate pool needs B = budget.pool_factor·M(1+N)/G = {self.spec.pool_size} "
                              f"distinct prompts per step but task.train_file ({source}) holds only "
                              f"{len(self.tasks)}: lower budget.pool_factor (= {cfg.budget.pool_factor}) or "
                              f"budget.roots_M (= {cfg.budget.roots_M})")
        self._warmup_tasks: list[Task] = []
        if cfg.predictor_warmup.task_file and self.method.uses_predictor:
            warm = Path(cfg.predictor_warmup.task_file)
            self._warmup_tasks, lines = read_task_rows(warm, family=cfg.task.family)
            where.update({t.id: f"{warm} line {n}" for t, n in zip(self._warmup_tasks, lines, strict=True)})
            shared = sorted({t.id for t in self.tasks} & {t.id for t in self._warmup_tasks})
            if shared:
                raise ConfigError(f"predictor_warmup.task_file shares {len(shared)} questions with the training "
                                  f"pool (e.g. {shared[0]!r}): the warm-up split must be disjoint from it")
        self._heldout_tasks = self._read_heldout_tasks(where)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(cfg.policy_model)
        self._prompt_ids: dict[str, list[int]] = {}
        self._check_prompt_lengths([*self.tasks, *self._warmup_tasks, *self._heldout_tasks], where)
        self.state = TrainerState()
        # the first guesses of the cost model, capped by what the agent can generate at all
        agent = cfg.agent
        self._cost_model = replace(cfg.costs,
                                   initial_tokens=min(cfg.costs.initial_tokens, agent.max_new_tokens * agent.max_turns),
                                   initial_turns=min(cfg.costs.initial_turns, agent.max_turns))
        self.planner = StepPlanner(self.method, self.spec, TokenLedger(self._cost_model), PromptHistory(),
                                   cfg.predictor.explore_fraction)
        self.rng = np.random.default_rng(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.profiler = PhaseProfiler()
        self._latest = self._latest_checkpoint()
        if self._latest is not None:
            self._load_trainer_state(self._latest)
        else:  # figures of a start that crashed before its first checkpoint: that run starts over
            start_over(self.out / HISTORY_FILE)

    def _build(self, cfg: TrainConfig, engine: Any) -> None:
        """The engine, the policy and the predictor (from the last checkpoint, if any)."""
        latest = self._latest
        # Engine first: an in-process vLLM creates the process group DeepSpeed then joins. Guarded:
        # a crash or a hang inside it becomes one EngineFault (trace_core.rollout.guard).
        self.engine = GuardedEngine(engine if engine is not None else self._build_engine(),
                                    EngineGuardConfig(poll_timeout_s=cfg.engine.poll_timeout_s))
        self.policy = PolicyOptimizer(cfg.policy_model, cfg.policy)
        if engine is not None:
            self.engine.load_weights(self.policy.full_state_dict())
        from trace_core.predictor import SuccessPredictor

        self.predictor = SuccessPredictor(replace(cfg.predictor, seed=predictor_seed(cfg.seed, cfg.predictor.seed)))
        if latest is not None:
            self.policy.load_checkpoint(latest / "policy", tag="policy")
            self.predictor.load_state_dict(torch.load(latest / "predictor.pt", weights_only=False))
            self.engine.load_weights(self.policy.full_state_dict())
        self.executor = TreeRolloutExecutor(self.engine, self.tokenizer, self.env_factory, cfg.agent)

    def _release_output_dir(self) -> None:
        """Give the output_dir's writer lock back (once): the run ended, or never started."""
        lock, self._lock = getattr(self, "_lock", None), None
        if lock is not None:
            lock.release()

    def _check_resume(self) -> None:
        """Refuse the folder's checkpoint when it is of another configuration (its identity,
        :func:`~trace_core.training.run_guard.run_identity`, differs); read before anything loads."""
        latest = self._latest_checkpoint()
        if latest is not None:
            saved = json.loads((latest / STATE_FILE).read_text()).get("identity")
            check_resume(saved, self.identity, self.out, f"a checkpoint ({latest.name})")
            return
        # Killed before its first checkpoint, a run leaves its tracking run in the spool, which the
        # tracker resumes: the identity written beside it when the run was created decides.
        marker = self.out / RUN_IDENTITY_FILE
        if (self.out / SPOOL_DIR).exists() and marker.is_file():
            check_resume(json.loads(marker.read_text()), self.identity, self.out,
                         "the tracking spool of a run stopped before its first checkpoint", source="spool")

    def _check_prompt_lengths(self, tasks: Sequence[Task], where: dict[str, str]) -> None:
        """Every prompt, rendered as the rollout renders it, leaves the model room for its first
        turn: shorter than ``agent.max_total_tokens`` (which engine.max_model_len bounds, and which
        the model's positions bound in turn). A ConfigError names the rows that do not."""
        limit = self.cfg.agent.max_total_tokens
        over = [(len(ids), t) for t in tasks if len(ids := self._prompt_tokens(t)) >= limit]
        if not over:
            return
        over.sort(key=lambda x: -x[0])
        shown = "; ".join(f"{where.get(t.id, 'a prompt')} (id {t.id!r}): {n} tokens" for n, t in over[:5])
        more = f"; and {len(over) - 5} more" if len(over) > 5 else ""
        raise ConfigError(f"{len(over)} prompt(s) leave the model no room to answer: a prompt (system turn, tool "
                          f"schemas, question) must be shorter than agent.max_total_tokens = {limit} tokens: "
                          f"{shown}{more}. Raise agent.max_total_tokens (and engine.max_model_len) or drop these "
                          "rows")

    def sampling_seed(self, step: int) -> int:
        return step_sampling_seed(self.cfg.seed, self.cfg.agent.seed, step)

    # ------------------------------------------------------------------ construction
    def _build_engine(self):
        from trace_core.rollout.build import build_engine

        return build_engine(self.cfg.engine.engine_config(self.cfg.policy_model, self.cfg.seed))

    def _build_tracker(self) -> Tracker:
        from dataclasses import replace

        tcfg = replace(self.cfg.tracking, spool_dir=str(self.out / SPOOL_DIR),
                       run_name=self.cfg.tracking.run_name or f"{self.cfg.method}-seed{self.cfg.seed}")
        tracker = MLflowTracker(tcfg, run_id=self.state.run_id,
                                tags={"method": self.cfg.method, "task": self.cfg.task.family})
        if self.state.run_id is None:
            tracker.log_params(flatten(self.cfg))
        marker = self.out / RUN_IDENTITY_FILE
        marker.with_suffix(".tmp").write_text(json.dumps(self.identity, indent=1, sort_keys=True))
        os.replace(marker.with_suffix(".tmp"), marker)
        return tracker

    # ------------------------------------------------------------------ data
    def _next_pool(self) -> list[Task]:
        """The next ``pool_size`` prompts of the data cursor, never one prompt twice in a pool."""
        if self.state.order is None:
            self.state.order = epoch_order(len(self.tasks), self.cfg.seed, self.state.epoch, [])
        taken, self.state.order, self.state.epoch, self.state.position = next_pool(
            self.state.order, self.state.epoch, self.state.position, self.spec.pool_size, self.cfg.seed)
        return [self.tasks[i] for i in taken]

    def _prompt_tokens(self, task: Task) -> list[int]:
        if task.id not in self._prompt_ids:
            env = self.env_factory(task)
            self._prompt_ids[task.id] = render_prompt(self.tokenizer, task, env.tool_descriptions(), self.cfg.agent)
        return self._prompt_ids[task.id]

    # ------------------------------------------------------------------ measurement and warm-up
    def measure_pool_success(self, step: int) -> dict[str, float]:
        """Pool success after ``step`` updates (:class:`PoolSuccessConfig`); its per-prompt figures
        go to ``pool_success/step<step>.json``."""
        ps = self.cfg.pool_success
        measured = measure_success(self.executor, self.tasks, ps.samples, derive_seed("pool_success", ps.seed))
        per_prompt, stats = measured.rates(), measured.rollouts.stats
        print(f"progress: {self.cfg.method} pool success after {step} steps: {measured.mean_rate():.3f} "
              f"({stats.trajectories} rollouts)", flush=True)
        record = {"step": float(step), "success": measured.mean_rate(), "rollouts": float(stats.trajectories),
                  "generated_tokens": float(stats.generated_tokens)}
        self._keep_measurement("pool_success", step, record, {"samples": ps.samples, "per_prompt": per_prompt},
                               {"pool/success": record["success"], "pool/rollouts": record["rollouts"]},
                               self.state.pool_success)
        return record

    def _read_heldout_tasks(self, where: dict[str, str]) -> list[Task]:
        """The held-out questions (:class:`HeldoutConfig`), refused when one is also a training or
        warm-up question: a held-out figure on trained questions measures memory."""
        file = self.cfg.heldout.task_file
        if not file:
            return []
        tasks, lines = read_task_rows(Path(file), family=self.cfg.task.family)
        where.update({t.id: f"{file} line {n}" for t, n in zip(tasks, lines, strict=True)})
        for name, others in (("training pool", self.tasks), ("predictor warm-up split", self._warmup_tasks)):
            shared = sorted({t.id for t in tasks} & {t.id for t in others})
            if shared:
                raise ConfigError(f"heldout.task_file {file} shares {len(shared)} questions with the {name} "
                                  f"(e.g. {shared[0]!r}): held-out questions must be in neither")
        return tasks

    def measure_heldout(self, step: int) -> dict[str, float]:
        """Held-out pass@1 after ``step`` updates (:class:`HeldoutConfig`); the per-question success
        counts go to ``heldout/step<step>.json``."""
        h = self.cfg.heldout
        k = h.samples_at(step, self.cfg.steps)
        measured = measure_success(self.executor, self._heldout_tasks, k, derive_seed("heldout", h.seed))
        successes, stats = measured.successes, measured.rollouts.stats
        p = pass_at_1(successes, k)
        print(f"progress: {self.cfg.method} held-out pass@1 after {step} steps: {p.value:.3f} ± {p.se:.3f} "
              f"({stats.trajectories} rollouts)", flush=True)
        record = {"step": float(step), "pass_at_1": p.value, "se": p.se, "questions": float(p.questions),
                  "rollouts": float(stats.trajectories), "generated_tokens": float(stats.generated_tokens)}
        self._keep_measurement("heldout", step, record, {"samples": k, "successes": successes},
                               {"heldout/pass_at_1": p.value, "heldout/se": p.se}, self.state.heldout)
        return record

    def _keep_measurement(self, folder: str, step: int, record: dict[str, float], detail: dict[str, Any],
                          metrics: dict[str, float], kept: list[dict[str, float]]) -> None:
        """A measurement's file (``folder/step<step>.json``: the record and its per-question
        detail), its record in the state and its metrics and file pending for the tracker."""
        rel = f"{folder}/step{step:05d}.json"
        (self.out / folder).mkdir(parents=True, exist_ok=True)
        (self.out / rel).write_text(json.dumps({**record, **detail}))
        kept.append(record)
        self.state.pending.append({"step": step, "timestamp": int(time.time() * 1000), "metrics": metrics})
        self.state.pending_files.append([rel, folder])

    def _heldout_due(self, step: int) -> bool:
        h = self.cfg.heldout
        wanted = step in h.at_steps or (h.at_end and step == self.cfg.steps)
        return bool(self._heldout_tasks) and wanted and all(int(r["step"]) != step for r in self.state.heldout)

    def _pool_success_due(self, step: int) -> bool:
        ps = self.cfg.pool_success
        wanted = step in ps.at_steps or (ps.at_end and step == self.cfg.steps)
        return ps.samples > 0 and wanted and all(int(r["step"]) != step for r in self.state.pool_success)

    def warm_up_predictor(self) -> dict[str, float]:
        """Fit the predictor on the warm-up split before RL (:class:`PredictorWarmupConfig`)."""
        w = self.cfg.predictor_warmup
        tasks = self._warmup_tasks  # read and checked (disjoint from the pool, lengths) when the trainer was built
        t0 = time.perf_counter()
        measured = measure_success(self.executor, tasks, w.samples, derive_seed("predictor_warmup", w.seed))
        result = measured.rollouts
        fit = self.predictor.fit(result.trees, w.updates)
        save_trees(self.out / "warmup_trees.jsonl.gz", result.trees)
        self.state.pending_files.append(["warmup_trees.jsonl.gz", "warmup"])
        # the same policy's real lengths: step 0 prices its rollouts at them, not at the first guess
        self.planner.observe_rollouts(result.trees)
        self.state.token_ledger = self.planner.ledger.to_dict()
        self.state.warmup = {"rollouts": float(result.stats.trajectories), "questions": float(len(tasks)),
                             "generated_tokens": float(result.stats.generated_tokens),
                             "success": measured.mean_rate(),
                             "first_loss": fit["first_loss"], "last_loss": fit["loss"],
                             "updates": float(w.updates), "wall_s": time.perf_counter() - t0}
        return self.state.warmup

    # ------------------------------------------------------------------ one step
    def train_step(self) -> StepOutput:
        """One step of the method (docs/architecture.md's table): allocate, roll out, expand, score,
        update the predictor, advantages, update the policy, sync the engine."""
        prof = self.profiler
        step = self.state.step
        pool = self._next_pool()
        with prof.phase("predictor_scoring"):
            v = self.predictor.score_histories([self._prompt_tokens(t) for t in pool])
        root_pred = {t.id: float(v[i]) for i, t in enumerate(pool)}
        ledger = self.planner.ledger  # the costs as they stand before this step's rollouts
        ids = [t.id for t in pool]
        plan: RootPlan | None = None
        if self.method.samples_in_rounds:  # the roots are chosen round by round, after each round's outcomes
            root_cost = self.planner.root_costs(ids)
            with prof.phase("rollout"):
                rounds = self.executor.run_in_rounds(pool, v, self.method, self.spec, self.rng,
                                                     sampling_seed=self.sampling_seed(step),
                                                     history=self.planner.history_view(ids, step))
            result, m = rounds.result, rounds.m
        else:
            plan = self.planner.plan_roots(v, ids, step, self.rng)
            m, root_cost = plan.m, plan.root_cost

            def score_prefixes(tree, nodes):
                return self.predictor.score_trees([tree], [list(nodes)])[0][list(nodes)]

            expansion = expansion_of(self.method, self.spec.expansion_N, score_prefixes, plan.tokens)
            with prof.phase("rollout"):
                result = self.executor.run(pool, m.tolist(), expansion, self.rng,
                                           sampling_seed=self.sampling_seed(step))
                if self.spec.prices_tokens and not self.method.prices_tokens and ledger.costs.step < 0:
                    result, m, root_cost = self._spend_the_rest(pool, v, step, m, result, ledger, root_cost,
                                                                expansion)
        # Wall-time attribution: the executor's loop is either in the engine, in the prefix scorer,
        # or outside both (tool steps and restores, waiting for tool threads). stats.tool_s sums
        # the tool threads' own durations, which overlap each other and the engine, so it is no
        # share of the wall clock.
        stats = result.stats
        prof.move("rollout", "tool_execution", max(0.0, stats.wall_s - stats.rollout_s - stats.scoring_s))
        prof.move("rollout", "predictor_scoring", stats.scoring_s)
        # Every sampled tree (a round rule's dropped groups included) was paid for and is evidence
        # for the predictor and the history; the policy trains on the kept ones only.
        trees = result.trees
        kept = [bool(k) for k in result.kept]
        trained = [t for t, k in zip(trees, kept, strict=True) if k]
        # Predictions made before the update (roots: stage 1; anchors: stage 2) for honest Spearman.
        with prof.phase("predictor_update"):
            pstats = self.predictor.update(trees, result.predictions_before_update(root_pred))
        advantages = self.estimator(trained)
        ostats: dict[str, float] = {}
        if trained:  # a group filter can leave nothing to train on
            with prof.phase("policy_optimisation"):
                ostats = self.policy.update(trained, advantages)
            with prof.phase("weight_sync"):
                self.engine.load_weights(self.policy.full_state_dict())

        k, pos = anchor_allocation(trees)
        alloc = allocation_stats(m, k, pos, trees)
        metrics = self._step_metrics(trees, kept, advantages, alloc, result)
        # the root outcomes into the history, the realised lengths into the ledger (the next
        # checkpoint keeps both)
        metrics.update(self.planner.observe_trees(step, trees, dict(zip(ids, root_cost.tolist(), strict=True)),
                                                  root_pred, plan))
        self.state.token_ledger = self.planner.ledger.to_dict()
        self.state.root_outcomes = self.planner.history.to_dict()
        if plan is not None:
            extra_roots = sum(c.kind == "continuation" and c.branch_node == ROOT for t in trees for c in t.trajectories)
            metrics.update(self.planner.token_figures(plan, extra_roots))
        metrics.update({f"predictor/{k2}": float(v2) for k2, v2 in pstats.items()})
        metrics.update({f"policy/{k2}": float(v2) for k2, v2 in ostats.items()})
        allocation = {"pool": [t.id for t in pool], "v": [float(x) for x in v], "m": [int(x) for x in m],
                      "k_by_position": [int(x) for x in alloc.k_by_position],
                      # which of the logged trees (in their file's order) the policy trained on
                      "kept": kept,
                      "dropped": [t.prompt_id for t, kk in zip(trees, kept, strict=True) if not kk],
                      "rounds": int(result.rounds)}
        return StepOutput(trees=trees, m=m, allocation=allocation, metrics=metrics)

    def _spend_the_rest(self, pool: list[Task], v: np.ndarray, step: int, m: np.ndarray, first: RolloutResult,
                        ledger: TokenLedger, root_cost: np.ndarray,
                        expansion: Any) -> tuple[RolloutResult, np.ndarray, np.ndarray]:
        """A uniform method's first step at a token budget, the ledger having seen no rollout: the
        groups planned at the first guess (``costs.initial_tokens``, capped at what the agent can
        generate) are a probe; what the rest of the budget buys at the lengths they measured is
        rolled out next, from the candidates not yet opened, by the method's own root rule.

        Why: the guess is a bound, often several times the policy's real length, so the step would
        otherwise buy a fraction of what the budget allows (a method with a predictor warm-up
        learns the lengths from it before step 0 and never comes here). One second wave, not more:
        its prices are measured, not guessed. Returns the merged result (the trees in pool order),
        the bare rollouts per candidate, and the root prices each tree was bought at."""
        G = self.spec.group_size_G
        left = int(self.spec.tokens_per_step) - int(first.stats.generated_tokens)
        unopened = np.flatnonzero(m == 0)
        if left < G or unopened.size == 0:
            return first, m, root_cost
        measured, _ = ledger_after_rollouts(ledger, first.trees)
        rest_pool = [pool[i] for i in unopened]
        cost = expected_root_tokens(measured.costs, measured.cost_model, [t.id for t in rest_pool])
        if uniform_groups_for_tokens(cost, left, G) < 1:
            return first, m, root_cost
        rest_spec = uniform_spec_for_tokens(replace(self.spec, tokens_per_step=left), cost)
        m_rest = self.planner.allocate(v[unopened], [t.id for t in rest_pool], step, rest_spec, self.rng)
        rest = self.executor.run(rest_pool, m_rest.tolist(), expansion, self.rng,
                                 sampling_seed=derive_seed(self.sampling_seed(step), "the rest of a first step"))
        merged = merge_results([first, rest])
        position = {t.id: i for i, t in enumerate(pool)}
        order = sorted(range(len(merged.trees)), key=lambda j: position[merged.trees[j].prompt_id])
        merged = replace(merged, trees=[merged.trees[j] for j in order], kept=[merged.kept[j] for j in order],
                         anchor_predictions=[merged.anchor_predictions[j] for j in order])
        m, root_cost = m.copy(), root_cost.copy()
        m[unopened] = m_rest
        root_cost[unopened] = cost
        return merged, m, root_cost

    def _step_metrics(self, trees: list[RolloutTree], kept: list[bool], advantages: Sequence[np.ndarray],
                      alloc: AllocationStats, result: RolloutResult) -> dict[str, float]:
        """method §7's figures of one step (:func:`~trace_core.metrics.step_metrics`: over every
        rollout spent, ``advantages`` the kept trees'), the executor's budget, and the history's size.

        The per-second figure divides by the rollout phase's wall time: the executor's whole run
        (``RolloutStats.wall_s``, every round of a round rule: generation, tool steps and prefix
        scoring), not the engine's share of it (``rollout_s``), so that a method's own overhead
        counts against it; ``budget/rollout_wall_s`` logs it, to be pooled over steps."""
        metrics = step_metrics(trees, kept, advantages, alloc, result.rounds, rollout_s=result.stats.wall_s)
        metrics.update({
            "budget/trajectories": float(result.stats.trajectories),
            "budget/generated_tokens": float(result.stats.generated_tokens),
            "budget/cached_prompt_tokens": float(result.stats.cached_prompt_tokens),
            "budget/rollout_wall_s": float(result.stats.wall_s),
            "history/prompts": float(len(self.planner.history)),  # prompts with a record when this step allocated
        })
        return metrics

    # ------------------------------------------------------------------ loop
    def run(self) -> dict[str, Any]:
        """Run (or resume) to ``cfg.steps``. The tracked run is RUNNING meanwhile and ends KILLED on
        SIGTERM/SIGINT (:func:`~trace_core.tracking.tracked_run`), FAILED on an exception, which
        leaves as a :class:`~trace_core.failures.RunFailed` (a crashed or hung engine included:
        it is not retried in this process, whose engine state is unknown)."""
        try:
            with tracked_run(self.tracker):
                try:
                    return self._run()
                except Exception as err:
                    if isinstance(err, refused_before_work()):
                        raise
                    activity = getattr(self, "_activity", "the run")  # the step (its phase has ended by now)
                    raise self._run_failed(err, getattr(activity, "label", str(activity))) from err
                finally:
                    self.engine.stop_watchdog()  # the engine may outlive this trainer (a caller's engine)
        finally:
            self._release_output_dir()  # the run is over: another process may resume it now

    def _run_failed(self, err: BaseException, during: str) -> RunFailed:
        """``err`` in plain words (:func:`~trace_core.failures.run_failed`), with the last complete
        checkpoint and the command that resumes; its traceback goes to the run folder's log."""
        return run_failed(err, during=during, kept=self._latest_checkpoint(), output_dir=self.out,
                          resume=self.resume_command)

    def _reached(self, boundary: str, step: int) -> None:
        """Called at each phase boundary of a step (``trees_saved``, ``checkpointed``, ``logged``):
        the seam where the kill-at-every-boundary test injects its hard exit. Does nothing."""

    def _run(self) -> dict[str, Any]:
        from tqdm.auto import tqdm

        cfg = self.cfg
        start = self.state.step
        # Records of the loaded checkpoint are sent again: MLflow drops exact duplicates (same
        # key, step, timestamp, value), and a crash before they were sent loses nothing.
        self._log_pending()
        bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc=f"train {cfg.method}",
                   disable=not cfg.progress, unit="step")
        self._activity = f"train {cfg.method}: starting"
        # A progress line at least every 20 s naming what runs (a step's phase, the warm-up, a
        # pool-success measurement), also when the bar is off (a pipeline step).
        with Heartbeat(lambda: str(self._activity), interval_s=20.0) as beat:
            self._beat = beat
            return self._loop(start, bar, beat)

    def _loop(self, start: int, bar: Any, beat: Heartbeat) -> dict[str, Any]:
        cfg = self.cfg
        last: dict[str, float] = {}
        if (start == 0 and self.state.warmup is None and self.method.uses_predictor
                and cfg.predictor_warmup.task_file):
            self._activity = f"train {cfg.method}: predictor warm-up"
            w = self.warm_up_predictor()
            beat.line(f"{cfg.method} predictor warm-up: {w['rollouts']:.0f} rollouts on {w['questions']:.0f} "
                      f"questions, loss {w['first_loss']:.3f} -> {w['last_loss']:.3f} in {w['wall_s']:.0f} s")
        t_loop = time.perf_counter()
        for step in bar:
            phase = self.profiler
            self._activity = _StepActivity(f"train {cfg.method} step {step + 1}/{cfg.steps}", phase)
            if self._pool_success_due(step):
                self.measure_pool_success(step)
            if self._heldout_due(step):
                self.measure_heldout(step)
            done_step = self.train_step()
            trees, allocation, out = done_step.trees, done_step.allocation, done_step.metrics
            # This step's phases, plus the previous step's checkpoint and logging.
            metrics = {**out, **self.profiler.end_step()}
            self.state.step = step + 1
            for key, value in metrics.items():
                self.state.history.setdefault(key, []).append(float(value))
            history_file = self.out / HISTORY_FILE
            with doing("appending the step's figures", history_file):
                append_step(history_file, step, metrics)  # the checkpoint holds no figures: it stays flat
            self.state.pending.append({"step": step, "timestamp": int(time.time() * 1000), "metrics": metrics})
            # Every tree of the step, and its allocation, on disk before the checkpoint that
            # records them as pending: a crash after it loses neither.
            trees_file = self.out / "trees" / f"step{step:05d}.jsonl.gz"
            with doing("writing the step's trees", trees_file):
                save_trees(trees_file, trees)
            alloc_file = self.out / "allocations" / f"step{step:05d}.json"
            with doing("writing the step's allocation", alloc_file):
                alloc_file.parent.mkdir(parents=True, exist_ok=True)
                alloc_file.write_text(json.dumps({"step": step, **allocation}))
            self.state.pending_files += [[f"trees/step{step:05d}.jsonl.gz", "trees"],
                                         [f"allocations/step{step:05d}.json", "allocations"]]
            self._reached("trees_saved", step)
            if self._pool_success_due(self.state.step):  # after the last step, before its checkpoint
                self.measure_pool_success(self.state.step)
            if self._heldout_due(self.state.step):
                self.measure_heldout(self.state.step)
            if self.state.step % cfg.checkpoint_every == 0 or self.state.step == cfg.steps:
                with self.profiler.phase("checkpoint"), \
                        doing(f"writing checkpoint step_{self.state.step:06d}", self._ckpt_root):
                    self._save_checkpoint()
                self._reached("checkpointed", step)
                with self.profiler.phase("logging"), doing("spooling the step's records", self.out / SPOOL_DIR):
                    self._log_pending()  # only what a checkpoint already holds
                self._reached("logged", step)
            last = metrics
            bar.set_postfix(eff=f"{out['effective_ratio']:.2f}", reward=f"{out['reward/mean']:.2f}")
            if not cfg.progress:  # no bar (a pipeline step): one line per step
                done = step + 1 - start
                elapsed = time.perf_counter() - t_loop
                beat.line(f"train {cfg.method} step {step + 1}/{cfg.steps}: effective ratio "
                          f"{out['effective_ratio']:.2f}, reward {out['reward/mean']:.2f}, {elapsed:.0f} s, "
                          f"~{elapsed / done * (cfg.steps - step - 1):.0f} s left")
        self._activity = f"train {cfg.method}: finishing (plots, policy save)"
        return self._finish(last)

    def _log_pending(self) -> None:
        for rec in self.state.pending:
            self.tracker.log_metrics(rec["metrics"], rec["step"], timestamp=rec["timestamp"])
        for rel, folder in self.state.pending_files:
            if (self.out / rel).is_file():
                self.tracker.log_artifact(self.out / rel, folder)
        self.state.pending = []
        self.state.pending_files = []

    def _finish(self, last: dict[str, float]) -> dict[str, Any]:
        from trace_core.training.plots import training_plots

        for name, fig in training_plots(self.state.history).items():
            self.tracker.log_figure(fig, f"plots/{name}.png")
            import matplotlib.pyplot as plt  # there are figures, so matplotlib is there

            plt.close(fig)  # logged: a long-lived process (a benchmark, the tests) must not keep every figure
        table = self.profiler.table()
        (self.out / "cost_breakdown.txt").write_text(table + "\n")
        self.tracker.log_artifact(self.out / "cost_breakdown.txt")
        undelivered = self.tracker.close()  # records the store has not confirmed yet (it warns how to deliver)
        summary = {"method": self.cfg.method, "steps": self.state.step, "run_id": self.tracker.run_id,
                   "final": last, "cost_fractions": self.profiler.fractions(),
                   "pool_success": self.state.pool_success, "heldout": self.state.heldout,
                   "warmup": self.state.warmup,
                   "tracking_undelivered": int(undelivered or 0)}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
        self.policy.save_pretrained(self.out / "policy")
        self.tokenizer.save_pretrained(self.out / "policy")
        print(f"\nCost breakdown ({self.cfg.method}, {self.state.step} steps)\n{table}")
        return summary

    # ------------------------------------------------------------------ checkpoints
    def _latest_checkpoint(self) -> Path | None:
        return latest_checkpoint(self.out)

    def _save_checkpoint(self) -> None:
        tag = f"step_{self.state.step:06d}"
        path = self._ckpt_root / tag
        tmp = self._ckpt_root / f".{tag}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.policy.save_checkpoint(tmp / "policy", tag="policy")
        torch.save(self.predictor.state_dict(), tmp / "predictor.pt")
        with open(tmp / "rng.pkl", "wb") as f:
            pickle.dump({"numpy": self.rng.bit_generator.state, "torch": torch.get_rng_state()}, f)
        self.state.run_id = self.tracker.run_id
        self.state.identity = self.identity
        # the per-step figures live in HISTORY_FILE (appended each step), not in every checkpoint
        (tmp / STATE_FILE).write_text(json.dumps({**self.state.__dict__, "history": {}}, default=float))
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
        pointer = self._ckpt_root / "latest"
        pointer.with_suffix(".tmp").write_text(tag)
        os.replace(pointer.with_suffix(".tmp"), pointer)  # the step is durable from here on
        kept = sorted(p for p in self._ckpt_root.glob("step_*") if p.is_dir())
        for old in kept[: -self.cfg.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    def _load_trainer_state(self, path: Path) -> None:
        data = json.loads((path / STATE_FILE).read_text())
        history_file = self.out / HISTORY_FILE
        if data.get("history"):  # a checkpoint written when it carried the figures itself
            write_base(history_file, data["history"], data["step"])
        data["history"] = read_history(history_file, data["step"])
        self.state = TrainerState(**data)
        self.planner.load_state_dict({"root_outcomes": self.state.root_outcomes,
                                      "token_ledger": self.state.token_ledger})
        with open(path / "rng.pkl", "rb") as f:
            rng = pickle.load(f)
        self.rng.bit_generator.state = rng["numpy"]
        torch.set_rng_state(rng["torch"])


class _StepActivity:
    """What a step is doing now, for the heartbeat: its label and the profiler's current phase."""

    def __init__(self, label: str, profiler: PhaseProfiler) -> None:
        self.label, self.profiler = label, profiler

    def __str__(self) -> str:
        return f"{self.label}: {self.profiler.current or 'between phases'}"


def epoch_order(num_tasks: int, seed: int, epoch: int, defer: Sequence[int]) -> list[int]:
    """Epoch ``epoch``'s order of the prompts: a seeded permutation, with the prompts in ``defer``
    (those already in the pool being filled when the epoch starts) moved to its end, in order."""
    order = np.random.default_rng([seed, epoch]).permutation(num_tasks).tolist()
    later = set(defer)
    return [i for i in order if i not in later] + [i for i in order if i in later]


def next_pool(order: list[int], epoch: int, position: int, size: int, seed: int
              ) -> tuple[list[int], list[int], int, int]:
    """The next ``size`` prompt indices from the cursor (``order``, ``epoch``, ``position``) and the
    cursor after them. A pool that crosses an epoch boundary takes the rest of this epoch, then
    the start of the next epoch's order, in which its own prompts come last
    (:func:`epoch_order`): no prompt is in one pool twice, and every prompt still comes once per
    epoch. Needs ``size <= len(order)``."""
    if size > len(order):
        raise ValueError(f"a pool of {size} prompts cannot be drawn without repeats from {len(order)} prompts")
    pool: list[int] = []
    while len(pool) < size:
        take = order[position: position + size - len(pool)]
        pool += take
        position += len(take)
        if position >= len(order):
            epoch, position = epoch + 1, 0
            order = epoch_order(len(order), seed, epoch, pool)
    return pool, order, epoch, position


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The last complete checkpoint of the run in ``output_dir`` (None: none yet)."""
    root = Path(output_dir) / "checkpoints"
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / STATE_FILE).is_file() else None


def train(cfg: TrainConfig, resume_command: str | None = None) -> dict[str, Any]:
    """Build a :class:`Trainer` and run it to ``cfg.steps`` (resuming if a checkpoint exists);
    ``resume_command`` is named in the message of a failure (:class:`~trace_core.failures.RunFailed`)."""
    t0 = time.perf_counter()
    trainer = Trainer(cfg, resume_command=resume_command)
    summary = trainer.run()
    summary["wall_s"] = time.perf_counter() - t0
    return summary
