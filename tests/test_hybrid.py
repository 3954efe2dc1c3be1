"""Hybrid layers (Nemotron-H): the chunked selective scan against a numpy recurrence, every parameter of every layer
kind receiving a gradient, and the configurations that are refused. Parity of logits, greedy decoding and
import/export against transformers' NemotronHForCausalLM are in test_hf.py (family nemotron_h)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nemocascade.models import hybrid
from nemocascade.models import transformer as tf


def _cfg(**kw):
    base = dict(vocab_size=40, d_model=16, n_layers=5, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=24,
                layer_pattern="ME*-M", rope=False, mlp_act="relu2", n_experts=4, n_experts_per_tok=2, d_ff_expert=8,
                d_ff_shared=8, router="sigmoid", n_expert_groups=2, topk_groups=1, mamba_heads=4, mamba_head_dim=4,
                ssm_state=6, mamba_groups=2, conv_kernel=3, mamba_chunk=4)
    return tf.ModelConfig(**base | kw)


def test_chunked_scan_equals_the_recurrence():
    """state_t = exp(dt_t A) state_{t-1} + dt_t B_t x_t, y_t = C_t . state_t, token by token in float64, from a
    non-zero initial state, over 11 tokens in chunks of 4 (the last one padded)."""
    rng = np.random.default_rng(0)
    b, T, h, p, n = 2, 11, 3, 4, 5
    x = rng.normal(size=(b, T, h, p))
    dt = np.log1p(np.exp(rng.normal(size=(b, T, h))))  # softplus: positive steps
    A = -np.exp(rng.normal(size=h))
    B, C = rng.normal(size=(b, T, h, n)), rng.normal(size=(b, T, h, n))
    state = rng.normal(size=(b, h, p, n))
    ys, s = [], state.copy()
    for t in range(T):
        s = s * np.exp(dt[:, t] * A)[..., None, None] + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None, :]
        ys.append(np.einsum("bhpn,bhn->bhp", s, C[:, t]))
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    y, final = hybrid.ssd(f32(x), f32(dt), f32(A), f32(B), f32(C), chunk=4, state=f32(state))
    np.testing.assert_allclose(np.asarray(y), np.stack(ys, 1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(final), s, rtol=1e-4, atol=1e-4)
    y_step, s_step = hybrid.ssd_step(f32(x[:, 0]), f32(dt[:, 0]), f32(A), f32(B[:, 0]), f32(C[:, 0]), f32(state))
    np.testing.assert_allclose(np.asarray(y_step), ys[0], rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # ~75 s; the hybrid's forward and decode parity with transformers stay in the default suite
def test_every_parameter_gets_a_gradient():
    cfg = _cfg()
    params = tf.init_params(cfg, jax.random.key(0))
    assert set(params) == {"embed", "final_norm", "lm_head", "mamba", "moe", "attn", "mlp"}
    assert params["mamba"]["in_proj"].shape[0] == 2 and params["attn"]["wq"].shape[0] == 1
    tokens = jnp.asarray(np.random.default_rng(1).integers(1, 40, (2, 9)), jnp.int32)

    def loss(p):
        logits = tf.forward(p, cfg, tokens[:, :-1])
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))

    grads = jax.grad(loss)(params)
    for path, g in jax.tree.leaves_with_path(grads):
        name = jax.tree_util.keystr(path)
        assert np.all(np.isfinite(np.asarray(g))), name
        if "router_bias" not in name:  # the selection bias only chooses experts: it gets no gradient
            assert float(jnp.abs(g).max()) > 0, name


def test_refused_configurations():
    with pytest.raises(ValueError, match="unknown layer kind"):
        _cfg(layer_pattern="MX*-M")
    with pytest.raises(ValueError, match="has 4 layers, model.n_layers=5"):
        _cfg(layer_pattern="ME*-")
    with pytest.raises(ValueError, match="must divide model.mamba_heads"):
        _cfg(mamba_groups=3)
    cfg = _cfg()
    params = tf.init_params(cfg, jax.random.key(0))
    tokens = jnp.ones((1, 6), jnp.int32)
    with pytest.raises(ValueError, match="packed rows"):
        tf.forward(params, cfg, tokens, segment_ids=jnp.ones((1, 6), jnp.int32))
