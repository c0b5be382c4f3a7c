"""One rule for turning a run's seed into the seeds of its parts.

A run has one seed (``TrainConfig.seed``). Everything random in it — each step's sampling, the
predictor's initialisation and example order, the data order, the allocators' tie-breaking — is
keyed by a seed derived from it and from what the part is (its name, the step, the prompt), so
that two runs with different seeds differ everywhere and one run is reproducible everywhere.
"""

from __future__ import annotations

import hashlib

SEED_BITS = 31  # derived seeds are non-negative int32 (vLLM, torch and numpy all accept them)


def derive_seed(*parts: object) -> int:
    """A seed in ``[0, 2**31)`` determined by ``parts`` (their ``str``), independent across parts:
    ``derive_seed(run_seed, "sampling", step)``. Any change of any part gives an unrelated seed."""
    if not parts:
        raise ValueError("derive_seed needs at least one part")
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & ((1 << SEED_BITS) - 1)


def step_sampling_seed(run_seed: int, agent_seed: int, step: int) -> int:
    """The seed of a step's rollouts: the run seed, ``agent.seed`` and the step, so the same prompt
    draws fresh samples at every step and in every run."""
    return derive_seed(run_seed, "sampling", agent_seed, step)


def predictor_seed(run_seed: int, seed: int) -> int:
    """The predictor's seed (initialisation, example order) in a run: ``predictor.seed`` mixed with
    the run seed, so runs with different seeds start from different predictors."""
    return derive_seed(run_seed, "predictor", seed)
