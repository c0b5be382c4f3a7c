"""trace_core — the TRACE library: rollout trees, exact budgeted allocation, tree-aware advantages,
metrics and a simulator. Pure Python/numpy at its heart; no Kubeflow, MLflow or DVC imports.

The names an integrator needs (docs/integration.md shows them at work inside a trainer)::

    from trace_core import StepPlanner, BudgetSpec, get_method, RolloutTree, tree_advantages

Each is imported when first used, so ``import trace_core`` stays cheap (no torch, no engine).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> the module that defines it
_EXPORTS = {
    # a step's decisions
    "StepPlanner": "trace_core.planner",
    "RootPlan": "trace_core.planner",
    "TokenAllowance": "trace_core.planner",
    # methods and budgets
    "BudgetSpec": "trace_core.allocation",
    "Method": "trace_core.methods",
    "METHODS": "trace_core.methods",
    "get_method": "trace_core.methods",
    "register_method": "trace_core.methods",
    "AnchorSignals": "trace_core.allocation",
    # trees and advantages
    "RolloutTree": "trace_core.tree",
    "TokenAdvantages": "trace_core.advantages",
    "tree_advantages": "trace_core.advantages",
    "grpo_advantages": "trace_core.advantages",
    "token_advantages": "trace_core.advantages",
    "get_advantage_estimator": "trace_core.advantages",
    "register_adv_est": "trace_core.advantages",
    # step metrics
    "effective_ratio": "trace_core.metrics",
    "prefix_effective_ratio": "trace_core.metrics",
    "step_metrics": "trace_core.metrics",
    "is_success": "trace_core.metrics",
    # state a step carries
    "PromptHistory": "trace_core.history",
    "TokenLedger": "trace_core.token_ledger",
    # the contracts of the extension points
    "RolloutEngine": "trace_core.rollout.engine",
    "Environment": "trace_core.rollout.env",
    "Task": "trace_core.rollout.env",
    "Tracker": "trace_core.tracking",
    # rollouts as trees, from any engine and environment
    "TreeRolloutExecutor": "trace_core.rollout.executor",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trace_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
