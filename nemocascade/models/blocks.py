"""The building blocks every model family shares, as pure functions over params and a model config: RMSNorm,
rotary embeddings, grouped-query attention (with its KV cache), SwiGLU / relu2 MLPs and the mixture-of-experts
layer with its router and load-balancing statistics. `transformer.py` (attention + MLP in every layer) and
`hybrid.py` (one mixer per layer) compose them."""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

_NEG_INF = -1e30  # finite, so fully-masked (padding) rows stay NaN-free
Params = dict[str, Any]
ModelConfig = Any  # transformer.ModelConfig, read by attribute (this module must not import it: no import circle)


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


class SelfMask(NamedTuple):
    """The mask of a pass over its own tokens (training, scoring) by its parts, in place of a dense [B, T, T] one:
    key s is visible to query t when s <= t and both lie in the same segment > 0 (`blockwise_attention`,
    `splash_attention`)."""
    segment_ids: jax.Array  # [B, T] int32: 0 on padding; all real tokens 1 in an unpacked row
    impl: str = "blockwise"  # static: "blockwise" (plain JAX, every backend) or "splash" (the Pallas TPU kernel)


def splash_attention(q, k, v, segment_ids, block: int):
    """`blockwise_attention`'s values from Pallas's splash attention kernel (`jax.experimental.pallas.ops.tpu`),
    forward and backward, on TPU; in Pallas's interpret mode elsewhere (slow: for tests). GQA runs the kernel's MQA
    form once per key head over that head's query group. T is padded to a multiple of `block` (a multiple of 128)
    with segment 0. Under a mesh (`jax.sharding.use_abstract_mesh`) the kernel runs per device in a `shard_map`:
    rows over the batch axes, heads over `tensor` when both head counts divide it."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    from nemocascade.mesh import logical_spec

    B, T, H, Dh = q.shape
    K = k.shape[2]
    Tp = -(-T // block) * block
    pad = lambda x: jnp.pad(x, ((0, 0), (0, Tp - T)) + ((0, 0),) * (x.ndim - 2))  # noqa: E731
    q, k, v, seg = pad(q * jnp.asarray(Dh ** -0.5, q.dtype)), pad(k), pad(v), pad(segment_ids)
    mesh = jax.sharding.get_abstract_mesh()
    platform = jax.default_backend() if mesh.empty else mesh.abstract_device.platform
    sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)

    def local(q, k, v, seg):  # q [b, T, h, Dh], k, v [b, T, kh, Dh], seg [b, T]: one device's rows and heads
        G = q.shape[2] // k.shape[2]
        kernel = sk.make_splash_mqa(sm.MultiHeadMask([sm.CausalMask((Tp, Tp))] * G), head_shards=1, q_seq_shards=1,
                                    block_sizes=sizes, interpret=platform != "tpu")
        qg = q.reshape(q.shape[0], Tp, k.shape[2], G, Dh).transpose(0, 2, 3, 1, 4)  # [b, kh, G, T, Dh]
        kg, vg = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [b, kh, T, Dh]
        per_head = jax.vmap(kernel, in_axes=(0, 0, 0, None))  # over key heads; the row's segments shared
        out = jax.vmap(lambda q, k, v, s: per_head(q, k, v, sk.SegmentIds(s, s)))(qg, kg, vg, seg)
        return out.transpose(0, 3, 1, 2, 4).reshape(q.shape)

    if mesh.empty:
        out = local(q, k, v, seg)
    else:
        heads = "heads" if logical_spec(mesh, ("heads",), (H,))[0] == logical_spec(mesh, ("kv_heads",), (K,))[0] \
            else None
        qs, ks = (logical_spec(mesh, ("batch", None, heads, None), x.shape) for x in (q, k))
        out = jax.shard_map(local, mesh=mesh, in_specs=(qs, ks, ks, logical_spec(mesh, ("batch", None), seg.shape)),
                            out_specs=qs, check_vma=False)(q, k, v, seg)
    return out[:, :T]


def _blocked(q, k, v, segment_ids, block):
    """q [B, T, H, Dh] -> [B, n, block, K, G, Dh]; k, v -> [B, n, block, K, Dh]; segment_ids -> [B, n, block] (T
    padded to n blocks with segment 0); and `scores(i, j)`: query block i against key block j, float32
    [B, block, K, G, block], the keys a query may not see at _NEG_INF, with their mask."""
    B, T, H, Dh = q.shape
    K = k.shape[2]
    n = -(-T // block)
    pad = lambda x: jnp.pad(x, ((0, 0), (0, n * block - T)) + ((0, 0),) * (x.ndim - 2))  # noqa: E731
    q = pad(q).reshape(B, n, block, K, H // K, Dh)
    k, v = pad(k).reshape(B, n, block, K, Dh), pad(v).reshape(B, n, block, K, Dh)
    seg = pad(segment_ids).reshape(B, n, block)
    causal = jnp.arange(block)[:, None] >= jnp.arange(block)[None, :]

    def scores(i, j):
        si, sj = seg[:, i], seg[:, j]
        ok = (si[:, :, None] == sj[:, None, :]) & (sj > 0)[:, None, :] & ((i > j) | causal)
        ok = ok[:, :, None, None, :]  # [B, block_q, 1, 1, block_k]
        s = jnp.einsum("bqkgd,bckd->bqkgc", q[:, i], k[:, j], preferred_element_type=jnp.float32) / (Dh ** 0.5)
        return jnp.where(ok, s, _NEG_INF), ok  # masked before any exp: nothing overflows

    return q, k, v, n, scores


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def blockwise_attention(q, k, v, segment_ids, block: int):
    """Causal grouped-query self-attention of q [B, T, H, Dh] over k, v [B, T, K, Dh] that never holds T x T
    scores (FlashAttention-2's algorithm in plain JAX): queries go `block` at a time, each over the key blocks at
    or before its own with an online softmax in float32, blocks above the diagonal never computed. The backward
    pass (`_blockwise_bwd`) recomputes each block's probabilities from the saved log-sum-exp, so it too holds one
    block's scores at a time: memory linear in T. A key is visible when it is causal and in the query's segment
    > 0 (`SelfMask`); a query that sees no key (padding) gets 0."""
    return _blockwise_fwd(q, k, v, segment_ids, block)[0]


def _blockwise_fwd(q, k, v, segment_ids, block):
    B, T, H, Dh = q.shape
    qb, kb, vb, n, scores = _blocked(q, k, v, segment_ids, block)

    def query_block(i):
        def key_block(j, carry):
            m, l, acc = carry
            s, ok = scores(i, j)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
            scale = jnp.exp(m - m_new)
            acc = acc * scale[..., None] + jnp.einsum("bqkgc,bckd->bqkgd", p.astype(v.dtype), vb[:, j],
                                                      preferred_element_type=jnp.float32)
            return m_new, l * scale + jnp.sum(p, axis=-1), acc

        shape = qb.shape[:1] + qb.shape[2:5]  # [B, block, K, G]
        init = (jnp.full(shape, _NEG_INF, jnp.float32), jnp.zeros(shape, jnp.float32),
                jnp.zeros((*shape, Dh), jnp.float32))
        m, l, acc = jax.lax.fori_loop(0, i + 1, key_block, init)  # key blocks 0..i: none above the diagonal
        l = jnp.maximum(l, 1e-30)
        return (acc / l[..., None]).astype(v.dtype), m + jnp.log(l)

    out, lse = jax.lax.map(query_block, jnp.arange(n))  # [n, B, block, K, G, (Dh)]
    out = out.swapaxes(0, 1)
    return out.reshape(B, n * block, H, Dh)[:, :T], (q, k, v, segment_ids, out, lse.swapaxes(0, 1))


def _blockwise_bwd(block, res, dout):
    q, k, v, segment_ids, out, lse = res
    B, T, H, Dh = q.shape
    qb, kb, vb, n, scores = _blocked(q, k, v, segment_ids, block)
    do = jnp.pad(dout, ((0, 0), (0, n * block - T), (0, 0), (0, 0))).reshape(qb.shape)
    delta = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [B, n, block, K, G]

    def query_block(i, grads):
        def key_block(j, carry):
            dq_i, dk, dv = carry
            s, ok = scores(i, j)
            p = jnp.where(ok, jnp.exp(s - lse[:, i, ..., None]), 0.0)  # this block's softmax probabilities
            dv = dv.at[:, j].add(jnp.einsum("bqkgc,bqkgd->bckd", p.astype(do.dtype), do[:, i],
                                            preferred_element_type=jnp.float32))
            dp = jnp.einsum("bqkgd,bckd->bqkgc", do[:, i], vb[:, j], preferred_element_type=jnp.float32)
            ds = (p * (dp - delta[:, i, ..., None]) / (Dh ** 0.5)).astype(q.dtype)
            dq_i = dq_i + jnp.einsum("bqkgc,bckd->bqkgd", ds, kb[:, j], preferred_element_type=jnp.float32)
            dk = dk.at[:, j].add(jnp.einsum("bqkgc,bqkgd->bckd", ds, qb[:, i], preferred_element_type=jnp.float32))
            return dq_i, dk, dv

        dq, dk, dv = grads
        dq_i, dk, dv = jax.lax.fori_loop(0, i + 1, key_block, (jnp.zeros(qb.shape[:1] + qb.shape[2:], jnp.float32),
                                                                dk, dv))
        return dq.at[:, i].set(dq_i), dk, dv

    zeros = lambda x: jnp.zeros(x.shape, jnp.float32)  # noqa: E731
    dq, dk, dv = jax.lax.fori_loop(0, n, query_block, (zeros(qb), zeros(kb), zeros(vb)))
    whole = lambda g, x: g.reshape(B, n * block, *x.shape[2:])[:, :T].astype(x.dtype)  # noqa: E731
    return whole(dq, q), whole(dk, k), whole(dv, v), None


blockwise_attention.defvjp(_blockwise_fwd, _blockwise_bwd)


class CachedMask(NamedTuple):
    """The mask of a cached pass whose attention reads the cache `chunk` slots at a time, up to the last slot its
    queries fill (`cached_attention`), in place of a dense [B, T, S] mask."""
    valid: jax.Array  # [B, S] bool: the cache's valid slots, the pass's own tokens included
    chunk: int  # static


def cached_attention(q, ck, cv, layer, valid, start, chunk: int):
    """Attention of q [B, T, H, Dh], the tokens at cache slots [start, start + T), over layer `layer` of the caches
    ck, cv [L, B, S, K, Dh]: each query sees the valid slots at or before its own. The cache is read `chunk` slots
    at a time (online softmax, float32) and only up to slot start + T: the cost follows the filled part of the
    cache, not its length (a multi-turn episode's cache is mostly empty until its last turn)."""
    B, T, H, Dh = q.shape
    S, K = ck.shape[2], ck.shape[3]
    C = min(chunk, S)
    q = q.reshape(B, T, K, H // K, Dh)
    query_slots = start + jnp.arange(T)
    read = lambda c, off: jax.lax.dynamic_slice(c, (layer, 0, off, 0, 0), (1, B, C, K, Dh))[0]  # noqa: E731

    def body(c, carry):
        m, l, acc = carry
        lo = c * C
        off = jnp.minimum(lo, S - C)  # the last chunk may overlap the one before: its repeated slots are masked
        slots = off + jnp.arange(C)
        ok = (slots[None, :] <= query_slots[:, None]) & (slots >= lo)[None, :]
        ok = (ok[None] & jax.lax.dynamic_slice_in_dim(valid, off, C, axis=1)[:, None, :])[:, None, None]
        k, v = read(ck, off), read(cv, off)
        scores = jnp.einsum("btkgd,bckd->bkgtc", q, k, preferred_element_type=jnp.float32) / (Dh ** 0.5)
        m_new = jnp.maximum(m, jnp.max(jnp.where(ok, scores, _NEG_INF), axis=-1))
        p = jnp.where(ok, jnp.exp(scores - m_new[..., None]), 0.0)
        scale = jnp.exp(m - m_new)
        acc = acc * scale[..., None] + jnp.einsum("bkgtc,bckd->bkgtd", p.astype(v.dtype), v,
                                                  preferred_element_type=jnp.float32)
        return m_new, l * scale + jnp.sum(p, axis=-1), acc

    G = H // K
    init = (jnp.full((B, K, G, T), _NEG_INF, jnp.float32), jnp.zeros((B, K, G, T), jnp.float32),
            jnp.zeros((B, K, G, T, Dh), jnp.float32))
    _, l, acc = jax.lax.fori_loop(0, (start + T + C - 1) // C, body, init)
    out = acc / jnp.maximum(l, 1e-30)[..., None]  # a row with no valid slot (an idle row) gets 0, never NaN
    return out.transpose(0, 3, 1, 2, 4).reshape(B, T, H, Dh).astype(cv.dtype)


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


def _routed(cfg: ModelConfig, flat, top_e, top_p, w):
    """The routed experts' output [N, D] for tokens `flat` [N, D] and their chosen experts and weights [N, k]: the
    (token, expert) pairs sorted by expert, a grouped matmul per projection (`lax.ragged_dot`), weighted, summed
    back per token."""
    k = top_e.shape[1]
    expert = top_e.reshape(-1)  # the N*k (token, expert) pairs, token-major
    order = jnp.argsort(expert, stable=True)
    token = order // k
    sizes = jnp.bincount(expert, length=cfg.n_experts).astype(jnp.int32)
    xs = flat[token]
    up = jax.lax.ragged_dot(xs, w["we_up"], sizes)
    hidden = (jnp.square(jax.nn.relu(up)) if cfg.mlp_act == "relu2"
              else jax.nn.silu(jax.lax.ragged_dot(xs, w["we_gate"], sizes)) * up)
    ys = jax.lax.ragged_dot(hidden, w["we_down"], sizes)
    ys = ys * top_p.reshape(-1)[order][:, None].astype(ys.dtype)
    return jnp.zeros_like(flat).at[token].add(ys)


def _routed_per_device(cfg: ModelConfig, flat, top_e, top_p, w):
    """`_routed` on each device's own tokens (a `shard_map` over the mesh being traced, tokens over the batch axes):
    every device sorts only its tokens' pairs, and gathers each layer's expert weights whole (as FSDP gathers a
    dense layer's), their gradients reduce-scattered back. Left to itself XLA replicates the global sort of every
    (token, expert) pair on every device. No all-to-all: the experts' weights travel, not the tokens. Without a mesh
    (or tokens that do not split over it): `_routed` as it is."""
    from nemocascade.mesh import RULES, logical_spec

    mesh = jax.sharding.get_abstract_mesh()
    rows = None if mesh.empty else logical_spec(mesh, ("batch", None), flat.shape)
    if rows is None or rows[0] is None:
        return _routed(cfg, flat, top_e, top_p, w)
    specs = {n: logical_spec(mesh, ("experts", "embed", "mlp") if n != "we_down" else ("experts", "mlp", "embed"),
                             x.shape, RULES) for n, x in w.items()}

    def local(flat, top_e, top_p, w):
        for n, spec in specs.items():
            for dim, axes in enumerate(spec):
                if axes is not None:
                    w[n] = jax.lax.all_gather(w[n], axes, axis=dim, tiled=True)
        return _routed(cfg, flat, top_e, top_p, w)

    return jax.shard_map(local, mesh=mesh, in_specs=(rows, rows, rows, specs), out_specs=rows,
                         check_vma=False)(flat, top_e, top_p, w)


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
    weights = {n: p[n].astype(dt) for n in ("we_up", "we_gate", "we_down") if n in p}
    out = _routed_per_device(cfg, flat, top_e, top_p, weights).reshape(B, T, D)
    expert = top_e.reshape(-1)
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
        kv = (ck, cv)
        if isinstance(mask, CachedMask):
            out = cached_attention(q, ck, cv, layer, mask.valid, start, mask.chunk)
            return jnp.einsum("bthk,hkd->btd", out, w("wo")), kv
        if not isinstance(mask, SelfMask):  # (a SelfMask prefill attends over its own keys, now in the cache)
            # attend over the first mask.shape[-1] slots only (the caller's static bound on the filled ones)
            S = mask.shape[-1]
            visible = lambda c: jax.lax.dynamic_slice(c, (layer, 0, 0, 0, 0), (1, c.shape[1], S) + c.shape[3:])[0]  # noqa: E731
            k, v = visible(ck), visible(cv)
    if isinstance(mask, SelfMask):
        attn = splash_attention if mask.impl == "splash" else blockwise_attention
        return jnp.einsum("bthk,hkd->btd", attn(q, k, v, mask.segment_ids, cfg.attention_block), w("wo")), kv
    return jnp.einsum("bthk,hkd->btd", attention(q, k, v, mask), w("wo")), kv
