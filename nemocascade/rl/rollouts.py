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

import jax
import jax.numpy as jnp
import numpy as np

from nemocascade import envs, evaluation, sampling
from nemocascade.data import pipeline
from nemocascade.rl import episodes, filters
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
        module docstring: groups' arrays have leading dims [P, G], P = len(records); unscored rewards are NaN.

        The records go to the sampler in `stage.score_overlap` equal chunks (the largest divisor of P at most
        that): chunk c+1 is dispatched before chunk c is scored, so the verifiers run while the device generates
        (`pipelined`). One chunk samples all P prompts with `rng` itself; chunk c of several uses fold_in(rng, c)."""
        ctx, stage, G = self.ctx, self.stage, self.stage.group_size
        if stage.get("max_turns", 1) > 1:
            return self._episodes(params, records, max_new, rng)
        P = len(records)
        n = chunk_count(P, stage.score_overlap)
        k = P // n
        max_prompt = stage.max_prompt_len or ctx.cfg.eval.max_prompt_len

        def generate(c):
            part = records[c * k:(c + 1) * k]
            toks, lens = pipeline.encode_prompts(ctx.tokenizer, [r["prompt"] for r in part], max_prompt,
                                                 thinking=ctx.cfg.thinking, bucket=sampling.PROMPT_BUCKET)
            toks, lens = shard_batch(ctx.mesh, (toks, lens))
            samples = sampling.sample(params, ctx.model_cfg, toks, lens, rng if n == 1 else jax.random.fold_in(rng, c),
                                      max_new_tokens=max_new, eos_id=ctx.tokenizer.eos_id,
                                      pad_id=ctx.tokenizer.pad_id, temperature=stage.temperature,
                                      top_p=stage.top_p, top_k=stage.top_k, num_samples=G)
            # back to the stage's full prompt width (left padding), so chunks and refill rounds of other widths
            # concatenate; the trainer's batch cuts the all-padding columns again (trim_columns)
            samples = widen_prompts(samples, max_prompt, ctx.tokenizer.pad_id)
            return samples, sampling.sequences(samples)  # device arrays: JAX dispatches and returns at once

        def score_chunk(c, host):
            samples, seqs = host
            rewards, domain_idx, verifier = self._score(records[c * k:(c + 1) * k], samples, score)
            return to_groups(samples, seqs, rewards, domain_idx), verifier

        parts, timing = pipelined(n, generate, score_chunk)
        groups = {key: np.concatenate([g[key] for g, _ in parts]) for key in parts[0][0]}
        verifier = {key: sum(v[key] for _, v in parts) for key in parts[0][1]}
        if self.epoch_filter and score:
            self.epoch_filter.update([r["id"] for r in records], groups["rewards"])
        return groups, {**timing, **verifier}

    def _episodes(self, params, records, max_new: int, rng):
        """Multi-turn rollouts (rl/episodes.py): G episodes per record in its domain's environment, rewarded by
        the environment -> (groups, stats with the agent metrics: turns, tool errors, environment seconds)."""
        ctx, stage = self.ctx, self.stage
        t = time.perf_counter()
        settings = episode_settings(stage, max_new, ctx)
        traj = episodes.run_episodes(params, ctx.model_cfg, ctx.tokenizer, records,
                                     [envs.env_name(r["domain"], stage.envs) for r in records], settings, rng,
                                     ctx.mesh, stage.group_size)
        domain_index = {d: i for i, d in enumerate(ctx.cfg.data.domains)}
        groups = episodes.trajectory_groups(traj, [domain_index[r["domain"]] for r in records], stage.group_size,
                                            settings.max_prompt_len, settings.budget)
        if self.epoch_filter:
            self.epoch_filter.update([r["id"] for r in records], groups["rewards"])
        wall = time.perf_counter() - t
        stats = {"generate_s": wall - traj.env_s, "score_s": traj.env_s, "score_overlap_s": 0.0}
        return groups, stats | {f"verifier_{k}": 0 for k in OUTCOMES} | episodes.episode_metrics(traj)

    def _score(self, records, samples, score: bool):
        """(rewards [P, G], domain indices [P], verifier counts) of host `samples` for `records`."""
        ctx, G, P = self.ctx, self.stage.group_size, len(records)
        verifier = {f"verifier_{k}": 0 for k in OUTCOMES}  # a reward model (scorer) is no verifier: 0
        if not score:
            rewards = np.full((P, G), np.nan, np.float32)
        else:
            texts = evaluation.decode_responses(ctx.tokenizer, samples.tokens, samples.mask, ctx.cfg.thinking)
            if self.scorer is not None:
                rewards = np.asarray(self.scorer(records, texts, samples.lengths.reshape(P, G)), np.float32)
            else:
                scores, verifier = evaluation.score_texts(ctx.pool, texts, [r for r in records for _ in range(G)],
                                                          self.rewards)
                rewards = np.asarray(scores, np.float32).reshape(P, G)
        domain_index = {d: i for i, d in enumerate(ctx.cfg.data.domains)}
        return rewards, [domain_index[r["domain"]] for r in records], verifier


def episode_settings(stage, max_new: int, ctx, greedy: bool = False) -> episodes.Settings:
    """A multi-turn stage's budgets (stage keys max_turns, max_total_tokens, max_obs_tokens, env_workers,
    stop_tokens)."""
    return episodes.Settings(
        max_turns=stage.max_turns, max_new_tokens=max_new, max_total_tokens=stage.max_total_tokens,
        max_obs_tokens=stage.max_obs_tokens,
        max_prompt_len=stage.max_prompt_len or ctx.cfg.eval.max_prompt_len, temperature=stage.temperature,
        top_p=stage.top_p, top_k=stage.top_k, greedy=greedy, thinking=ctx.cfg.thinking, workers=stage.env_workers,
        stop_tokens=tuple(stage.stop_tokens))


def chunk_count(P: int, most: int) -> int:
    """The largest divisor of P that is at most `most` (>= 1): equal chunks, one compiled sampler shape."""
    return max(d for d in range(1, max(min(P, most), 1) + 1) if P % d == 0)


def pipelined(n: int, generate, score):
    """Generate and score `n` chunks with the host's scoring of chunk c overlapping the device's generation of
    chunk c+1. `generate(c)` dispatches chunk c and returns its device arrays (JAX returns before they are
    computed); `score(c, host_arrays)` runs on the host. Returns ([score(c, ...) for each c], timings):
    generate_s (the host blocked on the device, dispatch included), score_s (host scoring), score_overlap_s (the
    part of score_s spent while a later chunk was generating). generate_s + score_s is the wall time."""
    out, gen_s, score_s, overlap_s = [], 0.0, 0.0, 0.0
    t = time.perf_counter()
    pending = generate(0)
    for c in range(n):
        host = to_host(pending)
        if c + 1 < n:
            pending = generate(c + 1)
        t1 = time.perf_counter()
        gen_s += t1 - t
        out.append(score(c, host))
        t = time.perf_counter()
        score_s += t - t1
        overlap_s += (t - t1) if c + 1 < n else 0.0
    return out, {"generate_s": gen_s, "score_s": score_s, "score_overlap_s": overlap_s}


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
