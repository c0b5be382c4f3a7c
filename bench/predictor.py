"""Success-predictor benchmark (method §5).

Three parts, all on simulator trees (trace_core/sim/) given synthetic token ids:

1. **Online Spearman**: the tiny Qwen3 predictor drives TRACE's allocation in the simulator for
   ``--steps`` steps and learns online; per step we log the out-of-sample Spearman between its
   predictions and the tree-backed targets V̂ at roots and at prefixes (made before the update
   that trains on those nodes), the ECE, the loss, and — what only a simulator knows — Spearman
   against the hidden true V. References: the simulator's hand-featured MLP (``learned``) and the
   oracle.
2. **Scoring cost** on trees of depth ≥ 4 (horizons 4..8): tokens entering the backbone (counted
   by a forward hook on the embedding) and time for tree-packed scoring vs. one forward per
   prefix vs. one forward per root-to-leaf path (read out at every turn boundary). The two
   baselines run both as one forward each (plain causal) and batched through the same packer
   without sharing, so that the batching effect and the sharing effect are separate.
3. **Share of a training step**: predictor work of one step (score the pool's prompts, score
   the anchors tree-packed, ``update`` with diagnostics) against one policy update on the same
   trajectories with a policy ≈ 13× the predictor's size (0.6B/8B ≈ 7.5%): forward + backward of
   a Qwen3 causal LM over every trajectory (one padded sequence per root-to-leaf path, a
   policy-gradient token loss) + AdamW. Rollout generation is *not* in the denominator (the
   paper's step includes it), so our share is an upper bound on the paper's definition.

Real rollout trees (TRACE training steps of a warm-started tiny policy on the embedded QA tasks,
with the predictor's out-of-sample Spearman against a per-prompt memory baseline) are measured by
``python -m bench.predictor_real`` (``bench/results/predictor_real.json``).

Synthetic tokens (documented, since simulator trees have empty token lists): vocabulary 0 = BOS,
1 = TURN, then 32 buckets of the prompt feature (logit difficulty + noise, clipped to ±8), 32
buckets of each turn's observation (V_t + noise, clipped to [−0.5, 1.5]), then filler ids. A
prompt is ``[BOS, feature bucket, filler × P]``; a turn ``[TURN, filler × L, observation bucket]``.
Fillers are a fixed hash of (depth, bucket, index), so the same history always gets the same ids
whether the simulator hands it over as features (allocation time) or as a tree (update time).

Timing: torch and BLAS pinned to one thread; times are this process's CPU seconds (best of
``--repeat``), which other load on a shared machine does not inflate.

    python -m bench.predictor [--quick] [--steps 60] [--out bench/results/predictor.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trace_core.allocation import BudgetSpec
from trace_core.predictor import PredictorConfig, path_tokens, tree_tokens
from trace_core.sim import HistoryBatch, SimConfig, make_predictor, run_step
from trace_core.tree import ROOT, RolloutTree
from trace_core.tree_packing.layout import history_tokens

# torch (and SuccessPredictor, which loads it) is imported in the functions that use it, so that
# ``--help`` answers without loading torch.
if TYPE_CHECKING:
    import torch

    from trace_core.predictor import SuccessPredictor


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.predictor", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example:\n  python -m bench.predictor --steps 10")
    ap.add_argument("--quick", action="store_true", help="fewer steps and smaller budgets (smoke run)")
    ap.add_argument("--steps", type=int, default=80, help="online steps per predictor")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=2, help="best-of repeats for timings")
    ap.add_argument("--out", type=Path, default=Path("bench/results/predictor.json"))
    return ap.parse_args()


# ============================================================================ synthetic tokens
@dataclass(frozen=True)
class SimTokens:
    """The synthetic token layout of simulator histories (see the module docstring)."""

    vocab_size: int = 2048
    prompt_filler: int = 4  # P: filler tokens after the prompt's feature bucket
    turn_filler: int = 2  # L: filler tokens between a turn's marker and its observation bucket
    buckets: int = 32

    BOS = 0
    TURN = 1

    @property
    def feature_base(self) -> int:
        return 2

    @property
    def obs_base(self) -> int:
        return 2 + self.buckets

    @property
    def filler_base(self) -> int:
        return 2 + 2 * self.buckets

    def _bucket(self, x: float, lo: float, hi: float) -> int:
        return int(np.clip((x - lo) / (hi - lo) * self.buckets, 0, self.buckets - 1))

    def _filler(self, depth: int, bucket: int, n: int) -> list[int]:
        span = self.vocab_size - self.filler_base
        return [self.filler_base + (7919 * depth + 104729 * bucket + 31 * j + 17) % span for j in range(n)]

    def prompt(self, feature: float) -> list[int]:
        b = self._bucket(feature, -8.0, 8.0)
        return [self.BOS, self.feature_base + b, *self._filler(0, b, self.prompt_filler)]

    def turn(self, depth: int, observation: float) -> list[int]:
        b = self._bucket(observation, -0.5, 1.5)
        return [self.TURN, *self._filler(depth, b, self.turn_filler), self.obs_base + b]

    def history(self, feature: float, observations: np.ndarray, depth: int) -> list[int]:
        out = self.prompt(feature)
        for d in range(1, depth + 1):
            out += self.turn(d, float(observations[d - 1]))
        return out

    def tokenize_tree(self, tree: RolloutTree) -> RolloutTree:
        """Fill a simulator tree's token lists in place (prompt at the root, one turn per node)."""
        root = tree.nodes[ROOT]
        root.token_ids = self.prompt(float(root.info["feature"]))
        root.loss_mask = [0] * len(root.token_ids)
        for node in tree.nodes[1:]:
            node.token_ids = self.turn(node.depth, float(node.info["obs"]))
            node.loss_mask = [1] * (len(node.token_ids) - 1) + [0]  # the observation is not model-written
        return tree


