"""The simulator (trace_core/sim/): determinism, the martingale, absorption, shared horizons,
equal budgets across the method registry, the no-anchor rule, and out-of-sample scoring."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from trace_core.allocation import BudgetSpec, GresoRoots, allocate_roots_beta
from trace_core.costs import depth_correction
from trace_core.history import GresoConfig, PosteriorConfig, PromptHistory, beta_posterior, greso_state
from trace_core.methods import METHODS, Method, get_method
from trace_core.metrics import allocation_stats, anchor_allocation, effective_ratio, spearman, step_metrics
from trace_core.sim import (
    HistoryBatch,
    LearnedPredictor,
    NoisyPredictor,
    OraclePredictor,
    PersistentPool,
    PersistentPoolConfig,
    SimConfig,
    expected_rollout_tokens,
    make_predictor,
    martingale_step,
    path_tokens,
    run_step,
    sim_token_ledger,
    simulate_paths,
    supervised_histories,
    tree_histories,
)
from trace_core.token_budget import PrefixCalibration
from trace_core.tree import ROOT, RolloutTree

SMALL = BudgetSpec(roots_M=64, expansion_N=2)


def _step(method="trace", predictor=None, seed=0, spec=SMALL, config=None):
    return run_step(method, spec, predictor or OraclePredictor(), np.random.default_rng(seed), config)


def _fingerprint(result):
    return (
        [t.to_json() for t in result.trees],
        result.pool_m.tolist(),
        result.anchor_K.tolist(),
        result.pool_pred.tolist(),
        result.anchor_pred.tolist(),
        {k: (None if np.isnan(v) else v) for k, v in result.metrics.items()},
    )


# ---------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("kind", ["oracle", "noisy", "learned"])
def test_same_seed_same_step(kind):
    runs = []
    for _ in range(2):
        predictor = make_predictor(kind, seed=3)
        rng = np.random.default_rng(11)
        runs.append([_fingerprint(run_step("trace", SMALL, predictor, rng)) for _ in range(2)])
    assert runs[0] == runs[1]


def test_different_seed_different_step():
    assert _fingerprint(_step(seed=1)) != _fingerprint(_step(seed=2))


# ---------------------------------------------------------------------------- the environment
def test_martingale_mean_of_final_value_and_reward():
    rng = np.random.default_rng(0)
    config = SimConfig()
    n = 60_000
    for v_t, t, horizon in [(0.3, 1, 8), (0.7, 4, 6), (0.05, 0, 3), (0.5, 2, 8)]:
        paths = simulate_paths(
            np.full(n, v_t), np.full(n, t, dtype=np.int64), np.full(n, horizon, dtype=np.int64), config, rng
        )
        v_final = paths.values[:, horizon]
        se = v_final.std() / np.sqrt(n)
        assert abs(v_final.mean() - v_t) < 5 * se + 1e-12
        assert abs(paths.reward.mean() - v_t) < 5 * np.sqrt(v_t * (1 - v_t) / n)
        # the spread grows along the path: the contrast potential is really spent
        assert v_final.std() > 0.1


def test_one_step_is_unbiased_and_noisy():
    rng = np.random.default_rng(1)
    v = np.repeat([0.1, 0.5, 0.9], 50_000)
    nxt = martingale_step(v, 6.0, rng)
    for x in (0.1, 0.5, 0.9):
        sel = nxt[v == x]
        assert abs(sel.mean() - x) < 5 * sel.std() / np.sqrt(sel.size)
        # Var of Beta(κv, κ(1−v)) is v(1−v)/(κ+1)
        assert sel.var() == pytest.approx(x * (1 - x) / 7.0, rel=0.05)


def test_zero_and_one_are_absorbing():
    rng = np.random.default_rng(2)
    assert martingale_step(np.array([0.0, 1.0, 0.0]), 6.0, rng).tolist() == [0.0, 1.0, 0.0]
    n = 1000
    paths = simulate_paths(
        np.r_[np.zeros(n), np.ones(n)], np.zeros(2 * n, dtype=np.int64), np.full(2 * n, 8), SimConfig(), rng
    )
    assert np.all(paths.values[:n] == 0.0) and np.all(paths.reward[:n] == 0.0)
    assert np.all(paths.values[n:] == 1.0) and np.all(paths.reward[n:] == 1.0)


def test_absorption_along_every_simulated_path():
    result = _step("trace", spec=BudgetSpec(256, 2), seed=4)
    hits = 0
    for tree, values in zip(result.trees, result.node_value, strict=True):
        assert values.shape == (len(tree.nodes),)
        for traj in tree.trajectories:
            path = tree.path(traj.leaf)[1:]
            v = [values[n] for n in path]
            for a, b in zip(v, v[1:], strict=False):
                if a in (0.0, 1.0):
                    hits += 1
                    assert b == a
            # a path absorbed at 0 (1) can only fail (succeed)
            if v[-1] in (0.0, 1.0):
                assert tree.trajectory_reward(traj.id) == v[-1]
    assert hits > 0  # the check above was exercised


def test_horizon_is_shared_by_every_path_of_a_prompt():
    result = _step("trace", spec=BudgetSpec(256, 6), seed=5)
    continuations = 0
    for tree in result.trees:
        T = tree.root.info["horizon"]
        assert {tree.nodes[leaf].depth for leaf in tree.leaves()} == {T}
        continuations += sum(t.kind == "continuation" for t in tree.trajectories)
    assert continuations == 256 * 6


# ---------------------------------------------------------------------------- budgets
# a method whose prefix rule reads the entropy of the policy's tokens (ARPO) has no reading here: refused below
@pytest.mark.parametrize("method", sorted(n for n, m in METHODS.items() if not (m.prices_tokens or m.reads_entropy)))
@pytest.mark.parametrize("shape", [(64, 2), (64, 6), (128, 0)])
def test_every_method_spends_exactly_the_equal_budget(method, shape):
    spec = BudgetSpec(*shape)
    result = run_step(method, spec, OraclePredictor(), np.random.default_rng(6))
    trees = result.trees
    spent = sum(len(t.trajectories) for t in trees)
    assert spent == result.trajectories
    if METHODS[method].samples_in_rounds:  # it spends what its rounds sample, within its own limits
        rule = METHODS[method].group_filter
        limits = rule.limits(spec)
        if limits.max_rollouts is not None:
            assert spent <= limits.max_rollouts
        # the rounds stop at the target, at a cap, or when the candidates run out (i.i.d.: no filter)
        assert (result.metrics["counts/mixed_groups_trained"] == rule.target_groups(spec)
                or spent == limits.max_rollouts or result.rounds == limits.max_rounds
                or (result.pool_m > 0).all())
    else:
        assert spent == spec.total
    bare = sum(t.kind == "bare" for tree in trees for t in tree.trajectories)
    assert bare == int(result.pool_m.sum())
    assert int(result.pool_m.sum() + result.anchor_K.sum() + result.root_extra.sum()) == spent
    assert result.pool_m.size == spec.pool_size
    if METHODS[method].samples_in_rounds:
        assert bare == spent and result.anchor_K.sum() == 0
    elif METHODS[method].expands:
        assert bare == spec.roots_M
        # K is spent within each prompt: m_i·N continuations for prompt i
        for tree, i in zip(trees, result.tree_prompt, strict=True):
            cont = sum(t.kind == "continuation" for t in tree.trajectories)
            assert cont == result.pool_m[i] * spec.expansion_N
    else:
        assert bare == spec.total and result.anchor_K.sum() == 0


def test_a_method_that_reads_the_policys_entropy_is_refused():
    """ARPO branches on the entropy of the tokens written after a tool result; the simulator's paths
    have none, so it refuses the method rather than invent a signal (method §4, ARPO)."""
    assert [n for n, m in METHODS.items() if m.reads_entropy] == ["arpo"]
    with pytest.raises(ValueError, match="reads entropy.*cannot run it"):
        run_step("arpo", BudgetSpec(64, 1), OraclePredictor(), np.random.default_rng(0))


def test_oracle_trace_beats_grpo_on_effective_ratio():
    spec = BudgetSpec(256, 2)
    grpo = [_step("grpo", spec=spec, seed=s).metrics["effective_ratio"] for s in range(3)]
    trace = [_step("trace", spec=spec, seed=s).metrics["effective_ratio"] for s in range(3)]
    assert np.mean(trace) > 2.0 * np.mean(grpo)


# ---------------------------------------------------------------------------- no-anchor rule
def test_anchorless_prompts_spend_their_prefix_budget_at_the_root():
    config = SimConfig(horizon_min=1, horizon_max=1)  # every rollout ends after one turn
    result = _step("trace", config=config, seed=7)
    assert result.anchor_K.size == 0
    selected = result.pool_m > 0
    assert np.array_equal(result.root_extra[selected], result.pool_m[selected] * SMALL.expansion_N)
    assert result.root_extra[~selected].sum() == 0
    for tree in result.trees:
        conts = [t for t in tree.trajectories if t.kind == "continuation"]
        assert conts and all(t.branch_node == ROOT for t in conts)
    assert result.trajectories == SMALL.total


def test_no_anchor_rule_applies_only_to_anchorless_prompts():
    config = SimConfig(horizon_min=1, horizon_max=3)
    result = _step("treepo", config=config, seed=8, spec=BudgetSpec(128, 2))
    horizons = {
        int(i): tree.root.info["horizon"] for tree, i in zip(result.trees, result.tree_prompt, strict=True)
    }
    assert 1 in horizons.values() and any(h > 1 for h in horizons.values())
    for i, h in horizons.items():
        k_here = result.anchor_K[result.anchor_prompt == i].sum()
        if h == 1:
            assert result.root_extra[i] == result.pool_m[i] * 2 and k_here == 0
        else:
            assert result.root_extra[i] == 0 and k_here == result.pool_m[i] * 2


# ---------------------------------------------------------------------------- predictors
def test_learned_predictor_is_scored_before_it_trains():
    predictor = LearnedPredictor(horizon_max=SimConfig().horizon_max)
    rng = np.random.default_rng(9)
    run_step("trace", SMALL, predictor, rng)  # one step so that the model is no longer at init
    before = copy.deepcopy(predictor)
    result = run_step("trace", SMALL, predictor, rng)
    assert predictor.updates == 2
    for tree, i in zip(result.trees, result.tree_prompt, strict=True):
        anchors = result.anchor_node[result.anchor_prompt == i]
        hist = tree_histories(tree, [ROOT, *anchors.tolist()], SimConfig().horizon_max)
        recorded = np.r_[result.pool_pred[i], result.anchor_pred[result.anchor_prompt == i]]
        np.testing.assert_allclose(before.score(hist), recorded, rtol=0, atol=1e-12)
        # the trained model scores the same histories differently: the step's predictions were
        # made by the model that had not seen these trees
        assert np.max(np.abs(predictor.score(hist) - recorded)) > 1e-6


def test_learned_predictor_never_reads_the_hidden_value():
    predictor = LearnedPredictor()
    _step("trace", predictor=predictor, seed=10)
    result = _step("trace", predictor=predictor, seed=11)
    tree = result.trees[0]
    hist = tree_histories(tree, list(range(len(tree.nodes))), 8)
    fake_value = np.random.default_rng(0).random(len(hist))
    scrambled = HistoryBatch(hist.prompt_feature, hist.observations, hist.depth, fake_value)
    np.testing.assert_array_equal(predictor.score(hist), predictor.score(scrambled))


def test_learned_predictor_learns_the_value():
    predictor = make_predictor("learned", seed=1)
    rng = np.random.default_rng(12)
    spec = BudgetSpec(256, 2)
    first = run_step("trace", spec, predictor, rng).metrics
    for _ in range(5):
        last = run_step("trace", spec, predictor, rng).metrics
    assert last["spearman_anchor_vs_true"] > 0.7
    assert last["spearman_root_vs_true"] > 0.9
    assert last["spearman_anchor_vs_true"] > first["spearman_anchor_vs_true"]


def test_oracle_and_noisy_predictors():
    result = _step("trace", seed=13)
    np.testing.assert_array_equal(result.anchor_pred, result.anchor_value)
    np.testing.assert_array_equal(result.pool_pred, result.pool_value)
    for tree, values, i in zip(result.trees, result.node_value, result.tree_prompt, strict=True):
        assert values[ROOT] == result.pool_value[i]
        assert all("V" not in n.info and "p0" not in n.info for n in tree.nodes)  # the trees show no hidden value
        hist = tree_histories(tree, list(range(len(tree.nodes))), 8, values)
        np.testing.assert_array_equal(hist.true_value, values)
        assert np.isnan(tree_histories(tree, [ROOT], 8).true_value).all()
    v = result.anchor_value
    hist = HistoryBatch(np.zeros(v.size), np.full((v.size, 8), np.nan), np.ones(v.size, dtype=np.int64), v)
    rho = [spearman(NoisyPredictor(std, seed=0).score(hist), v) for std in (0.5, 4.0)]
    assert 1.0 > rho[0] > rho[1] > 0.3


def test_supervised_set_is_roots_and_nodes_with_two_leaves():
    result = _step("trace", seed=15)
    histories, targets = supervised_histories(result.trees, 8)
    expected_targets, expected_depths = [], []
    for tree in result.trees:
        leaves, v_hat = tree.leaf_counts(), tree.tree_values()
        for n in tree.nodes:
            if n.id == ROOT or (not n.terminal and leaves[n.id] >= 2):
                expected_targets.append(v_hat[n.id])
                expected_depths.append(n.depth)
    np.testing.assert_array_equal(targets, expected_targets)
    np.testing.assert_array_equal(histories.depth, expected_depths)
    assert (histories.depth > 0).any()  # expanded prefixes are supervised, not only roots
    # a history's observations are those of its own path, turn by turn
    tree = result.trees[0]
    node = max(tree.anchors(), key=lambda a: tree.nodes[a].depth)
    hist = tree_histories(tree, [node], 8)
    path_obs = [tree.nodes[n].info["obs"] for n in tree.path(node)[1:]]
    np.testing.assert_array_equal(hist.observations[0, : len(path_obs)], path_obs)
    assert np.isnan(hist.observations[0, len(path_obs) :]).all()


def test_learned_predictor_rejects_a_mismatched_horizon():
    result = _step("trace", seed=16)
    hist = tree_histories(result.trees[0], [ROOT], 8)
    with pytest.raises(ValueError, match="horizon_max"):
        LearnedPredictor(horizon_max=10).score(hist)


# ---------------------------------------------------------------------------- trees and metrics
def test_trees_round_trip_and_feed_the_metrics_unchanged():
    result = _step("trace", seed=14)
    again = [RolloutTree.from_json(t.to_json()) for t in result.trees]
    assert again == result.trees
    assert effective_ratio(again) == result.metrics["effective_ratio"]
    for tree in result.trees:
        assert all(not n.token_ids for n in tree.nodes)
        assert all(set(n.info) == {"obs"} for n in tree.nodes[1:])  # observables only: V stays beside the tree


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"difficulty_beta": 0.0}, "difficulty_beta"),
        ({"horizon_min": 0}, "horizon_min"),
        ({"horizon_min": 5, "horizon_max": 4}, "horizon_min"),
        ({"kappa": -1.0}, "kappa"),
        ({"observation_noise_std": -0.1}, "observation_noise_std"),
        ({"feature_clip": 0.7}, "feature_clip"),
    ],
)
def test_bad_config_is_a_value_error(kwargs, word):
    with pytest.raises(ValueError, match=word):
        SimConfig(**kwargs)


def test_bad_predictor_output_and_names():
    class OutOfRange:
        def score(self, histories):
            return np.full(len(histories), 1.5)

        def update(self, trees):
            return None

    with pytest.raises(ValueError, match="outside"):
        _step(predictor=OutOfRange())
    with pytest.raises(ValueError, match="unknown predictor"):
        make_predictor("psychic")
    with pytest.raises(ValueError, match="unknown allocation method"):
        _step(method="greedy")
    with pytest.raises(ValueError, match="logit_noise_std"):
        NoisyPredictor(-1.0)


# ---------------------------------------------------------------------------- persistent pool
def _persistent_run(method, steps, spec=SMALL, predictor=None, seed=0, pool_config=None):
    pool = PersistentPool(spec.pool_size, SimConfig(), pool_config, seed=seed)
    history = PromptHistory()
    predictor = predictor or OraclePredictor()
    results = [run_step(method, spec, predictor, np.random.default_rng([seed, s]), pool=pool, history=history)
               for s in range(steps)]
    return pool, history, results


def test_persistent_pool_walks_its_dataset_epoch_by_epoch_and_the_same_for_every_method():
    pool = PersistentPool(SMALL.pool_size, seed=3)
    E = pool.pool_config.dataset_factor
    for epoch in range(3):
        ids = np.concatenate([pool.candidate_ids(epoch * E + k) for k in range(E)])
        assert np.array_equal(np.sort(ids), np.arange(pool.size))  # every prompt once per epoch
    assert not np.array_equal(pool.candidate_ids(0), pool.candidate_ids(E))  # a fresh order each epoch
    a, _, ra = _persistent_run("grpo", 3)
    b, _, rb = _persistent_run("trace", 3)
    for x, y in zip(ra, rb, strict=True):  # common random numbers: the same candidates at every step
        assert np.array_equal(np.sort(x.pool_ids), np.sort(y.pool_ids))
    assert a.step == b.step == 3


def test_persistent_prompts_keep_horizon_and_feature_error_and_drift_with_training():
    cfg = PersistentPoolConfig(global_drift=0.1, learn_gain=0.5, drift_noise_std=0.0)
    pool = PersistentPool(32, pool_config=cfg, seed=1)
    ids, prompts = pool.candidates()
    np.testing.assert_array_equal(prompts.horizon, pool.horizon[ids])
    z = np.log(np.clip(prompts.p0, 1e-9, 1 - 1e-9)) - np.log1p(-np.clip(prompts.p0, 1e-9, 1 - 1e-9))
    np.testing.assert_allclose(prompts.feature - z, pool.feature_error[ids], atol=1e-9)
    before = pool.logit.copy()
    pool.advance(ids[:5])
    np.testing.assert_allclose(pool.logit - before, np.where(np.isin(np.arange(pool.size), ids[:5]), 0.6, 0.1))
    with pytest.raises(ValueError, match="distinct"):
        pool.advance(np.array([1, 1]))
    # the noise is a function of (seed, step): two pools with the same seed drift alike
    p1, p2 = PersistentPool(32, seed=2), PersistentPool(32, seed=2)
    p1.advance(np.zeros(0, dtype=np.int64))
    p2.advance(np.zeros(0, dtype=np.int64))
    np.testing.assert_array_equal(p1.logit, p2.logit)


def test_a_method_that_finds_mixed_groups_moves_the_pool_further():
    _, _, grpo = _persistent_run("grpo", 6, spec=BudgetSpec(128, 2))
    _, _, trace = _persistent_run("trace", 6, spec=BudgetSpec(128, 2))
    assert trace[-1].pool_success > grpo[-1].pool_success
    assert trace[-1].metrics["pool_success"] == trace[-1].pool_success


def test_history_records_the_bare_root_outcomes_with_the_predictions_used():
    _, history, results = _persistent_run("trace", 2)
    r = results[1]
    for tree, i in zip(r.trees, r.tree_prompt, strict=True):
        events = history.events(int(r.pool_ids[i]))
        assert events[-1].step == 1 and events[-1].prediction == r.pool_pred[i]
        bare = [tree.trajectory_reward(t.id) for t in tree.trajectories if t.kind == "bare"]
        assert (events[-1].successes, events[-1].failures) == (sum(x > 0.5 for x in bare), sum(x <= 0.5 for x in bare))
    with pytest.raises(ValueError, match="persistent pool"):
        run_step("trace", SMALL, OraclePredictor(), np.random.default_rng(0), history=PromptHistory())


def test_posterior_roots_read_the_history_of_their_own_candidates():
    spec = SMALL
    pool = PersistentPool(spec.pool_size, seed=4)
    history, predictor = PromptHistory(), NoisyPredictor(1.0, seed=0)
    for s in range(3):
        rng = np.random.default_rng([4, s])
        if s == 2:  # replay the allocation from the same state and generator
            probe = np.random.default_rng([4, s])
            ids = pool.candidate_ids()[probe.permutation(spec.pool_size)]
            view = history.view(ids, pool.step)
        result = run_step("trace-posterior", spec, predictor, rng, pool=pool, history=history)
    alpha, beta = beta_posterior(view, result.pool_pred, PosteriorConfig())
    assert (view.count > 0).any()
    np.testing.assert_array_equal(result.pool_ids, ids)
    np.testing.assert_array_equal(result.pool_m, allocate_roots_beta(alpha, beta, spec.roots_M, spec.max_per_prompt))


def test_greso_skips_prompts_it_saw_uniform():
    spec = BudgetSpec(128, 0)

    def selected_uniform_share(method):
        _, history, results = _persistent_run(method, 10, spec=spec)
        hits = seen = 0
        for step, r in enumerate(results):
            for pid in r.pool_ids[r.pool_m > 0].tolist():
                past = [e for e in history.events(pid) if e.step < step]
                if past:
                    seen += 1
                    hits += past[-1].successes == 0 or past[-1].failures == 0
        return hits / seen, seen

    # a filtered prompt is never re-admitted
    strict_rule = GresoRoots(GresoConfig(initial_p_easy=0.0, initial_p_hard=0.0, p_min=0.0, min_keep_probability=0.0))
    strict = Method("greso-strict", strict_rule, None, "")
    greso, n_greso = selected_uniform_share(strict)
    grpo, n_grpo = selected_uniform_share("grpo")
    default, _ = selected_uniform_share("greso")
    assert n_greso > 20 and n_grpo > 20
    # GRPO re-samples prompts whatever their last group was (mostly one outcome under the
    # U-shaped prior); strict GRESO re-samples one it saw uniform only to fill places when fewer
    # candidates pass than it needs (rare here); the default re-admits such a prompt with
    # probability p^z (p about 1/2) and samples in rounds from what it kept
    assert grpo > 0.5 and greso < 0.05 and greso < default < grpo


def test_capped_dapo_samples_in_rounds_and_trains_only_on_the_first_mixed_groups():
    spec = BudgetSpec(128, 0)
    rule = get_method("dapo-capped").group_filter
    for kind, seed in (("easy", 0), ("hard", 1)):
        # a pool of near-coin prompts reaches the target early; the default pool spends the budget
        config = SimConfig(difficulty_beta=50.0) if kind == "easy" else SimConfig()
        r = run_step("dapo-capped", spec, OraclePredictor(), np.random.default_rng(seed), config)
        mixed = np.array([len(set(t.outcomes() > 0.5)) == 2 for t in r.trees])
        trained = r.metrics["counts/mixed_groups_trained"]
        assert r.tree_kept.sum() == min(mixed.sum(), rule.target_groups(spec)) == trained
        assert not (r.tree_kept & ~mixed).any()
        assert r.metrics["rollouts_per_mixed_group"] == r.trajectories / trained
        if kind == "easy":
            assert r.trajectories < spec.total and r.rounds < spec.total // 8 // rule.round_prompts(spec)
        else:
            assert r.trajectories == spec.total and r.rounds == 4


def test_published_dapo_fills_grpos_batch_and_reports_what_it_spent():
    spec = BudgetSpec(128, 0)  # GRPO trains 16 groups; a pool of 64 candidates
    rule = get_method("dapo").group_filter
    for kind, seed in (("easy", 0), ("hard", 1)):
        config = SimConfig(difficulty_beta=50.0) if kind == "easy" else SimConfig()
        r = run_step("dapo", spec, OraclePredictor(), np.random.default_rng(seed), config)
        mixed = np.array([len(set(t.outcomes() > 0.5)) == 2 for t in r.trees])
        trained = r.metrics["counts/mixed_groups_trained"]
        assert r.tree_kept.sum() == min(mixed.sum(), rule.target_groups(spec)) == trained
        # it spends past M(1+N): a first round of 48 prompts × 8, and every rollout is counted
        assert r.trajectories == 8 * int((r.pool_m > 0).sum()) == r.metrics["counts/rollouts"] > spec.total
        assert r.metrics["counts/dropped_rollouts"] == r.trajectories - 8 * int(r.tree_kept.sum())
        if kind == "easy":  # near-coin prompts: one round fills the batch
            assert r.rounds == 1 and r.tree_kept.sum() == 16
        else:  # the U-shaped pool needs the last 16 candidates too
            assert r.rounds == 2 and (r.pool_m > 0).all()


def test_greso_filters_in_front_of_dynamic_sampling_on_the_simulator():
    """GRESO as its authors run it: the pre-rollout filter decides once which candidates the
    rounds may sample; the rounds never touch a skipped one; every sampled group is recorded (and
    feeds the adaptive probabilities); only the first mixed groups up to GRPO's batch are trained."""
    spec = BudgetSpec(128, 0)
    method = get_method("greso")
    pool = PersistentPool(spec.pool_size, SimConfig(), seed=2)
    history = PromptHistory()
    predictor = OraclePredictor()
    for s in range(8):
        step = pool.step
        probe = np.random.default_rng([9, s])
        ids = pool.candidate_ids()[probe.permutation(spec.pool_size)]
        view = history.view(ids, step)
        eligible = method.round_candidates(np.full(spec.pool_size, 0.5), spec, probe, view)
        r = run_step("greso", spec, predictor, np.random.default_rng([9, s]), pool=pool, history=history)
        np.testing.assert_array_equal(r.pool_ids, ids)
        assert not (r.pool_m[~eligible] > 0).any()  # a skipped candidate is never rolled out
        assert history.steps()[-1].groups == int((r.pool_m > 0).sum())  # every sampled group recorded
        mixed = np.array([len(set(t.outcomes() > 0.5)) == 2 for t in r.trees])
        assert r.tree_kept.sum() == min(mixed.sum(), 16) and not (r.tree_kept & ~mixed).any()
        if s >= 2:
            assert (~eligible).any()  # prompts seen uniform are being skipped
    # the adaptive probabilities moved from their initial 0.5 once prompts recurred
    state = greso_state(history.view([], pool.step), GresoConfig())
    assert (state.p_easy, state.p_hard) != (0.5, 0.5)


