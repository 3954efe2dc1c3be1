"""One device mesh for every role, and logical-axis sharding rules.

The mesh has four named axes: `data` (pure data parallel), `fsdp` (data parallel with parameters
sharded), `expert` (expert parallel: a mixture of experts' experts split across it; outside the expert layers it
is one more data-parallel axis) and `tensor` (Megatron-style model parallel). Parameters and activations name
*logical* axes (see `models.transformer.param_axes`); `RULES` maps each logical axis to mesh axes. The policy, the
frozen reference and every teacher are placed with the same rules on the same mesh, so a teacher is just
another pytree with the same shardings as the policy.

A logical axis whose size is not divisible by its mesh axes is replicated instead (tiny demo models on
many devices), never an error.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "expert", "tensor")

# logical axis -> mesh axes (None = replicated). Activations use "batch".
RULES: dict[str, tuple[str, ...] | None] = {
    "batch": ("data", "fsdp", "expert"),
    "experts": ("expert",),
    "vocab": ("tensor",),
    "embed": ("fsdp",),
    "heads": ("tensor",),
    "kv_heads": ("tensor",),
    "mlp": ("tensor",),
    "head_dim": None,
    "layers": None,
    "norm": None,
}
# A dense model shards its weights over the `expert` axis too (there it is one more data-parallel axis), as ZeRO-3
# over all data-parallel devices does. With experts the expert layers own that axis and the other weights keep to
# fsdp: sharing it makes XLA lay the expert weights' gradients out by `embed`, the experts no longer split.
DENSE_RULES = RULES | {"embed": ("fsdp", "expert")}


def param_rules(moe: bool) -> dict:
    """The rules a model's params (and so its optimiser state) shard by: RULES with experts, else DENSE_RULES."""
    return RULES if moe else DENSE_RULES


def make_mesh(shape: Mapping[str, int] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Mesh over all (global, multi-host included) devices. `shape` maps mesh axes to sizes; one size
    may be -1 to take the remaining devices (default: everything on `fsdp`)."""
    devices = list(devices if devices is not None else jax.devices())
    shape = dict(shape or {"data": 1, "fsdp": -1, "tensor": 1})
    unknown = sorted(set(shape) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"mesh: unknown axis {unknown}; axes are {MESH_AXES}")
    sizes = [int(shape.get(a, 1)) for a in MESH_AXES]
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh: at most one axis may be -1, got {shape}")
    fixed = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % fixed:
            raise ValueError(f"mesh: {len(devices)} devices not divisible by the fixed axes {shape}")
        sizes[sizes.index(-1)] = len(devices) // fixed
    if math.prod(sizes) != len(devices):
        raise ValueError(f"mesh: axes {dict(zip(MESH_AXES, sizes))} need {math.prod(sizes)} devices, "
                         f"have {len(devices)}")
    if len(devices) > 1 and jax.process_count() == 1:
        grid = np.asarray(devices).reshape(sizes)
        return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))
    # multi-host / real accelerators: let JAX pick a topology-aware device order
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def logical_spec(mesh: Mesh, axes: Sequence[str | None], shape: Sequence[int], rules=RULES) -> PartitionSpec:
    """PartitionSpec for an array with logical `axes`; replicate dims that don't divide evenly and
    never use one mesh axis twice."""
    used, spec = set(), []
    for name, dim in zip(axes, shape):
        if name is not None and name not in rules:
            raise KeyError(f"no sharding rule for logical axis {name!r}; rules cover {sorted(rules)}")
        mesh_axes = tuple(a for a in (rules.get(name) or ()) if a not in used and mesh.shape[a] > 1)
        size = math.prod(mesh.shape[a] for a in mesh_axes)
        if not mesh_axes or dim % size:
            spec.append(None)
            continue
        used.update(mesh_axes)
        spec.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    return PartitionSpec(*spec)


def constrain(x, axes: Sequence[str | None], rules=RULES):
    """x laid out by its logical `axes` on the mesh being traced under (`jax.sharding.use_abstract_mesh`, as
    cascade.py traces every program); x as it is outside one.
    The models pin their activations so, rows over the data-parallel axes: left to itself XLA may lay a layer's
    activations out by the FSDP-sharded `embed` dim of its weights, every chip computing every row."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, logical_spec(mesh, axes, x.shape, rules))


def tree_shardings(mesh: Mesh, axes_tree, shapes_tree, rules=RULES):
    """NamedShardings for a pytree given matching pytrees of logical axes and shapes."""
    is_leaf = lambda x: isinstance(x, tuple)  # noqa: E731
    return jax.tree.map(lambda ax, sh: NamedSharding(mesh, logical_spec(mesh, ax, sh, rules)),
                        axes_tree, shapes_tree, is_leaf=is_leaf)


def batch_sharding(mesh: Mesh, ndim: int, batch_size: int) -> NamedSharding:
    """Leading (batch) dim over the batch axes (data x fsdp x expert) when divisible, the rest replicated."""
    return NamedSharding(mesh, logical_spec(mesh, ("batch",) + (None,) * (ndim - 1),
                                            (batch_size,) + (1,) * (ndim - 1)))


def shard_batch(mesh: Mesh, batch):
    """Place a host batch (pytree of numpy arrays) on the mesh, leading dim split over the batch axes.

    Every host holds the same *global* batch (our pipelines are deterministic given the seed) and each
    device takes its rows from it, so single- and multi-host runs see identical data."""
    def put(x):
        x = np.asarray(x)
        sharding = batch_sharding(mesh, x.ndim, x.shape[0]) if x.ndim else replicated(mesh)
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])
    return jax.tree.map(put, batch)


def to_host(tree):
    """Fetch (possibly multi-host sharded) arrays as numpy on every host."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils
    return multihost_utils.process_allgather(tree, tiled=True)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())
