"""The state one jitted training step maps to the next: params, optimiser state, step counter, RNG."""
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
