"""Jitted sampling: one prefill over the left-padded prompts (each prompt once, attending over the prompt's
cache slots only; its KV cache shared by its G samples), then a `lax.while_loop` of single-token decode steps over
the KV cache. Tokens are drawn by inverting the CDF (one uniform per row) and top-p finds its threshold by
bisection: no vocabulary-sized random draw or sort per step.

Returns, per response, the sampled tokens and the log-prob of each under the model at temperature 1
(`log_softmax(logits)`, the distribution the trainer's `forward` computes). With T = 1 and top-p = 1
(GRPO's setting) this is the sampling distribution itself; the trainer compares it against its own
full-forward log-probs as the sampler-vs-trainer mismatch metric (MOPD's pi_inf).

Decode attention (`chunk`): on CPU each step reads the KV cache `ATTN_CHUNK` slots at a time and only up to the
last filled slot (`blocks.cached_attention`), so a step costs what the filled slots cost, not the cache's length
(a multi-turn episode's cache is mostly empty until its last turn). On accelerators the default is one dense pass
over the whole cache: a dynamic-length loop in every layer of every step may cost more there than the slots it
skips. `chunk=0` forces the dense pass.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from nemocascade.models.transformer import ModelConfig, forward_cached, init_cache, left_pad_positions


ATTN_CHUNK = 128  # cache slots per read of chunked decode attention (the CPU default)


def attn_chunk(chunk: int | None) -> int:
    """The decode attention's chunk: `chunk` if given, else ATTN_CHUNK on CPU and 0 (dense) on accelerators."""
    if chunk is not None:
        return chunk
    return ATTN_CHUNK if jax.default_backend() == "cpu" else 0


PROMPT_BUCKET = 32  # callers pad a batch's prompts to a multiple of this (pipeline.encode_prompts(bucket=)), not
# to the longest allowed prompt: a handful of compiled sampler shapes, and no prefill or cache spent on padding


class Samples(NamedTuple):
    prompts: jax.Array      # [B*G, prompt_len] int32, left-padded (each prompt repeated G times, adjacent)
    prompt_lens: jax.Array  # [B*G] int32
    tokens: jax.Array       # [B*G, N] int32, pad after EOS
    logprobs: jax.Array     # [B*G, N] float32, log pi(token), 0 where mask is 0
    mask: jax.Array         # [B*G, N] float32, 1 on response tokens (EOS included)
    lengths: jax.Array      # [B*G] int32
    truncated: jax.Array    # [B*G] bool, True if no EOS within N tokens


def filter_logits(logits, temperature, top_p, top_k: int | None = None):
    """Temperature, then top-k (static), then nucleus top-p (keeps the smallest prefix of the sorted
    distribution whose mass reaches top_p, ties at its last token included; always keeps the argmax)."""
    logits = logits.astype(jnp.float32) / jnp.maximum(temperature, 1e-6)
    if top_k:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    # top_p is traced (no recompile per value); the cond skips the nucleus in every decode step at 1.0
    return jax.lax.cond(top_p < 1.0, functools.partial(_nucleus, top_p=top_p), lambda x: x, logits)


