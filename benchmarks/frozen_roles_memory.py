"""Where a frozen role's pass belongs, by XLA's own memory accounting: in its own jit, or inside the step's.

    python benchmarks/frozen_roles_memory.py                  # SmolLM2-135M's shape, GRPO + KL, 64 x 384 tokens
    python benchmarks/frozen_roles_memory.py --rows=32 --width=256 --remat

Compiles (no run, no weights) on this machine's default backend: the reference's log-prob pass
(`rl.update.FrozenRoles`) and the on-policy update (`rl.update.policy_step`, objective pg + kl) as two programs,
and the same two fused into one jit. Prints each program's arguments + temporaries + outputs - aliased bytes
(its peak), MiB, and what stays resident beside it. Separate: the run's peak is the larger of the two; fused:
the one program's.
"""
from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import optax

from nemocascade import objectives, train_state
from nemocascade.models import ModelConfig, init_params
from nemocascade.rl import update

SMOLLM2 = dict(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, d_ff=1536)


def peak_mib(compiled) -> float:
    m = compiled.memory_analysis()
    return (m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes) / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--remat", action="store_true")
    args = ap.parse_args()
    cfg = ModelConfig(**SMOLLM2, remat=args.remat)
    params = jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0))
    tx = optax.adamw(1e-6)
    state = jax.eval_shape(lambda p: train_state.create(p, tx, jax.random.key(0)), params)
    n, L, G = args.rows, args.width, args.group
    spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
    batch = {"tokens": spec((n, L), jnp.int32), "valid": spec((n, L), jnp.bool_), "positions": spec((n, L), jnp.int32),
             "mask": spec((n, L - 1), jnp.float32), "sampler_logp": spec((n, L - 1), jnp.float32),
             "domain_idx": spec((n,), jnp.int32), "rewards": spec((n // G, G), jnp.float32),
             "truncated": spec((n // G, G), jnp.bool_)}
    objective = objectives.build(dict(terms={"pg": 1.0, "kl": 0.03}))
    roles = update.FrozenRoles(cfg, objective.needs, reference=params)
    step = update.policy_step(tx, model_cfg=cfg, objective=objective)
    ref = roles._logp.lower(params, batch).compile()
    ref_out = jax.ShapeDtypeStruct((n, L - 1), jnp.float32)
    alone = jax.jit(step, donate_argnums=0).lower(state, batch | {"ref_logp": ref_out}).compile()

    def fused(state, batch, reference):
        return step(state, batch | {"ref_logp": update._sampled_logp(cfg, reference, batch)})
    together = jax.jit(fused, donate_argnums=0).lower(state, batch, params).compile()
    a, b, c = peak_mib(ref), peak_mib(alone), peak_mib(together)
    print(f"model SmolLM2-135M shape, remat={args.remat}, batch {n} x {L}, backend {jax.default_backend()}")
    mib = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)) / 2**20  # noqa: E731
    # resident beside each program: the policy's state during the reference pass, the reference during the step
    print(f"separate jits: reference pass {a:,.0f} + policy state {mib(state):,.0f} MiB, step {b:,.0f} + reference "
          f"{mib(params):,.0f} MiB -> peak {max(a + mib(state), b + mib(params)):,.0f} MiB")
    print(f"one jit:       {c:,.0f} MiB (the reference an argument)")


if __name__ == "__main__":
    main()