def test_mixed_group_metrics_of_an_ordinary_step():
    r = _step("trace", spec=BudgetSpec(128, 2), seed=20)
    mixed = sum(len(set(t.outcomes() > 0.5)) == 2 for t in r.trees)
    assert r.metrics["counts/mixed_groups_trained"] == mixed == round(r.metrics["effective_ratio"] * len(r.trees))
    assert r.metrics["rollouts_per_mixed_group"] == pytest.approx(r.trajectories / mixed)
    assert r.metrics["counts/dropped_groups"] == 0 and r.metrics["alloc/rounds"] == 1
    assert r.pool_ids is None and np.isnan(r.pool_success) and "pool_success" not in r.metrics


def test_bad_persistent_pool_config_and_mismatch():
    with pytest.raises(ValueError, match="dataset_factor"):
        PersistentPoolConfig(dataset_factor=0)
    with pytest.raises(ValueError, match="drift_noise_std"):
        PersistentPoolConfig(drift_noise_std=-1.0)
    with pytest.raises(ValueError, match="candidates a step"):
        run_step("grpo", SMALL, OraclePredictor(), np.random.default_rng(0), pool=PersistentPool(10))
    with pytest.raises(ValueError, match="another SimConfig"):
        run_step("grpo", SMALL, OraclePredictor(), np.random.default_rng(0),
                 pool=PersistentPool(SMALL.pool_size, SimConfig(kappa=3.0)))


