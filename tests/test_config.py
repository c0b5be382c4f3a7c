"""Typed config loading: YAML + overrides, strict keys and types."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from trace_core.config import ConfigError, dump_yaml, flatten, load_config


@dataclass
class Inner:
    steps: int = 3  # number of steps
    lr: float = 1e-3  # learning rate
    seeds: list[int] = field(default_factory=lambda: [0])


@dataclass
class Outer:
    method: Literal["grpo", "trace"] = "trace"
    name: str = "run"
    debug: bool = False
    inner: Inner = field(default_factory=Inner)
    note: str | None = None

    def __post_init__(self) -> None:
        if self.inner.steps < 1:
            raise ValueError(f"inner.steps = {self.inner.steps} must be >= 1")


def test_defaults_yaml_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("method: grpo\ninner:\n  lr: 0.5\n")
    cfg = load_config(Outer, path, ["inner.steps=7", "debug=true", "inner.seeds=[1, 2]", "note=hello"])
    assert cfg == Outer(method="grpo", debug=True, inner=Inner(steps=7, lr=0.5, seeds=[1, 2]), note="hello")
    assert flatten(cfg)["inner.steps"] == 7
    # Round trip through YAML gives the same config.
    path.write_text(dump_yaml(cfg))
    assert load_config(Outer, path) == cfg


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["inner.stepz=3"], "unknown key inner.stepz in inner; known keys: lr, seeds, steps"),
        (["methd=grpo"], "unknown key methd"),
        (["method=ppo"], "method: 'ppo' is not one of \\['grpo', 'trace'\\]"),
        (["inner.steps=many"], "inner.steps: expected an integer, got 'many'"),
        (["inner.lr=fast"], "inner.lr: expected a number"),
        (["debug=maybe"], "debug: expected true/false"),
        (["inner.steps=0"], "inner.steps = 0 must be >= 1"),
        (["inner.steps"], "must look like key=value"),
        (["inner=3"], "inner: expected a mapping"),
    ],
)
def test_bad_keys_and_values_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(Outer, None, overrides)


def test_missing_or_malformed_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Outer, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(Outer, bad)
