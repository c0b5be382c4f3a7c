"""Per-prompt history (trace_core/history.py): the record and its view, GRESO's filter, and the
Beta posterior that never counts an outcome twice."""

from __future__ import annotations

import numpy as np
import pytest

from trace_core.history import (
    GresoConfig,
    HistoryView,
    PosteriorConfig,
    PromptHistory,
    beta_posterior,
    greso_keep,
    greso_keep_probability,
    greso_state,
    outcome_streaks,
)


def _history(events: dict[str, list[tuple[int, int, int, float]]], max_events: int = 16) -> PromptHistory:
    """A history from {prompt: [(step, successes, failures, prediction), ...]} in step order."""
    h = PromptHistory(max_events)
    for step in sorted({e[0] for evs in events.values() for e in evs}):
        rows = [(pid, e) for pid, evs in events.items() for e in evs if e[0] == step]
        h.record(step, [pid for pid, _ in rows], [e[1] for _, e in rows], [e[2] for _, e in rows],
                 [e[3] for _, e in rows])
    return h


# ---------------------------------------------------------------------------- the record
def test_view_is_newest_first_padded_and_aligned_with_the_ids():
    h = _history({"a": [(0, 2, 0, 0.1), (3, 1, 1, 0.4)], "b": [(1, 0, 4, 0.9)]}, max_events=3)
    view = h.view(["b", "new", "a"], step=5)
    assert view.event_step.tolist() == [[1, -1, -1], [-1, -1, -1], [3, 0, -1]]
    assert view.successes.tolist() == [[0, 0, 0], [0, 0, 0], [1, 2, 0]]
    assert view.failures.tolist() == [[4, 0, 0], [0, 0, 0], [1, 0, 0]]
    np.testing.assert_array_equal(view.prediction[2, :2], [0.4, 0.1])
    assert np.isnan(view.prediction[1]).all() and view.count.tolist() == [1, 0, 2]
    assert len(h) == 2 and h.events("a")[0].successes == 2


def test_only_the_newest_events_are_kept_and_empty_groups_are_not_events():
    h = PromptHistory(max_events=2)
    for step in range(4):
        h.record(step, ["a", "b"], [step, 0], [1, 0], [0.5, 0.5])
    assert [e.step for e in h.events("a")] == [2, 3]
    assert h.events("b") == ()  # no rollouts, no event
    assert h.view(np.array([7, 8]), 1).count.tolist() == [0, 0]  # numpy ids work; unknown ids are empty


@pytest.mark.parametrize(
    ("call", "rule"),
    [
        (lambda h: h.record(2, ["a"], [1], [1], [0.5]), "not newer"),
        (lambda h: h.record(5, ["a", "a"], [1, 1], [1, 1], [0.5, 0.5]), "appears twice"),
        (lambda h: h.record(5, ["a"], [-1], [1], [0.5]), "non-negative whole"),
        (lambda h: h.record(5, ["a"], [0.5], [1], [0.5]), "non-negative whole"),
        (lambda h: h.record(5, ["a"], [1], [1], [1.5]), "probabilities"),
        (lambda h: h.record(5, ["a", "b"], [1], [1], [0.5]), "one entry per"),
        (lambda h: h.view(["a"], 3), "not before step 3"),
    ],
)
def test_bad_records_and_views_are_errors(call, rule):
    h = _history({"a": [(3, 1, 1, 0.5)]})
    with pytest.raises(ValueError, match=rule):
        call(h)


def test_each_step_records_its_groups_and_the_record_round_trips():
    h = PromptHistory(max_events=2)
    h.record(0, ["a", "b", "c", "d"], [4, 0, 2, 0], [0, 4, 2, 0], [0.5] * 4)  # d got no rollouts
    h.record(1, ["a", "c"], [4, 4], [0, 0], [0.5, 0.5])
    h.record(1, ["e"], [0], [3], [0.5])  # a step recorded in two parts sums them
    for step in (2, 3):
        h.record(step, ["a"], [1], [1], [0.5])
    assert [tuple(o.__dict__.values()) for o in h.steps()] == [
        (0, 3, 1, 1, 0), (1, 3, 2, 1, 2), (2, 1, 0, 0, 1), (3, 1, 0, 0, 1)]
    # the steps are the run's, not a prompt's: never truncated, and every view row shares them
    assert len(h.events("a")) == 2
    assert h.view(["zzz"], 2).steps.tolist() == [[0, 3, 1, 1, 0], [1, 3, 2, 1, 2]]
    back = PromptHistory.from_json(h.to_json())
    assert back == h and back.steps() == h.steps()
    old = {**h.to_dict(), "format": "trace-rl/prompt-history/v1"}  # a record from before the step totals
    del old["steps"]
    assert PromptHistory.from_dict(old).steps() == () and PromptHistory.from_dict(old).events("a") == h.events("a")


