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


# ------------------------------------------------------------------ budget rules at load time
@pytest.mark.parametrize("overrides, words", [
    # odd M when M_max = 2: every m_i is 0 or 2
    (["budget.roots_M=9", "budget.group_size_G=3", "budget.max_per_prompt=2"],
     ["budget = 9 is odd", "budget.roots_M = 9", "budget.max_per_prompt = 2"]),
    # M above the pool's capacity B·M_max (B = 1·16/16 = 1 prompt)
    (["budget.roots_M=16", "budget.expansion_N=0", "budget.group_size_G=16", "budget.max_per_prompt=2",
      "budget.pool_factor=1"], ["capacity", "B = pool_factor·M(1+N)/G = 1", "budget.pool_factor = 1"]),
    # M not divisible by G
    (["budget.roots_M=12", "budget.group_size_G=8"], ["not divisible", "budget.roots_M = 12",
                                                        "budget.group_size_G = 8"]),
])
def test_every_budget_rule_is_checked_when_the_config_loads(overrides: list[str], words: list[str]) -> None:
    from trace_core.training.config import TrainConfig

    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, None, ["method=trace", *overrides])
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_a_budget_rule_of_one_method_only_binds_that_method() -> None:
    from trace_core.training.config import TrainConfig

    odd = ["budget.roots_M=9", "budget.group_size_G=3", "budget.max_per_prompt=2"]
    assert load_config(TrainConfig, None, ["method=grpo", *odd]).budget.roots_M == 9  # G per prompt: no m_i
    with pytest.raises(ConfigError, match="method 'pcl'|method 'trace'"):
        load_config(TrainConfig, None, ["method=trace", *odd])


def test_the_advantage_defaults_to_the_method_s_own_and_an_explicit_one_is_kept() -> None:
    from trace_core.advantages import ADVANTAGE_ESTIMATORS
    from trace_core.methods import get_method
    from trace_core.training.config import TrainConfig

    cfg = load_config(TrainConfig, None, ["method=treepo"])
    assert cfg.advantage is None
    assert get_method(cfg.method).advantage_estimator(cfg.advantage) is ADVANTAGE_ESTIMATORS["tree"]
    explicit = load_config(TrainConfig, None, ["method=treepo", "advantage=treepo"])
    assert get_method(explicit.method).advantage_estimator(explicit.advantage) is ADVANTAGE_ESTIMATORS["treepo"]
    with pytest.raises(ConfigError, match="advantage 'ppo'"):
        load_config(TrainConfig, None, ["advantage=ppo"])


def test_a_pool_smaller_than_the_candidate_pool_fails_before_any_model(tmp_path: Path) -> None:
    from trace_core.training.config import TrainConfig
    from trace_core.training.trainer import Trainer

    train = tmp_path / "train.jsonl"
    embedded = Path(__file__).resolve().parents[1] / "data" / "math" / "train.jsonl"
    train.write_text("".join(embedded.read_text().splitlines(keepends=True)[:3]))  # 3 valid rows
    model = tmp_path / "model"  # not loadable: only its config.json, which the path checks read
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = load_config(TrainConfig, None, ["task.family=math", f"task.train_file={train}", "budget.roots_M=8",
                                          "budget.group_size_G=8", f"output_dir={tmp_path / 'out'}",
                                          f"policy_model={model}"])
    with pytest.raises(ValueError, match=r"B = budget.pool_factor·M\(1\+N\)/G = \d+ distinct prompts.*holds only 3"):
        Trainer(cfg)  # the model cannot be loaded: the pool check comes first
    assert not (tmp_path / "out" / "spool").exists()


def test_training_engine_settings_make_the_one_engine_config() -> None:
    from trace_core.rollout.engine import EngineConfig
    from trace_core.training.config import EngineSettings

    settings = EngineSettings(kind="hf", dtype="bfloat16", block_size=16, max_model_len=1024, kv_cache_mb=64,
                              gpu_memory_utilization=0.3, multiprocess=True)
    ec = settings.engine_config("some/model", seed=7)
    assert isinstance(ec, EngineConfig)
    assert (ec.model_path, ec.kind, ec.dtype, ec.seed, ec.block_size, ec.max_model_len) == (
        "some/model", "hf", "bfloat16", 7, 16, 1024)
    assert ec.gpu_memory_utilization == 0.3 and ec.multiprocess
    assert ec.kv_cache_bytes in (64 << 20, None)  # MiB on CPU; the GPU sizes by utilisation
