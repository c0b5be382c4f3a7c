"""A progress line at least every ``interval_s`` seconds while long work runs.

Training prints a line per step, but one step's phase (a pool-success measurement, the predictor's
warm-up, a slow rollout) can run for minutes; a user who sees nothing for that long cannot tell a
slow run from a hung one. :class:`Heartbeat` runs a daemon thread that, when no line was printed
for ``interval_s``, prints ``progress: <what is running now>, <seconds in it>``. Callers print their
own lines through :meth:`Heartbeat.line`, which resets the clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType


class Heartbeat:
    """``with Heartbeat(lambda: "train trace step 3/10: rollout"):`` — see the module docstring.

    ``activity``: returns what is running now (called from the heartbeat thread; keep it cheap).
    ``interval_s``: the longest silence; ``enabled=False`` makes every method a no-op except
    :meth:`line`, which still prints."""

    def __init__(self, activity: Callable[[], str], interval_s: float = 25.0, enabled: bool = True) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.activity = activity
        self.interval_s = interval_s
        self.enabled = enabled
        self._last = time.monotonic()
        self._since = time.monotonic()
        self._label = ""
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def line(self, text: str) -> None:
        """Print ``progress: <text>`` now and reset the silence clock."""
        with self._lock:
            print(f"progress: {text}", flush=True)
            self._last = time.monotonic()

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self.interval_s / 4)):
            now = time.monotonic()
            label = self.activity()
            if label != self._label:  # a new activity: time it from here
                self._label, self._since = label, now
            if now - self._last >= self.interval_s:
                self.line(f"{label} (running for {now - self._since:.0f} s)")

    def __enter__(self) -> Heartbeat:
        if self.enabled:
            self._last = self._since = time.monotonic()
            self._thread = threading.Thread(target=self._beat, name="progress-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
