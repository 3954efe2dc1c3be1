"""Model families. `transformer` is the one model function every role (policy, reference, teacher) uses."""
import jax

from nemocascade import mesh as mesh_lib
from nemocascade.models.transformer import (KVCache, ModelConfig, count_params, forward, forward_cached,
                                            forward_hidden, head_logprobs, init_cache, init_params, lm_head,
                                            param_axes, param_shapes)


def param_shardings(cfg: ModelConfig, mesh):
    """NamedShardings of every parameter on `mesh` (the same for policy, reference and teachers)."""
    return mesh_lib.tree_shardings(mesh, param_axes(cfg), param_shapes(cfg), mesh_lib.param_rules(cfg.moe))


def init_sharded(cfg: ModelConfig, mesh, rng):
    """Initialise params directly into their shardings (no full host copy per device)."""
    return jax.jit(init_params, static_argnums=0, out_shardings=param_shardings(cfg, mesh))(cfg, rng)


__all__ = ["KVCache", "ModelConfig", "count_params", "forward", "forward_cached", "forward_hidden", "head_logprobs",
           "init_cache", "init_params", "init_sharded", "lm_head", "param_axes", "param_shapes", "param_shardings"]