def test_the_simulator_reports_the_trainer_s_metric_names():
    r = _step("dapo", spec=BudgetSpec(128, 0), seed=3)
    k, pos = anchor_allocation(r.trees)
    kept = [bool(x) for x in r.tree_kept]
    adv = get_method("dapo").advantage_estimator()([t for t, x in zip(r.trees, kept, strict=True) if x])
    shared = step_metrics(r.trees, kept, adv, allocation_stats(r.pool_m, k, pos), r.rounds)
    # the trees hold no token ids: the per-token figures are the simulated tokens' (method §10)
    per_token = {"contrast/mixed_per_1k_tokens": 1000 * shared["counts/mixed_groups_trained"] / r.generated_tokens,
                 "contrast/yield_per_1k_tokens": 1000 * shared["counts/contrastive_rollouts"] / r.generated_tokens}
    assert {key: r.metrics[key] for key in shared} == pytest.approx({**shared, **per_token}, nan_ok=True)
    assert r.metrics["counts/dropped_groups"] == (~r.tree_kept).sum()


def test_the_simulator_explores_through_the_method_as_the_trainer_does():
    spec = BudgetSpec(64, 2)
    for name in ("trace", "grpo"):
        plain = _step(name, spec=spec, seed=5)
        explored = run_step(name, spec, OraclePredictor(), np.random.default_rng(5), explore_fraction=0.5)
        assert explored.pool_m.sum() == plain.pool_m.sum()
        if get_method(name).explores_roots:  # random skipped prompts get m = 2
            assert (explored.pool_m == 2).sum() > (plain.pool_m == 2).sum()
        else:
            np.testing.assert_array_equal(explored.pool_m, plain.pool_m)


