"""The stages of ``bench/gpu_check.sh``, one process each.

A stage that crashes or hangs costs only itself (the shell records it as failed or timed out) and
every stage starts with a fresh CUDA context. Each stage appends its record to the JSON report as
soon as it finishes, so a run cut short still reports what it did.

    python -m bench.gpu_check_stages STAGE --report FILE --work DIR [--cpu]

Stages: ``install`` (the carried wheels, stdlib only), ``env``, ``engine_tiny``, ``engine_0.5b``
(the transformers rollout engine), ``trace_steps`` (TRACE steps on the fixed-turns task under
DeepSpeed ZeRO-2, a file-based tracker), ``tree_training`` (one packed tree's forward + backward
at 16k and 64k tokens). ``init`` starts a report, ``record`` adds a failed stage's record, and
``wheels`` builds the wheels the check carries (``--wheels-dir``, default ``build/wheels``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# What the bare CUDA image (Python 3.12, torch, transformers) lacks and the check carries as
# wheels, distribution → module: DeepSpeed and its requirements, scipy (trace_core.metrics), and
# typing_extensions (pydantic needs a newer one than torch pins). See bench/gpu_check.md.
CARRIED = {"deepspeed": "deepspeed", "hjson": "hjson", "ninja": "ninja", "psutil": "psutil", "py-cpuinfo": "cpuinfo",
           "pydantic": "pydantic", "pydantic_core": "pydantic_core", "annotated-types": "annotated_types",
           "typing-inspection": "typing_inspection", "msgpack": "msgpack", "einops": "einops", "scipy": "scipy",
           "typing_extensions": "typing_extensions"}
# distributions PyPI ships only as an sdist at the pinned version: built here into pure-Python wheels
BUILT_HERE = ("deepspeed", "antlr4-python3-runtime")
# the image's interpreter and platform, for which the binary wheels are downloaded
WHEEL_TARGET = ("--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
                "--abi", "none", "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                "--platform", "manylinux2014_x86_64", "--platform", "any")


@dataclass(frozen=True)
class CheckSizes:
    """What the stages run at: the GPU check's sizes, or tiny ones for the CPU dry run."""

    device: str  # "cuda" or "cpu"
    engine_model: dict[str, Any]  # TinyQwen3Config fields of the ~0.5B-shaped engine model
    engine_requests: int = 4  # prompts per engine stage
    engine_samples: int = 2  # samples per prompt
    engine_new_tokens: int = 16  # tokens per sample
    trace_steps: int = 3  # TRACE training steps
    trace_overrides: tuple[str, ...] = ()  # TrainConfig overrides on top of the common ones
    tree_model: dict[str, Any] = field(default_factory=dict)  # bench/tree_training.py TinyModel fields
    tree_model_name: str = ""  # how the report names the tree-training model
    tree_sizes: tuple[int, ...] = (16384, 65536)  # distinct tokens of the packed tree (the last is the headline)
    tree_dtype: str = "bfloat16"  # parameters and activations of the tree-training model
    compare_size: int = 16384  # where the dense mask and per-leaf varlen also run


QWEN3_06B_LAYER = dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       intermediate_size=3072)

GPU = CheckSizes(
    device="cuda",
    # Qwen3-0.6B's 28 layers at its widths, the tiny tokenizer's 2k vocabulary: 0.44B parameters
    engine_model=dict(QWEN3_06B_LAYER, num_hidden_layers=28, init_std=0.02),
    trace_steps=3,
    trace_overrides=("budget.roots_M=16", "budget.expansion_N=2", "budget.group_size_G=8",
                     "budget.max_per_prompt=16", "budget.pool_factor=2", "task.envs.fixed_turns.turns=3",
                     "agent.max_new_tokens=16", "policy.dist_backend=nccl", "policy.dtype=bfloat16",
                     "predictor.device=cuda"),
    # Qwen3-0.6B's widths and full 151,936 vocabulary, 8 of its 28 layers, untied: 0.44B parameters
    tree_model=dict(QWEN3_06B_LAYER, vocab_size=151936, num_hidden_layers=8, max_position_embeddings=65536),
    tree_model_name="Qwen3-0.6B widths (hidden 1024, 16/8 heads, MLP 3072, vocab 151,936), 8 layers, 0.44B params",
)