class TokenSimPredictor:
    """The simulator's ``ValuePredictor`` protocol over a :class:`SuccessPredictor`: histories are
    turned into synthetic token ids; every update's stats are kept."""

    def __init__(self, predictor: SuccessPredictor, tokens: SimTokens) -> None:
        self.predictor, self.tokens = predictor, tokens
        self.history: list[dict[str, float]] = []

    def score(self, histories: HistoryBatch) -> np.ndarray:
        seqs = [
            self.tokens.history(
                float(histories.prompt_feature[i]), histories.observations[i], int(histories.depth[i])
            )
            for i in range(len(histories))
        ]
        return self.predictor.score_histories(seqs)

    def update(self, trees: Sequence[RolloutTree]) -> None:
        for tree in trees:
            self.tokens.tokenize_tree(tree)
        self.history.append(self.predictor.update(trees))


# ============================================================================ helpers
def cpu_timed(fn, repeat: int = 1):
    """Best-of-``repeat`` CPU seconds of this process (one thread) and the last result."""
    best, out = np.inf, None
    for _ in range(repeat):
        c0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - c0)
    return out, float(best)


class TokenCounter:
    """Counts token ids entering a backbone (forward hook on its embedding)."""

    def __init__(self, backbone: torch.nn.Module) -> None:
        self.count = 0
        self._hook = backbone.embed_tokens.register_forward_hook(self._on)

    def _on(self, module, inputs, output) -> None:
        self.count += int(inputs[0].numel())

    def take(self) -> int:
        n, self.count = self.count, 0
        return n