def _nucleus(logits, top_p):
    """Mask every token below the nucleus threshold t*, the largest probability t with mass(p >= t) >= top_p
    (= the probability of the last token of the sorted prefix whose mass reaches top_p). Found by bisection
    over the float32 bit patterns of t (monotone for t >= 0): 31 passes of a compare-and-sum over the vocabulary
    instead of a full-vocabulary sort, which costs far more on a CPU."""
    probs = jax.nn.softmax(logits, axis=-1)
    bits = lambda x: jax.lax.bitcast_convert_type(x, jnp.int32)  # noqa: E731
    as_float = lambda b: jax.lax.bitcast_convert_type(b, jnp.float32)  # noqa: E731
    shape = logits.shape[:-1] + (1,)
    lo = jnp.zeros(shape, jnp.int32)                                   # t = 0 always qualifies
    hi = jnp.full(shape, bits(jnp.float32(1.0)) + 1, jnp.int32)         # t > 1 never does

    def halve(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        ok = jnp.sum(jnp.where(probs >= as_float(mid), probs, 0.0), axis=-1, keepdims=True) >= top_p
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo, _ = jax.lax.fori_loop(0, 31, halve, (lo, hi))
    return jnp.where(probs < as_float(lo), -jnp.inf, logits)


def draw(logits, key):
    """One token per row from softmax(logits) (-inf = excluded) by inverting the CDF with one uniform per row:
    the same distribution as `jax.random.categorical` (Gumbel-max), without its vocabulary-sized draw of random
    bits per row and step (several times slower on a CPU)."""
    cdf = jnp.cumsum(jax.nn.softmax(logits, axis=-1), axis=-1)
    total = cdf[..., -1:]
    # u < total strictly (u * total can round up to it), so the first cdf entry above u is a token with mass
    u = jnp.minimum(jax.random.uniform(key, total.shape, jnp.float32) * total, jnp.nextafter(total, 0.0))
    return jnp.sum(cdf <= u, axis=-1).astype(jnp.int32)


def _prefill(params, cfg: ModelConfig, prompt_tokens, prompt_lens, slots: int):
    """(last-column logits [B, 1, vocab], a cache of prompt_len + `slots` slots holding the prompts, lengths [B]) of
    left-padded prompts, each prefilled once (attending over the prompt's cache slots only)."""
    B0, prompt_len = prompt_tokens.shape
    lens0 = prompt_lens.astype(jnp.int32)
    valid0 = jnp.arange(prompt_len)[None, :] >= (prompt_len - lens0)[:, None]
    cache = init_cache(cfg, B0, prompt_len + slots)
    logits, cache = forward_cached(params, cfg, prompt_tokens, left_pad_positions(valid0), valid0, cache, 0,
                                   last_only=True, seen=prompt_len)
    return logits, cache, lens0


def _next_token(last, key, greedy: bool, temperature, top_p, top_k: int):
    """(token [B], its log-prob at temperature 1 [B]) drawn from the logits `last` [B, vocab]."""
    tok = (jnp.argmax(last, axis=-1).astype(jnp.int32) if greedy
           else draw(filter_logits(last, temperature, top_p, top_k), key))
    return tok, jnp.take_along_axis(jax.nn.log_softmax(last, axis=-1), tok[:, None], axis=-1)[:, 0]


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "num_samples", "top_k", "greedy",
                                             "greedy_first", "chunk"))
def sample(params, cfg: ModelConfig, prompt_tokens, prompt_lens, rng, *, max_new_tokens: int, eos_id,
           pad_id=0, temperature=1.0, top_p=1.0, top_k: int | None = None, greedy: bool = False,
           num_samples: int = 1, greedy_first: bool = False, chunk: int | None = None) -> Samples:
    """Sample `num_samples` responses for every left-padded prompt row.

    prompt_tokens [B, prompt_len] int32 (left padding), prompt_lens [B]. Each prompt is prefilled once and its
    KV cache copied to its G = `num_samples` rows (prefix sharing: 1/G of the prefill compute). Rows stop at
    their first `eos_id`; the loop exits as soon as every row has stopped or after `max_new_tokens` tokens.
    `greedy`: every row takes the argmax. `greedy_first`: the first row of each prompt's G takes the argmax and
    the other G - 1 sample (evaluation's greedy answer and its avg@k samples from one prefill).
    """
    G, N = num_samples, max_new_tokens
    B0, prompt_len = prompt_tokens.shape
    logits, cache, lens0 = _prefill(params, cfg, prompt_tokens, prompt_lens, N)
    share = lambda x, axis: jnp.repeat(x, G, axis=axis) if G > 1 else x  # noqa: E731  (rows of a prompt adjacent)
    cache = cache.repeat_rows(G)
    prompts, lens = share(prompt_tokens, 0), share(lens0, 0)
    B = B0 * G
    argmax_row = jnp.arange(B) % G == 0 if greedy_first else None

    def cond(state):
        i, _, _, _, _, done, _ = state
        return (i < N) & ~jnp.all(done)

    def body(state):
        i, cache, last, out_tok, out_lp, done, rng = state
        rng, key = jax.random.split(rng)
        if greedy:
            tok = jnp.argmax(last, axis=-1).astype(jnp.int32)
        else:
            tok = draw(filter_logits(last, temperature, top_p, top_k), key)
            if greedy_first:
                tok = jnp.where(argmax_row, jnp.argmax(last, axis=-1).astype(jnp.int32), tok)
        lp = jnp.take_along_axis(jax.nn.log_softmax(last, axis=-1), tok[:, None], axis=-1)[:, 0]
        tok = jnp.where(done, pad_id, tok)
        out_tok = out_tok.at[:, i].set(tok)
        out_lp = out_lp.at[:, i].set(jnp.where(done, 0.0, lp))
        alive = ~done
        done = done | (tok == eos_id)
        logits, cache = forward_cached(params, cfg, tok[:, None], (lens + i)[:, None], alive[:, None], cache,
                                       prompt_len + i, chunk=attn_chunk(chunk))
        return i + 1, cache, logits[:, -1], out_tok, out_lp, done, rng

    state = (jnp.int32(0), cache, share(logits[:, -1], 0), jnp.full((B, N), pad_id, jnp.int32),
             jnp.zeros((B, N), jnp.float32), jnp.zeros((B,), bool), rng)
    i, _, _, out_tok, out_lp, done, _ = jax.lax.while_loop(cond, body, state)

    # response mask: tokens up to and including the first EOS (all N tokens if none)
    is_eos = out_tok == eos_id
    eos_before = jnp.cumsum(is_eos, axis=1) - is_eos
    mask = ((eos_before == 0) & (jnp.arange(N)[None, :] < i)).astype(jnp.float32)
    return Samples(prompts, lens, out_tok, out_lp * mask, mask, mask.sum(1).astype(jnp.int32), ~done)


