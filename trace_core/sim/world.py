"""The simulator's world: prompts with hidden success values that move as a martingale along a
rollout's turns, the step's or a persistent pool, and the paths a rollout takes through them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def clipped_logit(p: np.ndarray, clip: float) -> np.ndarray:
    p = np.clip(p, clip, 1.0 - clip)
    return np.log(p) - np.log1p(-p)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free


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
        self.logit = clipped_logit(rng.beta(a, a, size=D), self.config.feature_clip)
        self.horizon = rng.integers(self.config.horizon_min, self.config.horizon_max + 1, size=D).astype(np.int64)
        self.feature_error = rng.normal(0.0, self.config.feature_noise_std, size=D)
        # each prompt's typical tokens per turn, from a generator of their own (the streams above stay)
        self.turn_tokens = draw_turn_tokens(self.config, D, np.random.default_rng([self.seed, 3]))
        self.step = 0  # steps advanced so far; the next candidates are step `step`'s

    def success_probability(self) -> np.ndarray:
        """float64 (D,): every prompt's current success probability."""
        return sigmoid(self.logit)

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
        p = sigmoid(self.logit[ids])
        feature = clipped_logit(p, self.config.feature_clip) + self.feature_error[ids]
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
