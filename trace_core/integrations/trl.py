"""TRACE as a TRL plug-in: :class:`TraceGRPOTrainer`, a ``trl.GRPOTrainer`` whose step is TRACE's.

TRL keeps what it does well — the data loader and its order, the optimizer and scheduler, the
clipped policy loss, gradient accumulation, checkpoints, logging to ``report_to`` (MLflow
included). The plug-in replaces one method, ``_generate_and_score_completions`` (the seam TRL's
maintainers advise for custom advantages), by the step our own trainer runs
(:meth:`trace_core.training.trainer.Trainer.train_step`), all of whose decisions are the
:class:`~trace_core.planner.StepPlanner`'s:

    TRL's generation batch (the candidate pool) → the predictor scores the roots → the planner's
    root allocation m_i → bare rollouts and prompt-local continuations from the anchors' exact
    token histories (:class:`~trace_core.rollout.executor.TreeRolloutExecutor`, generating with the
    very model TRL trains) → the predictor learns from the trees → the tree-aware advantage →
    one row per trajectory for TRL's loss.

How TRL's batch maps onto TRACE's budget (checked by :func:`check_config` before any model loads):

- ``GRPOConfig.generation_batch_size`` = M(1+N): the step returns one row per trajectory, bare
  rollouts and continuations alike;
- ``GRPOConfig.num_generations`` = G / pool_factor: TRL's sampler then hands each step
  ``generation_batch_size / num_generations`` = pool_factor·M(1+N)/G = B *distinct* prompts, which
  are the step's candidate pool (TRL's sampler repeats each of them ``num_generations`` times; the
  plug-in takes each once). With ``pool_factor = 1`` this is plain TRL's own setting
  (``num_generations`` = G).

A row: its prompt ids are the exact token history its trajectory started from (the prompt for a
bare rollout, the anchor's history for a continuation), its completion ids the trajectory's own
turns, and TRL's ``tool_mask`` is 0 exactly on the environment's observation tokens, so the loss
only reads model-written tokens. Each token carries its node's tree-aware advantage (method §6), a
``(rows, tokens)`` tensor which TRL's loss accepts as is. Every node of a tree is the completion of
exactly one row (the trajectory that generated it), so a shared prefix is trained once.

The step's figures (effective ratio, prefix effective ratio, mixed groups per 1k tokens, the
allocation, the predictor's fit and the cost estimates) go into TRL's ``self._metrics`` under
``trace/``, which TRL's ``log`` averages and hands to every ``report_to`` backend. The planner's
state (prompt history, token ledger), the predictor, the step counter and the allocation's random
state are written into each TRL checkpoint and read back by ``train(resume_from_checkpoint=...)``.

TRL is imported when :class:`TraceGRPOTrainer` is first asked for (its step lives in the TRL-free
:class:`TraceSteps`; importing TRL loads its tracking stack, MLflow included, which importing
``trace_core`` never does): the configuration, its checks and the data helpers need no TRL.

**vLLM** (``GRPOConfig(use_vllm=True, vllm_mode="colocate")``): TRL starts its colocated
``vllm.LLM`` as it always does, and the plug-in's rollouts run through that engine's own step loop
(:meth:`~trace_core.rollout.vllm_engine.VLLMEngine.borrowing`: request by request, turn by turn,
continuations from their exact token histories, prefix caching as the engine has it). Before a
step's rollouts the trained weights go into it with TRL's own ``sync_weights`` (once per optimizer
step, as TRL does). TRL's importance-sampling correction for the engine's mismatch with the trained
model (``vllm_importance_sampling_correction``, on by default) is kept: each row carries the
log-probs the engine sampled its tokens with, and :func:`importance_ratio` builds the ratio TRL's
loss multiplies by, in the mode and bounds ``GRPOConfig`` names.

What the plug-in does not do (refused with an error naming the field): methods that sample in
rounds (``dapo``, ``greso``) or price their step in tokens (``trace-tokens``), whose rows per step
vary while TRL's generation batch is fixed; TRL's vLLM server mode and its sleep mode (the step
drives the engine request by request in this process); evaluation.

**Several processes** (``accelerate launch``/``torchrun``; DDP, the CPU's gloo included): each
process holds a slice of TRL's generation batch. The slices are gathered into the one candidate
pool, every process plans it (process 0's plan is the step's), grows the trees of its share of the
activated prompts, and the trees are gathered, so every process updates its predictor and the
planner on all of them and computes every advantage; each then trains on its 1/W slice of the rows,
with TRL's ``num_items_in_batch`` counted over all of them.
"""

from __future__ import annotations

