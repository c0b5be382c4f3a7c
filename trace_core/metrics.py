"""The per-step metrics of method §7, as pure functions over rollout trees and arrays.

Outcomes are binarised with one rule everywhere: a trajectory **succeeds iff its reward is
> 0.5** (:data:`SUCCESS_THRESHOLD`); rewards are 0/1 in the paper's tasks, and the threshold
keeps fractional rewards (e.g. partial credit) meaningful. Only finished trajectories count.
Ratios with an empty denominator are NaN, never 0, so that "nothing to measure" is not logged
as "measured nothing".

:func:`step_metrics` assembles one step's figures under the names the trainer logs; the
simulator (:mod:`trace_core.sim`) reports the same names through the same function.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from trace_core.advantages import as_tree_list as _check_trees
from trace_core.tree import ROOT, RolloutTree

SUCCESS_THRESHOLD = 0.5  # reward > this is a success
ADVANTAGE_TOL = 1e-9  # |A| above this counts as a learning signal (contrastive yield)


def is_success(reward: ArrayLike) -> np.ndarray:
    """The binarisation rule: ``reward > 0.5``."""
    return np.asarray(reward, dtype=np.float64) > SUCCESS_THRESHOLD


def is_mixed(rewards: ArrayLike) -> bool:
    """Whether a group's rewards hold a success and a failure (by :func:`is_success`): a mixed
    group, the one test of it that the executor, the simulator and the metrics share."""
    success = is_success(rewards)
    return bool(success.any() and not success.all())


def tree_is_mixed(tree: RolloutTree) -> bool:
    """Whether the tree's finished trajectories hold a success and a failure (a mixed group)."""
    return is_mixed(tree.outcomes())


# ---------------------------------------------------------------------------- contrast
def effective_ratio(trees: Sequence[RolloutTree]) -> float:
    """Share of activated prompts whose tree holds both a success and a failure leaf.

    Activated = the tree has at least one finished trajectory (a skipped prompt has none).
    NaN when no prompt is activated.
    """
    outcomes = [t.outcomes() for t in _check_trees(trees)]
    activated = [o for o in outcomes if o.size > 0]
    if not activated:
        return float("nan")
    return float(np.mean([is_mixed(o) for o in activated]))


def prefix_effective_ratio(trees: Sequence[RolloutTree]) -> float:
    """Share of expanded anchors whose group — the bare rollout through the anchor and its K
    continuations (:meth:`RolloutTree.branch_group`) — holds both outcomes. Unfinished
    trajectories of a group are ignored. NaN when no anchor was expanded."""
    flags = []
    for tree in _check_trees(trees):
        for anchor in tree.expanded_anchors():
            group = [tree.trajectories[j] for j in tree.branch_group(anchor)]
            rewards = np.array([tree.trajectory_reward(t.id) for t in group if t.finished])
            flags.append(is_mixed(rewards))
    return float(np.mean(flags)) if flags else float("nan")


def contrastive_yield(trees: Sequence[RolloutTree], advantages: Sequence[ArrayLike]) -> float:
    """Per 100 finished trajectories (bare rollouts and continuations), the number with at least
    one own node — generated after its branching point — whose ``|A| > 1e-9``.

    ``advantages[i]`` is tree ``i``'s per-node advantage array (an estimator's output). Guards
    against an effective ratio inflated by activating fewer prompts. NaN when no trajectory
    finished.
    """
    useful, total = _contrastive_rollouts(trees, advantages)
    return 100.0 * useful / total if total else float("nan")


def _contrastive_rollouts(trees: Sequence[RolloutTree], advantages: Sequence[ArrayLike]) -> tuple[int, int]:
    """(finished trajectories with a nonzero own-node advantage, finished trajectories)."""
    trees = _check_trees(trees)
    if len(advantages) != len(trees):
        raise ValueError(f"advantages must have one array per tree ({len(trees)}), got {len(advantages)}")
    total = useful = 0
    for i, (tree, adv) in enumerate(zip(trees, advantages, strict=True)):
        adv = np.asarray(adv, dtype=np.float64)
        if adv.shape != (len(tree.nodes),):
            raise ValueError(
                f"advantages[{i}] must have one value per node ({len(tree.nodes)}), got shape {adv.shape}"
            )
        if not np.all(np.isfinite(adv[1:])):
            raise ValueError(f"advantages[{i}] has non-finite values on generated nodes")
        for traj in tree.trajectories:
            if traj.finished:
                total += 1
                useful += bool(np.any(np.abs(adv[traj.nodes]) > ADVANTAGE_TOL))
    return useful, total


