"""A synthetic agentic environment for allocation studies (method §1–§4, §7).

Each prompt has a hidden difficulty and a horizon; each turn moves a hidden success probability
``V_t`` as a bounded martingale, so ``V_t = E[r | H_t]`` holds *exactly* (method §1's definition)
and the contrast potential ``V_t(1 − V_t)`` decays towards the end of a path:

- difficulty ``p0 = V_0 ~ Beta(a, a)`` with ``a = 0.15`` (U-shaped: most prompts are nearly
  always or never solved, so uniform sampling wastes most groups);
- horizon ``T ~ uniform{3..8}``, shared by every path of the prompt (a continuation branched at
  turn ``t`` runs turns ``t+1..T``);
- ``V_{t+1} ~ Beta(κ V_t, κ (1 − V_t))`` with ``κ = 6`` (mean ``V_t``: a martingale), 0 and 1
  absorbing;
- reward ``r ~ Bernoulli(V_T)`` at the terminal turn ``T``.

A real predictor could not see ``V``. What it may see: a prompt feature
``logit(p0) + N(0, 1)`` (standard deviation 1) and, at each turn, an observation
``V_t + N(0, 0.25)`` (standard deviation 0.25, not variance). The defaults are pinned in
:class:`SimConfig` (frozen) so that results cannot be tuned after the fact; change them only to
run a declared sensitivity study.

:func:`run_step` runs one step of method §2–§4 for any method of the allocation registry,
taking every rule from its :class:`~trace_core.allocation.Method` as the trainer does: sample a
shuffled candidate pool, score the roots, allocate ``m``, roll out the bare paths, score the
anchors, allocate ``K`` per prompt (method §3, including the no-anchor rule), roll out the
continuations, build real :class:`~trace_core.tree.RolloutTree` objects (empty token lists; in
``node.info`` only what a predictor may see — each turn's observation, the root's feature and
horizon — while the hidden ``V_t`` stays beside the trees, in ``StepResult.node_value``),
compute method §7's metrics under the trainer's names (:func:`~trace_core.metrics.step_metrics`),
and only then let the predictor learn from the step's trees — so every prediction used for allocation or reported in the
metrics is out-of-sample.

Two modes for the candidate pool:

- **i.i.d.** (the default, ``pool=None``): every step draws fresh prompts from the prior, so no
  prompt recurs and a method that remembers prompts collapses to one that does not;
- **persistent** (``pool=PersistentPool(...)``): a finite dataset of ``dataset_factor ×`` the
  candidate pool, walked epoch by epoch in a fresh random order (every prompt is a candidate
  once per epoch of ``dataset_factor`` steps), whose success probabilities drift as training
  proceeds (:class:`PersistentPoolConfig`: in logit space, a small drift of every prompt towards
  success, per-step Gaussian noise, and a larger push for each prompt that formed a trained
  mixed group that step). A prompt's visible feature is its *current* logit plus an error drawn
  once per prompt — a predictor's persistent misjudgement of it, which only the prompt's own
  outcomes can correct. A :class:`~trace_core.history.PromptHistory` passed beside the pool
  records each step's bare root outcomes for the methods that read history (GRESO, the posterior
  roots).

Methods that sample in rounds (DAPO's dynamic sampling) run their rounds here: the bare groups of
a round are rolled out before the next round is chosen; the method's group filter decides
which groups count as trained (``StepResult.tree_kept``), and the budget is a cap for them.

Generated tokens (method §10): each prompt has a typical length per turn, drawn when the prompt is
created (:func:`draw_turn_tokens`), and every generated turn a fresh factor around it
(:func:`path_tokens`); a rollout costs the sum over the turns it generates, so a continuation from
a late turn costs only its remaining turns. These draws come from a generator of their own (spawned
from the step's, or the persistent pool's), so every path, allocation and figure of a method is
what it is without them. :class:`TokenLedger` carries the cost estimates across steps, and
:func:`run_step` runs ``trace-tokens`` — and GRPO or PCL at an equal token budget — under
``BudgetSpec.tokens_per_step``.

Sampling is vectorised over paths (a Python loop runs over the ≤ ``horizon_max`` turns); trees
are built in a light loop over nodes. Everything is seeded: the same generator state, method,
budget and predictor (and pool and history state) give the same :class:`StepResult`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from trace_core.advantages import AdvantageEstimator
from trace_core.allocation import AnchorSignals, BudgetSpec, Method, SampledRounds, get_method, sample_in_rounds
from trace_core.costs import (
    CostModel,
    remaining_tokens,
)
from trace_core.history import HistoryView, PromptHistory
from trace_core.metrics import (
    allocation_stats,
    is_mixed,
    per_exposure,
    predictor_spearman,
    spearman,
    step_metrics,
    tree_is_mixed,
)
from trace_core.planner import RootPlan, StepPlanner
from trace_core.token_budget import StepCosts, TokenLedger, model_prefix_value
from trace_core.tree import ROOT, RolloutTree


# ============================================================================ configuration
@dataclass(frozen=True)
class SimConfig:
    """The simulator's pinned defaults. Every field is part of the experiment's
    definition; the benchmark reports the values it ran with."""

    difficulty_beta: float = 0.15  # a in p0 ~ Beta(a, a): prompt difficulty (U-shaped for a < 1)
    horizon_min: int = 3  # smallest number of turns T of a prompt (T ~ uniform{min..max})
    horizon_max: int = 8  # largest number of turns T of a prompt
    kappa: float = 6.0  # κ: concentration of V_{t+1} ~ Beta(κ V_t, κ(1 − V_t)); smaller = noisier
    feature_noise_std: float = 1.0  # std of the Gaussian added to logit(p0) in the prompt feature
    observation_noise_std: float = 0.25  # std (not variance) of the Gaussian added to V_t per turn
    feature_clip: float = 1e-9  # p0 is clipped to [c, 1 − c] before the logit, so the feature is finite
    # Generated tokens (method §10). Turn d of a prompt has a typical length, drawn once per prompt
    # and turn when the prompt is created: turn_tokens_mean · turn_tokens_growth^(d−1) times a
    # prompt factor and a turn factor, each log-normal with mean 1; one generated turn has that
    # length times a log-normal factor of mean 1 drawn per rollout and turn, rounded, at least 1.
    # A rollout (or a continuation) costs the sum over the turns it generates.
    turn_tokens_mean: float = 64.0  # mean generated tokens of a first turn
    turn_tokens_growth: float = 1.0  # ratio of turn d+1's typical length to turn d's (< 1: late turns short)
    turn_tokens_prompt_std: float = 0.5  # log-space std of the prompt factor (one per prompt)
    turn_tokens_turn_std: float = 0.3  # log-space std of the turn factor (one per prompt and turn)
    turn_tokens_sample_std: float = 0.2  # log-space std of one generated turn around its typical length

    def __post_init__(self) -> None:
        if not (np.isfinite(self.difficulty_beta) and self.difficulty_beta > 0):
            raise ValueError(f"difficulty_beta = {self.difficulty_beta}: a Beta parameter must be > 0")
        if not (isinstance(self.horizon_min, int) and isinstance(self.horizon_max, int)):
            raise ValueError("horizon_min and horizon_max must be integers")
        if not 1 <= self.horizon_min <= self.horizon_max:
            raise ValueError(
                f"horizon_min = {self.horizon_min}, horizon_max = {self.horizon_max}: "
                "need 1 <= horizon_min <= horizon_max"
            )
        if not (np.isfinite(self.kappa) and self.kappa > 0):
            raise ValueError(f"kappa = {self.kappa}: the martingale's concentration must be > 0")
        for name in ("feature_noise_std", "observation_noise_std"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"{name} = {value}: a noise std must be finite and >= 0")
        if not 0 < self.feature_clip < 0.5:
            raise ValueError(f"feature_clip = {self.feature_clip}: it must lie in (0, 0.5)")
        for name in ("turn_tokens_mean", "turn_tokens_growth"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value > 0):
                raise ValueError(f"{name} = {value}: it must be finite and > 0")
        for name in ("turn_tokens_prompt_std", "turn_tokens_turn_std", "turn_tokens_sample_std"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"{name} = {value}: a log-space std must be finite and >= 0")


# ============================================================================ the environment
@dataclass(frozen=True)
class PromptPool:
    """A step's candidate prompts. ``p0`` and ``horizon`` are hidden; ``feature`` is visible."""

    p0: np.ndarray  # float64 (B,): V_0, the prompt's true success probability
    horizon: np.ndarray  # int64 (B,): T, turns of every path of the prompt
    feature: np.ndarray  # float64 (B,): logit(p0) + N(0, feature_noise_std)
    # float64 (B, horizon_max): column d − 1 holds turn d's typical generated tokens (hidden); None:
    # no token costs drawn (run_step draws them for a pool without)
    turn_tokens: np.ndarray | None = None

    def take(self, rows: np.ndarray) -> PromptPool:
        """The prompts at ``rows``, in that order."""
        tok = None if self.turn_tokens is None else self.turn_tokens[rows]
        return PromptPool(p0=self.p0[rows], horizon=self.horizon[rows], feature=self.feature[rows], turn_tokens=tok)