import functools
import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trace_core.advantages import AdvantageEstimator, get_advantage_estimator, tree_advantages_batch
from trace_core.allocation import BudgetSpec
from trace_core.costs import CostModel
from trace_core.envs.families import get_family
from trace_core.envs.registry import EnvsConfig, make_env_factory
from trace_core.history import PromptHistory
from trace_core.integrations.rows import TrajectoryRow, trajectory_rows
from trace_core.methods import Method, get_method
from trace_core.metrics import allocation_stats, anchor_allocation, step_metrics
from trace_core.planner import RootPlan, StepPlanner
from trace_core.predictor import SuccessPredictor
from trace_core.predictor.config import PredictorConfig
from trace_core.rollout.agent import AgentConfig, render_prompt
from trace_core.rollout.engine import EngineConfig
from trace_core.rollout.env import Task
from trace_core.rollout.executor import RolloutResult, TreeRolloutExecutor, expansion_of, merge_parallel
from trace_core.rollout.hf_engine import HFEngine
from trace_core.seeding import derive_seed, predictor_seed, step_sampling_seed
from trace_core.token_ledger import TokenLedger
from trace_core.training.config import BudgetConfig, check_method_budget
from trace_core.tree import RolloutTree

if TYPE_CHECKING:
    from trl import GRPOConfig, GRPOTrainer

TASK_COLUMN = "trace_task"  # the dataset column holding each row's Task as JSON (task_dataset writes it)
TRACE_STATE_FILE = "trace_state.json"  # in a TRL checkpoint folder: the planner, step counter, allocation rng
TRACE_PREDICTOR_FILE = "trace_predictor.pt"  # in a TRL checkpoint folder: the predictor's state
TRL_STD_EPS = 1e-4  # the ε TRL adds to a group's std (GRPOTrainer's advantage): method grpo reproduces it
METRIC_PREFIX = "trace/"  # the plug-in's figures among TRL's logged metrics
# TRL's vLLM importance-sampling modes (GRPOConfig.vllm_importance_sampling_mode): bound handling × granularity
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
# TRL's scale_rewards → whether the tree advantage divides by its group's std. "batch" (one std over
# the batch) has no tree reading: a tree's groups are its branching nodes' children.
SCALE_BY_STD = {"group": True, "none": False}


class TraceConfigError(ValueError):
    """A configuration the plug-in refuses; the message names the field and its value."""


@dataclass(frozen=True)
class TraceTRLConfig:
    """What TRACE adds to a ``GRPOConfig``. TRL's own fields keep their meaning, except that
    ``generation_batch_size`` must be M(1+N) and ``num_generations`` G / pool_factor (module
    docstring); sampling's ``temperature`` and ``top_p`` are TRL's (the loss divides the logits by
    TRL's temperature, so the rollouts must sample at it)."""

    method: str = "trace"  # a name of the allocation registry (trace_core.methods.METHODS)
    # M, N, G, M_max and the pool factor (tokens_per_step must stay None: no token-priced steps here)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    # an estimator of trace_core.advantages' registry by name; None: method §6's tree advantage with
    # TRL's ε (1e-4) and TRL's scale_rewards, which on a tree of bare groups is TRL's group advantage
    advantage: str | None = None
    task_family: str = "math"  # a name of the task-family registry: whose environments run the tools and score
    envs: EnvsConfig = field(default_factory=EnvsConfig)  # the families' environment settings
    agent: AgentConfig = field(default_factory=AgentConfig)  # turn limits; temperature and top_p come from TRL
    predictor: PredictorConfig = field(default_factory=PredictorConfig)  # the success predictor Ṽψ (method §5)
    costs: CostModel = field(default_factory=CostModel)  # how the planner's ledger estimates rollout lengths
    tool_workers: int = 4  # threads running environment steps beside generation (0: in the loop)

    def spec(self) -> BudgetSpec:
        """The step's budget as the allocation reads it."""
        return self.budget.spec()


# ============================================================================ checks before any model
def check_config(trace: TraceTRLConfig, args: GRPOConfig, prompts: int | None = None) -> BudgetSpec:
    """Refuse what the plug-in cannot run, before any model loads; returns the step's budget.

    ``prompts``: the training dataset's rows (None: not checked). Each error names the field (as
    ``TraceTRLConfig.<field>`` or ``GRPOConfig.<field>``), its value and what it must be."""
    method = _method_of(trace)
    spec = _budget_of(trace, method)
    _check_estimator(trace)
    _check_family(trace)
    _check_batch(args, spec)
    _check_trl_settings(trace, args)
    if prompts is not None and prompts < spec.pool_size:
        raise TraceConfigError(
            f"train_dataset holds {prompts} prompts but a step's candidate pool needs B = "
            f"pool_factor·M(1+N)/G = {spec.pool_size} distinct ones: lower TraceTRLConfig.budget.pool_factor "
            f"(= {trace.budget.pool_factor}) or TraceTRLConfig.budget.roots_M (= {trace.budget.roots_M})")
    return spec


def _method_of(trace: TraceTRLConfig) -> Method:
    """The registry's method, refused when its step has no fixed number of trajectories."""
    try:
        method = get_method(trace.method)
    except ValueError as err:
        raise TraceConfigError(f"TraceTRLConfig.method = {trace.method!r}: {err}") from None
    if method.samples_in_rounds:
        raise TraceConfigError(
            f"TraceTRLConfig.method = {trace.method!r} samples bare groups in rounds and drops some: its rows per "
            "step vary, while TRL's generation batch is fixed; choose a method without a group filter")
    if method.prices_tokens:
        raise TraceConfigError(
            f"TraceTRLConfig.method = {trace.method!r} prices its step in generated tokens: its rows per step vary, "
            "while TRL's generation batch is fixed; choose a method of the trajectory budget")
    return method


