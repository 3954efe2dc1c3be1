"""Before an on-policy stage trains: compile its sampler and its update at their largest shapes for the devices the
run has, and stop in one line naming the knobs to turn when a program's peak does not fit a device's memory
(the accelerator's limit; host RAM on CPU, shared by its local devices). An out-of-memory kill an hour into a run
becomes a refusal before its first step.

A program's peak is XLA's own accounting of its compile (`memory_analysis`: arguments + outputs + temporaries -
aliased) plus the frozen roles resident beside it that it does not take as an argument. The runtime's reserve
and fragmentation are not counted: fitting here is necessary, not a guarantee.
"""
from __future__ import annotations

import math
import os
import time

import jax
import jax.numpy as jnp

from nemocascade.errors import BadInput
from nemocascade.mesh import batch_sharding, replicated

GiB = 2 ** 30


def device_memory() -> int:
    """Bytes one device may hold: the accelerator's `bytes_limit`, or on CPU the host's RAM over its local devices."""
    device = jax.local_devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // jax.local_device_count()


def peak(compiled) -> int:
    m = compiled.memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


def tree_bytes_per_device(tree) -> int:
    """Bytes of one device's shard of every array of `tree` (arrays, or abstract ones with shardings)."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def check(name: str, programs, limit: int | None = None) -> dict:
    """`programs`: (what, lowered program, resident bytes beside it, knobs to turn) -> {what: peak bytes}; raises
    BadInput naming the first program that does not fit `limit` (default: `device_memory()`)."""
    limit = device_memory() if limit is None else limit
    t0, peaks = time.perf_counter(), {}
    for what, lowered, resident, knobs in programs:
        peaks[what] = peak(lowered.compile()) + resident
        if peaks[what] > limit:
            raise BadInput(f"[{name}] its {what} needs {peaks[what] / GiB:.2f} GiB per device and a device holds "
                           f"{limit / GiB:.2f}: {knobs}")
    print(f"[{name}] preflight: " + ", ".join(f"{w} {p / GiB:.2f} GiB" for w, p in peaks.items())
          + f" per device of {limit / GiB:.1f} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return peaks


def onpolicy(ctx, name, stage, trainer, roles, source) -> dict:
    """The sampler (one `rollout.sample_chunks` chunk of prompts at the widest prompt bucket and longest response)
    and the update on the largest training batch (every prompt's group at prompt + response width), compiled as
    the stage runs them."""
    from nemocascade.rl import rollouts as rollouts_lib

    mesh, ro = ctx.mesh, stage.rollout
    B, G = ro.prompts_per_step, ro.group_size
    max_new = max([ro.max_new_tokens] + [n for _, n in ro.length_curriculum])
    width = rollouts_lib.prompt_width(stage, ctx) + max_new
    rows = lambda n, shape, dt: jax.ShapeDtypeStruct((n, *shape), dt, sharding=batch_sharding(mesh, 1 + len(shape), n))  # noqa: E731
    batch = rollouts_lib.batch_shapes(mesh, B, G, width)
    frozen = jax.eval_shape(roles, batch)
    batch |= {k: rows(x.shape[0], x.shape[1:], x.dtype) for k, x in frozen.items()}
    roles_bytes = sum(tree_bytes_per_device(p) for p in (*roles.teachers, roles.reference) if p is not None)
    programs = [("update", trainer.lower_step(batch), roles_bytes,
                 f"raise objective.micro_batches (now {stage.objective.micro_batches}), set model.remat=True, or use "
                 "more devices")]
    if source.sampler is not None:  # (None: episodes, which decode turn by turn)
        n, prompt = B // ro.sample_chunks, rollouts_lib.prompt_width(stage, ctx)  # the widest prompt bucket
        key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated(mesh))
        sampler = source.sampler(trainer.params, rows(n, (prompt,), jnp.int32), rows(n, (), jnp.int32), key,
                                 max_new, lower=True)
        programs.insert(0, ("sampler", sampler, tree_bytes_per_device(trainer.state.opt_state) + roles_bytes,
                            f"raise rollout.sample_chunks (now {ro.sample_chunks}), or lower "
                            "rollout.prompts_per_step or the lengths"))
    return check(name, programs)
