"""TraceGRPOTrainer on several processes (DDP over gloo on the CPU): two TRACE steps on the tiny
random Qwen3 with the fixed-turns family; each process writes what it saw to OUT/rank<R>.json.

    torchrun --nproc_per_node=2 tests/workers/trl_processes.py MODEL_DIR OUT

Per process: the last step's pool, plan and trees (every process should hold all of them), the
prompts it rolled out itself, the rows it trained on, the advantages of every row, TRL's
``num_items_in_batch``, and digests of the policy and predictor weights before and after.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from trl_setup import digest, fixed_turns_run


def main(model_dir: str, out: str) -> None:
    from trace_core.integrations.trl import TraceGRPOTrainer, prompt_shares

    # two processes × 4 rows = TRL's generation batch of M(1+N) = 8 rows
    trace, args, dataset = fixed_turns_run(out, rows_per_process=4)
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
