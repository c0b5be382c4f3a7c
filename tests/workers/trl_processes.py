"""TraceGRPOTrainer on several processes (DDP over gloo on the CPU): two TRACE steps on the tiny
random Qwen3 with the fixed-turns family; each process writes what it saw to OUT/rank<R>.json.

    torchrun --nproc_per_node=2 tests/workers/trl_processes.py MODEL_DIR OUT

Per process: the last step's pool, plan and trees (every process should hold all of them), the
prompts it rolled out itself, the rows it trained on, the advantages of every row, TRL's
``num_items_in_batch``, and digests of the policy and predictor weights before and after.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch


def digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode())
        h.update(state[key].detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def main(model_dir: str, out: str) -> None:
    from trl import GRPOConfig

    from trace_core.envs.families import get_family
    from trace_core.envs.registry import EnvsConfig
    from trace_core.integrations.trl import TraceGRPOTrainer, TraceTRLConfig, prompt_shares, task_dataset
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
    # two processes × 4 rows = TRL's generation batch of M(1+N) = 8 rows
    args = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=2,
                      max_steps=2, learning_rate=1e-3, logging_steps=1, report_to="none", save_strategy="no",
                      gradient_checkpointing=False, seed=0, disable_tqdm=True, dataloader_num_workers=0)
    trainer = TraceGRPOTrainer(model_dir, trace, args, dataset)
    batches: list[dict[str, torch.Tensor]] = []
    generate = trainer._generate_and_score_completions

    def keep(inputs):
        batch = generate(inputs)
        batches.append(batch)
        return batch

    trainer._generate_and_score_completions = keep
    policy_before = digest(trainer.model.state_dict())
    predictor_before = digest(trainer.predictor.model.state_dict())
    trainer.train()
    step = trainer.last_step
    rank, processes = trainer.accelerator.process_index, trainer.accelerator.num_processes
    share = prompt_shares(step.plan.m, step.plan.root_cost, processes)[rank]
    own = trainer._own_rows(step.rows)
    record = {
        "rank": rank, "processes": processes, "distributed_type": str(trainer.accelerator.distributed_type),
        "trace_steps": trainer.trace_steps, "pool": [t.id for t in step.pool], "m": step.plan.m.tolist(),
        "trees": [t.to_dict() for t in step.trees], "rows": len(step.rows),
        "share": [step.pool[i].id for i in share],
        "own_rows": [[r.tree, r.trajectory] for r in own],
        "own_batch_rows": int(batches[-1]["completion_ids"].shape[0]),
        "num_items_in_batch": int(batches[-1]["num_items_in_batch"]),
        "row_advantages": [list(map(float, r.advantages)) for r in step.rows],
        "node_advantages": [a.tolist() for a in step.advantages],
        "policy_before": policy_before, "policy_after": digest(trainer.model.state_dict()),
        "predictor_before": predictor_before, "predictor_after": digest(trainer.predictor.model.state_dict()),
        "predictor_updates": trainer.predictor.updates,
        "effective_ratio": float(step.metrics["effective_ratio"]),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(record, default=float))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(*sys.argv[1:3])
