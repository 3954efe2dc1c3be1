"""Does the multi-turn sampler keep its speed? Model tokens per second of three ways to make the same tokens:

    one turn      `sampling.sample`: T x N tokens in one decode loop (the single-turn rollout of the same length)
    kept cache    `sampling.begin_episodes`, then T turns of `decode_turn` (N tokens each) with `append_observations`
                  of W observation tokens between them: one cache for the whole episode (rl/episodes.py)
    turns only    the kept cache's T turns without the observations (their slots stay empty): the pause between
                  turns without the cost of encoding what the environment said
    re-encode     T calls of `sampling.sample`, each prefilling the whole trajectory so far (prompt, turns and
                  observations) and decoding N tokens: what a sampler without a kept cache pays

    python benchmarks/episodes.py [--rows=64] [--prompt_len=128] [--turns=3] [--new=64] [--obs=64] [--reps=3]
        [--d_model=128 --layers=4 --vocab=700] [--chunk=128]

Each way is timed twice: with the dense decode attention (every step reads the whole cache) and with the chunked
one (`--chunk` slots a read, up to the filled slots only: the CPU default, `sampling.ATTN_CHUNK`).

No EOS (every row makes every token), random weights of the given size (speed does not depend on them), the
environment instant (its time is the environment's, not the sampler's). One compile call, then `reps` timed calls;
medians. Time it on an idle machine only.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from nemocascade import sampling  # noqa: E402
from nemocascade.models import transformer as tf  # noqa: E402


def timed(fn, reps: int) -> tuple[float, list[float]]:
    t = time.perf_counter()
    jax.block_until_ready(fn(0))
    compile_s = time.perf_counter() - t
    out = []
    for r in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn(r + 1))
        out.append(time.perf_counter() - t)
    return compile_s, out


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(rows=64, prompt_len=128, turns=3, new=64, obs=64, reps=3, d_model=128, layers=4,
                     vocab=700, chunk=sampling.ATTN_CHUNK).items():
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--out", default=None, help="write the result as JSON here")
    a = ap.parse_args()
    heads = max(a.d_model // 32, 1)
    cfg = tf.ModelConfig(vocab_size=a.vocab, d_model=a.d_model, n_layers=a.layers, n_heads=heads,
                         n_kv_heads=max(heads // 2, 1), head_dim=32, d_ff=3 * a.d_model)
    params = tf.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    B, P, T, N, W = a.rows, a.prompt_len, a.turns, a.new, a.obs
    prompts = jnp.asarray(rng.integers(10, a.vocab, (B, P)), jnp.int32)
    lens = jnp.full((B,), P, jnp.int32)
    obs = jnp.asarray(rng.integers(10, a.vocab, (B, W)), jnp.int32)
    obs_lens = jnp.full((B,), W, jnp.int32)
    no_stop = np.asarray([-1], np.int32)

    def one_turn(seed, chunk):
        return sampling.sample(params, cfg, prompts, lens, jax.random.key(seed), max_new_tokens=T * N,
                               eos_id=-1, chunk=chunk).tokens

    def kept_cache(seed, chunk, observe=True):
        ep = sampling.begin_episodes(params, cfg, prompts, lens, slots=T * (N + W))
        talking = jnp.ones((B,), bool)
        for t in range(T):
            ep = sampling.decode_turn(params, cfg, ep, talking, jax.random.key(seed * 10 + t), max_new_tokens=N,
                                      budget=T * (N + W), stop_ids=no_stop, chunk=chunk)
            if t + 1 < T and observe:
                ep = sampling.append_observations(params, cfg, ep, obs, obs_lens, chunk=chunk)
        return ep.tokens

    def turns_only(seed, chunk):
        return kept_cache(seed, chunk, observe=False)

    def re_encode(seed, chunk):
        seq = prompts
        for t in range(T):
            out = sampling.sample(params, cfg, seq, jnp.full((B,), seq.shape[1], jnp.int32),
                                  jax.random.key(seed * 10 + t), max_new_tokens=N, eos_id=-1, chunk=chunk)
            seq = jnp.concatenate([seq, out.tokens] + ([obs] if t + 1 < T else []), axis=1)
        return seq

    model_tokens = B * T * N
    res = {"shape": vars(a), "backend": jax.default_backend(), "params": tf.count_params(params)}
    ways = ("one_turn", "turns_only", "kept_cache", "re_encode")
    for attn, chunk in (("dense", 0), ("chunked", a.chunk)):
        res[attn] = {}
        for name, fn in zip(ways, (one_turn, turns_only, kept_cache, re_encode)):
            compile_s, reps = timed(lambda seed: fn(seed, chunk), a.reps)  # noqa: B023
            res[attn][name] = {"tok_s": model_tokens / statistics.median(reps), "rep_s": reps, "compile_s": compile_s}
        for name in ways[1:]:
            res[attn][name]["vs_one_turn"] = res[attn][name]["tok_s"] / res[attn]["one_turn"]["tok_s"]
        res[attn]["kept_over_re_encode"] = res[attn]["kept_cache"]["tok_s"] / res[attn]["re_encode"]["tok_s"]
    res["kept_chunked_over_dense_one_turn"] = res["chunked"]["kept_cache"]["tok_s"] / res["dense"]["one_turn"]["tok_s"]
    print(f"{B} rows, prompt {P}, {T} turns x {N} tokens, observations of {W}, {res['params'] / 1e6:.2f}M params "
          f"({jax.default_backend()}); model tokens/s, median of {a.reps}:")
    print(f"  {'':<11} {'dense':>10} {'chunked ' + str(a.chunk):>22}")
    for name in ways:
        cells = []
        for attn in ("dense", "chunked"):
            r = res[attn][name]
            cells.append(f"{r['tok_s']:10.0f}" + (f" ({r['vs_one_turn']:.2f}x)" if "vs_one_turn" in r else " " * 8))
        print(f"  {name:<11} " + "    ".join(cells))
    for attn in ("dense", "chunked"):
        print(f"  {attn}: kept cache / re-encode {res[attn]['kept_over_re_encode']:.2f}x")
    print(f"  kept cache chunked / one turn dense (the sampler before chunking): "
          f"{res['kept_chunked_over_dense_one_turn']:.2f}x")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
