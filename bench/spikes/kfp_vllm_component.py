"""Spike 2: run a vLLM engine inside a `kfp.local` SubprocessRunner component.

A two-step pipeline, as the real one will have it: `build_tiny_policy` writes the tiny Qwen3 into
an output Model artifact, `vllm_rollout` starts `VLLMEngine` on it, generates a batch, reloads
weights in place, and reports timings as Metrics plus a JSON string. It runs once with the engine
core in the component's process and once with vLLM's multiprocess layout (engine core spawned
from inside the component's process).

What it needs (all of it in this file):
- the components live in a real file (kfp reads their source; `python -` gives nothing);
- `local.init(runner=local.SubprocessRunner(use_venv=False))`: the task runs with this venv's
  interpreter (`sys.executable`), where `trace_core` is installed (editable), so the component
  body simply imports it; nothing is pip-installed (`packages_to_install` would go into this venv);
- the pipeline is started under `if __name__ == "__main__"`: this file is also imported by kfp's
  executor inside the task, and vLLM's spawned processes re-import the task's main module.

Run:  .venv/bin/python bench/spikes/kfp_vllm_component.py
Writes bench/results/spike_kfp_vllm_component.json.
"""

# No `from __future__ import annotations`: kfp reads the component signatures' annotations as types.
import json
import sys
import tempfile
import time
from pathlib import Path

from kfp import dsl, local
from kfp.dsl import Input, Metrics, Model, Output

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "spike_kfp_vllm_component.json"


@dsl.component
def build_tiny_policy(seed: int, policy: Output[Model]):
    """Build the pinned tiny Qwen3 (weights from `seed`) into the artifact directory."""
    from trace_core.models import TinyQwen3Config, build_tiny_qwen3

    build_tiny_qwen3(policy.path, TinyQwen3Config(seed=seed))
    policy.metadata["seed"] = seed


@dsl.component
def vllm_rollout(policy: Input[Model], multiprocess: bool, n_requests: int, max_new_tokens: int,
                 metrics: Output[Metrics]) -> str:
    """Start vLLM on the policy, generate, reload weights in place, generate again; report JSON."""
    import json
    import os
    import tempfile
    import time

    t0 = time.perf_counter()
    from trace_core.models import TinyQwen3Config, build_tiny_qwen3
    from trace_core.rollout import EngineConfig, GenerationRequest, SamplingConfig, generate
    from trace_core.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(EngineConfig(model_path=policy.path, kv_cache_bytes=256 << 20, max_model_len=1024,
                                     multiprocess=multiprocess))
    start_s = time.perf_counter() - t0
    prompt = list(range(10, 200))
    reqs = [GenerationRequest(f"r{i}", prompt[i:], SamplingConfig(n=2, max_new_tokens=max_new_tokens, seed=i,
                                                                  ignore_eos=True)) for i in range(n_requests)]
    t = time.perf_counter()
    first = generate(engine, reqs)
    gen_s = time.perf_counter() - t
    new_dir = build_tiny_qwen3(os.path.join(tempfile.mkdtemp(), "seed1"), TinyQwen3Config(seed=1))
    t = time.perf_counter()
    engine.load_weights(str(new_dir))
    reload_s = time.perf_counter() - t
    second = generate(engine, reqs)
    engine.close()
    tokens = sum(len(s.token_ids) for c in first for s in c.samples)
    changed = sum(a.token_ids != b.token_ids for c1, c2 in zip(first, second, strict=True)
                  for a, b in zip(c1.samples, c2.samples, strict=True))
    result = {"pid": os.getpid(), "engine_start_s": start_s, "generate_s": gen_s, "tokens": tokens,
              "tok_per_s": tokens / gen_s, "reload_s": reload_s, "samples_changed_by_reload": changed,
              "samples": sum(len(c.samples) for c in first),
              "num_cached_tokens": [c.num_cached_tokens for c in second]}
    for key in ("engine_start_s", "generate_s", "tok_per_s", "reload_s"):
        metrics.log_metric(key, float(result[key]))
    return json.dumps(result)


@dsl.pipeline(name="vllm-in-kfp-local")
def spike_pipeline(multiprocess: bool = False, n_requests: int = 8, max_new_tokens: int = 32) -> str:
    policy = build_tiny_policy(seed=0)
    return vllm_rollout(policy=policy.outputs["policy"], multiprocess=multiprocess, n_requests=n_requests,
                        max_new_tokens=max_new_tokens).outputs["Output"]


def main() -> None:
    root = tempfile.mkdtemp(prefix="kfp_vllm_spike_")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root, raise_on_error=True)
    rows = []
    for multiprocess in (False, True):
        t = time.perf_counter()
        try:
            out = json.loads(spike_pipeline(multiprocess=multiprocess).output)
            out.update(ok=True)
        except Exception as exc:  # the spike reports failures instead of stopping
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[-2000:]}
        out.update(layout="multiprocess" if multiprocess else "in_process", pipeline_wall_s=time.perf_counter() - t)
        rows.append(out)
    print(f"{'layout':<14}{'ok':<5}{'pipeline':>10}{'engine start':>14}{'tok/s':>9}{'reload':>9}{'changed':>10}")
    for r in rows:
        if not r["ok"]:
            print(f"{r['layout']:<14}{'no':<5}{r['pipeline_wall_s']:>9.1f}s  {r['error'][:200]}")
            continue
        print(f"{r['layout']:<14}{'yes':<5}{r['pipeline_wall_s']:>9.1f}s{r['engine_start_s']:>13.1f}s"
              f"{r['tok_per_s']:>9.0f}{r['reload_s']:>8.2f}s{r['samples_changed_by_reload']:>6}/{r['samples']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"command": "bench/spikes/kfp_vllm_component.py " + " ".join(sys.argv[1:]),
                                   "rows": rows}, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":  # kfp's executor imports this file inside the task; never run the pipeline then
    main()