@dataclass(frozen=True)
class ContrastCounts:
    """The counts behind a step's contrast ratios, so that ratios over several steps (or seeds) are
    pooled as counts (``a + b``: the field-wise sum), and intervals drawn from them, instead of
    averaging ratios.

    Beside the rollouts, two costs a user pays: the **generated tokens** (model-written tokens of
    the trees, each node once: with prefix caching, what generation time follows) and the
    **rollout seconds** (wall time of the rollout phase that grew the trees — the executor's whole
    run: generation, tool steps and prefix scoring, not engine time alone, since a method that
    spends more on scoring prefixes pays for it). ``contrastive`` counts method §7's contrastive
    yield without its per-100 scaling: finished trajectories with a nonzero advantage on a node
    of their own. The seconds and that count are None where they were not measured (trees alone
    give neither); a pool with one None part is None, and its ratios are NaN."""

    activated: int  # prompts with at least one finished trajectory
    mixed: int  # of those, prompts whose tree holds both a success and a failure (a mixed group)
    expanded_anchors: int  # anchors that received continuations
    mixed_anchors: int  # of those, anchors whose branch group holds both outcomes
    trajectories: int  # finished trajectories (bare rollouts and continuations): the rollouts spent
    generated_tokens: int = 0  # model-written tokens of the trees (each node once)
    rollout_s: float | None = None  # wall time of the rollout phase that grew the trees
    contrastive: int | None = None  # finished trajectories with |A| > 1e-9 on an own node

    def __add__(self, other: ContrastCounts) -> ContrastCounts:
        if not isinstance(other, ContrastCounts):
            return NotImplemented

        def either(a, b):
            return None if a is None or b is None else a + b

        return ContrastCounts(
            self.activated + other.activated, self.mixed + other.mixed,
            self.expanded_anchors + other.expanded_anchors, self.mixed_anchors + other.mixed_anchors,
            self.trajectories + other.trajectories, self.generated_tokens + other.generated_tokens,
            either(self.rollout_s, other.rollout_s), either(self.contrastive, other.contrastive))

    @property
    def mixed_per_100_rollouts(self) -> float:
        """Mixed groups per 100 rollouts spent (NaN with no rollout)."""
        return 100.0 * self.mixed / self.trajectories if self.trajectories else float("nan")

    @property
    def rollouts_per_mixed_group(self) -> float:
        """Rollouts spent per mixed group: the price of one informative group (NaN with none)."""
        return self.trajectories / self.mixed if self.mixed else float("nan")

    @property
    def mixed_per_1k_tokens(self) -> float:
        """Mixed groups per 1,000 generated tokens (NaN with no token)."""
        return per_exposure(self.mixed, self.generated_tokens, 1000.0)

    @property
    def contrastive_per_1k_tokens(self) -> float:
        """Contrastive yield per 1,000 generated tokens: trajectories with a nonzero own-node
        advantage per 1,000 tokens (NaN with no token or no advantages)."""
        return float("nan") if self.contrastive is None else per_exposure(self.contrastive, self.generated_tokens,
                                                                         1000.0)

    @property
    def mixed_per_rollout_s(self) -> float:
        """Mixed groups per second of rollout wall time (NaN unmeasured or zero)."""
        return float("nan") if self.rollout_s is None else per_exposure(self.mixed, self.rollout_s)