CPU = CheckSizes(
    device="cpu",
    engine_model=dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      intermediate_size=768, num_hidden_layers=4),
    engine_requests=2, engine_samples=2, engine_new_tokens=6,
    trace_steps=2,
    trace_overrides=("budget.roots_M=4", "budget.expansion_N=1", "budget.group_size_G=4", "budget.max_per_prompt=4",
                     "budget.pool_factor=1", "task.envs.fixed_turns.turns=2", "agent.max_new_tokens=6",
                     "policy.dist_backend=gloo", "predictor.device=cpu"),
    tree_model=dict(vocab_size=4096, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=8192),
    tree_model_name="bench/tree_training.py's tiny Qwen3 (hidden 64, 2 layers)",
    tree_sizes=(1024, 2048), tree_dtype="float32", compare_size=1024,
)


# ============================================================================ the report
def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=float) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a report


def init_report(path: Path, mode: str, command: str, check: str = "trace-rl GPU check") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_json(path, {"check": check, "mode": mode, "command": command,
                       "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "stages": []})


def append_stage(path: Path, record: dict) -> None:
    report = json.loads(path.read_text()) if path.exists() else {"stages": []}
    report["stages"].append(record)
    _write_json(path, report)


# ============================================================================ stages
def stage_install(work: Path, sizes: CheckSizes, carried: dict[str, str] = CARRIED) -> dict:
    """Make the carried wheels importable: already there, ``pip install --target``, or (no pip)
    unpack them — a wheel is a zip laid out as site-packages. ``carried``: distribution → module."""
    import importlib.util

    missing = [m for m in carried.values() if importlib.util.find_spec(m) is None]
    wheels = Path(os.environ.get("GPU_CHECK_WHEELS", "")) if os.environ.get("GPU_CHECK_WHEELS") else None
    if not missing:
        return {"action": "none: every carried package is importable"}
    if wheels is None or not wheels.is_dir():
        raise RuntimeError(f"missing {missing} and no wheel directory (--wheels) to install them from")
    site = work / "site"
    site.mkdir(parents=True, exist_ok=True)
    files = sorted(wheels.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--target", str(site), *map(str, files)]
    pip_error = None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        how = "pip install --target" if proc.returncode == 0 else None
        pip_error = None if how else proc.stderr.strip().splitlines()[-3:]
    except (OSError, subprocess.TimeoutExpired) as err:
        how, pip_error = None, str(err)
    if how is None:
        for f in files:
            with zipfile.ZipFile(f) as z:
                z.extractall(site)
        how = "unzipped (no usable pip)"
    return {"action": how, "pip_error": pip_error, "site": str(site), "wheels": [f.name for f in files],
            "missing_before": missing}


def build_wheels(out: Path, lock: Path = REPO / "requirements" / "lock.txt",
                 carried: dict[str, str] = CARRIED) -> list[str]:
    """The ``carried`` wheels at the lock file's versions: those of BUILT_HERE built here (pure-Python
    wheels), the rest downloaded for the image's Python 3.12 on x86-64 Linux. Returns the pip commands run."""

    def norm(name: str) -> str:
        return name.lower().replace("_", "-").replace(".", "-")

    pins = {norm(line.split("==")[0]): line.split("==")[1].strip()
            for line in lock.read_text().splitlines() if "==" in line and not line.startswith("#")}
    missing = [d for d in carried if norm(d) not in pins]
    if missing:
        raise ValueError(f"{lock} pins no version of {missing}")
    out.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    built = [[*pip, "wheel", "--no-deps", f"{d}=={pins[norm(d)]}", "-w", str(out)] for d in carried if d in BUILT_HERE]
    downloaded = [f"{d}=={pins[norm(d)]}" for d in carried if d not in BUILT_HERE]
    cmds = built + ([[*pip, "download", "--only-binary=:all:", "--no-deps", *WHEEL_TARGET, "-d", str(out),
                      *downloaded]] if downloaded else [])
    for cmd in cmds:
        subprocess.run(cmd, check=True)
    return [" ".join(c[2:]) for c in cmds]


def stage_env(work: Path, sizes: CheckSizes) -> dict:
    import torch
    import transformers

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "cuda_available": torch.cuda.is_available()}
    for mod in ("deepspeed", "scipy", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as err:  # noqa: BLE001 — reported, the later stages say what it breaks
            out[mod] = f"not importable: {err}"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        nccl = torch.cuda.nccl.version()
        out.update(device=p.name, capability=f"{p.major}.{p.minor}", gpu_memory_gib=p.total_memory / 2**30,
                   cuda=torch.version.cuda, nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl))
    elif sizes.device == "cuda":
        raise RuntimeError("no CUDA device visible")
    return out


def _tiny_policy(work: Path) -> Path:
    from trace_core.models import TinyQwen3Config, build_tiny_qwen3

    path = work / "tiny"
    if not (path / "config.json").is_file():
        build_tiny_qwen3(path, TinyQwen3Config(seed=0))
    return path


def stage_engine(work: Path, sizes: CheckSizes, which: str) -> dict:
    """The transformers rollout engine on a policy directory: generate, then teacher-force."""
    import numpy as np
    import torch

    from trace_core.models import TinyQwen3Config, build_tiny_qwen3
    from trace_core.rollout.engine import EngineConfig, GenerationRequest, SamplingConfig
    from trace_core.rollout.hf_engine import HFEngine, teacher_forced_logprobs

    t0 = time.perf_counter()
    if which == "tiny":
        path = _tiny_policy(work)
    else:
        path = work / "engine_0.5b"
        build_tiny_qwen3(path, TinyQwen3Config(seed=0, **sizes.engine_model))
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine = HFEngine(EngineConfig(model_path=str(path), dtype="float32", max_model_len=1024, seed=0))
    loaded = time.perf_counter() - t0
    params = sum(p.numel() for p in engine.model.parameters())
    prompts = [engine.tokenizer.encode(f"Question {i}: which tool answers this?") for i in range(sizes.engine_requests)]
    sampling = SamplingConfig(n=sizes.engine_samples, max_new_tokens=sizes.engine_new_tokens, temperature=1.0,
                              seed=7, ignore_eos=True)
    engine.submit([GenerationRequest(f"r{i}", p, sampling) for i, p in enumerate(prompts)])
    t0 = time.perf_counter()
    done = []
    while engine.num_pending:
        done += engine.poll()
    gen_s = time.perf_counter() - t0
    tokens = sum(len(s.token_ids) for c in done for s in c.samples)
    first = done[0]
    gap = float(np.max(np.abs(np.array(first.samples[0].logprobs) - np.array(
        teacher_forced_logprobs(engine.model, first.prompt_token_ids, first.samples[0].token_ids)))))
    engine.close()
    return {"model": str(path.name), "parameters": params, "device": str(engine.model.device),
            "note": "the transformers engine runs on the host CPU (it has no device setting)",
            "build_s": built, "load_s": loaded, "generated_tokens": tokens, "generate_s": gen_s,
            "tokens_per_s": tokens / gen_s, "logprob_gap_vs_teacher_forcing": gap,
            "threads": torch.get_num_threads()}


def stage_trace_steps(work: Path, sizes: CheckSizes) -> dict:
    """A few TRACE steps on the fixed-turns task: transformers engine, DeepSpeed ZeRO-2, JSONL tracker."""
    import torch

    from bench.gpu_check_tracker import JsonlTracker
    from trace_core.config import load_config
    from trace_core.training.config import TrainConfig
    from trace_core.training.trainer import Trainer

    skip_figures_without_matplotlib()
    out_dir = work / "trace_run"
    overrides = [
        "method=trace", "advantage=tree", f"steps={sizes.trace_steps}", f"policy_model={_tiny_policy(work)}",
        f"output_dir={out_dir}", "task.family=fixed-turns", "task.envs.fixed_turns.prompts=64", "engine.kind=hf",
        "engine.dtype=float32", "engine.max_model_len=1024", "agent.max_total_tokens=1024",
        "policy.zero_stage=2", "policy.lr=1e-4", "policy.micro_batches=1", "progress=false",
        *sizes.trace_overrides,
    ]
    cfg = load_config(TrainConfig, None, overrides)
    tracker = JsonlTracker(out_dir / "tracker")
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer = Trainer(cfg, tracker=tracker)
    init_s = time.perf_counter() - t0
    summary = trainer.run()
    rec = trainer_record(trainer, summary, tracker, init_s)
    if torch.cuda.is_available():
        rec["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    close_trainer(trainer)
    return rec


def skip_figures_without_matplotlib() -> None:
    """The bare image has no matplotlib: the trainer's end-of-run figures are skipped (the metrics
    and the cost table are still written). The trainer imports the plotting function when a run ends."""
    import trace_core.training.plots as plots

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        plots.training_plots = lambda history: {}


def trainer_record(trainer: Any, summary: dict, tracker: Any, init_s: float) -> dict:
    """What a finished :class:`~trace_core.training.trainer.Trainer` run measured: its policy's
    layout, step times, the cost breakdown, tokens/s, the final metrics and the JSONL tracker's file."""
    cfg = trainer.cfg
    hist = trainer.state.history
    step_s = hist.get("cost/step_s", [])
    gen = hist.get("budget/generated_tokens", [])
    trained = hist.get("policy/trained_tokens", [])
    opt_s = hist.get("cost/policy_optimisation_s", [])
    return {
        "policy": {"zero_stage": cfg.policy.zero_stage, "backend": cfg.policy.dist_backend, "dtype": cfg.policy.dtype,
                   "attn_implementation": cfg.policy.attn_implementation, "world_size": trainer.policy.world_size,
                   "device": str(trainer.policy.device)},
        "steps": summary["steps"], "init_s": init_s, "step_s": step_s,
        "cost_fractions": summary["cost_fractions"], "cost_breakdown": trainer.profiler.table().splitlines(),
        "generated_tokens_per_step": gen,
        "generated_tokens_per_step_s": [g / s for g, s in zip(gen, step_s, strict=True) if s > 0],
        "generated_tokens_per_rollout_s": [g / s for g, s in zip(gen, hist.get("cost/rollout_s", []), strict=True)
                                           if s > 0],
        "policy_trained_tokens_per_s": [t / s for t, s in zip(trained, opt_s, strict=True) if s > 0],
        "final": {k: summary["final"].get(k) for k in ("effective_ratio", "reward/mean", "policy/policy_loss",
                                                        "policy/grad_norm", "predictor/loss")},
        "tracker": {"kind": "JSON lines (bench/gpu_check_tracker.py)", "metric_records": len(tracker.metrics()),
                    "file": str(tracker.dir / "records.jsonl")},
    }


def close_trainer(trainer: Any) -> None:
    """Release the trainer's DeepSpeed engine and the process group it joined."""
    import torch

    trainer.policy.engine.destroy()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def stage_tree_training(work: Path, sizes: CheckSizes) -> dict:
    """One packed tree's forward + backward (bench/tree_training.py's workload) on the device."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from bench.tree_training import TreeShape, build_tree, inputs_for, tree_stats
    from trace_core.tree_packing.attention import model_attention
    from trace_core.tree_packing.logprobs import install_logprob_head, packed_token_logprobs

    device = torch.device(sizes.device)
    dtype = getattr(torch, sizes.tree_dtype)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(Qwen3Config(**sizes.tree_model, tie_word_embeddings=False, attention_dropout=0.0))
    model.to(dtype).train()
    install_logprob_head(model)
    params = sum(p.numel() for p in model.parameters())
    shape = TreeShape()
    vocab = int(sizes.tree_model["vocab_size"])
    meter = _PeakMeter(device)

    def step(path: str, tree, adv) -> None:
        attn = "sdpa" if path == "dense" else "tree"
        model.config._attn_implementation = model_attention(attn)
        pack, pred, mask, weight = inputs_for(path, tree, adv)
        logp = packed_token_logprobs(model, pack, pred, mask, device, attn)
        (-(logp * torch.as_tensor(weight, device=device)).sum() / max(int(mask.sum()), 1)).backward()

    runs = [(s, "tree") for s in sizes.tree_sizes] + [(sizes.compare_size, p) for p in ("varlen", "dense")]
    warm = build_tree(shape, 1024, vocab)[:2]
    for path in ("tree", "varlen", "dense"):
        step(path, *warm)  # kernels, allocator, gradients allocated before any baseline
    results = []
    for size, path in runs:
        tree, adv = build_tree(shape, size, vocab)[:2]
        model.zero_grad(set_to_none=False)
        with meter:
            step(path, tree, adv)
        st = tree_stats(tree)
        results.append({"size": size, "path": path, "sharing_ratio": st["sharing_ratio"],
                        "peak_mib": meter.peak_mib, "seconds": meter.seconds,
                        "distinct_tokens_per_s": st["distinct_tokens"] / meter.seconds})
    by = {(r["size"], r["path"]): r for r in results}
    lo, hi = sizes.tree_sizes[0], sizes.tree_sizes[-1]
    c = sizes.compare_size
    return {"model": sizes.tree_model_name, "parameters": params, "dtype": sizes.tree_dtype,
            "peak_measure": ("torch.cuda.max_memory_allocated rise" if device.type == "cuda"
                             else "RSS rise in one process (rough at these tiny sizes)"),
            "runs": results,
            "peak_ratio_last_over_first": _ratio(by[(hi, "tree")]["peak_mib"], by[(lo, "tree")]["peak_mib"]),
            "token_ratio_last_over_first": hi / lo,
            "tree_over_varlen_tokens_per_s": _ratio(by[(c, "tree")]["distinct_tokens_per_s"],
                                                    by[(c, "varlen")]["distinct_tokens_per_s"])}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


class _PeakMeter:
    """Peak memory rise and seconds of a block: CUDA allocator statistics, or RSS on the CPU."""

    def __init__(self, device: Any) -> None:
        self.device = device

    def __enter__(self) -> _PeakMeter:
        import gc

        import torch

        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        else:
            self._base = _rss_kib("VmRSS") * 1024
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
        self._t = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
        else:
            peak = _rss_kib("VmHWM") * 1024
        self.seconds = time.perf_counter() - self._t
        self.peak_mib = (peak - self._base) / 2**20


def _rss_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _installed_top_levels() -> set[str]:
    """Top-level modules of installed distributions (not the standard library, not this repo)."""
    import importlib.metadata as md

    names: set[str] = set()
    for dist in md.distributions():
        top = dist.read_text("top_level.txt")
        if top:
            names.update(t.strip() for t in top.split() if t.strip())
        else:
            names.update(Path(f.parts[0]).stem for f in (dist.files or []) if f.parts and f.suffix in ("", ".py"))
    return {n for n in names if n.isidentifier() and not n.startswith("_")}


STAGES = {
    "install": stage_install,
    "env": stage_env,
    "engine_tiny": lambda work, sizes: stage_engine(work, sizes, "tiny"),
    "engine_0.5b": lambda work, sizes: stage_engine(work, sizes, "0.5b"),
    "trace_steps": stage_trace_steps,
    "tree_training": stage_tree_training,
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check_stages", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example (the dry run the tests make):\n"
                                        "  bash bench/gpu_check.sh --cpu --out /tmp/gpu_check.json")
    ap.add_argument("stage", choices=[*STAGES, "init", "record", "wheels"])
    ap.add_argument("--report", help="the JSON report each stage appends to")
    ap.add_argument("--work", default=None, help="scratch directory shared by the stages")
    ap.add_argument("--cpu", action="store_true", help="the CPU dry run: tiny sizes, gloo")
    ap.add_argument("--command", default="", help="init: the command line to record")
    ap.add_argument("--name", help="record: the stage")
    ap.add_argument("--status", default="failed", help="record: failed | timeout")
    ap.add_argument("--rc", type=int, default=1, help="record: the stage's exit status")
    ap.add_argument("--seconds", type=float, default=0.0, help="record: how long it ran")
    ap.add_argument("--log", help="record: the stage's log, whose tail goes into the record")
    ap.add_argument("--wheels-dir", default=str(REPO / "build" / "wheels"), help="wheels: where to put them")
    return ap


def record_failed_stage(args: argparse.Namespace, report: Path, extra: dict | None = None) -> None:
    """A stage that did not finish: its status, exit code, time, the tail of its log and ``extra``."""
    tail = Path(args.log).read_text(errors="replace").splitlines()[-15:] if args.log and Path(args.log).exists() \
        else []
    append_stage(report, {"name": args.name, "status": args.status, "rc": args.rc, "seconds": args.seconds,
                          "log_tail": tail, **(extra or {})})


def run_stage(args: argparse.Namespace, report: Path) -> None:
    work = Path(args.work or report.parent / "gpu_check_work")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    record = STAGES[args.stage](work, CPU if args.cpu else GPU)
    # the distributions this stage imported: what the bare image must have, or the check carries
    imported = sorted({m.split(".")[0] for m in list(sys.modules)} & _installed_top_levels())
    append_stage(report, {"name": args.stage, "status": "ok", "seconds": time.perf_counter() - t0, **record,
                          "imported_packages": imported})
    print(json.dumps({"stage": args.stage, "status": "ok"}))


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.stage == "wheels":
        for cmd in build_wheels(Path(args.wheels_dir)):
            print(cmd)
        return 0
    if not args.report:
        ap.error("--report is required")
    report = Path(args.report)
    if args.stage == "init":
        init_report(report, "cpu" if args.cpu else "gpu", args.command)
    elif args.stage == "record":
        record_failed_stage(args, report)
    else:
        run_stage(args, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
