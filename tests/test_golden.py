"""Behaviour pinned: two training steps of every registry method, on the transformers engine at a
fixed seed, give the recorded trees, allocations and metrics.

A refactor of the trainer, the executor or a method's rules must leave these files unchanged.
Token ids, loss masks, rewards, tree shapes and allocations must match exactly; floats (sampled
log-probs, losses, predictor scores) to 1e-4, so that a different CPU's last-bit rounding does not
count as a change of behaviour. A deliberate change of behaviour re-records them:

    TRACE_RL_GOLDEN_RECORD=1 .venv/bin/python -m pytest tests/test_golden.py

and the commit says why the figures moved.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny_overrides

from trace_core.config import load_config
from trace_core.methods import METHODS
from trace_core.training.config import TrainConfig

GOLDEN = Path(__file__).resolve().parent / "golden"
RECORD = os.environ.get("TRACE_RL_GOLDEN_RECORD") == "1"
TOLERANCE = 1e-4
# Measured durations and what is derived from them differ run to run: not behaviour.
TIMING_PREFIXES = ("cost/", "time/", "timing/")
TIMING_WORDS = ("seconds", "_s", "wall", "per_s", "throughput")


def is_timing(key: str) -> bool:
    return key.startswith(TIMING_PREFIXES) or any(key.endswith(w) or f"{w}/" in key for w in TIMING_WORDS)


def run_record(method: str, engine, model_dir: Path, out: Path) -> dict[str, Any]:
    from trace_core.training.trainer import Trainer
    from trace_core.tree import load_trees

    overrides = tiny_overrides(model_dir, out, f"sqlite:///{out.parent / 'mlflow.db'}", method, steps=2)
    if METHODS[method].prices_tokens:  # about the trajectories of the others' M(1+N) = 16 at 8 tokens a turn
        overrides += ["budget.tokens_per_step=400", "costs.initial_tokens=24", "costs.initial_turns=3"]
    cfg = load_config(TrainConfig, None, [*overrides, "engine.kind=hf", "seed=3"])
    trainer = Trainer(cfg, engine=engine)
    trainer.run()
    history = trainer.state.history
    steps = []
    for step in range(cfg.steps):
        trees = load_trees(out / "trees" / f"step{step:05d}.jsonl.gz")
        allocation = json.loads((out / "allocations" / f"step{step:05d}.json").read_text())
        metrics = {k: v[step] for k, v in sorted(history.items()) if not is_timing(k)}
        steps.append({"trees": [t.to_dict() for t in trees], "allocation": allocation, "metrics": metrics})
    return {"method": method, "steps": steps}


def compare(expected: Any, actual: Any, where: str) -> None:
    """Exact for ints, strings and structure; floats to TOLERANCE (relative, or absolute near 0)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), where
        assert sorted(expected) == sorted(actual), f"{where}: keys {sorted(set(expected) ^ set(actual))}"
        for k in expected:
            compare(expected[k], actual[k], f"{where}.{k}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(expected) == len(actual), f"{where}: length"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            compare(e, a, f"{where}[{i}]")
    elif isinstance(expected, float) or isinstance(actual, float):
        e, a = float(expected), float(actual)
        if math.isnan(e) or math.isnan(a):
            assert math.isnan(e) and math.isnan(a), f"{where}: {e} vs {a}"
        else:
            assert abs(e - a) <= TOLERANCE * max(1.0, abs(e)), f"{where}: {e} vs {a}"
    else:
        assert expected == actual, f"{where}: {expected!r} vs {actual!r}"


@pytest.mark.parametrize("method", sorted(METHODS))
def test_two_steps_reproduce_the_recorded_behaviour(method, hf_engine, tiny_models, tmp_path) -> None:
    try:
        record = run_record(method, hf_engine, tiny_models[0], tmp_path / method)
    finally:
        hf_engine.load_weights(str(tiny_models[0]))  # the session engine goes back to seed 0
    path = GOLDEN / f"{method}.json.gz"
    # json round trip: the comparison sees what the file holds (tuples as lists, float repr)
    record = json.loads(json.dumps(record, default=float))
    if RECORD:
        GOLDEN.mkdir(exist_ok=True)
        with gzip.open(path, "wt") as f:
            json.dump(record, f, separators=(",", ":"))
        pytest.skip(f"recorded {path.name}")
    assert path.is_file(), f"no golden record for {method}: run with TRACE_RL_GOLDEN_RECORD=1 once"
    with gzip.open(path, "rt") as f:
        expected = json.load(f)
    compare(expected, record, method)
