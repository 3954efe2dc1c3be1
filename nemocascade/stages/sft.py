"""SFT stage: masked next-token cross-entropy on assistant tokens, one jitted step with donated state.

    step(state, batch) -> (state, metrics)
        loss = sum_t m_t * -log p(x_t | x_<t) / sum_t m_t      (losses.token_cross_entropy)
        m_t = 1 on completion tokens (reasoning, </think>, answer, <|im_end|>); prompt and pad are 0.

`pack=True` packs several examples per row (pipeline.sft_dataset): each attends only within itself, with
its own positions, so the loss is the same token mean over the same examples with far less padding.
A packed row's first token of an example is a prompt token (mask 0), so no loss crosses a boundary.
"""
from __future__ import annotations

import functools
import time


from nemocascade import losses
from nemocascade.data import pipeline
from nemocascade.models import forward
from nemocascade.stages import common

# mix: domain -> weight of its share of the SFT stream (unnamed domains weigh 1; {} = equal shares)
DEFAULTS = dict(seq_len=160, batch_size=32, pack=False, mix={})


MIN_SEQ_LEN = 8  # a prompt's chat frame alone takes a few tokens: shorter rows can hold no response


def check(stage, earlier: dict) -> list[str]:
    """What is wrong with an SFT stage's settings (the data-aware check is `check_room`)."""
    bad = [f"batch_size={stage.batch_size} must be >= 1"] if stage.batch_size < 1 else []
    unknown, nonpositive = pipeline.bad_mix_weights(stage.domains, stage.mix)
    bad += [f"mix: {unknown | nonpositive} must name the stage's domains ({list(stage.domains)}) with weights > 0"
            ] if unknown or nonpositive else []
    return bad + ([f"seq_len={stage.seq_len} leaves no room for a response (minimum {MIN_SEQ_LEN})"]
                  if stage.seq_len < MIN_SEQ_LEN else [])


def check_data(ctx: common.RunContext, name: str, stage) -> str | None:
    """The stage's rows leave room for a response in every domain (`check_room`)."""
    for d in stage.domains:
        problem = check_room(ctx.sources[d]["train"], ctx.tokenizer, stage.seq_len, ctx.cfg.thinking)
        if problem:
            return f"{problem} (domain {d!r})"
    return None


def check_room(source, tokenizer, seq_len: int, thinking: bool, sample: int = 64) -> str | None:
    """None if at least one of the first `sample` examples keeps a trained token within `seq_len`, else what
    goes wrong: SFT on such rows would train on nothing (every completion token cut off)."""
    n = min(sample, len(source))
    kept = [pipeline.encode_example(source[i], tokenizer=tokenizer, seq_len=seq_len, thinking=thinking, pad=True)
            ["loss_mask"][1:].sum() for i in range(n)]
    if n and max(kept) == 0:
        return f"seq_len={seq_len} cuts off every response of the first {n} training examples (prompts are longer)"
    return None


def sft_loss(params, batch, shared=None, *, model_cfg):
    """Next-token cross-entropy on the response tokens (`loss_mask`), plus a mixture of experts' load-balancing
    loss; packed rows attend within their own example."""
    tokens = batch["tokens"]
    packed = {}
    if "segment_ids" in batch:
        packed = dict(positions=batch["positions"][:, :-1], segment_ids=batch["segment_ids"][:, :-1])
    logits, aux = forward(params, model_cfg, tokens[:, :-1], **packed, with_aux=True)
    loss, metrics = losses.token_cross_entropy(logits, tokens[:, 1:], batch["loss_mask"][:, 1:])
    if model_cfg.moe:  # 0 weight: logged only
        return loss + model_cfg.router_aux_coef * aux, metrics | {"router_aux": aux}
    return loss, metrics


def run(run_ctx: common.RunContext, name: str, stage, params):
    """Train `stage.steps` SFT steps from `params`; resumes from this stage's latest checkpoint."""
    tx, schedule = common.optimizer(stage)
    source = common.mixture_source(run_ctx, stage.domains, "train", stage.mix)
    ds = pipeline.sft_dataset(source, run_ctx.tokenizer, stage.seq_len, stage.batch_size,
                              seed=run_ctx.cfg.seed + common.stage_index(run_ctx, name), pack=stage.pack)
    trainer = common.Trainer(run_ctx, name, stage, params, tx, functools.partial(sft_loss, model_cfg=run_ctx.model_cfg),
                             data_iter=iter(ds))
    tokens_per_step = stage.batch_size * (stage.seq_len - 1)

    with trainer:
        for step in trainer.steps():
            t0 = time.perf_counter()
            batch = next(trainer.data_iter)
            metrics = trainer.update(trainer.put(batch))
            metrics["lr"] = float(schedule(step))
            metrics["tokens_per_s"] = tokens_per_step / (time.perf_counter() - t0)  # incl. padding
            if stage.pack:  # how full the rows are, and how many examples a step saw
                metrics["pack_fill"] = float((batch["segment_ids"] > 0).mean())
                metrics["examples"] = int(batch["segment_ids"].max(axis=1).sum())
            if stage.eval_every and (step + 1) % stage.eval_every == 0:
                metrics |= common.quick_eval(run_ctx, trainer.params, stage)
            trainer.log(step, metrics)
        return trainer.finish()


KIND = common.StageKind("sft", DEFAULTS, run, check, check_data=check_data)