def contrast_counts(trees: Sequence[RolloutTree], advantages: Sequence[ArrayLike] | None = None,
                    rollout_s: float | None = None) -> ContrastCounts:
    """:class:`ContrastCounts` of one step's trees (the numerators and denominators of
    :func:`effective_ratio` and :func:`prefix_effective_ratio`, and the trees' generated tokens).
    ``advantages`` (one per-node array per tree, as :func:`contrastive_yield` takes) gives the
    contrastive count; ``rollout_s`` is the rollout phase's wall time, which trees do not hold."""
    activated = mixed = anchors = mixed_anchors = trajectories = tokens = 0
    for tree in _check_trees(trees):
        o = tree.outcomes()
        trajectories += int(o.size)
        tokens += tree.num_generated_tokens()
        if o.size:
            activated += 1
            mixed += is_mixed(o)
        for anchor in tree.expanded_anchors():
            group = [tree.trajectories[j] for j in tree.branch_group(anchor)]
            anchors += 1
            mixed_anchors += is_mixed(np.array([tree.trajectory_reward(t.id) for t in group if t.finished]))
    contrastive = None if advantages is None else _contrastive_rollouts(trees, advantages)[0]
    if rollout_s is not None and not (math.isfinite(rollout_s) and rollout_s >= 0):
        raise ValueError(f"rollout_s must be a finite number of seconds >= 0, got {rollout_s}")
    return ContrastCounts(activated, mixed, anchors, mixed_anchors, trajectories, tokens,
                          None if rollout_s is None else float(rollout_s), contrastive)


def per_exposure(count: float, exposure: float, per: float = 1.0) -> float:
    """``per * count / exposure``: a count per unit of what it cost (NaN when nothing was spent)."""
    return per * count / exposure if exposure > 0 else float("nan")


WILSON_Z90 = 1.6448536269514722  # two-sided 90%: the standard normal's 95th percentile


def wilson_interval(successes: int, n: int, z: float = WILSON_Z90) -> tuple[float, float]:
    """Wilson score interval for a binomial share ``successes / n`` (90% by default); (NaN, NaN)
    when ``n == 0``. Unlike the normal approximation it stays inside [0, 1] and is sensible at
    0 and n, which small per-run counts of mixed groups often are."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return float("nan"), float("nan")
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def rate_interval(count: int, exposure: float, per: float = 1.0, z: float = WILSON_Z90) -> tuple[float, float]:
    """Score interval (90% by default) for a rate ``per * count / exposure`` — mixed groups per
    1,000 generated tokens, say — treating ``count`` as Poisson given the exposure spent: the
    λ·E with (count − λ·E)² = z²·λ·E, i.e. ``count + z²/2 ± z·sqrt(count + z²/4)``, divided by
    the exposure. It is Wilson's interval with the Poisson variance in place of the binomial
    one: it stays above 0 and is sensible at count 0. The exposure (tokens, seconds) is taken as
    measured, not drawn. Mixed groups are a sum of independent per-prompt outcomes, whose
    variance is at most the Poisson one, so the interval is if anything wide; a count whose units
    move together — the trajectories of one mixed group carry a nonzero advantage together — is
    more dispersed than Poisson, and this interval would be too narrow for it. (NaN, NaN) when
    nothing was spent."""
    if count < 0 or int(count) != count:
        raise ValueError(f"count must be a non-negative integer, got {count}")
    if not exposure > 0:
        return float("nan"), float("nan")
    half = z * math.sqrt(count + z * z / 4)
    centre = count + z * z / 2
    low = 0.0 if count == 0 else max(0.0, centre - half)  # exactly 0 at count 0, free of rounding
    return float(per * low / exposure), float(per * (centre + half) / exposure)


@dataclass(frozen=True)
class PassAt1:
    """pass@1 over questions with its standard error, the question as the unit: k samples of one
    question are correlated (they share its difficulty), so the pooled binomial interval over all
    n·k samples is too narrow; the spread of the n per-question rates is not."""

    value: float  # mean over questions of successes / k
    se: float  # standard deviation of the per-question rates / sqrt(n)
    questions: int  # n


def pass_at_1(successes: dict[str, int], samples: int) -> PassAt1:
    """pass@1 of per-question success counts out of ``samples``, SE by question (:class:`PassAt1`)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    rates = np.array([s / samples for s in successes.values()], dtype=float)
    if rates.size == 0:
        raise ValueError("successes must hold at least one question")
    if ((rates < 0) | (rates > 1)).any():
        raise ValueError(f"every count must lie in [0, {samples}]")
    se = float(rates.std(ddof=1) / np.sqrt(rates.size)) if rates.size > 1 else float("nan")
    return PassAt1(float(rates.mean()), se, int(rates.size))


