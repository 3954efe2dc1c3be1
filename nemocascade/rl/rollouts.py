"""On-policy rollouts shared by the RL stage kinds: draw prompts, sample G completions each from the current
params with the jitted sampler, score them with each prompt's domain reward, and gather the kept groups into the
training batch (the agent kind's episodes are a subclass of the source: stages/agent.py). Tokens, masks and
log-probs stay on the device from the sampler to the update: only the response tokens go to the host to be decoded
for the stage's scorer (stages/reward_sources.py), and only rewards come back.

    source = RolloutSource(ctx, stage, data_iter, epoch_len, epoch_filter=None, scorer=reward_sources.build(...))
    rollouts, stats = source.sample(params, source.prompts(B), max_new_tokens, rng)
    batch = training_batch([rollouts.rows, ...], kept_groups, target, G, mesh)   # one jitted gather

`rollouts.rows` (`Rows`, device arrays, P x G rows, a group's G rows adjacent): tokens / valid / positions [N, L]
(prompt + response), mask / sampler_logp [N, L-1] aligned with next-token targets. `rollouts.groups` (host numpy,
leading dim P): rewards, truncated, lengths [P, G], domain_idx [P] (index into `ctx.cfg.data.domains`) and the
columns each group uses, first and end [P]. `stats` holds timings (generate_s, score_s).
"""
from __future__ import annotations

import functools
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from nemocascade import chat, sampling
from nemocascade.data import pipeline
from nemocascade.errors import unknown_keys
from nemocascade.mesh import batch_sharding, shard_batch, to_host
from nemocascade.rl import filters

# A stage's `rollout` dict: what is sampled each step, read here alone (and validated by `problems`).
DEFAULTS = dict(
    prompts_per_step=16, group_size=8,
    mix={},  # domain -> weight of its share of the prompt stream (unnamed domains weigh 1; {} = equal shares)
    max_prompt_len=None,  # None: config.eval.max_prompt_len; long-context stages raise it
    max_new_tokens=96,  # response budget; `length_curriculum` ((start_step, max_new_tokens), ...) overrides it
    length_curriculum=(),  # in sub-stages, C1 math RL style
    temperature=1.0, top_p=1.0, top_k=None,  # top_k None: no top-k cut
    # the prompts sampled in this many chunks in turn (each its own sampler call): the KV cache holds one chunk's
    # rows x G x (prompt + response) at a time instead of the whole step's (the sampler's memory at real shapes)
    sample_chunks=1,
)


def problems(stage) -> list[str]:
    """What is wrong with a stage's `rollout` dict, as `rollout.<key>: problem` lines (empty: fine)."""
    r = stage.rollout
    bad = unknown_keys("rollout", r, DEFAULTS)
    if bad:
        return bad
    bad += [f"rollout.{k}={r[k]} must be >= 1" for k in ("prompts_per_step", "group_size", "max_new_tokens",
                                                         "sample_chunks") if r[k] < 1]
    if r.sample_chunks >= 1 and r.prompts_per_step % r.sample_chunks:
        bad.append(f"rollout.sample_chunks={r.sample_chunks} must divide rollout.prompts_per_step="
                   f"{r.prompts_per_step} (one sampler shape)")
    bad += [f"rollout.{k}={r[k]} must be None or >= 1" for k in ("max_prompt_len", "top_k")
            if r[k] is not None and r[k] < 1]
    curriculum = list(r.length_curriculum)
    if curriculum and (min(s for s, _ in curriculum) != 0 or min(n for _, n in curriculum) < 1):
        bad.append(f"rollout.length_curriculum={curriculum}: needs an entry at step 0 and max_new_tokens >= 1 "
                   "everywhere (room for a response)")
    bad += [f"rollout.temperature={r.temperature} must be > 0"] if not r.temperature > 0 else []
    bad += [f"rollout.top_p={r.top_p} must be in (0, 1]"] if not 0 < r.top_p <= 1 else []
    unknown, nonpositive = pipeline.bad_mix_weights(stage.domains, r.mix)
    bad += [f"rollout.mix names {sorted(unknown)}, not the stage's domains {list(stage.domains)}"] if unknown else []
    return bad + ([f"rollout.mix: weights must be > 0, got {nonpositive}"] if nonpositive else [])


def max_new_tokens_at(rollout, step: int) -> int:
    """The response budget at `step`: the `length_curriculum` entry in force, else `max_new_tokens`."""
    if not rollout.length_curriculum:
        return rollout.max_new_tokens
    return max((s, n) for s, n in rollout.length_curriculum if s <= step)[1]


def prompt_width(stage, ctx) -> int:
    return stage.rollout.max_prompt_len or ctx.cfg.eval.max_prompt_len


