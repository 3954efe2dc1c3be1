"""Checkpoints of one stage: params, optimiser state, step, RNG and the data iterator's state.

Orbax `CheckpointManager` under `workdir/checkpoints/<stage>/`, one numbered step directory per save,
written atomically by orbax (a crash mid-save leaves no half checkpoint that `latest_step` would pick).
Restoring places every array straight into the shardings of an abstract target state, so a run resumed
on another mesh reshards on load.
"""
from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


class StageCheckpointer:
    def __init__(self, directory: str, max_to_keep: int = 2, save_interval_steps: int = 1):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                               save_interval_steps=save_interval_steps)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data_state: dict | None = None, force: bool = False) -> bool:
        """Save `state` (a pytree) and the JSON-serialisable data-iterator state. Blocks until written
        so an interruption right after never loses it."""
        saved = self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state or {})), force=force)
        self.manager.wait_until_finished()
        return saved

    def restore(self, abstract_state, step: int | None = None):
        """Returns (state, data_state) of `step` (default: latest). `abstract_state` is a pytree of
        `jax.ShapeDtypeStruct` with shardings (e.g. from `jax.eval_shape` + shardings)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        return out["state"], out["data"]

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()


def abstract_like(tree, shardings):
    """ShapeDtypeStructs of `tree` (arrays or ShapeDtypeStructs) carrying `shardings`."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def save_params(path: str, params):
    """One-off params checkpoint (a stage's final params, a teacher). Overwrites atomically."""
    path = os.path.abspath(path)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path, params, force=True)


def load_params(path: str, abstract_params):
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(os.path.abspath(path), abstract_params)
