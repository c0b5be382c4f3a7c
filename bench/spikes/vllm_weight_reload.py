"""Spike 1: load new policy weights into a running vLLM engine without a restart.

For each (process layout, model size) it runs a fresh Python process that
  1. imports vLLM and starts an engine (= what a restart costs: the cold start),
  2. generates a batch (sampled, n=2) so the prefix cache holds blocks,
  3. loads the weights of another seed in place (state dict, then a saved directory) — each
     `VLLMEngine.load_weights` call includes `reset_prefix_cache`,
  4. checks the reload really took: the engine's log-probs of freshly sampled tokens are compared
     with transformers' teacher-forced log-probs of the NEW weights (and of the old ones),
  5. closes the engine and starts a new one in the same process (the cheapest possible restart).

Run:  .venv/bin/python bench/spikes/vllm_weight_reload.py            (all layouts and sizes)
      .venv/bin/python bench/spikes/vllm_weight_reload.py --quick    (tiny model only)
Writes bench/results/spike_vllm_weight_reload.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "spike_vllm_weight_reload.json"

SIZES = {
    # name: TinyQwen3Config overrides
    "tiny": {},  # hidden 128, 2 layers: 0.8M parameters
    "medium": {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2,
               "head_dim": 128, "intermediate_size": 3072},  # ~104M parameters
}


def run_case(layout: str, size: str, reps: int) -> dict:
    """One case, inside its own process (called with --case)."""
    t_process = time.perf_counter()
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from trace_core.models import TinyQwen3Config, build_tiny_qwen3
    from trace_core.rollout import EngineConfig, GenerationRequest, SamplingConfig, generate
    from trace_core.rollout.hf_engine import teacher_forced_logprobs

    tmp = Path(tempfile.mkdtemp(prefix="spike_reload_"))
    old_dir = build_tiny_qwen3(tmp / "seed0", TinyQwen3Config(seed=0, **SIZES[size]))
    new_dir = build_tiny_qwen3(tmp / "seed1", TinyQwen3Config(seed=1, **SIZES[size]))
    n_params = sum(t.numel() for t in load_file(str(new_dir / "model.safetensors")).values())
    cfg = EngineConfig(model_path=str(old_dir), kv_cache_bytes=256 << 20, max_model_len=1024,
                       multiprocess=(layout == "multiprocess"))

    t0 = time.perf_counter()
    from trace_core.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(cfg)
    cold_start_s = time.perf_counter() - t0  # import vllm + engine init, as a restarted worker pays it

    prompt = list(range(10, 140))
    reqs = [GenerationRequest(f"r{i}", prompt[i:], SamplingConfig(n=2, max_new_tokens=24, seed=i, ignore_eos=True))
            for i in range(4)]
    generate(engine, reqs)

    state_new = AutoModelForCausalLM.from_pretrained(new_dir, dtype=torch.float32).state_dict()
    state_old = AutoModelForCausalLM.from_pretrained(old_dir, dtype=torch.float32).state_dict()
    sd_times, dir_times = [], []
    for _ in range(reps):
        t = time.perf_counter()
        engine.load_weights(state_new)
        sd_times.append(time.perf_counter() - t)
        engine.load_weights(state_old)
    for _ in range(reps):
        t = time.perf_counter()
        engine.load_weights(str(new_dir))
        dir_times.append(time.perf_counter() - t)
        engine.load_weights(str(old_dir))

    engine.load_weights(state_new)
    out = generate(engine, reqs)
    model_new = AutoModelForCausalLM.from_pretrained(new_dir, dtype=torch.float32).eval()
    model_old = AutoModelForCausalLM.from_pretrained(old_dir, dtype=torch.float32).eval()
    diff_new, diff_old = 0.0, 0.0
    for c in out:
        for s in c.samples:
            got = np.array(s.logprobs)
            diff_new = max(diff_new, float(np.abs(got - teacher_forced_logprobs(model_new, c.prompt_token_ids,
                                                                                s.token_ids)).max()))
            diff_old = max(diff_old, float(np.abs(got - teacher_forced_logprobs(model_old, c.prompt_token_ids,
                                                                                s.token_ids)).max()))
    cached_after_reload = [c.num_cached_tokens for c in out]

    t = time.perf_counter()
    engine.close()
    close_s = time.perf_counter() - t
    t = time.perf_counter()
    engine = VLLMEngine(cfg)
    generate(engine, reqs[:1])
    warm_restart_s = time.perf_counter() - t
    engine.close()
    return {
        "layout": layout, "size": size, "params": n_params,
        "cold_start_s": cold_start_s, "case_total_s": time.perf_counter() - t_process,
        "reload_state_dict_s": statistics.median(sd_times), "reload_state_dict_all_s": sd_times,
        "reload_dir_s": statistics.median(dir_times), "reload_dir_all_s": dir_times,
        "max_abs_logprob_diff_vs_new_weights": diff_new, "max_abs_logprob_diff_vs_old_weights": diff_old,
        "num_cached_tokens_first_batch_after_reload": cached_after_reload,
        "close_s": close_s, "in_process_restart_s": warm_restart_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model only")
    parser.add_argument("--reps", type=int, default=5, help="reloads timed per source")
    parser.add_argument("--case", nargs=2, metavar=("LAYOUT", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print("RESULT " + json.dumps(run_case(*args.case, args.reps)), flush=True)
        return

    sizes = ["tiny"] if args.quick else list(SIZES)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    rows = []
    for size in sizes:
        for layout in ("in_process", "multiprocess"):
            proc = subprocess.run([sys.executable, __file__, "--case", layout, size, "--reps", str(args.reps)],
                                  capture_output=True, text=True, env=env, cwd=ROOT)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode or not lines:
                rows.append({"layout": layout, "size": size, "error": proc.stderr[-2000:]})
                print(f"{layout}/{size} FAILED:\n{proc.stderr[-2000:]}")
                continue
            rows.append(json.loads(lines[-1][len("RESULT "):]))

    header = (f"{'layout':<13}{'size':<8}{'params':>11}{'cold start':>12}{'reload sd':>11}{'reload dir':>12}"
              f"{'restart in-proc':>17}{'|dlp| new':>11}{'|dlp| old':>11}")
    print(header)
    for r in rows:
        if "error" in r:
            continue
        print(f"{r['layout']:<13}{r['size']:<8}{r['params']:>11,}{r['cold_start_s']:>11.1f}s"
              f"{r['reload_state_dict_s']:>10.3f}s{r['reload_dir_s']:>11.3f}s{r['in_process_restart_s']:>16.1f}s"
              f"{r['max_abs_logprob_diff_vs_new_weights']:>11.1e}{r['max_abs_logprob_diff_vs_old_weights']:>11.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"command": " ".join(["bench/spikes/vllm_weight_reload.py"] + sys.argv[1:]),
                                   "machine": f"{os.cpu_count()} CPUs", "rows": rows}, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":  # vLLM spawns its engine core in multiprocess mode: the guard is required
    main()
