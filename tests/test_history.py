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
    uniform_streak,
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


# ---------------------------------------------------------------------------- GRESO's filter
def test_uniform_streak_counts_the_newest_one_outcome_groups():
    h = _history({
        "mixed-last": [(0, 4, 0, 0.5), (1, 2, 2, 0.5)],
        "two-uniform": [(0, 1, 3, 0.5), (1, 4, 0, 0.5), (2, 0, 4, 0.5)],
        "none": [],
        "all-uniform": [(0, 0, 2, 0.5)],
    })
    assert uniform_streak(h.view(["mixed-last", "two-uniform", "none", "all-uniform"], 3)).tolist() == [0, 2, 0, 1]


def test_greso_keeps_a_streak_of_z_with_probability_p_to_the_z_minus_k_plus_1():
    h = _history({"z1": [(0, 0, 4, 0.5)], "z3": [(0, 4, 0, 0.5), (1, 4, 0, 0.5), (2, 0, 4, 0.5)],
                  "mixed": [(2, 1, 3, 0.5)], "new": []})
    n = 20_000
    view = h.view(["z1", "z3", "mixed", "new"] * n, 3)
    for k, p in [(1, 0.5), (2, 0.7)]:
        keep = greso_keep(view, GresoConfig(streak_k=k, readmit_probability=p), np.random.default_rng(0)).reshape(n, 4)
        want = [1.0 if 1 < k else p ** (1 - k + 1), p ** (3 - k + 1), 1.0, 1.0]
        for col in range(4):
            se = np.sqrt(want[col] * (1 - want[col]) / n)
            assert abs(keep[:, col].mean() - want[col]) <= 5 * se + 1e-12, (k, p, col)
    never = greso_keep(view, GresoConfig(readmit_probability=0.0), np.random.default_rng(1)).reshape(n, 4)
    assert not never[:, :2].any() and never[:, 2:].all()


def test_bad_greso_config():
    with pytest.raises(ValueError, match="streak_k"):
        GresoConfig(streak_k=0)
    with pytest.raises(ValueError, match="readmit_probability"):
        GresoConfig(readmit_probability=1.5)


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
