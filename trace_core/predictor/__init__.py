"""The success predictor ``Ṽψ`` of method §5.

- :mod:`.config` — :class:`PredictorConfig` (every knob, documented);
- :mod:`.model` — Qwen3 backbone + scalar head (:class:`PrefixValueModel`);
- :mod:`.packing` — tree packing: each distinct token once, ancestor-only attention (numpy);
- :mod:`.tree_attention` — sparse tree attention (each node attends to its own history only),
  registered with transformers as ``"trace_tree"``; the default kernel;
- :mod:`.scoring` — forwards over packs (sparse plan, or a dense 4D tree mask for sdpa/eager);
- :mod:`.examples` — method §5's supervised set and the prefix share;
- :mod:`.diagnostics` — out-of-sample Spearman, MSE, reliability bins / ECE;
- :mod:`.success_predictor` — :class:`SuccessPredictor`: score, update, save/restore.

Importing this package is cheap: each name below loads its module (torch, transformers, scipy) on
first use, so a configuration or a ``--help`` that only needs :class:`PredictorConfig` stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "PRETRAINED_LEARNING_RATES": "config", "PredictorConfig": "config",
    "Calibration": "diagnostics", "StepDiagnostics": "diagnostics", "calibration": "diagnostics",
    "step_diagnostics": "diagnostics",
    "Example": "examples", "informative_prefixes": "examples", "sample_examples": "examples",
    "supervised_set": "examples",
    "Pack": "packing", "TokenTree": "packing", "pack_token_trees": "packing", "path_tokens": "packing",
    "tree_tokens": "packing",
    "SuccessPredictor": "success_predictor", "root_scores": "success_predictor",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "PRETRAINED_LEARNING_RATES", "Calibration", "Example", "Pack", "PredictorConfig", "StepDiagnostics",
    "SuccessPredictor", "TokenTree", "calibration", "informative_prefixes",
    "pack_token_trees", "path_tokens", "root_scores", "sample_examples", "step_diagnostics", "supervised_set",
    "tree_tokens",
]