# ---------------------------------------------------------------------------- generated tokens (method §10)
TOKEN_KEYS = ("budget/generated_tokens", "contrast/mixed_per_1k_tokens", "contrast/yield_per_1k_tokens",
              "mixed_groups_with_anchors_per_1k_tokens")


def _without_tokens(metrics):
    figures = _fingerprint_metrics(metrics)
    return {k: v for k, v in figures.items() if k not in TOKEN_KEYS and not k.startswith("tokens/")}


def _fingerprint_metrics(metrics):
    return {k: (None if np.isnan(v) else v) for k, v in metrics.items()}


def test_token_costs_by_hand():
    config = SimConfig(horizon_min=3, horizon_max=4, turn_tokens_mean=10.0, turn_tokens_growth=2.0,
                       turn_tokens_sample_std=0.0)
    assert expected_rollout_tokens(config) == pytest.approx((70 + 150) / 2)  # 10+20+40 and +80
    typical = np.array([[10.4, 20.6, 30.0, 5.0], [1.0, 0.2, 3.0, 9.0]])
    got = path_tokens(typical, np.array([1, 0]), np.array([3, 4]), config, np.random.default_rng(0))
    assert got.tolist() == [21 + 30, 1 + 1 + 3 + 9]  # turns 2..3; every generated turn at least one token


