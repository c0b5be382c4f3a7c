"""A run's figures pooled over its steps (the main job's table): counts pooled, not ratios averaged,
and rollouts per mixed group charged for every rollout spent, dropped groups included."""

from __future__ import annotations

import math

import pytest

from trace_core.training.summary import run_figures, training_reading, training_table


def test_ratios_are_pooled_as_counts_and_dropped_groups_cost_their_rollouts() -> None:
    history = {"effective_ratio": [0.5, 1.0], "counts/activated": [4, 2], "counts/mixed_groups": [2, 2],
               "counts/mixed_groups_trained": [1, 2], "counts/rollouts": [64, 60],
               "counts/expanded_anchors": [0, 0], "counts/mixed_anchors": [0, 0], "contrastive_yield": [12.5, 20],
               "counts/contrastive_rollouts": [8, 12], "budget/generated_tokens": [4000, 2000],
               "budget/rollout_wall_s": [2.0, 3.0]}
    fig = run_figures("dapo", history, [{"step": 0, "success": 0.5}, {"step": 2, "success": 0.6}],
                      {"rollouts": 12}, 4)
    assert fig.effective_ratio == pytest.approx(4 / 6)  # pooled: not the mean of 0.5 and 1.0
    assert fig.rollouts_per_mixed_group == pytest.approx(124 / 3)  # every rollout, per mixed group trained
    assert fig.mixed_per_100_rollouts == pytest.approx(100 * 3 / 124)  # the dropped mixed group gave nothing
    assert math.isnan(fig.prefix_effective_ratio) and fig.pool_success_end == 0.6 and fig.warmup_rollouts == 12
    lo, hi = fig.effective_ratio_interval
    assert lo < 4 / 6 < hi
    older = run_figures("grpo", {k: v for k, v in history.items() if k != "counts/mixed_groups_trained"})
    assert older.rollouts_per_mixed_group == pytest.approx(124 / 4)  # a history from before the filter existed
    table = training_table([fig, older], {"dapo": 0.1, "grpo": 0.2}, "held-out pass@1 (%)")
    assert "| dapo | 0.667 [" in table and "| grpo |" in table
    assert table.splitlines()[0].endswith("| predictor root Spearman (out of sample) |")
    assert table.splitlines()[2].endswith("| – |")  # no step scored its roots out of sample
    scored = run_figures("trace", {**history, "predictor/oos_spearman_root": [0.2, math.nan, 0.6]})
    assert scored.predictor_spearman == pytest.approx(0.4)  # the steps where it is defined
    assert training_table([scored]).splitlines()[2].endswith("| 0.40 |")
    assert fig.opened_per_step == 3 and fig.rollouts_per_opened_prompt == pytest.approx(124 / 6)
    reading = training_reading([older, fig])
    assert "- grpo: opened 3.0 prompts a step with 20.7 rollouts each; 67% of them showed both outcomes" in reading
    assert "- dapo:" in reading and "1.00× grpo's effective ratio" in reading


def test_per_token_and_per_second_figures_pool_over_steps_with_poisson_intervals() -> None:
    history = {"effective_ratio": [0.5, 1.0], "counts/activated": [4, 2], "counts/mixed_groups": [2, 2],
               "counts/mixed_groups_trained": [1, 2], "counts/rollouts": [64, 60],
               "counts/expanded_anchors": [0, 0], "counts/mixed_anchors": [0, 0], "contrastive_yield": [12.5, 20],
               "counts/contrastive_rollouts": [8, 12], "budget/generated_tokens": [4000, 2000],
               "budget/rollout_wall_s": [2.0, 3.0]}
    fig = run_figures("dapo", history)
    # 3 mixed groups trained on, 6,000 tokens, 5 s: sums, not the steps' mean (0.25 and 1.0 per 1k)
    assert fig.mixed_per_1k_tokens == pytest.approx(0.5) and fig.mixed_per_rollout_s == pytest.approx(0.6)
    assert fig.contrastive_rollouts == 20 and fig.contrastive_per_1k_tokens == pytest.approx(20 / 6)
    # Poisson score interval: (3 + z²/2 ∓ z·sqrt(3 + z²/4)) over the exposure, z = 1.6449
    assert fig.mixed_per_1k_tokens_interval == pytest.approx((0.199824201, 1.251099708), abs=1e-8)
    assert fig.mixed_per_rollout_s_interval == pytest.approx((0.239789042, 1.501319649), abs=1e-8)
    # a history from before the count and the seconds were logged: the count from the per-100
    # yield and its rollouts (12.5% of 64 + 20% of 60), the seconds not measured
    older = run_figures("grpo", {k: v for k, v in history.items()
                                 if k not in ("counts/contrastive_rollouts", "budget/rollout_wall_s",
                                              "counts/mixed_groups_trained")})
    assert older.contrastive_rollouts == 20 and older.rollout_s is None
    assert math.isnan(older.mixed_per_rollout_s) and all(math.isnan(x) for x in older.mixed_per_rollout_s_interval)
    assert older.mixed_per_1k_tokens == pytest.approx(4 / 6)
    partly = run_figures("pcl", {**history, "budget/rollout_wall_s": [2.0]})  # one step unmeasured
    assert partly.rollout_s is None and math.isnan(partly.mixed_per_rollout_s)

    table = training_table([fig, older])
    head = table.splitlines()[0]
    for column in ("mixed groups / 1k tokens [90% CI]", "contrastive yield / 1k tokens",
                   "mixed groups / rollout s [90% CI]"):
        assert f"| {column} |" in head
    assert "| 2.4 | 16.2 | 41.3 | 0.50 [0.20, 1.25] | 3.33 | 0.600 [0.240, 1.501] |" in table.splitlines()[2]
    assert "| 3.2 | 16.2 | 31.0 | 0.67 [0.30, 1.48] | 3.33 | – |" in table.splitlines()[3]
    reading = training_reading([older, fig])
    assert "3.2 mixed groups per 100 rollouts and 0.67 per 1,000 generated tokens." in reading
    assert "0.75× its mixed groups per rollout, 0.75× per generated token)" in reading
