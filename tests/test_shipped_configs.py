"""The shipped training configs load strictly, and bad overrides name their key."""

from __future__ import annotations

from pathlib import Path

import pytest

from trace_core.config import ConfigError, flatten, load_config
from trace_core.training.config import TrainConfig

# configs/pipeline-*.yaml are whole-pipeline configs (PipelineConfig); the others train one run.
ALL = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
CONFIGS = [p for p in ALL if not p.name.startswith("pipeline-")]
PIPELINE_CONFIGS = [p for p in ALL if p.name.startswith("pipeline-")]


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_config_loads(path: Path) -> None:
    cfg = load_config(TrainConfig, path)
    assert cfg.budget.spec().total == cfg.budget.roots_M * (1 + cfg.budget.expansion_N)
    assert "budget.roots_M" in flatten(cfg)


@pytest.mark.parametrize("path", PIPELINE_CONFIGS, ids=[p.stem for p in PIPELINE_CONFIGS])
def test_shipped_pipeline_config_loads(path: Path) -> None:
    from pipelines.config import PipelineConfig

    cfg = load_config(PipelineConfig, path)
    assert cfg.train.task.family in cfg.warm_start.families


def test_the_real_policy_pipeline_config_warm_starts_smollm2_on_chained_math() -> None:
    from dataclasses import asdict

    from pipelines.config import PipelineConfig
    from pipelines.steps.warm_start import pretrained_config

    path = next(p for p in PIPELINE_CONFIGS if p.stem == "pipeline-smollm2")
    cfg = load_config(PipelineConfig, path, ["warm_start.testbed_seed=3", "warm_start.lr=2e-5"])
    assert cfg.warm_start.policy == "smollm2" and cfg.train.task.family == "math"
    assert cfg.train.predictor.vocab_size >= 49152  # the tiny predictor reads SmolLM2's token ids
    ws = pretrained_config(asdict(cfg.warm_start), asdict(cfg.train.agent), "out")
    assert (ws.chains.seed, ws.sft.lr, ws.out_dir) == (3, 2e-5, "out")
    assert ws.agent.max_new_tokens == cfg.train.agent.max_new_tokens
    with pytest.raises(ConfigError, match=r"warm_start.families must be \[math\]"):
        load_config(PipelineConfig, path, ["warm_start.families=[qa]", "train.task.family=qa"])


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
