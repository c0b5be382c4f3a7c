"""TRACE inside other RL frameworks.

Each integration lives in its own module and imports its framework only there, so that importing
``trace_core`` (or this package) never needs TRL, verl or any other trainer installed:

- :mod:`trace_core.integrations.trl`: a TRL ``GRPOTrainer`` whose step is TRACE's
  (``TraceGRPOTrainer``, configured by ``TraceTRLConfig``).
- :mod:`trace_core.integrations.verl`: TRACE's tree-aware advantage as verl's ``trace_tree``
  estimator (registered by the ``verl.plugins`` entry point, :mod:`.verl_plugin`), verl's
  per-prompt ``__rollout_n__`` from the root plan, and verl batches built from rollout trees.
- :mod:`trace_core.integrations.rows`: what both share — one batch row per trajectory.
"""