def test_token_costs_leave_the_step_stream_as_it_was():
    """The same step with other token lengths: the same trees, allocations and figures (the tokens
    come from a generator of their own), only more tokens."""
    a = _step("trace", seed=3)
    b = _step("trace", seed=3, config=SimConfig(turn_tokens_mean=500.0, turn_tokens_growth=0.5))
    assert _fingerprint(a)[:5] == _fingerprint(b)[:5]
    assert _without_tokens(a.metrics) == _without_tokens(b.metrics)
    assert b.generated_tokens > a.generated_tokens > 0


def test_every_step_reports_its_generated_tokens():
    r = _step("trace", seed=4)
    assert r.generated_tokens == int(r.bare_tokens.sum() + r.cont_tokens.sum())
    assert r.bare_tokens.size == r.pool_m.sum() and r.cont_tokens.size == r.anchor_K.sum() + r.root_extra.sum()
    start = 0
    for tree, i in zip(r.trees, r.tree_prompt, strict=True):  # bare rollouts grouped by prompt in pool order
        seg = r.bare_tokens[start : start + r.pool_m[i]]
        assert (seg >= tree.root.info["horizon"]).all()  # at least one token a turn
        start += r.pool_m[i]
    m = r.metrics
    assert m["budget/generated_tokens"] == r.generated_tokens
    per_1k = 1000 * m["counts/mixed_groups_trained"] / r.generated_tokens
    assert m["contrast/mixed_per_1k_tokens"] == pytest.approx(per_1k)
    useful_per_1k = 1000 * m["counts/contrastive_rollouts"] / r.generated_tokens
    assert m["contrast/yield_per_1k_tokens"] == pytest.approx(useful_per_1k)
    assert m["mixed_groups_with_anchors_per_1k_tokens"] == pytest.approx(
        1000 * (m["counts/mixed_groups_trained"] + m["counts/mixed_anchors"]) / r.generated_tokens)


