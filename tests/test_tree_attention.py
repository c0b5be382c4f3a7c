"""The shared tree-attention path: exact against per-path forwards and the dense-mask path,
bounded calls, saved memory linear in the packed tokens, and the chunked LM head."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trace_core.training.ppo import pack_trees_for_training
from trace_core.tree import RolloutTree
from trace_core.tree_packing.attention import (
    TreeAttentionConfig,
    build_plan,
    model_attention,
    tree_attention_mask,
)
from trace_core.tree_packing.layout import pack_token_trees, tree_tokens
from trace_core.tree_packing.logprobs import chunked_token_logprobs, install_logprob_head, packed_token_logprobs

VOCAB = 97
# tiny calls: many groups, split segments, padding everywhere
TIGHT = TreeAttentionConfig(query_chunk=5, max_pairs_per_call=600, max_keys_per_call=120, bucket=1.0)


def tiny_model(tie: bool = False, seed: int = 0) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                      tie_word_embeddings=tie, attention_dropout=0.0)
    model = Qwen3ForCausalLM(cfg)
    model.config._attn_implementation = model_attention("tree")
    return model.eval()


def random_tree(seed: int, turns: int = 4, bare: int = 3, long_prompt: int = 23) -> RolloutTree:
    """Bare rollouts plus continuations from random anchors; turns of 1–12 tokens, a prompt
    longer than a query chunk."""
    rng = np.random.default_rng(seed)
    tree = RolloutTree(f"t{seed}", rng.integers(0, VOCAB, size=long_prompt).tolist())

    def turn(traj: int) -> int:
        n_model, n_obs = int(rng.integers(1, 8)), int(rng.integers(0, 5))
        ids = rng.integers(0, VOCAB, size=n_model + n_obs).tolist()
        return tree.add_turn(traj, ids, [1] * n_model + [0] * n_obs, logprobs=(-rng.random(len(ids))).tolist())

    anchors = []
    for _ in range(bare):
        t = tree.start_trajectory("bare")
        for _ in range(turns):
            anchors.append(turn(t))
        tree.finish(t, float(rng.integers(0, 2)))
    for a in rng.choice(anchors[:-1], size=3, replace=False).tolist():
        if tree.nodes[a].terminal:
            continue
        for _ in range(2):
            c = tree.start_trajectory("continuation", branch_node=a)
            for _ in range(int(rng.integers(1, 3))):
                turn(c)
            tree.finish(c, float(rng.integers(0, 2)))
    return tree


def leaf_paths(tree: RolloutTree):
    """Per leaf: its history and the packed offset of each token of it (node-id packing order)."""
    offset, starts = 0, {}
    for node in tree.nodes:
        starts[node.id] = offset
        offset += len(node.token_ids)
    for leaf in tree.leaves():
        path = tree.path(leaf)
        index = np.concatenate([starts[n] + np.arange(len(tree.nodes[n].token_ids)) for n in path])
        yield np.asarray(tree.history_tokens(leaf)), index


@pytest.mark.parametrize("config", [TreeAttentionConfig(), TIGHT], ids=["default", "tight"])
def test_packed_logits_equal_each_path_alone(config: TreeAttentionConfig) -> None:
    model = tiny_model()
    for seed in range(3):
        tree = random_tree(seed)
        (pack,) = pack_token_trees([tree_tokens(tree)])
        plan = build_plan(pack, torch.device("cpu"), config)
        with torch.no_grad():
            packed = model(input_ids=torch.as_tensor(pack.token_ids)[None],
                           position_ids=torch.as_tensor(pack.position_ids)[None],
                           attention_mask={"full_attention": plan}, use_cache=False).logits[0]
            for hist, index in leaf_paths(tree):
                alone = model(input_ids=torch.as_tensor(hist)[None]).logits[0]
                assert float((packed[torch.as_tensor(index)] - alone).abs().max()) <= 1e-4


def test_plan_covers_the_tree_pattern_within_its_call_bounds() -> None:
    trees = [tree_tokens(random_tree(s)) for s in range(3)]
    (pack,) = pack_token_trees(trees)  # several trees in one pack: no pair crosses them
    plan = build_plan(pack, torch.device("cpu"), TIGHT)
    dense = tree_attention_mask(pack, torch.device("cpu"), "sdpa")[0, 0].numpy()
    seen = np.zeros_like(dense)
    queries = []
    for grp in plan.groups:
        G, Q = grp.query_index.shape
        K = grp.key_index.shape[1]
        assert G * Q * K <= TIGHT.max_pairs_per_call or G == 1
        assert G * K <= TIGHT.max_keys_per_call or G == 1
        assert Q <= TIGHT.query_chunk
        for g in range(G):
            for i in range(Q):
                if grp.query_valid[g, i]:
                    q = int(grp.query_index[g, i])
                    queries.append(q)
                    visible = grp.key_index[g, : int(grp.limit[g]) + i + 1].numpy()
                    seen[q, visible] = True
    assert sorted(queries) == list(range(pack.num_tokens))  # every token is a query exactly once
    np.testing.assert_array_equal(seen, dense)
    assert plan.pairs == int(dense.sum())


def _dense_logprobs(model, pack, targets) -> torch.Tensor:
    """Today's dense-mask packed path: the L × L mask, full logits, log_softmax."""
    ids = torch.as_tensor(pack.token_ids)
    pred = torch.as_tensor(targets.predecessor)
    wanted = torch.as_tensor(targets.loss_mask) & (pred >= 0)
    keep, row = torch.unique(pred[wanted], return_inverse=True)
    with _Switch(model, "sdpa"):
        out = model(input_ids=ids[None], position_ids=torch.as_tensor(pack.position_ids)[None],
                    attention_mask={"full_attention": tree_attention_mask(pack, torch.device("cpu"), "sdpa")},
                    use_cache=False, logits_to_keep=keep)
    logp = torch.log_softmax(out.logits[0].float(), dim=-1)[row, ids[wanted]]
    return torch.zeros(ids.shape).masked_scatter(wanted, logp)


