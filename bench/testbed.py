"""Freeze the embedded testbed: its parameters, its policy's success spread over the pool.

Builds the testbed warm start if ``--out`` holds none (``python -m trace_core.warmstart
--testbed``, the pipeline's recipe), then rolls every pool prompt and every warm-up question out
``--samples`` times at T = 1 through the real executor (vLLM, the dense retriever) and reports
the spread: the histogram of per-prompt successes, the shares never / always solved and mixed,
the largest share of the mixed prompts in one interior bin, and GRPO's expected step-0
effective ratio at G = k (the mixed share). Writes ``bench/results/testbed.json`` and ``.png``.

Calibration target (the paper's GRPO at 0.268): GRPO's effective ratio (G = 8) on the pool in
[0.20, 0.40], most prompts never or always solved, no interior bin above half the mixed.

Examples:

    python -m bench.testbed                       # build (~10 min) if needed, then measure (~3 min)
    python -m bench.testbed --out runs/testbed --samples 8
    python -m bench.testbed --out runs/testbed-seed1 --testbed-seed 1 --results bench/results/testbed-seed1.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def build(out: Path, data: str, index: str, testbed_seed: int = 0) -> None:
    cmd = [sys.executable, "-m", "trace_core.warmstart", "--tasks", "qa", "--testbed", "--testbed-seed",
           str(testbed_seed), "--view-epochs", "0",
           "--eval-tasks", "0", "--threads", "2", "--data", data, "--qa-index", index, "--out", str(out),
           "--no-progress", *testbed_sft_flags()]
    print("building the testbed:", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def testbed_sft_flags() -> list[str]:
    from trace_core.warmstart.pipeline import TESTBED_SFT

    return ["--epochs", str(TESTBED_SFT.epochs), "--lr", str(TESTBED_SFT.lr), "--batch-size",
            str(TESTBED_SFT.batch_size), "--warmup-steps", str(TESTBED_SFT.warmup_steps)]


def measure(out: Path, data: str, index: str, samples: int, seed: int) -> dict:
    import torch
    from transformers import AutoTokenizer

    from trace_core.evaluation.success import measure_success
    from trace_core.rollout.agent import AgentConfig
    from trace_core.rollout.engine import EngineConfig
    from trace_core.rollout.executor import TreeRolloutExecutor
    from trace_core.rollout.vllm_engine import VLLMEngine
    from trace_core.seeding import derive_seed
    from trace_core.warmstart.demos import load_tasks
    from trace_core.warmstart.pipeline import env_factory
    from trace_core.warmstart.testbed import spread_of

    torch.set_num_threads(1)
    agent = AgentConfig(max_turns=5, max_new_tokens=96, max_total_tokens=2048)
    engine = VLLMEngine(EngineConfig(model_path=str(out / "policy"), max_model_len=2048, kv_cache_bytes=256 << 20))
    executor = TreeRolloutExecutor(engine, AutoTokenizer.from_pretrained(out / "policy"),
                                   env_factory("qa", data, index), agent)
    result = {}
    try:
        for split in ("pool", "warmup"):
            tasks = load_tasks(out / f"{split}.jsonl")
            t0 = time.perf_counter()
            measured = measure_success(executor, tasks, samples, derive_seed("testbed-spread", seed))
            spread = spread_of(measured.rollouts.trees, samples)
            result[split] = {**spread.to_json(), "grpo_effective_ratio": spread.grpo_effective_ratio,
                             "wall_s": time.perf_counter() - t0, "rollouts": measured.rollouts.stats.trajectories}
    finally:
        engine.close()
    return result


def plot(spread: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, split in zip(axes, ("pool", "warmup"), strict=True):
        h = spread[split]["histogram"]
        k = spread[split]["samples"]
        ax.bar([f"{i}/{k}" for i in range(k + 1)], h, color=["#c44"] + ["#888"] * (k - 1) + ["#4a4"])
        sh = spread[split]["shares"]
        ax.set(xlabel="successes out of k at T = 1", ylabel="prompts",
               title=f"{split}: never {sh['never']:.0%}, always {sh['always']:.0%}, mixed {sh['mixed']:.0%}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.testbed", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/testbed"), help="the testbed warm start's folder")
    ap.add_argument("--data", default="data")
    ap.add_argument("--index", default="artifacts/qa_index")
    ap.add_argument("--samples", type=int, default=8, help="k rollouts per prompt (>= 8)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the spread's sampling")
    ap.add_argument("--testbed-seed", type=int, default=0,
                    help="draws the testbed (its topics' competence, splits, wrong steps): another value redraws "
                         "it, as the pipeline's warm_start.testbed_seed does")
    ap.add_argument("--results", type=Path, default=Path("bench/results/testbed.json"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    if not (args.out / "policy" / "config.json").is_file():
        build(args.out, args.data, args.index, args.testbed_seed)
    bed = json.loads((args.out / "testbed.json").read_text())
    if bed["config"]["seed"] != args.testbed_seed:  # an existing folder is measured as it is, never relabelled
        raise SystemExit(f"--out {args.out} holds the testbed drawn with seed {bed['config']['seed']}, not "
                         f"--testbed-seed {args.testbed_seed}: give another --out, or the seed it was drawn with")
    spread = measure(args.out, args.data, args.index, args.samples, args.seed)
    report = json.loads((args.out / "report.json").read_text())
    pool = spread["pool"]
    targets = {"grpo effective ratio (G = k) in [0.20, 0.40]": 0.20 <= pool["grpo_effective_ratio"] <= 0.40,
               "most prompts never or always solved": pool["shares"]["never"] + pool["shares"]["always"] > 0.5,
               "no interior bin above half the mixed": pool["largest_interior_bin_share"] <= 0.5}
    print(f"testbed {bed['hash']}: pool {len(bed['pool'])}, warm-up {len(bed['warmup'])}, k = {args.samples}")
    for split in ("pool", "warmup"):
        s = spread[split]
        print(f"  {split:7s} histogram {s['histogram']}  never {s['shares']['never']:.3f}  always "
              f"{s['shares']['always']:.3f}  mixed {s['shares']['mixed']:.3f}  mean success {s['mean_success']:.3f}  "
              f"largest interior bin {s['largest_interior_bin_share']:.2f} of the mixed ({s['wall_s']:.0f} s)")
    from bench.harness import git_commit, tree_is_dirty, verdict

    for name, ok in targets.items():
        print(f"  {verdict(ok)}  {name}")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    from trace_core.warmstart.testbed import testbed_identity

    args.results.write_text(json.dumps({
        "command": " ".join(["python -m bench.testbed", *sys.argv[1:]]), "commit": git_commit(),
        "dirty": tree_is_dirty(),
        "identity": testbed_identity(args.out), "hash": bed["hash"], "config": bed["config"],
        "source_md5": bed["source_md5"], "sft": report.get("sft"), "spread": spread,
        "targets": targets, "wall_s": time.perf_counter() - t0}, indent=1))
    plot(spread, args.results.with_suffix(".png"))
    print(f"wrote {args.results} and {args.results.with_suffix('.png')}")


if __name__ == "__main__":
    main()
