"""Sparse tree attention for the predictor: the shared kernel of
:mod:`trace_core.tree_packing.attention` (the policy update uses the same one), registered with
transformers as ``"trace_tree"`` on import, as the predictor's backbone expects."""

from trace_core.tree_packing.attention import (
    TREE_ATTENTION,
    TreeAttentionConfig,
    TreeAttentionPlan,
    build_plan,
    register_tree_attention,
    tree_attention_forward,
)

register_tree_attention()

__all__ = ["TREE_ATTENTION", "TreeAttentionConfig", "TreeAttentionPlan", "build_plan", "tree_attention_forward"]
