"""Tests of the success predictor (method §5): tree-packed scoring, online update, state, guard."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from trace_core.predictor import (
    Example,
    PredictorConfig,
    SuccessPredictor,
    calibration,
    informative_prefixes,
    pack_token_trees,
    sample_examples,
    step_diagnostics,
    supervised_set,
    tree_tokens,
)
from trace_core.predictor.examples import num_prefix_examples, prefix_weight
from trace_core.predictor.scoring import pack_logits
from trace_core.seeding import derive_seed
from trace_core.tree import ROOT, RolloutTree

VOCAB = 97


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny forwards: one thread is faster and immune to CPU contention from other processes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def random_tree(
    seed: int, depth: int = 4, n_bare: int = 3, n_cont: int = 3, allow_empty: bool = True
) -> RolloutTree:
    """A tree with ``n_bare`` bare rollouts of ``depth`` turns and ``n_cont`` continuations from
    random anchors; turns hold 0-4 tokens (0 only if ``allow_empty``)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, VOCAB, size=int(rng.integers(2, 6))).tolist()
    tree = RolloutTree(f"p{seed}", prompt_token_ids=prompt)
    lo = 0 if allow_empty else 1

    def turn(traj: int) -> None:
        ids = rng.integers(0, VOCAB, size=int(rng.integers(lo, 5))).tolist()
        tree.add_turn(traj, ids, [1] * len(ids))

    for _ in range(n_bare):
        traj = tree.start_trajectory("bare")
        for _ in range(depth):
            turn(traj)
        tree.finish(traj, float(rng.random() < 0.5))
    for _ in range(n_cont):
        anchor = int(rng.choice(tree.anchors()))
        traj = tree.start_trajectory("continuation", branch_node=anchor)
        for _ in range(depth - tree.nodes[anchor].depth):
            turn(traj)
        tree.finish(traj, float(rng.random() < 0.5))
    return tree


def tiny_config(**kw) -> PredictorConfig:
    base = dict(vocab_size=VOCAB, tiny_hidden_size=32, tiny_num_layers=2, tiny_num_heads=2,
                tiny_num_kv_heads=1, tiny_head_dim=16, tiny_intermediate_size=64, tiny_max_positions=256,
                init_std=0.1, batch_size=8, seed=0)
    base.update(kw)
    return PredictorConfig(**base)


def separate_score(predictor: SuccessPredictor, history: list[int]) -> float:
    """Reference: a plain causal forward over one history (no custom mask, default positions)."""
    with torch.no_grad():
        logits = predictor.model(torch.tensor([history]))
    return float(torch.sigmoid(logits[0, -1]))


