"""Mixture of experts: the routed layer against a numpy loop over tokens (top-k, renormalised or not, shared
expert), dropless when every token picks the same experts, the load-balancing loss against transformers'
Qwen3-MoE (padding excluded), and a training step that carries the loss. Logits parity, greedy decoding and
import/export against transformers are in test_hf.py (family qwen3_moe); sharding in test_sharding.py."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nemocascade.models import transformer as tf


def _cfg(**kw):
    base = dict(vocab_size=50, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32, n_experts=4,
                n_experts_per_tok=2, d_ff_expert=8, d_ff_shared=0, norm_topk_prob=False, router_aux_coef=0.01)
    return tf.ModelConfig(**base | kw)


def _silu(x):
    return x / (1 + np.exp(-x))


def _reference(cfg, x, p):
    """The layer token by token: softmax over the router logits, the k largest, each chosen expert's SwiGLU
    weighted by its probability (renormalised with norm_topk_prob), plus the shared expert."""
    x = np.asarray(x, np.float64)
    out = np.zeros_like(x)
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            h = x[b, t]
            logits = h @ p["router"]
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
            top = np.argsort(-probs, kind="stable")[:cfg.n_experts_per_tok]
            weights = probs[top] / (probs[top].sum() if cfg.norm_topk_prob else 1.0)
            for e, w in zip(top, weights):
                out[b, t] += w * ((_silu(h @ p["we_gate"][e]) * (h @ p["we_up"][e])) @ p["we_down"][e])
            if cfg.d_ff_shared:
                out[b, t] += (_silu(h @ p["ws_gate"]) * (h @ p["ws_up"])) @ p["ws_down"]
    return out


@pytest.mark.parametrize("kw", [dict(), dict(norm_topk_prob=True), dict(d_ff_shared=12, n_experts_per_tok=3)])
def test_routed_layer_matches_a_token_loop(kw):
    cfg = _cfg(**kw)
    params = tf.init_params(cfg, jax.random.key(0))
    layer = jax.tree.map(lambda a: a[0] * 10.0 if a.ndim > 2 else a[0], params["layers"])  # spread the router
    x = jax.random.normal(jax.random.key(1), (3, 5, cfg.d_model))
    out, stats = tf.moe(cfg, x, layer, jnp.float32, jnp.ones((3, 5), bool))
    ref = _reference(cfg, x, layer)
    assert np.abs(ref).max() > 1e-2
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-6)
    assert float(stats.rows) == 15 and float(stats.counts.sum()) == 15 * cfg.n_experts_per_tok
    np.testing.assert_allclose(float(stats.probs.sum()), 15.0, rtol=1e-5)


def test_dropless_when_every_token_picks_the_same_experts():
    """A router that sends all 24 tokens to experts 1 and 3: no capacity, nothing dropped."""
    cfg = _cfg(norm_topk_prob=True)
    params = tf.init_params(cfg, jax.random.key(0))
    layer = jax.tree.map(lambda a: a[0], params["layers"])
    x = jnp.abs(jax.random.normal(jax.random.key(2), (4, 6, cfg.d_model))) + 0.1  # positive inputs
    router = np.zeros((cfg.d_model, cfg.n_experts), np.float32)
    router[:, 1], router[:, 3] = 1.0, 0.5  # experts 1 and 3 always win, probabilities fixed per token
    layer = layer | {"router": jnp.asarray(router)}
    out, stats = tf.moe(cfg, x, layer, jnp.float32, jnp.ones((4, 6), bool))
    np.testing.assert_array_equal(np.asarray(stats.counts), [0, 24, 0, 24])
    np.testing.assert_allclose(np.asarray(out), _reference(cfg, x, layer), rtol=1e-4, atol=1e-6)


def test_load_balancing_loss_matches_transformers_and_skips_padding(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    from nemocascade.models import hf

    torch.manual_seed(0)
    hf_cfg = transformers.Qwen3MoeConfig(vocab_size=50, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                         head_dim=8, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
    model = transformers.Qwen3MoeForCausalLM(hf_cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    model.save_pretrained(str(tmp_path))
    cfg, params = hf.load(str(tmp_path))
    tokens = np.random.default_rng(0).integers(1, 50, (2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[1, 4:] = 0  # right padding: the real tokens' hidden states do not depend on it
    with torch.no_grad():
        out = model(torch.as_tensor(tokens), attention_mask=torch.as_tensor(mask), output_router_logits=True)
    ref = float(load_balancing_loss_func(out.router_logits, 4, 2, torch.as_tensor(mask)))
    _, ours = tf.forward(params, cfg, jnp.asarray(tokens, jnp.int32), valid=jnp.asarray(mask, bool), with_aux=True)
    assert abs(float(ours) - ref) <= 1e-5, (float(ours), ref)
    _, all_tokens = tf.forward(params, cfg, jnp.asarray(tokens, jnp.int32), with_aux=True)
    assert abs(float(all_tokens) - float(ours)) > 1e-4  # the padding would have counted


def test_training_step_carries_the_load_balancing_loss():
    """SFT's step on a mixture of experts: the loss is cross entropy + coef x the load-balancing loss (here the
    cross entropy's mask is empty, so the loss is the load-balancing term alone); the RL step's token outputs
    carry the same loss over the batch's real tokens."""
    import optax

    from nemocascade import train_state
    from nemocascade.stages import sft

    cfg = _cfg(router_aux_coef=0.5)
    params = tf.init_params(cfg, jax.random.key(0))
    tx = optax.sgd(0.0)
    state = train_state.create(params, tx, jax.random.key(0))
    tokens = jnp.asarray(np.random.default_rng(1).integers(1, 50, (2, 9)), jnp.int32)
    batch = {"tokens": tokens, "loss_mask": jnp.zeros((2, 9), jnp.float32)}
    _, metrics = train_state.make_step(functools.partial(sft.sft_loss, model_cfg=cfg), tx)(state, batch)
    _, aux = tf.forward(params, cfg, tokens[:, :-1], with_aux=True)
    np.testing.assert_allclose(float(metrics["loss"]), 0.5 * float(aux), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["router_aux"]), float(aux), rtol=1e-6)

    from nemocascade.rl import update

    valid = jnp.ones((2, 9), bool).at[1, 6:].set(False)
    rl = update.token_outputs(params, cfg, {"tokens": tokens, "valid": valid,
                                            "positions": jnp.broadcast_to(jnp.arange(9), (2, 9))})
    _, aux_valid = tf.forward(params, cfg, tokens[:, :-1], valid=valid[:, :-1], with_aux=True)
    np.testing.assert_allclose(float(rl["router_aux"]), float(aux_valid), rtol=1e-6)
