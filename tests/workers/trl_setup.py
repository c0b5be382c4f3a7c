"""What the TRL worker scripts share: the tiny fixed-turns TRACE run they train (the same
settings as tests/test_integration_trl.py) and a digest of a model's weights."""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode())
        h.update(state[key].detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def fixed_turns_run(out: str, rows_per_process: int, **grpo_changes: Any) -> tuple[Any, Any, Any]:
    """(TraceTRLConfig, GRPOConfig, dataset) of two TRACE steps of M(1+N) = 8 rows on the
    fixed-turns family; ``rows_per_process`` × processes must be 8."""
    from trl import GRPOConfig

    from trace_core.envs.families import get_family
    from trace_core.envs.registry import EnvsConfig
    from trace_core.integrations.trl import TraceTRLConfig, task_dataset
    from trace_core.predictor.config import PredictorConfig
    from trace_core.rollout.agent import AgentConfig
    from trace_core.rollout.env import FixedTurnsConfig
    from trace_core.training.config import BudgetConfig

    envs = EnvsConfig(fixed_turns=FixedTurnsConfig(turns=3, prompts=8))
    family = get_family("fixed-turns")
    dataset = task_dataset(family.synthetic_tasks(family.settings(envs)))
    trace = TraceTRLConfig(
        method="trace", budget=BudgetConfig(roots_M=4, expansion_N=1, group_size_G=4, max_per_prompt=4, pool_factor=2),
        task_family="fixed-turns", envs=envs, agent=AgentConfig(max_turns=3, max_new_tokens=6, max_total_tokens=768),
        predictor=PredictorConfig(tiny_hidden_size=32, tiny_intermediate_size=64, tiny_max_positions=1024,
                                  min_prefix_examples=2),
        tool_workers=0)
    args = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, per_device_train_batch_size=rows_per_process,
                      num_generations=2, max_steps=2, learning_rate=1e-3, logging_steps=1, report_to="none",
                      save_strategy="no", gradient_checkpointing=False, seed=0, disable_tqdm=True,
                      dataloader_num_workers=0, **grpo_changes)
    return trace, args, dataset
