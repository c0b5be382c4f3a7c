"""TRACE inside other RL frameworks.

Each integration lives in its own module and imports its framework only there, so that importing
``trace_core`` (or this package) never needs TRL, verl or any other trainer installed:

- :mod:`trace_core.integrations.trl`: a TRL ``GRPOTrainer`` whose step is TRACE's
  (``TraceGRPOTrainer``, configured by ``TraceTRLConfig``).
"""
