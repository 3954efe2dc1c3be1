"""Checkpoints of one stage: params, optimiser state, step, RNG and the data iterator's state.

Orbax `CheckpointManager` under `workdir/checkpoints/<stage>/`, one numbered step directory per save,
written atomically by orbax (a crash mid-save leaves no half checkpoint that `latest_step` would pick).
Restoring places every array straight into the shardings of an abstract target state, so a run resumed
on another mesh reshards on load.

A step that cannot be read (files truncated, deleted or garbled after it was written) is reported in one line
and the next older step is tried; with none left the error names the directory. `save_params` writes beside
the target and renames into place, so the old params stay whole until the new ones are.
"""
from __future__ import annotations

import sys

import jax
import orbax.checkpoint as ocp

from nemocascade import files, hosts
from nemocascade.errors import BadInput


def _why(err: BaseException) -> str:
    """The first line of an orbax/TensorStore error (they run to dozens of lines)."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200] if text else ''}"


class StageCheckpointer:
    def __init__(self, directory: str, max_to_keep: int = 2, save_interval_steps: int = 1):
        self.directory = files.path(directory)  # an epath: orbax writes gs:// through TensorStore's own driver
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                               save_interval_steps=save_interval_steps)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        self.wait()
        return self.manager.latest_step()

    def wait(self):
        """Block until every started save is on disk."""
        self.manager.wait_until_finished()

    def save(self, step: int, state, data_state: dict | None = None, force: bool = False) -> bool:
        """Save `state` (a pytree) and the JSON-serialisable data-iterator state, asynchronously: orbax copies
        the arrays to host memory before returning (so the next step may donate them) and writes them in a
        background thread while training goes on; a step directory appears only once complete (an interrupted
        write leaves the previous checkpoint the latest). `close()` (and the next save) waits for the write."""
        return self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state or {})), force=force)

    def restore(self, abstract_state, step: int | None = None):
        """Returns (state, data_state) of `step`. `abstract_state` is a pytree of `jax.ShapeDtypeStruct` with
        shardings (e.g. from `jax.eval_shape` + shardings)."""
        if step is None:
            return self.restore_latest_good(abstract_state)[1:]
        self.wait()
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        return out["state"], out["data"]

    def restore_latest_good(self, abstract_state):
        """(step, state, data_state) of the newest step that restores; unreadable ones are reported on stderr,
        one line each, and skipped. FileNotFoundError if there is no step, BadInput if none restores."""
        self.wait()
        steps = sorted(self.manager.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        for step in steps:
            try:
                state, data = self.restore(abstract_state, step)
            except Exception as err:  # orbax/TensorStore raise many types for damaged files
                print(f"checkpoint {self.directory}/{step} is unreadable ({_why(err)}); trying an older one",
                      file=sys.stderr)
                continue
            return step, state, data
        raise BadInput(f"no readable checkpoint in {self.directory} (steps {steps} all failed to restore); "
                       "delete the directory to restart this stage from its start")

    def restore_or_init(self, abstract_state, init):
        """(state, data_state) of the newest readable step, the steps after it dropped (`drop_after`); with no
        step, (init(), {}): the one way a stage's state comes to be."""
        if self.latest_step() is None:
            return init(), {}
        step, state, data = self.restore_latest_good(abstract_state)
        self.drop_after(step)
        return state, data

    def drop_after(self, step: int) -> None:
        """Delete steps newer than `step` (the unreadable ones a resume skipped), so the next save of those
        step numbers is not refused as already present."""
        self.wait()
        for s in self.manager.all_steps():
            if s > step:
                self.manager.delete(s)

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()


def abstract_like(tree, shardings):
    """ShapeDtypeStructs of `tree` (arrays or ShapeDtypeStructs) carrying `shardings`."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def save_params(path: str, params):
    """One-off params checkpoint (a stage's final params, a teacher). Written to a sibling directory, then
    renamed into place: a crash leaves either the old params or the new ones at `path`, never a mix."""
    path = str(files.path(path))
    tmp, old = f"{path}.tmp", f"{path}.old"  # the same names on every process: orbax writes one checkpoint from all
    if hosts.is_lead():
        files.rmtree(tmp)  # a killed earlier save's
    hosts.barrier(f"save_params:{path}:start")
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(files.path(tmp), params)
    if hosts.is_lead():
        if files.exists(path):
            files.rmtree(old)
            files.rename(path, old)
        files.rename(tmp, path)
        files.rmtree(old)
    hosts.barrier(f"save_params:{path}:done")


def load_params(path: str, abstract_params):
    """Params saved by `save_params`; BadInput naming `path` if they are missing or unreadable."""
    path = str(files.path(path))
    if not files.exists(path) and files.exists(f"{path}.old"):
        path = f"{path}.old"  # killed between the two renames of save_params
    try:
        with ocp.StandardCheckpointer() as ckptr:
            return ckptr.restore(files.path(path), abstract_params)
    except Exception as err:
        raise BadInput(f"params checkpoint {path} is missing or unreadable ({_why(err)}); rerun the stage "
                       "that wrote it (delete its entry from summary.json) or restore the directory") from None
