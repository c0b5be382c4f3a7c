"""The success predictor ``Ṽψ`` (method §5): score trees cheaply, learn online from them.

    predictor = SuccessPredictor(PredictorConfig(...))
    v = predictor.score_histories(prompt_token_ids)          # stage 1: pool roots
    p = predictor.score_trees(trees, nodes=anchors)          # stage 2: anchors, tree-packed
    stats = predictor.update(trees, predictions=allocation_time_scores)   # after the step: V̂ targets

``update`` takes the step's roots and informative prefixes as scored *before* it changes any
weight (handed in from allocation, or scored on entry) for the out-of-sample diagnostics —
Spearman, MSE, calibration — then trains on method §5's supervised set with AdamW, gradient
clipping and a guard that skips any optimizer step whose loss, gradient norm or resulting
weights are not finite (weights and optimizer state untouched).

Scoring packs whole trees (:mod:`trace_core.tree_packing.layout`): every distinct token enters the backbone once and
each node is read at its last token; with the default sparse tree attention
(:mod:`trace_core.tree_packing.attention`) a node's tokens attend only to its own history.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trace_core.predictor.config import PredictorConfig
from trace_core.predictor.diagnostics import StepDiagnostics, random_anchor_nodes, step_diagnostics
from trace_core.predictor.examples import Example, sample_examples, supervised_set
from trace_core.predictor.model import PrefixValueModel, build_backbone
from trace_core.predictor.scoring import pack_logits, score_token_trees
from trace_core.seeding import derive_seed
from trace_core.tree import ROOT, RolloutTree
from trace_core.tree_packing.layout import (
    TokenTree,
    ancestor_closure,
    history_tokens,
    pack_token_trees,
    tree_tokens,
)

STATE_FORMAT = "trace-rl/success-predictor/v1"


class SuccessPredictor:
    """A Qwen3 backbone + scalar head + sigmoid over the policy's token ids of a history."""

    def __init__(self, config: PredictorConfig | None = None) -> None:
        self.config = config or PredictorConfig()
        self.device = torch.device(self.config.device)
        self.model = PrefixValueModel(build_backbone(self.config), self.config.init_std, self.config.seed)
        self.model.to(self.device).train()
        self.max_length = self.config.max_length or self.model.max_positions
        if self.max_length > self.model.max_positions:
            raise ValueError(f"max_length ({self.max_length}) exceeds the backbone's max positions "
                             f"({self.model.max_positions})")
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=self.config.resolved_learning_rate(), betas=self.config.adam_betas,
            eps=self.config.adam_eps, weight_decay=self.config.weight_decay,
        )
        self.rng = np.random.default_rng(self.config.seed)
        self.optimizer_steps = 0  # optimizer steps taken (skipped ones excluded)
        self.skipped_steps = 0  # optimizer steps refused by the non-finite guard, in total
        self.updates = 0  # update() calls
        self.last_diagnostics: StepDiagnostics | None = None  # out-of-sample report of the last update
        self.replayed: list[list[RolloutTree]] = []  # the previous replay_steps − 1 steps' trees, oldest first

    # ------------------------------------------------------------------ scoring
    def _score(self, token_trees: Sequence[TokenTree], selections: Sequence[np.ndarray | None] | None):
        return score_token_trees(
            self.model, token_trees, selections, self.device, self.config.attn_implementation,
            self.config.compute_dtype, self.config.max_tokens_per_forward, self.max_length,
        )

    def score_trees(
        self, trees: Sequence[RolloutTree], nodes: Sequence[Iterable[int] | None] | None = None
    ) -> list[np.ndarray]:
        """Values of tree nodes, one float64 array per tree (NaN where not requested).

        ``nodes[i]``: node ids of tree ``i`` to score (None = all). Only those nodes and their
        ancestors are packed; each distinct token among them enters the backbone once."""
        trees = list(trees)
        token_trees = [tree_tokens(t) for t in trees]
        if nodes is None:
            return self._score(token_trees, None)
        if len(nodes) != len(trees):
            raise ValueError(f"nodes must have one entry per tree ({len(trees)}), got {len(nodes)}")
        wanted = [None if ns is None else np.asarray(list(ns), dtype=np.int64) for ns in nodes]
        selections = [None if w is None else ancestor_closure(tt.parents, w)
                      for tt, w in zip(token_trees, wanted, strict=True)]
        scores = self._score(token_trees, selections)
        for s, w in zip(scores, wanted, strict=True):
            if w is not None:
                keep = np.zeros(s.size, dtype=bool)
                keep[w] = True
                s[~keep] = np.nan
        return scores

    def score_histories(self, histories: Sequence[Sequence[int]]) -> np.ndarray:
        """Value of each history (token ids), scored independently (no sharing between them);
        e.g. the candidate pool's prompts in stage 1. Shape ``(len(histories),)``."""
        if len(histories) == 0:
            return np.zeros(0)
        scores = self._score([history_tokens(h) for h in histories], None)
        return np.array([s[0] for s in scores], dtype=np.float64)

    # ------------------------------------------------------------------ training
    def update(
        self, trees: Sequence[RolloutTree], predictions: Sequence[np.ndarray] | None = None
    ) -> dict[str, float]:
        """Learn from one step's complete trees (method §5).

        ``predictions`` (optional, one array per tree, NaN where not scored) are values this
        predictor gave *before* this call — e.g. the roots scored in stage 1 and the anchors in
        stage 2 — reused for the diagnostics; supervised nodes without one are scored now, still
        before any weight changes. Returns flat stats:

        ``loss`` (mean training MSE over the optimizer steps taken; NaN if none), ``n_roots``,
        ``n_prefixes`` (prefix examples drawn), ``prefix_weight`` (the loss weight of each, 1 unless
        the floor raised their count past the share), ``n_prefix_candidates``, ``optimizer_steps``,
        ``skipped`` (steps refused by the guard), ``grad_norm`` (of the last step taken), and,
        with ``config.diagnostics``, the out-of-sample ``oos_*`` / ``ece_*`` figures computed on
        predictions made before this update changed any weight, and the two prefix Spearman
        figures (:mod:`.diagnostics`): ``prefix_spearman_expanded_anchors`` and the unbiased
        ``prefix_spearman_random_anchor`` over ``prefix_random_anchors`` bare rollouts (one
        random internal node of each, scored with the others before the update)."""
        trees = list(trees)
        candidates = supervised_set(trees, self.config.min_leaves)
        stats: dict[str, float] = {}
        if self.config.diagnostics:
            # Its own generator, keyed by the update: the draw leaves the example stream alone.
            anchors = random_anchor_nodes(trees, np.random.default_rng(
                derive_seed(self.config.seed, "random_anchor", self.updates)))
            nodes: list[list[int]] = [[] for _ in trees]
            for ex in candidates.roots + candidates.prefixes:
                nodes[ex.tree].append(ex.node)
            for i, a in enumerate(anchors):
                nodes[i] = sorted(set(nodes[i]) | set(a.tolist()))
            if predictions is None:
                predictions = self.score_trees(trees, nodes)
            else:
                predictions = self._complete_predictions(trees, predictions, nodes)
            self.last_diagnostics = step_diagnostics(
                trees, predictions, self.config.min_leaves, self.config.calibration_bins, random_anchors=anchors
            )
            stats.update(self.last_diagnostics.as_dict())
        # Training reads this step's trees and the replayed ones (config.replay_steps); the
        # diagnostics above read this step's alone, scored before any weight changed.
        train_trees = [t for step in self.replayed for t in step] + trees
        self._use_learning_rate(self.config.resolved_online_learning_rate())
        train_candidates = supervised_set(train_trees, self.config.min_leaves) if self.replayed else candidates
        examples, n_prefixes = sample_examples(train_candidates, self.config.prefix_share, self.rng,
                                               self.config.min_prefix_examples)
        stats.update(self.fit_examples(train_trees, examples))
        stats.update(n_roots=float(len(candidates.roots)), n_prefixes=float(n_prefixes),
                     prefix_weight=examples[-1].weight if n_prefixes else 1.0,
                     n_prefix_candidates=float(len(candidates.prefixes)),
                     n_train_roots=float(len(train_candidates.roots)))
        if self.config.replay_steps > 1:
            self.replayed = [*self.replayed, trees][-(self.config.replay_steps - 1):]
        self.updates += 1
        return stats

    def fit(self, trees: Sequence[RolloutTree], updates: int) -> dict[str, float]:
        """``updates`` rounds of :meth:`update`'s training on the same trees, without its
        diagnostics: fitting the predictor before RL on a warm-up split's trees. Each round draws
        its own examples (the prefix share applies per round). Returns the last round's stats and
        ``first_loss``."""
        trees = list(trees)
        candidates = supervised_set(trees, self.config.min_leaves)
        stats: dict[str, float] = {}
        first = float("nan")
        self._use_learning_rate(self.config.resolved_learning_rate())
        for i in range(updates):
            examples, n_prefixes = sample_examples(candidates, self.config.prefix_share, self.rng,
                                                   self.config.min_prefix_examples)
            stats = self.fit_examples(trees, examples)
            stats.update(n_roots=float(len(candidates.roots)), n_prefixes=float(n_prefixes))
            if i == 0:
                first = stats["loss"]
        return {**stats, "first_loss": first, "updates": float(updates)}

    def _use_learning_rate(self, lr: float) -> None:
        """The fit from random weights and the online updates use their own rates (config)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _complete_predictions(
        self, trees: list[RolloutTree], predictions: Sequence[np.ndarray], nodes: list[list[int]]
    ) -> list[np.ndarray]:
        if len(predictions) != len(trees):
            raise ValueError(f"predictions needs one array per tree ({len(trees)}), got {len(predictions)}")
        out, missing = [], []
        for i, (tree, pred) in enumerate(zip(trees, predictions, strict=True)):
            pred = np.array(pred, dtype=np.float64)
            if pred.shape != (len(tree.nodes),):
                raise ValueError(f"predictions[{i}] must have one value per node ({len(tree.nodes)}), "
                                 f"got shape {pred.shape}")
            out.append(pred)
            missing.append([n for n in nodes[i] if np.isnan(pred[n])])
        if any(missing):
            fresh = self.score_trees(trees, missing)
            for pred, new, ms in zip(out, fresh, missing, strict=True):
                pred[ms] = new[ms]
        return out

    def fit_examples(self, trees: Sequence[RolloutTree], examples: Sequence[Example]) -> dict[str, float]:
        """Train on explicit ``examples`` for ``epochs_per_update`` passes of shuffled
        mini-batches of ``batch_size``. Each mini-batch packs only the paths to its nodes."""
        token_trees = [tree_tokens(t) for t in trees]
        examples = [ex for ex in examples if ex.weight > 0]  # a zero weight contributes nothing
        losses: list[float] = []
        skipped = 0
        grad_norm = float("nan")
        for _ in range(self.config.epochs_per_update):
            order = self.rng.permutation(len(examples))
            for start in range(0, len(order), self.config.batch_size):
                batch = [examples[j] for j in order[start:start + self.config.batch_size].tolist()]
                loss, norm, ok = self._optimizer_step(token_trees, batch)
                if ok:
                    losses.append(loss)
                    grad_norm = norm
                else:
                    skipped += 1
        return {
            "loss": float(np.mean(losses)) if losses else float("nan"),
            "optimizer_steps": float(len(losses)),
            "skipped": float(skipped),
            "grad_norm": grad_norm,
        }

    def _optimizer_step(
        self, token_trees: list[TokenTree], batch: list[Example]
    ) -> tuple[float, float, bool]:
        by_tree: dict[int, list[Example]] = {}
        for ex in batch:
            if not 0 <= ex.tree < len(token_trees):
                raise ValueError(f"example tree index {ex.tree} is out of range ({len(token_trees)} trees)")
            by_tree.setdefault(ex.tree, []).append(ex)
        tree_ids = sorted(by_tree)
        sub_trees = [token_trees[i] for i in tree_ids]
        selections = [ancestor_closure(token_trees[i].parents, [e.node for e in by_tree[i]])
                      for i in tree_ids]
        packs = pack_token_trees(sub_trees, selections, self.config.max_tokens_per_forward, self.max_length)

        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        batch_weight = sum(ex.weight for ex in batch)
        for pack in packs:
            logits = pack_logits(self.model, pack, self.device, self.config.attn_implementation,
                                 self.config.compute_dtype)
            index, target, weight = [], [], []
            for item, readout in zip(pack.items, pack.readout, strict=True):
                for ex in by_tree[tree_ids[item]]:
                    index.append(int(readout[ex.node]))
                    target.append(ex.target)
                    weight.append(ex.weight)
            pred = torch.sigmoid(logits[torch.as_tensor(index, device=self.device)])
            y = torch.as_tensor(target, dtype=pred.dtype, device=self.device)
            w = torch.as_tensor(weight, dtype=pred.dtype, device=self.device)
            # the weighted mean over the batch (all weights 1: the plain mean), accumulated over packs
            loss = (w * (pred - y) ** 2).sum() / batch_weight
            loss.backward()
            total += loss.detach().double()
        loss_value = float(total)
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not math.isfinite(loss_value):
            return self._refuse(loss_value, float("nan"))
        norm = float(torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip))
        if not math.isfinite(norm):
            return self._refuse(loss_value, norm)
        snapshot = None
        if self.config.rollback_nonfinite_weights:
            snapshot = ([p.detach().clone() for p in self.model.parameters()],
                        copy.deepcopy(self.optimizer.state_dict()))
        self.optimizer.step()
        if snapshot is not None and not self._weights_finite():
            with torch.no_grad():
                for p, saved in zip(self.model.parameters(), snapshot[0], strict=True):
                    p.copy_(saved)
            self.optimizer.load_state_dict(snapshot[1])
            return self._refuse(loss_value, norm)
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1
        return loss_value, norm, True

    def _weights_finite(self) -> bool:
        return bool(torch.stack([torch.isfinite(p).all() for p in self.model.parameters()]).all())

    def _refuse(self, loss: float, norm: float) -> tuple[float, float, bool]:
        self.optimizer.zero_grad(set_to_none=True)
        self.skipped_steps += 1
        return loss, norm, False

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically: weights, optimizer, counters, RNG."""
        return {
            "format": STATE_FORMAT,
            "config": asdict(self.config),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "optimizer_steps": self.optimizer_steps,
            "skipped_steps": self.skipped_steps,
            "updates": self.updates,
            "rng": self.rng.bit_generator.state,
            "replayed": [[t.to_dict() for t in step] for step in self.replayed],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a success-predictor state (format={state.get('format')!r})")
        mine = asdict(self.config)
        # A field the saved config predates counts as its default (older states stay loadable).
        theirs = {**asdict(PredictorConfig()), **dict(state["config"])}
        theirs["adam_betas"] = tuple(theirs["adam_betas"])
        arch = [k for k in mine if k not in ("device",) and mine[k] != theirs.get(k)]
        if arch:
            raise ValueError(f"state was saved with a different config; differing fields: {arch}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.optimizer_steps = int(state["optimizer_steps"])
        self.skipped_steps = int(state["skipped_steps"])
        self.updates = int(state["updates"])
        self.rng.bit_generator.state = state["rng"]
        self.replayed = [[RolloutTree.from_dict(t) for t in step] for step in state.get("replayed", [])]

    def save(self, path: str | Path) -> None:
        torch.save(self.state_dict(), Path(path))

    @classmethod
    def load(cls, path: str | Path, config: PredictorConfig | None = None) -> SuccessPredictor:
        """A predictor restored from :meth:`save` (``config`` overrides e.g. the device only)."""
        state = torch.load(Path(path), map_location="cpu", weights_only=True)
        if config is None:
            cfg = dict(state["config"])
            cfg["adam_betas"] = tuple(cfg["adam_betas"])
            config = PredictorConfig(**cfg)
        predictor = cls(config)
        predictor.load_state_dict(state)
        return predictor


def root_scores(scores: Sequence[np.ndarray]) -> np.ndarray:
    """The root value of each tree from :meth:`SuccessPredictor.score_trees` output."""
    return np.array([s[ROOT] for s in scores], dtype=np.float64)
