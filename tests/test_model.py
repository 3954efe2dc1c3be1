"""Model: KV-cache decoding equals the full forward pass; blocks match independent numpy references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nemocascade.models import transformer as tf

CFGS = {
    "llama": tf.ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=12, d_ff=48),
    "qwen3": tf.ModelConfig(vocab_size=61, d_model=32, n_layers=2, n_heads=4, n_kv_heads=1, head_dim=8, d_ff=40,
                            qk_norm=True, tie_embeddings=True, rope_theta=1e6),
    "qwen2": tf.ModelConfig(vocab_size=61, d_model=32, n_layers=3, n_heads=2, n_kv_heads=2, head_dim=16, d_ff=40,
                            qkv_bias=True),
}


def _params(cfg, seed=0):
    params = tf.init_params(cfg, jax.random.key(seed))
    # non-trivial norms and biases so every path is exercised
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    leaves = [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    return jax.tree.unflatten(treedef, leaves)


@pytest.mark.parametrize("chunk", [0, 4, "blockwise prefill"])
@pytest.mark.parametrize("name", sorted(CFGS))
def test_kv_cache_decode_matches_full_forward(name, chunk):
    """Dense (chunk 0) and chunked cache attention (4 slots a read over an 11-slot cache: the last read overlaps the
    one before) both give the full pass's logits; so does a prefill that attends blockwise (blocks of 2)."""
    cfg = CFGS[name]
    seen = 0
    if chunk == "blockwise prefill":
        cfg, chunk, seen = tf.ModelConfig(**{**cfg.__dict__, "attention": "blockwise", "attention_block": 2}), 0, 5
    params = _params(cfg)
    B, prompt_len, N = 3, 5, 6
    rng = np.random.default_rng(0)
    lens = np.array([5, 3, 1])
    tokens = rng.integers(1, cfg.vocab_size, (B, prompt_len + N)).astype(np.int32)
    # left-pad each prompt: row b has prompt_len - lens[b] pads then its tokens
    valid = np.arange(prompt_len)[None] >= (prompt_len - lens)[:, None]
    tokens[:, :prompt_len][~valid] = 0
    full_valid = np.concatenate([valid, np.ones((B, N), bool)], 1)
    pos = tf.left_pad_positions(jnp.asarray(full_valid))
    full = tf.forward(params, cfg, jnp.asarray(tokens), pos, jnp.asarray(full_valid))

    cache = tf.init_cache(cfg, B, prompt_len + N)
    logits, cache = tf.forward_cached(params, cfg, jnp.asarray(tokens[:, :prompt_len]), pos[:, :prompt_len],
                                      jnp.asarray(valid), cache, 0, chunk=chunk, seen=seen)
    step_logits = [logits[:, -1]]
    for i in range(N - 1):
        t = prompt_len + i
        lg, cache = tf.forward_cached(params, cfg, jnp.asarray(tokens[:, t:t + 1]), pos[:, t:t + 1],
                                      jnp.ones((B, 1), bool), cache, t, chunk=chunk)
        step_logits.append(lg[:, -1])
    decoded = np.stack(step_logits, 1)
    ref = np.asarray(full[:, prompt_len - 1:prompt_len + N - 1])
    assert np.max(np.abs(decoded - ref)) <= 1e-5
    # prefill logits on valid prompt tokens equal the full pass too
    np.testing.assert_allclose(np.asarray(logits)[valid], np.asarray(full[:, :prompt_len])[valid], atol=1e-5)


