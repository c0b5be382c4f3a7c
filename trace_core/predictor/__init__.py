"""The success predictor ``Ṽψ`` of method §5.

- :mod:`.config` — :class:`PredictorConfig` (every knob, documented);
- :mod:`.model` — Qwen3 backbone + scalar head (:class:`PrefixValueModel`);
- tree packing (each distinct token once, ancestor-only attention; numpy) and the sparse tree
  attention (registered with transformers as ``"trace_tree"``; the default kernel) are shared
  with the policy update: :mod:`trace_core.tree_packing` (its names are re-exported here);
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
    "Pack": "trace_core.tree_packing.layout", "TokenTree": "trace_core.tree_packing.layout",
    "pack_token_trees": "trace_core.tree_packing.layout", "path_tokens": "trace_core.tree_packing.layout",
    "tree_tokens": "trace_core.tree_packing.layout",
    "SuccessPredictor": "success_predictor", "root_scores": "success_predictor",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = _HOME[name]
    value = getattr(importlib.import_module(home if "." in home else f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "PRETRAINED_LEARNING_RATES", "Calibration", "Example", "Pack", "PredictorConfig", "StepDiagnostics",
    "SuccessPredictor", "TokenTree", "calibration", "informative_prefixes",
    "pack_token_trees", "path_tokens", "root_scores", "sample_examples", "step_diagnostics", "supervised_set",
    "tree_tokens",
]
