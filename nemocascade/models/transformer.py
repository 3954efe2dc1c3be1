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

Pieces (`blocks.py`): RMSNorm, rotary embeddings (HF "rotate half", configurable theta), grouped-query attention,
an MLP or a mixture of experts (its load-balancing loss from `forward(..., with_aux=True)`), optional QK-norm
(Qwen3), q/k/v bias (Qwen2) and tied embeddings, and a `head_dim` that need not equal d_model / n_heads. A
`layer_pattern` selects the hybrid decoder instead (`hybrid.py`).

Every parameter carries *logical* axis names (`param_axes`); `nemocascade.mesh` maps them to mesh axes.
Masking follows left padding: `valid[b, t]` marks real tokens, padded keys are never attended to.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from nemocascade.mesh import constrain
from nemocascade.models import hybrid
from nemocascade.models.blocks import (CachedMask, KVCache, RouterStats, SelfMask, _no_stats, attend,  # noqa: F401
                                       attention, load_balancing_loss, mlp, mlp_axes, mlp_shapes, moe, moe_axes,
                                       moe_shapes, rms_norm, rope, route)

Params = dict[str, Any]


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
    dtype: str = "float32"  # compute dtype: "float32", "bfloat16" or "auto" (`auto_dtype`); params stay in param_dtype
    param_dtype: str = "float32"
    init_std: float = 0.02
    remat: bool = False  # rematerialise each layer in the backward pass (memory for compute)
    # self-attention of a training, scoring or prefill pass: "dense" holds [T, T] scores; "blockwise" queries and
    # keys `attention_block` at a time, never T x T, in the backward pass too (`blocks.blockwise_attention`);
    # "splash" the same through Pallas's TPU kernel (interpret mode elsewhere: tests); "auto": dense up to
    # attention_block tokens, then splash on TPU, blockwise elsewhere (`self_mask`). Decode: `sampling.attn_chunk`
    attention: str = "auto"
    attention_block: int = 512
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
            hybrid.check(self)
        if self.attention not in ("auto", "dense", "blockwise", "splash") or self.attention_block <= 0:
            raise ValueError(f"model.attention={self.attention!r} must be 'auto', 'dense', 'blockwise' or 'splash' and "
                             f"model.attention_block={self.attention_block} positive")
        if self.attention in ("auto", "splash") and self.attention_block % 128:
            raise ValueError(f"model.attention_block={self.attention_block} must be a multiple of 128 (splash "
                             "attention's tiles)")
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
# Forward passes (the building blocks are in blocks.py)


def init_cache(cfg: ModelConfig, batch: int, max_len: int) -> KVCache:
    dtype = jnp.dtype(cfg.dtype)
    if cfg.layer_pattern:
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


def _decoder(params: Params, cfg: ModelConfig, tokens, positions, mask, kv=None, start=0, tok_valid=None):
    """The shared body: embed, every layer (one `lax.scan`), final norm. Returns the normed hidden state
    [B, T, d_model], with `kv` = (k_cache, v_cache) the updated caches (None without), and the router
    statistics summed over layers (None for a dense model); `tok_valid` [B, T] marks the tokens they count."""
    if tok_valid is None:
        tok_valid = jnp.ones(tokens.shape, bool)
    if cfg.layer_pattern:
        return hybrid.decoder(params, cfg, tokens, positions, mask, kv, start, tok_valid)
    x = constrain(params["embed"].astype(jnp.dtype(cfg.dtype))[tokens], ("batch", None, None))

    def body(carry, xs):
        x, kv, stats = carry
        p, layer = xs
        x, kv, new = _layer(cfg, x, p, positions, mask, None if kv is None else (*kv, layer), start, tok_valid)
        x = constrain(x, ("batch", None, None))
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


def self_mask(cfg: ModelConfig, segment_ids) -> SelfMask | None:
    """How a pass over its own T tokens attends (`ModelConfig.attention`): a SelfMask for blockwise or splash
    attention, or None for dense. "auto" is dense up to `attention_block` tokens, then splash on TPU (the backend of
    the mesh being traced, else JAX's) and blockwise elsewhere."""
    T, impl = segment_ids.shape[1], cfg.attention
    if impl == "auto":
        if T <= cfg.attention_block:
            return None
        mesh = jax.sharding.get_abstract_mesh()
        impl = "splash" if (jax.default_backend() if mesh.empty else mesh.abstract_device.platform) == "tpu" \
            else "blockwise"
    return None if impl == "dense" else SelfMask(segment_ids, impl)


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
    if segment_ids is not None and "M" in cfg.layer_pattern:
        raise ValueError("packed rows (segment_ids) with Mamba-2 layers: the recurrent state would carry from one "
                         "sequence into the next; train this model with pack=False")
    seg = jnp.where(valid, 1 if segment_ids is None else segment_ids, 0).astype(jnp.int32)
    mask = self_mask(cfg, seg)
    if mask is None:
        mask = jnp.tril(jnp.ones((T, T), bool))[None] & valid[:, None, :]
        if segment_ids is not None:
            mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids > 0)[:, None, :]
    valid = seg > 0  # the real tokens (the router statistics count them)
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
                   last_only: bool = False, seen: int = 0, chunk: int = 0):
    """(logits [B, T, vocab] float32, new cache) for `tokens` [B, T] written to cache slots [start, start+T).

    Each token attends to every valid cached slot at or before its own. This is both prefill (start=0,
    T=prompt length) and decode (T=1). positions, valid [B, T] as in `forward` (required here).
    `last_only`: logits of the last column only ([B, 1, vocab]): a prefill needs no more, and the LM head over
    every prompt position would cost T x vocab x d_model per row.
    `seen` (static, 0 = the whole cache): attention reads only cache slots [0, seen), which must include
    [start, start+T) (a prefill's bound).
    `chunk` (static, 0 = off): attention reads the cache `chunk` slots at a time and only up to slot start + T
    (`blocks.cached_attention`): decoding then costs what the filled slots cost, whatever the cache's length.
    A prefill (start 0, seen = T) of more than `cfg.attention_block` tokens attends blockwise, as training does.
    """
    T = tokens.shape[1]
    kv_valid = jax.lax.dynamic_update_slice_in_dim(cache.valid, valid, start, axis=1)
    prefill = self_mask(cfg, valid.astype(jnp.int32)) if isinstance(start, int) and start == 0 and seen == T \
        else None
    if prefill is not None:  # a long prompt's prefill attends as training does
        mask = prefill
    elif chunk and cache.valid.shape[1] > chunk:  # (a cache of one chunk is read whole, without the loop)
        mask = CachedMask(kv_valid, chunk)
    else:
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
