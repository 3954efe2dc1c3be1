"""The launchers in launch/, run for real with fakes standing in for python, gcloud, sbatch and srun: what each
worker receives (the code, the arguments quoted once), where it logs, and the exit status when a process fails."""
import os
import stat
import subprocess
import time

from conftest import ROOT

ARGS = ["--config.stage_order=(\"sft\",\"grpo\")", "--config.note=a b'c"]  # quoting must survive each shell


def _script(path, text):
    path.write_text("#!/usr/bin/env bash\n" + text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def _fake_python(bin_dir):
    """Prints its arguments one per line with the process rank (JAX's or Slurm's) and the directory it ran in; rank
    1 exits 3 when FAIL_RANK1 is set, and rank 0 then hangs (as a real peer waits on a dead one)."""
    return _script(bin_dir / "python", """
if [[ $1 == -c ]]; then exec python3 "$@"; fi
rank=${JAX_PROCESS_ID:-${SLURM_PROCID:-?}}
echo "rank=$rank cwd=$PWD"; for a in "$@"; do echo "arg=$a"; done
if [[ -n ${FAIL_RANK1:-} && $rank == 1 ]]; then exit 3; fi
if [[ -n ${FAIL_RANK1:-} && $rank == 0 ]]; then sleep 300; fi
""")


def _run(cmd, env, timeout=60):
    return subprocess.run(cmd, cwd=ROOT, env=os.environ | env, capture_output=True, text=True, timeout=timeout)


def _args(log_text):
    return [line[4:] for line in log_text.splitlines() if line.startswith("arg=")]


def test_local_multiprocess_logs_each_process_and_passes_arguments(tmp_path):
    fake = _fake_python(tmp_path)
    proc = _run(["bash", "launch/local_multiprocess.sh", "2", "cascade_math:tiny", str(tmp_path / "w"), *ARGS],
                {"PYTHON": str(fake), "PORT": "12999"})
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        text = (tmp_path / "w.logs" / f"process_{rank}.log").read_text()
        assert f"rank={rank}" in text
        assert _args(text) == ["experiments/run.py", "--distributed", "--config=cascade_math:tiny",
                               f"--workdir={tmp_path / 'w'}", *ARGS]
    assert "rank=0" in proc.stdout and "rank=1" not in proc.stdout  # process 0 is shown on the terminal too


def test_local_multiprocess_fails_fast_when_one_process_fails(tmp_path):
    fake = _fake_python(tmp_path)
    start = time.monotonic()
    proc = _run(["bash", "launch/local_multiprocess.sh", "2", "x", str(tmp_path / "w")],
                {"PYTHON": str(fake), "FAIL_RANK1": "1"})
    assert proc.returncode == 3, (proc.returncode, proc.stderr)  # the failure's own status, not 0 and not a hang
    assert time.monotonic() - start < 30  # rank 0 (sleeping 300 s) was stopped
    assert "stopping the others" in proc.stderr


def test_local_multiprocess_rejects_a_bad_process_count(tmp_path):
    proc = _run(["bash", "launch/local_multiprocess.sh", "two", "x", str(tmp_path / "w")], {})
    assert proc.returncode == 2 and "N must be a positive integer" in proc.stderr


def test_tpu_vm_copies_the_checkout_and_starts_every_worker_under_nohup(tmp_path):
    """A fake gcloud with two workers (their own home directories): scp copies to each, ssh runs the command in
    each with its own hostname; the run started there must survive the ssh command and log per worker."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_python(bin_dir)
    _script(bin_dir / "hostname", 'echo "worker-$WORKER"\n')
    workers = tmp_path / "workers"
    gcloud = _script(tmp_path / "gcloud", f"""
echo "gcloud $*" >> {tmp_path}/gcloud.log
[[ "$*" == *"--worker=all"* ]] || {{ echo "not --worker=all" >&2; exit 9; }}
kind=$4 src=$5 dest=${{6#*:~/}}
while [[ $# -gt 0 && $1 != --command ]]; do shift; done
for w in 0 1; do
  home={workers}/$w; mkdir -p $home
  if [[ $kind == scp ]]; then cp "$src" "$home/$dest"
  elif [[ $kind == ssh ]]; then (cd $home && HOME=$home WORKER=$w PATH={bin_dir}:$PATH bash -c "$2"); fi
done
""")
    env = {"GCLOUD": str(gcloud), "INSTALL": "true"}
    proc = _run(["bash", "launch/tpu_vm.sh", "tpu1", "zone-a", "cascade_math", "gs://bucket/runs/x", *ARGS], env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("started, pid") == 2
    for w in (0, 1):
        home = workers / str(w)
        assert (home / "nemocascade" / "experiments" / "run.py").is_file()  # the checkout reached the worker
        assert (home / "nemocascade" / "launch" / "tpu_vm.sh").is_file()
        logs = list((home / "nemocascade_logs").glob(f"x-*.worker-{w}.log"))
        assert len(logs) == 1, list((home / "nemocascade_logs").iterdir())
        for _ in range(100):  # nohup'd in the background: the log may lag the ssh command's return
            text = logs[0].read_text()
            if "arg=" in text:
                break
            time.sleep(0.05)
        assert f"cwd={home / 'nemocascade'}" in text
        assert _args(text) == ["experiments/run.py", "--distributed", "--config=cascade_math",
                               "--workdir=gs://bucket/runs/x", *ARGS]
    # --dry-run prints the same two gcloud commands and runs nothing
    before = (tmp_path / "gcloud.log").read_text()
    dry = _run(["bash", "launch/tpu_vm.sh", "--dry-run", "tpu1", "zone-a", "cascade_math", "gs://b/x"], env)
    assert dry.returncode == 0, dry.stderr
    assert (tmp_path / "gcloud.log").read_text() == before
    lines = dry.stdout.strip().splitlines()
    assert "tpu-vm scp" in lines[0] and "--worker=all" in lines[0]
    assert "tpu-vm ssh" in lines[1] and "nohup python experiments/run.py" in lines[1]
    logs = _run(["bash", "launch/tpu_vm.sh", "--dry-run", "--logs", "tpu1", "zone-a"], env)
    assert logs.returncode == 0 and "nemocascade_logs" in logs.stdout


def test_slurm_snapshots_the_code_and_logs_per_node(tmp_path):
    """A fake sbatch runs the job script; a fake srun runs its task on 2 'nodes' with SLURM_PROCID set and the
    --output pattern's %t replaced, as Slurm does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_python(bin_dir)
    _script(bin_dir / "srun", """
while [[ $1 == --* ]]; do case $1 in --output=*) out=${1#--output=} ;; esac; shift; done
for t in 0 1; do SLURM_PROCID=$t "$@" > "${out//%t/$t}" 2>&1 || exit $?; done
""")
    sbatch = _script(tmp_path / "sbatch", f'grep -q -- "--nodes=2" "$1" && PATH={bin_dir}:$PATH bash "$1"\n')
    env = {"SBATCH": str(sbatch), "RUNS_ROOT": str(tmp_path / "runs")}
    proc = _run(["bash", "launch/slurm_gpu.sh", "2", "cascade_math", "/shared/x", *ARGS], env)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "code" / "experiments" / "run.py").is_file()
    assert not (run_dir / "code" / "runs").exists()  # ignored files stay behind
    for rank in (0, 1):
        text = (run_dir / "logs" / f"node_{rank}.log").read_text()
        assert f"rank={rank} cwd={run_dir / 'code'}" in text
        assert _args(text) == ["experiments/run.py", "--distributed", "--config=cascade_math", "--workdir=/shared/x",
                               *ARGS]
    job = (run_dir / "job.sbatch").read_text()
    assert "--kill-on-bad-exit=1" in job and "#SBATCH --ntasks-per-node=1" in job
    dry = _run(["bash", "launch/slurm_gpu.sh", "--dry-run", "2", "cascade_math", "/shared/x"],
               env | {"SBATCH": "/nonexistent/sbatch"})
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --nodes=2" in dry.stdout and dry.stdout.strip().endswith("job.sbatch")