def param_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(total, non-embedding) parameter counts; the LM head counts as embedding."""
    total = sum(p.numel() for p in model.parameters())
    emb = sum(
        p.numel() for n, p in model.named_parameters() if "embed_tokens" in n or n.startswith("lm_head")
    )
    return total, total - emb


def rolling(x: Sequence[float], w: int) -> list[float]:
    a = np.asarray(x, dtype=np.float64)
    return [
        float(np.nanmean(a[max(0, i - w + 1) : i + 1]))
        if np.any(~np.isnan(a[max(0, i - w + 1) : i + 1]))
        else float("nan")
        for i in range(a.size)
    ]


# ============================================================================ 1. online Spearman
def bench_online(
    steps: int, spec: BudgetSpec, seed: int, tiny: PredictorConfig, shares: Sequence[float]
) -> dict:
    from trace_core.predictor import SuccessPredictor

    tokens = SimTokens(vocab_size=tiny.vocab_size)
    runs: dict[str, dict] = {}
    for share in shares:
        adapter = TokenSimPredictor(
            SuccessPredictor(PredictorConfig(**{**asdict(tiny), "prefix_share": share})), tokens
        )
        rng = np.random.default_rng(seed)
        per_step, c0 = [], time.process_time()
        for _ in range(steps):
            res = run_step("trace", spec, adapter, rng)
            per_step.append({**res.metrics, **adapter.history[-1]})
        runs[f"qwen3-tiny(prefix_share={share})"] = {"steps": per_step, "cpu_s": time.process_time() - c0}
    for kind in ("learned", "oracle"):
        pred, rng = make_predictor(kind, seed=seed), np.random.default_rng(seed)
        per_step = [run_step("trace", spec, pred, rng).metrics for _ in range(steps)]
        runs[f"sim-{kind}"] = {"steps": per_step}
    return runs


def summarise_online(runs: dict, last: int) -> list[dict]:
    rows = []
    for name, run in runs.items():
        st = run["steps"][-last:]

        def m(key: str, st=st) -> float:
            vals = [s.get(key, np.nan) for s in st]
            return float(np.nanmean(vals)) if np.any(~np.isnan(vals)) else float("nan")

        rows.append(
            {
                "predictor": name,
                "spearman_root_vs_Vhat": m("spearman_root_vs_target"),
                "spearman_prefix_vs_Vhat": m("spearman_prefix_vs_target"),
                "oos_spearman_root": m("oos_spearman_root"),
                "oos_spearman_prefix": m("oos_spearman_prefix"),
                "spearman_root_vs_true": m("spearman_root_vs_true"),
                "spearman_anchor_vs_true": m("spearman_anchor_vs_true"),
                "ece_root": m("ece_root"),
                "loss": m("loss"),
                "effective_ratio": m("effective_ratio"),
                "skipped_share": m("alloc/skipped_share"),
            }
        )
    return rows


# ============================================================================ 2. scoring cost
def make_timing_trees(spec: BudgetSpec, seed: int, tokens: SimTokens) -> list[RolloutTree]:
    """One TRACE step of the simulator with horizons 4..8 (a declared change of SimConfig's
    horizon_min from 3, so that every tree is at least 4 turns deep), tokenised."""
    rng = np.random.default_rng(seed)
    res = run_step(
        "trace", spec, make_predictor("oracle"), rng, SimConfig(horizon_min=4), compute_metrics=False
    )
    return [tokens.tokenize_tree(t) for t in res.trees]


def plain_scores(predictor: SuccessPredictor, sequences: Sequence[list[int]], readouts: Sequence[list[int]]):
    """One plain causal forward per sequence (no custom mask), read at the given positions."""
    import torch

    out = []
    with torch.no_grad():
        for seq, read in zip(sequences, readouts, strict=True):
            logits = predictor.model(torch.tensor([seq]))
            out.append(torch.sigmoid(logits[0, read]).numpy())
    return out


def scoring_variants(predictor: SuccessPredictor, trees: list[RolloutTree], dense: SuccessPredictor) -> dict:
    """Per variant, the call that scores every node of ``trees`` that way (``dense``: the same
    weights behind a dense mask)."""
    from trace_core.predictor.scoring import score_token_trees

    cfg = predictor.config

    def packed(tts, p=predictor):
        return score_token_trees(
            p.model,
            tts,
            None,
            p.device,
            p.config.attn_implementation,
            cfg.compute_dtype,
            cfg.max_tokens_per_forward,
            predictor.max_length,
        )

    prefixes = [history_tokens(t.history_tokens(n.id)) for t in trees for n in t.nodes]
    paths = [path_tokens(t, leaf) for t in trees for leaf in t.leaves()]
    path_seqs = [np.concatenate(p.tokens).tolist() for p in paths]
    path_reads = [(np.cumsum([x.size for x in p.tokens]) - 1).tolist() for p in paths]
    tree_tts = [tree_tokens(t) for t in trees]
    return {
        "tree_packed": lambda: packed(tree_tts),
        "tree_packed_dense_mask": lambda: packed(tree_tts, dense),
        "per_prefix_batched": lambda: packed(prefixes),
        "per_path_batched": lambda: packed(paths),
        "per_prefix_one_forward_each": lambda: plain_scores(
            predictor, [p.tokens[0].tolist() for p in prefixes], [[-1]] * len(prefixes)
        ),
        "per_path_one_forward_each": lambda: plain_scores(predictor, path_seqs, path_reads),
    }


def bench_scoring(predictor: SuccessPredictor, trees: list[RolloutTree], repeat: int) -> dict:
    from trace_core.predictor import SuccessPredictor

    counter = TokenCounter(predictor.model.backbone)
    dense = SuccessPredictor(PredictorConfig(**{**asdict(predictor.config), "attn_implementation": "sdpa"}))
    dense.model.load_state_dict(predictor.model.state_dict())
    dense_counter = TokenCounter(dense.model.backbone)
    results, outs = {}, {}
    for name, fn in scoring_variants(predictor, trees, dense).items():
        counter.take(), dense_counter.take()
        outs[name], cpu = cpu_timed(fn, repeat)
        results[name] = {"tokens": (counter.take() + dense_counter.take()) // repeat, "cpu_s": cpu}
    # the packed scores equal per-prefix scores (float32 tolerance)
    packed_flat = np.concatenate(outs["tree_packed"])
    prefix_flat = np.concatenate([o.ravel() for o in outs["per_prefix_one_forward_each"]])
    dense_flat = np.concatenate(outs["tree_packed_dense_mask"])
    base = results["tree_packed"]
    for r in results.values():
        r["tokens_vs_packed"] = r["tokens"] / base["tokens"]
        r["time_vs_packed"] = r["cpu_s"] / base["cpu_s"]
    depth = [max(n.depth for n in t.nodes) for t in trees]
    return {
        "trees": len(trees),
        "nodes": sum(len(t.nodes) for t in trees),
        "leaves": sum(len(t.leaves()) for t in trees),
        "depth_min": int(min(depth)),
        "depth_max": int(max(depth)),
        "distinct_tokens": sum(len(n.token_ids) for t in trees for n in t.nodes),
        "max_abs_diff_packed_vs_per_prefix": float(np.max(np.abs(packed_flat - prefix_flat))),
        "max_abs_diff_dense_vs_per_prefix": float(np.max(np.abs(dense_flat - prefix_flat))),
        "variants": results,
    }


# ============================================================================ 3. share of a step
def policy_step(policy, optimizer, trees: list[RolloutTree], micro_batch: int) -> None:
    """One policy-gradient update on every trajectory of the step: each root-to-leaf path is one
    right-padded sequence; loss = −Σ advantage · log π(token) over model-written tokens."""
    import torch

    seqs, masks, adv = [], [], []
    for tree in trees:
        rewards = np.array([tree.nodes[leaf].reward for leaf in tree.leaves()])
        for leaf, r in zip(tree.leaves(), rewards, strict=True):
            seqs.append(tree.history_tokens(leaf))
            masks.append(tree.history_loss_mask(leaf))
            adv.append(float(r - rewards.mean()))
    optimizer.zero_grad(set_to_none=True)
    n_tokens = sum(sum(m) for m in masks)
    for s in range(0, len(seqs), micro_batch):
        chunk = range(s, min(s + micro_batch, len(seqs)))
        L = max(len(seqs[i]) for i in chunk)
        ids = torch.zeros(len(chunk), L, dtype=torch.long)
        att = torch.zeros(len(chunk), L, dtype=torch.long)
        lm = torch.zeros(len(chunk), L)
        a = torch.tensor([adv[i] for i in chunk])
        for row, i in enumerate(chunk):
            ids[row, : len(seqs[i])] = torch.tensor(seqs[i])
            att[row, : len(seqs[i])] = 1
            lm[row, : len(seqs[i])] = torch.tensor(masks[i], dtype=torch.float32)
        logits = policy(input_ids=ids, attention_mask=att).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(a[:, None] * logp * lm[:, 1:]).sum() / max(n_tokens, 1)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()


def step_trees(spec: BudgetSpec, seed: int, tokens: SimTokens) -> tuple[list[RolloutTree], list[list[int]]]:
    """One TRACE step's tokenised trees, and the prompts of its whole candidate pool."""
    trees = make_timing_trees(spec, seed, tokens)
    # stage 1 scores the whole candidate pool: the trees' prompts plus the prompts TRACE skipped
    extra = np.random.default_rng(seed + 1).normal(0, 3, max(0, spec.pool_size - len(trees)))
    return trees, [t.root.token_ids for t in trees] + [tokens.prompt(float(f)) for f in extra]


