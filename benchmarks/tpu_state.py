"""Per-chip training state (params + AdamW moments, float32) of Qwen3-8B on a TPU topology, compiled by the TPU
compiler without a TPU, under the old sharding rules (a dense model replicated over the `expert` axis) and the
current ones (`mesh.DENSE_RULES`: sharded over it too).

    pip install "jax[tpu]==0.10.2"
    JAX_PLATFORMS=cpu python benchmarks/tpu_state.py [--topology=v5p:4x4x4 --mesh=fsdp=16,expert=2,tensor=2]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import optax  # noqa: E402
from jax.experimental import topologies  # noqa: E402

from nemocascade import mesh as mesh_lib, train_state  # noqa: E402
from nemocascade.models import ModelConfig, init_params, param_axes, param_shapes  # noqa: E402

QWEN3_8B = ModelConfig(vocab_size=151936, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128,
                       d_ff=12288, qk_norm=True, tie_embeddings=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", default="v5p:4x4x4")
    ap.add_argument("--mesh", default="fsdp=16,expert=2,tensor=2")
    a = ap.parse_args()
    devices = topologies.get_topology_desc(platform="tpu", topology_name=a.topology).devices
    mesh = mesh_lib.make_mesh({k: int(v) for k, v in (kv.split("=") for kv in a.mesh.split(","))}, devices)
    cfg, tx = QWEN3_8B, optax.adamw(1e-6)
    create = lambda k: train_state.create(init_params(cfg, k), tx, k)  # noqa: E731
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=mesh_lib.replicated(mesh))
    for name, rules in (("replicated over expert (old RULES)", mesh_lib.RULES),
                        ("sharded over expert (DENSE_RULES)", mesh_lib.DENSE_RULES)):
        shard = mesh_lib.tree_shardings(mesh, param_axes(cfg), param_shapes(cfg), rules)
        out = train_state.shardings(jax.eval_shape(create, jax.random.key(0)), shard, mesh)
        compiled = jax.jit(create, out_shardings=out).trace(key).lower().compile()
        print(f"{a.topology} {a.mesh}, Qwen3-8B, {name}: "
              f"{compiled.memory_analysis().output_size_in_bytes / 2**30:.2f} GiB of state per chip")


if __name__ == "__main__":
    main()
