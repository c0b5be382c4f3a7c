# shellcheck shell=bash
# What install.sh and install-verl.sh share, sourced after they set VENV: BIN, the log (emptied),
# the start time, and stage: one install stage, a progress line, the command's output into $LOG,
# a heartbeat at least every 20 s while it runs, and the log's tail if it fails.
BIN=$VENV/bin
LOG=$VENV/install.log
mkdir -p "$VENV"
: > "$LOG"
START=$SECONDS

stage() {  # stage <n> <total> <what> <command...>
  local n=$1 total=$2 what=$3; shift 3
  local t0=$SECONDS
  echo "==> venv [$n/$total] $what" | tee -a "$LOG"
  "$@" >> "$LOG" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
      local have
      have=$(ls -d "$VENV"/lib/python*/site-packages/*.dist-info 2>/dev/null | wc -l)
      echo "    ... $what: $((SECONDS - t0)) s, $have packages installed so far"
    fi
  done
  if ! wait "$pid"; then
    tail -30 "$LOG"
    echo "venv stage '$what' failed; the full log is $LOG" >&2
    exit 1
  fi
  echo "    done in $((SECONDS - t0)) s"
}


new_venv() {  # new_venv <total> <python>: stage 1, the virtual environment (kept when it exists)
  if [ ! -x "$BIN/python" ]; then
    stage 1 "$1" "python -m venv ($2)" "$2" -m venv "$VENV"
  else
    echo "==> venv [1/$1] $BIN/python exists"
  fi
}