def test_uniform_methods_buy_the_groups_the_token_budget_buys():
    E = expected_rollout_tokens(SimConfig())  # a fresh ledger's guess for every prompt
    spec = BudgetSpec(64, 2, tokens_per_step=int(np.ceil(5 * 8 * E)))
    for name in ("grpo", "pcl"):
        r = run_step(name, spec, OraclePredictor(), np.random.default_rng(5))
        assert int(r.pool_m.sum()) == 40 and set(r.pool_m[r.pool_m > 0].tolist()) == {8}, name
        assert r.trajectories == 40 and r.pool_m.size == spec.pool_size
    with pytest.raises(ValueError, match="under a token budget a method is token-priced"):
        run_step("trace", spec, OraclePredictor(), np.random.default_rng(5))
    with pytest.raises(ValueError, match="the budget needs tokens_per_step"):
        run_step("trace-tokens", SMALL, OraclePredictor(), np.random.default_rng(5))


def test_trace_tokens_spends_its_plan_and_each_prompts_allowance():
    config = SimConfig()
    E = expected_rollout_tokens(config)
    spec = BudgetSpec(16, 2, tokens_per_step=int(48 * E))
    r = run_step("trace-tokens", spec, OraclePredictor(), np.random.default_rng(6), config)
    plan = r.token_plan
    np.testing.assert_array_equal(r.pool_m, plan.m)
    assert plan.root_tokens <= spec.tokens_per_step and plan.reserved.sum() <= spec.tokens_per_step - plan.root_tokens
    assert r.trajectories == int(r.pool_m.sum() + r.anchor_K.sum() + r.root_extra.sum())
    # a fresh ledger prices every root rollout at E and a continuation from t of T at E·(1 − t/T)
    start = 0
    for tree, i in zip(r.trees, r.tree_prompt, strict=True):
        T = tree.root.info["horizon"]
        mine = r.anchor_prompt == i
        spent = float(np.sum(r.anchor_K[mine] * E * (1 - r.anchor_turn[mine] / T))) + r.root_extra[i] * E
        realised = float(r.bare_tokens[start : start + r.pool_m[i]].sum())
        start += r.pool_m[i]
        allowance = max(plan.reserved[i] + E * r.pool_m[i] - realised, 0.0)
        assert spent <= allowance + 1e-6
    assert r.metrics["tokens/budget"] == spec.tokens_per_step
    assert r.token_ledger.costs.step == 0 and r.token_ledger.calibration.predicted > 0


