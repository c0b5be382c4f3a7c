"""The simulator's success predictors: the oracle, a noisy oracle, and a learned predictor that
sees only what a real one would (a prompt's visible history and a prefix's depth)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from trace_core.sim.world import (
    SimConfig,
    clipped_logit,
    sigmoid,
)
from trace_core.tree import ROOT, RolloutTree


# ============================================================================ predictors
@dataclass(frozen=True)
class HistoryBatch:
    """Histories ``H_t`` to score. ``prompt_feature``, ``observations`` and ``depth`` are what a
    real predictor could read; ``true_value`` is the hidden ``V_t``, for the oracle and the
    noisy predictor only (a learned predictor must never read it)."""

    prompt_feature: np.ndarray  # float64 (n,): the prompt's visible feature
    observations: np.ndarray  # float64 (n, horizon_max): column c = turn c + 1's observation; NaN after depth
    depth: np.ndarray  # int64 (n,): t (0 = the prompt root)
    true_value: np.ndarray  # float64 (n,): hidden V_t

    def __post_init__(self) -> None:
        n = self.prompt_feature.shape[0]
        if self.observations.ndim != 2 or self.observations.shape[0] != n:
            raise ValueError(
                f"observations must have shape ({n}, horizon_max), got {self.observations.shape}"
            )
        if self.depth.shape != (n,) or self.true_value.shape != (n,):
            raise ValueError("depth and true_value must have one entry per history")

    def __len__(self) -> int:
        return self.prompt_feature.shape[0]


class ValuePredictor(Protocol):
    """The predictor ``Ṽψ`` of method §5, as the simulator uses it: score histories before the
    step allocates, learn from the step's finished trees after it (a no-op for fixed ones)."""

    def score(self, histories: HistoryBatch) -> np.ndarray:
        """One value in [0, 1] per history."""
        ...

    def update(self, trees: Sequence[RolloutTree]) -> None:
        """Learn from a step's complete trees (tree-backed targets, method §5)."""
        ...


class OraclePredictor:
    """Returns the true ``V_t``: the upper bound of what any predictor can do."""

    def score(self, histories: HistoryBatch) -> np.ndarray:
        return histories.true_value.copy()

    def update(self, trees: Sequence[RolloutTree]) -> None:
        return None


class NoisyPredictor:
    """``sigmoid(logit(V) + N(0, logit_noise_std))``: the oracle with a controllable rank error
    (larger std, lower Spearman; the benchmark reports the Spearman it achieves). ``V`` is
    clipped to [clip, 1 − clip] before the logit so that 0 and 1 stay finite."""

    def __init__(self, logit_noise_std: float = 1.0, seed: int = 0, clip: float = 1e-4) -> None:
        if not (np.isfinite(logit_noise_std) and logit_noise_std >= 0):
            raise ValueError(f"logit_noise_std = {logit_noise_std}: it must be finite and >= 0")
        if not 0 < clip < 0.5:
            raise ValueError(f"clip = {clip}: it must lie in (0, 0.5)")
        self.logit_noise_std = float(logit_noise_std)
        self.clip = float(clip)
        self._rng = np.random.default_rng(seed)

    def score(self, histories: HistoryBatch) -> np.ndarray:
        z = clipped_logit(histories.true_value, self.clip)
        return sigmoid(z + self._rng.normal(0.0, self.logit_noise_std, size=z.shape[0]))

    def update(self, trees: Sequence[RolloutTree]) -> None:
        return None


@dataclass(frozen=True)
class LearnedPredictorConfig:
    """A tiny MLP ``Ṽψ`` trained online on tree-backed targets (method §5) — our stand-in for the
    paper's Qwen3-0.6B value head. Its hyper-parameters are the model's, not the simulator's."""

    hidden_units: int = 32  # width of the one tanh hidden layer
    learning_rate: float = 0.01  # Adam step size (a tiny model; the paper's 3e-5 is for a 0.6B LM)
    iterations_per_update: int = 40  # Adam iterations after each step (warm-started from the last)
    batch_size: int = 2048  # samples per Adam iteration, drawn from the replay without replacement
    replay_steps: int = 4  # train on the supervised nodes of the last k steps (the newest included)
    min_leaves: int = 2  # method §5's S: roots plus internal nodes with >= this many leaves below
    feature_clip: float = 8.0  # |prompt feature| is clipped here before scaling
    observation_decay: float = 0.5  # per-turn weight ratio of the exponentially weighted observation mean
    seed: int = 0  # initial weights

    def __post_init__(self) -> None:
        for name in ("hidden_units", "iterations_per_update", "batch_size", "replay_steps", "min_leaves"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} = {getattr(self, name)}: it must be >= 1")
        if not (self.learning_rate > 0 and self.feature_clip > 0 and 0 < self.observation_decay <= 1):
            raise ValueError("learning_rate and feature_clip must be > 0; observation_decay in (0, 1]")


