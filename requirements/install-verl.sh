#!/usr/bin/env bash
# verl's own environment, beside ours: verl 0.9 pins transformers < 5.11 and tensordict <= 0.10,
# ours transformers 5.19, so it cannot share .venv. It holds torch (the CPU wheel), verl with every
# dependency pinned (requirements/verl-lock.txt, resolved by pip from verl's own requirements) and
# trace-rl itself without its dependencies: trace_core.integrations.verl needs only numpy beside
# verl, and installing trace-rl registers its verl.plugins entry point.
#   requirements/install-verl.sh <python> <venv> <torch requirement>
set -uo pipefail
PYTHON=$1 VENV=$2 TORCH=$3
source "$(dirname "$0")/stages.sh"  # BIN, LOG, START; stage <n> <total> <what> <command...>

new_venv 5 "$PYTHON"  # stage 1: python -m venv, unless it exists
stage 2 5 "pip 26.3, setuptools, wheel" "$BIN/pip" install -q pip==26.3 setuptools==78.1.1 wheel
stage 3 5 "$TORCH (the CPU wheel)" "$BIN/pip" install -q "$TORCH"
stage 4 5 "verl and its pins ($(grep -c '==' requirements/verl-lock.txt) packages)" \
  "$BIN/pip" install -q --no-deps -r requirements/verl-lock.txt
stage 5 5 "trace-rl itself (editable, no dependencies)" "$BIN/pip" install -q --no-deps --no-build-isolation -e .
echo "==> verl venv ready in $((SECONDS - START)) s"