def predictor_timings(predictor: SuccessPredictor, trees: list[RolloutTree], pool_prompts: list[list[int]],
                      repeat: int) -> tuple[dict[str, float], dict, int]:
    """CPU seconds of the predictor's work in one step (scoring, and its update three ways), the
    update's statistics and the tokens it runs through the backbone."""
    from trace_core.predictor import SuccessPredictor

    counter = TokenCounter(predictor.model.backbone)
    pool_v, t_pool = cpu_timed(lambda: predictor.score_histories(pool_prompts), repeat)
    anchor_p, t_anchor = cpu_timed(lambda: predictor.score_trees(trees, [t.anchors() for t in trees]), repeat)
    allocation_time = [
        np.where(np.arange(len(t.nodes)) == ROOT, pool_v[i], p)
        for i, (t, p) in enumerate(zip(trees, anchor_p, strict=True))
    ]
    state = predictor.state_dict()
    counter.take()
    stats, t_update = cpu_timed(lambda: predictor.update(trees, predictions=allocation_time), repeat)
    update_tokens = counter.take() // repeat
    predictor.load_state_dict(state)
    _, t_update_fresh = cpu_timed(lambda: predictor.update(trees), repeat)
    lean = SuccessPredictor(PredictorConfig(**{**asdict(predictor.config), "diagnostics": False}))
    _, t_update_nodiag = cpu_timed(lambda: lean.update(trees), repeat)
    times = {
        "score_pool": t_pool,
        "score_anchors_packed": t_anchor,
        "update_reusing_allocation_predictions": t_update,
        "update_rescoring_for_diagnostics": t_update_fresh,
        "update_without_diagnostics": t_update_nodiag,
    }
    return times, stats, update_tokens


