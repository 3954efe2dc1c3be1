"""A decoder-only transformer of the Llama / Qwen2 / Qwen3 family as pure functions over a params pytree.

Three fixed-shape entry points share one body (`_decoder`):

    forward(params, cfg, tokens, positions=None, valid=None, segment_ids=None)          -> logits
    forward_cached(params, cfg, tokens, positions, valid, cache, start)                 -> (logits, cache)
    forward_hidden(params, cfg, tokens, positions=None, valid=None, segment_ids=None)   -> hidden

`forward` serves every role (policy, frozen reference, teachers): a role is just another params pytree.
`forward_cached` is prefill and decode over a KV cache (sampling); `forward_hidden` stops before the LM head
(the reward model's scalar head; `head_logprobs` applies the head chunk by chunk for a trainer that needs only
the sampled tokens' log-probs). Parameters of all layers are stacked on a leading `layers` axis and applied
with `lax.scan`, which keeps compile time flat in depth.

Pieces: RMSNorm, rotary embeddings (HF "rotate half" convention, configurable theta), grouped-query
attention, SwiGLU MLP or a mixture of SwiGLU experts (Qwen3-MoE: softmax top-k router, dropless grouped
matmuls, optional shared expert, the load-balancing loss from `forward(..., with_aux=True)`), optional QK-norm
(Qwen3), optional q/k/v bias (Qwen2), optional tied embeddings, and a `head_dim` that need not equal
d_model / n_heads.

Every parameter carries *logical* axis names (`param_axes`); `nemocascade.mesh` maps them to mesh axes.
Masking follows left padding: `valid[b, t]` marks real tokens, padded keys are never attended to.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

Params = dict[str, Any]
_NEG_INF = -1e30  # finite, so fully-masked (padding) rows stay NaN-free


def auto_dtype(backend: str | None = None) -> str:
    """The compute dtype `dtype="auto"` means on `backend` (default: JAX's): bfloat16 where the matrix units
    run it natively (TPU, GPU), float32 on CPU (bfloat16 matmuls there are emulated and slower)."""
    return "float32" if (backend or jax.default_backend()) == "cpu" else "bfloat16"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 32
    d_ff: int = 384
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6
    qk_norm: bool = False
    qkv_bias: bool = False
    tie_embeddings: bool = False
    dtype: str = "float32"  # compute dtype: "float32", "bfloat16", or "auto" (bfloat16 on TPU/GPU, float32 on
    # CPU, where XLA has no fast bfloat16 matmul); params stay in param_dtype
    param_dtype: str = "float32"
    init_std: float = 0.02
    remat: bool = False  # rematerialise each layer in the backward pass (memory for compute)
    # mixture of experts (Qwen3-MoE): n_experts > 0 replaces every layer's MLP by n_experts routed SwiGLU experts of
    # width d_ff_expert, n_experts_per_tok of them per token (softmax router, top-k, dropless), plus an always-on
    # shared expert of width d_ff_shared (0: none)
    n_experts: int = 0
    n_experts_per_tok: int = 0
    d_ff_expert: int = 0
    d_ff_shared: int = 0
    norm_topk_prob: bool = False  # renormalise the top-k router probabilities to sum to 1
    router_aux_coef: float = 0.0  # weight of the load-balancing loss (Switch) in every training loss
    # router "sigmoid" (Nemotron-H, DeepSeek-V3): sigmoid scores, experts chosen by score + a per-expert selection
    # bias within the best `topk_groups` of `n_expert_groups` groups, weights the chosen scores (renormalised with
    # norm_topk_prob) times `routed_scaling`; "softmax" (Qwen3-MoE)
    router: str = "softmax"
    n_expert_groups: int = 1
    topk_groups: int = 1
    routed_scaling: float = 1.0
    mlp_act: str = "swiglu"  # "relu2": up -> squared ReLU -> down, no gate (Nemotron-H's MLPs, experts, shared expert)
    # hybrid layers (Nemotron-H, models/hybrid.py): one mixer per layer, `layer_pattern` one character per layer,
    # "M" Mamba-2, "*" attention, "-" MLP, "E" mixture of experts ("" = attention + MLP in every layer)
    layer_pattern: str = ""
    rope: bool = True  # rotary embeddings in attention (Nemotron-H's attention layers have none)
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    ssm_state: int = 0
    mamba_groups: int = 1
    conv_kernel: int = 4
    mamba_chunk: int = 128  # the chunked scan's chunk length (training and prefill)
    conv_bias: bool = True
    dt_limit: tuple = (0.0, float("inf"))  # softplus(dt) is clamped to this range

    @property
    def moe(self) -> bool:
        return self.n_experts > 0

    def __post_init__(self):
        for key in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff"):
            if int(getattr(self, key)) <= 0:
                raise ValueError(f"model.{key} must be positive, got {getattr(self, key)!r}")
        if self.n_experts < 0 or (self.n_experts and not 1 <= self.n_experts_per_tok <= self.n_experts):
            raise ValueError(f"model.n_experts_per_tok={self.n_experts_per_tok} must be in [1, model.n_experts="
                             f"{self.n_experts}] (n_experts 0: a dense MLP)")
        if self.n_experts and self.d_ff_expert <= 0:
            raise ValueError(f"model.d_ff_expert must be positive with model.n_experts={self.n_experts}")
        if self.router not in ("softmax", "sigmoid") or self.mlp_act not in ("swiglu", "relu2"):
            raise ValueError(f"model.router={self.router!r} must be 'softmax' or 'sigmoid', model.mlp_act="
                             f"{self.mlp_act!r} 'swiglu' or 'relu2'")
        if self.n_experts and (self.n_experts % self.n_expert_groups or self.topk_groups > self.n_expert_groups):
            raise ValueError(f"model.n_expert_groups={self.n_expert_groups} must divide model.n_experts="
                             f"{self.n_experts} and be >= model.topk_groups={self.topk_groups}")
        if self.layer_pattern:
            from nemocascade.models import hybrid
            hybrid.check(self)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"model.n_heads={self.n_heads} must be a multiple of model.n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"model.head_dim={self.head_dim} must be even for rotary embeddings")
        if self.dtype == "auto":  # resolved once, here: the config is a static jit argument
            object.__setattr__(self, "dtype", auto_dtype())
        for key, also in (("dtype", " or 'auto'"), ("param_dtype", "")):
            if getattr(self, key) not in ("float32", "bfloat16"):
                raise ValueError(f"model.{key} must be 'float32', 'bfloat16'{also}, got {getattr(self, key)!r}")

    @classmethod
    def from_dict(cls, d) -> "ModelConfig":
        d = dict(d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown model config key(s) {unknown}; known: {sorted(known)}")
        return cls(**d)


def param_axes(cfg: ModelConfig) -> Params:
    """Logical axis names of every parameter, in the same pytree structure as the params."""
    if cfg.layer_pattern:
        from nemocascade.models import hybrid
        return hybrid.param_axes(cfg)
    layer = {
        "attn_norm": ("layers", "norm"),
        "wq": ("layers", "embed", "heads", "head_dim"),
        "wk": ("layers", "embed", "kv_heads", "head_dim"),
        "wv": ("layers", "embed", "kv_heads", "head_dim"),
        "wo": ("layers", "heads", "head_dim", "embed"),
        "mlp_norm": ("layers", "norm"),
    }
    layer |= moe_axes(cfg) if cfg.moe else mlp_axes(cfg, "w_")
    if cfg.qkv_bias:
        layer |= {"bq": ("layers", "heads", "head_dim"), "bk": ("layers", "kv_heads", "head_dim"),
                  "bv": ("layers", "kv_heads", "head_dim")}
    if cfg.qk_norm:
        layer |= {"q_norm": ("layers", "head_dim"), "k_norm": ("layers", "head_dim")}
    axes = {"embed": ("vocab", "embed"), "layers": layer, "final_norm": ("norm",)}
    if not cfg.tie_embeddings:
        axes["lm_head"] = ("embed", "vocab")
    return axes


def param_shapes(cfg: ModelConfig) -> Params:
    if cfg.layer_pattern:
        from nemocascade.models import hybrid
        return hybrid.param_shapes(cfg)
    L, D, H, K, Dh, F, V = (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                            cfg.d_ff, cfg.vocab_size)
    layer = {"attn_norm": (L, D), "wq": (L, D, H, Dh), "wk": (L, D, K, Dh), "wv": (L, D, K, Dh),
             "wo": (L, H, Dh, D), "mlp_norm": (L, D)}
    layer |= moe_shapes(cfg, L) if cfg.moe else mlp_shapes(cfg, "w_", L, F)
    if cfg.qkv_bias:
        layer |= {"bq": (L, H, Dh), "bk": (L, K, Dh), "bv": (L, K, Dh)}
    if cfg.qk_norm:
        layer |= {"q_norm": (L, Dh), "k_norm": (L, Dh)}
    shapes = {"embed": (V, D), "layers": layer, "final_norm": (D,)}
    if not cfg.tie_embeddings:
        shapes["lm_head"] = (D, V)
    return shapes


def mlp_axes(cfg: ModelConfig, prefix: str, lead=("layers",)) -> Params:
    """A SwiGLU MLP's gate/up/down (a relu2 MLP's up/down) logical axes, named `prefix` + gate/up/down."""
    axes = {prefix + "up": (*lead, "embed", "mlp"), prefix + "down": (*lead, "mlp", "embed")}
    return axes | ({prefix + "gate": (*lead, "embed", "mlp")} if cfg.mlp_act == "swiglu" else {})


def mlp_shapes(cfg: ModelConfig, prefix: str, L: int, F: int, lead=()) -> Params:
    D = cfg.d_model
    shapes = {prefix + "up": (L, *lead, D, F), prefix + "down": (L, *lead, F, D)}
    return shapes | ({prefix + "gate": (L, *lead, D, F)} if cfg.mlp_act == "swiglu" else {})


def moe_axes(cfg: ModelConfig) -> Params:
    """Routed experts on the mesh's expert axis; the router's expert dim is replicated."""
    axes = {"router": ("layers", "embed", None)} | mlp_axes(cfg, "we_", ("layers", "experts"))
    if cfg.router == "sigmoid":
        axes["router_bias"] = ("layers", None)
    return axes | (mlp_axes(cfg, "ws_") if cfg.d_ff_shared else {})


def moe_shapes(cfg: ModelConfig, L: int) -> Params:
    E = cfg.n_experts
    shapes = {"router": (L, cfg.d_model, E)} | mlp_shapes(cfg, "we_", L, cfg.d_ff_expert, (E,))
    if cfg.router == "sigmoid":
        shapes["router_bias"] = (L, E)
    return shapes | (mlp_shapes(cfg, "ws_", L, cfg.d_ff_shared) if cfg.d_ff_shared else {})


def init_params(cfg: ModelConfig, rng: jax.Array) -> Params:
    """Norm weights 1, biases 0, matrices N(0, init_std); the output projections are scaled by
    1/sqrt(2 n_layers) (GPT-2) so the residual stream does not grow with depth."""
    shapes = param_shapes(cfg)
    flat, treedef = jax.tree.flatten_with_path(shapes, is_leaf=lambda x: isinstance(x, tuple))
    keys = jax.random.split(rng, len(flat))
    dtype = jnp.dtype(cfg.param_dtype)
    leaves = []
    for (path, shape), key in zip(flat, keys):
        name = path[-1].key
        if "norm" in name or name in ("D", "dt_bias"):
            leaves.append(jnp.ones(shape, dtype))
        elif name == "A_log":  # Mamba-2's A = -exp(A_log) = -1, -2, ..., -heads
            leaves.append(jnp.broadcast_to(jnp.log(jnp.arange(1, shape[-1] + 1, dtype=jnp.float32)),
                                           shape).astype(dtype))
        elif name.startswith("b") or name in ("conv_b", "router_bias"):
            leaves.append(jnp.zeros(shape, dtype))
        else:
            std = cfg.init_std / ((2 * cfg.n_layers) ** 0.5 if name in ("wo", "w_down", "we_down", "ws_down", "down",
                                                                          "out_proj") else 1.0)
            leaves.append((std * jax.random.normal(key, shape, jnp.float32)).astype(dtype))
    return jax.tree.unflatten(treedef, leaves)


def count_params(params: Params) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))


# ----------------------------------------------------------------------------------------------------
# Building blocks


def rms_norm(x, weight, eps):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 (as HF Llama/Qwen)."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)


def rope(x, positions, theta):
    """Rotary embedding, HF 'rotate_half' layout. x [B, T, N, Dh], positions [B, T] int."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (jnp.arange(0, half, dtype=jnp.float32) * 2.0 / x.shape[-1]))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, half]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def attention(q, k, v, mask):
    """Grouped-query attention. q [B, T, H, Dh]; k, v [B, S, K, Dh]; mask [B, T, S] bool."""
    B, T, H, Dh = q.shape
    K = k.shape[2]
    q = q.reshape(B, T, K, H // K, Dh)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) / (Dh ** 0.5)
    scores = jnp.where(mask[:, None, None, :, :], scores, _NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(B, T, H, Dh)


def mlp(cfg: ModelConfig, x, p, prefix: str, dt):
    """The MLP whose weights are p[prefix + gate/up/down], on x [..., D]: SwiGLU, silu(x gate) * (x up) then
    down; or with mlp_act "relu2", relu(x up)^2 then down."""
    up = jnp.einsum("...d,df->...f", x, p[prefix + "up"].astype(dt))
    if cfg.mlp_act == "relu2":
        hidden = jnp.square(jax.nn.relu(up))
    else:
        hidden = jax.nn.silu(jnp.einsum("...d,df->...f", x, p[prefix + "gate"].astype(dt))) * up
    return jnp.einsum("...f,fd->...d", hidden, p[prefix + "down"].astype(dt))


def route(cfg: ModelConfig, logits, p):
    """(probabilities [N, E] for the load-balancing statistics, chosen experts [N, k], their weights [N, k]) from
    router logits [N, E] float32 (`ModelConfig.router`)."""
    k = cfg.n_experts_per_tok
    if cfg.router == "softmax":
        probs = jax.nn.softmax(logits, axis=-1)
        weights, experts = jax.lax.top_k(probs, k)
        if cfg.norm_topk_prob:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        return probs, experts, weights
    scores = jax.nn.sigmoid(logits)
    choice = scores + p["router_bias"].astype(jnp.float32)
    N, E, G = logits.shape[0], cfg.n_experts, cfg.n_expert_groups
    if G > 1:  # keep the best topk_groups groups, each scored by the sum of its two best experts
        grouped = choice.reshape(N, G, E // G)
        group_score = jnp.sum(jax.lax.top_k(grouped, min(2, E // G))[0], axis=-1)
        _, best = jax.lax.top_k(group_score, cfg.topk_groups)
        keep = jnp.zeros((N, G), bool).at[jnp.arange(N)[:, None], best].set(True)
        choice = jnp.where(jnp.repeat(keep, E // G, axis=1), choice, -jnp.inf)
    _, experts = jax.lax.top_k(choice, k)
    weights = jnp.take_along_axis(scores, experts, axis=-1)
    if cfg.norm_topk_prob:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return scores / jnp.sum(scores, axis=-1, keepdims=True), experts, weights * cfg.routed_scaling


class RouterStats(NamedTuple):
    """Sums over layers and real tokens that the load-balancing loss needs (`load_balancing_loss`):
    top-k assignments per expert, router probability per expert, and rows (tokens x layers)."""
    counts: jax.Array  # [E]
    probs: jax.Array   # [E]
    rows: jax.Array    # []


def moe(cfg: ModelConfig, x, p, dt, tok_valid):
    """Routed experts, dropless: every token reaches its `n_experts_per_tok` experts (`route`, in float32), as a
    grouped matmul over the (token, expert) pairs sorted by expert (`lax.ragged_dot`), plus the shared expert.
    Experts are SwiGLU or relu2 MLPs (`mlp_act`). x [B, T, D]; tok_valid [B, T] bool marks the tokens the router
    statistics count. Returns (out [B, T, D], RouterStats)."""
    B, T, D = x.shape
    E, k = cfg.n_experts, cfg.n_experts_per_tok
    flat = x.reshape(B * T, D)
    router = p["router"]
    logits = (jnp.einsum("nd,de->ne", flat.astype(jnp.float32), router.astype(jnp.float32)) if cfg.router == "sigmoid"
              else jnp.einsum("nd,de->ne", flat, router.astype(dt), preferred_element_type=jnp.float32))
    probs, top_e, top_p = route(cfg, logits, p)  # [N, E], [N, k], [N, k]
    expert = top_e.reshape(-1)  # the N*k (token, expert) pairs, token-major
    order = jnp.argsort(expert, stable=True)
    token = order // k
    sizes = jnp.bincount(expert, length=E).astype(jnp.int32)
    xs = flat[token]
    up = jax.lax.ragged_dot(xs, p["we_up"].astype(dt), sizes)
    hidden = (jnp.square(jax.nn.relu(up)) if cfg.mlp_act == "relu2"
              else jax.nn.silu(jax.lax.ragged_dot(xs, p["we_gate"].astype(dt), sizes)) * up)
    ys = jax.lax.ragged_dot(hidden, p["we_down"].astype(dt), sizes)
    ys = ys * top_p.reshape(-1)[order][:, None].astype(ys.dtype)
    out = jnp.zeros_like(flat).at[token].add(ys).reshape(B, T, D)
    if cfg.d_ff_shared:
        out = out + mlp(cfg, x, p, "ws_", dt)
    w = tok_valid.reshape(-1).astype(jnp.float32)
    stats = RouterStats(jnp.zeros((E,), jnp.float32).at[expert].add(jnp.repeat(w, k)),
                        jnp.sum(probs * w[:, None], axis=0), jnp.sum(w))
    return out, stats


def load_balancing_loss(cfg: ModelConfig, stats: RouterStats):
    """Switch Transformer's auxiliary loss over all layers, as transformers' Qwen3-MoE computes it:
    n_experts * sum_e (top-k assignments to e / rows) * (router probability of e / rows): k when the load is
    spread evenly, up to n_experts * k when one expert takes every token with probability 1."""
    rows = jnp.maximum(stats.rows, 1.0)
    return cfg.n_experts * jnp.sum((stats.counts / rows) * (stats.probs / rows))


def _no_stats(cfg: ModelConfig) -> RouterStats:
    z = jnp.zeros((cfg.n_experts,), jnp.float32)
    return RouterStats(z, z, jnp.zeros((), jnp.float32))


class KVCache(NamedTuple):
    """Per-layer keys/values for `max_len` slots and which slots hold real tokens.

    k, v: [attention layers, B, max_len, n_kv_heads, head_dim]; valid: [B, max_len] bool.
    Slot s holds the s-th token of the (left-padded) sequence; rotary positions are stored in k already.
    A hybrid model (models/hybrid.py) also carries each Mamba-2 layer's recurrent state: conv [mamba layers, B,
    conv_kernel - 1, conv channels] (the last inputs of its causal convolution) and ssm [mamba layers, B, heads,
    head_dim, state] float32.
    """
    k: jax.Array
    v: jax.Array
    valid: jax.Array
    conv: jax.Array | None = None
    ssm: jax.Array | None = None

    def repeat_rows(self, G: int) -> "KVCache":
        """Every row repeated G times, a prompt's copies adjacent (one prefill shared by G samples)."""
        if G == 1:
            return self
        rep = lambda x, axis: None if x is None else jnp.repeat(x, G, axis=axis)  # noqa: E731
        return KVCache(rep(self.k, 1), rep(self.v, 1), rep(self.valid, 0), rep(self.conv, 1), rep(self.ssm, 1))


def init_cache(cfg: ModelConfig, batch: int, max_len: int) -> KVCache:
    dtype = jnp.dtype(cfg.dtype)
    if cfg.layer_pattern:
        from nemocascade.models import hybrid
        return hybrid.init_cache(cfg, batch, max_len)
    shape = (cfg.n_layers, batch, max_len, cfg.n_kv_heads, cfg.head_dim)
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch, max_len), bool))


def _layer(cfg: ModelConfig, x, p, positions, mask, kv=None, start=None, tok_valid=None):
    """One pre-norm block. With `kv` = (all layers' cached k, v, this layer's index), writes the new
    keys/values at slot `start` and attends over the first S cached slots (S = mask.shape[-1]); returns
    (x, (k_cache, v_cache), router statistics (None for a dense MLP)).
    The cache is updated in place (a loop-carried dynamic_update_slice), never copied per step."""
    dt = jnp.dtype(cfg.dtype)
    out, kv = attend(cfg, rms_norm(x, p["attn_norm"], cfg.norm_eps), p, positions, mask, kv, start)
    x = x + out
    h = rms_norm(x, p["mlp_norm"], cfg.norm_eps)
    if cfg.moe:
        out, stats = moe(cfg, h, p, dt, tok_valid)
        return x + out, kv, stats
    return x + mlp(cfg, h, p, "w_", dt), kv, None


def attend(cfg: ModelConfig, h, p, positions, mask, kv=None, start=None):
    """Grouped-query self-attention of the normed input h [B, T, D] (rotary unless `cfg.rope` is False) ->
    (output [B, T, D], kv as `_layer` describes)."""
    dt = jnp.dtype(cfg.dtype)
    w = lambda name: p[name].astype(dt)  # noqa: E731  (cast params to the compute dtype)
    q = jnp.einsum("btd,dhk->bthk", h, w("wq"))
    k = jnp.einsum("btd,dhk->bthk", h, w("wk"))
    v = jnp.einsum("btd,dhk->bthk", h, w("wv"))
    if cfg.qkv_bias:
        q, k, v = q + w("bq"), k + w("bk"), v + w("bv")
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"], cfg.norm_eps)
        k = rms_norm(k, p["k_norm"], cfg.norm_eps)
    if cfg.rope:
        q = rope(q, positions, cfg.rope_theta)
        k = rope(k, positions, cfg.rope_theta)
    if kv is not None:
        ck, cv, layer = kv
        ck = jax.lax.dynamic_update_slice(ck, k[None].astype(ck.dtype), (layer, 0, start, 0, 0))
        cv = jax.lax.dynamic_update_slice(cv, v[None].astype(cv.dtype), (layer, 0, start, 0, 0))
        # attend over the first mask.shape[-1] slots only (the caller's static bound on the filled ones)
        S = mask.shape[-1]
        visible = lambda c: jax.lax.dynamic_slice(c, (layer, 0, 0, 0, 0), (1, c.shape[1], S) + c.shape[3:])[0]  # noqa: E731
        k, v, kv = visible(ck), visible(cv), (ck, cv)
    return jnp.einsum("bthk,hkd->btd", attention(q, k, v, mask), w("wo")), kv


def _decoder(params: Params, cfg: ModelConfig, tokens, positions, mask, kv=None, start=0, tok_valid=None):
    """The shared body: embed, every layer (one `lax.scan`), final norm. Returns the normed hidden state
    [B, T, d_model], with `kv` = (k_cache, v_cache) the updated caches (None without), and the router
    statistics summed over layers (None for a dense model); `tok_valid` [B, T] marks the tokens they count."""
    if tok_valid is None:
        tok_valid = jnp.ones(tokens.shape, bool)
    if cfg.layer_pattern:
        from nemocascade.models import hybrid
        return hybrid.decoder(params, cfg, tokens, positions, mask, kv, start, tok_valid)
    x = params["embed"].astype(jnp.dtype(cfg.dtype))[tokens]

    def body(carry, xs):
        x, kv, stats = carry
        p, layer = xs
        x, kv, new = _layer(cfg, x, p, positions, mask, None if kv is None else (*kv, layer), start, tok_valid)
        if new is not None:
            stats = jax.tree.map(jnp.add, stats, new)
        return (x, kv, stats), None

    if cfg.remat:
        body = jax.checkpoint(body, prevent_cse=False)
    stats = _no_stats(cfg) if cfg.moe else None
    (x, kv, stats), _ = jax.lax.scan(body, (x, kv, stats), (params["layers"], jnp.arange(cfg.n_layers)))
    return rms_norm(x, params["final_norm"], cfg.norm_eps), kv, stats


def lm_head(params: Params, cfg: ModelConfig, h):
    """Logits float32 [B, T, vocab] of the normed hidden state `h`."""
    head = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
    return jnp.einsum("btd,dv->btv", h, head.astype(jnp.dtype(cfg.dtype)), preferred_element_type=jnp.float32)


def forward_hidden(params: Params, cfg: ModelConfig, tokens, positions=None, valid=None, segment_ids=None,
                   with_aux: bool = False):
    """The final normed hidden state [B, T, d_model] of `tokens` [B, T]: `forward` without the LM head
    (for scalar heads, e.g. the reward model). Arguments as `forward`; `with_aux`: (hidden, load-balancing loss
    over the valid tokens; 0 for a dense model)."""
    B, T = tokens.shape
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    if valid is None:
        valid = jnp.ones((B, T), bool)
    mask = jnp.tril(jnp.ones((T, T), bool))[None] & valid[:, None, :]
    if segment_ids is not None:
        if "M" in cfg.layer_pattern:
            raise ValueError("packed rows (segment_ids) with Mamba-2 layers: the recurrent state would carry from one "
                             "sequence into the next; train this model with pack=False")
        mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids > 0)[:, None, :]
        valid = valid & (segment_ids > 0)
    h, _, stats = _decoder(params, cfg, tokens, positions, mask, tok_valid=valid)
    if not with_aux:
        return h
    return h, (load_balancing_loss(cfg, stats) if cfg.moe else jnp.zeros((), jnp.float32))


def forward(params: Params, cfg: ModelConfig, tokens, positions=None, valid=None, segment_ids=None,
            with_aux: bool = False):
    """Logits for `tokens` [B, T] (float32 [B, T, vocab]).

    positions: rotary positions [B, T] (default 0..T-1). With left padding pass
        `positions = t - n_pad[b]` so every row's first real token has position 0.
    valid: [B, T] bool, False on padding; padded keys are never attended to.
    segment_ids: [B, T] int for packed rows (several sequences per row, pipeline.sft_dataset(pack=True)):
        a token attends only to earlier tokens of its own segment; segment 0 is padding. Pass each
        segment's own `positions` (0 at its first token).
    with_aux: return (logits, load-balancing loss) (`forward_hidden`).
    """
    if with_aux:
        h, aux = forward_hidden(params, cfg, tokens, positions, valid, segment_ids, with_aux=True)
        return lm_head(params, cfg, h), aux
    return lm_head(params, cfg, forward_hidden(params, cfg, tokens, positions, valid, segment_ids))


def head_logprobs(params: Params, cfg: ModelConfig, h, targets, chunk: int):
    """(log pi(targets), entropy of pi) [B, T] float32 from the normed hidden state `h` [B, T, d_model], with the
    LM head and log-softmax applied `chunk` positions at a time under `jax.checkpoint`: the [B, T, vocab] logits
    never exist whole, in the forward pass or the backward (which recomputes one chunk's logits at a time).
    The entropy is a diagnostic and carries no gradient."""
    B, T, D = h.shape
    n = -(-T // chunk)
    pad = n * chunk - T
    hs = jnp.pad(h, ((0, 0), (0, pad), (0, 0))).reshape(B, n, chunk, D).swapaxes(0, 1)
    ts = jnp.pad(targets, ((0, 0), (0, pad))).reshape(B, n, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def one(args):
        hc, tc = args
        logp_all = jax.nn.log_softmax(lm_head(params, cfg, hc), axis=-1)
        logp = jnp.take_along_axis(logp_all, tc[..., None].astype(jnp.int32), axis=-1)[..., 0]
        p = jnp.exp(logp_all)
        entropy = -jnp.sum(jnp.where(p > 0, p * logp_all, 0.0), axis=-1)
        return logp, jax.lax.stop_gradient(entropy)

    logp, entropy = jax.lax.map(one, (hs, ts))
    whole = lambda x: x.swapaxes(0, 1).reshape(B, n * chunk)[:, :T]  # noqa: E731
    return whole(logp), whole(entropy)


def forward_cached(params: Params, cfg: ModelConfig, tokens, positions, valid, cache: KVCache, start,
                   last_only: bool = False, seen: int = 0):
    """(logits [B, T, vocab] float32, new cache) for `tokens` [B, T] written to cache slots [start, start+T).

    Each token attends to every valid cached slot at or before its own. This is both prefill (start=0,
    T=prompt length) and decode (T=1). positions, valid [B, T] as in `forward` (required here).
    `last_only`: logits of the last column only ([B, 1, vocab]): a prefill needs no more, and the LM head over
    every prompt position would cost T x vocab x d_model per row.
    `seen` (static, 0 = the whole cache): attention reads only cache slots [0, seen), which must include
    [start, start+T); a decode loop raises it block by block so early steps do not read the empty cache.
    """
    T = tokens.shape[1]
    kv_valid = jax.lax.dynamic_update_slice_in_dim(cache.valid, valid, start, axis=1)
    slots = jnp.arange(seen or cache.valid.shape[1])
    query_slots = start + jnp.arange(T)
    mask = (slots[None, :] <= query_slots[:, None])[None] & kv_valid[:, None, :slots.shape[0]]
    if cfg.layer_pattern:  # the hybrid decoder reads and returns the whole cache (its Mamba-2 states too)
        h, new, _ = _decoder(params, cfg, tokens, positions, mask, cache, start, valid)
        return lm_head(params, cfg, h[:, -1:] if last_only else h), new._replace(valid=kv_valid)
    h, (k, v), _ = _decoder(params, cfg, tokens, positions, mask, (cache.k, cache.v), start, valid)
    return lm_head(params, cfg, h[:, -1:] if last_only else h), KVCache(k, v, kv_valid)


def left_pad_positions(valid):
    """Rotary positions for left-padded rows: 0 at each row's first real token (pads get 0 too)."""
    return jnp.maximum(jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1, 0)