# ---------------------------------------------------------------------------- GRESO's filter
def test_streaks_of_all_success_and_all_failure_are_counted_apart():
    h = _history({
        "mixed-last": [(0, 4, 0, 0.5), (1, 2, 2, 0.5)],
        "easy-then-hard": [(0, 1, 3, 0.5), (1, 4, 0, 0.5), (2, 0, 4, 0.5)],
        "none": [],
        "hard-2": [(0, 4, 0, 0.5), (1, 0, 2, 0.5), (2, 0, 3, 0.5)],
        "easy-3": [(0, 4, 0, 0.5), (1, 4, 0, 0.5), (2, 2, 0, 0.5)],
    })
    easy, hard = outcome_streaks(h.view(["mixed-last", "easy-then-hard", "none", "hard-2", "easy-3"], 3))
    assert easy.tolist() == [0, 0, 0, 0, 3]
    assert hard.tolist() == [0, 1, 0, 2, 0]


def test_keep_probabilities_by_hand_for_mixed_and_pure_streaks_and_the_floor():
    """No step recorded a recurrence, so both probabilities are still the initial 0.5."""
    h = _history({
        "easy-hard": [(0, 8, 0, 0.5), (1, 0, 8, 0.5)],  # counted apart: a hard streak of 1, not 2
        "hard-3": [(0, 0, 8, 0.5), (1, 0, 8, 0.5), (2, 0, 8, 0.5)],
        "easy-2": [(1, 8, 0, 0.5), (2, 8, 0, 0.5)],
        "broken": [(0, 0, 8, 0.5), (1, 3, 5, 0.5), (2, 8, 0, 0.5)],  # the mixed group ends the streak
        "mixed": [(2, 4, 4, 0.5)],
        "new": [],
    })
    cfg = GresoConfig(adapt_from_recurrence=False, step_size=0.0)  # the pair stays at its initial values
    view = h.view(["easy-hard", "hard-3", "easy-2", "broken", "mixed", "new"], 3)
    np.testing.assert_allclose(greso_keep_probability(view, cfg), [0.5, 0.125, 0.25, 0.5, 1.0, 1.0])
    # separate probabilities: p_easy for all-success streaks, p_hard for all-failure ones
    two = GresoConfig(initial_p_easy=0.9, initial_p_hard=0.2, adapt_from_recurrence=False, step_size=0.0)
    # (hard-3: 0.2^3 = 0.008, floored to 0.01)
    np.testing.assert_allclose(greso_keep_probability(view, two), [0.2, 0.01, 0.81, 0.9, 1.0, 1.0])
    # the floor: 8 all-failure groups keep max(0.5^8, 0.01) = 0.01, not 0.0039
    long = _history({"a": [(s, 0, 8, 0.5) for s in range(8)]})
    assert greso_keep_probability(long.view(["a"], 8), cfg)[0] == pytest.approx(0.01)
    assert greso_keep_probability(long.view(["a"], 8), GresoConfig(min_keep_probability=0.0, step_size=0.0,
                                                                   adapt_from_recurrence=False))[0] == 0.5 ** 8


def test_greso_draws_match_the_keep_probabilities():
    h = _history({"hard": [(0, 0, 4, 0.5)], "easy3": [(0, 4, 0, 0.5), (1, 4, 0, 0.5), (2, 4, 0, 0.5)],
                  "mixed": [(2, 1, 3, 0.5)], "new": []})
    n = 20_000
    view = h.view(["hard", "easy3", "mixed", "new"] * n, 3)
    cfg = GresoConfig(adapt_from_recurrence=False, step_size=0.0)
    keep = greso_keep(view, cfg, np.random.default_rng(0)).reshape(n, 4)
    for col, want in enumerate([0.5, 0.125, 1.0, 1.0]):
        se = np.sqrt(want * (1 - want) / n)
        assert abs(keep[:, col].mean() - want) <= 5 * se + 1e-12, col


def test_both_probabilities_adapt_every_step_towards_their_targets():
    """A scripted run of 100-group steps: the share of all-success (all-failure) groups against
    the targets 1/12 and 1/6 moves p_easy (p_hard) by 0.01 a step, clamped to [0.05, 0.95]."""
    cfg = GresoConfig()
    assert (cfg.target_easy, cfg.target_hard) == pytest.approx((0.25 / 3, 0.5 / 3))
    script = [  # (all-success, all-failure) of 100 groups; the first step has no recurring prompt
        (50, 50),  # first pass over the data: not counted
        (50, 50),  # both above target: both down
        (5, 50),  # easy below target (0.05 < 0.083): p_easy up; hard above: down
        (9, 10),  # easy above (0.09 >= 0.083): down; hard below (0.10 < 0.167): up
        (8, 17),  # easy below: up; hard exactly at target (0.17 >= 0.167): down
    ]
    want = [(0.5, 0.5), (0.5, 0.5), (0.49, 0.49), (0.5, 0.48), (0.49, 0.49), (0.5, 0.48)]
    h = PromptHistory()
    for step, (easy, hard) in enumerate(script):
        assert tuple(greso_state(h.view([], step), cfg).__dict__.values()) == pytest.approx(want[step]), step
        ids = [f"p{i}" for i in range(100)]
        wins = [4] * easy + [0] * hard + [2] * (100 - easy - hard)
        h.record(step, ids, wins, [4 - w for w in wins], [0.5] * 100)
    assert tuple(greso_state(h.view([], 5), cfg).__dict__.values()) == pytest.approx(want[5])
    # the clamp: a long run of all-failure steps takes p_hard to 0.05 and no lower; p_easy to 0.95
    for step in range(5, 60):
        h.record(step, [f"p{i}" for i in range(10)], [0] * 10, [4] * 10, [0.5] * 10)
    state = greso_state(h.view([], 60), cfg)
    assert (state.p_easy, state.p_hard) == pytest.approx((0.95, 0.05))
    # the state is a function of the record: a resumed run continues where it stopped
    assert greso_state(PromptHistory.from_json(h.to_json()).view([], 60), cfg) == state
    # without the first-pass rule every step adapts from the first
    eager = GresoConfig(adapt_from_recurrence=False)
    assert greso_state(_history({"a": [(0, 4, 0, 0.5)]}).view([], 1), eager).p_easy == pytest.approx(0.49)


