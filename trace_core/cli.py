"""``trace-rl`` command line: train (and the tools around it).

    trace-rl train --config configs/embedded.yaml method=grpo steps=3
    trace-rl show-config --config configs/embedded.yaml
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trace-rl", description="TRACE: budgeted root and prefix allocation for agentic RL.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Overrides are dotted keys of TrainConfig, e.g. budget.roots_M=32 policy.zero_stage=3.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("train", "run (or resume) a training run"),
                            ("show-config", "print the resolved configuration as YAML")):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--config", help="YAML file with TrainConfig fields (defaults otherwise)")
        p.add_argument("overrides", nargs="*", help="key=value overrides, applied after the file")
    args = parser.parse_args(argv)

    from trace_core.config import ConfigError, dump_yaml, load_config
    from trace_core.training.config import TrainConfig

    try:
        cfg = load_config(TrainConfig, args.config, args.overrides)
    except ConfigError as err:
        print(f"trace-rl: configuration error: {err}", file=sys.stderr)
        return 2
    if args.command == "show-config":
        print(dump_yaml(cfg), end="")
        return 0
    from trace_core.data.reading import DataValidationError
    from trace_core.training.trainer import train

    try:
        summary = train(cfg)
    except DataValidationError as err:  # its message is the report (file, rules, rows): no traceback
        print(f"trace-rl: {err}", file=sys.stderr)
        return 2
    print(json.dumps({k: summary[k] for k in ("method", "steps", "run_id", "wall_s")}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