class Rows(NamedTuple):
    """Rollouts as training rows on the device (sampling.sequences' layout)."""
    tokens: jax.Array  # [N, L] int32, prompt left-padded to the stage's width, then the response
    valid: jax.Array  # [N, L] bool
    positions: jax.Array  # [N, L] int32
    mask: jax.Array  # [N, L-1] float32, 1 where the target is a token the policy sampled
    sampler_logp: jax.Array  # [N, L-1] float32, log pi_inf of those targets


class Rollouts(NamedTuple):
    rows: Rows  # device
    groups: dict  # host, leading dim P (module docstring)


class RolloutSource:
    """Draws prompts (skipping ones the C1 epoch filter dropped), samples G rollouts each, scores them.

    `rewards`: domain -> reward function for this stage (default: each domain's registered reward).
    Its state (`state_dict`) goes into the stage checkpoint, so a resumed stage draws the same prompts."""

    def __init__(self, ctx, stage, data_iter, epoch_len: int, epoch_filter=None, scorer=None,
                 group_size: int | None = None):
        """`scorer`: (records, texts, lengths [P, G]) -> rewards [P, G] (stages/reward_sources.py). `group_size`:
        rollouts per prompt, when not the stage's (C2's prefilter samples each problem more often)."""
        self.ctx, self.stage, self.data_iter, self.epoch_len = ctx, stage, data_iter, epoch_len
        self.G = stage.rollout.group_size if group_size is None else group_size
        self.epoch_filter, self.scorer = epoch_filter, scorer
        self.drawn = 0
        self._pending: list[dict] = []

    def state_dict(self):
        return {"drawn": self.drawn, "pending": self._pending,
                "epoch_filter": self.epoch_filter.state_dict() if self.epoch_filter else None}

    def load_state_dict(self, d):
        self.drawn, self._pending = d["drawn"], d["pending"]
        if self.epoch_filter and d.get("epoch_filter"):
            self.epoch_filter.load_state_dict(d["epoch_filter"])

    def take_metrics(self) -> dict:
        """The scorer's counters since the last call (verifier timeouts, ...)."""
        return self.scorer.take_metrics()

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

    def sampler(self, params, toks, lens, rng, max_new: int, lower: bool = False):
        """The stage's sampler call on device prompts (`lower`: its lowering, for `preflight`)."""
        ctx, ro = self.ctx, self.stage.rollout
        fn = sampling.sample.lower if lower else sampling.sample
        return fn(params, ctx.model_cfg, toks, lens, rng, max_new_tokens=max_new, eos_id=ctx.tokenizer.eos_id,
                  pad_id=ctx.tokenizer.pad_id, temperature=ro.temperature, top_p=ro.top_p, top_k=ro.top_k,
                  num_samples=self.G)

    def sample(self, params, records, max_new: int, rng) -> tuple[Rollouts, dict]:
        """Sample G rollouts per record from `params` and score them -> (Rollouts, stats) as in the module
        docstring. Every refill round is at the stage's full prompt width (left padding), so rounds concatenate;
        the training batch cuts the all-padding columns again (column_window)."""
        ctx, ro, G = self.ctx, self.stage.rollout, self.G
        max_prompt = prompt_width(self.stage, ctx)
        t0 = time.perf_counter()
        toks, lens = pipeline.encode_prompts(ctx.tokenizer, [r["prompt"] for r in records], max_prompt,
                                             thinking=ctx.cfg.thinking, bucket=sampling.PROMPT_BUCKET)
        per = -(-len(records) // ro.sample_chunks)  # (a refill round's fewer records: fewer chunks)
        chunks = [self.sampler(params, *shard_batch(ctx.mesh, (toks[i:i + per], lens[i:i + per])),
                               rng if per == len(records) else jax.random.fold_in(rng, i), max_new)
                  for i in range(0, len(records), per)]  # dispatched in turn; the host waits once, below
        samples = chunks[0] if len(chunks) == 1 else sampling.Samples(*map(jnp.concatenate, zip(*chunks)))
        rows = to_rows(samples, width=max_prompt, pad_id=ctx.tokenizer.pad_id)
        lengths, truncated, tokens, mask = to_host((samples.lengths, samples.truncated, samples.tokens, samples.mask))
        t1 = time.perf_counter()
        lengths, truncated = lengths.reshape(-1, G), truncated.reshape(-1, G)
        texts = chat.decode_responses(ctx.tokenizer, tokens, mask, ctx.cfg.thinking)
        rewards = np.asarray(self.scorer(records, texts, lengths), np.float32)
        timing = {"generate_s": t1 - t0, "score_s": time.perf_counter() - t1}
        if self.epoch_filter:
            self.epoch_filter.update([r["id"] for r in records], rewards)
        domain_index = {d: i for i, d in enumerate(ctx.cfg.data.domains)}
        groups = {"rewards": rewards, "truncated": truncated, "lengths": lengths,
                  "domain_idx": np.asarray([domain_index[r["domain"]] for r in records], np.int32),
                  "first": max_prompt - lens, "end": max_prompt + lengths.max(1)}
        return Rollouts(rows, groups), timing


@functools.partial(jax.jit, static_argnames=("width", "pad_id"))
def to_rows(samples: sampling.Samples, *, width: int, pad_id: int) -> Rows:
    """The sampler's output as training rows, its prompts left-padded to `width` columns (the sampler saw them cut
    to a bucket)."""
    left = width - samples.prompts.shape[1]
    samples = samples._replace(prompts=jnp.pad(samples.prompts, ((0, 0), (left, 0)), constant_values=pad_id))
    tokens, valid, positions, mask = sampling.sequences(samples)
    logp = jnp.concatenate([jnp.zeros_like(samples.prompts[:, 1:], jnp.float32), samples.logprobs], 1)
    return Rows(tokens, valid, positions, mask, logp)


def bucket_width(n: int, bucket: int) -> int:
    """The smallest width >= n on the ladder bucket x {1, 2, 3, 4, 6, 8, 12, 16, ...} (two steps per octave):
    at most 1.5x the columns needed, and a step's width takes one of ~2 log2(L / bucket) values, so a run
    compiles its train step a handful of times instead of once per multiple of `bucket`."""
    m = 1
    while bucket * m < n:
        m = m * 3 // 2 if m >= 2 and (m & (m - 1)) == 0 else (m // 3) * 4 if m % 3 == 0 else m * 2
    return bucket * m


def column_window(first: int, end: int, width: int, bucket: int = 16) -> tuple[int, int]:
    """(start, width) of the columns a batch keeps: every used column (first..end-1) at a width from
    `bucket_width`'s ladder, at most the rows' own `width`, so only a few shapes are ever compiled. Widened to the
    left first (prompts are left-padded), then to the right."""
    keep = min(width, max(bucket_width(end - first, bucket), 2))
    return min(first, width - keep), keep


def training_batch(rounds, groups: dict, target: int, G: int, mesh, bucket: int = 16, group_bucket: int = 4) -> dict:
    """The step's batch: the kept groups' rows gathered on the device from the sampling rounds' `rounds` (Rows,
    one per round) by `groups["group_id"]` (host: a group's index in the rounds' rows concatenated), padded with
    zero rows up to a multiple of `group_bucket` groups (at most `target`: filtered-out groups cost no training
    compute), all-padding columns cut (`column_window`). Adds rewards and truncated [groups, G] and domain_idx [N]."""
    n = len(groups["group_id"])
    target = pipeline.pad_to_bucket(max(n, 1), group_bucket, most=target)
    pad = target - n
    padded = lambda x: np.concatenate([x, np.zeros((pad, *np.shape(x)[1:]), np.asarray(x).dtype)])  # noqa: E731
    row_idx = (padded(groups["group_id"])[:, None] * G + np.arange(G)).reshape(-1).astype(np.int32)
    first, width = column_window(int(groups["first"].min()), int(groups["end"].max()), rounds[0].tokens.shape[1],
                                 bucket)
    index = jax.device_put((row_idx, np.repeat(np.arange(target) < n, G), np.int32(first)))
    rows = _gather(tuple(rounds), *index, width=width, mesh=mesh)
    host = {"rewards": padded(groups["rewards"]).astype(np.float32), "truncated": padded(groups["truncated"]),
            "domain_idx": np.repeat(padded(groups["domain_idx"]).astype(np.int32), G)}
    return rows._asdict() | shard_batch(mesh, host)


def batch_shapes(mesh, prompts: int, G: int, width: int) -> dict:
    """`training_batch`'s arrays as abstract shapes on `mesh` (prompts x G rows of `width` columns), for a compile
    ahead of time (`preflight`, benchmarks/memory_plan.py)."""
    rows = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=batch_sharding(mesh, len(shape), shape[0]))  # noqa: E731
    N = prompts * G
    return {"tokens": rows((N, width), jnp.int32), "valid": rows((N, width), jnp.bool_),
            "positions": rows((N, width), jnp.int32), "mask": rows((N, width - 1), jnp.float32),
            "sampler_logp": rows((N, width - 1), jnp.float32), "rewards": rows((prompts, G), jnp.float32),
            "truncated": rows((prompts, G), jnp.bool_), "domain_idx": rows((N,), jnp.int32)}


@functools.partial(jax.jit, static_argnames=("width", "mesh"))
def _gather(rounds, row_idx, keep, first, *, width: int, mesh) -> Rows:
    rows = jax.tree.map(lambda *xs: jnp.concatenate(xs), *rounds) if len(rounds) > 1 else rounds[0]

    def take(x, w):
        x = jax.lax.dynamic_slice_in_dim(x[row_idx], first, w, axis=1)
        x = jnp.where(keep[:, None], x, jnp.zeros((), x.dtype))  # padding rows: no token, no weight
        return jax.lax.with_sharding_constraint(x, batch_sharding(mesh, 2, x.shape[0]))
    return Rows(*(take(x, width - (k in ("mask", "sampler_logp")))
                  for k, x in zip(Rows._fields, rows)))


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
