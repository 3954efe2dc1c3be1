"""The TPU compiler, without a TPU: cascade_math:tiny's on-policy step and one decode step compile for a real v5e
2x2 topology (libtpu's compiler, deviceless; `pip install -e ".[tpu]"`), and fit a 16 GiB v5e chip."""
import functools
import importlib.util

import jax
import jax.numpy as jnp
import ml_collections
import pytest

from nemocascade import configs, mesh as mesh_lib, objectives, optim, train_state
from nemocascade.models import ModelConfig, forward, forward_cached, init_cache, init_params, param_shardings
from nemocascade.rl import rollouts, update

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                reason='libtpu absent: pip install -e ".[tpu]" (.ci/run does)')
V5E_HBM = 16 * 2**30


@pytest.fixture(scope="module")
def setup():
    from jax.experimental import topologies
    # the suite's persistent cache (conftest) cannot load a deviceless TPU executable back: it would only warn
    cache = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    yield _setup(topologies)
    jax.config.update("jax_enable_compilation_cache", cache)


def _setup(topologies):
    devices = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices
    cfg = configs.load("cascade_math:tiny")
    model = ModelConfig.from_dict({**cfg.model.to_dict(), "vocab_size": cfg.tokenizer.vocab_size, "dtype": "bfloat16"})
    mesh = mesh_lib.make_mesh(None, devices)
    shard = param_shardings(model, mesh)
    abstract = lambda t, s: jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), t, s)  # noqa: E731
    params = abstract(jax.eval_shape(functools.partial(init_params, model), jax.random.key(0)), shard)
    rows = lambda n, shape, dt: jax.ShapeDtypeStruct((n, *shape), dt, sharding=mesh_lib.batch_sharding(  # noqa: E731
        mesh, 1 + len(shape), n))
    return devices, cfg, model, mesh, shard, params, rows


def _fits(compiled):
    m = compiled.memory_analysis()
    assert m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes < V5E_HBM
    assert compiled.cost_analysis()["flops"] > 0


def test_on_policy_step_compiles_for_v5e(setup):
    devices, cfg, model, mesh, shard, params, rows = setup
    assert devices[0].platform == "tpu" and len(devices) == 4
    r = cfg.stages.grpo.rollout
    P, G, W = r.prompts_per_step, r.group_size, cfg.eval.max_prompt_len + r.max_new_tokens
    tx, _ = optim.make_optimizer(ml_collections.ConfigDict(dict(optim.DEFAULTS)), 100)
    state_shape = jax.eval_shape(lambda p: train_state.create(p, tx, jax.random.key(0)), params)
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state_shape,
                         train_state.shardings(state_shape, shard, mesh))
    step = jax.jit(update.policy_step(tx, model_cfg=model, objective=objectives.build(dict(terms={"pg": 1.0}))),
                   donate_argnums=0)
    batch = rollouts.batch_shapes(mesh, P, G, W)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # as a run traces it (activations pinned on the mesh)
        _fits(step.trace(state, batch).lower().compile())


def test_decode_step_compiles_for_v5e(setup):
    devices, cfg, model, mesh, shard, params, rows = setup
    B, S = cfg.stages.grpo.rollout.prompts_per_step * cfg.stages.grpo.rollout.group_size, 256
    cache = jax.eval_shape(lambda: init_cache(model, B, S))
    cache = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=mesh_lib.replicated(mesh)), cache)
    step = jax.jit(functools.partial(forward_cached, cfg=model))
    one = rows(B, (1,), jnp.int32)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        _fits(step.trace(params, tokens=one, positions=one, valid=rows(B, (1,), jnp.bool_), cache=cache,
                         start=jax.ShapeDtypeStruct((), jnp.int32)).lower().compile())


def test_auto_attention_is_splash_on_a_tpu_mesh_and_compiles(setup):
    """A 1,024-token pass under the v5e mesh: model.attention="auto" picks the Pallas splash kernel (a Mosaic
    custom call in the compiled program), forward and backward."""
    devices, cfg, model, mesh, shard, params, rows = setup
    tokens = rows(8, (1024,), jnp.int32)
    loss = lambda p, t: jnp.mean(forward(p, model, t))  # noqa: E731
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        compiled = jax.jit(jax.grad(loss)).trace(params, tokens).lower().compile()
    assert "tpu_custom_call" in compiled.as_text()
    _fits(compiled)
