"""Soak benchmark: does a long run stay flat? Step time, memory and bytes written per step over
≥ 1,000 training steps on the committed testbed.

A run's state must not grow with its step count: what grows with history (the per-step figures,
the root-outcome history, the token ledger, the tracking records) is appended or bounded by the
pool, never rewritten whole each step. This benchmark trains TRACE with the testbed's
configuration (``configs/testbed.yaml``: real vLLM, DeepSpeed ZeRO-2, the QA environment with its
retriever, a local MLflow store) on the committed testbed policy and pool
(``bench/results/learning/testbed``: a policy with graded success, so steps have mixed groups,
continuations and policy updates), with a checkpoint every step and small steps
(:data:`SMALL_STEP`), for ``--steps`` steps, and samples, at the same point of every step (once
its trees are on disk, before its checkpoint):

- **step time**: wall seconds since the previous sample (so the previous step's checkpoint and
  logging are in it);
- **RSS**: resident memory of this process and its children (the vLLM engine core, the sandbox);
- **bytes written**: characters passed to ``write`` by those processes since the previous sample
  (``/proc/<pid>/io`` ``wchar``: trees, checkpoints, the spool, the MLflow store), and the size of
  the newest checkpoint's ``trainer_state.json``.

Targets (each judged on the means of the first and the last tenth of the steps): the last
tenth's step time, RSS and bytes written per step within 10% of the first tenth's. A rerun of
the same command resumes the run from its last checkpoint and appends to its samples; memory is
then judged only where the first and last tenth were measured by one process.

    .venv/bin/python -m bench.soak [--steps 1000] [--out bench/results/soak.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench.harness import Provenance, process_tree_sum, save_figure, verdict, write_json

TOLERANCE = 0.10  # the last tenth within 10% of the first
# A soak tests what grows with the step count, not learning: small steps (8 trajectories of short
# turns) make a thousand of them fit in half an hour on two cores and make any per-step overhead
# that grows with history (state written whole, records re-read) a larger share of a step.
SMALL_STEP = ("budget.roots_M=4", "budget.expansion_N=1", "budget.group_size_G=4", "budget.max_per_prompt=4",
              "budget.pool_factor=2")
SAMPLES_FILE = "soak_samples.jsonl"


@dataclass(frozen=True)
class Sample:
    """What one step cost, measured once its trees are on disk."""

    step: int
    process: int  # which start of the benchmark measured it (a resumed run counts up)
    wall_s: float  # since the previous sample of the same process (NaN for a process's first)
    rss_mib: float  # this process and its children
    written_mib: float  # characters written since the previous sample (NaN for a process's first)
    state_kib: float  # the newest checkpoint's trainer_state.json (NaN before the first)


# ============================================================================ the figures (pure)
def tenths(values: np.ndarray) -> tuple[float, float]:
    """The mean of the finite values in the first and in the last tenth of ``values`` (at least one each)."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return float("nan"), float("nan")
    n = max(1, values.size // 10)

    def mean(part: np.ndarray) -> float:
        finite = part[np.isfinite(part)]
        return float(finite.mean()) if finite.size else float("nan")

    return mean(values[:n]), mean(values[-n:])


def drift(first: float, last: float) -> float:
    """The relative change from the first tenth to the last (NaN where the first is 0 or undefined)."""
    return (last - first) / first if np.isfinite(first) and np.isfinite(last) and first > 0 else float("nan")


def judge(samples: list[Sample], tolerance: float = TOLERANCE) -> dict[str, dict]:
    """Each figure's first and last tenth, its drift and its verdict. Memory is judged only when
    one process measured both tenths (a restart resets what a process holds)."""
    out: dict[str, dict] = {}
    n = max(1, len(samples) // 10)
    one_process = bool(samples) and samples[0].process == samples[-1].process and \
        len({s.process for s in samples[-n:] + samples[:n]}) == 1
    for key, label in (("wall_s", "step time"), ("rss_mib", "RSS"), ("written_mib", "bytes written per step"),
                       ("state_kib", "trainer_state.json size")):
        first, last = tenths(np.array([getattr(s, key) for s in samples], dtype=float))
        change = drift(first, last)
        figure = f"{first:.4g} -> {last:.4g} ({change:+.1%})"
        if key == "rss_mib" and not one_process:
            result = f"not judged: the run restarted between its first and last tenth ({figure})"
        elif not np.isfinite(change):
            result = f"not judged: undefined ({figure})"
        else:
            result = verdict(abs(change) <= tolerance, figure)
        out[key] = {"label": label, "first_tenth": first, "last_tenth": last, "drift": change, "verdict": result}
    return out


# ============================================================================ measuring
class Meter:
    """Samples this process tree's time, memory and writes at each call of :meth:`sample`."""

    def __init__(self, process: int, checkpoints: Path) -> None:
        self.process = process
        self.checkpoints = checkpoints
        self.last_t: float | None = None
        self.last_written: float | None = None

    def sample(self, step: int) -> Sample:
        now = time.perf_counter()
        written = process_tree_sum(lambda p: p.io_counters().write_chars) / 2**20
        rss = process_tree_sum(lambda p: p.memory_info().rss) / 2**20
        state = self._state_kib()
        s = Sample(step=step, process=self.process,
                   wall_s=float("nan") if self.last_t is None else now - self.last_t, rss_mib=rss,
                   written_mib=float("nan") if self.last_written is None else written - self.last_written,
                   state_kib=state)
        self.last_t, self.last_written = now, written
        return s

    def _state_kib(self) -> float:
        pointer = self.checkpoints / "latest"
        if not pointer.is_file():
            return float("nan")
        state = self.checkpoints / pointer.read_text().strip() / "trainer_state.json"
        return state.stat().st_size / 1024 if state.is_file() else float("nan")


def read_samples(path: Path) -> list[Sample]:
    if not path.is_file():
        return []
    return [Sample(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def soak(args: argparse.Namespace) -> list[Sample]:
    """Train ``args.steps`` steps of the testbed's configuration (resuming a folder's run) and
    return every sample, those of earlier starts first."""
    from trace_core.config import load_config
    from trace_core.training.config import TrainConfig
    from trace_core.training.trainer import Trainer

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    samples_file = work / SAMPLES_FILE
    earlier = read_samples(samples_file)
    process = (earlier[-1].process + 1) if earlier else 0
    cfg = load_config(TrainConfig, args.config, [
        f"method={args.method}", f"steps={args.steps}", f"policy_model={args.testbed}/policy",
        f"output_dir={work / 'run'}", f"task.data_dir={args.data}", f"task.train_file={args.testbed}/pool.jsonl",
        f"task.index_dir={args.testbed}/qa_index", f"predictor_warmup.task_file={args.testbed}/warmup.jsonl",
        "progress=false", "checkpoint_every=1",
        f"tracking.tracking_uri=sqlite:///{(work / 'mlflow.db').resolve()}", "tracking.experiment=bench-soak",
        "pool_success.samples=0", *SMALL_STEP, *args.overrides])
    kept = {s.step for s in earlier}
    every = max(1, args.steps // 20)

    class MeasuredTrainer(Trainer):
        """The trainer, sampled at the seam its tests use: once a step's trees are on disk."""

        def _reached(self, boundary: str, step: int) -> None:
            if boundary != "trees_saved" or step in kept:
                return
            s = meter.sample(step)
            with samples_file.open("a") as f:
                f.write(json.dumps(asdict(s)) + "\n")
            kept.add(step)
            if (step + 1) % every == 0:
                print(f"soak step {step + 1}/{args.steps}: {s.wall_s:.2f} s, RSS {s.rss_mib:.0f} MiB, "
                      f"{s.written_mib:.2f} MiB written, state {s.state_kib:.1f} KiB", flush=True)

    trainer = MeasuredTrainer(cfg)
    meter = Meter(process, trainer._ckpt_root)  # a process's first sample is its baseline (start-up is not a step)
    trainer.run()
    return read_samples(samples_file)


def plot(samples: list[Sample], out: Path) -> None:
    import matplotlib.pyplot as plt

    steps = np.array([s.step for s in samples])
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.4))
    for ax, key, label in zip(axes, ("wall_s", "rss_mib", "written_mib", "state_kib"),
                              ("step time (s)", "RSS, process tree (MiB)", "written per step (MiB)",
                               "trainer_state.json (KiB)"), strict=True):
        ax.plot(steps, [getattr(s, key) for s in samples], lw=0.6)
        ax.set_xlabel("step")
        ax.set_title(label)
    fig.suptitle("Soak: TRACE on the testbed, small steps, a checkpoint every step")
    save_figure(fig, out)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Targets: step time, RSS and bytes written per step in the last tenth "
                                        "within 10% of the first tenth.\n\nExample:\n"
                                        "  python -m bench.soak --steps 1000   # resumes when rerun")
    ap.add_argument("--testbed", default="bench/results/learning/testbed",
                    help="a testbed folder: policy/, pool.jsonl, warmup.jsonl, qa_index/")
    ap.add_argument("--config", default="configs/testbed.yaml")
    ap.add_argument("--data", default="data", help="the generated data folder (make data)")
    ap.add_argument("--method", default="trace")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--work", default="runs/bench_soak", help="the run folder (a rerun resumes it; not committed)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/soak.json"))
    ap.add_argument("overrides", nargs="*", help="further TrainConfig overrides (key=value), applied last")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.steps < 10:
        raise SystemExit(f"--steps must be >= 10 (a tenth of the run is at least one step), got {args.steps}")
    missing = [name for name in ("policy/config.json", "pool.jsonl", "warmup.jsonl", "qa_index")
               if not (Path(args.testbed) / name).exists()]
    if missing:
        raise SystemExit(f"--testbed {args.testbed}: {', '.join(missing)} missing (a testbed folder: "
                         "bench/results/learning/testbed, or one `python -m bench.testbed` built)")
    provenance = Provenance.now()
    t0 = time.perf_counter()
    samples = soak(args)
    targets = judge(samples)
    print(f"\n{'figure':<26}{'first tenth':>13}{'last tenth':>13}{'drift':>9}  verdict")
    for t in targets.values():
        print(f"{t['label']:<26}{t['first_tenth']:>13.4g}{t['last_tenth']:>13.4g}{t['drift']:>+9.1%}  "
              f"{t['verdict'].split(' ')[0]}")
    write_json(args.out, {
        "command": " ".join(["python -m bench.soak", *(argv if argv is not None else sys.argv[1:])]),
        "commit": provenance.commit, "dirty": provenance.dirty,
        "settings": {"config": args.config, "testbed": args.testbed, "method": args.method, "steps": args.steps,
                     "checkpoint_every": 1,
                     "small_step": list(SMALL_STEP), "overrides": args.overrides},
        "steps_measured": len(samples), "processes": len({s.process for s in samples}),
        "targets": targets, "samples": [asdict(s) for s in samples], "wall_s": time.perf_counter() - t0})
    plot(samples, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