def paired_pass_difference(a: dict[str, int], a_samples: int, b: dict[str, int], b_samples: int) -> PassAt1:
    """pass@1 of ``a`` minus that of ``b``, paired by question: the mean over the questions both
    measured of (rate_a − rate_b), and the SE of that mean. Pairing removes the questions' own
    difficulty from the error, which two independent intervals would count twice. Both must
    measure the same questions (a ValueError names those only one has)."""
    if set(a) != set(b):
        only = sorted(set(a) ^ set(b))
        raise ValueError(f"the two measurements must cover the same questions; {len(only)} differ, e.g. {only[:3]}")
    if a_samples < 1 or b_samples < 1:
        raise ValueError(f"samples must be >= 1, got {a_samples} and {b_samples}")
    rates = np.array([a[q] / a_samples - b[q] / b_samples for q in sorted(a)], dtype=float)
    if rates.size == 0:
        raise ValueError("the measurements must hold at least one question")
    se = float(rates.std(ddof=1) / np.sqrt(rates.size)) if rates.size > 1 else float("nan")
    return PassAt1(float(rates.mean()), se, int(rates.size))


# ---------------------------------------------------------------------------- predictor
def spearman(pred: ArrayLike, target: ArrayLike) -> float:
    """Spearman rank correlation of ``pred`` and ``target`` (ties take average ranks).

    Pairs where either value is NaN are dropped. NaN when fewer than two pairs remain or either
    side is constant (the correlation is undefined there)."""
    p = np.asarray(pred, dtype=np.float64).ravel()
    t = np.asarray(target, dtype=np.float64).ravel()
    if p.shape != t.shape:
        raise ValueError(f"pred ({p.size}) and target ({t.size}) must have the same length")
    keep = ~(np.isnan(p) | np.isnan(t))
    p, t = p[keep], t[keep]
    if p.size < 2 or np.ptp(p) == 0 or np.ptp(t) == 0:
        return float("nan")
    return float(stats.spearmanr(p, t).statistic)


@dataclass(frozen=True)
class PredictorSpearman:
    """method §5/§7 diagnostic: rank correlation of predicted and tree-backed values."""

    root: float  # over prompt roots (one pair per tree)
    prefix: float  # over internal nodes with >= min_leaves leaves below
    num_roots: int  # pairs that entered each correlation
    num_prefixes: int


