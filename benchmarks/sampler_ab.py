"""Sampler A/B between two checkouts on the same machine (the README's "what this stop's sampler changes bought"):

    git worktree add /tmp/old fa01273
    for r in 1 2; do
      python benchmarks/sampler_ab.py /tmp/old /tmp/old_$r.json; python benchmarks/sampler_ab.py . /tmp/new_$r.json
    done

Or the decode attention, dense against chunked, in one checkout (a fourth argument: `chunk`, 0 = dense):

    for r in 1 2; do
      python benchmarks/sampler_ab.py . /tmp/dense_$r.json /tmp/smollm2_hf 0
      python benchmarks/sampler_ab.py . /tmp/chunked_$r.json /tmp/smollm2_hf 128
    done

REPO's nemocascade samples SmolLM2-135M (an HF directory, default /tmp/smollm2_hf, written by benchmarks/speed.py)
at batch 1 / 8 / 32, 4 prompts x 8 samples and batch 8 at top-p 0.95: 64-token random prompts, 128 new tokens, no
EOS; one compile call, then the median of 3 timed calls. Prints and writes tok/s per shape.
"""

import json
import statistics
import sys
import time

sys.path.insert(0, sys.argv[1])  # REPO's nemocascade, before any installed one

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from nemocascade import sampling  # noqa: E402
from nemocascade.models import hf  # noqa: E402

SHAPES = ((1, 1, 1.0), (8, 1, 1.0), (32, 1, 1.0), (4, 8, 1.0), (8, 1, 0.95))  # prompts, samples each, top-p


def main():
    cfg, params = hf.load(sys.argv[3] if len(sys.argv) > 3 else "/tmp/smollm2_hf")
    chunk = {"chunk": int(sys.argv[4])} if len(sys.argv) > 4 else {}  # (an older checkout's sample has no chunk)
    rng = np.random.default_rng(0)
    out = {}
    for p, g, top_p in SHAPES:
        toks = jnp.asarray(rng.integers(10, cfg.vocab_size, (p, 64)), jnp.int32)
        lens = jnp.full((p,), 64, jnp.int32)

        def call(k):
            t = time.perf_counter()
            jax.block_until_ready(sampling.sample(params, cfg, toks, lens, jax.random.key(k), max_new_tokens=128,
                                                  eos_id=-1, num_samples=g, top_p=top_p, **chunk).tokens)
            return time.perf_counter() - t

        compile_s = call(0)
        reps = [call(r + 1) for r in range(3)]
        tok_s = p * g * 128 / statistics.median(reps)
        out[f"{p}x{g} top_p={top_p}"] = {"tok_s": tok_s, "reps": reps, "compile_s": compile_s}
        print(sys.argv[1], p, g, top_p, round(tok_s, 1), flush=True)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
