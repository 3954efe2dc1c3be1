"""Run an experiment: `python experiments/run.py --config=NAME[:VARIANT] --workdir=DIR [--config.key=value ...]`.

NAME is a file in experiments/configs/ (or a path to a config file); VARIANT is passed to its
`get_config(arg)`. Every config key can be overridden on the command line. An interrupted run resumes
where it stopped when started again with the same workdir and config (`--allow_config_change=eval.*` lets
named keys differ; the change is recorded in summary.json). `--rescore` evaluates a workdir's finished stages
again without training (after a change to evaluation).

Exit status: 0 done; 2 bad input (a config key, value, path, or a workdir started with another config);
3 training diverged (non-finite updates); 75 workdir in use by another run; 130/143 stopped by SIGINT/SIGTERM
at a step boundary, checkpoint saved (nemocascade/errors.py). Each prints one line, no traceback.
"""
import difflib
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # run from a checkout without installing


def resolve_config_arg(argv: list[str]) -> list[str]:
    """`--config=cascade_math:tiny` -> `--config=<repo>/experiments/configs/cascade_math.py:tiny`, and a list-valued
    `--config.KEY=a,b` -> `--config.KEY=('a', 'b')` (`configs.expand_list_overrides`)."""
    from nemocascade import configs

    out = []
    for a in argv:
        if a.startswith("--config="):
            try:
                path, variant = configs.resolve(a[len("--config="):])
            except FileNotFoundError as err:
                sys.exit(_bad_input(f"--config: {err}"))
            a = f"--config={path}" + (f":{variant}" if variant else "")
            configs.add_import_dir(path)  # ml_collections loads the file itself: `from _common import ...` must work
        out.append(a)
    spec = next((a[len("--config="):] for a in out if a.startswith("--config=")), None)
    if spec and any(a.startswith("--config.") for a in out):
        try:
            cfg = configs.load(spec)
        except Exception:  # a config that fails to load: absl's parse reports its own error
            return out
        out = configs.expand_list_overrides(out, cfg)  # --config.stages.grpo.domains=math,if
    return out


_CONFIG = config_flags.DEFINE_config_file("config", None, "experiments/configs/NAME.py[:VARIANT]", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (default runs/NAME[_VARIANT])")
_ALLOW = flags.DEFINE_list("allow_config_change", [], "config keys (fnmatch patterns, e.g. eval.*) a resumed run "
                           "may change; the change is recorded in summary.json")
_RESCORE = flags.DEFINE_bool("rescore", False, "evaluate the workdir's finished stages again from their final params, "
                              "without training (after a change to evaluation); rewrites their scores in "
                              "summary.json, eval_scores/, the tables and plots")
_REDO = flags.DEFINE_string("redo_from", None, "discard this finished stage and every stage after it, then resume: "
                            "the finished stages before it continue another way (a new stage order, say) without "
                            "training again; keys of the discarded stages may change with --allow_config_change")
_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "multi-host: call jax.distributed.initialize() first "
                                 "(coordinator/process ids from the environment: TPU VM, SLURM, or "
                                 "JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID)")


def parse_flags(argv: list[str]) -> list[str]:
    """absl parsing, but a bad `--config.KEY=VALUE` ends in one line naming the key (with the nearest valid
    one) or the value, and exit status 2, instead of chained tracebacks."""
    try:
        return flags.FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as err:
        known = _known_keys(argv)
        for arg in argv[1:]:
            key = arg.split("=", 1)[0][len("--config."):] if arg.startswith("--config.") else None
            if known and key is not None and key not in known:
                near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
                sys.exit(_bad_input(f"--config.{key}: no such config key"
                                    + (f"; did you mean --config.{near[0]}?" if near else "")))
        sys.exit(_bad_input(str(err) if isinstance(err, flags.Error) else f"{type(err).__name__}: {err}"))


def _known_keys(argv: list[str]) -> set[str]:
    """Every dotted key of the config `--config=` names, inner nodes included (empty if it does not load)."""
    from nemocascade import configs

    spec = next((a[len("--config="):] for a in argv if a.startswith("--config=")), None)
    try:
        leaves = configs.flatten(configs.load(spec).to_dict()) if spec else {}
    except Exception:  # a config file that fails to load: its own error is reported instead
        return set()
    known = set()
    for key in leaves:
        parts = key.split(".")
        known.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return known


def _bad_input(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv):
    del argv
    from nemocascade import errors, interrupts

    interrupts.install()  # SIGINT/SIGTERM: finish the step, checkpoint, exit 130/143 (nemocascade/interrupts.py)
    try:
        run()
    except errors.RunStop as err:
        print(err if isinstance(err, errors.Interrupted) else f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:  # a second signal: stopped mid-step
        print("stopped at once by a second signal; a resume starts from the last saved checkpoint", file=sys.stderr)
        sys.exit(130)


def run():
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
    if _RESCORE.value and _REDO.value:
        sys.exit(_bad_input("--rescore and --redo_from: one at a time (rescore evaluates, redo trains again)"))
    if _RESCORE.value:
        summary = cascade.rescore(cfg, workdir, name, variant, allow_changes=_ALLOW.value)
    else:
        summary = cascade.run(cfg, workdir, name, variant, allow_changes=_ALLOW.value, redo_from=_REDO.value)
    print(f"done: {os.path.join(workdir, 'summary.json')} ({summary['total_wall_s']:.0f}s) [{spec}]")


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main, argv=resolve_config_arg(sys.argv), flags_parser=parse_flags)