def root_and_prefix_pairs(
    trees: Sequence[RolloutTree], predictions: Sequence[ArrayLike], min_leaves: int = 2
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``((pred, target) at roots, (pred, target) at prefixes)``, target = method §5's ``V̂``.

    ``predictions[i]`` holds the predictor's value for each node of tree ``i`` (NaN where it was
    not scored). Prefixes are the non-root, non-terminal nodes with at least ``min_leaves``
    leaves below — by default method §5's informative internal nodes; a prefix with one leaf has
    a single 0/1 outcome as its target. Pairs with a NaN on either side are dropped.
    """
    trees = _check_trees(trees)
    if len(predictions) != len(trees):
        raise ValueError(f"predictions must have one array per tree ({len(trees)}), got {len(predictions)}")
    if min_leaves < 1:
        raise ValueError(f"min_leaves must be >= 1, got {min_leaves}")
    root_p, root_t, pre_p, pre_t = [], [], [], []
    for i, (tree, pred) in enumerate(zip(trees, predictions, strict=True)):
        pred = np.asarray(pred, dtype=np.float64)
        if pred.shape != (len(tree.nodes),):
            raise ValueError(
                f"predictions[{i}] must have one value per node ({len(tree.nodes)}), got shape {pred.shape}"
            )
        target, leaves = tree.tree_values(), tree.leaf_counts()
        root_p.append(pred[ROOT])
        root_t.append(target[ROOT])
        for n in tree.nodes[1:]:
            if not n.terminal and leaves[n.id] >= min_leaves:
                pre_p.append(pred[n.id])
                pre_t.append(target[n.id])

    def finite(p: list[float], t: list[float]) -> tuple[np.ndarray, np.ndarray]:
        pa, ta = np.array(p, dtype=np.float64), np.array(t, dtype=np.float64)
        keep = ~(np.isnan(pa) | np.isnan(ta))
        return pa[keep], ta[keep]

    return finite(root_p, root_t), finite(pre_p, pre_t)


def predictor_spearman(
    trees: Sequence[RolloutTree], predictions: Sequence[ArrayLike], min_leaves: int = 2
) -> PredictorSpearman:
    """Spearman between predictions and ``V̂``, separately at prompt roots and at prefixes
    (see :func:`root_and_prefix_pairs` for which nodes count)."""
    (rp, rt), (pp, pt) = root_and_prefix_pairs(trees, predictions, min_leaves)
    return PredictorSpearman(
        root=spearman(rp, rt), prefix=spearman(pp, pt), num_roots=rp.size, num_prefixes=pp.size
    )


# ---------------------------------------------------------------------------- allocation
@dataclass(frozen=True)
class AllocationStats:
    """method §7's allocation histograms and budget for one step (method §8 reports the paper's)."""

    pool_size: int  # candidate prompts
    skipped_share: float  # share of the pool with m = 0 (NaN for an empty pool)
    mean_m_selected: float  # bare rollouts per selected prompt (NaN if none selected)
    mean_rollouts_selected: float  # bare rollouts + continuations per selected prompt
    m_histogram: np.ndarray  # int64, m_histogram[k] = prompts with m = k, k = 0..max(m)
    position_bin_edges: np.ndarray  # float64, n_bins + 1 edges over [0, 1]
    k_by_position: np.ndarray  # int64, continuations allocated to anchors in each bin
    anchors_by_position: np.ndarray  # int64, anchors in each bin (expanded or not)
    budget_trajectories: int  # Σ m + Σ K
    generated_tokens: int | None  # model-written tokens of the given trees (None without trees)

    @property
    def k_share_by_position(self) -> np.ndarray:
        """Share of the prefix budget per position bin (NaN where no continuation was given)."""
        total = self.k_by_position.sum()
        return self.k_by_position / total if total else np.full(self.k_by_position.shape, np.nan)


def anchor_allocation(trees: Sequence[RolloutTree]) -> tuple[np.ndarray, np.ndarray]:
    """Realised ``(K, relative position)`` per anchor, read from the trees.

    ``K`` counts the continuations started at each anchor (all anchors listed, K = 0 included);
    the position is ``t / T`` in (0, 1). A tree whose root received continuations (method §3's
    extra root rollouts for an anchorless prompt) contributes one entry at position 0.
    """
    ks: list[int] = []
    positions: list[float] = []
    for tree in _check_trees(trees):
        starts: dict[int, int] = {}
        for traj in tree.trajectories:
            if traj.kind == "continuation":
                starts[traj.branch_node] = starts.get(traj.branch_node, 0) + 1
        if starts.get(ROOT):
            ks.append(starts[ROOT])
            positions.append(0.0)
        for a in tree.anchors():
            ks.append(starts.get(a, 0))
            positions.append(tree.relative_position(a))
    return np.array(ks, dtype=np.int64), np.array(positions, dtype=np.float64)


def allocation_stats(
    m: ArrayLike,
    anchor_k: ArrayLike,
    anchor_position: ArrayLike,
    trees: Sequence[RolloutTree] | None = None,
    n_position_bins: int = 5,
) -> AllocationStats:
    """Allocation histograms and budget of one step.

    ``m``: root rollouts per pool prompt (0 = skipped). ``anchor_k`` / ``anchor_position``: K and
    relative turn position ``t/T`` per anchor of the selected prompts (position 0 = the root of
    an anchorless prompt; see :func:`anchor_allocation`). Positions are binned into
    ``n_position_bins`` equal bins over [0, 1). ``trees``, if given, supplies the generated-token
    count. "Mean m" is reported both without continuations (bare rollouts only) and with them,
    since the paper does not say which it reports (method §8).
    """
    m_arr = _int_array(m, "m")
    k_arr = _int_array(anchor_k, "anchor_k")
    pos = np.asarray(anchor_position, dtype=np.float64).ravel()
    if pos.shape != k_arr.shape:
        raise ValueError(
            f"anchor_position ({pos.size}) and anchor_k ({k_arr.size}) must have the same length"
        )
    if np.any(~np.isfinite(pos)) or np.any((pos < 0) | (pos >= 1)):
        raise ValueError("anchor_position values must lie in [0, 1) (t/T with t < T; 0 = root)")
    if n_position_bins < 1:
        raise ValueError(f"n_position_bins must be >= 1, got {n_position_bins}")
    selected = m_arr > 0
    n_selected = int(selected.sum())
    edges = np.linspace(0.0, 1.0, n_position_bins + 1)
    bin_of = np.minimum((pos * n_position_bins).astype(np.int64), n_position_bins - 1)
    total_k = int(k_arr.sum())
    tokens = None if trees is None else sum(t.num_generated_tokens() for t in _check_trees(trees))
    return AllocationStats(
        pool_size=m_arr.size,
        skipped_share=float(np.mean(~selected)) if m_arr.size else float("nan"),
        mean_m_selected=float(m_arr[selected].mean()) if n_selected else float("nan"),
        mean_rollouts_selected=(int(m_arr.sum()) + total_k) / n_selected if n_selected else float("nan"),
        m_histogram=np.bincount(m_arr, minlength=1).astype(np.int64),
        position_bin_edges=edges,
        k_by_position=np.bincount(bin_of, weights=k_arr, minlength=n_position_bins).astype(np.int64),
        anchors_by_position=np.bincount(bin_of, minlength=n_position_bins).astype(np.int64),
        budget_trajectories=int(m_arr.sum()) + total_k,
        generated_tokens=tokens,
    )


# ---------------------------------------------------------------------------- rewards
@dataclass(frozen=True)
class RewardStats:
    """Outcome statistics over finished trajectories (NaN fields when there are none)."""

    num_trajectories: int
    mean_reward: float
    accuracy: float  # share of successes (reward > 0.5)
    mean_response_tokens: float  # model-written tokens on the root→leaf path (shared prefix included)
    mean_turns: float  # depth of the leaf
    tool_error_rate: float  # share of generated turn nodes with a truthy info["tool_error"]


TrajectoryKind = Literal["all", "bare", "continuation"]


def reward_stats(trees: Sequence[RolloutTree], kind: TrajectoryKind = "all") -> RewardStats:
    """Rewards, accuracy, response length, turns and tool errors of the finished trajectories of
    ``kind``. ``"bare"`` gives the on-policy view (continuations start from chosen prefixes,
    so their outcomes are conditioned). Tool errors are counted over the trajectories' own
    nodes, from the node ``info`` key ``"tool_error"``."""
    if kind not in ("all", "bare", "continuation"):
        raise ValueError(f"kind must be 'all', 'bare' or 'continuation', got {kind!r}")
    rewards: list[float] = []
    lengths: list[int] = []
    turns: list[int] = []
    own_nodes = tool_errors = 0
    for tree in _check_trees(trees):
        for traj in tree.trajectories:
            if traj.leaf is None or (kind != "all" and traj.kind != kind):
                continue
            rewards.append(tree.trajectory_reward(traj.id))
            lengths.append(sum(sum(tree.nodes[n].loss_mask) for n in tree.path(traj.leaf)))
            turns.append(tree.nodes[traj.leaf].depth)
            own_nodes += len(traj.nodes)
            tool_errors += sum(bool(tree.nodes[n].info.get("tool_error")) for n in traj.nodes)
    if not rewards:
        nan = float("nan")
        return RewardStats(0, nan, nan, nan, nan, nan)
    r = np.array(rewards)
    return RewardStats(
        num_trajectories=len(rewards),
        mean_reward=float(r.mean()),
        accuracy=float(is_success(r).mean()),
        mean_response_tokens=float(np.mean(lengths)),
        mean_turns=float(np.mean(turns)),
        tool_error_rate=tool_errors / own_nodes,
    )


# ---------------------------------------------------------------------------- checks
def _int_array(values: ArrayLike, name: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        raise ValueError(f"{name} must hold non-negative integers") from None
    if not (np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)) and np.all(arr >= 0)):
        raise ValueError(f"{name} must hold non-negative integers")
    return arr.astype(np.int64)


# ---------------------------------------------------------------------------- one step
def step_metrics(
    trees: Sequence[RolloutTree],
    kept: Sequence[bool],
    trained_advantages: Sequence[ArrayLike],
    allocation: AllocationStats,
    rounds: int = 1,
    rollout_s: float | None = None,
) -> dict[str, float]:
    """method §7's figures of one step, by the names the trainer logs and the simulator reports.

    ``trees``: every tree the step sampled; ``kept``: per tree, whether the policy trains on it
    (False: dropped by a round rule's group filter); ``trained_advantages``: the estimator's
    output on the kept trees, in order; ``allocation``: the step's :class:`AllocationStats`;
    ``rounds``: sampling rounds of the bare rollouts; ``rollout_s``: the rollout phase's wall time
    (see :class:`ContrastCounts`), which adds ``contrast/mixed_per_rollout_s`` (a simulator has
    none and omits it).

    The figures count **every rollout spent**: a dropped group counts in the effective ratio and
    the rollouts (it was paid for), and the price of a mixed group divides every rollout spent
    by the mixed groups the policy trains on. A dropped tree yields no learning signal, so its
    advantages are 0 in the contrastive yield. The same holds per generated token and per
    rollout second: ``contrast/mixed_per_1k_tokens`` is the mixed groups trained on per 1,000
    tokens of every tree, ``contrast/yield_per_1k_tokens`` the trajectories with a nonzero
    own-node advantage (``counts/contrastive_rollouts``) per 1,000 of them."""
    trees = _check_trees(trees)
    kept = [bool(k) for k in kept]
    if len(kept) != len(trees):
        raise ValueError(f"kept must have one flag per tree ({len(trees)}), got {len(kept)}")
    adv = iter(trained_advantages)
    all_adv = [next(adv) if k else np.zeros(len(t.nodes)) for t, k in zip(trees, kept, strict=True)]
    if next(adv, None) is not None:
        raise ValueError(f"trained_advantages must have one array per kept tree ({sum(kept)}), got more")
    rs_all, rs_bare = reward_stats(trees, "all"), reward_stats(trees, "bare")
    counts = contrast_counts(trees, all_adv, rollout_s)
    trained = contrast_counts([t for t, k in zip(trees, kept, strict=True) if k])
    # every rollout, token and second spent, over the mixed groups the policy trains on
    paid = replace(counts, mixed=trained.mixed)
    dropped = [t for t, k in zip(trees, kept, strict=True) if not k]
    spent = counts.trajectories
    metrics = {
        "effective_ratio": effective_ratio(trees),
        "prefix_effective_ratio": prefix_effective_ratio(trees),
        "contrastive_yield": 100.0 * counts.contrastive / spent if spent else float("nan"),
        "mixed_groups_per_100_rollouts": paid.mixed_per_100_rollouts,
        "rollouts_per_mixed_group": paid.rollouts_per_mixed_group,
        "contrast/mixed_per_1k_tokens": paid.mixed_per_1k_tokens,
        "contrast/yield_per_1k_tokens": counts.contrastive_per_1k_tokens,
        "counts/contrastive_rollouts": float(counts.contrastive),
        "counts/activated": float(counts.activated),
        "counts/mixed_groups": float(counts.mixed),
        "counts/mixed_groups_trained": float(trained.mixed),
        "counts/dropped_groups": float(len(dropped)),
        "counts/dropped_rollouts": float(sum(len(t.outcomes()) for t in dropped)),
        "counts/expanded_anchors": float(counts.expanded_anchors),
        "counts/mixed_anchors": float(counts.mixed_anchors),
        "counts/rollouts": float(spent),
        "alloc/skipped_share": allocation.skipped_share,
        "alloc/mean_m_selected": allocation.mean_m_selected,
        "alloc/mean_rollouts_selected": allocation.mean_rollouts_selected,
        "alloc/rounds": float(rounds),
        "reward/mean": rs_all.mean_reward,
        "reward/accuracy_bare": rs_bare.accuracy,
        "reward/response_tokens": rs_all.mean_response_tokens,
        "reward/turns": rs_all.mean_turns,
        "reward/tool_error_rate": rs_all.tool_error_rate,
    }
    if rollout_s is not None:
        metrics["contrast/mixed_per_rollout_s"] = paid.mixed_per_rollout_s
    for b, k in enumerate(allocation.k_by_position):
        metrics[f"alloc/k_position_bin{b}"] = float(k)
    return metrics
