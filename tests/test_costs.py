"""Cost estimates (trace_core/costs.py): hand-computed discounted means, the fallbacks, the per-depth
continuation correction, the JSON round trip and every bad-input rule."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trace_core.costs import (
    CostModel,
    CostState,
    PromptCost,
    cost_error,
    depth_correction,
    expected_anchor_fraction,
    expected_root_tokens,
    expected_turns,
    observe,
    observe_continuations,
    policy_mean,
    remaining_tokens,
)

MODEL = CostModel(discount=0.5, policy_discount=0.5, prior_weight=1.0, initial_tokens=400.0, initial_turns=5.0)


def _two_steps() -> CostState:
    """Step 0: prompt "a" rollouts of 100 and 200 tokens (2 and 4 turns), "b" one of 300 (3 turns);
    step 2: "a" one of 50 tokens (1 turn)."""
    s = observe(CostState(), MODEL, 0, [100, 200, 300], [2, 4, 3], ["a", "a", "b"])
    return observe(s, MODEL, 2, [50], [1], ["a"])


def test_before_any_rollout_every_prompt_gets_the_initial_guess():
    s = CostState()
    assert policy_mean(s, MODEL) == (400.0, 5.0)
    np.testing.assert_array_equal(expected_root_tokens(s, MODEL, ["x", 7]), [400.0, 400.0])
    np.testing.assert_array_equal(expected_turns(s, MODEL, n=3), [5.0, 5.0, 5.0])
    with pytest.raises(ValueError, match="pass prompt_ids, or n"):
        expected_root_tokens(s, MODEL)


def test_discounted_means_by_hand():
    s = observe(CostState(), MODEL, 0, [100, 200, 300], [2, 4, 3], ["a", "a", "b"])
    # the policy: 600 tokens, 9 turns over 3 rollouts
    assert policy_mean(s, MODEL) == pytest.approx((200.0, 3.0))
    # "a": (300 + 1·200) / (2 + 1) with the prior's one pseudo-rollout at the policy mean
    np.testing.assert_allclose(expected_root_tokens(s, MODEL, ["a", "b", "c"]), [500 / 3, 250.0, 200.0])
    np.testing.assert_allclose(expected_turns(s, MODEL, ["a"]), [(6 + 3) / 3])
    s = _two_steps()
    # two steps later the old sums count 0.5² = 1/4: policy (150 + 50) / (0.75 + 1)
    pol = 200.0 / 1.75
    assert policy_mean(s, MODEL)[0] == pytest.approx(pol)
    # "a": (75 + 50) / (0.5 + 1) own; with the prior (125 + pol) / 2.5; "b" keeps its own 300 / 1
    want = [(125.0 + pol) / 2.5, (300.0 + pol) / 2.0, pol]
    np.testing.assert_allclose(expected_root_tokens(s, MODEL, ["a", "b", "c"]), want)
    # prior_weight 0: a seen prompt's own discounted mean alone
    own = CostModel(discount=0.5, policy_discount=0.5, prior_weight=0.0)
    np.testing.assert_allclose(expected_root_tokens(s, own, ["a", "b"]), [125.0 / 1.5, 300.0])


def test_prompts_that_never_recur_teach_only_the_policy_mean():
    s = observe(CostState(), MODEL, 0, [100, 300], [2, 2])
    assert s.prompts == {} and policy_mean(s, MODEL) == (200.0, 2.0)


def test_states_are_immutable_and_observed_in_step_order():
    s0 = observe(CostState(), MODEL, 0, [100], [2], ["a"])
    s1 = observe(s0, MODEL, 1, [300], [2], ["a"])
    assert s0.prompts["a"] == PromptCost(100.0, 2.0, 1.0, 0)  # the older state is untouched
    assert s1.prompts["a"] == PromptCost(350.0, 3.0, 1.5, 1)
    with pytest.raises(ValueError, match="older than the state's newest step 1"):
        observe(s1, MODEL, 0, [1], [1], ["a"])
    same_step = observe(s1, MODEL, 1, [50], [1], ["a"])  # several calls for one step add up undiscounted
    assert same_step.prompts["a"] == PromptCost(400.0, 4.0, 2.5, 1)


def test_remaining_tokens_follow_the_linear_rule_without_continuations():
    s = CostState()
    np.testing.assert_allclose(remaining_tokens(s, MODEL, [300, 300, 80], [1, 0, 3], [4, 4, 4]), [225, 300, 20])
    np.testing.assert_allclose(expected_anchor_fraction(s, MODEL, [2, 3, 5.7, 8]), 0.5)


def test_the_per_depth_correction_is_learned_by_bin():
    model = CostModel(depth_bins=4, depth_prior_weight=2.0, depth_discount=0.5)
    # two continuations from t/T = 1/4 (bin 1): realised/predicted 0.5 and 1.0
    s = observe_continuations(CostState(), model, 0, [1, 2], [4, 8], [100.0, 60.0], [50.0, 60.0])
    w = depth_correction(s, model)
    np.testing.assert_allclose(w, [1.0, (1.5 + 2) / (2 + 2), 1.0, 1.0])
    np.testing.assert_allclose(remaining_tokens(s, model, [400], [1], [4]), [400 * 0.75 * 0.875])
    # T = 4: anchors at 1/4, 2/4, 3/4 (bins 1, 2, 3)
    np.testing.assert_allclose(expected_anchor_fraction(s, model, [4]), [(0.75 * 0.875 + 0.5 + 0.25) / 3])
    # a step later the old bin sums count half: (1.5·0.5 + 2 + 2) / (2·0.5 + 1 + 2) with a new ratio of 2
    s2 = observe_continuations(s, model, 1, [1], [4], [10.0], [20.0])
    assert depth_correction(s2, model)[1] == pytest.approx((0.75 + 2.0 + 2.0) / (1.0 + 1.0 + 2.0))
    with pytest.raises(ValueError, match="depth_bins = 2"):
        depth_correction(s, CostModel(depth_bins=2))


def test_json_round_trip():
    s = _two_steps()
    s = observe(s, MODEL, 3, [10, 20], [1, 2], [7, ("t", 1)])
    s = observe_continuations(s, MODEL, 3, [1], [3], [50.0], [40.0])
    back = CostState.from_json(json.dumps(json.loads(s.to_json())))
    assert back == s
    np.testing.assert_array_equal(expected_root_tokens(back, MODEL, ["a", 7, ("t", 1)]),
                                  expected_root_tokens(s, MODEL, ["a", 7, ("t", 1)]))
    with pytest.raises(ValueError, match="not a cost state"):
        CostState.from_dict({"format": "other"})


def test_cost_error_by_hand():
    e = cost_error([110, 90], [100, 100])
    assert (e.n, e.mean_absolute, e.mean_relative, e.bias) == (2, 10.0, pytest.approx(0.1), pytest.approx(0.0))
    e = cost_error([150, 50], [100, 200])  # off by 50 (+0.5) and 150 (−0.75)
    assert e.mean_absolute == 100.0 and e.mean_relative == pytest.approx(0.625) and e.bias == pytest.approx(-0.125)
    assert cost_error([], []).n == 0
    with pytest.raises(ValueError, match=r"realised\[0\] = 0.0"):
        cost_error([1.0], [0.0])


@pytest.mark.parametrize(
    "kwargs, rule",
    [
        (dict(discount=0.0), "discount = 0.0: a per-step discount must lie in"),
        (dict(policy_discount=1.5), "policy_discount"),
        (dict(prior_weight=-1.0), "prior_weight = -1.0: a pseudo-count"),
        (dict(initial_tokens=0.0), "initial_tokens"),
        (dict(initial_turns=0.5), "initial_turns"),
        (dict(depth_bins=0), "depth_bins"),
    ],
)
def test_bad_models_are_errors(kwargs, rule):
    with pytest.raises(ValueError, match=rule):
        CostModel(**kwargs)


def test_bad_observations_are_errors():
    s = CostState()
    with pytest.raises(ValueError, match=r"lengths\[1\] = -3.0"):
        observe(s, MODEL, 0, [1, -3], [1, 1])
    with pytest.raises(ValueError, match=r"turns\[0\] = 0.0"):
        observe(s, MODEL, 0, [1], [0])
    with pytest.raises(ValueError, match="prompt_ids has 1 entries but lengths has 2"):
        observe(s, MODEL, 0, [1, 2], [1, 1], ["a"])
    with pytest.raises(ValueError, match="steps count from 0"):
        observe(s, MODEL, -1, [1], [1])
    with pytest.raises(ValueError, match="0 <= turn < turns"):
        remaining_tokens(s, MODEL, [100], [4], [4])
    with pytest.raises(ValueError, match=r"root_tokens\[0\]"):
        remaining_tokens(s, MODEL, [0.0], [1], [4])