def bench_step_share(
    spec: BudgetSpec,
    seed: int,
    tokens: SimTokens,
    pred_cfg: PredictorConfig,
    policy_shape: dict,
    repeat: int,
    micro_batch: int,
) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from trace_core.predictor import SuccessPredictor

    qc = Qwen3Config(
        vocab_size=tokens.vocab_size, tie_word_embeddings=False, max_position_embeddings=4096, **policy_shape
    )
    qc._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    policy = Qwen3ForCausalLM(qc).train()
    popt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    predictor = SuccessPredictor(pred_cfg)
    p_total, p_nonemb = param_counts(predictor.model)
    q_total, q_nonemb = param_counts(policy)
    trees, pool_prompts = step_trees(spec, seed, tokens)
    cpu_s, stats, update_tokens = predictor_timings(predictor, trees, pool_prompts, repeat)
    _, cpu_s["policy_step"] = cpu_timed(lambda: policy_step(policy, popt, trees, micro_batch), max(1, repeat - 1))

    def share_with(update: str) -> float:  # the predictor's share of the step with that kind of update
        return (cpu_s["score_pool"] + cpu_s["score_anchors_packed"] + cpu_s[update]) / cpu_s["policy_step"]

    return {
        "predictor_params_total": p_total,
        "predictor_params_non_embedding": p_nonemb,
        "policy_params_total": q_total,
        "policy_params_non_embedding": q_nonemb,
        "size_ratio_total": p_total / q_total,
        "size_ratio_non_embedding": p_nonemb / q_nonemb,
        "trees": len(trees),
        "trajectories": sum(len(t.leaves()) for t in trees),
        "policy_tokens": sum(len(t.history_tokens(leaf)) for t in trees for leaf in t.leaves()),
        "distinct_tree_tokens": sum(len(n.token_ids) for t in trees for n in t.nodes),
        "pool_prompts": len(pool_prompts),
        "update_tokens": update_tokens,
        "cpu_s": cpu_s,
        "predictor_share_of_step": share_with("update_reusing_allocation_predictions"),
        "predictor_share_of_step_rescoring_diagnostics": share_with("update_rescoring_for_diagnostics"),
        "predictor_share_of_step_no_diagnostics": share_with("update_without_diagnostics"),
        "update_stats": stats,
        "policy_shape": policy_shape,
    }


# ============================================================================ 4. real token trees
@dataclass(frozen=True)
class CountingTask:
    """Trees of real tokens sampled from a tiny random Qwen3 policy. A turn is ``turn_tokens``
    sampled tokens (model-written) plus one observation token ``obs_base + hits`` from the
    "environment", where a hit is a sampled id divisible by 4; the reward is 1 iff the hits of
    all turns reach the prompt's threshold ``threshold + prompt[0] − 3``: the first prompt token
    is a difficulty level in 0..6 (stated by the prompt, as a task statement would), the rest are
    random ids."""

    vocab_size: int = 256
    prompt_len: int = 8
    turns: int = 5
    turn_tokens: int = 8
    threshold: int = 10
    policy_init_std: float = 0.3

    @property
    def obs_base(self) -> int:
        return self.vocab_size - self.turn_tokens - 1


def sample_turn(policy, histories: list[list[int]], n: int, gen: torch.Generator) -> list[list[int]]:
    """``n`` sampled tokens (temperature 1) for each history; histories of one length form one batch."""
    import torch

    out: list[list[int]] = [[] for _ in histories]
    by_len: dict[int, list[int]] = {}
    for i, h in enumerate(histories):
        by_len.setdefault(len(h), []).append(i)
    with torch.no_grad():
        for rows in by_len.values():
            ids = torch.tensor([histories[i] for i in rows])
            res = policy(input_ids=ids, use_cache=True)
            past, logits = res.past_key_values, res.logits[:, -1]
            toks = []
            for _ in range(n):
                tok = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=gen)
                toks.append(tok)
                res = policy(input_ids=tok, past_key_values=past, use_cache=True)
                past, logits = res.past_key_values, res.logits[:, -1]
            sampled = torch.cat(toks, 1).tolist()
            for r, i in enumerate(rows):
                out[i] = sampled[r]
    return out