# ---------------------------------------------------------------------------- scoring
@pytest.mark.parametrize("attn", ["tree", "sdpa", "eager"])
@pytest.mark.parametrize("max_tokens", [10_000, 40])
def test_tree_scoring_equals_per_prefix_scoring(attn: str, max_tokens: int) -> None:
    predictor = SuccessPredictor(tiny_config(attn_implementation=attn, max_tokens_per_forward=max_tokens))
    trees = [random_tree(s) for s in range(4)]
    scores = predictor.score_trees(trees)
    for tree, s in zip(trees, scores, strict=True):
        assert max(n.depth for n in tree.nodes) >= 4
        ref = np.array([separate_score(predictor, tree.history_tokens(n.id)) for n in tree.nodes])
        np.testing.assert_allclose(s, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("attn", ["tree", "sdpa"])
def test_packed_gradients_equal_per_prefix_gradients(attn: str) -> None:
    """Training through the packed forward gives the gradients of separate per-prefix forwards."""
    predictor = SuccessPredictor(tiny_config(attn_implementation=attn))
    tree = random_tree(3)
    y = torch.as_tensor(np.random.default_rng(0).random(len(tree.nodes)), dtype=torch.float32)
    params = list(predictor.model.parameters())
    (pack,) = pack_token_trees([tree_tokens(tree)])
    logits = pack_logits(predictor.model, pack, predictor.device, attn, "float32")
    packed_loss = ((torch.sigmoid(logits[torch.as_tensor(pack.readout[0])]) - y) ** 2).sum()
    packed = torch.autograd.grad(packed_loss, params)
    separate_loss = sum(
        (torch.sigmoid(predictor.model(torch.tensor([tree.history_tokens(n.id)]))[0, -1]) - y[n.id]) ** 2
        for n in tree.nodes
    )
    separate = torch.autograd.grad(separate_loss, params)
    for g_packed, g_sep in zip(packed, separate, strict=True):
        torch.testing.assert_close(g_packed, g_sep, atol=1e-5, rtol=1e-4)


def test_tokens_entering_backbone_equal_distinct_tree_tokens() -> None:
    predictor = SuccessPredictor(tiny_config(max_tokens_per_forward=60))
    seen: list[int] = []
    embed = predictor.model.backbone.embed_tokens
    hook = embed.register_forward_hook(lambda m, inp, out: seen.append(inp[0].numel()))
    try:
        trees = [random_tree(s) for s in range(5)]
        predictor.score_trees(trees)
        assert sum(seen) == sum(len(n.token_ids) for t in trees for n in t.nodes)
        assert len(seen) > 1  # several forwards (60-token packs), still no token twice
        # a subset: only the requested nodes' paths are packed
        seen.clear()
        tree = trees[0]
        leaf = tree.leaves()[0]
        out = predictor.score_trees([tree], nodes=[[leaf]])
        assert sum(seen) == len(tree.history_tokens(leaf))
        assert np.isnan(out[0][ROOT]) and not np.isnan(out[0][leaf])
        # stage-1 roots: independent histories, no padding
        seen.clear()
        prompts = [t.root.token_ids for t in trees]
        v = predictor.score_histories(prompts)
        assert sum(seen) == sum(len(p) for p in prompts)
        np.testing.assert_allclose(v, [separate_score(predictor, p) for p in prompts], atol=1e-5, rtol=0)
    finally:
        hook.remove()


def test_packing_layout() -> None:
    tree = RolloutTree("p", prompt_token_ids=[1, 2])
    a = tree.start_trajectory("bare")
    n1 = tree.add_turn(a, [3], [1])
    n2 = tree.add_turn(a, [], [])  # adds no tokens: read out at its parent's last token
    n3 = tree.add_turn(a, [4, 5], [1, 1])
    tree.finish(a, 1.0)
    b = tree.start_trajectory("continuation", branch_node=n1)
    n4 = tree.add_turn(b, [6], [1])
    tree.finish(b, 0.0)
    (pack,) = pack_token_trees([tree_tokens(tree)])
    assert pack.token_ids.tolist() == [1, 2, 3, 4, 5, 6]
    assert pack.position_ids.tolist() == [0, 1, 2, 3, 4, 3]
    assert pack.readout[0].tolist() == [1, 2, 2, 4, 5]
    assert (n1, n2, n3, n4) == (1, 2, 3, 4)


def test_tiny_backbone_weights_are_the_shared_tiny_qwen3_draw() -> None:
    """The tiny backbone is drawn by models.init_tiny_weights: sorted names, norms 1, the rest
    N(0, init_std) from one generator seeded with config.seed; the head draws from seed + 1."""
    from transformers import Qwen3Model

    from trace_core.models import init_tiny_weights
    from trace_core.predictor.model import tiny_backbone_config

    config = tiny_config(seed=3)
    backbone = SuccessPredictor(config).model.backbone
    fresh = init_tiny_weights(Qwen3Model(tiny_backbone_config(config)), 3, config.init_std)
    gen = torch.Generator().manual_seed(3)
    for name, param in sorted(backbone.named_parameters()):
        assert torch.equal(param, fresh.get_parameter(name)), name
        if name.endswith("norm.weight"):
            assert torch.all(param == 1.0), name
        else:
            assert torch.equal(param, torch.randn(param.shape, generator=gen) * config.init_std), name
    other = SuccessPredictor(tiny_config(seed=4)).model.backbone
    assert not torch.equal(backbone.embed_tokens.weight, other.embed_tokens.weight)


def test_bad_inputs_raise() -> None:
    predictor = SuccessPredictor(tiny_config())
    with pytest.raises(ValueError, match="vocabulary"):
        predictor.score_histories([[1, VOCAB]])
    with pytest.raises(ValueError, match="holds no tokens"):
        predictor.score_histories([[]])
    with pytest.raises(ValueError, match="max_length"):
        SuccessPredictor(tiny_config(max_length=4)).score_histories([[1] * 5])
    with pytest.raises(ValueError, match="prefix_share"):
        tiny_config(prefix_share=1.0)
    with pytest.raises(ValueError, match="learning_rate"):
        tiny_config(learning_rate=float("inf"))


def test_learning_rates_per_spec(tmp_path) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    lm = Qwen3ForCausalLM(cfg)
    lm.save_pretrained(tmp_path)
    qa = SuccessPredictor(PredictorConfig(backbone_path=str(tmp_path)))
    assert qa.optimizer.param_groups[0]["lr"] == 3e-5
    assert torch.equal(qa.model.backbone.embed_tokens.weight, lm.model.embed_tokens.weight)
    assert PredictorConfig(backbone_path="x", task_family="math").resolved_learning_rate() == 1.5e-5
    assert PredictorConfig(backbone_path="x", task_family="function_calling").resolved_learning_rate() == 3e-5
    assert PredictorConfig().resolved_learning_rate() == PredictorConfig().tiny_learning_rate


def test_fit_and_online_updates_use_their_own_learning_rates() -> None:
    tiny = PredictorConfig()
    assert tiny.resolved_online_learning_rate() == tiny.tiny_online_learning_rate < tiny.tiny_learning_rate
    assert PredictorConfig(learning_rate=2e-3).resolved_online_learning_rate() == 2e-3
    assert PredictorConfig(learning_rate=2e-3, online_learning_rate=5e-4).resolved_online_learning_rate() == 5e-4
    assert PredictorConfig(backbone_path="x", task_family="math").resolved_online_learning_rate() == 1.5e-5
    with pytest.raises(ValueError, match="online_learning_rate"):
        PredictorConfig(online_learning_rate=0.0)
    predictor = SuccessPredictor(tiny_config())
    trees = [random_tree(s) for s in range(6)]
    predictor.fit(trees, 1)
    assert {g["lr"] for g in predictor.optimizer.param_groups} == {tiny.tiny_learning_rate}
    predictor.update(trees)
    assert {g["lr"] for g in predictor.optimizer.param_groups} == {tiny.tiny_online_learning_rate}
    predictor.fit(trees, 1)  # a later fit is a fit again
    assert {g["lr"] for g in predictor.optimizer.param_groups} == {tiny.tiny_learning_rate}


# ---------------------------------------------------------------------------- supervised set
def test_supervised_set_selection() -> None:
    tree = RolloutTree("p", prompt_token_ids=[1])
    a = tree.start_trajectory("bare")
    n1 = tree.add_turn(a, [2], [1])
    n2 = tree.add_turn(a, [3], [1])
    n3 = tree.add_turn(a, [4], [1])
    tree.finish(a, 1.0)
    b = tree.start_trajectory("continuation", branch_node=n2)
    tree.add_turn(b, [5], [1])
    tree.finish(b, 0.0)
    c = tree.start_trajectory("bare")
    tree.add_turn(c, [6], [1])
    tree.finish(c, 0.0)
    empty = RolloutTree("skipped", prompt_token_ids=[1])  # a skipped prompt: no leaves, no target
    # n1 and n2 have 2 leaves below; n3 is terminal; the continuation's node is a leaf
    assert informative_prefixes(tree).tolist() == [n1, n2]
    assert informative_prefixes(tree, min_leaves=3).tolist() == []
    s = supervised_set([empty, tree])
    assert [(e.tree, e.node) for e in s.roots] == [(1, ROOT)]
    assert [(e.tree, e.node, e.target) for e in s.prefixes] == [(1, n1, 0.5), (1, n2, 0.5)]
    assert s.roots[0].target == pytest.approx(1 / 3)
    assert n3 not in [e.node for e in s.prefixes]


def test_prefix_share_sampling() -> None:
    rng = np.random.default_rng(0)
    assert num_prefix_examples(10, 100, 0.5, rng) == 10  # share/(1-share)*roots = 10 exactly
    assert num_prefix_examples(10, 3, 0.5, rng) == 3  # capped by the candidates
    assert num_prefix_examples(10, 100, 0.0, rng) == 0
    draws = [num_prefix_examples(47, 1000, 0.06, rng) for _ in range(4000)]
    share = np.mean(draws) / (47 + np.mean(draws))
    assert abs(share - 0.06) < 0.002
    s = supervised_set([random_tree(k, allow_empty=False) for k in range(30)])
    examples, n = sample_examples(s, 0.06, np.random.default_rng(1))
    assert examples[: len(s.roots)] == s.roots and len(examples) == len(s.roots) + n
    assert set(examples[len(s.roots):]) <= set(s.prefixes)


def test_floor_prefixes_keep_the_share_of_the_loss() -> None:
    assert prefix_weight(47, 3, 0.06) == 1.0  # at or under the share: full weight
    assert prefix_weight(0, 5, 0.06) == 1.0 and prefix_weight(5, 0, 0.06) == 1.0
    w = prefix_weight(35, 16, 0.06)
    assert 16 * w / (35 + 16 * w) == pytest.approx(0.06)
    s = supervised_set([random_tree(k, allow_empty=False) for k in range(30)])
    assert len(s.prefixes) > 20
    examples, n = sample_examples(s, 0.06, np.random.default_rng(1), minimum=20)
    roots, prefixes = examples[: len(s.roots)], examples[len(s.roots):]
    assert n == 20 and all(e.weight == 1.0 for e in roots)
    share = sum(e.weight for e in prefixes) / sum(e.weight for e in examples)
    assert share == pytest.approx(0.06)
    with pytest.raises(ValueError, match="prefix_share"):
        prefix_weight(3, 3, 1.0)


def test_weighted_loss_is_the_weighted_mean() -> None:
    """A prefix at weight w moves the loss as w copies of it would: one example at weight 0.5
    beside a root gives the loss of the weighted mean, and weight 0 the root's alone."""
    trees = [random_tree(0, allow_empty=False)]
    s = supervised_set(trees)
    root, prefix = s.roots[0], s.prefixes[0]
    pred = SuccessPredictor(tiny_config()).score_trees(trees)[0]
    err = {ex.node: (pred[ex.node] - ex.target) ** 2 for ex in (root, prefix)}
    for w, expected in ((0.5, (err[root.node] + 0.5 * err[prefix.node]) / 1.5), (0.0, err[root.node])):
        fresh = SuccessPredictor(tiny_config())
        out = fresh.fit_examples(trees, [root, dataclasses.replace(prefix, weight=w)])
        assert out["loss"] == pytest.approx(expected, rel=1e-4)


# ---------------------------------------------------------------------------- update, guard, state
def _weights(p: SuccessPredictor) -> list[torch.Tensor]:
    return [t.detach().clone() for t in p.model.parameters()]


def test_update_trains_and_reports() -> None:
    predictor = SuccessPredictor(tiny_config(prefix_share=0.3, learning_rate=1e-2))
    trees = [random_tree(s) for s in range(12)]
    first = predictor.update(trees)
    for _ in range(10):
        last = predictor.update(trees)
    assert first["n_roots"] == 12 and first["skipped"] == 0 and first["optimizer_steps"] >= 2
    assert np.isfinite(first["loss"]) and last["oos_mse_root"] < first["oos_mse_root"]


def test_diagnostics_use_predictions_made_before_the_update() -> None:
    predictor = SuccessPredictor(tiny_config(learning_rate=1e-2, prefix_share=0.5))
    trees = [random_tree(s, allow_empty=False) for s in range(10)]
    before = predictor.score_trees(trees)
    stats = predictor.update(trees)
    after = predictor.score_trees(trees)
    expected = step_diagnostics(trees, before)
    assert stats["oos_spearman_root"] == pytest.approx(expected.spearman_root, abs=1e-6)
    assert stats["oos_spearman_prefix"] == pytest.approx(expected.spearman_prefix, abs=1e-6)
    assert stats["oos_mse_root"] == pytest.approx(expected.mse_root, abs=1e-6)
    assert stats["ece_prefix"] == pytest.approx(expected.calibration_prefix.ece, abs=1e-6)
    post = step_diagnostics(trees, after)
    assert abs(post.mse_root - stats["oos_mse_root"]) > 1e-6  # the update moved the predictions

    # allocation-time predictions can be handed in (roots only here): the rest is scored first
    twin = SuccessPredictor(tiny_config(learning_rate=1e-2, prefix_share=0.5))
    roots_only = [np.where(np.arange(len(t.nodes)) == ROOT, b, np.nan)
                  for t, b in zip(trees, before, strict=True)]
    reused = twin.update(trees, predictions=roots_only)
    for key in ("oos_spearman_root", "oos_spearman_prefix", "oos_mse_prefix", "ece_root", "loss"):
        assert reused[key] == pytest.approx(stats[key], abs=1e-6)


def test_nonfinite_target_is_skipped_and_weights_untouched() -> None:
    predictor = SuccessPredictor(tiny_config())
    trees = [random_tree(0)]
    predictor.update(trees)  # creates optimizer state
    w0, opt0 = _weights(predictor), predictor.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    out = predictor.fit_examples(trees, [Example(0, ROOT, float("nan")), Example(0, 1, 0.5)])
    assert out["skipped"] == 1 and out["optimizer_steps"] == 0 and np.isnan(out["loss"])
    assert all(torch.equal(a, b) for a, b in zip(w0, _weights(predictor), strict=True))
    assert torch.equal(opt0, predictor.optimizer.state_dict()["state"][0]["exp_avg"])
    assert predictor.skipped_steps == 1


def test_infinite_learning_rate_is_rolled_back() -> None:
    predictor = SuccessPredictor(tiny_config())
    trees = [random_tree(s) for s in range(3)]
    predictor.update(trees)
    w0 = _weights(predictor)
    opt_state = predictor.optimizer.state_dict()["state"]
    state0 = {k: {n: t.clone() for n, t in v.items()} for k, v in opt_state.items()}
    steps0 = predictor.optimizer_steps
    # an infinite online rate (past the config's own check) makes every step non-finite
    object.__setattr__(predictor.config, "online_learning_rate", float("inf"))
    out = predictor.update(trees)
    assert out["skipped"] == out["optimizer_steps"] + out["skipped"] > 0
    assert predictor.optimizer_steps == steps0
    assert all(torch.equal(a, b) for a, b in zip(w0, _weights(predictor), strict=True))
    state1 = predictor.optimizer.state_dict()["state"]
    assert all(torch.equal(state0[k][n], state1[k][n]) for k in state0 for n in state0[k])


def test_save_restore_continues_bit_identically(tmp_path) -> None:
    config = tiny_config(prefix_share=0.3)
    steps = [[random_tree(10 * k + s) for s in range(6)] for k in range(4)]
    straight = SuccessPredictor(config)
    for trees in steps:
        straight.update(trees)

    first = SuccessPredictor(config)
    for trees in steps[:2]:
        first.update(trees)
    first.save(tmp_path / "predictor.pt")
    resumed = SuccessPredictor.load(tmp_path / "predictor.pt")
    for trees in steps[2:]:
        resumed.update(trees)
    assert resumed.optimizer_steps == straight.optimizer_steps and resumed.updates == 4
    for a, b in zip(straight.model.state_dict().values(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert straight.rng.random() == resumed.rng.random()
    with pytest.raises(ValueError, match="different config"):
        SuccessPredictor(tiny_config(tiny_hidden_size=48)).load_state_dict(first.state_dict())


def test_an_update_trains_on_the_replayed_steps_and_diagnoses_this_one() -> None:
    steps = [[random_tree(100 + 10 * k + s) for s in range(3)] for k in range(3)]
    replay = SuccessPredictor(tiny_config(replay_steps=2))
    single = SuccessPredictor(tiny_config(replay_steps=1))
    for k, trees in enumerate(steps):
        a, b = replay.update(trees), single.update(trees)
        assert a["n_roots"] == b["n_roots"] == len(trees)  # the diagnostics: this step's trees only
        assert a["n_train_roots"] == (len(trees) if k == 0 else 2 * len(trees))  # this step and the one before
        assert b["n_train_roots"] == len(trees)
    assert [len(s) for s in replay.replayed] == [3] and single.replayed == []
    with pytest.raises(ValueError, match="replay_steps"):
        tiny_config(replay_steps=0)


# ---------------------------------------------------------------------------- diagnostics, explore
def test_calibration_bins() -> None:
    cal = calibration([0.05, 0.15, 0.95, 1.0], [0.0, 1.0, 1.0, 1.0], n_bins=10)
    assert cal.count.tolist() == [1, 1, 0, 0, 0, 0, 0, 0, 0, 2]
    assert cal.mean_target[1] == 1.0 and np.isnan(cal.mean_prediction[2])
    assert cal.ece == pytest.approx((0.05 + 0.85 + 2 * 0.025) / 4)
    assert np.isnan(calibration([], []).ece)


# ---------------------------------------------------------------------------- prefix floor, random anchor
def test_min_prefix_examples_is_a_floor_capped_by_the_candidates() -> None:
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    assert num_prefix_examples(10, 100, 0.06, rng_a, minimum=16) == 16  # the share alone gives ~0.6
    assert num_prefix_examples(10, 100, 0.06, rng_b) <= 1
    assert rng_a.random() == rng_b.random()  # the floor draws nothing: the stream is the same
    assert num_prefix_examples(10, 5, 0.06, rng_a, minimum=16) == 5  # capped by the candidates
    assert num_prefix_examples(1000, 10_000, 0.06, rng_a, minimum=16) in (63, 64)  # the share rules above it
    with pytest.raises(ValueError, match="minimum"):
        num_prefix_examples(10, 100, 0.06, rng_a, minimum=-1)
    with pytest.raises(ValueError, match="min_prefix_examples"):
        tiny_config(min_prefix_examples=-1)
    assert PredictorConfig().min_prefix_examples == 16  # on by default

    trees = [random_tree(s, allow_empty=False, n_cont=4) for s in range(6)]
    candidates = len(supervised_set(trees).prefixes)
    assert candidates > 8
    floor = SuccessPredictor(tiny_config(prefix_share=0.06, min_prefix_examples=8)).update(trees)
    assert floor["n_prefixes"] == 8 and floor["n_roots"] == 6
    share_only = SuccessPredictor(tiny_config(prefix_share=0.06, min_prefix_examples=0)).update(trees)
    assert share_only["n_prefixes"] <= 1
    fit = SuccessPredictor(tiny_config(prefix_share=0.06, min_prefix_examples=8)).fit(trees, 1)
    assert fit["n_prefixes"] == 8  # the warm-up fit honours it too


def test_random_anchor_diagnostic_scores_one_internal_node_per_bare_rollout() -> None:
    from trace_core.metrics import spearman
    from trace_core.predictor.diagnostics import random_anchor_nodes

    trees = [random_tree(s, allow_empty=False, n_bare=4, n_cont=3) for s in range(8)]
    short = RolloutTree("one-turn", prompt_token_ids=[1, 2])  # bare rollouts without an internal node
    for reward in (0.0, 1.0):
        t = short.start_trajectory("bare")
        short.add_turn(t, [3], [1])
        short.finish(t, reward)
    trees.append(short)
    eligible = sum(1 for t in trees for b in t.bare_trajectories() if len(b.nodes) >= 2)
    assert eligible == 8 * 4

    chosen = random_anchor_nodes(trees, np.random.default_rng(0))
    for tree, nodes in zip(trees, chosen, strict=True):
        bare = [b for b in tree.bare_trajectories() if len(b.nodes) >= 2]
        assert len(nodes) == len(bare)
        for b, n in zip(bare, nodes.tolist(), strict=True):  # one per bare rollout, on its own path
            assert n in b.nodes[:-1] and tree.nodes[n].kind == "bare"

    predictor = SuccessPredictor(tiny_config(learning_rate=1e-2))
    before = predictor.score_trees(trees)
    stats = predictor.update(trees)
    assert stats["prefix_random_anchors"] == eligible
    # the same anchors, scored before the update, against the rollouts' rewards
    anchors = random_anchor_nodes(trees, np.random.default_rng(
        derive_seed(predictor.config.seed, "random_anchor", 0)))
    pred = [before[i][n] for i, a in enumerate(anchors) for n in a.tolist()]
    reward = [trees[i].trajectory_reward(trees[i].nodes[n].trajectory) for i, a in enumerate(anchors)
              for n in a.tolist()]
    assert len(pred) == eligible
    assert stats["prefix_spearman_random_anchor"] == pytest.approx(spearman(pred, reward), abs=1e-6)
    # the expanded-anchor figure keeps its old name beside its new one
    assert stats["prefix_spearman_expanded_anchors"] == stats["oos_spearman_prefix"]
    after = predictor.score_trees(trees)
    moved = [after[i][n] for i, a in enumerate(anchors) for n in a.tolist()]
    assert not np.allclose(moved, pred)  # so it was measured before the update changed them


def test_predictor_state_from_before_a_config_field_still_loads() -> None:
    config = tiny_config()
    state = SuccessPredictor(config).state_dict()
    del state["config"]["min_prefix_examples"]  # a state saved before the field existed
    SuccessPredictor(config).load_state_dict(state)  # the default is assumed
    with pytest.raises(ValueError, match="min_prefix_examples"):
        SuccessPredictor(tiny_config(min_prefix_examples=3)).load_state_dict(state)