def test_the_reservation_follows_the_price_of_continuations():
    """Once the ledger has learned what continuations cost, cheap ones (short later turns) win a
    larger reservation than expensive ones (long later turns) where the prefix stage is marginal
    (ρ = 0.03 here; at larger ρ cheap continuations saturate with fewer tokens: at ρ = 0.1 this
    pool reserves 0.4 of the budget for cheap ones, 0.5 for expensive ones), and a calibration of
    ρ = 0 reserves nothing."""
    shares, corrections = {}, {}
    for growth in (0.5, 2.0):
        config = SimConfig(turn_tokens_growth=growth)
        spec = BudgetSpec(16, 2, tokens_per_step=int(48 * expected_rollout_tokens(config)))
        ledger = sim_token_ledger(config)
        for s in range(3):
            ledger = run_step("trace-tokens", spec, OraclePredictor(), np.random.default_rng([9, s]), config,
                              compute_metrics=False, ledger=ledger).token_ledger
        corrections[growth] = depth_correction(ledger.costs, ledger.cost_model)
        marginal = dataclasses.replace(ledger, calibration=PrefixCalibration(100.0, 3.0))
        r = run_step("trace-tokens", spec, OraclePredictor(), np.random.default_rng([9, 3]), config,
                     compute_metrics=False, ledger=marginal)
        shares[growth] = r.token_plan.reservation_share
        none = dataclasses.replace(ledger, calibration=PrefixCalibration(100.0, 0.0))
        r = run_step("trace-tokens", spec, OraclePredictor(), np.random.default_rng([9, 3]), config,
                     compute_metrics=False, ledger=none)
        assert r.token_plan.reservation_share == 0.0 and not r.token_plan.reserved.any()
    # late anchors: their continuations cost less (more) than the linear rule says where later turns
    # are short (long); early bins also carry the fresh prompts' root estimate errors
    assert corrections[0.5][-1] < 1 < corrections[2.0][-1]
    assert shares[0.5] > shares[2.0]