def sequences(samples: Samples):
    """Concatenate prompts and responses for a trainer forward pass.

    Returns tokens, valid, positions [B, prompt_len + N] and `response_mask` [B, prompt_len + N - 1]
    aligned with next-token targets (`tokens[:, 1:]`): 1 where the target is a response token.
    """
    tokens = jnp.concatenate([samples.prompts, samples.tokens], axis=1)
    prompt_len = samples.prompts.shape[1]
    prompt_valid = jnp.arange(prompt_len)[None, :] >= (prompt_len - samples.prompt_lens)[:, None]
    valid = jnp.concatenate([prompt_valid, samples.mask > 0], axis=1)
    positions = left_pad_positions(valid)
    response_mask = jnp.concatenate([jnp.zeros_like(samples.prompts[:, 1:], jnp.float32), samples.mask], axis=1)
    return tokens, valid, positions, response_mask


# ----------------------------------------------------------------------------------------------------
# Multi-turn episodes: the model's turns and the environment's observations share one KV cache.
#
# Slots are a timeline shared by all rows (one write index `t`, as in `sample`): in a turn every row that is still
# talking writes one token a step, the others write an empty (invalid) slot; an observation is one chunk of
# `W` slots, right-padded per row. Each row keeps its own rotary position (its real tokens so far) and attends
# only to its valid slots, so its tokens are exactly those of the compacted trajectory (prompt, turn,
# observation, turn, ...) re-encoded from scratch. Mamba layers would let an empty slot decay their state:
# multi-turn sampling refuses hybrid models (`check_episode_model`).


class Episodes(NamedTuple):
    cache: object          # KVCache over prompt_len + R slots
    last: jax.Array        # [B, vocab] float32 logits of each row's next token
    t: jax.Array           # int32: the next free slot (shared)
    pos: jax.Array         # [B] int32: each row's next rotary position = its real tokens so far
    used: jax.Array        # [B] int32: tokens after the prompt (the model's and the observations')
    tokens: jax.Array      # [B, R] int32: the token in slot prompt_len + j (pad when empty)
    kind: jax.Array        # [B, R] int8: 0 empty, 1 the model's, 2 an observation's
    logprobs: jax.Array    # [B, R] float32: log pi(token) at temperature 1 on the model's tokens, else 0
    talking: jax.Array     # [B] bool: still in its turn (after `decode_turn`: cut by a length limit)


EMPTY, MODEL, OBSERVATION = 0, 1, 2


def check_episode_model(cfg: ModelConfig) -> None:
    if cfg.layer_pattern and "M" in cfg.layer_pattern:
        raise ValueError("multi-turn sampling (max_turns > 1) needs a model without Mamba layers: an empty slot "
                         f"between turns would decay their state (layer_pattern={cfg.layer_pattern!r})")


@functools.partial(jax.jit, static_argnames=("cfg", "slots", "num_samples"))
def begin_episodes(params, cfg: ModelConfig, prompt_tokens, prompt_lens, *, slots: int,
                   num_samples: int = 1) -> Episodes:
    """Prefill the left-padded prompts once each, share each prompt's cache by its `num_samples` rows (adjacent),
    and leave `slots` empty slots after the prompts for turns and observations."""
    check_episode_model(cfg)
    B0, prompt_len = prompt_tokens.shape
    logits, cache, lens0 = _prefill(params, cfg, prompt_tokens, prompt_lens, slots)
    G = num_samples
    rows = lambda x: jnp.repeat(x, G, axis=0)  # noqa: E731
    B = B0 * G
    return Episodes(cache.repeat_rows(G), rows(logits[:, -1]), jnp.int32(prompt_len), rows(lens0),
                    jnp.zeros((B,), jnp.int32), jnp.zeros((B, slots), jnp.int32), jnp.zeros((B, slots), jnp.int8),
                    jnp.zeros((B, slots), jnp.float32), jnp.zeros((B,), bool))


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "top_k", "greedy", "chunk"),
                   donate_argnames=("ep",))
