"""On-policy rollouts shared by the RL stage kinds (GRPO, MOPD): draw prompts, sample G completions each
from the current params with the jitted sampler, score them with each prompt's domain reward, and turn
the samples into fixed-width training rows.

    source = RolloutSource(ctx, stage, data_iter, epoch_len, epoch_filter=None, rewards=None)
    groups, stats = source.sample(params, source.prompts(B), max_new_tokens, rng)
    batch = trim_columns(flat_batch)     # cut all-padding columns, in buckets (few compiled shapes)

`groups` holds arrays with leading dims [P, G]: tokens / valid / positions [P, G, L] (prompt + response),
mask / sampler_logp [P, G, L-1] aligned with next-token targets, rewards, truncated, lengths [P, G], and
domain_idx [P] (index into `ctx.cfg.data.domains`). `stats` holds timings (generate_s, score_s) and the
verifier calls that timed out, raised or crashed (verifier_timeouts / _errors / _crashes, each scored 0):
counts that add up over rounds and land in metrics.jsonl.
"""
from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np

from nemocascade import evaluation, sampling
from nemocascade.data import pipeline
from nemocascade.rl import filters
from nemocascade.mesh import shard_batch, to_host
from nemocascade.rewards.pool import OUTCOMES


class RolloutSource:
    """Draws prompts (skipping ones the C1 epoch filter dropped), samples G rollouts each, scores them.

    `rewards`: domain -> reward function for this stage (default: each domain's registered reward).
    Its state (`state_dict`) goes into the stage checkpoint, so a resumed stage draws the same prompts."""

    def __init__(self, ctx, stage, data_iter, epoch_len: int, epoch_filter=None, rewards=None, scorer=None):
        self.ctx, self.stage, self.data_iter, self.epoch_len = ctx, stage, data_iter, epoch_len
        self.epoch_filter, self.rewards = epoch_filter, rewards
        self.scorer = scorer  # (records, texts, lengths [P, G]) -> rewards [P, G]: a reward model instead of verifiers
        self.drawn = 0
        self._pending: list[dict] = []

    def state_dict(self):
        return {"drawn": self.drawn, "pending": self._pending,
                "epoch_filter": self.epoch_filter.state_dict() if self.epoch_filter else None}

    def load_state_dict(self, d):
        self.drawn, self._pending = d["drawn"], d["pending"]
        if self.epoch_filter and d.get("epoch_filter"):
            self.epoch_filter.load_state_dict(d["epoch_filter"])

    def prompts(self, n: int) -> list[dict]:
        out = []
        for _ in range(1000 * n):  # bounded even if the epoch filter dropped nearly everything
            if len(out) == n:
                break
            if not self._pending:
                self._pending = list(next(self.data_iter))
            rec = self._pending.pop(0)
            self.drawn += 1
            if self.epoch_filter and self.drawn % self.epoch_len == 0:
                self.epoch_filter.end_epoch()
            if self.epoch_filter is None or self.epoch_filter.keep(rec["id"]):
                out.append(rec)
        return out

    def sample(self, params, records, max_new: int, rng, score: bool = True):
        """Sample G rollouts per record from `params` and (if `score`) score them -> (groups, stats) as in the
        module docstring: groups' arrays have leading dims [P, G], P = len(records); unscored rewards are NaN."""
        ctx, stage, G = self.ctx, self.stage, self.stage.group_size
        t0 = time.perf_counter()
        max_prompt = stage.max_prompt_len or ctx.cfg.eval.max_prompt_len
        toks, lens = pipeline.encode_prompts(ctx.tokenizer, [r["prompt"] for r in records], max_prompt,
                                             thinking=ctx.cfg.thinking, bucket=sampling.PROMPT_BUCKET)
        toks, lens = shard_batch(ctx.mesh, (toks, lens))
        samples = sampling.sample(params, ctx.model_cfg, toks, lens, rng,
                                  max_new_tokens=max_new, eos_id=ctx.tokenizer.eos_id, pad_id=ctx.tokenizer.pad_id,
                                  temperature=stage.temperature, top_p=stage.top_p, top_k=stage.top_k,
                                  num_samples=G)
        # back to the stage's full prompt width (left padding), so refill rounds of other widths concatenate;
        # the trainer's batch cuts the all-padding columns again (trim_columns)
        samples = widen_prompts(samples, max_prompt, ctx.tokenizer.pad_id)
        samples, seqs = to_host((samples, sampling.sequences(samples)))
        t1 = time.perf_counter()
        P = len(records)
        verifier = {f"verifier_{k}": 0 for k in OUTCOMES}  # a reward model (scorer) is no verifier: 0
        if score:
            texts = evaluation.decode_responses(ctx.tokenizer, samples.tokens, samples.mask, ctx.cfg.thinking)
            if self.scorer is not None:
                rewards = np.asarray(self.scorer(records, texts, samples.lengths.reshape(P, G)), np.float32)
            else:
                scores, verifier = evaluation.score_texts(ctx.pool, texts, [r for r in records for _ in range(G)],
                                                          self.rewards)
                rewards = np.asarray(scores, np.float32).reshape(P, G)
        else:
            rewards = np.full((P, G), np.nan, np.float32)
        t2 = time.perf_counter()
        domain_index = {d: i for i, d in enumerate(ctx.cfg.data.domains)}
        groups = to_groups(samples, seqs, rewards, [domain_index[r["domain"]] for r in records])
        if self.epoch_filter and score:
            self.epoch_filter.update([r["id"] for r in records], rewards)
        return groups, {"generate_s": t1 - t0, "score_s": t2 - t1, **verifier}


