"""The state one jitted training step maps to the next (params, optimiser state, step counter, RNG), and the one
step every stage kind runs: `make_step` over the stage's loss."""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import optax

from nemocascade.mesh import replicated


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: dict
    opt_state: optax.OptState
    rng: jax.Array  # raw uint32 key data (jax.random.key_data), so orbax can store it


def create(params, tx: optax.GradientTransformation, rng: jax.Array) -> TrainState:
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), jax.random.key_data(rng))


def make_step(loss, tx: optax.GradientTransformation, *, grad_clip: float = 0.0, micro_batches: int = 1,
              prepare=None):
    """One optimiser update, `step(state, batch, *frozen) -> (state, metrics)`, pure and jittable.

    `loss(params, rows, shared, *frozen) -> (scalar, metrics)` is the stage's objective on rows of the batch;
    `prepare(batch, step) -> (rows, shared, metrics)` computes once over the whole batch what every micro-batch
    reads (GRPO's group advantages and normalisers; default: the batch itself, None, no metrics). `micro_batches`
    split the rows and sum losses, metrics and gradients (a loss normalised by the whole batch's `shared` gives
    the full batch's gradient). `frozen`: arguments the loss reads and never trains (LoRA's base: `lora.over_adapters`).

    `grad_norm` is the global norm before clipping, `clipped` whether optax.clip_by_global_norm(grad_clip) scaled
    it down (its rule, norm >= max). An update whose loss, gradient norm or new params are not finite is discarded
    (params and optimiser state kept, the step counter advanced, `skipped_nonfinite` 1): no checkpoint ever holds
    a NaN or an inf."""
    def step(state, batch, *frozen):
        rows, shared, metrics = prepare(batch, state.step) if prepare else (batch, None, {})

        def grads_of(b):
            (value, m), g = jax.value_and_grad(loss, has_aux=True)(state.params, b, shared, *frozen)
            return value, m, g

        if micro_batches == 1:
            value, m, grads = grads_of(rows)
        else:
            split = jax.tree.map(lambda x: x.reshape(micro_batches, x.shape[0] // micro_batches, *x.shape[1:]), rows)
            zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grads_of, jax.tree.map(lambda x: x[0], split)))
            (value, m, grads), _ = jax.lax.scan(lambda c, b: (jax.tree.map(jnp.add, c, grads_of(b)), None),
                                                zeros, split)
        norm = optax.global_norm(grads)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        finite = jnp.isfinite(value) & jnp.isfinite(norm)
        for leaf in jax.tree.leaves(params):
            finite &= jnp.all(jnp.isfinite(leaf))
        keep = lambda new, old: jax.tree.map(lambda x, y: jnp.where(finite, x, y), new, old)  # noqa: E731
        metrics = {**metrics, **m, "loss": value, "grad_norm": norm,
                   "clipped": (norm >= grad_clip).astype(jnp.float32) if grad_clip else jnp.zeros([]),
                   "skipped_nonfinite": 1.0 - finite.astype(jnp.float32)}
        return state.replace(step=state.step + 1, params=keep(params, state.params),
                             opt_state=keep(opt_state, state.opt_state)), metrics
    return step


def shardings(state_shape: TrainState, param_shardings, mesh) -> TrainState:
    """Optimiser moments follow their parameter's sharding (matched by tree structure); scalars are
    replicated. `state_shape` is the `jax.eval_shape` of a state."""
    rep = replicated(mesh)
    param_treedef = jax.tree.structure(state_shape.params)

    def opt_shardings(node):
        if jax.tree.structure(node) == param_treedef:
            return param_shardings
        return rep

    opt = jax.tree.map(opt_shardings, state_shape.opt_state,
                       is_leaf=lambda n: jax.tree.structure(n) == param_treedef)
    return TrainState(rep, param_shardings, opt, rep)
