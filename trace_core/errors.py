"""Errors a run raises before it does any work, each naming the input that stopped it.

A leaf module (it imports nothing of the project), so that the modules that raise these errors —
the tracking store, the run's folder guard — and the one that reports them
(:func:`trace_core.failures.refused_before_work`) need not import each other.
"""

from __future__ import annotations


class TrackingStoreError(RuntimeError):
    """The tracking store (or the spool) cannot take this run's records."""


class RunRefused(RuntimeError):
    """The run cannot start in its folder: another process writes it, or its checkpoint belongs to
    a run of another configuration."""
