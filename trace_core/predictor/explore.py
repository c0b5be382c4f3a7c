"""method §5's root exploration, re-exported from :mod:`trace_core.allocation` where it lives
beside the other root rules (this package's lazy ``explore_roots`` name points here)."""

from __future__ import annotations

from trace_core.allocation import explore_roots

__all__ = ["explore_roots"]