def _budget_of(trace: TraceTRLConfig, method: Method) -> BudgetSpec:
    """The budget, by the trainer's own rules (the method's root rule run on its pool once)."""
    if trace.budget.tokens_per_step is not None:
        raise TraceConfigError(
            f"TraceTRLConfig.budget.tokens_per_step = {trace.budget.tokens_per_step}: the plug-in spends M(1+N) "
            "trajectories a step (TRL's generation batch); leave it None")
    try:
        check_method_budget(method.name, trace.budget)
    except ValueError as err:
        raise TraceConfigError(f"TraceTRLConfig.{err}") from None
    return trace.spec()


def _check_estimator(trace: TraceTRLConfig) -> None:
    if trace.advantage is None:
        return
    try:
        get_advantage_estimator(trace.advantage)
    except ValueError as err:
        raise TraceConfigError(f"TraceTRLConfig.advantage = {trace.advantage!r}: {err}") from None


def _check_family(trace: TraceTRLConfig) -> None:
    try:
        get_family(trace.task_family)
    except ValueError as err:
        raise TraceConfigError(f"TraceTRLConfig.task_family = {trace.task_family!r}: {err}") from None


def _check_batch(args: GRPOConfig, spec: BudgetSpec) -> None:
    """TRL's generation batch is the step's M(1+N) rows, its sampler's distinct prompts the pool B."""
    if args.generation_batch_size != spec.total:
        raise TraceConfigError(
            f"GRPOConfig.generation_batch_size = {args.generation_batch_size} must be M(1+N) = {spec.total}: a "
            "step returns one row per trajectory (set per_device_train_batch_size × steps_per_generation to it)")
    G, factor = spec.group_size_G, spec.pool_factor
    if G % factor or G // factor < 2:
        raise TraceConfigError(
            f"TraceTRLConfig.budget.pool_factor = {factor} must divide budget.group_size_G = {G} into a quotient "
            ">= 2: TRL's num_generations = G / pool_factor repeats each candidate of the pool")
    if args.num_generations != G // factor:
        raise TraceConfigError(
            f"GRPOConfig.num_generations = {args.num_generations} must be budget.group_size_G / budget.pool_factor "
            f"= {G // factor}: TRL's sampler then hands each step the candidate pool of B = pool_factor·M(1+N)/G "
            f"= {spec.pool_size} distinct prompts")


def _check_trl_settings(trace: TraceTRLConfig, args: GRPOConfig) -> None:
    """TRL settings with no reading in a TRACE step."""
    if args.use_vllm:
        _check_vllm_settings(trace, args)
    if trace.advantage is None and args.scale_rewards not in SCALE_BY_STD:
        raise TraceConfigError(f"GRPOConfig.scale_rewards = {args.scale_rewards!r}: the tree advantage scales "
                               f"within its groups; use one of {sorted(SCALE_BY_STD)}")
    if args.mask_truncated_completions:
        raise TraceConfigError("GRPOConfig.mask_truncated_completions = True: a trajectory ends by the agent's "
                               "limits (TraceTRLConfig.agent), and dropping one would drop its tree's contrast")


def _check_vllm_settings(trace: TraceTRLConfig, args: GRPOConfig) -> None:
    """TRL's vLLM settings the plug-in's rollouts can run with (module docstring)."""
    if args.vllm_mode != "colocate":
        raise TraceConfigError(f"GRPOConfig.vllm_mode = {args.vllm_mode!r}: the plug-in steps the engine request "
                               "by request in this process (turns, tool calls, continuations from exact token "
                               "histories), which TRL's vLLM server does not offer; use 'colocate'")
    if args.vllm_enable_sleep_mode:
        raise TraceConfigError("GRPOConfig.vllm_enable_sleep_mode = True: the plug-in's rollouts step the engine "
                               "directly and do not wake it; set it False")
    if args.vllm_importance_sampling_correction and args.vllm_importance_sampling_mode not in IS_MODES:
        raise TraceConfigError(f"GRPOConfig.vllm_importance_sampling_mode = {args.vllm_importance_sampling_mode!r}"
                               f": use one of {list(IS_MODES)}")
    limit = args.vllm_max_model_length
    if limit is not None and limit < trace.agent.max_total_tokens:
        raise TraceConfigError(f"GRPOConfig.vllm_max_model_length = {limit} is below TraceTRLConfig.agent."
                               f"max_total_tokens = {trace.agent.max_total_tokens}: a trajectory's whole history "
                               "must fit in the engine")