def visible_features(histories: HistoryBatch, feature_clip: float = 8.0, decay: float = 0.5) -> np.ndarray:
    """The learned predictor's input, built only from what a real predictor sees (never ``V``):
    scaled prompt feature, last observation, exponentially weighted and plain means of the
    observations so far, depth / horizon_max, and a root indicator. Shape ``(n, 6)``."""
    n, H = histories.observations.shape
    depth = histories.depth
    f = np.clip(histories.prompt_feature, -feature_clip, feature_clip) / 4.0
    cols = np.arange(1, H + 1)[None, :]  # turn of each column
    seen = (cols <= depth[:, None]) & ~np.isnan(histories.observations)
    obs = np.where(seen, histories.observations, 0.0)
    count = seen.sum(axis=1)
    has = count > 0
    last = np.where(has, obs[np.arange(n), np.clip(depth - 1, 0, H - 1)], 0.0)
    w = np.where(seen, decay ** (depth[:, None] - cols).clip(min=0), 0.0)
    ewm = np.divide((w * obs).sum(axis=1), w.sum(axis=1), out=np.zeros(n), where=has)
    mean = np.divide(obs.sum(axis=1), count, out=np.zeros(n), where=has)
    return np.column_stack([f, last, ewm, mean, depth / H, (~has).astype(np.float64)])


