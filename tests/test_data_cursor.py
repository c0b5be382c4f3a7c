"""The trainer's data cursor and seeds: pools never hold a prompt twice (also across an epoch
boundary), every prompt still comes once per epoch, and a run's seed reaches every step's
sampling. Which root rules explore is a property of the method, not of its name."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_core.methods import METHODS, get_method
from trace_core.seeding import derive_seed, predictor_seed, step_sampling_seed
from trace_core.training.trainer import epoch_order, next_pool


@settings(max_examples=200, deadline=None)
@given(num=st.integers(2, 40), size_frac=st.floats(0.05, 1.0), seed=st.integers(0, 5), pools=st.integers(1, 30))
def test_pools_never_repeat_a_prompt_and_cover_each_epoch(num, size_frac, seed, pools) -> None:
    size = max(1, int(num * size_frac))
    order, epoch, position = epoch_order(num, seed, 0, []), 0, 0
    drawn: list[int] = []
    for _ in range(pools):
        pool, order, epoch, position = next_pool(order, epoch, position, size, seed)
        assert len(pool) == size and len(set(pool)) == size, pool
        drawn += pool
    for e in range(len(drawn) // num):  # each complete epoch's worth holds every prompt once
        assert sorted(drawn[e * num:(e + 1) * num]) == list(range(num))


def test_the_old_cursor_repeated_prompts_at_an_epoch_boundary() -> None:
    """The case that used to give a duplicate: 16 prompts, pools of 6 (the third pool crosses)."""
    order, epoch, position = epoch_order(16, 0, 0, []), 0, 0
    for _ in range(8):
        pool, order, epoch, position = next_pool(order, epoch, position, 6, 0)
        assert len(set(pool)) == 6
    with pytest.raises(ValueError, match="without repeats"):
        next_pool(order, epoch, position, 17, 0)


def test_derived_seeds_differ_by_step_and_by_run() -> None:
    seeds = {derive_seed(run, "sampling", 0, step) for run in range(3) for step in range(50)}
    assert len(seeds) == 150
    assert derive_seed(1, "sampling", 0, 3) == derive_seed(1, "sampling", 0, 3)
    assert all(0 <= s < 2**31 for s in seeds)


def test_exploration_is_a_property_of_the_method() -> None:
    explorers = {name for name, m in METHODS.items() if m.explores_roots}
    assert {"trace", "trace-root-only"} <= explorers
    for name in ("grpo", "pcl", "treepo", "trace-prefix-only"):
        assert not get_method(name).explores_roots, name


def test_run_seed_reaches_the_sampling_and_the_predictor() -> None:
    """Two runs that differ only in ``seed`` sample differently at every step and initialise
    different predictors; one run's steps differ from each other."""
    assert step_sampling_seed(1, 0, 0) != step_sampling_seed(2, 0, 0)
    assert step_sampling_seed(1, 0, 0) != step_sampling_seed(1, 0, 1)
    assert np.unique([step_sampling_seed(s, 0, k) for s in range(4) for k in range(10)]).size == 40
    assert predictor_seed(1, 0) != predictor_seed(2, 0)
