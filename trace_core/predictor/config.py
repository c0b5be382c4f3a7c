"""Configuration of the success predictor ``Ṽψ`` (method §5)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

TaskFamily = Literal["qa", "function_calling", "math"]

# method §5: the paper's learning rates for a pretrained Qwen3-0.6B backbone, per task family.
PRETRAINED_LEARNING_RATES: dict[str, float] = {"qa": 3e-5, "function_calling": 3e-5, "math": 1.5e-5}


@dataclass(frozen=True)
class PredictorConfig:
    """Every knob of the predictor. Two backbones are supported: a pretrained Qwen3 checkpoint
    on disk (``backbone_path``; the paper uses Qwen3-0.6B) or a tiny randomly initialised Qwen3
    built from the ``tiny_*`` fields (tests, CPU benchmarks). The tiny fields are ignored when
    ``backbone_path`` is set."""

    # ---- backbone
    backbone_path: str | None = None  # local pretrained Qwen3 dir (local_files_only); None = tiny
    vocab_size: int = 2048  # tiny only: > every token id of the policy (shared tokenizer)
    tiny_hidden_size: int = 64  # tiny only: model width
    tiny_num_layers: int = 2  # tiny only: decoder layers
    tiny_num_heads: int = 2  # tiny only: query heads
    tiny_num_kv_heads: int = 1  # tiny only: key/value heads (GQA, as in Qwen3)
    tiny_head_dim: int = 32  # tiny only: per-head width
    tiny_intermediate_size: int = 192  # tiny only: MLP width
    tiny_max_positions: int = 4096  # tiny only: longest history (in tokens) the backbone accepts
    init_std: float = 0.02  # std of the random init (tiny backbone weights; the scalar head always)
    # "tree": sparse per-node attention over its own history (Σ q·k pairs); "sdpa"/"eager": a dense
    # (L × L) tree mask — exact too, but L² attention pairs per pack
    attn_implementation: Literal["tree", "sdpa", "eager"] = "tree"
    compute_dtype: Literal["float32", "bfloat16"] = "float32"  # autocast dtype of forwards (weights: fp32)

    # ---- optimisation (method §5)
    task_family: TaskFamily = "qa"  # pretrained lr: 3e-5 QA / function calling, 1.5e-5 math
    learning_rate: float | None = None  # explicit AdamW lr; None = per task family or tiny
    tiny_learning_rate: float = 1e-3  # default lr of a tiny random backbone (3e-5 barely moves one)
    # The online updates during RL (update()) of a tiny backbone take a smaller step than its fit
    # from random weights (fit()). A scale adaptation: each update is one optimizer step on the
    # tens of roots a step makes, and at 1e-3 that step moved the fitted predictor's pool-wide mean
    # by up to ±0.17 per step (offline replay on the testbed, bench/predictor_real.py's data), at
    # 3e-4 by ±0.02 over the first five steps, while its ranking still improved.
    tiny_online_learning_rate: float = 3e-4
    online_learning_rate: float | None = None  # explicit lr of the online updates; None = as resolved below
    weight_decay: float = 0.01  # AdamW decoupled weight decay (torch default; the paper does not state one)
    adam_betas: tuple[float, float] = (0.9, 0.999)  # AdamW betas
    adam_eps: float = 1e-8  # AdamW epsilon
    grad_clip: float = 1.0  # max global L2 norm of the gradient (clip_grad_norm_)
    min_leaves: int = 2  # method §5's S: internal nodes with >= this many leaves below are supervised prefixes
    prefix_share: float = 0.06  # share of prefix examples in a step's examples and in its loss (paper: 6%)
    # Floor on prefix examples per update (capped by the informative prefixes there are). A scale
    # adaptation: the paper's 6% of ~1,000 roots a step is ~60 prefix examples; at our tens of
    # roots the share alone gives under one, and the prefix head would never be trained. Prefixes
    # the floor adds are weighted down so that together they keep prefix_share of the loss: at
    # full weight 16 prefixes beside ~35 roots were a third of it and pulled the roots' mean
    # (offline replay on the testbed: the roots' bias stayed within ±0.05 over 10 steps with the
    # floor's prefixes left out, ±0.12 with them at full weight).
    min_prefix_examples: int = 16
    # Steps of trees each update trains on: this step's and the replay_steps − 1 before it. A scale
    # adaptation (1 = the paper): the paper's step has ~1,000 roots, ours tens, and one optimizer
    # step on a batch that small moves the predictor's mean output by up to ±0.2 per step (measured
    # offline on the testbed with bench/predictor_real.py: pool-wide bias −0.16 then +0.25 with 1,
    # −0.03 then +0.14 with 4, ranking unchanged). TRACE's allocation reads calibrated values, so a
    # drifting mean skips prompts it should open.
    replay_steps: int = 4
    batch_size: int = 64  # supervised examples (roots + prefixes) per optimizer step
    epochs_per_update: int = 1  # passes over one step's examples per update() call
    rollback_nonfinite_weights: bool = True  # snapshot before each step; undo non-finite weights

    # ---- scoring
    max_tokens_per_forward: int = 8192  # trees are packed greedily into forwards of at most this many tokens
    max_length: int | None = None  # longest history accepted (tokens); None = the backbone's max positions

    # ---- allocation-side knob (method §5), read by the trainer, not by the predictor itself
    explore_fraction: float = 0.0  # root budget share at m=2 to random skipped prompts (0 = paper)

    # ---- diagnostics
    diagnostics: bool = True  # score the step's trees before training on them (out-of-sample Spearman, ECE)
    calibration_bins: int = 10  # equal-width reliability bins over [0, 1]

    # ---- reproducibility / placement
    seed: int = 0  # seeds the tiny backbone and head init and the example sampling/shuffling
    device: str = "cpu"  # torch device of the model ("cpu", "cuda", "cuda:1", ...)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "tiny_hidden_size", "tiny_num_layers", "tiny_num_heads",
                     "tiny_num_kv_heads", "tiny_head_dim", "tiny_intermediate_size", "tiny_max_positions",
                     "min_leaves", "batch_size", "epochs_per_update", "max_tokens_per_forward",
                     "calibration_bins"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.tiny_num_heads % self.tiny_num_kv_heads:
            raise ValueError(f"tiny_num_heads ({self.tiny_num_heads}) must be a multiple of "
                             f"tiny_num_kv_heads ({self.tiny_num_kv_heads})")
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"max_length must be >= 1 or None, got {self.max_length}")
        for name in ("init_std", "tiny_learning_rate", "tiny_online_learning_rate", "grad_clip", "adam_eps"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")
        for name in ("learning_rate", "online_learning_rate"):
            lr = getattr(self, name)
            if lr is not None and not (math.isfinite(lr) and lr > 0):
                raise ValueError(f"{name} must be finite and > 0 or None, got {lr}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be finite and >= 0, got {self.weight_decay}")
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            raise ValueError(f"adam_betas must be two numbers in [0, 1), got {self.adam_betas}")
        if int(self.replay_steps) < 1:
            raise ValueError(f"replay_steps must be >= 1 (1 = this step's trees only), got {self.replay_steps}")
        if int(self.min_prefix_examples) < 0:
            raise ValueError(f"min_prefix_examples must be >= 0, got {self.min_prefix_examples}")
        if not 0 <= self.prefix_share < 1:
            raise ValueError(f"prefix_share must lie in [0, 1) (a share), got {self.prefix_share}")
        if not 0 <= self.explore_fraction <= 1:
            raise ValueError(f"explore_fraction must lie in [0, 1], got {self.explore_fraction}")
        if self.task_family not in PRETRAINED_LEARNING_RATES:
            raise ValueError(
                f"task_family must be one of {sorted(PRETRAINED_LEARNING_RATES)}, got {self.task_family!r}"
            )
        if self.attn_implementation not in ("tree", "sdpa", "eager"):
            raise ValueError(f"attn_implementation must be tree, sdpa or eager: {self.attn_implementation}")
        if self.compute_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"compute_dtype must be 'float32' or 'bfloat16', got {self.compute_dtype!r}")

    @property
    def pretrained(self) -> bool:
        return self.backbone_path is not None

    def resolved_learning_rate(self) -> float:
        """The lr in use: explicit, else the paper's per task family (pretrained), else the tiny default."""
        if self.learning_rate is not None:
            return float(self.learning_rate)
        if self.pretrained:
            return PRETRAINED_LEARNING_RATES[self.task_family]
        return float(self.tiny_learning_rate)

    def resolved_online_learning_rate(self) -> float:
        """The lr of the online updates during RL: explicit, else an explicit ``learning_rate``,
        else the paper's per task family (pretrained: the same as the fit's), else the tiny online
        default."""
        if self.online_learning_rate is not None:
            return float(self.online_learning_rate)
        if self.learning_rate is not None or self.pretrained:
            return self.resolved_learning_rate()
        return float(self.tiny_online_learning_rate)
