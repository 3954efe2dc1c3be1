#!/usr/bin/env bash
# Run an experiment on every host of a multi-host TPU VM slice, one process per host, joined by jax.distributed.
#   launch/tpu_vm.sh [--dry-run] TPU_NAME ZONE CONFIG WORKDIR [--config.key=value ...]   start the run
#   launch/tpu_vm.sh [--dry-run] --logs TPU_NAME ZONE                                     each worker's last lines
# Start: packs this checkout (tracked and untracked-but-not-ignored files, as `git ls-files` lists them), copies it
# to every worker, installs it with jax[tpu], and starts the run under nohup so it outlives the ssh session; each
# worker logs to ~/nemocascade_logs/<run>.<hostname>.log. WORKDIR must be a filesystem every host mounts (NFS,
# a mounted bucket): orbax writes each checkpoint from all hosts together (gs:// paths directly: not yet). --dry-run prints the gcloud commands instead of running
# them. Environment: GCLOUD (default gcloud), INSTALL (default: pip install -q -e . 'jax[tpu]').
set -euo pipefail
DRY=0; LOGS=0
while [[ ${1:-} == --* ]]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --logs) LOGS=1 ;;
    *) echo "error: unknown option $1 (--dry-run, --logs)" >&2; exit 2 ;;
  esac
  shift
done
GCLOUD=${GCLOUD:-gcloud}
run() { if ((DRY)); then printf '%q ' "$@"; echo; else "$@"; fi; }
if ((LOGS)); then
  (($# == 2)) || { echo "usage: $0 [--dry-run] --logs TPU_NAME ZONE" >&2; exit 2; }
  run "$GCLOUD" compute tpus tpu-vm ssh "$1" --zone "$2" --worker=all \
    --command 'for f in ~/nemocascade_logs/*.log; do echo "== $(hostname) $f"; tail -n 20 "$f"; done'
  exit 0
fi
if (($# < 4)); then
  echo "usage: $0 [--dry-run] TPU_NAME ZONE CONFIG WORKDIR [--config.key=value ...]" >&2; exit 2
fi
TPU=$1; ZONE=$2; CONFIG=$3; WORKDIR=$4; shift 4
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUN_ID=$(basename "$WORKDIR")-$(date +%Y%m%d-%H%M%S)
TARBALL=${TMPDIR:-/tmp}/nemocascade-$RUN_ID.tar.gz
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | tar --null -czf "$TARBALL" -T -)
# the command each worker runs, every user argument quoted once for the remote shell
args=$(printf ' %q' --distributed --config="$CONFIG" --workdir="$WORKDIR" "$@")
remote="set -e; rm -rf ~/nemocascade && mkdir -p ~/nemocascade ~/nemocascade_logs
tar -xzf ~/nemocascade.tar.gz -C ~/nemocascade && cd ~/nemocascade
${INSTALL:-pip install -q -e . 'jax[tpu]'}
log=~/nemocascade_logs/$RUN_ID.\$(hostname).log
nohup python experiments/run.py$args > \$log 2>&1 < /dev/null &
echo \"\$(hostname): started, pid \$!, log \$log\""
run "$GCLOUD" compute tpus tpu-vm scp "$TARBALL" "$TPU:~/nemocascade.tar.gz" --zone "$ZONE" --worker=all
run "$GCLOUD" compute tpus tpu-vm ssh "$TPU" --zone "$ZONE" --worker=all --command "$remote"
if ((DRY)); then rm -f "$TARBALL"; exit 0; fi
echo "started on every worker of $TPU; follow with: $0 --logs $TPU $ZONE" >&2
