"""The main job's cost: how long the whole pipeline takes on this machine, where the time goes, and
how much memory it holds.

The benchmark runs what ``make run`` runs (``python -m pipelines run --local``: prepare data → index
→ warm start → train, evaluate and profile each method → compare) in this process, on a fresh
workspace and a fresh MLflow store, so no stage is reused from an earlier run — the state of a new
clone. The one thing reused is what a clone ships: the warm start's SFT cache entry
(``warm_starts/``), which a clone's first ``make run`` reads too.

Measured:

- **wall time** of the whole run, and of each task from the pipeline's own log (its "Executing
  task" and "finished" lines; a method's train, evaluate and profile tasks are named by method in
  the order the run took them);
- **peak memory**: the largest sum of proportional set sizes (PSS: each page shared by n processes
  counts 1/n in each) over this process and all its children (the tasks kfp.local starts, their
  vLLM engine cores, DeepSpeed workers, sandboxes), sampled every second — the memory the run
  holds. The sum of resident sizes (RSS) is kept beside it: it counts a shared page (torch's
  libraries, a model mapped by several processes) once in every process, so it can exceed the
  machine's memory; a record that holds only that sum (one made before PSS was measured) is judged
  by it only where it stays under the target, since it is an upper bound;
- the **comparison table** the run printed, so the record shows what the time bought.

The tasks run with torch's own thread count, as under ``make run``: the one BLAS/OpenMP thread the
benchmark package sets by default is taken out of their environment (a thread count the caller
set stays).

Targets (the main job's): the whole run within 20 minutes and 12 GiB on the machine it ran on. A
configuration that is not the main job (``--config configs/pipeline-smollm2.yaml``) is measured and
judged against the same targets; a MISS there says how far the real policy is from them.

    .venv/bin/python -m bench.main_job                                         # make run's configuration
    .venv/bin/python -m bench.main_job --config configs/pipeline-smollm2.yaml \\
        --out bench/results/main_job-smollm2.json
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path

from bench import THREAD_VARIABLES, THREADS_DEFAULTED
from bench.harness import Provenance, process_tree_sum, save_figure, verdict, write_json

WALL_TARGET_S = 20 * 60  # the main job's budget on a two-core machine
MEMORY_TARGET_MIB = 12 * 1024  # and its memory
SAMPLE_EVERY_S = 1.0

_STARTED = re.compile(r"^(\d\d:\d\d:\d\d\.\d+) - INFO - Executing task '([^']+)'")
_ENDED = re.compile(r"^(\d\d:\d\d:\d\d\.\d+) - INFO - Task '([^']+)' finished with status (\w+)")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # kfp.local colours task names and statuses


@dataclass(frozen=True)
class TaskTime:
    """One task of the run, as its log tells it."""

    task: str  # kfp's task name, with the method for a per-method task ("train grpo")
    seconds: float  # from its "Executing task" line to its "finished" line
    status: str  # the status kfp.local wrote (SUCCESS, FAILURE)


def task_times(log: str, methods: list[str]) -> list[TaskTime]:
    """The tasks of a kfp.local log in the order they ran. Log lines carry a time of day only: a
    time earlier than the previous one is taken as the next day. A task that runs once per method
    (train, evaluate, profile) is named by ``methods`` in order when it ran once for each."""
    day = timedelta(0)
    last: datetime | None = None
    started: dict[str, datetime] = {}
    done: list[tuple[str, float, str]] = []

    def stamp(text: str) -> datetime:
        nonlocal day, last
        t = datetime.strptime(text, "%H:%M:%S.%f") + day
        if last is not None and t < last:
            day += timedelta(days=1)
            t += timedelta(days=1)
        last = t
        return t

    for line in _COLOUR.sub("", log).splitlines():
        if m := _STARTED.match(line):
            started[m.group(2)] = stamp(m.group(1))
        elif (m := _ENDED.match(line)) and m.group(2) in started:
            t = stamp(m.group(1))
            done.append((m.group(2), (t - started.pop(m.group(2))).total_seconds(), m.group(3)))
    counts = {name: sum(1 for n, _, _ in done if n == name) for name, _, _ in done}
    seen: dict[str, int] = {}
    out = []
    for name, seconds, status in done:
        k = seen.get(name, 0)
        seen[name] = k + 1
        label = f"{name} {methods[k]}" if counts[name] == len(methods) > 1 else name
        out.append(TaskTime(label, seconds, status))
    return out


class PeakMemory:
    """The largest memory of this process tree, sampled on a thread: the sum of proportional set
    sizes (``peak_pss_mib``) and the sum of resident sizes (``peak_mib``, an upper bound)."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S) -> None:
        self.every_s = every_s
        self.peak_mib = 0.0
        self.peak_pss_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self) -> None:
        rss = process_tree_sum(lambda p: p.memory_info().rss)
        pss = process_tree_sum(lambda p: p.memory_full_info().pss)  # Linux: /proc/<pid>/smaps_rollup
        self.peak_mib = max(self.peak_mib, rss / 2**20)
        self.peak_pss_mib = max(self.peak_pss_mib, pss / 2**20)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def judge(wall_s: float, peak_rss_mib: float, peak_pss_mib: float | None = None) -> dict[str, dict]:
    """The verdicts: memory on the PSS sum; without one (an older record), on the RSS sum where it
    stays under the target (an upper bound), else left unjudged, saying why."""
    if peak_pss_mib is not None:
        memory = verdict(peak_pss_mib <= MEMORY_TARGET_MIB, f"{peak_pss_mib / 1024:.1f} GiB (PSS)")
    elif peak_rss_mib <= MEMORY_TARGET_MIB:
        memory = verdict(True, f"{peak_rss_mib / 1024:.1f} GiB (the RSS sum, an upper bound)")
    else:
        memory = (f"not judged: only the RSS sum was measured, {peak_rss_mib / 1024:.1f} GiB, which counts "
                  "every shared page once per process")
    return {"wall": {"label": f"whole run ≤ {WALL_TARGET_S // 60} min",
                     "verdict": verdict(wall_s <= WALL_TARGET_S, f"{wall_s:.0f} s")},
            "memory": {"label": f"peak memory ≤ {MEMORY_TARGET_MIB // 1024} GiB", "verdict": memory}}