def test_bad_greso_config():
    for kwargs, word in [({"initial_p_easy": 1.5}, "initial_p_easy"), ({"target_hard": -0.1}, "target_hard"),
                         ({"step_size": -0.01}, "step_size"), ({"p_min": 0.6, "p_max": 0.4}, "p_min"),
                         ({"min_keep_probability": 2.0}, "min_keep_probability")]:
        with pytest.raises(ValueError, match=word):
            GresoConfig(**kwargs)


# ---------------------------------------------------------------------------- the posterior
def test_posterior_by_hand():
    h = _history({"a": [(1, 3, 0, 0.2), (5, 2, 0, 0.3), (7, 1, 1, 0.6)], "new": []})
    cfg = PosteriorConfig(prior_strength=4.0, discount=0.5, evidence_window=4)
    alpha, beta = beta_posterior(h.view(["a", "new"], 9), np.array([0.9, 0.25]), cfg)
    # step 1 is 8 steps old: outside the window, left to the prior. The oldest counted event
    # (step 5) gives the prior mean 0.3; the counted evidence is discounted by 0.5^age.
    assert alpha[0] == pytest.approx(4 * 0.3 + 0.5**4 * 2 + 0.5**2 * 1)
    assert beta[0] == pytest.approx(4 * 0.7 + 0.5**4 * 0 + 0.5**2 * 1)
    # no evidence: the current prediction with the prior's strength
    assert (alpha[1], beta[1]) == pytest.approx((4 * 0.25, 4 * 0.75))
    # a shorter window drops step 5 too: the prior moves to step 7's prediction
    a2, b2 = beta_posterior(h.view(["a"], 9), np.array([0.9]), PosteriorConfig(4.0, 0.5, 2))
    assert (a2[0], b2[0]) == pytest.approx((4 * 0.6 + 0.25, 4 * 0.4 + 0.25))


def test_the_posterior_never_reads_the_current_prediction_when_it_counts_evidence():
    """The current score was trained on the counted outcomes: using it as the prior would count
    them twice. Whatever it says, a prompt with counted evidence keeps the same posterior."""
    rng = np.random.default_rng(0)
    h = PromptHistory()
    ids = list(range(50))
    for step in range(6):
        sel = [i for i in ids if rng.random() < 0.5]
        n = rng.integers(2, 9, size=len(sel))
        wins = rng.binomial(n, 0.5)
        h.record(step, sel, wins, n - wins, rng.random(len(sel)))
    view = h.view(ids + list(range(100, 110)), 6)  # ten prompts never seen
    cfg = PosteriorConfig()
    a1, b1 = beta_posterior(view, rng.random(60), cfg)
    a2, b2 = beta_posterior(view, rng.random(60), cfg)
    counted = (view.valid & (6 - view.event_step <= cfg.evidence_window)).any(axis=1)
    assert counted.any() and (~counted).any()
    np.testing.assert_array_equal(a1[counted], a2[counted])
    np.testing.assert_array_equal(b1[counted], b2[counted])
    assert not np.allclose(a1[~counted], a2[~counted])
    # counted outcomes add their discounted weight on top of the prior's strength
    total = a1 + b1
    assert np.all(total[counted] > cfg.prior_strength) and np.allclose(total[~counted], cfg.prior_strength)


def test_posterior_input_checks():
    view = HistoryView.empty(3, step=2)
    with pytest.raises(ValueError, match="one per prompt"):
        beta_posterior(view, np.array([0.5, 0.5]), PosteriorConfig())
    with pytest.raises(ValueError, match="probabilities"):
        beta_posterior(view, np.array([0.5, 0.5, 1.5]), PosteriorConfig())
    for kwargs, word in [({"prior_strength": 0.0}, "prior_strength"), ({"discount": 0.0}, "discount"),
                         ({"evidence_window": 0}, "evidence_window")]:
        with pytest.raises(ValueError, match=word):
            PosteriorConfig(**kwargs)