def widen_prompts(samples: sampling.Samples, width: int, pad_id: int) -> sampling.Samples:
    """`samples` with its prompts left-padded to `width` columns (the sampler saw them cut to a bucket)."""
    left = width - samples.prompts.shape[1]
    return samples._replace(prompts=jnp.pad(samples.prompts, ((0, 0), (left, 0)), constant_values=pad_id))


def to_groups(samples: sampling.Samples, seqs, rewards, domain_idx) -> dict:
    """Host samples of P prompts x G and their `sampling.sequences` -> the groups dict of the module docstring
    (leading dims [P, G]); `rewards` [P, G], `domain_idx` [P]."""
    P, G = np.shape(rewards)
    tokens, valid, positions, rmask = seqs
    shape = lambda x: np.asarray(x).reshape(P, G, *np.shape(x)[1:])  # noqa: E731
    sampler_logp = np.concatenate([np.zeros_like(samples.prompts[:, 1:], np.float32), samples.logprobs], 1)
    return {"tokens": shape(tokens), "valid": shape(valid), "positions": shape(positions),
            "mask": shape(rmask), "sampler_logp": shape(sampler_logp), "rewards": rewards,
            "truncated": shape(samples.truncated), "lengths": shape(samples.lengths),
            "domain_idx": np.asarray(domain_idx)}


def bucket_width(n: int, bucket: int) -> int:
    """The smallest width >= n on the ladder bucket x {1, 2, 3, 4, 6, 8, 12, 16, ...} (two steps per octave):
    at most 1.5x the columns needed, and a step's width takes one of ~2 log2(L / bucket) values, so a run
    compiles its train step a handful of times instead of once per multiple of `bucket`."""
    m = 1
    while bucket * m < n:
        m = m * 3 // 2 if m >= 2 and (m & (m - 1)) == 0 else (m // 3) * 4 if m % 3 == 0 else m * 2
    return bucket * m


def trim_columns(batch: dict, bucket: int = 16) -> dict:
    """Cut the columns that are padding in every row (left of the longest prompt, right of the longest
    response), keeping a width from `bucket_width`'s ladder (at most the batch's own width) so only a few
    shapes are ever compiled. Keys tokens/valid/positions are [N, L]; other 2-D keys are [N, L-1]
    (next-token aligned)."""
    used = np.flatnonzero(batch["valid"].any(0))
    if used.size == 0:
        used = np.arange(1)
    width = batch["tokens"].shape[1]
    lo, hi = int(used[0]), int(used[-1]) + 1
    keep = min(width, max(bucket_width(hi - lo, bucket), 2))
    lo = min(lo, width - keep)  # widen to the left first (prompts are left-padded), then to the right
    hi = lo + keep
    return {k: v[:, lo:hi] if k in ("tokens", "valid", "positions") else v[:, lo:hi - 1] if v.ndim == 2 else v
            for k, v in batch.items()}


def rollout_metrics(groups, domains):
    """Statistics of the on-policy sample (first round, before any filter), per domain."""
    r = groups["rewards"]
    m = {"reward": float(r.mean()), "zero_var_frac": float(1 - filters.dynamic_filter_keep(r).mean()),
         "response_len": float(groups["lengths"].mean()), "truncation_rate": float(groups["truncated"].mean())}
    for i, d in enumerate(domains):
        sel = groups["domain_idx"] == i
        if sel.any():
            m[f"reward/{d}"] = float(r[sel].mean())
            m[f"pass_rate/{d}"] = float((r[sel] >= 1.0).mean())
    return m
