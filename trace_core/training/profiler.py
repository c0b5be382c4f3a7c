"""Cost breakdown: wall time per phase per step, as fractions (method §7, the paper's cost table)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = (
    "rollout",  # generation in the engine (tool execution and prefix scoring excluded)
    "tool_execution",  # environment steps and restores
    "predictor_scoring",  # the candidate pool's roots and each prompt's anchors
    "predictor_update",
    "policy_optimisation",
    "weight_sync",
    "checkpoint",
    "logging",
)


class PhaseProfiler:
    """Accumulates seconds per phase for the current step and over the run."""

    def __init__(self) -> None:
        self.step: dict[str, float] = defaultdict(float)
        self.total: dict[str, float] = defaultdict(float)
        self.steps = 0
        self.current: str | None = None  # the phase running now (read by the progress heartbeat)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases: {', '.join(PHASES)}")
        t = time.perf_counter()
        outer, self.current = self.current, name
        try:
            yield
        finally:
            self.current = outer
            self.add(name, time.perf_counter() - t)

    def add(self, name: str, seconds: float) -> None:
        self.step[name] += seconds
        self.total[name] += seconds

    def move(self, src: str, dst: str, seconds: float) -> None:
        """Re-attribute ``seconds`` measured inside ``src`` to ``dst`` (e.g. tool time in a rollout)."""
        seconds = min(seconds, self.step[src])
        self.step[src] -= seconds
        self.total[src] -= seconds
        self.add(dst, seconds)

    def end_step(self) -> dict[str, float]:
        """This step's seconds and fractions (``cost/<phase>_s``, ``cost/<phase>_frac``)."""
        total = sum(self.step.values()) or 1.0
        out = {f"cost/{p}_s": self.step.get(p, 0.0) for p in PHASES}
        out.update({f"cost/{p}_frac": self.step.get(p, 0.0) / total for p in PHASES})
        out["cost/step_s"] = sum(self.step.values())
        self.step = defaultdict(float)
        self.steps += 1
        return out

    def fractions(self) -> dict[str, float]:
        total = sum(self.total.values()) or 1.0
        return {p: self.total.get(p, 0.0) / total for p in PHASES}

    def table(self) -> str:
        total = sum(self.total.values())
        lines = [f"{'phase':<22}{'seconds':>10}{'share':>9}", "-" * 41]
        for p in PHASES:
            s = self.total.get(p, 0.0)
            lines.append(f"{p:<22}{s:>10.2f}{(s / total if total else 0.0):>9.1%}")
        lines.append("-" * 41)
        lines.append(f"{'total':<22}{total:>10.2f}{1.0 if total else 0.0:>9.1%}")
        return "\n".join(lines)