def draw_turn_tokens(config: SimConfig, size: int, rng: np.random.Generator) -> np.ndarray:
    """float64 (size, horizon_max): each prompt's typical generated tokens per turn (SimConfig's
    token fields): ``mean · growth^(d−1)`` times a prompt factor and a turn factor, log-normal with mean 1."""
    H = config.horizon_max
    sp, st = config.turn_tokens_prompt_std, config.turn_tokens_turn_std
    prompt = np.exp(rng.normal(0.0, sp, size=(size, 1)) - 0.5 * sp * sp)
    turn = np.exp(rng.normal(0.0, st, size=(size, H)) - 0.5 * st * st)
    shape = config.turn_tokens_mean * np.power(config.turn_tokens_growth, np.arange(H, dtype=np.float64))
    return shape[None, :] * prompt * turn


def expected_rollout_tokens(config: SimConfig) -> float:
    """Expected generated tokens of a root rollout of a fresh prompt: ``E_T[Σ_{d ≤ T} mean·growth^(d−1)]``
    over the horizon prior (the factors have mean 1; rounding ignored)."""
    shape = config.turn_tokens_mean * np.power(config.turn_tokens_growth, np.arange(config.horizon_max))
    horizons = np.arange(config.horizon_min, config.horizon_max + 1)
    return float(np.mean([shape[:T].sum() for T in horizons]))


def path_tokens(
    turn_tokens: np.ndarray, start_depth: np.ndarray, horizon: np.ndarray, config: SimConfig,
    rng: np.random.Generator,
) -> np.ndarray:
    """int64 (n,): generated tokens of paths that generate turns ``start_depth + 1 .. horizon``;
    ``turn_tokens``: each path's prompt row of :func:`draw_turn_tokens`. Each generated turn is its
    typical length times a fresh log-normal factor of mean 1, rounded, at least 1 token."""
    n, H = turn_tokens.shape[0], config.horizon_max
    ss = config.turn_tokens_sample_std
    factor = np.exp(rng.normal(0.0, ss, size=(n, H)) - 0.5 * ss * ss)
    per_turn = np.maximum(np.rint(turn_tokens * factor), 1.0)
    d = np.arange(1, H + 1)[None, :]
    generated = (d > np.asarray(start_depth)[:, None]) & (d <= np.asarray(horizon)[:, None])
    return np.where(generated, per_turn, 0.0).sum(axis=1).astype(np.int64)


def sample_prompts(config: SimConfig, size: int, rng: np.random.Generator) -> PromptPool:
    """``size`` fresh prompts, i.i.d. from the configured prior (without token costs: :func:`run_step`
    draws those from a generator of its own, so this stream is what it always was)."""
    if size < 0:
        raise ValueError(f"size = {size}: the number of prompts cannot be negative")
    a = config.difficulty_beta
    p0 = rng.beta(a, a, size=size)
    horizon = rng.integers(config.horizon_min, config.horizon_max + 1, size=size)
    c = config.feature_clip
    clipped = np.clip(p0, c, 1.0 - c)
    feature = np.log(clipped) - np.log1p(-clipped) + rng.normal(0.0, config.feature_noise_std, size=size)
    return PromptPool(p0=p0, horizon=horizon.astype(np.int64), feature=feature)


