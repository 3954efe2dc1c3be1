#!/usr/bin/env bash
# Run an experiment on every host of a multi-host TPU VM slice (one process per host).
#   launch/tpu_vm.sh TPU_NAME ZONE cascade_math gs://bucket/runs/cascade_math [--config.key=value ...]
# The workdir must be shared by all hosts (a GCS bucket or NFS): orbax writes one checkpoint from all hosts.
set -euo pipefail
TPU=$1; ZONE=$2; CONFIG=$3; WORKDIR=$4; shift 4
gcloud compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker=all --command "
  cd ~/nemocascade && git pull --ff-only && pip install -q -e . 'jax[tpu]' &&
  python experiments/run.py --distributed --config=$CONFIG --workdir=$WORKDIR $*"
