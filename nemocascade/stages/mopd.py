"""MOPD: Multi-domain On-Policy Distillation (Cascade 2 section 4.4, METHOD.md "MOPD").

Each step:
  1. sample B prompts x G rollouts from the student (the sampler's per-token log-probs are log pi_inf);
  2. every prompt's domain picks its teacher (`stage.teachers`: domain -> checkpoint name, default
     `best:<domain>`, the strongest held-out checkpoint of that domain so far; nemocascade/teachers.py);
  3. one optimiser update on `losses.mopd_loss`: per sampled token the advantage
     a_t = sg[log pi_teacher - log pi_train], truncated importance weight w_t = sg[pi_train / pi_inf] inside
     [is_low, is_high] (0 outside), loss -mean_responses[(1/|V|) sum_t w_t a_t log pi_train].
No outcome reward, no group baseline. The learning rate warms up linearly from 0.1x (METHOD.md: early grad
norms are large). Logged: reverse KL mean(log pi_train - log pi_teacher) overall and per domain (it should
fall toward 0), the IS-weight statistics, and (unless `log_reward=False`) the rollouts' verifier reward.

Every teacher is a params pytree on the student's mesh, applied by the same model function inside the one
jitted step. All teachers run over the whole batch and each row keeps its own teacher's values: with K
teachers that is K forward passes, the price of one static-shaped step.

`objective` selects the alternative full-distribution losses of METHOD.md (GKD family): `forward_kl`,
`reverse_kl`, `gjsd` (beta = `gjsd_beta`), each a per-token divergence over the vocabulary, reduced as MOPD
(per-response token mean, then mean over responses).
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from nemocascade import checkpoint, losses
from nemocascade.models import forward
from nemocascade.rl import rollouts as rollouts_lib
from nemocascade.stages import common

DEFAULTS = dict(
    max_prompt_len=0,  # 0: config.eval.max_prompt_len; long-context stages raise it
    prompts_per_step=16, group_size=4, max_new_tokens=96, temperature=1.0, top_p=1.0, top_k=0,
    teachers={},  # domain -> checkpoint name; a domain not listed uses "best:<domain>"
    objective="mopd", is_low=0.5, is_high=2.0, gjsd_beta=0.5, log_reward=True,
)
DIVERGENCES = {
    "forward_kl": lambda s, t, beta: losses.forward_kl(s, t),
    "reverse_kl": lambda s, t, beta: losses.reverse_kl(s, t),
    "gjsd": lambda s, t, beta: losses.generalized_jsd(s, t, beta),
}
OBJECTIVES = ("mopd", *DIVERGENCES)


def teacher_refs(stage) -> dict[str, str]:
    """domain -> teacher checkpoint name for every domain of the stage."""
    extra = sorted(set(stage.teachers) - set(stage.domains))
    if extra:
        raise ValueError(f"stage teachers name domain(s) {extra} that the stage does not train on "
                         f"(domains: {list(stage.domains)})")
    return {d: stage.teachers.get(d, f"best:{d}") for d in stage.domains}


def _per_response_mean(per_token, mask):
    """mean over responses with >= 1 valid token of the response's masked token mean (as mopd_loss)."""
    n_tok = jnp.sum(mask, -1)
    per_resp = jnp.sum(mask * per_token, -1) / jnp.maximum(n_tok, 1.0)
    return jnp.sum(per_resp) / jnp.maximum(jnp.sum(n_tok > 0), 1.0)


