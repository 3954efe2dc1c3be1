"""Compile cascade_math's GRPO programs for a real TPU topology, deviceless, with the TPU compiler (libtpu).

    pip install "jax[tpu]==0.10.2"        # the jax the project installs; no TPU needed
    JAX_PLATFORMS=cpu python benchmarks/tpu_compile.py --topology=v5e:2x2

Programs: the sampler (`sampling.sample`, prefill + decode loop), the on-policy step (`rl.update.policy_step`, the
pg objective, AdamW) and one teacher pass (`rl.update.FrozenRoles`), on cascade_math's model in bfloat16 and its GRPO
shapes (prompts x group, 64-token prompts, 112 new tokens), params sharded over `fsdp` on every chip. Prints per
program the compiler's temporaries and arguments per chip, flops and `optimal_seconds`. A loop body is counted once
(issue 39: compile a decode step or a micro-batch alone for per-iteration costs); a negative optimal_seconds is the
compiler's own figure, printed as given.
"""
import argparse
import functools
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import topologies  # noqa: E402

from nemocascade import configs, objectives, optim, sampling, train_state  # noqa: E402
from nemocascade import mesh as mesh_lib  # noqa: E402
from nemocascade.models import ModelConfig, init_params, param_shardings  # noqa: E402
from nemocascade.rl import update  # noqa: E402

PROMPT_LEN, MAX_NEW = 64, 112


def report(compiled) -> dict:
    m, c = compiled.memory_analysis(), compiled.cost_analysis()
    c = c[0] if isinstance(c, list) else c
    return {"temp_mib": round(m.temp_size_in_bytes / 2**20, 2), "arg_mib": round(m.argument_size_in_bytes / 2**20, 2),
            "gflops": round(c.get("flops", 0) / 1e9, 3), "optimal_s": c.get("optimal_seconds")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--topology", default="v5e:2x2", help="e.g. v5e:2x2, v5p:2x2x2, v6e:2x2")
    args = ap.parse_args()
    devices = topologies.get_topology_desc(platform="tpu", topology_name=args.topology).devices
    cfg = configs.load("cascade_math")
    P, G = cfg.stages.grpo.rollout.prompts_per_step, cfg.stages.grpo.rollout.group_size
    model = ModelConfig.from_dict({**cfg.model.to_dict(), "vocab_size": cfg.tokenizer.vocab_size, "dtype": "bfloat16"})
    mesh = mesh_lib.make_mesh(None, devices)
    shard = param_shardings(model, mesh)
    abstract = lambda t, s: jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), t, s)  # noqa: E731
    params = abstract(jax.eval_shape(functools.partial(init_params, model), jax.random.key(0)), shard)
    tx, _ = optim.make_optimizer(ml_collections.ConfigDict(dict(optim.DEFAULTS)), 100)
    state_shape = jax.eval_shape(lambda p: train_state.create(p, tx, jax.random.key(0)), params)
    state = abstract(state_shape, train_state.shardings(state_shape, shard, mesh))

    def rows(n, shape, dtype):
        return jax.ShapeDtypeStruct((n, *shape), dtype, sharding=mesh_lib.batch_sharding(mesh, 1 + len(shape), n))

    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # as a run traces its programs (cascade.py)
        out = {"topology": args.topology, "chips": len(devices), "prompts x group": [P, G]}
        key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=mesh_lib.replicated(mesh))
        sample = jax.jit(functools.partial(sampling.sample, cfg=model, max_new_tokens=MAX_NEW, eos_id=2, num_samples=G))
        out["sample"] = report(sample.trace(params, prompt_tokens=rows(P, (PROMPT_LEN,), jnp.int32),
                                            prompt_lens=rows(P, (), jnp.int32), rng=key).lower().compile())
        step = jax.jit(update.policy_step(tx, model_cfg=model, objective=objectives.build(dict(terms={"pg": 1.0}))),
                       donate_argnums=0)
        N, W = P * G, PROMPT_LEN + MAX_NEW
        batch = {"tokens": rows(N, (W,), jnp.int32), "valid": rows(N, (W,), jnp.bool_),
                 "positions": rows(N, (W,), jnp.int32),
                 "mask": rows(N, (W - 1,), jnp.float32), "sampler_logp": rows(N, (W - 1,), jnp.float32),
                 "domain_idx": rows(N, (), jnp.int32), "rewards": rows(P, (G,), jnp.float32),
                 "truncated": rows(P, (G,), jnp.bool_)}
        out["step"] = report(step.trace(state, batch).lower().compile())
        roles = update.FrozenRoles(model, {"teacher_logp"}, teachers=(params,), teacher_of_domain=np.zeros(1, np.int32))
        out["teacher"] = report(roles._teacher.trace(params, batch, rows(N, (), jnp.bool_), None).lower().compile())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
