"""The testbed comparison's equal-token parts against hand computation: which runs get the token
budget, the equal-token targets, and where a run's trajectories and tokens went (read from
trees written by the trainer's own writer)."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from bench import train_compare as tc
from trace_core.tree import RolloutTree, save_trees


def _run(variant: str, seed: int, *, mixed: list[int], activated: list[int], rollouts: list[int],
         tokens: list[int], trained: list[int] | None = None, anchors: list[int] | None = None,
         contrastive: list[float] | None = None) -> dict:
    n = len(rollouts)
    series = {"counts/mixed_groups": mixed, "counts/activated": activated, "counts/rollouts": rollouts,
              "counts/mixed_groups_trained": trained or mixed, "budget/generated_tokens": tokens,
              "contrastive_yield": contrastive or [0.0] * n, "counts/dropped_rollouts": [0] * n,
              "prefix_effective_ratio": [float("nan")] * n, "alloc/skipped_share": [0.0] * n,
              "effective_ratio": [m / a for m, a in zip(mixed, activated, strict=True)]}
    if anchors is not None:  # mixed branch groups: recorded by runs of this version
        series["counts/mixed_anchors"] = anchors
    return {"variant": variant, "seed": seed, "warmup_rollouts": 0.0, "wall_s": 1.0,
            "pool_success": [{"step": 0, "success": 0.5}, {"step": n, "success": 0.5}], "series": series}


def test_only_the_methods_that_read_a_token_budget_get_one() -> None:
    args = Namespace(tokens_per_step=5200)
    assert tc.token_budget("grpo", args) == 5200  # groups of G: as many as the tokens buy
    assert tc.token_budget("pcl", args) == 5200
    assert tc.token_budget("trace-tokens", args) == 5200
    assert tc.token_budget("trace", args) is None  # its stages count trajectories: it runs at M(1+N)
    assert tc.token_budget("dapo", args) is None  # rounds
    assert tc.token_budget("grpo", Namespace(tokens_per_step=None)) is None


def test_the_equal_token_targets_by_hand() -> None:
    # trace-tokens: 12 mixed over 4,000 tokens = 3.0 per 1k; trace 10 / 5,000 = 2.0; grpo 4 / 5,000 = 0.8
    runs = [_run("trace-tokens", 0, mixed=[6, 6], activated=[10, 10], rollouts=[40, 40], tokens=[2000, 2000]),
            _run("trace", 0, mixed=[5, 5], activated=[10, 10], rollouts=[32, 32], tokens=[2500, 2500]),
            _run("grpo", 0, mixed=[2, 2], activated=[8, 8], rollouts=[40, 40], tokens=[2500, 2500]),
            _run("pcl", 0, mixed=[7, 7], activated=[10, 10], rollouts=[40, 40], tokens=[2500, 2500])]
    rows, _ = tc.summarise(runs, ["trace-tokens", "trace", "grpo", "pcl"], pool_k=4, pool_size=16)
    out = tc.judge_tokens(rows, runs)
    assert out["trace-tokens mixed groups per 1k tokens >= 1.2x trace"].startswith("PASS 3.000 vs 2.000 (1.50x")
    assert out["trace-tokens mixed groups per 1k tokens >= 3.0x grpo"].startswith("PASS 3.000 vs 0.800 (3.75x")
    # effective ratio 0.6 < pcl's 0.7: MISS; mixed per rollout 12/80 = 0.15 < 14/80 = 0.175: MISS
    assert out["trace-tokens effective ratio above pcl"].startswith("MISS 0.6000 vs 0.7000")
    assert out["trace-tokens mixed groups per rollout above pcl"].startswith("MISS 0.1500 vs 0.1750")
    assert tc.judge_tokens([r for r in rows if r["method"] != "trace-tokens"], runs) == {}


def test_the_token_rules_own_scale_is_reported_beside_the_targets() -> None:
    # contrast groups per 1k tokens: trace-tokens (12 + 6) / 4,000 = 4.5; trace (10 + 2) / 5,000 = 2.4;
    # grpo 4 / 5,000 = 0.8. Yield per 1k tokens: 25% of 80 rollouts = 20 / 4,000 = 5.0; trace 10% of
    # 64 = 6.4 / 5,000 = 1.28; pcl: 0, so no multiple
    runs = [_run("trace-tokens", 0, mixed=[6, 6], activated=[10, 10], rollouts=[40, 40], tokens=[2000, 2000],
                 anchors=[3, 3], contrastive=[25.0, 25.0]),
            _run("trace", 0, mixed=[5, 5], activated=[10, 10], rollouts=[32, 32], tokens=[2500, 2500],
                 anchors=[1, 1], contrastive=[10.0, 10.0]),
            _run("grpo", 0, mixed=[2, 2], activated=[8, 8], rollouts=[40, 40], tokens=[2500, 2500], anchors=[0, 0],
                 contrastive=[10.0, 10.0]),
            _run("pcl", 0, mixed=[7, 7], activated=[10, 10], rollouts=[40, 40], tokens=[2500, 2500])]
    rows, _ = tc.summarise(runs, ["trace-tokens", "trace", "grpo", "pcl"], pool_k=4, pool_size=16)
    by = {r["method"]: r for r in rows}
    assert by["trace-tokens"]["contrast_groups_per_1000_tokens"] == pytest.approx(4.5)
    assert by["trace"]["contrast_groups_per_1000_tokens"] == pytest.approx(2.4)
    assert by["pcl"]["contrast_groups_per_1000_tokens"] is None  # its runs recorded no anchors
    out = tc.judge_tokens(rows, runs)
    assert out["trace-tokens vs trace per 1k tokens (reported, no target)"] == (
        "mixed prompt + branch groups 4.500 vs 2.400 (1.88x), yield 5.00 vs 1.28 (3.91x) (seeds [0])")
    assert out["trace-tokens vs grpo per 1k tokens (reported, no target)"].startswith(
        "mixed prompt + branch groups 4.500 vs 0.800 (5.62x), yield 5.00 vs 1.60 (3.12x)")
    assert out["trace-tokens vs pcl per 1k tokens (reported, no target)"] == "yield 5.00 vs 0.00 (–) (seeds [0])"


def test_a_record_without_a_count_takes_it_from_its_runs_checkpoint(tmp_path: Path) -> None:
    run = _run("trace", 0, mixed=[1, 2], activated=[4, 4], rollouts=[8, 8], tokens=[100, 100])
    assert tc.complete_series(run, tmp_path) is run  # no checkpoint: nothing to take
    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest").write_text("step_000002")
    (tmp_path / "checkpoints" / "step_000002" / "trainer_state.json").write_text(json.dumps(
        {"history": {"counts/mixed_anchors": [3.0, 4.0], "counts/expanded_anchors": [9.0]}}))
    done = tc.complete_series(run, tmp_path)
    assert done["series"]["counts/mixed_anchors"] == [3.0, 4.0]
    assert "counts/expanded_anchors" not in done["series"]  # one value for two steps: not taken
    assert "counts/mixed_anchors" not in run["series"]  # the record itself is not changed


def _tree(prompt: str) -> RolloutTree:
    """Two bare rollouts of two turns (3 + 2 generated tokens each) and one continuation from the
    first bare rollout's first turn (4 generated tokens): branch depth 1."""
    tree = RolloutTree(prompt, [1, 2])
    anchors = []
    for _ in range(2):
        t = tree.start_trajectory("bare")
        anchors.append(tree.add_turn(t, [5, 6, 7, 8], [1, 1, 1, 0]))
        tree.add_turn(t, [9, 9], [1, 1])
        tree.finish(t, 1.0)
    c = tree.start_trajectory("continuation", anchors[0])
    tree.add_turn(c, [3, 3, 3, 3, 0], [1, 1, 1, 1, 0])
    tree.finish(c, 0.0)
    return tree


def test_where_the_trajectories_and_tokens_went_is_read_from_the_trees(tmp_path: Path) -> None:
    save_trees(tmp_path / "trees" / "step00000.jsonl.gz", [_tree("a"), _tree("b")])
    (tmp_path / "checkpoints" / "step_000001").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest").write_text("step_000001")
    (tmp_path / "checkpoints" / "step_000001" / "trainer_state.json").write_text(json.dumps(
        {"history": {"tokens/root_cost_error": [0.2, 0.4], "tokens/anchor_cost_error": [float("nan"), 0.3]}}))
    shift = tc.allocation_shift(tmp_path)
    assert shift["continuation_trajectory_share"] == pytest.approx(2 / 6)
    assert shift["continuation_token_share"] == pytest.approx(8 / (8 + 20))  # bare: 2 x 2 x (3 + 2)
    assert shift["mean_anchor_depth"] == 1.0
    assert shift["root_cost_error"] == pytest.approx(0.3)
    assert shift["anchor_cost_error"] == pytest.approx(0.3)  # NaN steps (no anchors) left out
    assert tc.allocation_shift(tmp_path / "elsewhere") is None

