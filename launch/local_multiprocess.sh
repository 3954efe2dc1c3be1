#!/usr/bin/env bash
# Rehearse a multi-host launch on one machine: N CPU processes joined by jax.distributed.
#   launch/local_multiprocess.sh [--dry-run] N CONFIG WORKDIR [--config.key=value ...]
# Each process logs to WORKDIR.logs/process_<i>.log (process 0 also to this terminal). When one process fails the
# others are stopped (they would otherwise wait on it until the coordinator's deadline) and the launcher exits
# with the first failure's status; it exits 0 only when every process did.
# Environment: PYTHON (default python), PORT (default: a free one), JAX_PLATFORMS (default cpu).
set -euo pipefail
DRY=0
if [[ ${1:-} == --dry-run ]]; then DRY=1; shift; fi
if (($# < 3)); then
  echo "usage: $0 [--dry-run] N CONFIG WORKDIR [--config.key=value ...]" >&2; exit 2
fi
N=$1; CONFIG=$2; WORKDIR=${3%/}; shift 3
if ! [[ $N =~ ^[1-9][0-9]*$ ]]; then echo "error: N must be a positive integer, got '$N'" >&2; exit 2; fi
PYTHON=${PYTHON:-python}
PORT=${PORT:-$($PYTHON -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
LOGS="$WORKDIR.logs"
export JAX_COORDINATOR_ADDRESS=127.0.0.1:$PORT JAX_NUM_PROCESSES=$N JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
cmd=($PYTHON experiments/run.py --distributed --config="$CONFIG" --workdir="$WORKDIR" "$@")
if ((DRY)); then
  for i in $(seq 0 $((N - 1))); do
    printf 'JAX_COORDINATOR_ADDRESS=%s JAX_NUM_PROCESSES=%s JAX_PROCESS_ID=%s' "$JAX_COORDINATOR_ADDRESS" "$N" "$i"
    printf ' %q' "${cmd[@]}"; printf ' > %q 2>&1\n' "$LOGS/process_$i.log"
  done
  exit 0
fi
mkdir -p "$LOGS"
set -m  # each process in its own process group: stopping one stops whatever it started
pids=()
for i in $(seq 0 $((N - 1))); do
  if ((i == 0)); then
    JAX_PROCESS_ID=0 "${cmd[@]}" > >(tee "$LOGS/process_0.log") 2>&1 &
  else
    JAX_PROCESS_ID=$i "${cmd[@]}" > "$LOGS/process_$i.log" 2>&1 &
  fi
  pids+=($!)
done
stop_all() { for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done; }
trap 'stop_all; exit 130' INT TERM
status=0
running=("${pids[@]}")
while ((${#running[@]})); do
  still=()
  for pid in "${running[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then still+=("$pid"); continue; fi
    set +e; wait "$pid"; rc=$?; set -e  # bash keeps an exited child's status for `wait PID`
    if ((rc != 0 && status == 0)); then
      status=$rc
      echo "launcher: a process exited with status $rc; stopping the others (logs: $LOGS/)" >&2
      stop_all
    fi
  done
  running=("${still[@]}")
  ((${#running[@]} == 0)) || sleep 0.2
done
if ((status != 0)); then
  for i in $(seq 0 $((N - 1))); do echo "--- $LOGS/process_$i.log (last lines)" >&2; tail -n 5 "$LOGS/process_$i.log" >&2; done
fi
exit $status
