"""The shipped training configs load strictly, and bad overrides name their key."""

from __future__ import annotations

from pathlib import Path

import pytest

from trace_core.config import ConfigError, flatten, load_config
from trace_core.training.config import TrainConfig

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_config_loads(path: Path) -> None:
    cfg = load_config(TrainConfig, path)
    assert cfg.budget.spec().total == cfg.budget.roots_M * (1 + cfg.budget.expansion_N)
    assert "budget.roots_M" in flatten(cfg)


def test_paper_config_is_the_paper_setting() -> None:
    cfg = load_config(TrainConfig, Path(CONFIGS[0]).with_name("paper-qwen3-8b.yaml"))
    assert (cfg.budget.roots_M, cfg.budget.expansion_N, cfg.policy.zero_stage) == (1024, 2, 3)
    assert cfg.predictor.backbone_path.endswith("Qwen3-0.6B") and cfg.policy_model.endswith("Qwen3-8B")


@pytest.mark.parametrize(
    ("override", "message"),
    [("method=ppo", "method 'ppo' is not one of"), ("budget.roots_M=12", "not divisible by group_size_G"),
     ("policy.zero_stage=5", "zero_stage must be 0, 1, 2 or 3"), ("polcy.lr=1", "unknown key polcy"),
     ("agent.max_total_tokens=99999", "exceeds engine.max_model_len")],
)
def test_invalid_values_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(TrainConfig, CONFIGS[0], [override])