def mopd_step(state, batch, teacher_params, *, model_cfg, tx, stage):
    """One update. batch: tokens/valid/positions [N, L]; mask, sampler_logp [N, L-1]; teacher_idx, domain_idx
    [N] (domain_idx indexes `stage.domains`). teacher_params: a tuple of params pytrees."""
    run = lambda p: forward(p, model_cfg, batch["tokens"][:, :-1], batch["positions"][:, :-1],  # noqa: E731
                            batch["valid"][:, :-1])
    targets, mask = batch["tokens"][:, 1:], batch["mask"]
    full = stage.objective != "mopd"
    t_out = None
    for k, tp in enumerate(teacher_params):  # each row keeps its own teacher's values
        logits = run(tp)
        val = jax.nn.log_softmax(logits.astype(jnp.float32), -1) if full else losses.token_logprobs(logits, targets)
        sel = (batch["teacher_idx"] == k).reshape(-1, *([1] * (val.ndim - 1)))
        t_out = val if t_out is None else jnp.where(sel, val, t_out)
    t_out = jax.lax.stop_gradient(t_out)
    t_logp = jnp.take_along_axis(t_out, targets[..., None], -1)[..., 0] if full else t_out

    def loss_fn(params):
        logits = run(params)
        logp = losses.token_logprobs(logits, targets)
        if full:
            loss = _per_response_mean(DIVERGENCES[stage.objective](logits, t_out, stage.gjsd_beta), mask)
            aux = {}
        else:
            loss, aux = losses.mopd_loss(logp, t_logp, batch["sampler_logp"], mask, stage.is_low, stage.is_high)
            aux = {k: aux[k] for k in ("is_weight_mean", "is_clip_frac")}
        rkl = jax.lax.stop_gradient(logp - t_logp) * mask
        return loss, (aux, jnp.sum(rkl, -1), jnp.sum(mask, -1))

    (loss, (aux, rkl_rows, tok_rows)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    metrics = {**aux, "loss": loss, "grad_norm": optax.global_norm(grads),
               "reverse_kl": jnp.sum(rkl_rows) / jnp.maximum(jnp.sum(tok_rows), 1.0)}
    for i, d in enumerate(stage.domains):  # reverse KL per domain: token mean over that domain's rows
        sel = batch["domain_idx"] == i
        metrics[f"reverse_kl/{d}"] = jnp.sum(jnp.where(sel, rkl_rows, 0.0)) / jnp.maximum(
            jnp.sum(jnp.where(sel, tok_rows, 0.0)), 1.0)
    new_params = optax.apply_updates(state.params, updates)
    return state.replace(step=state.step + 1, params=new_params, opt_state=opt_state), metrics


def load_teachers(ctx, stage) -> tuple[tuple, dict[str, int], dict[str, str]]:
    """Distinct teacher params (on the student's mesh), domain -> teacher index, domain -> stage name."""
    refs = teacher_refs(stage)
    resolved = {d: ctx.registry.stage_of(ref) for d, ref in refs.items()}
    order = list(dict.fromkeys(resolved.values()))
    params = tuple(checkpoint.load_params(ctx.registry.path(f"stage:{s}"), ctx.abstract_params) for s in order)
    return params, {d: order.index(s) for d, s in resolved.items()}, resolved


def check(stage, earlier: dict) -> list[str]:
    """What is wrong with a MOPD stage's settings, as `key: problem` lines (empty: fine); run at validation."""
    bad = [f"objective={stage.objective!r} unknown; known: {OBJECTIVES}"] if stage.objective not in OBJECTIVES else []
    bad += [f"is_low={stage.is_low}, is_high={stage.is_high}: need 0 < is_low <= 1 <= is_high"] if not (
        0 < stage.is_low <= 1 <= stage.is_high) else []
    bad += [f"{k}={stage[k]} must be >= 1" for k in ("prompts_per_step", "group_size", "max_new_tokens")
            if stage[k] < 1]
    return bad + common.sampling_problems(stage)


def run(ctx: common.RunContext, name: str, stage, params):
    teachers, teacher_of, resolved = load_teachers(ctx, stage)
    refs = teacher_refs(stage)
    print(f"[{name}] teachers: " + ", ".join(f"{d} <- {refs[d]} ({s})" for d, s in resolved.items()), flush=True)
    B, G = stage.prompts_per_step, stage.group_size
    tx, schedule = common.optimizer(stage)
    data_iter, epoch_len = common.prompt_stream(ctx, name, stage)
    rollouts = rollouts_lib.RolloutSource(ctx, stage, data_iter, epoch_len, rewards=common.stage_rewards(stage))
    stage_domain = {d: i for i, d in enumerate(stage.domains)}
    step_fn = functools.partial(mopd_step, model_cfg=ctx.model_cfg, tx=tx, stage=stage)
    trainer = common.Trainer(ctx, name, stage, params, tx, step_fn, data_iter=data_iter,
                             extra_state_fns=(rollouts.state_dict, rollouts.load_state_dict))
    run_domains = list(ctx.cfg.data.domains)
    with trainer:
        for step in trainer.steps():
            rng = jax.random.fold_in(jax.random.wrap_key_data(trainer.state.rng), step)
            records = rollouts.prompts(B)
            groups, timing = rollouts.rollouts(trainer.state.params, records, stage.max_new_tokens, rng,
                                               score=stage.log_reward)
            flat = lambda x: x.reshape(B * G, *x.shape[2:])  # noqa: E731
            batch = {k: flat(groups[k]) for k in ("tokens", "valid", "positions", "mask", "sampler_logp")}
            batch = rollouts_lib.trim_columns(batch)
            batch["teacher_idx"] = np.repeat([teacher_of[r["domain"]] for r in records], G).astype(np.int32)
            batch["domain_idx"] = np.repeat([stage_domain[r["domain"]] for r in records], G).astype(np.int32)
            t0 = time.perf_counter()
            metrics = trainer.update(trainer.put(batch), teachers)
            metrics |= {"train_s": time.perf_counter() - t0, "lr": float(schedule(step)), **timing}
            # the verifier reward is monitoring only: MOPD has no outcome reward
            metrics |= (rollouts_lib.rollout_metrics(groups, run_domains) if stage.log_reward else
                        {"response_len": float(groups["lengths"].mean()),
                         "truncation_rate": float(groups["truncated"].mean())})
            if stage.eval_every and (step + 1) % stage.eval_every == 0:
                metrics |= common.quick_eval(ctx, trainer.state.params, stage)
            trainer.log(step, metrics)
        return trainer.finish()


KIND = common.StageKind("mopd", DEFAULTS, run, check, teacher_refs=teacher_refs)
