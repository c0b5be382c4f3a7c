"""A run's figures pooled over its steps (the main job's table): counts pooled, not ratios averaged,
and rollouts per mixed group charged for every rollout spent, dropped groups included."""

from __future__ import annotations

import math

import pytest

from trace_core.training.summary import run_figures, training_reading, training_table


def test_ratios_are_pooled_as_counts_and_dropped_groups_cost_their_rollouts() -> None:
    history = {"effective_ratio": [0.5, 1.0], "counts/activated": [4, 2], "counts/mixed_groups": [2, 2],
               "counts/mixed_groups_trained": [1, 2], "counts/rollouts": [64, 60],
               "counts/expanded_anchors": [0, 0], "counts/mixed_anchors": [0, 0], "contrastive_yield": [10, 20]}
    fig = run_figures("dapo", history, [{"step": 0, "success": 0.5}, {"step": 2, "success": 0.6}],
                      {"rollouts": 12}, 4)
    assert fig.effective_ratio == pytest.approx(4 / 6)  # pooled: not the mean of 0.5 and 1.0
    assert fig.rollouts_per_mixed_group == pytest.approx(124 / 3)  # every rollout, per mixed group trained
    assert fig.mixed_per_100_rollouts == pytest.approx(100 * 4 / 124)
    assert math.isnan(fig.prefix_effective_ratio) and fig.pool_success_end == 0.6 and fig.warmup_rollouts == 12
    lo, hi = fig.effective_ratio_interval
    assert lo < 4 / 6 < hi
    older = run_figures("grpo", {k: v for k, v in history.items() if k != "counts/mixed_groups_trained"})
    assert older.rollouts_per_mixed_group == pytest.approx(124 / 4)  # a history from before the filter existed
    table = training_table([fig, older], {"dapo": 0.1, "grpo": 0.2}, "held-out pass@1 (%)")
    assert "| dapo | 0.667 [" in table and "| grpo |" in table
    assert fig.opened_per_step == 3 and fig.rollouts_per_opened_prompt == pytest.approx(124 / 6)
    reading = training_reading([older, fig])
    assert "- grpo: opened 3.0 prompts a step with 20.7 rollouts each; 67% of them showed both outcomes" in reading
    assert "- dapo:" in reading and "1.00× grpo's effective ratio" in reading