class LearnedPredictor:
    """A one-hidden-layer MLP (numpy, seeded) over :func:`visible_features`, trained online with
    minibatch Adam on the squared error to method §5's targets ``V̂`` (``tree.tree_values()``) at
    the roots and the internal nodes with ≥ 2 leaves below. Our choices: every supervised node
    weighs the same (the paper's 6% prefix share of a batch is not reproduced), and a short
    replay of recent steps stabilises the online fit. It starts untrained (outputs near 0.5):
    run it for warm-up steps before reading its figures.

    Out-of-sample by construction: :func:`run_step` scores a step's histories before calling
    :meth:`update` with that step's trees."""

    def __init__(self, config: LearnedPredictorConfig | None = None, horizon_max: int = 8) -> None:
        self.config = config or LearnedPredictorConfig()
        self.horizon_max = int(horizon_max)
        rng = np.random.default_rng(self.config.seed)
        d, h = 6, self.config.hidden_units
        self.params = {
            "W1": rng.normal(0.0, 1.0 / np.sqrt(d), size=(d, h)),
            "b1": np.zeros(h),
            "w2": rng.normal(0.0, 1.0 / np.sqrt(h), size=h),
            "b2": np.zeros(1),
        }
        self._adam_m = {k: np.zeros_like(v) for k, v in self.params.items()}
        self._adam_v = {k: np.zeros_like(v) for k, v in self.params.items()}
        self._adam_t = 0
        self._replay: list[tuple[np.ndarray, np.ndarray]] = []
        self._batch_rng = np.random.default_rng([self.config.seed, 1])  # minibatch draws
        self.updates = 0  # number of update() calls so far
        self.last_loss = float("nan")  # training MSE after the last update

    def _features(self, histories: HistoryBatch) -> np.ndarray:
        return visible_features(histories, self.config.feature_clip, self.config.observation_decay)

    def _forward(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        hidden = np.tanh(x @ self.params["W1"] + self.params["b1"])
        return hidden, sigmoid(hidden @ self.params["w2"] + self.params["b2"][0])

    def score(self, histories: HistoryBatch) -> np.ndarray:
        if histories.observations.shape[1] != self.horizon_max:
            raise ValueError(
                f"histories have {histories.observations.shape[1]} observation columns but the predictor "
                f"was built for horizon_max = {self.horizon_max}"
            )
        if len(histories) == 0:
            return np.zeros(0)
        return self._forward(self._features(histories))[1]

    def update(self, trees: Sequence[RolloutTree]) -> None:
        histories, targets = supervised_histories(trees, self.horizon_max, self.config.min_leaves)
        self._replay.append((self._features(histories), targets))
        self._replay = self._replay[-self.config.replay_steps :]
        x = np.concatenate([r[0] for r in self._replay])
        y = np.concatenate([r[1] for r in self._replay])
        self.updates += 1
        if y.size == 0:
            return
        beta1, beta2, eps, lr = 0.9, 0.999, 1e-8, self.config.learning_rate
        for _ in range(self.config.iterations_per_update):
            if y.size > self.config.batch_size:
                rows = self._batch_rng.choice(y.size, size=self.config.batch_size, replace=False)
                xb, yb = x[rows], y[rows]
            else:
                xb, yb = x, y
            hidden, pred = self._forward(xb)
            # d/dz of mean (sigmoid(z) − y)² = 2 (pred − y) pred (1 − pred) / n
            dz = 2.0 * (pred - yb) * pred * (1.0 - pred) / yb.size
            dh = np.outer(dz, self.params["w2"]) * (1.0 - hidden**2)
            grads = {"W1": xb.T @ dh, "b1": dh.sum(axis=0), "w2": hidden.T @ dz, "b2": np.array([dz.sum()])}
            self._adam_t += 1
            for k, g in grads.items():
                self._adam_m[k] = beta1 * self._adam_m[k] + (1 - beta1) * g
                self._adam_v[k] = beta2 * self._adam_v[k] + (1 - beta2) * g * g
                m_hat = self._adam_m[k] / (1 - beta1**self._adam_t)
                v_hat = self._adam_v[k] / (1 - beta2**self._adam_t)
                self.params[k] = self.params[k] - lr * m_hat / (np.sqrt(v_hat) + eps)
        self.last_loss = float(np.mean((self._forward(x)[1] - y) ** 2))


def tree_histories(
    tree: RolloutTree, nodes: Sequence[int], horizon_max: int, node_value: np.ndarray | None = None
) -> HistoryBatch:
    """The histories ending at ``nodes`` of a simulator tree, from what its ``node.info`` shows (the
    observations and the prompt feature). ``node_value``: the tree's hidden values, one per node
    (``StepResult.node_value``), for the histories' ``true_value``; None (what a predictor learning
    from trees gets): NaN."""
    n = len(nodes)
    obs = np.full((n, horizon_max), np.nan)
    depth = np.zeros(n, dtype=np.int64)
    value = np.full(n, np.nan) if node_value is None else np.asarray(node_value, dtype=np.float64)[list(nodes)]
    for row, node_id in enumerate(nodes):
        node = tree.nodes[node_id]
        depth[row] = node.depth
        walk = node_id
        while walk != ROOT:
            w = tree.nodes[walk]
            obs[row, w.depth - 1] = w.info["obs"]
            walk = w.parent
    feature = np.full(n, float(tree.root.info["feature"]))
    return HistoryBatch(prompt_feature=feature, observations=obs, depth=depth, true_value=value)


def supervised_histories(
    trees: Sequence[RolloutTree], horizon_max: int, min_leaves: int = 2
) -> tuple[HistoryBatch, np.ndarray]:
    """method §5's training set ``S`` of a step: each tree's root and its internal nodes with
    ``>= min_leaves`` leaves below, with their tree-backed targets ``V̂`` (the hidden values are
    not in the trees: ``true_value`` is NaN)."""
    batches, targets = [], []
    for tree in trees:
        leaves, v_hat = tree.leaf_counts(), tree.tree_values()
        nodes = [n.id for n in tree.nodes if n.id == ROOT or (not n.terminal and leaves[n.id] >= min_leaves)]
        if leaves[ROOT] == 0:
            continue
        batches.append(tree_histories(tree, nodes, horizon_max))
        targets.append(v_hat[nodes])
    if not batches:
        empty = np.zeros(0)
        return HistoryBatch(empty, np.zeros((0, horizon_max)), np.zeros(0, dtype=np.int64), empty), empty
    return (
        HistoryBatch(
            prompt_feature=np.concatenate([b.prompt_feature for b in batches]),
            observations=np.concatenate([b.observations for b in batches]),
            depth=np.concatenate([b.depth for b in batches]),
            true_value=np.concatenate([b.true_value for b in batches]),
        ),
        np.concatenate(targets),
    )


DEFAULT_NOISE_STD = 2.0  # the benchmark's "noisy" predictor: root Spearman ≈ 0.95, anchor ≈ 0.9


def make_predictor(
    kind: str, config: SimConfig | None = None, seed: int = 0, noise_std: float = DEFAULT_NOISE_STD
) -> ValuePredictor:
    """``"oracle"``, ``"noisy"`` (logit noise of std ``noise_std``) or ``"learned"`` (seeded)."""
    config = config or SimConfig()
    if kind == "oracle":
        return OraclePredictor()
    if kind == "noisy":
        return NoisyPredictor(logit_noise_std=noise_std, seed=seed)
    if kind == "learned":
        return LearnedPredictor(LearnedPredictorConfig(seed=seed), horizon_max=config.horizon_max)
    raise ValueError(f"unknown predictor kind {kind!r}; known: oracle, noisy, learned")