class _Switch:
    """Point a model at another attention kernel for one forward."""

    def __init__(self, model, name: str) -> None:
        self.model, self.name = model, name

    def __enter__(self) -> None:
        self.old = self.model.config._attn_implementation
        self.model.config._attn_implementation = self.name

    def __exit__(self, *exc) -> None:
        self.model.config._attn_implementation = self.old


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_gradients_equal_the_dense_mask_path(tie: bool) -> None:
    from trace_core.advantages import get_advantage_estimator

    model = tiny_model(tie=tie, seed=1)
    install_logprob_head(model, max_logits_per_chunk=3 * VOCAB)  # chunks of 3 tokens
    trees = [random_tree(s, turns=3) for s in (5, 6)]
    adv = get_advantage_estimator("tree")(trees)
    params = list(model.parameters())
    for pack, targets in pack_trees_for_training(trees, adv, max_tokens_per_forward=1):  # a pack per tree
        w = torch.as_tensor(targets.advantage)
        m = torch.as_tensor(targets.loss_mask)
        dense_lp = _dense_logprobs(model, pack, targets)
        g_dense = torch.autograd.grad((dense_lp * w * m).sum(), params)
        tree_lp = packed_token_logprobs(model, pack, targets.predecessor, targets.loss_mask, torch.device("cpu"),
                                        "tree", TIGHT)
        g_tree = torch.autograd.grad((tree_lp * w * m).sum(), params)
        torch.testing.assert_close(tree_lp, dense_lp, atol=1e-5, rtol=0)
        for gt, gd in zip(g_tree, g_dense, strict=True):
            torch.testing.assert_close(gt, gd, atol=1e-5, rtol=1e-4)


def test_chunked_logprobs_and_gradients_equal_full_log_softmax() -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    rows = torch.tensor([0, 3, 3, 6, 1, 3, 2])  # a branching node's last token predicts several children
    targets = torch.randint(0, 50, (7,), generator=gen)
    ref = torch.log_softmax(hidden[rows] @ weight.t(), -1).gather(1, targets[:, None]).squeeze(1)
    g = torch.randn(7, generator=gen, dtype=torch.float64)
    ref_grads = torch.autograd.grad((ref * g).sum(), (hidden, weight))
    for budget in (1, 50, 150, 10_000):
        got = chunked_token_logprobs(hidden, weight, rows, targets, max_logits_per_chunk=budget)
        torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=0)  # float32 log-probs
        grads = torch.autograd.grad((got * g).sum(), (hidden, weight))
        for a, b in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _saved_bytes(model, pack, attn: str) -> int:
    """Bytes autograd keeps for backward during one packed forward (distinct storages)."""
    storages: dict[int, int] = {}

    def pack_hook(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    wanted = np.ones(pack.num_tokens, dtype=bool)
    pred = np.arange(pack.num_tokens) - 1
    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t), _Switch(model, model_attention(attn)):
        packed_token_logprobs(model, pack, pred, wanted, torch.device("cpu"), attn)
    return sum(storages.values())


