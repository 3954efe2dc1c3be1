"""Run one config over several seeds and aggregate: `python experiments/sweep.py --config=NAME[:VARIANT]
--seeds=0,1,2,3,4 --workdir=DIR [--parallel=2] [--config.key=value ...]`.

Each seed is an `experiments/run.py --config=... --workdir=DIR/seed_S --config.seed=S` process (its output in
DIR/seed_S.log), with any other `--config.*` flags passed through. Resumable: run the same command again and
every seed resumes where it stopped (a finished seed only re-reads its summary). After the seeds it writes
DIR/sweep.json (docs/run_output.md: per stage x domain the mean over seeds with a 95% Student-t interval,
and the paired gain of each stage over its start), DIR/sweep_table.md and DIR/sweep.png (means with bands).
`--aggregate_only` re-aggregates whatever seeds have a summary.json, while others still run; `--rescore`
evaluates every seed's finished stages again without training (run.py's flag), then aggregates.

Exit status: 0 when every seed finished; otherwise the first failing seed's status (its log names the problem).
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from nemocascade import files, plots  # noqa: E402
from nemocascade.run_log import load_metrics  # noqa: E402
from nemocascade import sweep as sweep_lib  # noqa: E402


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="NAME[:VARIANT], as for run.py")
    ap.add_argument("--seeds", required=True, help="comma-separated integers, e.g. 0,1,2,3,4")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--parallel", type=int, default=1, help="seeds run at once (each a process; 1: one by one)")
    ap.add_argument("--aggregate_only", action="store_true", help="write sweep.json from the summaries there now")
    args, passthrough = ap.parse_known_args(argv)
    bad = [a for a in passthrough
           if not a.startswith(("--config.", "--allow_config_change", "--redo_from="))
           and a not in ("--rescore", "--norescore")]
    if bad:
        ap.error(f"unknown arguments {bad}: only --config.KEY=VALUE, --allow_config_change, --redo_from=STAGE and "
                 "--rescore pass through to run.py")
    if any(a.startswith("--config.seed") for a in passthrough):
        ap.error("--config.seed: the sweep sets each seed's own; use --seeds")
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--seeds={args.seeds!r}: comma-separated integers, e.g. 0,1,2")
    if not args.seed_list or len(set(args.seed_list)) != len(args.seed_list):
        ap.error(f"--seeds={args.seeds!r}: at least one seed, none twice")
    if args.parallel < 1:
        ap.error("--parallel must be >= 1")
    return args, passthrough


def run_seeds(args, passthrough) -> int:
    """Start every seed's run.py (at most --parallel at once); the first non-zero exit status, or 0."""
    pending, running, failed = list(args.seed_list), {}, 0
    while pending or running:
        while pending and len(running) < args.parallel:
            seed = pending.pop(0)
            wd = os.path.join(args.workdir, f"seed_{seed}")
            cmd = [sys.executable, os.path.join(HERE, "run.py"), f"--config={args.config}", f"--workdir={wd}",
                   f"--config.seed={seed}", *passthrough]
            log = open(_log_path(args, seed), "a")
            running[seed] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log, time.time())
            print(f"[sweep] seed {seed}: started ({wd})", flush=True)
        time.sleep(1.0)
        for seed, (proc, log, t0) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            if not files.is_local(args.workdir):  # the log was written here; a copy goes beside the seed's workdir
                files.atomic_write(os.path.join(args.workdir, f"seed_{seed}.log"), files.read_bytes(log.name))
            del running[seed]
            status = "done" if proc.returncode == 0 else f"FAILED, exit {proc.returncode} (see seed_{seed}.log)"
            print(f"[sweep] seed {seed}: {status} in {time.time() - t0:.0f} s", flush=True)
            failed = failed or proc.returncode
    return failed


def _log_path(args, seed) -> str:
    """Where seed `seed`'s output goes while it runs: beside its workdir, or in a local mirror of a remote one."""
    local = args.workdir if files.is_local(args.workdir) else files.local_mirror(args.workdir)
    os.makedirs(local, exist_ok=True)
    return os.path.join(local, f"seed_{seed}.log")


def aggregate(args) -> dict | None:
    summaries = {}
    for seed in args.seed_list:
        path = os.path.join(args.workdir, f"seed_{seed}", "summary.json")
        if files.exists(path):
            summaries[seed] = files.read_json(path)
    if not summaries:
        print("[sweep] no seed has a summary.json yet", file=sys.stderr)
        return None
    name, _, variant = args.config.partition(":")
    sweep = sweep_lib.aggregate(name, variant or None, summaries)
    files.atomic_write(os.path.join(args.workdir, "sweep.json"), json.dumps(sweep, indent=1))
    table = sweep_lib.table_markdown(sweep)
    files.atomic_write(os.path.join(args.workdir, "sweep_table.md"), table + "\n")
    plots.plot_sweep(sweep, os.path.join(args.workdir, "sweep.png"))
    print(table, flush=True)
    compare_arms(args, summaries)
    return sweep


def compare_arms(args, summaries: dict) -> None:
    """When the config compares arms from one checkpoint (`config.compare`: cascade_demo, mopd_vs_grpo) and some
    seed finished them: DIR/arms.json, arms_table.md and arms.png (`sweep_lib.arms`, claim (c))."""
    cmp = files.read_json(os.path.join(args.workdir, f"seed_{min(summaries)}", "config.json")).get("compare")
    if not cmp:
        return
    metrics = {seed: load_metrics(os.path.join(args.workdir, f"seed_{seed}", "metrics.jsonl")) for seed in summaries}
    result = sweep_lib.arms(summaries, metrics, tuple(cmp["stages"]), cmp["start_stage"])
    if not result["domains"]:
        print(f"[sweep] arms {cmp['stages']}: no seed has finished them with a regressed domain yet", flush=True)
        return
    files.atomic_write(os.path.join(args.workdir, "arms.json"), json.dumps(result, indent=1))
    table = sweep_lib.arms_markdown(result)
    files.atomic_write(os.path.join(args.workdir, "arms_table.md"), table + "\n")
    plots.plot_arms(result, os.path.join(args.workdir, "arms.png"))
    print(table, flush=True)


def main(argv):
    args, passthrough = parse(argv)
    files.makedirs(args.workdir)
    status = 0 if args.aggregate_only else run_seeds(args, passthrough)
    aggregate(args)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
