"""The success predictor ``Ṽψ`` of SPEC §5.

- :mod:`.config` — :class:`PredictorConfig` (every knob, documented);
- :mod:`.model` — Qwen3 backbone + scalar head (:class:`PrefixValueModel`);
- :mod:`.packing` — tree packing: each distinct token once, ancestor-only attention (numpy);
- :mod:`.tree_attention` — sparse tree attention (each node attends to its own history only),
  registered with transformers as ``"trace_tree"``; the default kernel;
- :mod:`.scoring` — forwards over packs (sparse plan, or a dense 4D tree mask for sdpa/eager);
- :mod:`.examples` — SPEC §5's supervised set and the prefix share;
- :mod:`.diagnostics` — out-of-sample Spearman, MSE, reliability bins / ECE;
- :mod:`.explore` — ``explore_fraction`` (a root-allocation rule);
- :mod:`.success_predictor` — :class:`SuccessPredictor`: score, update, save/restore.

Importing this package imports torch and transformers; the rest of ``trace_core`` does not.
"""

from trace_core.predictor.config import PRETRAINED_LEARNING_RATES, PredictorConfig
from trace_core.predictor.diagnostics import Calibration, StepDiagnostics, calibration, step_diagnostics
from trace_core.predictor.examples import Example, informative_prefixes, sample_examples, supervised_set
from trace_core.predictor.explore import explore_roots
from trace_core.predictor.packing import Pack, TokenTree, pack_token_trees, path_tokens, tree_tokens
from trace_core.predictor.success_predictor import SuccessPredictor, root_scores

__all__ = [
    "PRETRAINED_LEARNING_RATES", "Calibration", "Example", "Pack", "PredictorConfig", "StepDiagnostics",
    "SuccessPredictor", "TokenTree", "calibration", "explore_roots", "informative_prefixes",
    "pack_token_trees", "path_tokens", "root_scores", "sample_examples", "step_diagnostics", "supervised_set",
    "tree_tokens",
]
