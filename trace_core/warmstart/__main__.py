"""CLI: ``python -m trace_core.warmstart --data data --out runs/warm --tasks math,qa``."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from trace_core.warmstart.demos import DemoConfig
from trace_core.warmstart.evaluate import WarmStartEvalConfig
from trace_core.warmstart.pipeline import (
    DEFAULT_FAMILIES,
    FAMILIES,
    FULL_SFT,
    VIEW_SFT,
    WarmStartConfig,
    run_warm_start,
)
from trace_core.warmstart.policy import WARM_MODEL
from trace_core.warmstart.testbed import TestbedConfig


def parse_args(argv: list[str] | None = None) -> WarmStartConfig:
    sft_d, view_d, demo_d, eval_d = FULL_SFT, VIEW_SFT, DemoConfig(), WarmStartEvalConfig()
    p = argparse.ArgumentParser(
        prog="python -m trace_core.warmstart",
        description="Warm-start a tiny Qwen3 policy: scripted expert demonstrations (with errors), a tokenizer "
        "trained on them, SFT on the model-written tokens, and its success rate per task through the "
        "rollout executor and the real environments.",
        epilog="Examples:\n  python -m trace_core.warmstart --out runs/warm --tasks qa,math\n"
               "  python -m trace_core.warmstart --testbed --out runs/testbed   # the embedded testbed",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", default="data", help="generated data directory (python -m trace_core.data.generate)")
    p.add_argument("--out", default="runs/warm", help="output directory (init/, policy/, demos.jsonl, report.json)")
    p.add_argument("--tasks", default=",".join(DEFAULT_FAMILIES),
                   help=f"comma-separated task families from {FAMILIES} (fc: BFCL, long sequences)")
    p.add_argument("--train-tasks", type=int, default=None, help="demonstrate only the first N training tasks")
    p.add_argument("--epsilon", type=float, default=demo_d.epsilon, help="probability that an expert step is wrong")
    p.add_argument("--demos-per-task", type=int, default=demo_d.demos_per_task)
    p.add_argument("--hidden", type=int, default=WARM_MODEL.hidden_size, help="model width")
    p.add_argument("--layers", type=int, default=WARM_MODEL.num_hidden_layers, help="decoder layers")
    p.add_argument("--heads", type=int, default=WARM_MODEL.num_attention_heads, help="attention heads")
    p.add_argument("--intermediate", type=int, default=WARM_MODEL.intermediate_size, help="MLP width")
    p.add_argument("--vocab", type=int, default=WARM_MODEL.vocab_size, help="tokenizer size (upper bound)")
    p.add_argument("--untied-sft", action="store_true",
                   help="train the output embedding separately from the input one (default: tied during SFT)")
    p.add_argument("--no-copy-init", action="store_true", help="plain random init (no copy_friendly_init)")
    p.add_argument("--view-lr", type=float, default=view_d.lr, help="stage 1 (turn views) learning rate")
    p.add_argument("--view-epochs", type=float, default=view_d.epochs, help="stage 1 epochs (0: skip stage 1)")
    p.add_argument("--view-batch-size", type=int, default=view_d.batch_size, help="stage 1 batch size")
    p.add_argument("--lr", type=float, default=sft_d.lr, help="stage 2 (full demonstrations) learning rate")
    p.add_argument("--epochs", type=float, default=sft_d.epochs, help="stage 2 epochs")
    p.add_argument("--batch-size", type=int, default=sft_d.batch_size, help="stage 2 batch size")
    p.add_argument("--warmup-steps", type=int, default=sft_d.warmup_steps, help="stage 2 linear warm-up steps")
    p.add_argument("--max-length", type=int, default=sft_d.max_length, help="demonstrations are cut to this")
    p.add_argument("--threads", type=int, default=None, help="torch threads for SFT (default: torch's)")
    p.add_argument("--seed", type=int, default=0, help="seeds the error draws, the weights, batch order, sampling")
    p.add_argument("--eval-tasks", type=int, default=50, help="test tasks per family to evaluate (0: skip)")
    p.add_argument("--train-task-ids", default="",
                   help="comma-separated training task ids to demonstrate instead of the first --train-tasks")
    p.add_argument("--real-observations", action="store_true",
                   help="demonstrations observe the real tools (sandbox, retriever), not the experts' stand-ins")
    p.add_argument("--eval-split", choices=["test", "train"], default="test",
                   help="test: held-out tasks; train: the demonstrated tasks (the success RL on them starts from)")
    p.add_argument("--eval-samples", type=int, default=eval_d.samples, help="trajectories per test task (>= 2)")
    p.add_argument("--temperature", type=float, default=eval_d.temperature, help="evaluation sampling temperature")
    p.add_argument("--qa-index", default=None, help="retriever index dir for QA evaluation (default: build one)")
    p.add_argument("--synthetic-kbs", type=int, default=0,
                   help="QA demonstrations also over this many freshly generated knowledge bases (copying, not recall)")
    p.add_argument("--synthetic-questions", type=int, default=200, help="questions per synthetic knowledge base")
    p.add_argument("--testbed", action="store_true",
                   help="QA demonstrations follow the embedded testbed's plan (topics known / unknown / partial) "
                        "over its pool and warm-up split; --eval-split train then measures the pool")
    p.add_argument("--testbed-pool", type=int, default=TestbedConfig.pool_size, help="testbed pool size")
    p.add_argument("--testbed-seed", type=int, default=TestbedConfig.seed, help="seeds the testbed's draws")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    a = p.parse_args(argv)
    families = tuple(t.strip() for t in a.tasks.split(",") if t.strip())
    heads = a.heads
    model = dataclasses.replace(
        WARM_MODEL, seed=a.seed, hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2) if heads % 2 == 0 else 1, intermediate_size=a.intermediate,
        vocab_size=a.vocab,
    )
    return WarmStartConfig(
        data_dir=a.data, out_dir=a.out, families=families, train_tasks=a.train_tasks, eval_tasks=a.eval_tasks,
        eval_split=a.eval_split, real_observations=a.real_observations,
        train_task_ids=tuple(x for x in a.train_task_ids.split(",") if x),
        qa_index=a.qa_index, synthetic_kbs=a.synthetic_kbs, synthetic_questions=a.synthetic_questions,
        demos=DemoConfig(epsilon=a.epsilon, demos_per_task=a.demos_per_task, seed=a.seed),
        model=model,
        copy_init=not a.no_copy_init,
        view_sft=None if a.view_epochs == 0 else dataclasses.replace(
            view_d, lr=a.view_lr, epochs=a.view_epochs, batch_size=a.view_batch_size, max_length=a.max_length,
            seed=a.seed, threads=a.threads, progress=not a.no_progress, tie_embeddings=not a.untied_sft),
        sft=dataclasses.replace(sft_d, lr=a.lr, epochs=a.epochs, batch_size=a.batch_size, max_length=a.max_length,
                                warmup_steps=a.warmup_steps,
                                seed=a.seed, threads=a.threads, progress=not a.no_progress,
                                tie_embeddings=not a.untied_sft),
        eval=WarmStartEvalConfig(samples=a.eval_samples, temperature=a.temperature, seed=a.seed),
        testbed=TestbedConfig(pool_size=a.testbed_pool, seed=a.testbed_seed) if a.testbed else None,
    )


def main(argv: list[str] | None = None) -> int:
    run_warm_start(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
