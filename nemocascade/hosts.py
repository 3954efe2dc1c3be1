"""Several processes, one run (multi-host, `jax.distributed`): every process computes the same thing, process 0
alone writes the run's files (metrics, summaries, TensorBoard, plots, registries), orbax writes checkpoints from
all processes together, and what one process builds for the others (data, tokenizer) is built by process 0 while
the others wait at a barrier. With one process every helper here is a no-op wrapper."""
from __future__ import annotations

import jax


def is_lead() -> bool:
    """True on the process that writes the run's files (process 0; always, with one process)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier `name` (a no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def lead_first(name: str, build):
    """`build()` on process 0, then on the others once it has finished: process 0 builds what is missing (a
    dataset, a tokenizer) and the others then find it built and only load it. Returns `build()`'s value."""
    if is_lead():
        out = build()
        barrier(name)
        return out
    barrier(name)
    return build()
