"""Reward-model stage: train a scalar Bradley-Terry RM on preference pairs (C1's RLHF reward model).

    rm = init_rm(policy params)                    the RM starts from the policy (C1: from the SFT model)
    step(state, batch) -> (state, metrics)
        r_c, r_r = rm_scores(rm, chosen), rm_scores(rm, rejected)      (one forward pass over both)
        loss = mean -log sigmoid(r_c - r_r - margin)                     (losses.bradley_terry_loss)

A pair is ``rewards.rm_scorer.rm_text(prompt, answer["chosen" | "rejected"])``: the request and each answer
as a non-thinking chat turn, exactly what ``rewards.rm_scorer.RewardModelScorer`` scores later, so the RM is
trained on the inputs it will judge (the think block is never shown to it, METHOD.md). Pairs come from the records'
``answer`` JSON (``data/preference.py``), not from ``response``, which an imperfect teacher may have padded.

The stage trains through ``common.Trainer`` (checkpoints, resume, logging) with the RM's own shardings,
evaluates held-out pairwise accuracy (``eval/<domain>/pairwise_acc``, also per rejected kind), saves the RM
to ``rm_path(workdir, name)`` and returns the policy params unchanged: an RM stage trains no policy.
"""
from __future__ import annotations

import functools
import json
import os
import time

import grain
import jax
import jax.numpy as jnp
import numpy as np

from nemocascade import checkpoint, losses
from nemocascade.data import pipeline
from nemocascade.models import reward_model
from nemocascade.models.transformer import left_pad_positions
from nemocascade.rewards import rm_scorer
from nemocascade.stages import common

DEFAULTS = dict(domains=("pref",), seq_len=96, batch_size=32, margin=0.0, head_std=0.0, eval_pairs=512)


def check(stage, earlier: dict) -> list[str]:
    """What is wrong with a reward-model stage's settings; run at validation."""
    bad = [f"{k}={stage[k]} must be >= {lo}" for k, lo in (("batch_size", 1), ("seq_len", 8), ("eval_pairs", 0))
           if stage[k] < lo]
    if stage.lora.rank:
        bad.append(f"lora.rank={stage.lora.rank}: an RM stage trains a new scalar head, which LoRA would keep "
                   "frozen; use rank 0")
    if stage.optim.state != "reset":
        bad.append(f"optim.state={stage.optim.state!r}: an RM stage trains a new pytree (policy + scalar head), so "
                   "there is no optimiser state to keep; use 'reset'")
    return bad


def rm_path(workdir: str, name: str) -> str:
    """Where stage `name` saves its reward model (``checkpoint.save_params``; load with ``rewards.rm_scorer.load``)."""
    return os.path.join(workdir, "checkpoints", "rm", name)


def encode_pair(record: dict, tokenizer, seq_len: int) -> dict[str, np.ndarray]:
    """One training pair: ``chosen``/``rejected`` int32[seq_len] (right-padded) and their ``*_valid`` masks."""
    pair = json.loads(record["answer"])
    out = {}
    for side in ("chosen", "rejected"):
        ids = rm_scorer.encode_rm(tokenizer, record["prompt"], pair[side], seq_len)
        tokens = np.full((seq_len,), tokenizer.pad_id, np.int32)
        tokens[:len(ids)] = ids
        out[side], out[f"{side}_valid"] = tokens, np.arange(seq_len) < len(ids)
    return out


def pair_dataset(source, tokenizer, seq_len: int, batch_size: int, seed: int) -> grain.IterDataset:
    """Infinite shuffled batches of ``encode_pair`` rows; resumable like ``pipeline.sft_dataset``."""
    ds = grain.MapDataset.source(source).shuffle(seed=seed).repeat()
    ds = ds.map(functools.partial(encode_pair, tokenizer=tokenizer, seq_len=seq_len))
    return ds.batch(batch_size, drop_remainder=True).to_iter_dataset(pipeline.READ_OPTIONS)


def rm_loss(params, batch, shared=None, *, model_cfg, margin):
    """Bradley-Terry on the reward model's scores of the chosen and rejected sequences."""
    tokens = jnp.concatenate([batch["chosen"], batch["rejected"]])
    valid = jnp.concatenate([batch["chosen_valid"], batch["rejected_valid"]])
    r_chosen, r_rejected = jnp.split(reward_model.rm_scores(params, model_cfg, tokens, left_pad_positions(valid),
                                                            valid), 2)
    return losses.bradley_terry_loss(r_chosen, r_rejected, margin)