@dataclass(frozen=True)
class PersistentPoolConfig:
    """The persistent pool's pinned defaults (fixed before any reported run). Per step, every
    prompt's logit moves by ``global_drift + N(0, drift_noise_std)``, and each prompt that formed
    a trained mixed group that step (its tree held both outcomes and the method trained on it)
    moves up by ``learn_gain`` more: the policy learns from contrast, and what it learns makes the
    prompt easier — so a method that finds mixed groups also uses them up."""

    dataset_factor: int = 2  # dataset size D = dataset_factor × the candidate pool B; an epoch is that many steps
    global_drift: float = 0.02  # logit added to every prompt per step (training generalises a little)
    learn_gain: float = 0.25  # extra logit per step for a prompt that formed a trained mixed group
    drift_noise_std: float = 0.1  # std of the Gaussian logit noise added to every prompt per step

    def __post_init__(self) -> None:
        if not (isinstance(self.dataset_factor, int) and self.dataset_factor >= 1):
            raise ValueError(f"dataset_factor = {self.dataset_factor}: it must be an integer >= 1")
        for name in ("global_drift", "learn_gain"):
            if not np.isfinite(getattr(self, name)):
                raise ValueError(f"{name} = {getattr(self, name)}: it must be finite")
        if not (np.isfinite(self.drift_noise_std) and self.drift_noise_std >= 0):
            raise ValueError(f"drift_noise_std = {self.drift_noise_std}: a noise std must be finite and >= 0")


