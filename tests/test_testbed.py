"""The embedded testbed's draw (pure, over the generated QA data): two disjoint splits of the
same topics, a demonstration plan that follows each topic's competence, question files that are
the training split's rows unchanged (nothing in them carries the grade), a stable hash, and the
spread and interval arithmetic the reports use."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from conftest import DATA

from trace_core.metrics import contrast_counts, wilson_interval
from trace_core.warmstart import testbed as tb


@pytest.fixture(scope="module")
def rows():
    return tb.read_rows(DATA / "qa" / "train.jsonl")


def topic(row) -> str:
    return row["metadata"]["path"][0]["entity_id"]


def test_splits_are_disjoint_share_topics_and_follow_the_competence(rows) -> None:
    data, md5 = rows
    bed = tb.draw_testbed(data, tb.TestbedConfig(), md5)
    by_id = {r["id"]: r for r in data}
    assert len(bed.pool) == 128 and len(set(bed.pool)) == 128
    assert not set(bed.pool) & set(bed.warmup)
    assert {topic(by_id[q]) for q in bed.pool} <= {topic(by_id[q]) for q in bed.warmup}
    assert all(len(by_id[q]["metadata"]["path"]) <= 3 for q in bed.pool + bed.warmup)
    plans: dict[str, list] = {}
    for p in bed.plan:
        plans.setdefault(p.task_id, []).append(p)
    assert set(plans) == set(bed.pool) | set(bed.warmup)
    for qid, plan in plans.items():
        kind = bed.competence[topic(by_id[qid])]
        right = sum(p.corrupt_at is None for p in plan)
        hops = len(by_id[qid]["metadata"]["path"])
        assert all(p.corrupt_at is None or 0 <= p.corrupt_at <= hops for p in plan)
        if kind == "known":
            assert right == len(plan) == 1
        elif kind == "unknown":
            assert right == 0 and len(plan) == 1
        else:
            assert len(plan) in (2, 3, 4) and 1 <= right < len(plan)
    kinds = Counter(bed.competence.values())
    assert all(kinds[k] > 0 for k in ("known", "unknown", "partial"))


def test_question_files_are_the_training_rows_unchanged(rows, tmp_path) -> None:
    data, md5 = rows
    bed = tb.draw_testbed(data, tb.TestbedConfig(), md5)
    path = tb.write_split(data, bed.pool, tmp_path / "pool.jsonl")
    by_id = {r["id"]: r for r in data}
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in written] == list(bed.pool)
    assert all(r == by_id[r["id"]] for r in written)  # no tag, grade or competence added


def test_the_draw_and_its_hash_are_determined_by_config_and_data(rows) -> None:
    data, md5 = rows
    a, b = tb.draw_testbed(data, tb.TestbedConfig(), md5), tb.draw_testbed(data, tb.TestbedConfig(), md5)
    assert a.to_json() == b.to_json()
    other = tb.draw_testbed(data, tb.TestbedConfig(seed=1), md5)
    assert other.hash != a.hash and other.pool != a.pool
    assert tb.testbed_hash(tb.TestbedConfig(), md5) == a.hash != tb.testbed_hash(tb.TestbedConfig(), "other data")


def test_bad_testbed_settings_are_errors_naming_the_setting(rows) -> None:
    data, md5 = rows
    with pytest.raises(ValueError, match="pool_size"):
        tb.draw_testbed(data, tb.TestbedConfig(pool_size=10_000), md5)
    with pytest.raises(ValueError, match="known_share"):
        tb.TestbedConfig(known_share=0.8, unknown_share=0.5)
    with pytest.raises(ValueError, match="partial_demos"):
        tb.TestbedConfig(partial_demos=(1,))
    with pytest.raises(ValueError, match="max_hops"):
        tb.TestbedConfig(max_hops=1)


def test_spread_shares_bins_and_grpo_ratio() -> None:
    s = tb.Spread(8, {"a": 0, "b": 0, "c": 8, "d": 3, "e": 5, "f": 5})
    assert s.histogram == [2, 0, 0, 1, 0, 2, 0, 0, 1]
    assert s.shares == {"never": 2 / 6, "always": 1 / 6, "mixed": 3 / 6}
    assert s.largest_interior_bin_share == pytest.approx(2 / 3)
    assert s.grpo_effective_ratio == pytest.approx(0.5)
    assert s.mean_success == pytest.approx(21 / 48)


def test_wilson_interval_matches_its_formula_and_edges() -> None:
    lo, hi = wilson_interval(9, 32)
    p, n, z = 9 / 32, 32, 1.6448536269514722
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert (lo, hi) == pytest.approx((centre - half, centre + half))
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert all(np.isnan(wilson_interval(0, 0)))
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 3)


def test_contrast_counts_are_the_ratios_numerators() -> None:
    from trace_core.metrics import effective_ratio, prefix_effective_ratio
    from trace_core.tree import RolloutTree

    def tree(pid, rewards):
        t = RolloutTree(pid, [1, 2, 3])
        for r in rewards:
            j = t.start_trajectory("bare")
            t.add_turn(j, [4], [1])
            t.finish(j, r)
        return t

    trees = [tree("a", [1, 0]), tree("b", [1, 1]), tree("c", [0, 0, 1])]
    c = contrast_counts(trees)
    assert (c.activated, c.mixed, c.trajectories) == (3, 2, 7)
    assert c.mixed / c.activated == effective_ratio(trees)
    assert c.rollouts_per_mixed_group == 3.5 and c.mixed_per_100_rollouts == pytest.approx(200 / 7)
    assert c.expanded_anchors == 0 and np.isnan(prefix_effective_ratio(trees))


def test_a_miniature_testbed_lands_in_its_calibration_range(kb_qa_index, tmp_path) -> None:
    """The whole recipe on a 16-question pool: draw, demonstrate through the real retriever, fit
    (the pipeline's SFT), then 8 rollouts per pool prompt at T = 1 through the executor. GRPO's
    expected step-0 effective ratio (the mixed share) lands in the miniature's configured range,
    and most prompts are never or always solved."""
    import dataclasses

    from conftest import batched_threads
    from transformers import AutoTokenizer

    from trace_core.rollout.agent import AgentConfig
    from trace_core.rollout.engine import EngineConfig
    from trace_core.rollout.executor import TreeRolloutExecutor
    from trace_core.rollout.hf_engine import HFEngine
    from trace_core.warmstart.demos import load_tasks
    from trace_core.warmstart.pipeline import TESTBED_SFT, WarmStartConfig, env_factory, run_warm_start

    index_dir, _ = kb_qa_index
    mini = tb.TestbedConfig(pool_size=16, grpo_ratio_range=(0.05, 0.65))
    config = WarmStartConfig(data_dir=str(DATA), out_dir=str(tmp_path), families=("qa",), eval_tasks=0,
                             qa_index=str(index_dir), view_sft=None, testbed=mini,
                             sft=dataclasses.replace(TESTBED_SFT, progress=False))
    with batched_threads():
        report = run_warm_start(config)
    policy = report["policy_dir"]
    agent = AgentConfig(max_turns=5, max_new_tokens=96, max_total_tokens=2048)
    engine = HFEngine(EngineConfig(model_path=policy, max_model_len=2048, seed=0))
    try:
        executor = TreeRolloutExecutor(engine, AutoTokenizer.from_pretrained(policy),
                                       env_factory("qa", DATA, index_dir), agent, tool_workers=2)
        pool = load_tasks(tmp_path / "pool.jsonl")
        result = executor.run(pool, [8] * len(pool), None, np.random.default_rng(0),
                              sampling_seed=0)
    finally:
        engine.close()
    spread = tb.spread_of(result.trees, 8)
    lo, hi = mini.grpo_ratio_range
    assert lo <= spread.grpo_effective_ratio <= hi, spread.to_json()
    assert spread.shares["never"] + spread.shares["always"] > 0.5, spread.to_json()


def test_the_heldout_split_is_the_test_questions_on_the_testbed_topics(rows) -> None:
    data, md5 = rows
    bed = tb.draw_testbed(data, tb.TestbedConfig(), md5)
    test_rows, _ = tb.read_rows(DATA / "qa" / "test.jsonl")
    held = tb.heldout_rows(test_rows, bed)
    assert held, "the embedded test split holds questions on the testbed's topics"
    assert not {r["id"] for r in held} & (set(bed.pool) | set(bed.warmup))
    assert {topic(r) for r in held} <= set(bed.competence)
    assert all(len(r["metadata"]["path"]) <= bed.config.max_hops for r in held)
    # every test question on a testbed topic within the hop limit is in it, and the JSON form agrees
    expected = [r for r in test_rows if topic(r) in bed.competence and len(r["metadata"]["path"]) <= 3]
    assert [r["id"] for r in held] == [r["id"] for r in expected]
    assert tb.heldout_rows(test_rows, json.loads(json.dumps(bed.to_json()))) == held


def test_the_testbed_identity_follows_the_weights_and_the_recorded_code(tmp_path, rows) -> None:
    data, md5 = rows
    bed = tb.draw_testbed(data, tb.TestbedConfig(), md5)
    folder = tmp_path / "bed"
    (folder / "policy").mkdir(parents=True)
    (folder / "testbed.json").write_text(json.dumps({**bed.to_json(), "warm_start_code": "abc"}))
    (folder / "policy" / "model.safetensors").write_bytes(b"weights one")
    first = tb.testbed_identity(folder)
    assert first["hash"] == bed.hash and first["warm_start_code"] == "abc"
    (folder / "policy" / "model.safetensors").write_bytes(b"weights two")
    assert tb.testbed_identity(folder)["policy_digest"] != first["policy_digest"]
    (folder / "testbed.json").write_text(json.dumps(bed.to_json()))  # a folder that recorded no code digest
    assert tb.testbed_identity(folder)["warm_start_code"] == tb.warm_start_code_digest()
    (folder / "policy" / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no weight file"):
        tb.testbed_identity(folder)
