"""Hybrid layers (Nemotron-H, the family of Cascade 2's Nemotron-3-Nano-30B-A3B): one mixer per layer, chosen by
`ModelConfig.layer_pattern`, one character per layer:

    "M"  Mamba-2 (state space duality): in_proj -> causal depthwise conv -> selective scan -> gated RMSNorm -> out
    "*"  grouped-query attention (without rotary embeddings when `rope` is False, as Nemotron-H's)
    "-"  MLP (relu2 or SwiGLU, `mlp_act`)
    "E"  mixture of experts (`transformer.moe`: sigmoid or softmax router, shared expert)

each a pre-norm residual block, then a final norm and the LM head. The params hold one stack per kind (leading axis:
that kind's layers in order), `{"mamba": ..., "attn": ..., "mlp": ..., "moe": ...}`; the decoder walks the pattern
in Python (a 52-layer pattern compiles 52 layer bodies; `remat` checkpoints each one).

The selective scan runs chunked for training and prefill (`ssd`: within a chunk a masked quadratic form, between
chunks a recurrence over the chunk states) and as a one-token recurrence when decoding (`ssd_step`); the sampler's
cache carries each Mamba-2 layer's conv inputs and SSM state beside the attention layers' keys and values.
Padding follows the attention layers' left padding: padded positions are zeroed before the projection and after
the convolution, so the state stays zero through them. Packed rows (several sequences in one) are refused: a
recurrent state would carry across the boundary.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from nemocascade.mesh import constrain
from nemocascade.models import blocks as tf

KINDS = {"M": "mamba", "*": "attn", "-": "mlp", "E": "moe"}


def check(cfg) -> None:
    bad = sorted(set(cfg.layer_pattern) - set(KINDS))
    if bad:
        raise ValueError(f"model.layer_pattern={cfg.layer_pattern!r}: unknown layer kind(s) {bad}; one character "
                         f"per layer, {KINDS}")
    if len(cfg.layer_pattern) != cfg.n_layers:
        raise ValueError(f"model.layer_pattern has {len(cfg.layer_pattern)} layers, model.n_layers={cfg.n_layers}")
    if "E" in cfg.layer_pattern and not cfg.moe:
        raise ValueError("model.layer_pattern has mixture-of-experts layers ('E') but model.n_experts=0")
    if "M" in cfg.layer_pattern:
        for key in ("mamba_heads", "mamba_head_dim", "ssm_state", "conv_kernel", "mamba_chunk"):
            if getattr(cfg, key) <= 0:
                raise ValueError(f"model.{key} must be positive with Mamba-2 layers ('M') in model.layer_pattern")
        if cfg.mamba_heads % cfg.mamba_groups:
            raise ValueError(f"model.mamba_groups={cfg.mamba_groups} must divide model.mamba_heads={cfg.mamba_heads}")


def stacks(cfg) -> dict[str, list[int]]:
    """kind -> the global indices of its layers, in order."""
    out: dict[str, list[int]] = {}
    for i, c in enumerate(cfg.layer_pattern):
        out.setdefault(KINDS[c], []).append(i)
    return out


def mamba_dims(cfg) -> tuple[int, int, int]:
    """(inner width heads x head_dim, conv channels inner + 2 x groups x state, in_proj width)."""
    inner = cfg.mamba_heads * cfg.mamba_head_dim
    conv = inner + 2 * cfg.mamba_groups * cfg.ssm_state
    return inner, conv, inner + conv + cfg.mamba_heads


def param_shapes(cfg) -> dict:
    D, V = cfg.d_model, cfg.vocab_size
    out = {"embed": (V, D), "final_norm": (D,)}
    if not cfg.tie_embeddings:
        out["lm_head"] = (D, V)
    for kind, idx in stacks(cfg).items():
        n = len(idx)
        if kind == "mamba":
            inner, conv, proj = mamba_dims(cfg)
            H = cfg.mamba_heads
            p = {"in_proj": (n, D, proj), "conv_w": (n, conv, cfg.conv_kernel), "dt_bias": (n, H), "A_log": (n, H),
                 "D": (n, H), "gate_norm": (n, inner), "out_proj": (n, inner, D)}
            if cfg.conv_bias:
                p["conv_b"] = (n, conv)
        elif kind == "attn":
            H, K, Dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
            p = {"wq": (n, D, H, Dh), "wk": (n, D, K, Dh), "wv": (n, D, K, Dh), "wo": (n, H, Dh, D)}
        elif kind == "mlp":
            p = tf.mlp_shapes(cfg, "", n, cfg.d_ff)
        else:
            p = tf.moe_shapes(cfg, n)
        out[kind] = {"norm": (n, D), **p}
    return out


def param_axes(cfg) -> dict:
    out = {"embed": ("vocab", "embed"), "final_norm": ("norm",)}
    if not cfg.tie_embeddings:
        out["lm_head"] = ("embed", "vocab")
    for kind in stacks(cfg):
        if kind == "mamba":  # the projection's output mixes gate, conv input and dt: replicated, not split
            p = {"in_proj": ("layers", "embed", None), "conv_w": ("layers", None, None), "dt_bias": ("layers", None),
                 "A_log": ("layers", None), "D": ("layers", None), "gate_norm": ("layers", None),
                 "out_proj": ("layers", None, "embed")}
            if cfg.conv_bias:
                p["conv_b"] = ("layers", None)
        elif kind == "attn":
            p = {"wq": ("layers", "embed", "heads", "head_dim"), "wk": ("layers", "embed", "kv_heads", "head_dim"),
                 "wv": ("layers", "embed", "kv_heads", "head_dim"), "wo": ("layers", "heads", "head_dim", "embed")}
        elif kind == "mlp":
            p = tf.mlp_axes(cfg, "")
        else:
            p = tf.moe_axes(cfg)
        out[kind] = {"norm": ("layers", "norm"), **p}
    return out


def init_cache(cfg, batch: int, max_len: int) -> tf.KVCache:
    st = stacks(cfg)
    dtype = jnp.dtype(cfg.dtype)
    kv = (len(st.get("attn", ())), batch, max_len, cfg.n_kv_heads, cfg.head_dim)
    nm = len(st.get("mamba", ()))
    _, conv, _ = mamba_dims(cfg)
    return tf.KVCache(jnp.zeros(kv, dtype), jnp.zeros(kv, dtype), jnp.zeros((batch, max_len), bool),
                      jnp.zeros((nm, batch, max(cfg.conv_kernel - 1, 0), conv), dtype),
                      jnp.zeros((nm, batch, cfg.mamba_heads, cfg.mamba_head_dim, cfg.ssm_state), jnp.float32))


# ----------------------------------------------------------------------------------------------------
# Mamba-2


def _segsum(x):
    """out[..., i, j] = x[..., j+1] + ... + x[..., i] for i >= j, -inf above the diagonal. x [..., L]."""
    L = x.shape[-1]
    xx = jnp.where(jnp.tril(jnp.ones((L, L), bool), -1), jnp.broadcast_to(x[..., :, None], x.shape + (L,)), 0.0)
    out = jnp.cumsum(xx, axis=-2)  # masked sums, not differences of one cumsum: no cancellation in float32
    return jnp.where(jnp.tril(jnp.ones((L, L), bool)), out, -jnp.inf)


def ssd(x, dt, A, B, C, chunk: int, state=None):
    """The selective scan over a sequence, chunked (state space duality). x [b, T, h, p]; dt [b, T, h] (after
    softplus); A [h] (negative); B, C [b, T, h, n] (already per head); state [b, h, p, n] or None (zeros).
    Returns (y [b, T, h, p] without the D skip, final state [b, h, p, n]); float32 throughout."""
    b, T, h, p = x.shape
    pad = -T % chunk
    f32 = lambda a: a.astype(jnp.float32)  # noqa: E731
    x, dt, B, C = f32(x), f32(dt), f32(B), f32(C)
    padded = lambda a: jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))  # noqa: E731
    x, dt, B, C = padded(x * dt[..., None]), padded(dt), padded(B), padded(C)
    c = x.shape[1] // chunk
    x = x.reshape(b, c, chunk, h, p)
    B = B.reshape(b, c, chunk, h, -1)
    C = C.reshape(b, c, chunk, h, -1)
    a = (A[None, None, :] * dt).reshape(b, c, chunk, h).transpose(0, 3, 1, 2)  # [b, h, c, l]
    a_cum = jnp.cumsum(a, axis=-1)
    decay = jnp.exp(_segsum(a))  # [b, h, c, l, s]
    # in two contractions (C.B, then the decayed sum over x): one einsum of four operands lets XLA build a
    # [b, c, l, s, h, p] intermediate, head_dim (p) times the [b, c, l, s, h] one
    scores = jnp.einsum("bclhn,bcshn->bclsh", C, B) * decay.transpose(0, 2, 3, 4, 1)
    y_diag = jnp.einsum("bclsh,bcshp->bclhp", scores, x)
    to_end = jnp.exp(a_cum[..., -1:] - a_cum)  # [b, h, c, l]
    states = jnp.einsum("bclhn,bhcl,bclhp->bchpn", B, to_end, x)
    first = jnp.zeros((b, 1, h, p, B.shape[-1]), jnp.float32) if state is None else f32(state)[:, None]
    states = jnp.concatenate([first, states], axis=1)  # [b, c + 1, h, p, n]
    chunk_decay = jnp.exp(_segsum(jnp.pad(a_cum[..., -1], ((0, 0), (0, 0), (1, 0)))))  # [b, h, c + 1, c + 1]
    states = jnp.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)
    states, final = states[:, :-1], states[:, -1]
    y_off = jnp.einsum("bclhn,bchpn,bhcl->bclhp", C, states, jnp.exp(a_cum))
    y = (y_diag + y_off).reshape(b, c * chunk, h, p)[:, :T]
    return y, final


def ssd_step(x, dt, A, B, C, state):
    """One token of the recurrence: state <- exp(dt A) state + dt B x, y = C . state. x [b, h, p]; dt [b, h];
    B, C [b, h, n]; state [b, h, p, n] float32. Returns (y [b, h, p], new state)."""
    x, dt, B, C = (a.astype(jnp.float32) for a in (x, dt, B, C))
    state = (state * jnp.exp(dt * A[None])[..., None, None]
             + (dt[..., None] * x)[..., None] * B[:, :, None, :])
    return jnp.einsum("bhpn,bhn->bhp", state, C), state


def mamba(cfg, h, p, tok_valid, conv_state=None, ssm_state=None, decode: bool = False):
    """A Mamba-2 mixer on the normed input h [B, T, D] -> (output [B, T, D], new conv state, new SSM state).
    Without states (training, a fresh prefill) they start at zero; `decode`: T = 1, one recurrence step."""
    dt_ = jnp.dtype(cfg.dtype)
    Bsz, T, _ = h.shape
    H, P, N, G, K = cfg.mamba_heads, cfg.mamba_head_dim, cfg.ssm_state, cfg.mamba_groups, cfg.conv_kernel
    inner, conv_dim, _ = mamba_dims(cfg)
    keep = tok_valid[..., None].astype(dt_)
    proj = jnp.einsum("btd,de->bte", h * keep, p["in_proj"].astype(dt_))
    z, xbc, dt = proj[..., :inner], proj[..., inner:inner + conv_dim], proj[..., inner + conv_dim:]
    prev = jnp.zeros((Bsz, K - 1, conv_dim), dt_) if conv_state is None else conv_state.astype(dt_)
    full = jnp.concatenate([prev, xbc], axis=1)  # [B, K - 1 + T, conv]
    w = p["conv_w"].astype(dt_)  # [conv, K]
    conv = sum(full[:, k:k + T] * w[:, k] for k in range(K))
    if cfg.conv_bias:
        conv = conv + p["conv_b"].astype(dt_)
    new_conv = full[:, T:]  # the last K - 1 inputs
    xbc = jax.nn.silu(conv) * keep
    x = xbc[..., :inner].reshape(Bsz, T, H, P)
    heads = lambda a: jnp.repeat(a.reshape(Bsz, T, G, N), H // G, axis=2)  # noqa: E731  group -> its heads
    Bm, Cm = heads(xbc[..., inner:inner + G * N]), heads(xbc[..., inner + G * N:])
    A = -jnp.exp(p["A_log"].astype(jnp.float32))
    dt = jax.nn.softplus(dt.astype(jnp.float32) + p["dt_bias"].astype(jnp.float32))
    dt = jnp.clip(dt, *cfg.dt_limit)
    if decode:
        y, new_ssm = ssd_step(x[:, 0], dt[:, 0], A, Bm[:, 0], Cm[:, 0], ssm_state)
        y = y[:, None]
    else:
        y, new_ssm = ssd(x, dt, A, Bm, Cm, cfg.mamba_chunk, ssm_state)
    y = y + p["D"].astype(jnp.float32)[:, None] * x.astype(jnp.float32)
    y = y.reshape(Bsz, T, inner) * jax.nn.silu(z.astype(jnp.float32))
    grouped = y.reshape(Bsz, T, G, inner // G)  # the gated norm is per group
    grouped = grouped * jax.lax.rsqrt(jnp.mean(grouped * grouped, axis=-1, keepdims=True) + cfg.norm_eps)
    y = (grouped.reshape(Bsz, T, inner) * p["gate_norm"].astype(jnp.float32)).astype(dt_)
    return jnp.einsum("bti,id->btd", y, p["out_proj"].astype(dt_)), new_conv, new_ssm


# ----------------------------------------------------------------------------------------------------
# The decoder


def decoder(params, cfg, tokens, positions, mask, cache=None, start=0, tok_valid=None):
    """`transformer._decoder` for a hybrid pattern: (normed hidden [B, T, D], the updated cache or None, router
    statistics or None). `cache`: a KVCache (prefill or decode) or None (training)."""
    dt = jnp.dtype(cfg.dtype)
    rows = ("batch", None, None)  # activations' layout (mesh.constrain)
    x = constrain(params["embed"].astype(dt)[tokens], rows)
    decode = cache is not None and tokens.shape[1] == 1  # one token: the recurrence, not the chunked scan
    counters = {kind: 0 for kind in KINDS.values()}
    stats = tf._no_stats(cfg) if cfg.moe else None
    k_all, v_all = (cache.k, cache.v) if cache is not None else (None, None)
    conv_all, ssm_all = (cache.conv, cache.ssm) if cache is not None else (None, None)

    def layer(kind, x, p, j, k_all, v_all, conv_j, ssm_j):
        h = tf.rms_norm(x, p["norm"], cfg.norm_eps)
        st = None
        if kind == "mamba":
            out, conv_j, ssm_j = mamba(cfg, h, p, tok_valid, conv_j, ssm_j, decode)
        elif kind == "attn":
            out, kv = tf.attend(cfg, h, p, positions, mask, None if k_all is None else (k_all, v_all, j), start)
            k_all, v_all = kv if kv is not None else (k_all, v_all)
        elif kind == "mlp":
            out = tf.mlp(cfg, h, p, "", dt)
        else:
            out, st = tf.moe(cfg, h, p, dt, tok_valid)
        return x + out, (k_all, v_all, conv_j, ssm_j, st)

    for c in cfg.layer_pattern:
        kind = KINDS[c]
        j = counters[kind]
        counters[kind] += 1
        p = jax.tree.map(lambda a: a[j], params[kind])  # noqa: B023
        conv_j = None if conv_all is None or kind != "mamba" else conv_all[j]
        ssm_j = None if ssm_all is None or kind != "mamba" else ssm_all[j]
        fn = jax.checkpoint(layer, static_argnums=(0, 3), prevent_cse=False) if cfg.remat else layer
        x, (k_all, v_all, conv_j, ssm_j, st) = fn(kind, x, p, j, k_all, v_all, conv_j, ssm_j)
        x = constrain(x, rows)
        if kind == "mamba" and conv_all is not None:
            conv_all = conv_all.at[j].set(conv_j.astype(conv_all.dtype))
            ssm_all = ssm_all.at[j].set(ssm_j)
        if st is not None:
            stats = jax.tree.map(jnp.add, stats, st)
    h = tf.rms_norm(x, params["final_norm"], cfg.norm_eps)
    new_cache = None if cache is None else cache._replace(k=k_all, v=v_all, conv=conv_all, ssm=ssm_all)
    return h, new_cache, stats


# ----------------------------------------------------------------------------------------------------
# Hugging Face (transformers' NemotronHForCausalLM, model_type "nemotron_h")

HF_KINDS = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}
_L = "backbone.layers.{i}."
# (kind of stack or None for the top level, our leaf) -> (HF tensor name, layout kind as in hf.py)
TENSORS = {
    (None, "embed"): ("backbone.embeddings.weight", "same"),
    (None, "final_norm"): ("backbone.norm_f.weight", "same"),
    (None, "lm_head"): ("lm_head.weight", "T"),
    ("*", "norm"): (_L + "norm.weight", "same"),
    ("mamba", "in_proj"): (_L + "mixer.in_proj.weight", "T"),
    ("mamba", "conv_w"): (_L + "mixer.conv1d.weight", "conv"),
    ("mamba", "conv_b"): (_L + "mixer.conv1d.bias", "same"),
    ("mamba", "dt_bias"): (_L + "mixer.dt_bias", "same"),
    ("mamba", "A_log"): (_L + "mixer.A_log", "same"),
    ("mamba", "D"): (_L + "mixer.D", "same"),
    ("mamba", "gate_norm"): (_L + "mixer.norm.weight", "same"),
    ("mamba", "out_proj"): (_L + "mixer.out_proj.weight", "T"),
    ("attn", "wq"): (_L + "mixer.q_proj.weight", "in_heads"),
    ("attn", "wk"): (_L + "mixer.k_proj.weight", "in_heads"),
    ("attn", "wv"): (_L + "mixer.v_proj.weight", "in_heads"),
    ("attn", "wo"): (_L + "mixer.o_proj.weight", "out_heads"),
    ("mlp", "up"): (_L + "mixer.up_proj.weight", "T"),
    ("mlp", "down"): (_L + "mixer.down_proj.weight", "T"),
    ("moe", "router"): (_L + "mixer.gate.weight", "T"),
    ("moe", "router_bias"): (_L + "mixer.gate.e_score_correction_bias", "same"),
    ("moe", "we_up"): (_L + "mixer.experts.{e}.up_proj.weight", "T"),
    ("moe", "we_down"): (_L + "mixer.experts.{e}.down_proj.weight", "T"),
    ("moe", "ws_up"): (_L + "mixer.shared_experts.up_proj.weight", "T"),
    ("moe", "ws_down"): (_L + "mixer.shared_experts.down_proj.weight", "T"),
}


def tensor_spec(cfg, top: str, leaf: str | None):
    """(HF name template, layout kind, [(placeholder, values)] of the leaf's stacked axes) of params[top] (a
    top-level leaf, leaf None) or params[top][leaf] (a layer stack's leaf)."""
    if leaf is None:
        template, kind = TENSORS[(None, top)]
        return template, kind, []
    template, kind = TENSORS.get((top, leaf)) or TENSORS[("*", leaf)]
    stack = [("i", stacks(cfg)[top])]
    return template, kind, stack + ([("e", list(range(cfg.n_experts)))] if "{e}" in template else [])


def _float(x):
    return float(x["__float__"]) if isinstance(x, dict) and "__float__" in x else float(x)


def config_from_hf(hf: dict, param_dtype: str, where: str) -> dict:
    """Our ModelConfig's keys for a nemotron_h config dict; anything the model function does not compute is
    refused."""
    if hf.get("layers_block_type"):
        unknown = sorted(set(hf["layers_block_type"]) - set(HF_KINDS))
        if unknown:
            raise ValueError(f"{where}: layers_block_type holds {unknown}; supported: {sorted(HF_KINDS)}")
        pattern = "".join(HF_KINDS[k] for k in hf["layers_block_type"])
    elif hf.get("hybrid_override_pattern"):
        pattern = hf["hybrid_override_pattern"]
    else:
        raise ValueError(f"{where}: neither layers_block_type nor hybrid_override_pattern")
    unsupported = {
        "mlp_hidden_act": hf.get("mlp_hidden_act", "relu2") != "relu2",
        "mamba_hidden_act": hf.get("mamba_hidden_act", "silu") != "silu",
        "use_bias": bool(hf.get("use_bias", False)) or bool(hf.get("mamba_proj_bias", False)),
        "attention_bias": bool(hf.get("attention_bias", False)),
        "mlp_bias": bool(hf.get("mlp_bias", False)),
        "moe_latent_size": hf.get("moe_latent_size") is not None,
        "num_nextn_predict_layers": bool(hf.get("num_nextn_predict_layers", 0)),
        "residual_in_fp32": bool(hf.get("residual_in_fp32", False)),
    }
    for key, bad in unsupported.items():
        if bad:
            raise ValueError(f"{where}: {key}={hf.get(key)!r} is not supported by nemocascade's hybrid model")
    get = lambda *keys, default=None: next((hf[k] for k in keys if k in hf), default)  # noqa: E731
    moe = {}
    if "E" in pattern:
        moe = dict(n_experts=hf["n_routed_experts"], n_experts_per_tok=hf["num_experts_per_tok"],
                   d_ff_expert=hf["moe_intermediate_size"],
                   d_ff_shared=hf["moe_shared_expert_intermediate_size"] if hf.get("n_shared_experts", 1) else 0,
                   norm_topk_prob=bool(hf.get("norm_topk_prob", True)), router="sigmoid",
                   n_expert_groups=int(hf.get("n_group", 1)), topk_groups=int(hf.get("topk_group", 1)),
                   routed_scaling=float(hf.get("routed_scaling_factor", 1.0)))
    limit = get("time_step_limit", "mamba_dt_limit", default=(0.0, float("inf")))
    n_heads = hf["num_attention_heads"]
    return dict(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=len(pattern), n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
        d_ff=hf.get("intermediate_size", 1), norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), rope=False,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), dtype="auto", param_dtype=param_dtype,
        init_std=float(hf.get("initializer_range", 0.02)), mlp_act="relu2", layer_pattern=pattern,
        mamba_heads=hf["mamba_num_heads"], mamba_head_dim=hf["mamba_head_dim"], ssm_state=hf["ssm_state_size"],
        mamba_groups=int(get("n_groups", "mamba_n_groups", default=8)),
        conv_kernel=int(get("conv_kernel", "mamba_d_conv", default=4)),
        mamba_chunk=int(get("chunk_size", "mamba_chunk_size", default=128)),
        conv_bias=bool(get("use_conv_bias", "mamba_conv_bias", default=True)),
        dt_limit=(_float(limit[0]), _float(limit[1])), **moe)


