"""Jitted sampling: one prefill over the left-padded prompts, then a `lax.while_loop` of single-token
decode steps over the KV cache.

Returns, per response, the sampled tokens and the log-prob of each under the model at temperature 1
(`log_softmax(logits)`, the distribution the trainer's `forward` computes). With T = 1 and top-p = 1
(GRPO's setting) this is the sampling distribution itself; the trainer compares it against its own
full-forward log-probs as the sampler-vs-trainer mismatch metric (MOPD's pi_inf).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from nemocascade.models.transformer import ModelConfig, forward_cached, init_cache, left_pad_positions


class Samples(NamedTuple):
    prompts: jax.Array      # [B*G, prompt_len] int32, left-padded (each prompt repeated G times, adjacent)
    prompt_lens: jax.Array  # [B*G] int32
    tokens: jax.Array       # [B*G, N] int32, pad after EOS
    logprobs: jax.Array     # [B*G, N] float32, log pi(token), 0 where mask is 0
    mask: jax.Array         # [B*G, N] float32, 1 on response tokens (EOS included)
    lengths: jax.Array      # [B*G] int32
    truncated: jax.Array    # [B*G] bool, True if no EOS within N tokens


def filter_logits(logits, temperature, top_p, top_k: int = 0):
    """Temperature, then top-k (static), then nucleus top-p (keeps the smallest prefix of the sorted
    distribution whose mass reaches top_p; always keeps the argmax)."""
    logits = logits.astype(jnp.float32) / jnp.maximum(temperature, 1e-6)
    if top_k:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)

    def nucleus(logits):
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p
        threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        return jnp.where(logits < threshold, -jnp.inf, logits)

    # top_p is traced (no recompile per value); the cond skips the vocab sort in every decode step at 1.0
    return jax.lax.cond(top_p < 1.0, nucleus, lambda x: x, logits)


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "num_samples", "top_k", "greedy"))
def sample(params, cfg: ModelConfig, prompt_tokens, prompt_lens, rng, *, max_new_tokens: int, eos_id,
           pad_id=0, temperature=1.0, top_p=1.0, top_k: int = 0, greedy: bool = False,
           num_samples: int = 1) -> Samples:
    """Sample `num_samples` responses for every left-padded prompt row.

    prompt_tokens [B, prompt_len] int32 (left padding), prompt_lens [B]. Rows stop at their first `eos_id`;
    the loop exits as soon as every row has stopped or after `max_new_tokens` tokens.
    """
    G, N = num_samples, max_new_tokens
    prompts = jnp.repeat(prompt_tokens, G, axis=0)
    lens = jnp.repeat(prompt_lens.astype(jnp.int32), G, axis=0)
    B, prompt_len = prompts.shape
    valid = jnp.arange(prompt_len)[None, :] >= (prompt_len - lens)[:, None]
    cache = init_cache(cfg, B, prompt_len + N)
    logits, cache = forward_cached(params, cfg, prompts, left_pad_positions(valid), valid, cache, 0)

    def cond(state):
        i, _, _, _, _, done, _ = state
        return (i < N) & ~jnp.all(done)

    def body(state):
        i, cache, last, out_tok, out_lp, done, rng = state
        rng, key = jax.random.split(rng)
        if greedy:
            tok = jnp.argmax(last, axis=-1).astype(jnp.int32)
        else:
            tok = jax.random.categorical(key, filter_logits(last, temperature, top_p, top_k)).astype(jnp.int32)
        lp = jnp.take_along_axis(jax.nn.log_softmax(last, axis=-1), tok[:, None], axis=-1)[:, 0]
        tok = jnp.where(done, pad_id, tok)
        out_tok = out_tok.at[:, i].set(tok)
        out_lp = out_lp.at[:, i].set(jnp.where(done, 0.0, lp))
        alive = ~done
        done = done | (tok == eos_id)
        logits, cache = forward_cached(params, cfg, tok[:, None], (lens + i)[:, None], alive[:, None], cache,
                                       prompt_len + i)
        return i + 1, cache, logits[:, -1], out_tok, out_lp, done, rng

    state = (jnp.int32(0), cache, logits[:, -1], jnp.full((B, N), pad_id, jnp.int32),
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
