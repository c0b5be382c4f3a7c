"""Faults of the rollout engine made explicit: a crash or a hang inside the real engine becomes one
EngineFault naming what happened, the engine is marked broken, and a user's Ctrl-C stays a Ctrl-C.
The faults are injected around the real transformers engine."""

from __future__ import annotations

import time

import pytest
from conftest import FaultyEngine

from trace_core.rollout.engine import GenerationRequest, SamplingConfig, generate
from trace_core.rollout.guard import EngineFault, EngineGuardConfig, GuardedEngine

pytestmark = pytest.mark.faults  # selected by `make faults`; the tests with `fault` are its injections
FAULT_AREA = "rollout engine"


CRASH = RuntimeError("CUDA error: an illegal memory access was encountered (injected)")


def _requests(tag: str, n: int = 2) -> list[GenerationRequest]:
    return [GenerationRequest(f"{tag}-{i}", [1, 2, 3, 4 + i], SamplingConfig(max_new_tokens=4, seed=i))
            for i in range(n)]


def _drain(engine) -> None:
    while engine.num_pending:  # leave the shared engine idle for the next test
        engine.poll()


def test_a_healthy_engine_is_unchanged_behind_the_guard(hf_engine) -> None:
    guarded = GuardedEngine(hf_engine, EngineGuardConfig(poll_timeout_s=30))
    plain = generate(hf_engine, _requests("plain"))
    same = generate(guarded, _requests("plain"))
    assert [c.samples[0].token_ids for c in plain] == [c.samples[0].token_ids for c in same]
    guarded._stop.set()


def test_a_crash_in_the_engine_is_one_fault_naming_it_and_breaks_the_engine(hf_engine, fault) -> None:
    guarded = GuardedEngine(FaultyEngine(hf_engine, 2, CRASH), EngineGuardConfig(poll_timeout_s=30))
    try:
        with pytest.raises(EngineFault, match="failed in poll: RuntimeError: CUDA error") as err:
            generate(guarded, _requests("crash"))
        assert isinstance(err.value.__cause__, RuntimeError)
        with pytest.raises(EngineFault, match="unusable after an earlier fault"):
            guarded.submit(_requests("after"))
    finally:
        guarded._stop.set()
        _drain(hf_engine)


def test_a_hung_engine_is_interrupted_and_reported(hf_engine, fault) -> None:
    guarded = GuardedEngine(FaultyEngine(hf_engine, 1, None), EngineGuardConfig(poll_timeout_s=0.5))
    try:
        t0 = time.monotonic()
        with pytest.raises(EngineFault, match=r"hung: one engine step \(poll\) did not return within 0.5 s"):
            generate(guarded, _requests("hang"))
        assert time.monotonic() - t0 < 60  # interrupted, not slept out
        assert guarded.broken is not None
    finally:
        guarded._stop.set()
        _drain(hf_engine)


def test_a_users_interrupt_is_not_taken_for_a_hang(hf_engine, fault) -> None:
    class _Interrupted(FaultyEngine):
        def poll(self):
            raise KeyboardInterrupt

    guarded = GuardedEngine(_Interrupted(hf_engine, 1, CRASH), EngineGuardConfig(poll_timeout_s=30))
    try:
        with pytest.raises(KeyboardInterrupt):
            generate(guarded, _requests("ctrl-c"))
        assert guarded.broken is None
    finally:
        guarded._stop.set()
        _drain(hf_engine)


def test_bad_guard_settings() -> None:
    with pytest.raises(ValueError, match="poll_timeout_s"):
        EngineGuardConfig(poll_timeout_s=-1)