def test_chunked_cache_attention_matches_numpy_softmax_and_gives_idle_rows_zero():
    """`cached_attention` against a numpy softmax over each query's visible slots (valid and at or before its own),
    read in chunks of 3 from a 10-slot cache up to slot start + T only; a row with no valid slot gets 0, not NaN."""
    from nemocascade.models import blocks
    rng = np.random.default_rng(0)
    L, B, S, K, G, Dh, T, start = 2, 3, 10, 2, 2, 4, 2, 5
    ck, cv = (rng.normal(size=(L, B, S, K, Dh)).astype(np.float32) for _ in range(2))
    q = rng.normal(size=(B, T, K * G, Dh)).astype(np.float32)
    valid = rng.random((B, S)) < 0.7
    valid[:, start:start + T] = True
    valid[2] = False  # an idle row
    ck[1, :, start + T:] = 1e3  # slots past the queries must never be read into the result
    out = np.asarray(blocks.cached_attention(jnp.asarray(q), jnp.asarray(ck), jnp.asarray(cv), 1, jnp.asarray(valid),
                                             start, 3))
    for b in range(2):
        for t in range(T):
            for h in range(K * G):
                see = valid[b] & (np.arange(S) <= start + t)
                s = ck[1, b, see, h // G] @ q[b, t, h] / np.sqrt(Dh)
                w = np.exp(s - s.max())
                np.testing.assert_allclose(out[b, t, h], (w / w.sum()) @ cv[1, b, see, h // G], atol=1e-5)
    assert np.all(out[2] == 0)


def test_left_padding_does_not_change_logits():
    cfg = CFGS["llama"]
    params = _params(cfg)
    seq = np.array([[5, 9, 2, 7]], np.int32)
    plain = tf.forward(params, cfg, jnp.asarray(seq))
    padded = np.array([[0, 0, 5, 9, 2, 7]], np.int32)
    valid = padded != 0
    out = tf.forward(params, cfg, jnp.asarray(padded), tf.left_pad_positions(jnp.asarray(valid)), jnp.asarray(valid))
    np.testing.assert_allclose(np.asarray(out[:, 2:]), np.asarray(plain), atol=1e-5)


def _np_forward(params, cfg, tokens):
    """Independent numpy transformer (loops over layers/heads) for one unpadded batch."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    eps = cfg.norm_eps

    def norm(x, w):
        return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w

    def rope(x, pos):  # x [T, Dh]
        half = x.shape[-1] // 2
        inv = 1.0 / cfg.rope_theta ** (np.arange(half) * 2.0 / x.shape[-1])
        ang = pos[:, None] * inv[None]
        c, s = np.cos(ang), np.sin(ang)
        return np.concatenate([x[:, :half] * c - x[:, half:] * s, x[:, half:] * c + x[:, :half] * s], -1)

    B, T = tokens.shape
    out = []
    for b in range(B):
        x = p["embed"][tokens[b]]
        pos = np.arange(T, dtype=np.float64)
        for l in range(cfg.n_layers):
            L = {k: v[l] for k, v in p["layers"].items()}
            h = norm(x, L["attn_norm"])
            attn = np.zeros_like(x)
            for head in range(cfg.n_heads):
                kvh = head // (cfg.n_heads // cfg.n_kv_heads)
                q = h @ L["wq"][:, head] + (L["bq"][head] if cfg.qkv_bias else 0)
                k = h @ L["wk"][:, kvh] + (L["bk"][kvh] if cfg.qkv_bias else 0)
                v = h @ L["wv"][:, kvh] + (L["bv"][kvh] if cfg.qkv_bias else 0)
                if cfg.qk_norm:
                    q, k = norm(q, L["q_norm"]), norm(k, L["k_norm"])
                q, k = rope(q, pos), rope(k, pos)
                s = q @ k.T / np.sqrt(cfg.head_dim)
                s = np.where(np.tril(np.ones((T, T))) > 0, s, -np.inf)
                a = np.exp(s - s.max(-1, keepdims=True))
                a /= a.sum(-1, keepdims=True)
                attn += (a @ v) @ L["wo"][head]
            x = x + attn
            h = norm(x, L["mlp_norm"])
            g = h @ L["w_gate"]
            x = x + ((g / (1 + np.exp(-g))) * (h @ L["w_up"])) @ L["w_down"]
        x = norm(x, p["final_norm"])
        head_w = p["embed"].T if cfg.tie_embeddings else p["lm_head"]
        out.append(x @ head_w)
    return np.stack(out)


@pytest.mark.parametrize("name", sorted(CFGS))
def test_forward_matches_numpy_reference(name):
    cfg = CFGS[name]
    params = _params(cfg, seed=3)
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 7)).astype(np.int32)
    ours = np.asarray(tf.forward(params, cfg, jnp.asarray(tokens)))
    np.testing.assert_allclose(ours, _np_forward(params, cfg, tokens), atol=1e-4, rtol=1e-4)


def test_bf16_compute_close_to_f32():
    cfg = CFGS["llama"]
    params = _params(cfg)
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, cfg.vocab_size, (2, 9)), jnp.int32)
    f32 = tf.forward(params, cfg, tokens)
    bf16 = tf.forward(params, tf.ModelConfig(**{**cfg.__dict__, "dtype": "bfloat16"}), tokens)
    assert bf16.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(bf16 - f32))) < 0.1


def test_bad_config_names_key():
    with pytest.raises(ValueError, match="n_kv_heads"):
        tf.ModelConfig(vocab_size=10, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="bogus"):
        tf.ModelConfig.from_dict({"vocab_size": 10, "bogus": 1})


def test_head_logprobs_in_chunks_equal_the_whole_logits_and_their_gradient():
    cfg = tf.ModelConfig(vocab_size=37, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=24,
                         tie_embeddings=True)
    params = tf.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 37, (3, 11)), jnp.int32)
    targets = jnp.asarray(rng.integers(0, 37, (3, 11)), jnp.int32)

    def whole(p):
        logp_all = jax.nn.log_softmax(tf.forward(p, cfg, tokens), -1)
        logp = jnp.take_along_axis(logp_all, targets[..., None], -1)[..., 0]
        return logp, -jnp.sum(jnp.exp(logp_all) * logp_all, -1)

    def chunked(p):
        return tf.head_logprobs(p, cfg, tf.forward_hidden(p, cfg, tokens), targets, chunk=4)  # 3 chunks, 1 padded

    (lp_w, ent_w), (lp_c, ent_c) = whole(params), chunked(params)
    np.testing.assert_allclose(np.asarray(lp_c), np.asarray(lp_w), atol=1e-6)
    np.testing.assert_allclose(np.asarray(ent_c), np.asarray(ent_w), atol=1e-6)
    weights = jnp.asarray(rng.normal(size=(3, 11)), jnp.float32)
    g_w = jax.grad(lambda p: jnp.sum(weights * whole(p)[0]))(params)
    g_c = jax.grad(lambda p: jnp.sum(weights * chunked(p)[0]))(params)
    for a, b in zip(jax.tree.leaves(g_w), jax.tree.leaves(g_c)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-4)
    assert float(jnp.abs(g_c["embed"]).max()) > 0


def test_auto_compute_dtype_is_float32_on_cpu_and_bfloat16_on_accelerators(monkeypatch):
    from nemocascade.models import transformer as tfm
    assert [tfm.auto_dtype(b) for b in ("cpu", "tpu", "gpu")] == ["float32", "bfloat16", "bfloat16"]
    kw = dict(vocab_size=17, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32)
    assert tfm.ModelConfig(**kw, dtype="auto").dtype == "float32"  # this machine's backend is the CPU
    monkeypatch.setattr(tfm.jax, "default_backend", lambda: "tpu")
    cfg = tfm.ModelConfig(**kw, dtype="auto")
    assert cfg.dtype == "bfloat16" and cfg == tfm.ModelConfig(**kw, dtype="bfloat16")  # one jit cache entry
    with pytest.raises(ValueError, match="model.dtype"):
        tfm.ModelConfig(**kw, dtype="float16")


def test_blockwise_attention_matches_numpy_softmax_and_dense_gradients():
    """`blockwise_attention` (blocks of 4 over 11 tokens: the last block padded) against a numpy softmax over each
    query's visible keys (causal, same segment > 0), for left padding, packed segments and GQA (2 query heads per
    key head); its gradients equal dense attention's under the same mask, and a query that sees nothing gets 0."""
    from nemocascade.models import blocks
    rng = np.random.default_rng(0)
    B, T, K, G, Dh = 3, 11, 2, 2, 8
    q = rng.normal(size=(B, T, K * G, Dh)).astype(np.float32)
    k, v = (rng.normal(size=(B, T, K, Dh)).astype(np.float32) for _ in range(2))
    seg = np.ones((B, T), np.int32)
    seg[0, :3] = 0  # left padding
    seg[1] = [1, 1, 1, 2, 2, 2, 2, 3, 3, 0, 0]  # three packed sequences, then padding
    out = np.asarray(blocks.blockwise_attention(*map(jnp.asarray, (q, k, v, seg)), 4))
    for b in range(B):
        for t in range(T):
            see = (np.arange(T) <= t) & (seg[b] == seg[b, t]) & (seg[b] > 0)
            for h in range(K * G):
                if not see.any():
                    assert np.all(out[b, t, h] == 0)
                    continue
                s = k[b, see, h // G] @ q[b, t, h] / np.sqrt(Dh)
                w = np.exp(s - s.max())
                np.testing.assert_allclose(out[b, t, h], (w / w.sum()) @ v[b, see, h // G], atol=1e-5)
    mask = np.tril(np.ones((T, T), bool))[None] & (seg[:, :, None] == seg[:, None, :]) & (seg > 0)[:, None, :]
    weight = rng.normal(size=out.shape).astype(np.float32) * (seg > 0)[:, :, None, None]  # a loss on real tokens
    loss = lambda attn, m: lambda *qkv: jnp.sum(attn(*qkv, jnp.asarray(m)) * weight)  # noqa: E731
    ours = jax.grad(loss(lambda *a: blocks.blockwise_attention(*a, 4), seg), (0, 1, 2))(q, k, v)
    dense = jax.grad(loss(blocks.attention, mask), (0, 1, 2))(q, k, v)
    for a, b in zip(ours, dense):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_blockwise_backward_memory_grows_linearly_not_quadratically():
    """XLA's own accounting of the gradient program's temporaries (CPU compile), 8 heads of 64: from T = 4,096 to
    8,192 they grow by under 1.5x (a few blocks' scores plus O(T) vectors), and stay under a tenth of the one
    [8, T, T] float32 score tensor dense attention holds (which alone grows 4x)."""
    from nemocascade.models import blocks

    def temp(T):
        sd = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
        f = lambda q, k, v, s: jnp.sum(blocks.blockwise_attention(q, k, v, s, 512) ** 2)  # noqa: E731
        grad = jax.jit(jax.grad(f, (0, 1, 2))).lower(sd(1, T, 8, 64), sd(1, T, 2, 64), sd(1, T, 2, 64),
                                                     jax.ShapeDtypeStruct((1, T), jnp.int32))
        return grad.compile().memory_analysis().temp_size_in_bytes

    small, large = temp(4096), temp(8192)
    assert large < 1.5 * small, (small, large)
    assert large < 8 * 8192 ** 2 * 4 / 10, large


@pytest.mark.parametrize("name", sorted(CFGS))
def test_blockwise_model_equals_dense_with_left_padding_and_packing(name):
    """The whole model with attention="blockwise" (blocks of 3) against "dense": logits on real tokens and the
    gradient of a loss over them, for a left-padded row and a packed one."""
    dense = CFGS[name]
    blockwise = tf.ModelConfig(**{**dense.__dict__, "attention": "blockwise", "attention_block": 3})
    params = _params(dense, seed=5)
    tokens = jnp.asarray(np.random.default_rng(2).integers(1, dense.vocab_size, (2, 8)).astype(np.int32))
    seg = jnp.asarray([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 2, 2, 2, 2, 0]], jnp.int32)
    positions = jnp.asarray([[0, 0, 0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 1, 2, 3, 0]], jnp.int32)
    real = seg > 0

    def loss(p, cfg):
        logits = tf.forward(p, cfg, tokens, positions, real, seg)
        return jnp.sum(jnp.where(real[..., None], jax.nn.log_softmax(logits), 0.0)[..., 0]), logits

    (_, ld), gd = jax.value_and_grad(loss, has_aux=True)(params, dense)
    (_, lb), gb = jax.value_and_grad(loss, has_aux=True)(params, blockwise)
    np.testing.assert_allclose(np.asarray(lb)[np.asarray(real)], np.asarray(ld)[np.asarray(real)], atol=1e-5)
    for a, b in zip(jax.tree.leaves(gb), jax.tree.leaves(gd)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_splash_attention_in_interpret_mode_equals_blockwise_values_and_gradients():
    """Pallas's splash kernel (interpret mode off TPU), T = 200 padded to two tiles of 128: left padding, two
    packed sequences then padding, GQA; values on real tokens and gradients of a loss on them equal blockwise's."""
    from nemocascade.models import blocks
    rng = np.random.default_rng(0)
    B, T, K, G, Dh = 2, 200, 2, 2, 64
    q = rng.normal(size=(B, T, K * G, Dh)).astype(np.float32)
    k, v = (rng.normal(size=(B, T, K, Dh)).astype(np.float32) for _ in range(2))
    seg = np.ones((B, T), np.int32)
    seg[0, :37] = 0
    seg[1, 90:170], seg[1, 170:] = 2, 0
    real = seg > 0
    weight = rng.normal(size=q.shape).astype(np.float32) * real[:, :, None, None]
    outs, grads = [], []
    for attn in (blocks.splash_attention, blocks.blockwise_attention):
        f = lambda q, k, v: jnp.sum(attn(q, k, v, jnp.asarray(seg), 128) * weight)  # noqa: E731, B023
        outs.append(np.asarray(attn(*map(jnp.asarray, (q, k, v, seg)), 128))[real])
        grads.append(jax.grad(f, (0, 1, 2))(q, k, v))
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)
    for a, b in zip(*grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def test_auto_attention_is_dense_up_to_its_block_then_blockwise_on_cpu():
    cfg = tf.ModelConfig(vocab_size=61)
    assert tf.self_mask(cfg, jnp.ones((1, 512), jnp.int32)) is None
    assert tf.self_mask(cfg, jnp.ones((1, 513), jnp.int32)).impl == "blockwise"
    with pytest.raises(ValueError, match="multiple of 128"):
        tf.ModelConfig(vocab_size=61, attention_block=100)