def decode_turn(params, cfg: ModelConfig, ep: Episodes, talking, rng, *, max_new_tokens: int, budget, stop_ids,
                pad_id=0, temperature=1.0, top_p=1.0, top_k: int | None = None, greedy: bool = False,
                chunk: int | None = None) -> Episodes:
    """One turn of the rows in `talking` [B] bool: each draws tokens until one of `stop_ids` (included), its
    `max_new_tokens` for this turn, its `budget` of tokens after the prompt, or the last slot. The other rows idle
    (empty slots). Returns the episodes with `talking` True on the rows that were cut by a limit."""
    prompt_len = ep.cache.valid.shape[1] - ep.tokens.shape[1]
    slots = ep.cache.valid.shape[1]
    stop_ids = jnp.asarray(stop_ids, jnp.int32)

    def cond(state):
        i, ep, _ = state
        return (i < max_new_tokens) & (ep.t < slots) & jnp.any(ep.talking)

    def body(state):
        i, ep, rng = state
        rng, key = jax.random.split(rng)
        on = ep.talking
        tok, lp = _next_token(ep.last, key, greedy, temperature, top_p, top_k)
        tok = jnp.where(on, tok, pad_id)
        j = ep.t - prompt_len
        logits, cache = forward_cached(params, cfg, tok[:, None], ep.pos[:, None], on[:, None], ep.cache, ep.t,
                                       chunk=attn_chunk(chunk))
        used = ep.used + on
        stopped = on & jnp.any(tok[:, None] == stop_ids[None, :], axis=1)
        ep = ep._replace(
            cache=cache, last=jnp.where(on[:, None], logits[:, -1], ep.last), t=ep.t + 1, pos=ep.pos + on,
            used=used, tokens=ep.tokens.at[:, j].set(tok), kind=ep.kind.at[:, j].set(jnp.where(on, MODEL, EMPTY)),
            logprobs=ep.logprobs.at[:, j].set(jnp.where(on, lp, 0.0)), talking=on & ~stopped & (used < budget))
        return i + 1, ep, rng

    _, ep, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), ep._replace(talking=talking & (ep.used < budget)), rng))
    return ep


@functools.partial(jax.jit, static_argnames=("cfg", "chunk"), donate_argnames=("ep",))
def append_observations(params, cfg: ModelConfig, ep: Episodes, obs_tokens, obs_lens,
                        chunk: int | None = None) -> Episodes:
    """Write each row's observation (`obs_tokens` [B, W], its first `obs_lens` [B] tokens real; 0 = none) into the
    next W slots and encode them in one pass; a row's next token is then drawn after its observation's last token.
    The caller checks that W slots are left."""
    prompt_len = ep.cache.valid.shape[1] - ep.tokens.shape[1]
    W = obs_tokens.shape[1]
    lens = obs_lens.astype(jnp.int32)
    valid = jnp.arange(W)[None, :] < lens[:, None]
    logits, cache = forward_cached(params, cfg, obs_tokens, ep.pos[:, None] + jnp.arange(W)[None, :], valid,
                                   ep.cache, ep.t, chunk=attn_chunk(chunk))
    at_last = jnp.take_along_axis(logits, jnp.maximum(lens - 1, 0)[:, None, None], axis=1)[:, 0]
    j = ep.t - prompt_len
    put = lambda a, x: jax.lax.dynamic_update_slice_in_dim(a, x.astype(a.dtype), j, axis=1)  # noqa: E731
    return ep._replace(cache=cache, last=jnp.where((lens > 0)[:, None], at_last, ep.last), t=ep.t + W,
                       pos=ep.pos + lens, used=ep.used + lens, tokens=put(ep.tokens, jnp.where(valid, obs_tokens, 0)),
                       kind=put(ep.kind, jnp.where(valid, OBSERVATION, EMPTY)),
                       logprobs=put(ep.logprobs, jnp.zeros(valid.shape, jnp.float32)))