class PersistentPool:
    """A finite dataset of prompts that recur across steps and drift (:class:`PersistentPoolConfig`).

    Prompt ``i`` keeps its horizon and its feature error for the whole run; its success
    probability is ``sigmoid(logit_i)``, initially ``p0 ~ Beta(a, a)`` (clipped to
    ``[feature_clip, 1 − feature_clip]``). The candidates of step ``s`` are slice ``s mod E`` of
    epoch ``s // E``'s random order (``E = dataset_factor``): a function of the seed and the step
    alone, so every method sees the same candidates at a step (common random numbers), while the
    probabilities behind them depend on what the method trained on. The generators of the
    dataset, the epoch orders and the drift noise are derived from ``seed``; the step's own
    generator is never used here."""

    def __init__(
        self, candidates_per_step: int, config: SimConfig | None = None,
        pool_config: PersistentPoolConfig | None = None, seed: int = 0,
    ) -> None:
        if int(candidates_per_step) < 1:
            raise ValueError(f"candidates_per_step = {candidates_per_step}: it must be >= 1")
        self.config = config or SimConfig()
        self.pool_config = pool_config or PersistentPoolConfig()
        self.candidates_per_step = int(candidates_per_step)
        self.size = self.pool_config.dataset_factor * self.candidates_per_step
        self.seed = int(seed)
        rng = np.random.default_rng([self.seed, 0])
        a, D = self.config.difficulty_beta, self.size
        self.logit = _logit(rng.beta(a, a, size=D), self.config.feature_clip)
        self.horizon = rng.integers(self.config.horizon_min, self.config.horizon_max + 1, size=D).astype(np.int64)
        self.feature_error = rng.normal(0.0, self.config.feature_noise_std, size=D)
        # each prompt's typical tokens per turn, from a generator of their own (the streams above stay)
        self.turn_tokens = draw_turn_tokens(self.config, D, np.random.default_rng([self.seed, 3]))
        self.step = 0  # steps advanced so far; the next candidates are step `step`'s

    def success_probability(self) -> np.ndarray:
        """float64 (D,): every prompt's current success probability."""
        return _sigmoid(self.logit)

    def success(self) -> float:
        """Pool success: the mean success probability over the whole dataset."""
        return float(self.success_probability().mean())

    def candidate_ids(self, step: int | None = None) -> np.ndarray:
        """int64 (B,): the dataset indices that are step ``step``'s candidates (default: the next step)."""
        step = self.step if step is None else int(step)
        E = self.pool_config.dataset_factor
        order = np.random.default_rng([self.seed, 1, step // E]).permutation(self.size)
        k = step % E
        return order[k * self.candidates_per_step : (k + 1) * self.candidates_per_step].astype(np.int64)

    def candidates(self) -> tuple[np.ndarray, PromptPool]:
        """The next step's candidates: their ids and a :class:`PromptPool` of their current state."""
        ids = self.candidate_ids()
        p = _sigmoid(self.logit[ids])
        feature = _logit(p, self.config.feature_clip) + self.feature_error[ids]
        return ids, PromptPool(p0=p, horizon=self.horizon[ids].copy(), feature=feature,
                               turn_tokens=self.turn_tokens[ids].copy())

    def advance(self, trained_mixed_ids: np.ndarray) -> None:
        """End the step: drift every prompt, push the ones that formed a trained mixed group."""
        ids = np.asarray(trained_mixed_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.size or np.unique(ids).size != ids.size):
            raise ValueError("trained_mixed_ids must be distinct dataset indices")
        pc = self.pool_config
        noise = np.random.default_rng([self.seed, 2, self.step]).normal(0.0, pc.drift_noise_std, size=self.size)
        self.logit += pc.global_drift + noise
        self.logit[ids] += pc.learn_gain
        self.step += 1


def martingale_step(v: np.ndarray, kappa: float, rng: np.random.Generator) -> np.ndarray:
    """One turn: ``V' ~ Beta(κ V, κ (1 − V))`` where ``0 < V < 1``; 0 and 1 stay put."""
    out = np.array(v, dtype=np.float64, copy=True)
    moving = (out > 0.0) & (out < 1.0)
    if moving.any():
        vm = out[moving]
        out[moving] = rng.beta(kappa * vm, kappa * (1.0 - vm))
    return out


@dataclass(frozen=True)
class Paths:
    """Simulated paths, one row each; column ``d`` is turn ``d`` (0 = the root)."""

    values: np.ndarray  # float64 (n, H + 1): hidden V_d for start < d <= T (V_start at start), NaN elsewhere
    observations: np.ndarray  # float64 (n, H + 1): V_d + noise for start < d <= T, NaN elsewhere
    reward: np.ndarray  # float64 (n,): Bernoulli(V_T), 0.0 or 1.0


def simulate_paths(
    start_value: np.ndarray,
    start_depth: np.ndarray,
    horizon: np.ndarray,
    config: SimConfig,
    rng: np.random.Generator,
) -> Paths:
    """Run each path from ``V = start_value`` at turn ``start_depth`` to its ``horizon``."""
    start_value = np.asarray(start_value, dtype=np.float64)
    start_depth = np.asarray(start_depth, dtype=np.int64)
    horizon = np.asarray(horizon, dtype=np.int64)
    n, H = start_value.shape[0], config.horizon_max
    if not (start_depth.shape == horizon.shape == (n,)):
        raise ValueError("start_value, start_depth and horizon must be 1-D arrays of one length")
    if n and (np.any(start_depth < 0) or np.any(start_depth >= horizon) or np.any(horizon > H)):
        raise ValueError(f"need 0 <= start_depth < horizon <= horizon_max = {H} for every path")
    values = np.full((n, H + 1), np.nan)
    observations = np.full((n, H + 1), np.nan)
    rows = np.arange(n)
    values[rows, start_depth] = start_value
    current = start_value.copy()
    for d in range(1, H + 1):
        active = (start_depth < d) & (d <= horizon)
        if not active.any():
            continue
        current[active] = martingale_step(current[active], config.kappa, rng)
        values[active, d] = current[active]
        observations[active, d] = current[active] + rng.normal(
            0.0, config.observation_noise_std, size=int(active.sum())
        )
    final = values[rows, horizon] if n else np.zeros(0)
    reward = (rng.random(n) < final).astype(np.float64)
    return Paths(values=values, observations=observations, reward=reward)


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


def _logit(p: np.ndarray, clip: float) -> np.ndarray:
    p = np.clip(p, clip, 1.0 - clip)
    return np.log(p) - np.log1p(-p)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free


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
        z = _logit(histories.true_value, self.clip)
        return _sigmoid(z + self._rng.normal(0.0, self.logit_noise_std, size=z.shape[0]))

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
        return hidden, _sigmoid(hidden @ self.params["w2"] + self.params["b2"][0])

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


# ============================================================================ one step
@dataclass
class StepResult:
    """Everything one simulated step produced. Pool arrays have one entry per candidate prompt
    (shuffled order); anchor arrays one per anchor of the bare rollouts, grouped by prompt."""

    method: str
    trees: list[RolloutTree]  # one per selected prompt (m > 0), in pool order
    tree_prompt: np.ndarray  # int64: pool index of each tree
    pool_m: np.ndarray  # int64 (B,): bare rollouts per pool prompt (0 = skipped)
    pool_pred: np.ndarray  # float64 (B,): predicted root value v (scored before any update)
    pool_value: np.ndarray  # float64 (B,): hidden p0
    root_extra: np.ndarray  # int64 (B,): extra root rollouts of anchorless prompts (method §3)
    anchor_prompt: np.ndarray  # int64 (A,): pool index of the anchor's prompt
    anchor_node: np.ndarray  # int64 (A,): node id in that prompt's tree
    anchor_turn: np.ndarray  # int64 (A,): t
    anchor_position: np.ndarray  # float64 (A,): t / T
    anchor_reward: np.ndarray  # float64 (A,): reward of the bare rollout through the anchor
    anchor_pred: np.ndarray  # float64 (A,): predicted V at the anchor (before any update)
    anchor_value: np.ndarray  # float64 (A,): hidden V_t
    anchor_K: np.ndarray  # int64 (A,): continuations allocated to the anchor
    node_value: list[np.ndarray]  # float64 per tree, one per node: hidden V_t (the root's: p0), never in node.info
    trajectories: int  # finished trajectories in the trees (== spec.total, asserted; a round rule's own spend)
    turns_generated: int  # generated turn nodes: the simulator's stand-in for tokens
    metrics: dict[str, float] = field(default_factory=dict)
    pool_ids: np.ndarray | None = None  # int64 (B,): dataset index of each candidate (persistent pool only)
    tree_kept: np.ndarray | None = None  # bool per tree: the policy trains on it (a round rule's group filter)
    rounds: int = 1  # sampling rounds of the bare rollouts
    pool_success: float = float("nan")  # persistent pool: mean success probability after this step's drift
    generated_tokens: int = 0  # tokens the step generated (bare rollouts and continuations), method §10
    bare_tokens: np.ndarray | None = None  # int64 (R,): generated tokens of each bare rollout, grouped by prompt
    cont_tokens: np.ndarray | None = None  # int64 (C,): generated tokens of each continuation, grouped by prompt
    token_plan: object | None = None  # a token-priced method's stage 1 (trace_core.token_budget.TokenPlan)
    token_ledger: TokenLedger | None = None  # the ledger after this step: pass it to the next one


def sim_token_ledger(config: SimConfig) -> TokenLedger:
    """A fresh :class:`~trace_core.token_budget.TokenLedger` whose first guesses are the
    configuration's expected rollout tokens and turns."""
    turns = 0.5 * (config.horizon_min + config.horizon_max)
    return TokenLedger(CostModel(initial_tokens=expected_rollout_tokens(config), initial_turns=turns))


def _checked_scores(values: object, n: int, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise ValueError(f"predictor returned shape {arr.shape} for {n} {what} histories")
    if np.any(~np.isfinite(arr) | (arr < 0) | (arr > 1)):
        raise ValueError(f"predictor returned {what} values outside [0, 1] (or NaN)")
    return arr


def _segment_bounds(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.searchsorted(sorted_keys, keys, "left"), np.searchsorted(sorted_keys, keys, "right")


def run_step(
    method: str | Method,
    spec: BudgetSpec,
    predictor: ValuePredictor,
    rng: np.random.Generator,
    config: SimConfig | None = None,
    compute_metrics: bool = True,
    pool: PersistentPool | None = None,
    history: PromptHistory | None = None,
    explore_fraction: float = 0.0,
    ledger: TokenLedger | None = None,
) -> StepResult:
    """One step of method §2–§4 with ``method`` at budget ``spec`` (``spec.total`` trajectories).

    Order: pool → score roots → ``m`` → bare rollouts → score anchors → ``K`` per prompt
    (an anchorless prompt spends ``m_i·N`` on extra root rollouts) → continuations → trees →
    metrics → ``predictor.update(trees)`` → ``history.record`` → ``pool.advance``. Raises
    AssertionError if the trees do not hold exactly ``spec.total`` trajectories (the
    equal-budget contract of method §4); a method that samples in rounds spends what its rounds
    sample, within its own limits (``trajectories`` reports it, and the metrics count it).

    ``pool``: a :class:`PersistentPool` to draw the candidates from (default: fresh i.i.d.
    prompts); ``history``: the run's per-prompt record, read by a root rule that reads history and updated with the
    step's bare root outcomes (persistent pool only: i.i.d. prompts never recur);
    ``explore_fraction``: method §5's root exploration, applied by the methods that explore (as
    the trainer's ``predictor.explore_fraction``; 0: none).

    Generated tokens (method §10): every rollout's tokens are drawn from a generator spawned from
    ``rng`` (so the rest of the step's stream is what it is without them) and reported
    (``generated_tokens``). ``ledger``: the run's :class:`TokenLedger` (default: a fresh one), read
    for the expected costs and returned updated in ``StepResult.token_ledger``. Under a token budget
    (``spec.tokens_per_step``) a token-priced method (``method.prices_tokens``: ``trace-tokens``)
    plans its roots and reservations with its token rule and spends each prompt's allowance — its
    reservation plus its roots' expected cost less their realised cost — with the rule's stage 2;
    a method without expansion or rounds gets as many groups of ``G`` as the budget buys at the
    expected costs (:func:`~trace_core.token_budget.uniform_spec_for_tokens`); other methods are
    refused there.

    Every rule comes from ``method``, as in the trainer: its root rule (with the history where it
    reads one), exploration, its group filter and rounds, its prefix rule and its default advantage estimator; the
    metrics carry the trainer's names (:func:`simulator_metrics`). A method whose prefix rule reads the
    entropy of the policy's tokens (``method.reads_entropy``: ARPO) is refused with a ValueError: the
    synthetic paths have no tokens, and a stand-in signal would be an invention, not ARPO."""
    config = config or SimConfig()
    method = get_method(method) if isinstance(method, str) else method
    if method.reads_entropy:
        raise ValueError(f"method {method.name!r} branches where the entropy of the tokens the policy wrote after a "
                         "tool result rose (its prefix rule reads entropy); the simulator's rollouts are synthetic "
                         "paths without tokens or log-probs, so it cannot run it: run it through the trainer's "
                         "executor (method §4, ARPO)")
    H = config.horizon_max
    B = spec.pool_size
    token_rng = rng.spawn(1)[0]  # generated tokens only: the step's own stream is left as it was
    ledger = ledger or sim_token_ledger(config)
    planner = StepPlanner(method, spec, ledger, history, explore_fraction)

    # ---- candidate pool, shuffled
    prompts, ids, step = _candidates(config, B, pool, history, rng, token_rng)

    # ---- stage 1: roots
    root_batch = HistoryBatch(prompts.feature, np.full((B, H), np.nan), np.zeros(B, dtype=np.int64), prompts.p0)
    v = _checked_scores(predictor.score(root_batch), B, "root")
    rounds, sampled = 1, None
    if method.group_filter is None:
        root_plan = planner.plan_roots(v, ids, step, rng)
        m, spec = root_plan.m, root_plan.spec
    else:  # the pre-rollout filter (where there is one) once, then the rounds over what it kept
        sampled, bare_prompt, bare = _sample_in_rounds(method, v, prompts, spec, config, rng,
                                                       planner.history_view(ids, step))
        m, rounds = sampled.m, sampled.rounds
        root_plan = RootPlan(m, spec, planner.root_costs(ids, n=B))
    root_cost, plan, allowances = root_plan.root_cost, root_plan.token_plan, root_plan.tokens
    model, costs = ledger.cost_model, ledger.costs
    prefix_budget = np.array([planner.prefix_budget(mi) for mi in m.tolist()], dtype=np.int64)
    planned = int(m.sum() + prefix_budget.sum())
    method.check_planned(spec, planned)
    selected = np.flatnonzero(m)

    # ---- bare rollouts, grouped by prompt in pool order
    if method.group_filter is None:
        bare_prompt = np.repeat(selected, m[selected])
        bare = simulate_paths(prompts.p0[bare_prompt], np.zeros(bare_prompt.size, dtype=np.int64),
                              prompts.horizon[bare_prompt], config, rng)
    R = bare_prompt.size
    bare_tokens = path_tokens(prompts.turn_tokens[bare_prompt], np.zeros(R, dtype=np.int64),
                              prompts.horizon[bare_prompt], config, token_rng)

    # ---- anchors: turns 1..T−1 of each bare rollout, scored
    anchors = _anchors(prompts, bare_prompt, bare, H)
    anchor_prompt, anchor_turn, anchor_reward = anchors.prompt, anchors.turn, anchors.reward
    A = anchor_prompt.size
    p = _checked_scores(predictor.score(anchors.histories), A, "anchor")

    # ---- stage 2: prefixes, prompt by prompt (method §3: a prompt needs only its own rollouts)
    K = np.zeros(A, dtype=np.int64)
    root_extra = np.zeros(B, dtype=np.int64)
    lo, hi = _segment_bounds(anchor_prompt, selected)
    anchor_cost = remaining_tokens(costs, model, root_cost[anchor_prompt], anchor_turn, prompts.horizon[anchor_prompt])
    if method.prices_tokens:  # each prompt's allowance: its reservation and what its roots cost less than expected
        b_lo, b_hi = _segment_bounds(bare_prompt, selected)
        realised = np.bincount(bare_prompt, weights=bare_tokens, minlength=B)
        for i, a0, a1, b0, b1 in zip(selected.tolist(), lo.tolist(), hi.tolist(), b_lo.tolist(), b_hi.tolist(),
                                     strict=True):
            allowance = allowances.allowance(i, m[i], realised[i])
            spent_i = method.token_rule.spend(p[a0:a1], anchor_reward[a0:a1], anchor_turn[a0:a1], anchor_cost[a0:a1],
                                              bare.reward[b0:b1], float(v[i]), float(root_cost[i]), allowance)
            K[a0:a1] = spent_i.K
            root_extra[i] = spent_i.extra_roots
        planned = int(m.sum() + K.sum() + root_extra.sum())
    for i, a0, a1 in zip(selected.tolist(), lo.tolist(), hi.tolist(), strict=True):
        budget = int(prefix_budget[i])
        if budget == 0:
            continue
        placement = method.place_prefixes(AnchorSignals(p[a0:a1], anchor_reward[a0:a1], anchor_turn[a0:a1]), budget,
                                          rng)
        K[a0:a1] = placement.K
        root_extra[i] = placement.extra_roots
    spent = int(m.sum() + K.sum() + root_extra.sum())
    if spent != planned:
        raise AssertionError(f"{method.name}: allocated {spent} rollouts != {planned}")

    # ---- continuations (from anchors, then extra root rollouts), grouped by prompt
    cont = _continue(prompts, anchors, K, root_extra, config, rng, token_rng)

    # ---- trees
    trees, anchor_node, node_value = _build_trees(
        prompts, selected, bare_prompt, bare, anchors.path, anchor_turn, cont.prompt, cont.start_depth,
        cont.from_anchor, cont.paths,
    )
    trajectories = sum(len(t.trajectories) for t in trees)
    if trajectories != planned:
        raise AssertionError(f"{method.name}: trees hold {trajectories} trajectories != {planned}")
    turns = sum(len(t.nodes) - 1 for t in trees)
    mixed = np.array([tree_is_mixed(t) for t in trees], dtype=bool)
    if sampled is None:
        kept = np.ones(len(trees), dtype=bool)
    else:  # the group filter decided in sampling order; the trees are in pool order
        kept_by_candidate = np.zeros(B, dtype=bool)
        kept_by_candidate[sampled.order] = sampled.kept
        kept = kept_by_candidate[selected]
    result = StepResult(
        method=method.name, trees=trees, tree_prompt=selected, pool_m=m, pool_pred=v, pool_value=prompts.p0,
        root_extra=root_extra, anchor_prompt=anchor_prompt, anchor_node=anchor_node, anchor_turn=anchor_turn,
        anchor_position=anchor_turn / prompts.horizon[anchor_prompt], anchor_reward=anchor_reward,
        anchor_pred=p, anchor_value=anchors.value, anchor_K=K, node_value=node_value, trajectories=trajectories,
        turns_generated=turns, pool_ids=ids, tree_kept=kept, rounds=rounds,
        generated_tokens=int(bare_tokens.sum() + cont.tokens.sum()), bare_tokens=bare_tokens, cont_tokens=cont.tokens,
        token_plan=plan,
    )
    token_figures = planner.observe_costs(_step_costs(
        method, v, root_cost, ids, bare_prompt, bare_tokens, prompts, anchor_prompt, anchor_reward, anchor_cost, K,
        cont.from_anchor, cont.prompt, cont.start_depth, cont.paths.reward, cont.tokens))
    result.token_ledger = planner.ledger
    if compute_metrics:
        result.metrics = simulator_metrics(result, method.advantage_estimator())
        result.metrics.update(token_figures)
        result.metrics.update(planner.token_figures(root_plan, int(root_extra.sum())))
    predictor.update(trees)  # after every score of this step has been used and recorded
    if history is not None:  # the bare root outcomes, with the predictions the allocator used
        b_lo, b_hi = _segment_bounds(bare_prompt, selected)
        planner.record_root_outcomes(step, ids[selected], [bare.reward[a:b] for a, b in zip(b_lo, b_hi, strict=True)],
                                     v[selected])
    if pool is not None:
        pool.advance(ids[selected[mixed & kept]])
        result.pool_success = pool.success()
        if compute_metrics:
            result.metrics["pool_success"] = result.pool_success
    return result


def _candidates(
    config: SimConfig, B: int, pool: PersistentPool | None, history: PromptHistory | None, rng: np.random.Generator,
    token_rng: np.random.Generator,
) -> tuple[PromptPool, np.ndarray | None, int]:
    """The step's ``B`` candidates, shuffled (so no prompt is favoured by its index even if a
    caller passes a fixed dataset order: method §2's promise), with their dataset ids (persistent
    pool only) and the step number."""
    if pool is None:
        if history is not None:
            raise ValueError("a history needs a persistent pool: i.i.d. prompts never recur")
        prompts, ids = sample_prompts(config, B, rng), None
    else:
        if pool.candidates_per_step != B:
            raise ValueError(f"the pool serves {pool.candidates_per_step} candidates a step but the budget needs {B}")
        if pool.config != config:
            raise ValueError("the persistent pool was built with another SimConfig")
        ids, prompts = pool.candidates()
    if prompts.turn_tokens is None:
        prompts = PromptPool(prompts.p0, prompts.horizon, prompts.feature, draw_turn_tokens(config, B, token_rng))
    order = rng.permutation(B)
    return prompts.take(order), None if ids is None else ids[order], 0 if pool is None else pool.step


@dataclass(frozen=True)
class _Anchors:
    """The anchors of a step's bare rollouts (turns 1..T−1 of each), grouped by prompt."""

    path: np.ndarray  # int64 (A,): the bare rollout through the anchor
    turn: np.ndarray  # int64 (A,): t
    prompt: np.ndarray  # int64 (A,): pool index of the anchor's prompt
    value: np.ndarray  # float64 (A,): hidden V_t
    reward: np.ndarray  # float64 (A,): reward of the bare rollout through the anchor
    histories: HistoryBatch  # what a predictor sees at each anchor


def _anchors(prompts: PromptPool, bare_prompt: np.ndarray, bare: Paths, H: int) -> _Anchors:
    n_anchor = prompts.horizon[bare_prompt] - 1
    path = np.repeat(np.arange(bare_prompt.size), n_anchor)
    turn = 1 + np.arange(path.size) - np.repeat(np.cumsum(n_anchor) - n_anchor, n_anchor)
    prompt = bare_prompt[path]
    obs = np.where(np.arange(1, H + 1)[None, :] <= turn[:, None], bare.observations[path, 1:], np.nan)
    value = bare.values[path, turn]
    histories = HistoryBatch(prompts.feature[prompt], obs, turn, value)
    return _Anchors(path, turn, prompt, value, bare.reward[path], histories)


@dataclass(frozen=True)
class _Continuations:
    """A step's continuations (from anchors, then extra root rollouts), grouped by prompt."""

    prompt: np.ndarray  # int64 (C,): pool index of the continuation's prompt
    start_depth: np.ndarray  # int64 (C,): the turn it branches at (0: from the root)
    from_anchor: np.ndarray  # int64 (C,): the anchor it branches at (−1: from the root)
    paths: Paths
    tokens: np.ndarray  # int64 (C,): generated tokens


def _continue(
    prompts: PromptPool, anchors: _Anchors, K: np.ndarray, root_extra: np.ndarray, config: SimConfig,
    rng: np.random.Generator, token_rng: np.random.Generator,
) -> _Continuations:
    cont_anchor = np.repeat(np.arange(K.size), K)
    extra_prompt = np.repeat(np.arange(root_extra.size), root_extra)
    prompt = np.concatenate([anchors.prompt[cont_anchor], extra_prompt])
    start_depth = np.concatenate([anchors.turn[cont_anchor], np.zeros(extra_prompt.size, dtype=np.int64)])
    start_value = np.concatenate([anchors.value[cont_anchor], prompts.p0[extra_prompt]])
    from_anchor = np.concatenate([cont_anchor, np.full(extra_prompt.size, -1, dtype=np.int64)])
    by_prompt = np.argsort(prompt, kind="stable")
    prompt, start_depth = prompt[by_prompt], start_depth[by_prompt]
    start_value, from_anchor = start_value[by_prompt], from_anchor[by_prompt]
    paths = simulate_paths(start_value, start_depth, prompts.horizon[prompt], config, rng)
    tokens = path_tokens(prompts.turn_tokens[prompt], start_depth, prompts.horizon[prompt], config, token_rng)
    return _Continuations(prompt, start_depth, from_anchor, paths, tokens)


def _step_costs(
    method: Method, v: np.ndarray, root_cost: np.ndarray, ids: np.ndarray | None,
    bare_prompt: np.ndarray, bare_tokens: np.ndarray, prompts: PromptPool, anchor_prompt: np.ndarray,
    anchor_reward: np.ndarray, anchor_cost: np.ndarray, K: np.ndarray,
    cont_from_anchor: np.ndarray, cont_prompt: np.ndarray, cont_start_depth: np.ndarray, cont_reward: np.ndarray,
    cont_tokens: np.ndarray,
) -> StepCosts:
    """What the step's rollouts cost against their estimates, for the ledger
    (:meth:`~trace_core.planner.StepPlanner.observe_costs`). A token-priced method's calibration
    pair is the stage-1 model's value of the continuations each prompt ran
    (:func:`~trace_core.token_budget.model_prefix_value`, over the prompt's anchors) and the
    expanded anchors whose branch group holds both outcomes."""
    horizon = prompts.horizon
    from_anchor = cont_from_anchor >= 0
    a = cont_from_anchor[from_anchor]
    predicted, realised = None, 0.0
    if method.prices_tokens:
        B = root_cost.shape[0]
        differs = cont_reward[from_anchor] != anchor_reward[a]
        realised = float((np.bincount(a, weights=differs, minlength=K.size) > 0).sum())
        anchors = np.bincount(anchor_prompt, minlength=B).astype(np.float64)
        continuations = np.bincount(anchor_prompt, weights=K, minlength=B)
        predicted = float(model_prefix_value(v, anchors, continuations).sum())
    return StepCosts(
        bare_tokens=bare_tokens.astype(np.float64), bare_turns=horizon[bare_prompt].astype(np.float64),
        bare_estimate=root_cost[bare_prompt], bare_prompt_ids=None if ids is None else ids[bare_prompt],
        cont_tokens=cont_tokens[from_anchor].astype(np.float64),
        cont_turn=cont_start_depth[from_anchor].astype(np.float64),
        cont_turns=horizon[cont_prompt[from_anchor]].astype(np.float64),
        cont_root_estimate=root_cost[cont_prompt[from_anchor]], cont_estimate=anchor_cost[a],
        prefix_predicted=predicted, prefix_realised=realised,
    )


def _sample_in_rounds(
    method: Method, v: np.ndarray, prompts: PromptPool, spec: BudgetSpec, config: SimConfig, rng: np.random.Generator,
    view: HistoryView | None,
) -> tuple[SampledRounds, np.ndarray, Paths]:
    """The method's bare groups in rounds (:func:`~trace_core.allocation.sample_in_rounds`, the
    trainer's loop), each round's paths simulated before the next is chosen. Returns what the
    rounds sampled and the bare paths grouped by prompt in pool order."""
    parts: list[tuple[np.ndarray, Paths]] = []

    def roll(m_r: np.ndarray) -> np.ndarray:
        sel = np.flatnonzero(m_r)
        bp = np.repeat(sel, m_r[sel])
        paths = simulate_paths(prompts.p0[bp], np.zeros(bp.size, dtype=np.int64), prompts.horizon[bp], config, rng)
        parts.append((bp, paths))
        return np.array([is_mixed(paths.reward[bp == i]) for i in sel.tolist()], dtype=bool)

    sampled = sample_in_rounds(method, v, spec, rng, roll, view)
    if not parts:
        empty = np.zeros((0, config.horizon_max + 1))
        return sampled, np.zeros(0, dtype=np.int64), Paths(empty, empty.copy(), np.zeros(0))
    bp_all = np.concatenate([bp for bp, _ in parts])
    by_prompt = np.argsort(bp_all, kind="stable")
    paths = Paths(
        values=np.concatenate([q.values for _, q in parts])[by_prompt],
        observations=np.concatenate([q.observations for _, q in parts])[by_prompt],
        reward=np.concatenate([q.reward for _, q in parts])[by_prompt],
    )
    return sampled, bp_all[by_prompt], paths


def _build_trees(
    pool: PromptPool,
    selected: np.ndarray,
    bare_prompt: np.ndarray,
    bare: Paths,
    anchor_path: np.ndarray,
    anchor_turn: np.ndarray,
    cont_prompt: np.ndarray,
    cont_start_depth: np.ndarray,
    cont_from_anchor: np.ndarray,
    cont: Paths,
) -> tuple[list[RolloutTree], np.ndarray, list[np.ndarray]]:
    """Real rollout trees with empty token lists; ``info`` holds what a predictor may see: ``obs``
    per turn node, ``horizon`` and ``feature`` at the root. Returns the trees, each anchor's node id
    and each tree's hidden values per node (the root's: ``p0``)."""
    bare_v, bare_o, bare_r = bare.values.tolist(), bare.observations.tolist(), bare.reward.tolist()
    cont_v, cont_o, cont_r = cont.values.tolist(), cont.observations.tolist(), cont.reward.tolist()
    horizon = pool.horizon.tolist()
    node_of_path: list[list[int]] = [[] for _ in range(bare_prompt.size)]
    b_lo, b_hi = _segment_bounds(bare_prompt, selected)
    c_lo, c_hi = _segment_bounds(cont_prompt, selected)
    starts, from_anchor = cont_start_depth.tolist(), cont_from_anchor.tolist()
    a_path, a_turn = anchor_path.tolist(), anchor_turn.tolist()
    trees, node_value = [], []
    bounds = zip(selected.tolist(), b_lo.tolist(), b_hi.tolist(), c_lo.tolist(), c_hi.tolist(), strict=True)
    for i, j0, j1, k0, k1 in bounds:
        T = horizon[i]
        tree = RolloutTree(
            prompt_id=str(i),
            info={"horizon": T, "feature": float(pool.feature[i])},
        )
        values = [float(pool.p0[i])]
        for j in range(j0, j1):
            traj = tree.start_trajectory("bare")
            ids = [ROOT]
            vj, oj = bare_v[j], bare_o[j]
            for d in range(1, T + 1):
                ids.append(tree.add_turn(traj, [], [], info={"obs": oj[d]}))
                values.append(vj[d])
            tree.finish(traj, bare_r[j])
            node_of_path[j] = ids
        for c in range(k0, k1):
            a = from_anchor[c]
            branch = ROOT if a < 0 else node_of_path[a_path[a]][a_turn[a]]
            traj = tree.start_trajectory("continuation", branch_node=branch)
            vc, oc = cont_v[c], cont_o[c]
            for d in range(starts[c] + 1, T + 1):
                tree.add_turn(traj, [], [], info={"obs": oc[d]})
                values.append(vc[d])
            tree.finish(traj, cont_r[c])
        trees.append(tree)
        node_value.append(np.array(values))
    anchor_node = np.array([node_of_path[j][t] for j, t in zip(a_path, a_turn, strict=True)], dtype=np.int64)
    return trees, anchor_node, node_value


def simulator_metrics(result: StepResult, estimator: AdvantageEstimator) -> dict[str, float]:
    """One step's figures: :func:`~trace_core.metrics.step_metrics` under the trainer's names
    (``estimator``: the method's advantage, on the trees the policy trains on), then what only a
    simulator reports.

    Spearman is reported twice: against the tree-backed targets ``V̂`` (method §5, what a real
    run can log) and against the hidden true ``V`` over the whole pool / every anchor (what only
    a simulator can know). All predictions were made before the predictor saw this step. Beside
    them: ``turns_generated``, the step's simulated tokens under the trainer's names
    (``budget/generated_tokens``; the mixed groups trained on and the contrastive rollouts per 1,000
    of them, ``contrast/mixed_per_1k_tokens`` and ``contrast/yield_per_1k_tokens``, which the
    trees' empty token lists would leave undefined), the mixed groups with the expanded anchors
    whose branch group holds both outcomes per 1,000 tokens
    (``mixed_groups_with_anchors_per_1k_tokens``: the token budget's objective, method §10), and
    the share of the prefix budget per position bin (``k_share_pos_<lo>_<hi>``)."""
    trees = result.trees
    kept = [True] * len(trees) if result.tree_kept is None else [bool(k) for k in result.tree_kept]
    advantages = estimator([t for t, k in zip(trees, kept, strict=True) if k])
    predictions = []
    tree_of_prompt = {int(i): k for k, i in enumerate(result.tree_prompt)}
    for k, tree in enumerate(trees):
        pred = np.full(len(tree.nodes), np.nan)
        pred[ROOT] = result.pool_pred[result.tree_prompt[k]]
        predictions.append(pred)
    for a in range(result.anchor_node.size):
        tree_k = tree_of_prompt[int(result.anchor_prompt[a])]
        predictions[tree_k][result.anchor_node[a]] = result.anchor_pred[a]
    sp = predictor_spearman(trees, predictions)
    extra = np.flatnonzero(result.root_extra)
    stats = allocation_stats(
        result.pool_m,
        np.concatenate([result.anchor_K, result.root_extra[extra]]),
        np.concatenate([result.anchor_position, np.zeros(extra.size)]),
    )
    out = step_metrics(trees, kept, advantages, stats, result.rounds)
    out.update({
        "turns_generated": float(result.turns_generated),
        "spearman_root_vs_target": sp.root,
        "spearman_prefix_vs_target": sp.prefix,
        "spearman_root_vs_true": spearman(result.pool_pred, result.pool_value),
        "spearman_anchor_vs_true": spearman(result.anchor_pred, result.anchor_value),
    })
    # per generated token: the simulator's tokens (its trees hold no token ids), under the trainer's names
    tokens = float(result.generated_tokens)
    groups = out["counts/mixed_groups_trained"] + out["counts/mixed_anchors"]
    out.update({
        "budget/generated_tokens": tokens,
        "contrast/mixed_per_1k_tokens": per_exposure(out["counts/mixed_groups_trained"], tokens, 1000.0),
        "contrast/yield_per_1k_tokens": per_exposure(out["counts/contrastive_rollouts"], tokens, 1000.0),
        "mixed_groups_with_anchors_per_1k_tokens": per_exposure(groups, tokens, 1000.0),
    })
    k_share = stats.k_share_by_position
    for b in range(k_share.size):
        lo_edge, hi_edge = stats.position_bin_edges[b], stats.position_bin_edges[b + 1]
        out[f"k_share_pos_{lo_edge:.1f}_{hi_edge:.1f}"] = float(k_share[b])
    return out