def counting_step(
    policy,
    task: CountingTask,
    n_prompts: int,
    m: int,
    n_cont: int,
    rng: np.random.Generator,
    gen: torch.Generator,
) -> list[RolloutTree]:
    """One step of real token trees: ``m`` bare rollouts per prompt, then ``n_cont``
    continuations per tree from uniformly drawn anchors (allocation is not predictor-driven here)."""
    level = rng.integers(0, 7, n_prompts)
    body = rng.integers(7, task.obs_base, (n_prompts, task.prompt_len - 1))
    trees = [
        RolloutTree(f"c{i}", prompt_token_ids=[int(level[i]), *body[i].tolist()]) for i in range(n_prompts)
    ]

    def run(starts: list[tuple[RolloutTree, int, int]]) -> None:
        """Roll out trajectories (tree, trajectory, branch node) to depth ``turns``, batched by length."""
        hist = [t.history_tokens(b) for t, _, b in starts]
        hits = [
            sum(x - task.obs_base for n in t.path(b)[1:] for x in t.nodes[n].token_ids[-1:])
            for t, _, b in starts
        ]
        depth = [t.nodes[b].depth for t, _, b in starts]
        while True:
            live = [i for i, d in enumerate(depth) if d < task.turns]
            if not live:
                break
            new = sample_turn(policy, [hist[i] for i in live], task.turn_tokens, gen)
            for i, toks in zip(live, new, strict=True):
                h = sum(1 for x in toks if x % 4 == 0)
                turn = toks + [task.obs_base + h]
                tree, traj, _ = starts[i]
                tree.add_turn(traj, turn, [1] * len(toks) + [0])
                hist[i] += turn
                hits[i] += h
                depth[i] += 1
        for (tree, traj, _), h in zip(starts, hits, strict=True):
            tree.finish(traj, float(h >= task.threshold + tree.root.token_ids[0] - 3))

    run([(t, t.start_trajectory("bare"), ROOT) for t in trees for _ in range(m)])
    conts = []
    for t in trees:
        for a in rng.choice(t.anchors(), size=n_cont).tolist():
            conts.append((t, t.start_trajectory("continuation", branch_node=a), a))
    run(conts)
    return trees


def bench_real_tokens(steps: int, seed: int, task: CountingTask, pred_cfg: PredictorConfig) -> dict:
    import torch
    from transformers import Qwen3Config

    from trace_core.models import init_tiny_qwen3
    from trace_core.predictor import SuccessPredictor

    qc = Qwen3Config(
        vocab_size=task.vocab_size,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=512,
        initializer_range=task.policy_init_std,
        tie_word_embeddings=False,
    )
    policy = init_tiny_qwen3(qc, seed)
    predictor = SuccessPredictor(pred_cfg)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    per_step = []
    for _ in range(steps):
        trees = counting_step(policy, task, n_prompts=16, m=4, n_cont=4, rng=rng, gen=gen)
        stats = predictor.update(trees)
        stats["mean_reward"] = float(np.mean([r for t in trees for r in t.outcomes()]))
        stats["root_target_std"] = float(np.std([t.tree_values()[ROOT] for t in trees]))
        per_step.append(stats)
    return {"task": asdict(task), "steps": per_step}


# ============================================================================ report
PER_STEP_KEYS = (
    "oos_spearman_root",
    "oos_spearman_prefix",
    "oos_mse_root",
    "oos_mse_prefix",
    "ece_root",
    "ece_prefix",
    "loss",
    "n_roots",
    "n_prefixes",
    "skipped",
    "spearman_root_vs_target",
    "spearman_prefix_vs_target",
    "spearman_root_vs_true",
    "spearman_anchor_vs_true",
    "effective_ratio",
    "skipped_share",
    "mean_reward",
    "root_target_std",
)


def table(rows: list[dict], cols: list[str]) -> str:
    from bench.bench_tables import format_table, significant

    return format_table(rows, cols, fmt=significant)


