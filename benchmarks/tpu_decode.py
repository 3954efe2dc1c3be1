"""One decode step of Qwen3-8B against its HBM roofline, by the TPU compiler's own estimate, without a TPU.

    pip install -e ".[tpu]"
    JAX_PLATFORMS=cpu python benchmarks/tpu_decode.py [--topology=v5p:4x4x4 --rows=256 --filled=2048 --cache=4096]

A decode step (`forward_cached`, one token per row, the cache read densely: the accelerator default) reads every
weight and the KV cache. Its floor is (weights + filled KV) bytes per chip / HBM bandwidth, two ways: the bfloat16
weights split over every chip, or as FSDP lays them out for sampling, gathered onto every data-parallel shard
(split only over `tensor`). The compiler's `cost_analysis` counts a loop's body once, so the layer scan is
compiled unrolled here (`jax.lax.scan` with unroll=True: the only loop of a dense decode step). Printed per chip: the
compiler's bytes accessed and optimal seconds, each floor, and floor / optimal (the fraction of the roofline
reached), for the weights as stored (float32, cast in every step) and as a bfloat16 copy.
"""
import argparse
import functools
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import topologies  # noqa: E402

from nemocascade import mesh as mesh_lib  # noqa: E402
from nemocascade.models import forward_cached, init_cache, init_params, param_shardings  # noqa: E402

from memory_plan import MESHES, MODELS  # noqa: E402

HBM_GBPS = {"v5e": 819, "v5p": 2765, "v6e": 1640, "v4": 1228}
jax.lax.scan = functools.partial(jax.lax.scan, unroll=True)  # every layer counted (see the docstring)


def step_cost(cfg, mesh, rows: int, cache_len: int, param_dtype: str) -> dict:
    shard = param_shardings(cfg, mesh)
    shapes = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
    params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, jnp.dtype(param_dtype), sharding=s), shapes, shard)
    kv = mesh_lib.logical_spec(mesh, (None, "batch", None, "kv_heads", None),
                               (cfg.n_layers, rows, cache_len, cfg.n_kv_heads, cfg.head_dim))
    cache = jax.eval_shape(lambda: init_cache(cfg, rows, cache_len))
    cache = cache._replace(k=jax.ShapeDtypeStruct(cache.k.shape, cache.k.dtype, sharding=jax.NamedSharding(mesh, kv)),
                           v=jax.ShapeDtypeStruct(cache.v.shape, cache.v.dtype, sharding=jax.NamedSharding(mesh, kv)),
                           valid=jax.ShapeDtypeStruct(cache.valid.shape, bool,
                                                      sharding=mesh_lib.batch_sharding(mesh, 2, rows)))
    one = lambda dt: jax.ShapeDtypeStruct((rows, 1), dt, sharding=mesh_lib.batch_sharding(mesh, 2, rows))  # noqa: E731
    start = jax.ShapeDtypeStruct((), jnp.int32, sharding=mesh_lib.replicated(mesh))
    step = jax.jit(functools.partial(forward_cached, cfg=cfg), donate_argnames="cache")
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        c = step.trace(params, tokens=one(jnp.int32), positions=one(jnp.int32), valid=one(bool), cache=cache,
                       start=start).lower().compile()
    cost = c.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return {"bytes": cost["bytes accessed"], "optimal_s": cost["optimal_seconds"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", default="v5p:4x4x4")
    ap.add_argument("--rows", type=int, default=256, help="decode batch (rows sampled together)")
    ap.add_argument("--cache", type=int, default=4096, help="cache slots (prompt + response)")
    ap.add_argument("--filled", type=int, default=2048, help="slots filled at this step (what the floor reads)")
    a = ap.parse_args()
    devices = topologies.get_topology_desc(platform="tpu", topology_name=a.topology).devices
    mesh = mesh_lib.make_mesh(MESHES["dense"][len(devices)], devices)
    full = MODELS["qwen3-8b"]
    dp = mesh.shape["data"] * mesh.shape["fsdp"] * mesh.shape["expert"]
    kv_bytes = full.n_layers * a.rows * a.filled * full.n_kv_heads * full.head_dim * 2 * 2 / mesh.size
    n_params = sum(x.size for x in jax.tree.leaves(jax.eval_shape(functools.partial(init_params, full),
                                                                  jax.random.key(0))))
    bw = HBM_GBPS[a.topology.split(":")[0]] * 1e9
    print(f"Qwen3-8B decode step, {a.topology} ({mesh.size} chips, {dict(mesh.shape)}), {a.rows} rows "
          f"({a.rows / dp:g} per data-parallel shard), cache {a.cache} slots, {a.filled} filled")
    for dtype in ("float32", "bfloat16"):
        total = step_cost(full, mesh, a.rows, a.cache, dtype)
        # floors: bfloat16 weights split over every chip, or as this layout needs them (every data-parallel
        # shard multiplies its rows by all of them: FSDP gathers each layer, split only over `tensor`), plus the KV
        for name, w in (("weights / chips", n_params * 2 / mesh.size),
                        ("weights / tensor (FSDP's)", n_params * 2 / mesh.shape["tensor"])):
            floor_s = (w + kv_bytes) / bw
            print(f"  params {dtype:8s}: compiler {total['bytes'] / 2**30:6.2f} GiB read per chip, optimal "
                  f"{total['optimal_s'] * 1e3:7.3f} ms | floor with {name}: {(w + kv_bytes) / 2**30:5.2f} GiB, "
                  f"{floor_s * 1e3:6.3f} ms: roofline reached {floor_s / total['optimal_s']:.0%}")


if __name__ == "__main__":
    main()
