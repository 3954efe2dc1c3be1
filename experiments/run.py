"""Run an experiment: `python experiments/run.py --config=NAME[:VARIANT] --workdir=DIR [--config.key=value ...]`.

NAME is a file in experiments/configs/ (or a path to a config file); VARIANT is passed to its
`get_config(arg)`. Every config key can be overridden on the command line. An interrupted run resumes
where it stopped when started again with the same workdir.
"""
import os
import signal
import sys

from absl import app, flags, logging
from ml_collections import config_flags

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing


def resolve_config_arg(argv: list[str]) -> list[str]:
    """`--config=cascade_math:tiny` -> `--config=<repo>/experiments/configs/cascade_math.py:tiny`."""
    from nemocascade import configs

    out = []
    for a in argv:
        if a.startswith("--config="):
            try:
                path, variant = configs.resolve(a[len("--config="):])
            except FileNotFoundError as err:
                sys.exit(f"--config: {err}")
            a = f"--config={path}" + (f":{variant}" if variant else "")
        out.append(a)
    return out


_CONFIG = config_flags.DEFINE_config_file("config", None, "experiments/configs/NAME.py[:VARIANT]", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (default runs/NAME[_VARIANT])")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "multi-host: call jax.distributed.initialize() first "
                                 "(coordinator/process ids from the environment: TPU VM, SLURM, or "
                                 "JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID)")


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv):
    del argv
    # preemption (SIGTERM) takes the same path as Ctrl-C: the stage saves a checkpoint, then exits
    signal.signal(signal.SIGTERM, _raise_interrupt)
    logging.set_verbosity(logging.WARNING)  # orbax/absl INFO lines drown the progress output
    if _DISTRIBUTED.value:
        import jax
        env = os.environ  # TPU VMs and SLURM are detected by JAX; plain env vars are passed here
        kw = ({"coordinator_address": env["JAX_COORDINATOR_ADDRESS"], "num_processes": int(env["JAX_NUM_PROCESSES"]),
               "process_id": int(env["JAX_PROCESS_ID"])} if "JAX_NUM_PROCESSES" in env else {})
        jax.distributed.initialize(**kw)  # before any other JAX call: every host then sees the global mesh
    from nemocascade import cascade  # after flag parsing: keeps --help fast

    cfg = _CONFIG.value
    spec = flags.FLAGS["config"].config_filename
    variant = cfg.get("variant") or None
    name = cfg.name
    workdir = _WORKDIR.value or os.path.join("runs", name + (f"_{variant}" if variant else ""))
    summary = cascade.run(cfg, workdir, name, variant)
    print(f"done: {os.path.join(workdir, 'summary.json')} ({summary['total_wall_s']:.0f}s) [{spec}]")


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main, argv=resolve_config_arg(sys.argv))