def importance_ratio(old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor, mode: str,
                     clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """The importance-sampling ratio of TRL's vLLM correction, as ``GRPOConfig`` defines it:
    ρ = exp(log π_train − log π_engine) of each model-written token (``mask`` 1), 1 elsewhere; the
    ``sequence_*`` modes take one ρ per row, the exp of the row's summed difference, shape (B, 1).
    ``*_truncate`` clamps ρ into [clip_min, clip_max]; ``*_mask`` sets ρ outside it to 0 (a bound
    of None is no bound). All tensors (B, T); ``old_logps`` at TRL's temperature, like the engine's
    sampled log-probs."""
    if mode not in IS_MODES:
        raise ValueError(f"mode must be one of {list(IS_MODES)}, got {mode!r}")
    diff = (old_logps - sampling_logps) * mask
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return ratio if clip_min is None and clip_max is None else torch.clamp(ratio, min=clip_min, max=clip_max)
    outside = torch.zeros_like(ratio, dtype=torch.bool)
    if clip_min is not None:
        outside |= ratio < clip_min
    if clip_max is not None:
        outside |= ratio > clip_max
    return ratio.masked_fill(outside, 0.0)


# ============================================================================ the data
def task_dataset(tasks: Sequence[Task]) -> Any:
    """A ``datasets.Dataset`` of ``tasks`` for TRL: ``prompt`` (the question, as TRL reads prompts)
    and :data:`TASK_COLUMN` (the whole :class:`~trace_core.rollout.env.Task` as JSON, which the
    plug-in's environments read)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [t.question for t in tasks],
                              TASK_COLUMN: [json.dumps(asdict(t)) for t in tasks]})


def task_of_row(row: dict[str, Any]) -> Task:
    """The :class:`~trace_core.rollout.env.Task` of a :func:`task_dataset` row."""
    if TASK_COLUMN not in row:
        raise TraceConfigError(f"train_dataset rows need a {TASK_COLUMN!r} column (build the dataset with "
                               "trace_core.integrations.trl.task_dataset)")
    return Task(**json.loads(row[TASK_COLUMN]))


def pool_of(rows: Sequence[dict[str, Any]]) -> list[Task]:
    """The candidate pool of a TRL generation batch: each distinct task once, in batch order
    (TRL's sampler repeats each candidate ``num_generations`` times, side by side)."""
    seen: dict[str, Task] = {}
    for row in rows:
        task = task_of_row(row)
        seen.setdefault(task.id, task)
    return list(seen.values())


def environment_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """The reward source the plug-in names to TRL: the task family's environment scores each
    trajectory inside the rollout (``env.reward`` of its episode), so TRL's reward loop never runs;
    a call means TRL generated outside the plug-in's step."""
    raise RuntimeError("environment_reward is scored inside TraceGRPOTrainer's rollouts; TRL should not call it")


# ============================================================================ several processes
def prompt_shares(m: np.ndarray, root_cost: np.ndarray, processes: int) -> list[np.ndarray]:
    """The activated prompts (``m_i > 0``, pool indices) split over ``processes`` by expected
    generated tokens ``m_i · root_cost_i``: largest first, each to the least loaded process (ties
    to the lower index); each share in pool order. Deterministic, so every process computes the
    same split."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    m, root_cost = np.asarray(m), np.asarray(root_cost, dtype=np.float64)
    load = m * root_cost
    shares: list[list[int]] = [[] for _ in range(processes)]
    totals = np.zeros(processes)
    for i in sorted(np.flatnonzero(m > 0).tolist(), key=lambda i: (-load[i], i)):
        p = int(np.argmin(totals))
        shares[p].append(i)
        totals[p] += load[i]
    return [np.array(sorted(s), dtype=np.int64) for s in shares]


# ============================================================================ generation with the live policy
class _LastLogitsOnCPU:
    """The policy as :class:`~trace_core.rollout.hf_engine.HFEngine` calls it: the input ids go to
    the policy's device, the last position's logits come back to the CPU (where the engine's
    per-sample generators draw)."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.config = model.config

    def __call__(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        out = self._model(input_ids=input_ids.to(self._model.device), **kwargs)
        return _Logits(out.logits[:, -1:].float().cpu())


@dataclass(frozen=True)
class _Logits:
    logits: torch.Tensor  # (1, 1, vocab): the last position's logits, on the CPU


def live_policy_engine(model: Any, tokenizer: Any, seed: int, max_model_len: int) -> HFEngine:
    """The transformers reference engine on the policy TRL trains, read in place: the rollouts
    always sample from the current weights, and nothing is copied or synced."""
    name = str(getattr(model, "name_or_path", "") or "live-policy")
    config = EngineConfig(model_path=name, kind="hf", seed=seed, max_model_len=max_model_len)
    return HFEngine.on_model(config, _LastLogitsOnCPU(model), tokenizer, model.generation_config)


@contextmanager
def sampling_mode(model: Any) -> Iterator[None]:
    """The policy in eval mode while it samples (no dropout), back to its mode after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


# ============================================================================ one step's results
@dataclass(frozen=True)
class TraceStep:
    """What one TRACE step did (kept as ``TraceGRPOTrainer.last_step``)."""

    step: int  # the step's index (0 = the first TRACE step of the run)
    pool: list[Task]  # the candidate pool, in TRL's batch order
    v: np.ndarray  # float64 (B,): the predictor's root score of each candidate
    plan: RootPlan  # the planner's stage 1 (m per candidate)
    trees: list[RolloutTree]  # one per activated candidate, in pool order
    advantages: list[np.ndarray]  # per tree, per node: the advantage the rows carry
    rows: list[TrajectoryRow]  # one per trajectory, tree by tree
    metrics: dict[str, float]  # the step's figures, as logged (without the prefix)


# ============================================================================ the trainer
class TraceSteps:
    """What :class:`TraceGRPOTrainer` adds to ``trl.GRPOTrainer`` (it is ``TraceSteps`` before
    ``GRPOTrainer``): TRACE's step behind TRL's generation seam, its logging and its checkpoint
    state. Build the trainer like a ``GRPOTrainer``, with a :class:`TraceTRLConfig` and a
    :func:`task_dataset`; no reward functions (the task family's environment scores), no tools (it
    runs them)."""

    def __init__(self, model: Any, trace: TraceTRLConfig, args: GRPOConfig, train_dataset: Any,
                 processing_class: Any = None, callbacks: list[Any] | None = None,
                 optimizers: tuple[Any, Any] = (None, None), peft_config: Any = None) -> None:
        self.spec = check_config(trace, args, len(train_dataset))  # every refusal before the model loads
        _check_unique_tasks(train_dataset)
        super().__init__(model, reward_funcs=[environment_reward], args=args, train_dataset=train_dataset,
                         processing_class=processing_class, callbacks=callbacks, optimizers=optimizers,
                         peft_config=peft_config)
        self.trace = trace
        self.method = get_method(trace.method)
        self.agent = replace(trace.agent, temperature=args.temperature, top_p=args.top_p)
        self.env_factory = make_env_factory(trace.task_family, trace.envs)
        self.planner = StepPlanner(self.method, self.spec, TokenLedger(self._cost_model()), PromptHistory(),
                                   trace.predictor.explore_fraction)
        _check_predictor_vocab(trace.predictor, self._tokenizer)
        self.predictor = SuccessPredictor(replace(trace.predictor, seed=predictor_seed(args.seed,
                                                                                        trace.predictor.seed)))
        self.trace_rng = np.random.default_rng(derive_seed(args.seed, "trace-trl allocation"))
        self.trace_steps = 0  # TRACE steps done (generation batches), saved with each checkpoint
        self.last_step: TraceStep | None = None
        self._prompt_ids: dict[str, list[int]] = {}
        self._vllm_engine = self._borrow_vllm_engine() if args.use_vllm else None

    def _borrow_vllm_engine(self) -> Any:
        """The rollout engine on TRL's colocated ``vllm.LLM`` (its requests at TRL's temperature, the
        log-probs after it, as TRL's own vLLM generation reads them)."""
        from trace_core.rollout.vllm_engine import VLLMEngine

        engine = self.vllm_generation.llm.llm_engine
        config = EngineConfig(model_path=str(engine.model_config.model), kind="vllm", seed=self.args.seed,
                              max_model_len=self.agent.max_total_tokens, logprobs_mode="processed_logprobs")
        try:
            return VLLMEngine.borrowing(config, engine)
        except ValueError as err:
            raise TraceConfigError(f"TraceTRLConfig.agent.max_total_tokens = {self.agent.max_total_tokens} does not "
                                   f"fit TRL's vLLM engine: {err}") from None

    def _cost_model(self) -> CostModel:
        """The first guesses of the cost model, capped by what the agent can generate at all."""
        agent, costs = self.trace.agent, self.trace.costs
        return replace(costs, initial_tokens=min(costs.initial_tokens, agent.max_new_tokens * agent.max_turns),
                       initial_turns=min(costs.initial_turns, agent.max_turns))

    # ------------------------------------------------------------------ TRL's seam
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """TRACE's step on TRL's generation batch (its distinct prompts are the candidate pool):
        one row per trajectory, with per-token tree advantages and the observation tokens masked."""
        if not self.model.training:
            raise NotImplementedError("TraceGRPOTrainer does not evaluate; measure with trace_core.evaluation")
        pool = pool_of(self._whole_batch(inputs))
        if len(pool) != self.spec.pool_size:  # TRL's RepeatSampler always hands B distinct prompts
            raise AssertionError(f"TRL's generation batch holds {len(pool)} distinct prompts, expected the pool of "
                                 f"B = {self.spec.pool_size} (a custom sampler or an iterable dataset?)")
        step = self.run_step(pool)
        self.last_step = step
        self.trace_steps += 1
        self._log_step(step)
        return self.batch_of(self._own_rows(step.rows), items=sum(sum(r.tool_mask) for r in step.rows))

    # ------------------------------------------------------------------ several processes
    def _whole_batch(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """TRL's generation batch across every process, in process order: each process holds a
        slice of it (its sampler's share), and the step plans over the whole candidate pool."""
        if self.accelerator.num_processes == 1:
            return inputs
        from accelerate.utils import gather_object

        return [{TASK_COLUMN: x} for x in gather_object([row[TASK_COLUMN] for row in inputs])]

    def _own_rows(self, rows: list[TrajectoryRow]) -> list[TrajectoryRow]:
        """This process's slice of the step's rows (each process trains on 1/W of them; the
        advantages were computed over every tree before the split)."""
        size = len(rows) // self.accelerator.num_processes
        start = self.accelerator.process_index * size
        return rows[start:start + size]

    def _first_process_plan(self, v: np.ndarray, plan: RootPlan) -> tuple[np.ndarray, RootPlan]:
        """Process 0's scores and plan on every process, with its allocation random state: the
        processes' predictors learn from the same trees, but only bit-identically where the
        hardware is deterministic, and one step must run one plan."""
        if self.accelerator.num_processes == 1:
            return v, plan
        from accelerate.utils import broadcast_object_list

        shared = broadcast_object_list([v, plan, self.trace_rng.bit_generator.state], from_process=0)
        self.trace_rng.bit_generator.state = shared[2]
        return shared[0], shared[1]

    # ------------------------------------------------------------------ the step
    def run_step(self, pool: list[Task]) -> TraceStep:
        """One TRACE step on ``pool`` (the trainer's ``train_step`` up to the policy update, which
        TRL's loss does): score, plan the roots, roll out and expand, update the predictor, advantages."""
        step = self.trace_steps
        ids = [t.id for t in pool]
        v = self.predictor.score_histories([self._prompt_tokens(t) for t in pool])
        v, plan = self._first_process_plan(v, self.planner.plan_roots(v, ids, step, self.trace_rng))
        result = self._roll_out(pool, plan, step)
        trees = result.trees
        root_pred = dict(zip(ids, v.tolist(), strict=True))
        pstats = self.predictor.update(trees, result.predictions_before_update(root_pred))
        advantages = self._advantages(trees)
        rows = trajectory_rows(trees, advantages)
        if len(rows) != self.spec.total:  # the rows are TRL's generation batch: a loud guard on the budget
            raise AssertionError(f"{self.method.name}: the step rolled out {len(rows)} trajectories, expected "
                                 f"M(1+N) = {self.spec.total}")
        metrics = self._step_figures(result, plan, advantages)
        metrics.update(self.planner.observe_trees(step, trees, dict(zip(ids, plan.root_cost.tolist(), strict=True)),
                                                  root_pred, plan))
        metrics.update({f"predictor/{k}": float(x) for k, x in pstats.items()})
        return TraceStep(step, pool, v, plan, trees, advantages, rows, metrics)

    def _roll_out(self, pool: list[Task], plan: RootPlan, step: int) -> RolloutResult:
        """The bare rollouts of ``plan`` and the method's continuations, sampled from TRL's model:
        each process grows the trees of its share of the activated prompts (:func:`prompt_shares`),
        and every process gets all of them. A request's seed is keyed by its prompt, so the
        samples do not depend on the share; the prefix rule's draws (random anchors, ARPO's
        branching) come from a generator of the step and the process."""

        def score_prefixes(tree: RolloutTree, nodes: Sequence[int]) -> np.ndarray:
            return self.predictor.score_trees([tree], [list(nodes)])[0][list(nodes)]

        expansion = expansion_of(self.method, self.spec.expansion_N, score_prefixes, plan.tokens)
        policy = self.accelerator.unwrap_model(self.model)
        engine = self._rollout_engine(policy)
        executor = TreeRolloutExecutor(engine, self._tokenizer, self.env_factory, self.agent,
                                       tool_workers=self.trace.tool_workers)
        processes, rank = self.accelerator.num_processes, self.accelerator.process_index
        share = prompt_shares(plan.m, plan.root_cost, processes)[rank]
        draws = np.random.default_rng(derive_seed(self.args.seed, "trace-trl expansion", step, rank))
        with torch.no_grad(), sampling_mode(policy):
            part = executor.run([pool[i] for i in share], plan.m[share].tolist(), expansion, draws,
                                sampling_seed=step_sampling_seed(self.args.seed, self.agent.seed, step))
        if processes == 1:
            return part
        from accelerate.utils import gather_object

        return merge_parallel(gather_object([part]), [t.id for t in pool])

    def _rollout_engine(self, policy: Any) -> Any:
        """What the step samples from: TRL's model in place, or TRL's colocated vLLM engine with the
        trained weights loaded (TRL's ``sync_weights``, once per optimizer step, as TRL does)."""
        if self._vllm_engine is None:
            return live_policy_engine(policy, self._tokenizer, seed=self.args.seed,
                                      max_model_len=self.agent.max_total_tokens)
        if self.state.global_step != self._last_loaded_step:
            self.vllm_generation.sync_weights()
            self._last_loaded_step = self.state.global_step
        return self._vllm_engine

    def _advantages(self, trees: list[RolloutTree]) -> list[np.ndarray]:
        return self._estimator()(trees)

    def _estimator(self) -> AdvantageEstimator:
        """The registry's estimator the config names, else the tree advantage at TRL's ε and scaling."""
        if self.trace.advantage is not None:
            return self.method.advantage_estimator(self.trace.advantage)
        scale = SCALE_BY_STD[self.args.scale_rewards]
        return lambda trees: tree_advantages_batch(trees, scale_by_std=scale, eps=TRL_STD_EPS)

    def _step_figures(self, result: RolloutResult, plan: RootPlan, advantages: list[np.ndarray]) -> dict[str, float]:
        """method §7's figures of the step (the trainer's names) and the rollouts' budget."""
        trees = result.trees
        k, pos = anchor_allocation(trees)
        metrics = step_metrics(trees, [True] * len(trees), advantages, allocation_stats(plan.m, k, pos, trees),
                               result.rounds, rollout_s=result.stats.wall_s)
        metrics.update({"budget/trajectories": float(result.stats.trajectories),
                        "budget/generated_tokens": float(result.stats.generated_tokens),
                        "budget/rollout_wall_s": float(result.stats.wall_s),
                        "alloc/activated_prompts": float(np.count_nonzero(plan.m)),
                        "alloc/max_m": float(plan.m.max()),
                        "history/prompts": float(len(self.planner.history))})  # prompts with a record before
        return metrics

    def _prompt_tokens(self, task: Task) -> list[int]:
        """The prompt's token ids as the rollout renders them (what the predictor scores)."""
        if task.id not in self._prompt_ids:
            env = self.env_factory(task)
            self._prompt_ids[task.id] = render_prompt(self._tokenizer, task, env.tool_descriptions(), self.agent)
        return self._prompt_ids[task.id]

    # ------------------------------------------------------------------ TRL's batch
    def batch_of(self, rows: list[TrajectoryRow], items: int | None = None) -> dict[str, torch.Tensor]:
        """TRL's training batch of ``rows``: prompts left-padded, completions right-padded,
        ``tool_mask`` 0 on observation tokens, per-token ``advantages``; the old and the reference
        log-probs where TRL's loss reads them. ``items``: the model-written tokens of the whole
        generation batch, over every process (TRL's ``num_items_in_batch``; None: those of ``rows``)."""
        from trl.trainer.utils import pad as trl_pad

        device = self.accelerator.device
        pad_id = self._tokenizer.pad_token_id
        multiple = self.pad_to_multiple_of

        def padded(seqs: list[Any], value: float, side: str, dtype: torch.dtype) -> torch.Tensor:
            return trl_pad([torch.tensor(s, dtype=dtype) for s in seqs], padding_value=value, padding_side=side,
                       pad_to_multiple_of=multiple).to(device)

        prompt_ids = padded([r.prompt_ids for r in rows], pad_id, "left", torch.long)
        prompt_mask = padded([[1] * len(r.prompt_ids) for r in rows], 0, "left", torch.long)
        completion_ids = padded([r.completion_ids for r in rows], pad_id, "right", torch.long)
        completion_mask = padded([[1] * len(r.completion_ids) for r in rows], 0, "right", torch.long)
        tool_mask = padded([r.tool_mask for r in rows], 1, "right", torch.long)  # TRL pads it with 1
        advantages = padded([r.advantages for r in rows], 0.0, "right", torch.float32)
        batch = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                 "completion_mask": completion_mask, "tool_mask": tool_mask, "advantages": advantages,
                 "num_items_in_batch": (completion_mask * tool_mask).sum() if items is None
                 else torch.tensor(items, device=device)}
        batch.update(self._reference_logps(batch))
        if self._corrects_engine_mismatch():
            if any(r.sampling_logprobs is None for r in rows):
                raise AssertionError("a row without the engine's sampled log-probs: vLLM returns them for every token")
            sampled = padded([r.sampling_logprobs for r in rows], 0.0, "right", torch.float32)
            written, args = completion_mask * tool_mask, self.args
            batch["importance_sampling_ratio"] = importance_ratio(
                batch["old_per_token_logps"], sampled, written, args.vllm_importance_sampling_mode,
                args.vllm_importance_sampling_clip_min, args.vllm_importance_sampling_clip_max)
            self._log_engine_mismatch(batch["old_per_token_logps"], sampled, written)
        return batch

    def _corrects_engine_mismatch(self) -> bool:
        """TRL's vLLM importance-sampling correction is on for this run."""
        return bool(self.use_vllm and self.args.vllm_importance_sampling_correction)

    def _log_engine_mismatch(self, old: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor) -> None:
        """How far the engine's sampled log-probs are from the trained model's, on model-written tokens."""
        delta = (old - sampled).abs()[mask.bool()]
        if delta.numel():
            self._metrics["train"][f"{METRIC_PREFIX}sampling/logp_difference_mean"].append(float(delta.mean()))
            self._metrics["train"][f"{METRIC_PREFIX}sampling/logp_difference_max"].append(float(delta.max()))

    def _reference_logps(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``old_per_token_logps`` where TRL's loss needs them (generation and optimizer steps out
        of step: its own rule) and ``ref_per_token_logps`` with a KL term (``beta`` != 0)."""
        out: dict[str, torch.Tensor] = {}
        generate_every = self.args.steps_per_generation * self.num_iterations
        needs_old = self.args.gradient_accumulation_steps % generate_every != 0 or self._corrects_engine_mismatch()
        if not needs_old and self.beta == 0.0:
            return out
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        keep = batch["completion_ids"].size(1)
        size = self.args.per_device_train_batch_size
        with torch.no_grad():
            if needs_old:
                out["old_per_token_logps"] = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention, keep, batch_size=size)[0]
            if self.beta != 0.0:
                if self.ref_model is None:
                    raise NotImplementedError("a KL term (GRPOConfig.beta != 0) with a PEFT adapter: not supported")
                out["ref_per_token_logps"] = self._get_per_token_logps_and_entropies(
                    self.ref_model, input_ids, attention, keep, batch_size=size)[0]
        return out

    # ------------------------------------------------------------------ logging
    def _log_step(self, step: TraceStep) -> None:
        """The step's figures into TRL's metrics (``log`` averages them per logging step and hands
        them to every ``report_to`` backend), with TRL's own reward and token figures."""
        metrics = self._metrics["train"]
        for key, value in step.metrics.items():
            metrics[f"{METRIC_PREFIX}{key}"].append(float(value))
        rewards = np.array([r.reward for r in step.rows])
        metrics["reward"].append(float(rewards.mean()))
        metrics["reward_std"].append(float(rewards.std(ddof=1)) if rewards.size > 1 else 0.0)
        model_tokens = [sum(r.tool_mask) for r in step.rows]
        metrics["completions/mean_length"].append(float(np.mean(model_tokens)))
        self.state.num_input_tokens_seen += sum(len(r.prompt_ids) + len(r.completion_ids) for r in step.rows)
        metrics["num_tokens"] = [float(self.state.num_input_tokens_seen)]

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """TRL's checkpoint, plus the planner's state (history, ledger), the predictor, the step
        counter and the allocation's random state."""
        super()._save_checkpoint(model, trial)
        if not self.args.should_save:
            return
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        state = {"trace_steps": self.trace_steps, "planner": self.planner.state_dict(),
                 "allocation_rng": self.trace_rng.bit_generator.state}
        with open(os.path.join(folder, TRACE_STATE_FILE), "w") as f:
            json.dump(state, f, default=float)
        torch.save(self.predictor.state_dict(), os.path.join(folder, TRACE_PREDICTOR_FILE))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """TRL's resume, plus what :meth:`_save_checkpoint` added (where TRL restores its own
        extra state); a checkpoint without it (not a TRACE run's) is refused."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, TRACE_STATE_FILE)
        if not os.path.isfile(path):
            raise TraceConfigError(f"resume_from_checkpoint = {checkpoint}: no {TRACE_STATE_FILE} in it (not a "
                                   "TraceGRPOTrainer checkpoint)")
        with open(path) as f:
            state = json.load(f)
        self.trace_steps = int(state["trace_steps"])
        self.planner.load_state_dict(state["planner"])
        self.trace_rng.bit_generator.state = state["allocation_rng"]
        self.predictor.load_state_dict(torch.load(os.path.join(checkpoint, TRACE_PREDICTOR_FILE),
                                                  weights_only=False))


@functools.cache
def trainer_class() -> type:
    """``TraceGRPOTrainer``: :class:`TraceSteps` in front of ``trl.GRPOTrainer`` (TRL imported here)."""
    from trl import GRPOTrainer

    trainer = type("TraceGRPOTrainer", (TraceSteps, GRPOTrainer), {"__doc__": TraceSteps.__doc__,
                                                                     "__module__": __name__})
    return trainer


if TYPE_CHECKING:
    class TraceGRPOTrainer(TraceSteps, GRPOTrainer):
        """What the module's ``__getattr__`` builds (:func:`trainer_class`)."""


def __getattr__(name: str) -> Any:
    """``TraceGRPOTrainer`` on first access (TRL imported then); nothing else is lazy."""
    if name == "TraceGRPOTrainer":
        return trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check_unique_tasks(dataset: Any) -> None:
    """One row per task id: the executor grows one tree per prompt, and a repeated id would draw
    the same seeds twice."""
    if TASK_COLUMN not in dataset.column_names:
        raise TraceConfigError(f"train_dataset has no {TASK_COLUMN!r} column (build it with task_dataset)")
    counts = Counter(json.loads(x)["id"] for x in dataset[TASK_COLUMN])
    repeated = sorted(i for i, n in counts.items() if n > 1)[:5]
    if repeated:
        raise TraceConfigError(f"train_dataset repeats task ids {repeated}: one row per prompt")


def _check_predictor_vocab(predictor: PredictorConfig, tokenizer: Any) -> None:
    """A tiny predictor embeds the policy's token ids: its vocabulary must hold all of them."""
    if not predictor.pretrained and len(tokenizer) > predictor.vocab_size:
        raise TraceConfigError(f"TraceTRLConfig.predictor.vocab_size = {predictor.vocab_size} is smaller than the "
                               f"policy tokenizer's {len(tokenizer)} tokens: raise it or set backbone_path")