def plot(out_png: Path, online: dict, scoring: dict, share: dict, real: dict, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 4, figsize=(22, 4.6))
    for name, run in online.items():
        st = run["steps"]
        if "oos_spearman_root" in st[0]:
            ax[0].plot(rolling([s["oos_spearman_root"] for s in st], window), label=f"{name} root")
            ax[0].plot(rolling([s["oos_spearman_prefix"] for s in st], window), "--", label=f"{name} prefix")
        else:
            ax[0].plot(rolling([s["spearman_root_vs_target"] for s in st], window), ":", label=f"{name} root")
    ax[0].set(title=f"out-of-sample Spearman vs V̂ (rolling {window})", xlabel="step", ylim=(-0.2, 1.0))
    ax[0].legend(fontsize=6)
    names = list(scoring["variants"])
    x = np.arange(len(names))
    ax[1].bar(x - 0.2, [scoring["variants"][n]["tokens_vs_packed"] for n in names], 0.4, label="tokens ×")
    ax[1].bar(x + 0.2, [scoring["variants"][n]["time_vs_packed"] for n in names], 0.4, label="CPU time ×")
    ax[1].set_xticks(x, [n.replace("_", "\n") for n in names], fontsize=6)
    ax[1].set(
        title=f"scoring cost relative to tree-packed (depth {scoring['depth_min']}–{scoring['depth_max']})",
        yscale="log",
    )
    ax[1].legend(fontsize=7)
    parts = share["cpu_s"]
    keys = ["score_pool", "score_anchors_packed", "update_reusing_allocation_predictions"]
    bottom = 0.0
    for k in keys:
        v = 100 * parts[k] / parts["policy_step"]
        ax[2].bar([0], [v], bottom=bottom, label=k)
        bottom += v
    ax[2].axhline(2.0, color="k", ls="--", lw=1, label="target 2%")
    ax[2].set(
        title=f"predictor share of a policy update (size ratio {100 * share['size_ratio_total']:.1f}%)",
        ylabel="% of policy step CPU time",
        xticks=[],
    )
    ax[2].legend(fontsize=7)
    rs = real["steps"]
    w = max(1, window // 2)
    ax[3].plot(rolling([s["oos_spearman_root"] for s in rs], w), label="root")
    ax[3].plot(rolling([s["oos_spearman_prefix"] for s in rs], w), "--", label="prefix")
    ax[3].set(
        title=f"real token trees: OOS Spearman (rolling {w})",
        xlabel="step",
        ylim=(-0.2, 1.0),
    )
    ax[3].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


# ============================================================================ the run
ONLINE_SPEC = BudgetSpec(roots_M=64, expansion_N=1)
SCORING_TOKENS = SimTokens(prompt_filler=126, turn_filler=46)  # 128-token prompts, 48-token turns
SHARE_TOKENS = SimTokens(prompt_filler=62, turn_filler=30)  # 64-token prompts, 32-token turns
POLICY_SHAPE = dict(  # part 3's policy: about 13x its predictor's size, the paper's 0.6B/8B ratio
    hidden_size=384,
    num_hidden_layers=6,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=1152,
)
REAL_SUMMARY_KEYS = (
    "oos_spearman_root",
    "oos_spearman_prefix",
    "oos_mse_root",
    "oos_mse_prefix",
    "ece_prefix",
    "mean_reward",
    "root_target_std",
)
WINDOW = 10  # steps of the figure's rolling means


def tiny_predictor_config(seed: int) -> PredictorConfig:
    """The tiny Qwen3 predictor every part starts from."""
    return PredictorConfig(
        vocab_size=2048,
        tiny_hidden_size=64,
        tiny_num_layers=2,
        tiny_num_heads=2,
        tiny_num_kv_heads=1,
        tiny_head_dim=32,
        tiny_intermediate_size=192,
        init_std=0.02,
        learning_rate=1e-3,
        batch_size=32,
        seed=seed,
    )


def online_part(steps: int, seed: int, tiny: PredictorConfig, quick: bool) -> tuple[dict, list[dict]]:
    """Part 1: every predictor's run, and their summary over the last steps (printed)."""
    shares = (0.06,) if quick else (0.06, 0.3)
    online = bench_online(steps, ONLINE_SPEC, seed, tiny, shares)
    rows = summarise_online(online, last=min(20, steps))
    print(
        f"\n== 1. online Spearman (TRACE in the simulator, "
        f"M={ONLINE_SPEC.roots_M}, N={ONLINE_SPEC.expansion_N}, "
        f"{steps} steps; mean of the last {min(20, steps)})"
    )
    print(table(rows, list(rows[0])))
    return online, rows


def scoring_part(seed: int, tiny: PredictorConfig, quick: bool, repeat: int) -> dict:
    """Part 2: scoring cost of each variant (printed)."""
    from trace_core.predictor import SuccessPredictor

    spec = BudgetSpec(roots_M=16, expansion_N=1) if quick else BudgetSpec(roots_M=32, expansion_N=1)
    trees = make_timing_trees(spec, seed, SCORING_TOKENS)
    scorer = SuccessPredictor(PredictorConfig(**{**asdict(tiny), "max_tokens_per_forward": 4096}))
    scoring = bench_scoring(scorer, trees, repeat)
    print(
        f"\n== 2. scoring cost: {scoring['trees']} trees, {scoring['nodes']} nodes, "
        f"{scoring['leaves']} leaves, "
        f"depth {scoring['depth_min']}–{scoring['depth_max']}, {scoring['distinct_tokens']} distinct tokens; "
        f"max |packed − per-prefix| = {scoring['max_abs_diff_packed_vs_per_prefix']:.2e}"
    )
    rows = [{"variant": k, **v} for k, v in scoring["variants"].items()]
    print(table(rows, ["variant", "tokens", "tokens_vs_packed", "cpu_s", "time_vs_packed"]))
    return scoring


def share_part(seed: int, tiny: PredictorConfig, quick: bool, repeat: int) -> dict:
    """Part 3: the predictor's share of a training step (printed)."""
    spec = BudgetSpec(roots_M=16, expansion_N=1) if quick else BudgetSpec(roots_M=32, expansion_N=1)
    pred_cfg = PredictorConfig(
        **{
            **asdict(tiny),
            "tiny_hidden_size": 128,
            "tiny_num_layers": 4,
            "tiny_num_heads": 4,
            "tiny_num_kv_heads": 2,
            "tiny_intermediate_size": 288,
            "max_tokens_per_forward": 4096,
        }
    )
    share = bench_step_share(spec, seed, SHARE_TOKENS, pred_cfg, POLICY_SHAPE, repeat, micro_batch=16)
    print_share(share)
    return share


def print_share(share: dict) -> None:
    print(
        f"\n== 3. share of a training step: predictor {share['predictor_params_total'] / 1e6:.2f}M params vs "
        f"policy {share['policy_params_total'] / 1e6:.2f}M "
        f"(ratio {100 * share['size_ratio_total']:.1f}% total, "
        f"{100 * share['size_ratio_non_embedding']:.1f}% non-embedding); "
        f"{share['trajectories']} trajectories, "
        f"{share['policy_tokens']} policy tokens, {share['distinct_tree_tokens']} distinct tree tokens"
    )
    rows = [
        {"part": k, "cpu_s": v, "share_of_policy_step_%": 100 * v / share["cpu_s"]["policy_step"]}
        for k, v in share["cpu_s"].items()
    ]
    print(table(rows, ["part", "cpu_s", "share_of_policy_step_%"]))
    print(
        f"predictor share of a step: {100 * share['predictor_share_of_step']:.2f}% (diagnostics on the "
        f"allocation-time predictions; {100 * share['predictor_share_of_step_rescoring_diagnostics']:.2f}% "
        f"re-scoring them, {100 * share['predictor_share_of_step_no_diagnostics']:.2f}% without); "
        "target <= 2%"
    )


def real_tokens_part(steps: int, seed: int, tiny: PredictorConfig) -> tuple[dict, dict]:
    """Part 4: the predictor on real token trees, and its means over the last steps (printed)."""
    task = CountingTask()
    real_cfg = PredictorConfig(**{**asdict(tiny), "vocab_size": task.vocab_size, "prefix_share": 0.3})
    real = bench_real_tokens(steps, seed, task, real_cfg)
    last = real["steps"][-min(10, len(real["steps"])) :]
    summary = {k: float(np.nanmean([s[k] for s in last])) for k in REAL_SUMMARY_KEYS}
    print(
        f"\n== 4. real token trees (tiny random Qwen3 policy, counting task, {len(real['steps'])} steps, "
        f"prefix_share 0.3; mean of the last {len(last)})"
    )
    print(table([summary], list(summary)))
    return real, summary


def per_step(steps: list[dict]) -> list[dict]:
    """The figures of each step the results file keeps."""
    return [{m: s[m] for m in PER_STEP_KEYS if m in s} for s in steps]


def main() -> None:
    args = parse_args()
    import torch  # after parsing, so that --help answers at once

    torch.set_num_threads(1)
    steps = 10 if args.quick else args.steps
    tiny = tiny_predictor_config(args.seed)
    t0 = time.perf_counter()
    online, online_rows = online_part(steps, args.seed, tiny, args.quick)
    scoring = scoring_part(args.seed, tiny, args.quick, args.repeat)
    share = share_part(args.seed, tiny, args.quick, args.repeat)
    real, real_summary = real_tokens_part(steps // 2, args.seed, tiny)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "command": "python -m bench.predictor"
        + (" --quick" if args.quick else f" --steps {steps}")
        + f" --repeat {args.repeat} --seed {args.seed}",
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "sim_tokens_online": asdict(SimTokens()),
        "sim_tokens_scoring": asdict(SCORING_TOKENS),
        "sim_tokens_share": asdict(SHARE_TOKENS),
        "online": {
            "budget": asdict(ONLINE_SPEC),
            "steps": steps,
            "predictor_config": asdict(tiny),
            "summary_last_20": online_rows,
            "per_step": {k: per_step(v["steps"]) for k, v in online.items()},
        },
        "scoring": scoring,
        "share": share,
        "real_tokens": {"task": real["task"], "per_step": per_step(real["steps"]), "summary_last_10": real_summary},
        "wall_s": time.perf_counter() - t0,
    }
    args.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    plot(args.out.with_suffix(".png"), online, scoring, share, real, WINDOW)
    print(f"\nwrote {args.out} and {args.out.with_suffix('.png')} ({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
