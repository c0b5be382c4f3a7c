"""Budgeted rollout allocation, numpy in, numpy out: method §2's global roots (:mod:`.roots`), method
§3's prompt-local prefixes (:mod:`.prefixes`), the budget every method shares (:mod:`.spec`), the
rules a method is made of (:mod:`.rules`) and the group filters that sample in rounds
(:mod:`.rounds`). The two TRACE solvers are exact; their references (``allocate_roots_dp``,
``allocate_prefixes_greedy``) exist for tests and benchmarks and are never a silent fallback.

The methods built from these rules are registered in :mod:`trace_core.methods`; the solvers priced
in generated tokens (method §10) are in :mod:`trace_core.token_budget`.
"""

from __future__ import annotations

from trace_core.allocation.checks import (
    GAIN_TIE_TOL,
    as_int,
    as_probabilities,
    check_prefix_inputs,
)
from trace_core.allocation.prefixes import (
    allocate_prefixes,
    allocate_prefixes_greedy,
    continuation_keep_probability,
    prefix_objective,
    prefix_value,
)
from trace_core.allocation.roots import (
    allocate_roots,
    allocate_roots_beta,
    allocate_roots_beta_dp,
    allocate_roots_dp,
    allocate_roots_thompson,
    beta_moments,
    check_root_budget,
    explore_roots,
    root_objective,
    root_objective_beta,
    root_unit_gains,
    root_unit_gains_beta,
    root_value,
    root_value_beta,
)
from trace_core.allocation.rounds import (
    DynamicSampling,
    DynamicSamplingConfig,
    RoundLimits,
    RoundRule,
    SampledRounds,
    next_checked_round,
)
from trace_core.allocation.rules import (
    AnchorSignals,
    ArpoPrefixes,
    CandidateFilter,
    EntropyReader,
    EntropySignals,
    GresoRoots,
    PosteriorRoots,
    PrefixPlacement,
    PrefixRule,
    RootRule,
    StatelessRoots,
    TokenRule,
    prefixes_random,
    prefixes_trace,
    roots_pcl,
    roots_trace,
    roots_uniform,
    roots_uniform_all,
)
from trace_core.allocation.spec import (
    BudgetSpec,
)

__all__ = [
    "AnchorSignals",
    "ArpoPrefixes",
    "BudgetSpec",
    "CandidateFilter",
    "DynamicSampling",
    "DynamicSamplingConfig",
    "EntropyReader",
    "EntropySignals",
    "GAIN_TIE_TOL",
    "GresoRoots",
    "PosteriorRoots",
    "PrefixPlacement",
    "PrefixRule",
    "RootRule",
    "RoundLimits",
    "RoundRule",
    "SampledRounds",
    "StatelessRoots",
    "TokenRule",
    "allocate_prefixes",
    "allocate_prefixes_greedy",
    "allocate_roots",
    "allocate_roots_beta",
    "allocate_roots_beta_dp",
    "allocate_roots_dp",
    "allocate_roots_thompson",
    "as_int",
    "as_probabilities",
    "beta_moments",
    "check_prefix_inputs",
    "check_root_budget",
    "continuation_keep_probability",
    "explore_roots",
    "next_checked_round",
    "prefix_objective",
    "prefix_value",
    "prefixes_random",
    "prefixes_trace",
    "root_objective",
    "root_objective_beta",
    "root_unit_gains",
    "root_unit_gains_beta",
    "root_value",
    "root_value_beta",
    "roots_pcl",
    "roots_trace",
    "roots_uniform",
    "roots_uniform_all",
]
