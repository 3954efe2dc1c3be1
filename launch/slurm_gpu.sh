#!/usr/bin/env bash
# Multi-node GPU run under Slurm: one task per node (all its GPUs visible to it), joined by jax.distributed,
# which reads the coordinator and process ids from Slurm's environment.
#   launch/slurm_gpu.sh [--dry-run] NODES CONFIG WORKDIR [--config.key=value ...]
# Copies this checkout (the files `git ls-files` lists, untracked-but-not-ignored included) to
# RUNS_ROOT/<run>/code on the shared filesystem, so every node runs the code as it was at submission and later
# edits here do not reach a queued job; writes RUNS_ROOT/<run>/job.sbatch and submits it (the job outlives this
# shell, as nohup would). Each node logs to RUNS_ROOT/<run>/logs/node_<rank>.log; one failing task ends the job
# (srun --kill-on-bad-exit), so the job's state is FAILED when any process fails. --dry-run writes the job
# script, prints it and the sbatch command, and submits nothing.
# Environment: RUNS_ROOT (default ~/nemocascade_runs, must be on a filesystem every node mounts),
# GPUS_PER_NODE (8), PARTITION, TIME (24:00:00), SETUP (run before python on each node, e.g. a venv's activate),
# SBATCH (default sbatch).
set -euo pipefail
DRY=0
if [[ ${1:-} == --dry-run ]]; then DRY=1; shift; fi
if (($# < 3)); then
  echo "usage: $0 [--dry-run] NODES CONFIG WORKDIR [--config.key=value ...]" >&2; exit 2
fi
NODES=$1; CONFIG=$2; WORKDIR=$3; shift 3
if ! [[ $NODES =~ ^[1-9][0-9]*$ ]]; then echo "error: NODES must be a positive integer, got '$NODES'" >&2; exit 2; fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUN_DIR=${RUNS_ROOT:-$HOME/nemocascade_runs}/$(basename "$WORKDIR")-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RUN_DIR/code" "$RUN_DIR/logs"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | tar --null -cf - -T -) | tar -xf - -C "$RUN_DIR/code"
task="cd $(printf '%q' "$RUN_DIR/code")${SETUP:+ && $SETUP} && exec python experiments/run.py$(
  printf ' %q' --distributed --config="$CONFIG" --workdir="$WORKDIR" "$@")"
cat > "$RUN_DIR/job.sbatch" <<EOF
#!/usr/bin/env bash
#SBATCH --job-name=nemocascade
#SBATCH --nodes=$NODES
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=${GPUS_PER_NODE:-8}
#SBATCH --time=${TIME:-24:00:00}
#SBATCH --output=$RUN_DIR/logs/slurm-%j.out
${PARTITION:+#SBATCH --partition=$PARTITION}
set -euo pipefail
srun --kill-on-bad-exit=1 --output=$RUN_DIR/logs/node_%t.log bash -c $(printf '%q' "$task")
EOF
if ((DRY)); then
  cat "$RUN_DIR/job.sbatch"
  printf '%q ' "${SBATCH:-sbatch}" "$RUN_DIR/job.sbatch"; echo
  exit 0
fi
"${SBATCH:-sbatch}" "$RUN_DIR/job.sbatch"
echo "submitted; logs in $RUN_DIR/logs/ (node_<rank>.log per node)" >&2
