#!/usr/bin/env bash
# Rehearse a multi-host launch on one machine: N CPU processes joined by jax.distributed.
#   launch/local_multiprocess.sh 2 cascade_math:tiny runs/mp_smoke
set -euo pipefail
N=$1; CONFIG=$2; WORKDIR=$3; shift 3
export JAX_COORDINATOR_ADDRESS=127.0.0.1:12355 JAX_NUM_PROCESSES=$N JAX_PLATFORMS=cpu
for i in $(seq 0 $((N - 1))); do
  JAX_PROCESS_ID=$i python experiments/run.py --distributed --config="$CONFIG" --workdir="$WORKDIR" "$@" &
done
wait
