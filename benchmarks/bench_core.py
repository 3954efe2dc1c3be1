"""Throughput of the SFT step and the sampler for a config's model, on this machine.

    python benchmarks/bench_core.py --config=sft_math [--batch=32 --seq=128 --new=96 --steps=20]

Prints tokens/s (after compilation; the compile time is printed separately).
"""
import argparse
import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from nemocascade import configs, optim, sampling, train_state  # noqa: E402
from nemocascade.models import ModelConfig, count_params, init_params  # noqa: E402
from nemocascade.stages import sft  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="sft_math")
    ap.add_argument("--vocab", type=int, default=384)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--samples", type=int, default=128, help="rows decoded at once")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    cfg = configs.load(a.config)
    mcfg = ModelConfig.from_dict({**cfg.model.to_dict(), "vocab_size": a.vocab})
    params = init_params(mcfg, jax.random.key(0))
    print(f"{a.config}: {count_params(params) / 1e6:.2f}M params, backend {jax.default_backend()}, "
          f"{jax.device_count()} device(s)")

    tx, _ = optim.make_optimizer(cfg.stages[next(iter(cfg.stages))].optim, 1000)
    state = train_state.create(params, tx, jax.random.key(0))
    step = jax.jit(train_state.make_step(functools.partial(sft.sft_loss, model_cfg=mcfg), tx), donate_argnums=0)
    rng = np.random.default_rng(0)
    batch = {"tokens": jnp.asarray(rng.integers(1, a.vocab, (a.batch, a.seq)), jnp.int32),
             "loss_mask": jnp.ones((a.batch, a.seq), jnp.float32)}
    t = time.perf_counter()
    state, m = step(state, batch)
    jax.block_until_ready(m)
    print(f"sft step compile+first: {time.perf_counter() - t:.2f}s")
    t = time.perf_counter()
    for _ in range(a.steps):
        state, m = step(state, batch)
    jax.block_until_ready(m)
    dt = (time.perf_counter() - t) / a.steps
    print(f"sft step: {dt * 1e3:.1f} ms, {a.batch * (a.seq - 1) / dt:,.0f} tokens/s (batch {a.batch} x seq {a.seq})")

    prompts = jnp.asarray(rng.integers(1, a.vocab, (a.samples, a.prompt)), jnp.int32)
    lens = jnp.full((a.samples,), a.prompt, jnp.int32)
    kw = dict(max_new_tokens=a.new, eos_id=-1)  # no EOS: every row decodes all `new` tokens
    t = time.perf_counter()
    jax.block_until_ready(sampling.sample(state.params, mcfg, prompts, lens, jax.random.key(1), **kw))
    print(f"sampler compile+first: {time.perf_counter() - t:.2f}s")
    reps = 3
    t = time.perf_counter()
    for i in range(reps):
        out = sampling.sample(state.params, mcfg, prompts, lens, jax.random.key(2 + i), **kw)
    jax.block_until_ready(out)
    dt = (time.perf_counter() - t) / reps
    print(f"sampler: {dt:.2f}s per call, {a.samples * a.new / dt:,.0f} generated tokens/s "
          f"({a.samples} rows x {a.new} new tokens, prompt {a.prompt})")


if __name__ == "__main__":
    main()