def plot(tasks: list[TaskTime], title: str, out: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.35 * len(tasks) + 1.2))
    names = [t.task for t in tasks][::-1]
    ax.barh(names, [t.seconds for t in tasks][::-1], color="#4c72b0")
    ax.set_xlabel("seconds")
    ax.set_title(title)
    save_figure(fig, out)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.main_job", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=f"Targets: the whole run ≤ {WALL_TARGET_S // 60} min and ≤ "
                                        f"{MEMORY_TARGET_MIB // 1024} GiB.\n\nExamples:\n"
                                        "  python -m bench.main_job\n"
                                        "  python -m bench.main_job --config configs/pipeline-smollm2.yaml "
                                        "--out bench/results/main_job-smollm2.json")
    ap.add_argument("--config", default=None,
                    help="a pipeline configuration (YAML); default: the main job's own (what make run runs)")
    ap.add_argument("--work", type=Path, default=Path("runs/bench_main_job"),
                    help="the run's workspace and MLflow store; emptied first (not committed)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/main_job.json"))
    ap.add_argument("overrides", nargs="*", help="further PipelineConfig overrides (key=value), applied last")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from pipelines.config import PipelineConfig
    from pipelines.local import run_local
    from trace_core.config import load_config

    work = args.work.resolve()
    overrides = [f"workspace={work / 'pipeline'}", f"train.tracking.tracking_uri=sqlite:///{work / 'mlflow.db'}",
                 *args.overrides]
    cfg = load_config(PipelineConfig, args.config, overrides)  # a bad configuration stops here, before any work
    provenance = Provenance.now()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # Every task runs in a process of its own, started from this environment: as `make run` starts
    # them, with torch's own thread count, not the one thread the benchmark package defaults to.
    for name in THREADS_DEFAULTED:
        os.environ.pop(name, None)
    t0 = time.perf_counter()
    with PeakMemory() as memory:
        result = run_local(cfg)
    wall = time.perf_counter() - t0
    tasks = task_times(result.log.read_text(errors="replace"), list(cfg.methods))
    targets = judge(wall, memory.peak_mib, memory.peak_pss_mib)
    print(f"\n{'task':<22}{'seconds':>10}")
    for t in tasks:
        print(f"{t.task:<22}{t.seconds:>10.0f}")
    print(f"{'whole run':<22}{wall:>10.0f}\npeak memory {memory.peak_pss_mib / 1024:.1f} GiB (PSS; the RSS sum "
          f"{memory.peak_mib / 1024:.1f} GiB)\n")
    for t in targets.values():
        print(f"{t['label']}: {t['verdict']}")
    print(f"\n{result.table}")
    plot_path = args.out.with_suffix(".png")
    plot(tasks, f"Where the time goes: {args.config or 'the main job'} ({wall / 60:.1f} min)", plot_path)
    write_json(args.out, {
        "command": " ".join(["python -m bench.main_job", *(argv if argv is not None else sys.argv[1:])]),
        "commit": provenance.commit, "dirty": provenance.dirty,
        "config": args.config, "overrides": args.overrides, "methods": list(cfg.methods),
        "machine": {"cpus": os.cpu_count(), "memory_gib": round(os.sysconf("SC_PHYS_PAGES")
                                                                * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)},
        "thread_variables": {name: os.environ.get(name) for name in THREAD_VARIABLES},  # None: torch's own
        "wall_s": wall, "peak_pss_mib": memory.peak_pss_mib, "peak_rss_mib": memory.peak_mib,
        "tasks": [asdict(t) for t in tasks],
        "table": result.table, "targets": targets,
    })
    print(f"wrote {args.out} and {plot_path}")


if __name__ == "__main__":
    main()