def config_to_hf(cfg) -> dict:
    if cfg.mlp_act != "relu2" or cfg.rope or cfg.qk_norm or cfg.qkv_bias or (cfg.moe and cfg.router != "sigmoid"):
        raise ValueError("a hybrid model exports as nemotron_h only: relu2 MLPs, no rotary embedding, no QK-norm or "
                         "q/k/v bias, a sigmoid router")
    kinds = {v: k for k, v in HF_KINDS.items()}
    out = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": cfg.vocab_size,
           "hidden_size": cfg.d_model, "layers_block_type": [kinds[c] for c in cfg.layer_pattern],
           "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
           "intermediate_size": cfg.d_ff, "mlp_hidden_act": "relu2", "layer_norm_epsilon": cfg.norm_eps,
           "tie_word_embeddings": cfg.tie_embeddings, "initializer_range": cfg.init_std, "dtype": cfg.param_dtype,
           "mamba_num_heads": cfg.mamba_heads, "mamba_head_dim": cfg.mamba_head_dim, "ssm_state_size": cfg.ssm_state,
           "n_groups": cfg.mamba_groups, "conv_kernel": cfg.conv_kernel, "chunk_size": cfg.mamba_chunk,
           "use_conv_bias": cfg.conv_bias, "time_step_limit": list(cfg.dt_limit), "use_bias": False,
           "mamba_proj_bias": False, "attention_bias": False, "mlp_bias": False, "residual_in_fp32": False}
    if cfg.moe:
        out |= {"n_routed_experts": cfg.n_experts, "num_experts_per_tok": cfg.n_experts_per_tok,
                "moe_intermediate_size": cfg.d_ff_expert, "moe_shared_expert_intermediate_size": cfg.d_ff_shared,
                "n_shared_experts": int(bool(cfg.d_ff_shared)), "norm_topk_prob": cfg.norm_topk_prob,
                "n_group": cfg.n_expert_groups, "topk_group": cfg.topk_groups,
                "routed_scaling_factor": cfg.routed_scaling}
    return out
