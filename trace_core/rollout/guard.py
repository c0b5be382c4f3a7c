"""A rollout engine that fails loudly: crashes and hangs become one clear :class:`EngineFault`.

Training calls the engine thousands of times; an engine that raises deep inside vLLM, or stops
answering (a deadlocked worker, a wedged device), must neither crash the step with an unrelated
traceback nor hang the run forever. :class:`GuardedEngine` wraps any :class:`RolloutEngine`:

- **crash**: any exception out of ``submit``/``poll``/``load_weights`` is re-raised as
  ``EngineFault`` naming the call and the original error (chained). After a fault the engine is
  marked broken and every later call raises at once: its state is unknown, so nothing more is
  generated with it.
- **death**: an engine whose process can die (``inner.death()`` says why, in words) is watched
  too: a death during a ``poll`` stops the call at once (the same signal as a hang), and any fault
  after it names the death rather than the engine's own generic error.
- **hang**: a daemon watchdog thread times each ``poll``. When one runs past ``poll_timeout_s`` it
  sends SIGUSR1 to the main thread, whose handler (installed when the guard is built on the main
  thread) raises inside the stuck call — a real signal wakes blocking waits and sleeps, which a
  flag set with ``_thread.interrupt_main`` does not; it surfaces in ``poll`` as an
  ``EngineFault`` saying the engine hung. Native code that never returns to the interpreter
  cannot be interrupted; after a further ``hard_exit_after_s`` the watchdog prints the same
  message to stderr and ends the process with status :data:`EXIT_ENGINE_HUNG` — the training
  checkpoint on disk is the last complete one either way (it is written atomically), so the run
  resumes from it.

The caller (the trainer) turns the fault into a stop with a clear error; it does not retry in the
same process, because a crashed or hung engine's memory and workers are in an unknown state.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from trace_core.rollout.engine import Completion, GenerationRequest, RolloutEngine, WeightsSource

EXIT_ENGINE_HUNG = 75  # the process status when a hung engine could not be interrupted


class EngineFault(RuntimeError):
    """The rollout engine crashed or hung; its message names the call and what happened."""


class _EngineHung(BaseException):
    """Raised in the main thread by the watchdog's signal; ``poll`` turns it into an EngineFault.
    A BaseException so that no ``except Exception`` inside the engine swallows it."""


@dataclass(frozen=True)
class EngineGuardConfig:
    poll_timeout_s: float = 600.0  # longest one engine step (poll) may take before it counts as hung; 0 = no watchdog
    hard_exit_after_s: float = 60.0  # after an unanswered interrupt, end the process with EXIT_ENGINE_HUNG

    def __post_init__(self) -> None:
        if self.poll_timeout_s < 0 or self.hard_exit_after_s <= 0:
            raise ValueError(f"poll_timeout_s must be >= 0 and hard_exit_after_s > 0, got {self.poll_timeout_s}, "
                             f"{self.hard_exit_after_s}")


class GuardedEngine:
    """``GuardedEngine(engine, EngineGuardConfig(...))``: the same contract, faults made explicit."""

    def __init__(self, inner: RolloutEngine, config: EngineGuardConfig | None = None) -> None:
        self.inner = inner
        self.config = config or EngineGuardConfig()
        self.broken: str | None = None  # the fault that broke it
        self._poll_started: float | None = None
        self._timed_out = False
        self._died: str | None = None  # the engine process's death, seen by the watchdog during a poll
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._main = threading.main_thread().ident
        if self.config.poll_timeout_s > 0 and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self._on_signal)
            self._watchdog = threading.Thread(target=self._watch, name="engine-watchdog", daemon=True)
            self._watchdog.start()

    # ------------------------------------------------------------------ the contract
    def submit(self, requests: Sequence[GenerationRequest]) -> None:
        self._call("submit", self.inner.submit, requests)

    def poll(self) -> list[Completion]:
        with self._lock:
            self._poll_started, self._timed_out = time.monotonic(), False
        try:
            return self._call("poll", self.inner.poll)
        except _EngineHung:
            if self._died is not None:
                raise self._fail(f"the rollout engine failed in poll: {self._died}") from None
            raise self._fail(f"the rollout engine hung: one engine step (poll) did not return within "
                             f"{self.config.poll_timeout_s:g} s") from None
        finally:
            with self._lock:
                self._poll_started = None

    @property
    def num_pending(self) -> int:
        return self.inner.num_pending

    def load_weights(self, weights: WeightsSource) -> None:
        self._call("load_weights", self.inner.load_weights, weights)

    def close(self) -> None:
        self.stop_watchdog()
        self.inner.close()

    def stop_watchdog(self) -> None:
        """Stop timing polls (the engine itself stays usable, unguarded against hangs)."""
        self._stop.set()

    def __getattr__(self, name: str):  # engine-specific extras (stats, config) pass through
        return getattr(self.inner, name)

    # ------------------------------------------------------------------ faults
    def _on_signal(self, signum, frame) -> None:
        # Only while a poll of ours is still running: a signal that lands just after it returned
        # must not raise somewhere else in the caller.
        if self._poll_started is not None and self._timed_out:
            raise _EngineHung

    def _fail(self, message: str) -> EngineFault:
        self.broken = message
        return EngineFault(message)

    def _call(self, name: str, fn, *args):
        if self.broken is not None:
            raise EngineFault(f"the rollout engine is unusable after an earlier fault: {self.broken}")
        try:
            return fn(*args)
        except (EngineFault, _EngineHung, KeyboardInterrupt):
            raise
        except Exception as err:  # noqa: BLE001 - any engine error is a fault of the engine
            cause = self._death() or f"{type(err).__name__}: {err}"
            raise self._fail(f"the rollout engine failed in {name}: {cause}") from err

    def _death(self) -> str | None:
        """Why the engine's process died (None: it did not, or the engine cannot tell)."""
        death = getattr(self.inner, "death", None)
        return death() if callable(death) else None

    def _watch(self) -> None:
        interrupted_at: float | None = None
        while not self._stop.wait(min(1.0, self.config.poll_timeout_s / 4)):
            with self._lock:
                started = self._poll_started
                now = time.monotonic()
                if started is None:
                    interrupted_at = None
                    continue
                died = None if self._timed_out else self._death()
                if not self._timed_out and (died is not None or now - started > self.config.poll_timeout_s):
                    self._timed_out, self._died, interrupted_at = True, died, now
                    signal.pthread_kill(self._main, signal.SIGUSR1)
                    continue
            if interrupted_at is not None and now - interrupted_at > self.config.hard_exit_after_s:
                print(f"the rollout engine hung: one engine step (poll) did not return within "
                      f"{self.config.poll_timeout_s:g} s and could not be interrupted; stopping the process. "
                      "The last checkpoint is complete: rerun the same command to resume from it.",
                      file=sys.stderr, flush=True)
                os._exit(EXIT_ENGINE_HUNG)