def pairwise_accuracy(rm_params, ctx, domain: str, records, batch_size: int, seq_len: int) -> dict[str, float]:
    """Held-out ``mean(r(chosen) > r(rejected))`` (a tie is wrong), overall and per rejected ``kind``."""
    scorer = rm_scorer.RewardModelScorer(rm_params, ctx.model_cfg, ctx.tokenizer, batch_size=batch_size,
                                         max_len=seq_len, mesh=ctx.mesh)
    pairs = [json.loads(r["answer"]) for r in records]
    prompts = [r["prompt"] for r in records]
    wins = scorer.score_texts(prompts, [p["chosen"] for p in pairs]) > \
        scorer.score_texts(prompts, [p["rejected"] for p in pairs])
    out = {f"eval/{domain}/pairwise_acc": float(wins.mean())}
    kinds = np.asarray([p.get("kind", "") for p in pairs])
    for kind in sorted(set(kinds) - {""}):
        out[f"eval/{domain}/pairwise_acc/{kind}"] = float(wins[kinds == kind].mean())
    return out


def evaluate_rm(rm_params, ctx, stage) -> dict[str, float]:
    out = {}
    for domain in stage.domains:
        records = ctx.records(domain, "test", stage.eval_pairs)
        out |= pairwise_accuracy(rm_params, ctx, domain, records, stage.batch_size, stage.seq_len)
    return out


def _has_pairs(record) -> bool:
    try:
        pair = json.loads(record["answer"])
    except ValueError:
        return False
    return isinstance(pair, dict) and {"chosen", "rejected"} <= set(pair)


def train_rm(ctx: common.RunContext, name: str, stage, params):
    """Train the RM from the policy `params`; returns (rm_params, held-out eval metrics) and saves the RM."""
    for domain in stage.domains:
        if domain in ctx.sources and not _has_pairs(ctx.sources[domain]["train"][0]):
            raise ValueError(f"config.stages.{name}.domains: {domain!r} has no preference pairs (its answer JSON "
                             f"lacks 'chosen'/'rejected'); use a preference domain such as 'pref'")
    tx, schedule = common.optimizer(stage)
    source = common.mixture_source(ctx, stage.domains, "train")
    seed = ctx.cfg.seed + common.stage_index(ctx, name)
    data_iter = iter(pair_dataset(source, ctx.tokenizer, stage.seq_len, stage.batch_size, seed))
    rm_params = reward_model.init_rm(params, ctx.model_cfg, jax.random.key(seed), stage.head_std)
    loss = functools.partial(rm_loss, model_cfg=ctx.model_cfg, margin=float(stage.margin))
    trainer = common.Trainer(ctx, name, stage, rm_params, tx, loss, data_iter=data_iter,
                             param_shardings=reward_model.param_shardings(ctx.model_cfg, ctx.mesh))
    scores = None
    with trainer:
        for step in trainer.steps():
            t0 = time.perf_counter()
            metrics = trainer.update(trainer.put(next(trainer.data_iter)))
            metrics["lr"] = float(schedule(step))
            metrics["pairs_per_s"] = stage.batch_size / (time.perf_counter() - t0)
            last = step + 1 == stage.steps
            if last or (stage.eval_every and (step + 1) % stage.eval_every == 0):
                evals = evaluate_rm(trainer.state.params, ctx, stage)
                metrics |= evals
                scores = evals if last else scores
            trainer.log(step, metrics)
        rm_params = trainer.finish()
    if scores is None:  # resumed after the last step, or steps=0
        scores = evaluate_rm(rm_params, ctx, stage)
    checkpoint.save_params(rm_path(ctx.workdir, name), rm_params)
    return rm_params, scores


def run(ctx: common.RunContext, name: str, stage, params):
    """Stage entry point (``KIND.run``): trains and saves the RM, returns the policy unchanged."""
    train_rm(ctx, name, stage, params)
    return params


KIND = common.StageKind("rm", DEFAULTS, run, check, trains_policy=False)
