"""Tree packing for the predictor: the shared layout of :mod:`trace_core.tree_packing.layout`.

The predictor's scoring, the policy update and its old-log-prob recomputation all pack trees the
same way (each distinct token once, ancestor-only attention), so the layout lives in one module;
this name stays for the predictor's callers.
"""

from trace_core.tree_packing.layout import (
    Pack,
    TokenTree,
    ancestor_closure,
    history_tokens,
    pack_token_trees,
    path_tokens,
    tree_tokens,
)

__all__ = ["Pack", "TokenTree", "ancestor_closure", "history_tokens", "pack_token_trees", "path_tokens",
           "tree_tokens"]
