"""``trace-rl`` command line: train (and the tools around it).

    trace-rl train --config configs/embedded.yaml method=grpo steps=3
    trace-rl show-config --config configs/embedded.yaml
    trace-rl deliver runs/trace/spool

Nothing heavy is imported before the arguments are parsed: ``--help`` answers at once. A bad input
(a configuration value, a path, the data, a prompt too long, an output_dir another run holds) is
refused before any work, in one line on stderr with exit status 2
(:func:`~trace_core.failures.refused_before_work`). A failure once work has started (a full disk, a
dead engine) ends with one plain message on stderr, exit status 1: what failed, the cause, the
last complete checkpoint, the command that resumes and the log file that holds the traceback
(:mod:`trace_core.failures`); ``--debug`` prints the traceback too.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import traceback

from trace_core.failures import refused_before_work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trace-rl", description="TRACE: budgeted root and prefix allocation for agentic RL.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n"
               "  trace-rl train --config configs/testbed.yaml method=trace steps=10\n"
               "  trace-rl show-config --config configs/paper-qwen3-8b.yaml\n"
               "  trace-rl deliver runs/my-run/spool\n\n"
               "Overrides are dotted keys of TrainConfig, e.g. budget.roots_M=32 policy.zero_stage=3.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    examples = {"train": "trace-rl train --config configs/testbed.yaml method=trace seed=1 output_dir=runs/t1\n"
                         "  (rerun the same command to resume from its last checkpoint)",
                "show-config": "trace-rl show-config method=pcl budget.roots_M=64"}
    for name, help_text in (("train", "run (or resume) a training run"),
                            ("show-config", "print the resolved configuration as YAML")):
        p = sub.add_parser(name, help=help_text, description=help_text,
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog=f"Example:\n  {examples[name]}\n\nOverrides are dotted keys of TrainConfig.")
        p.add_argument("--config", help="YAML file with TrainConfig fields (defaults otherwise)")
        p.add_argument("overrides", nargs="*", help="key=value overrides, applied after the file")
        if name == "train":
            p.add_argument("--debug", action="store_true",
                           help="on a failure, print its traceback on stderr too (it is always in "
                                "<output_dir>/failure.log)")
    _add_deliver(sub)
    sub.add_parser("methods", help="list the registered methods (method=NAME) and the rule each samples by",
                   description="List every method of the registry (the value of method=NAME) with the rule it "
                               "samples by: which prompts, how many rollouts each, which anchors it expands.",
                   formatter_class=argparse.RawDescriptionHelpFormatter,
                   epilog="Example:\n  trace-rl methods\n  trace-rl train --config configs/testbed.yaml "
                          "method=knapsack-rl")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.command == "deliver":
        return _deliver(args)
    if args.command == "methods":
        from trace_core.methods import METHODS

        width = max(map(len, METHODS))
        for name, method in METHODS.items():
            print(f"{name:<{width}}  {method.description}")
        return 0

    from trace_core.config import ConfigError, dump_yaml, load_config
    from trace_core.training.config import TrainConfig

    try:
        cfg = load_config(TrainConfig, args.config, args.overrides)
    except ConfigError as err:
        print(f"trace-rl: configuration error: {one_line(err)}", file=sys.stderr)
        return 2
    if args.command == "show-config":
        print(dump_yaml(cfg), end="")
        return 0
    from pathlib import Path

    from trace_core.training.run_guard import check_inputs, hold_output_dir

    try:  # the paths and the folder's writer lock before torch is even imported: a refusal is at once
        check_inputs(cfg)
        lock = hold_output_dir(Path(cfg.output_dir))
    except refused_before_work() as err:
        print(f"trace-rl: {one_line(err)}", file=sys.stderr)
        return 2
    from trace_core.failures import RunFailed, run_failed
    from trace_core.training.trainer import latest_checkpoint, train

    resume = shlex.join(["trace-rl", *argv])
    try:  # the trainer checks again and holds the same lock (this process's) for its run
        summary = train(cfg, resume_command=resume)
    except refused_before_work() as err:  # a bad input, found before any work: one line, no traceback
        print(f"trace-rl: {one_line(err)}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 — every run-time failure ends in one plain message
        failed = err if isinstance(err, RunFailed) else run_failed(
            err, during="the run", kept=latest_checkpoint(Path(cfg.output_dir)), output_dir=cfg.output_dir,
            resume=resume)
        if args.debug:
            traceback.print_exception(err, file=sys.stderr)
        print(f"trace-rl: {failed}", file=sys.stderr, flush=True)
        return 1
    finally:
        if lock is not None:
            lock.release()
    print(json.dumps({k: summary[k] for k in ("method", "steps", "run_id", "wall_s")}, default=str))
    return 0


def one_line(err: BaseException) -> str:
    """An error's message on one line (a data report's lines joined with " | ")."""
    return " | ".join(line.strip() for line in str(err).splitlines() if line.strip())


DELIVER_HELP = "deliver a run's spooled tracking records to its tracking store and set its final status"
DELIVER_DESCRIPTION = """\
Deliver a run's spooled tracking records to its tracking store and set its final status.

A tracker writes every record to its spool (tracking.spool_dir; a training run's is
<output_dir>/spool) before it sends it, and keeps it there until the store confirms it. When the
store was down as the run ended, the records and the run's final status (FINISHED, FAILED or
KILLED) wait in the spool, and the store shows the run as RUNNING. This command sends them, in
order, to the store the spool names (creating the run if it never was), then sets the final
status. Sending twice is harmless: the store drops exact duplicates.

Exit status: 0 when everything is delivered, 1 when records are still spooled (the store is still
failing: run it again later), 2 when the spool or the options are invalid."""
DELIVER_EPILOG = """\
example:
  trace-rl deliver runs/trace/spool --wait 60
  trace-rl deliver runs/trace/spool --tracking-uri http://mlflow:5000 --status KILLED"""


def _add_deliver(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("deliver", help=DELIVER_HELP, description=DELIVER_DESCRIPTION, epilog=DELIVER_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spool_dir", help="the run's spool folder (tracking.spool_dir)")
    p.add_argument("--tracking-uri", metavar="URI",
                   help="deliver to this store instead of the one the spool was written for (and remember it)")
    p.add_argument("--status", choices=("FINISHED", "FAILED", "KILLED"),
                   help="end the run with this status instead of the spooled one (a run whose process was "
                        "killed with SIGKILL has none, and stays RUNNING without this)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="keep retrying a store that fails for this long (default: try once)")


def _deliver(args: argparse.Namespace) -> int:
    from trace_core.tracking import TrackingStoreError, deliver

    try:
        report = deliver(args.spool_dir, tracking_uri=args.tracking_uri, status=args.status, wait_s=args.wait)
    except (ValueError, TrackingStoreError) as err:
        print(f"trace-rl deliver: {err}", file=sys.stderr)
        return 2
    run = report.run_id or "(not created yet)"
    print(f"delivered {report.delivered} records of run {run} to {report.tracking_uri}; "
          f"{report.pending} still spooled, {report.rejected} values refused as invalid in all; "
          f"spooled status: {report.status or 'none'}")
    if report.pending:
        print(f"trace-rl deliver: {report.pending} records are still in {report.spool_dir}: {report.error}",
              file=sys.stderr)
        return 1
    if report.status not in ("FINISHED", "FAILED", "KILLED"):
        print("trace-rl deliver: the run was never closed, so it stays RUNNING; pass --status to end it",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
