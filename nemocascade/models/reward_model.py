"""A scalar Bradley-Terry reward model: our transformer plus a linear head on the last token's hidden state.

    rm_params = {**transformer params, "rm_head": {"w": [d_model], "b": []}}     (one pytree)
    r(x) = w . h_T + b,   h_T = final-norm hidden state at the last valid token of x

The transformer part has exactly the policy's structure, so `transformer.forward_hidden` applies it unchanged
(the LM head is kept, unused: `forward_hidden` stops before it) and Cascade 1's recipe of starting the
RM from the SFT policy is `init_rm(policy_params, ...)`. The head starts at zero: the initial RM scores
every text 0, so its first Bradley-Terry loss is exactly log 2 and no random preference is baked in.

Sharding: the head's vector is replicated (logical axis "norm", as `final_norm`); the rest follows the
policy's rules, so the RM lives on the same mesh as every other role (`param_shardings`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from nemocascade import mesh as mesh_lib
from nemocascade.models import transformer

HEAD = "rm_head"


def param_axes(cfg: transformer.ModelConfig) -> transformer.Params:
    return {**transformer.param_axes(cfg), HEAD: {"w": ("norm",), "b": ()}}


def param_shapes(cfg: transformer.ModelConfig) -> transformer.Params:
    return {**transformer.param_shapes(cfg), HEAD: {"w": (cfg.d_model,), "b": ()}}


def param_shardings(cfg: transformer.ModelConfig, mesh):
    """NamedShardings of every RM parameter on `mesh` (the policy's rules; the head replicated)."""
    return mesh_lib.tree_shardings(mesh, param_axes(cfg), param_shapes(cfg), mesh_lib.param_rules(cfg.moe))


def abstract_params(cfg: transformer.ModelConfig, mesh):
    """ShapeDtypeStructs with shardings of the RM pytree: the target for `checkpoint.load_params`."""
    shapes, dtype = param_shapes(cfg), jnp.dtype(cfg.param_dtype)
    is_leaf = lambda x: isinstance(x, tuple)  # noqa: E731
    return jax.tree.map(lambda sh, s: jax.ShapeDtypeStruct(sh, dtype, sharding=s), shapes,
                        param_shardings(cfg, mesh), is_leaf=is_leaf)


def init_rm(policy_params: transformer.Params, cfg: transformer.ModelConfig, key: jax.Array,
            head_std: float = 0.0) -> transformer.Params:
    """RM params: a copy of the policy's transformer and a head N(0, head_std) (default: zeros), b = 0."""
    dtype = jnp.dtype(cfg.param_dtype)
    body = {k: v for k, v in policy_params.items() if k != HEAD}
    head = {"w": (head_std * jax.random.normal(key, (cfg.d_model,), jnp.float32)).astype(dtype),
            "b": jnp.zeros((), dtype)}
    return {**jax.tree.map(jnp.copy, body), HEAD: head}


def last_valid_index(valid) -> jax.Array:
    """Index of each row's last True in `valid` [B, T] (rows may be left- and right-padded); 0 if none."""
    T = valid.shape[1]
    idx = jnp.arange(T, dtype=jnp.int32)
    return jnp.max(jnp.where(valid, idx[None, :], -1), axis=1).clip(0)


def rm_scores(rm_params: transformer.Params, cfg: transformer.ModelConfig, tokens, positions, valid) -> jax.Array:
    """Scalar rewards [B] float32 of `tokens` [B, T], read at each row's last valid token.

    positions / valid as in `transformer.forward`; `transformer.left_pad_positions(valid)` gives the right
    positions for left, right or both-sided padding (0 at each row's first real token). Padding after
    the last real token is never attended to by it (causal mask), so right padding does not change a score.
    A row with no valid token gets the score of position 0 (meaningless; mask it out).
    """
    h = transformer.forward_hidden(rm_params, cfg, tokens, positions, valid)
    last = last_valid_index(valid)
    h_last = jnp.take_along_axis(h, last[:, None, None], axis=1)[:, 0].astype(jnp.float32)  # [B, D]
    head = rm_params[HEAD]
    return h_last @ head["w"].astype(jnp.float32) + head["b"].astype(jnp.float32)