def test_saved_memory_is_linear_in_packed_tokens() -> None:
    """Doubling the turns' length doubles what the tree path keeps for backward; the dense
    path's mask makes it grow ~4×."""
    model = tiny_model()
    install_logprob_head(model)

    def tree_of(turn_len: int) -> RolloutTree:
        rng = np.random.default_rng(0)
        tree = RolloutTree("m", rng.integers(0, VOCAB, size=2 * turn_len).tolist())
        anchors = []
        for _ in range(4):
            t = tree.start_trajectory("bare")
            for _ in range(3):
                anchors.append(tree.add_turn(t, rng.integers(0, VOCAB, size=turn_len).tolist(), [1] * turn_len))
            tree.finish(t, 1.0)
        for a in anchors[::3]:
            c = tree.start_trajectory("continuation", branch_node=a)
            tree.add_turn(c, rng.integers(0, VOCAB, size=turn_len).tolist(), [1] * turn_len)
            tree.finish(c, 0.0)
        return tree

    small, large = (pack_token_trees([tree_tokens(tree_of(n))])[0] for n in (48, 96))
    assert large.num_tokens == 2 * small.num_tokens
    tree_ratio = _saved_bytes(model, large, "tree") / _saved_bytes(model, small, "tree")
    dense_ratio = _saved_bytes(model, large, "sdpa") / _saved_bytes(model, small, "sdpa")
    assert tree_ratio <= 2.1, tree_ratio
    assert dense_ratio >= 3.0, dense_ratio


def test_bfloat16_autocast_follows_the_dense_path() -> None:
    model = tiny_model(seed=2)
    tree = random_tree(9)
    (pack,) = pack_token_trees([tree_tokens(tree)])
    ids = torch.as_tensor(pack.token_ids)[None]
    pos = torch.as_tensor(pack.position_ids)[None]
    outs = {}
    for attn in ("tree", "sdpa"):
        mask = build_plan(pack, torch.device("cpu"), TIGHT) if attn == "tree" else \
            tree_attention_mask(pack, torch.device("cpu"), "sdpa")
        model.zero_grad()
        with _Switch(model, model_attention(attn)), torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=ids, position_ids=pos, attention_mask={"full_attention": mask},
                           use_cache=False).logits[0]
        logits.float().square().mean().backward()
        outs[attn] = (logits.float(), model.model.layers[0].self_attn.q_proj.weight.grad.clone())
    torch.testing.assert_close(outs["tree"][0], outs["sdpa"][0], atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(outs["tree"][1], outs["sdpa"][1], atol=3e-2, rtol=5e-2)


def test_bad_plans_raise() -> None:
    with pytest.raises(ValueError, match="query_chunk"):
        TreeAttentionConfig(query_chunk=0)
    with pytest.raises(ValueError, match="bucket"):
        TreeAttentionConfig(bucket=0.5)
    model = tiny_model()
    (pack,) = pack_token_trees([tree_tokens(random_tree(0))])
    plan = build_plan(pack, torch.device("cpu"))
    with pytest.raises(ValueError, match="plan is for"):
        model(input_ids=torch.as_tensor(pack.token_ids[:-1])[None], attention_mask={"full_attention": plan})
    with pytest.raises(ValueError, match="install_logprob_head"):
        packed_token_logprobs(model, pack, np.zeros(pack.num_tokens, dtype=np.int64),
                              np.ones(pack.num_tokens, dtype=bool), torch.device("cpu"))


# ---------------------------------------------------------------------------- the benchmark's workload
def test_benchmark_tree_has_the_paper_shape_at_every_size() -> None:
    from bench import tree_training

    shape = tree_training.TreeShape()
    for size in (1024, 4096):
        tree, adv, _ = tree_training.build_tree(shape, size, VOCAB)
        tree.validate()
        stats = tree_training.tree_stats(tree)
        assert stats["distinct_tokens"] == size and stats["leaves"] == 48 and stats["sharing_ratio"] >= 2
        assert len(tree.bare_trajectories()) == 16
        assert sorted(len(tree.path(t.leaf)) - 1 for t in tree.bare_trajectories())[0] >= shape.min_turns
        packs = {p: tree_training.inputs_for(p, tree, adv) for p in ("tree", "varlen")}
        assert packs["tree"][0].num_tokens == size
        assert packs["varlen"][0].num_tokens == stats["path_tokens"]  # shared prefixes repeated
        # both paths train the same tokens: each leaf's model-written tokens, once (tree) or per path
        assert packs["varlen"][2].sum() == sum(sum(tree.history_loss_mask(leaf)) for leaf in tree.leaves())


def test_benchmark_help_imports_no_torch() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = ("import runpy, sys\nsys.argv = ['tree_training', '--help']\ntry:\n"
            "    runpy.run_module('bench.tree_training', run_name='__main__', alter_sys=True)\nexcept SystemExit:\n"
            "    pass\nprint('torch' in sys.modules, 'numpy' in sys.modules)")
    root = Path(__file__).resolve().parents[1]  # where `python -m bench.tree_training` runs from
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout
    assert out.strip().splitlines()[-1] == "False False"
