"""Held-out evaluation of one domain: sample (greedy by default) on the test split, score with the
domain's reward in the verifier pool, report pass@1 (mean reward) and n."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from nemocascade import chat, sampling
from nemocascade.data import pipeline
from nemocascade.rewards import get_reward


def generate(params, model_cfg, tokenizer, records, *, batch_size, max_prompt_len, max_new_tokens,
             rng, thinking=True, greedy=True, temperature=1.0, top_p=1.0, num_samples=1):
    """Completions (decoded text, think-prefix included in thinking mode) for `records`, in order,
    `num_samples` per record (adjacent). Batches are padded to `batch_size` so one compiled sampler
    serves every batch."""
    texts, prefix = [], (chat.THINK_OPEN + "\n") if thinking else ""
    for start in range(0, len(records), batch_size):
        chunk = records[start:start + batch_size]
        prompts = [r["prompt"] for r in chunk]
        prompts += [prompts[-1]] * (batch_size - len(chunk))
        toks, lens = pipeline.encode_prompts(tokenizer, prompts, max_prompt_len, thinking=thinking)
        out = sampling.sample(params, model_cfg, jnp.asarray(toks), jnp.asarray(lens),
                              jax.random.fold_in(rng, start), max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_id,
                              pad_id=tokenizer.pad_id, temperature=temperature, top_p=top_p,
                              greedy=greedy, num_samples=num_samples)
        tokens, mask = np.asarray(out.tokens), np.asarray(out.mask)
        for row in range(len(chunk) * num_samples):
            texts.append(prefix + tokenizer.decode(tokens[row][mask[row] > 0].tolist()))
    return texts


def evaluate_domain(params, model_cfg, tokenizer, records, domain, pool, *, batch_size, max_prompt_len,
                    max_new_tokens, rng, thinking=True):
    """Greedy pass@1 on `records` (dicts with prompt/answer). Returns {"pass@1", "n", "mean_len"}."""
    texts = generate(params, model_cfg, tokenizer, records, batch_size=batch_size,
                     max_prompt_len=max_prompt_len, max_new_tokens=max_new_tokens, rng=rng,
                     thinking=thinking)
    scores = pool.score(get_reward(domain), [(t, r["answer"]) for t, r in zip(texts, records)])
    return {"pass@1": float(np.mean(scores)) if scores else 0.0, "n": len(records),
            "mean_len": float(np.mean([len(tokenizer.encode(t)) for t in texts])) if texts else 0.0}
