#!/usr/bin/env bash
# The GPU check: one script, at most 4 minutes, whose stages each append their record to a JSON
# report as they finish (a run cut short still reports what it did). See bench/gpu_check.md.
#
#   bench/gpu_check.sh [--cpu] [--out FILE] [--wheels DIR] [--work DIR]
#
#   install        make the carried wheels (DeepSpeed and its dependencies, scipy) importable
#   env            python, torch, CUDA, NCCL, transformers, deepspeed versions; the device
#   engine_tiny    the tiny random Qwen3 through the transformers rollout engine
#   engine_0.5b    a ~0.5B-shaped random Qwen3 (Qwen3-0.6B's 28 layers) through the same engine
#   trace_steps    TRACE steps on the fixed-turns task, DeepSpeed ZeRO-2 over NCCL, a JSONL tracker:
#                  step time, cost breakdown, tokens/s, peak GPU memory
#   tree_training  one packed tree's forward + backward at 16k and 64k tokens (Qwen3-0.6B widths,
#                  8 layers, 0.44B params): peak GPU memory, tokens/s, vs dense mask and varlen at 16k
#
# --cpu is the dry run: tiny sizes, gloo, CPU only (what the tests run).
set -uo pipefail
cd "$(dirname "$0")/.."

MODE=gpu OUT=bench/results/gpu_check.json WHEELS="" WORK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) MODE=cpu ;;
    --out) OUT=$2; shift ;;
    --wheels) WHEELS=$2; shift ;;
    --work) WORK=$2; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-python3}
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK" "$(dirname "$OUT")"
WORK=$(cd "$WORK" && pwd)
[ -n "$WHEELS" ] && WHEELS=$(cd "$WHEELS" && pwd)

# the carried wheels land in $WORK/site (install stage); offline: nothing is ever downloaded
export PYTHONPATH="$PWD:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
export GPU_CHECK_WHEELS="$WHEELS" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TRANSFORMERS_VERBOSITY=error PYTHONUNBUFFERED=1
FLAG=""
if [ "$MODE" = cpu ]; then
  FLAG=--cpu
  export DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  TOTAL=170
  BUDGETS="install:20 env:15 engine_tiny:25 engine_0.5b:25 trace_steps:60 tree_training:30"
else
  # the host side of a GPU run keeps every core (the bench package's default is one thread)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
  TOTAL=240
  BUDGETS="install:25 env:15 engine_tiny:25 engine_0.5b:45 trace_steps:75 tree_training:55"
fi

"$PY" -m bench.gpu_check_stages init --report "$OUT" $FLAG --command "bench/gpu_check.sh $*"
START=$(date +%s)
FAILED=0
for entry in $BUDGETS; do
  name=${entry%%:*} budget=${entry##*:}
  left=$(( TOTAL - ($(date +%s) - START) ))
  [ "$budget" -gt "$left" ] && budget=$left
  if [ "$budget" -lt 5 ]; then
    "$PY" -m bench.gpu_check_stages record --report "$OUT" --name "$name" --status skipped --rc 0 --seconds 0
    FAILED=1
    continue
  fi
  t0=$(date +%s)
  timeout -k 5 "$budget" "$PY" -m bench.gpu_check_stages "$name" --report "$OUT" --work "$WORK" $FLAG \
    >"$WORK/$name.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then
    echo "gpu_check: $name ok (${secs} s)"
  else
    status=failed; { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && status=timeout
    "$PY" -m bench.gpu_check_stages record --report "$OUT" --name "$name" --status $status --rc $rc \
      --seconds "$secs" --log "$WORK/$name.log"
    echo "gpu_check: $name $status (rc $rc, ${secs} s); log tail in $OUT" >&2
    FAILED=1
  fi
done
echo "gpu_check: report in $OUT ($(( $(date +%s) - START )) s)"
exit $FAILED
