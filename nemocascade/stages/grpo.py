"""GRPO stage exactly as Cascade RL uses it (METHOD.md "GRPO as used in every RL stage").

Each step, strictly on-policy:
  1. sample B prompts x G rollouts from the *current* params (jitted sampler, KV cache);
  2. score every rollout with its domain's verifier (process pool, per-call timeout);
  3. group filters: overlong (filter | penalty | none), mask_if_max_reward_below, dynamic filtering with a
     bounded refill (never aborts: trains on what it has, padding the batch with zero-weight groups);
  4. A_i = (r_i - mean_g r) / (std_g r + eps) per group;
  5. exactly one optimiser update on the objective  sum_k w_k * term_k  (config `objective`):
        pg       -sum_{i,t} m A_i log pi(y_it) / normaliser   (token-mean over the *global* batch)
        kl       sum m * KL_k{1,2,3}(pi || pi_ref) / normaliser  (frozen reference = the stage's start)
        entropy  -sum m * H(pi) / normaliser                     (a bonus; 0 in Cascade RL)
     The importance ratio is 1 (one update per batch), so the PPO ratio/clip collapses to log pi.
     Micro-batches share the global normaliser, so their summed gradient equals the full batch's.

Left out on purpose: PPO epochs / clipping (ratio is always 1), value functions, reward models (the RLHF
stage adds one), asynchronous rollouts.
"""
from __future__ import annotations

import functools
import time
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
import optax

from nemocascade import losses
from nemocascade.models import forward
from nemocascade.rl import filters
from nemocascade.rl import rollouts as rollouts_lib
from nemocascade.stages import common

DEFAULTS = dict(
    max_prompt_len=0,  # 0: config.eval.max_prompt_len; long-context stages raise it
    prompts_per_step=16, group_size=8, micro_batches=1,
    length_curriculum=((0, 96),),  # (start_step, max_new_tokens) sub-stages, C1 math RL style
    temperature=1.0, top_p=1.0, top_k=0,
    objective=dict(pg=1.0, kl=0.0, entropy=0.0), kl_estimator="k3", aggregation="token_mean",
    adv_eps=1e-6,
    dynamic_filter=False, refill_rounds=3, overlong="none", mask_if_max_reward_below=-1.0,
    epoch_filter=False, readmit_hard=0.1, readmit_easy=0.01,
    # RLHF (METHOD.md "Rewards per domain"): score rollouts with the BT reward model an earlier `rm` stage
    # trained, on the text after </think>; "scalar" = its score, "pairwise" = Cascade 2's aggregation (mean
    # P(i beats j) over the group, ties broken by ranking, optional quality-gated conciseness bonus)
    reward_model="", reward_mode="scalar", conciseness_bonus=0.0, quality_gate=0.5, rm_max_len=160,
)
REWARD_MODES = ("scalar", "pairwise")
TERMS = ("pg", "kl", "entropy")


def check(stage, earlier: dict) -> list[str]:
    """What is wrong with a GRPO stage's settings, as `key: problem` lines (empty: fine); run at validation.
    `earlier`: the stages before it (an RLHF stage's `reward_model` must name one of kind "rm")."""
    B, G = stage.prompts_per_step, stage.group_size
    bad = [f"objective.{k}: unknown term; terms: {TERMS}" for k in stage.objective if k not in TERMS]
    bad += [f"group_size={G}: the group baseline needs >= 2 rollouts per prompt (one is always its own mean: "
            "advantage 0, nothing trains)"] if G < 2 else []
    bad += [f"prompts_per_step={B} must be >= 1"] if B < 1 else []
    bad += [f"micro_batches={stage.micro_batches} must divide prompts_per_step*group_size={B * G}"] if (
        stage.micro_batches < 1 or (B * G) % stage.micro_batches) else []
    curriculum = list(stage.length_curriculum)
    if not curriculum or min(s for s, _ in curriculum) != 0 or min(n for _, n in curriculum) < 1:
        bad.append(f"length_curriculum={curriculum}: needs an entry at step 0 and max_new_tokens >= 1 everywhere "
                   "(room for a response)")
    bad += [f"kl_estimator={stage.kl_estimator!r}; choose one of {losses.KL_ESTIMATORS}"] if (
        stage.kl_estimator not in losses.KL_ESTIMATORS) else []
    bad += [f"aggregation={stage.aggregation!r}; choose one of {losses.AGGREGATIONS}"] if (
        stage.aggregation not in losses.AGGREGATIONS) else []
    bad += [f"overlong={stage.overlong!r}; choose one of {filters.OVERLONG_MODES}"] if (
        stage.overlong not in filters.OVERLONG_MODES) else []
    bad += [f"reward_mode={stage.reward_mode!r}; choose one of {REWARD_MODES}"] if (
        stage.reward_mode not in REWARD_MODES) else []
    bad += common.sampling_problems(stage)
    bad += [f"refill_rounds={stage.refill_rounds} must be >= 1"] if stage.refill_rounds < 1 else []
    src = stage.reward_model
    bad += [f"reward_model={src!r}: must name an earlier stage of kind 'rm' (earlier: {list(earlier)})"] if (
        src and (src not in earlier or earlier[src].kind != "rm")) else []
    return bad


def max_new_tokens_at(stage, step: int) -> int:
    return max((s, n) for s, n in stage.length_curriculum if s <= step)[1]


def grpo_step(state, batch, ref_params, *, model_cfg, tx, stage):
    """One optimiser update. batch: tokens/valid/positions [N, L]; mask, sampler_logp [N, L-1]
    (aligned with next-token targets); advantages [N]; has_data scalar (0 -> no-op update)."""
    w = stage.objective
    mb = stage.micro_batches
    normalizer = losses.loss_normalizer(batch["mask"], stage.aggregation)

    def loss_fn(params, b):
        logits = forward(params, model_cfg, b["tokens"][:, :-1], b["positions"][:, :-1], b["valid"][:, :-1])
        logp = losses.token_logprobs(logits, b["tokens"][:, 1:])
        m = b["mask"]
        pg, _ = losses.grpo_loss(logp, b["advantages"], m, aggregation=stage.aggregation, normalizer=normalizer)
        ent = losses.token_entropy(logits)
        total = w.pg * pg
        aux = {"pg_loss": pg, "entropy": jnp.sum(m * ent) / normalizer,
               "logp_mismatch": jnp.sum(m * jnp.abs(logp - b["sampler_logp"])) / normalizer}
        if w.entropy:
            total -= w.entropy * aux["entropy"]
        if w.kl:
            ref_logits = forward(ref_params, model_cfg, b["tokens"][:, :-1], b["positions"][:, :-1],
                                 b["valid"][:, :-1])
            ref_logp = jax.lax.stop_gradient(losses.token_logprobs(ref_logits, b["tokens"][:, 1:]))
            aux["kl"] = jnp.sum(m * losses.kl_penalty(logp, ref_logp, stage.kl_estimator)) / normalizer
            total += w.kl * aux["kl"]
        return total, aux

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    batch = dict(batch)
    keep = batch.pop("has_data") > 0  # an all-filtered step changes nothing but the step counter
    if mb == 1:
        (loss, aux), grads = grad_fn(state.params, batch)
    else:  # sum micro-batch gradients; every micro-batch divides by the global normaliser
        split = jax.tree.map(lambda x: x.reshape(mb, x.shape[0] // mb, *x.shape[1:]), batch)

        def acc(carry, b):
            (l, a), g = grad_fn(state.params, b)
            return jax.tree.map(jnp.add, carry, (l, a, g)), None

        zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(lambda: grad_fn(state.params, jax.tree.map(
            lambda x: x[0], split))))
        (loss, aux, grads), _ = jax.lax.scan(acc, (zeros[0][0], zeros[0][1], zeros[1]), split)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    pick = lambda new, old: jax.tree.map(lambda a, b: jnp.where(keep, a, b), new, old)  # noqa: E731
    metrics = {**aux, "loss": loss, "grad_norm": optax.global_norm(grads)}
    return state.replace(step=state.step + 1, params=pick(new_params, state.params),
                         opt_state=pick(opt_state, state.opt_state)), metrics


def build_batch(groups, stage, target: int, bucket: int = 16, group_bucket: int = 4):
    """Group filters -> advantages -> flat training batch, padded with zero-weight groups up to a
    multiple of `group_bucket` (at most `target`): filtered-out groups cost no training compute.

    Columns that are padding in every row (left of the longest prompt, right of the longest response)
    are cut, keeping widths multiples of `bucket` so only a few shapes are ever compiled."""
    rewards, loss_keep = filters.overlong(groups["rewards"], groups["truncated"], stage.overlong)
    adv = np.asarray(losses.group_advantages(jnp.asarray(rewards), stage.adv_eps))
    mask = groups["mask"] * loss_keep[..., None]
    P, G = rewards.shape
    target = min(target, max(-(-P // group_bucket) * group_bucket, group_bucket)) if group_bucket else target
    pad = target - P
    padded = lambda x: np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)]) if pad else x  # noqa: E731
    flat = lambda x: padded(x).reshape(target * G, *x.shape[2:])  # noqa: E731
    batch = {"tokens": flat(groups["tokens"]), "valid": flat(groups["valid"]), "positions": flat(groups["positions"]),
             "mask": flat(mask.astype(np.float32)), "sampler_logp": flat(groups["sampler_logp"]),
             "advantages": flat(adv.astype(np.float32))}
    batch = rollouts_lib.trim_columns(batch, bucket)
    return batch | {"has_data": np.float32(P > 0)}


def run(ctx: common.RunContext, name: str, stage, params):
    """Train `stage.steps` GRPO steps from `params` (settings checked by `check` at validation)."""
    B = stage.prompts_per_step
    tx, schedule = common.optimizer(stage)
    data_iter, epoch_len = common.prompt_stream(ctx, name, stage)
    epoch_filter = (filters.EpochFilter(stage.readmit_hard, stage.readmit_easy, ctx.cfg.seed)
                    if stage.epoch_filter else None)
    rollouts = rollouts_lib.RolloutSource(ctx, stage, data_iter, epoch_len, epoch_filter, common.stage_rewards(stage),
                                          scorer=rm_scorer(ctx, stage) if stage.reward_model else None)
    ref = jax.tree.map(jnp.copy, params) if stage.objective.kl else None
    step_fn = functools.partial(grpo_step, model_cfg=ctx.model_cfg, tx=tx, stage=stage)
    trainer = common.Trainer(ctx, name, stage, params, tx, step_fn, data_iter=data_iter,
                             extra_state_fns=(rollouts.state_dict, rollouts.load_state_dict))
    domains = list(ctx.cfg.data.domains)
    with trainer:
        for step in trainer.steps():
            max_new = max_new_tokens_at(stage, step)
            rng = jax.random.fold_in(jax.random.wrap_key_data(trainer.state.rng), step)
            buf = filters.RefillBuffer(B, stage.refill_rounds if stage.dynamic_filter else 1)
            timing, first, rounds = defaultdict(float), None, 0
            while not buf.ready():  # always B prompts per round: one compiled sampler
                groups, t = rollouts.rollouts(trainer.state.params, rollouts.prompts(B), max_new,
                                              jax.random.fold_in(rng, rounds))
                rounds += 1
                for k, v in t.items():
                    timing[k] += v
                first = first or groups
                keep = filters.dynamic_filter_keep(groups["rewards"]) if stage.dynamic_filter else np.ones(B, bool)
                keep &= filters.max_reward_keep(groups["rewards"], stage.mask_if_max_reward_below)
                buf.add(groups, keep)
            groups, fstats = buf.take()
            batch = build_batch(groups, stage, B)
            t0 = time.perf_counter()
            metrics = trainer.update(trainer.put(batch), ref)
            timing["train_s"] = time.perf_counter() - t0
            metrics |= rollouts_lib.rollout_metrics(first, domains) | dict(timing)
            metrics |= {"lr": float(schedule(step)), "max_new_tokens": max_new, "kept_groups": fstats["kept"],
                        "refill_rounds": fstats["rounds"]}
            if stage.eval_every and (step + 1) % stage.eval_every == 0:
                metrics |= common.quick_eval(ctx, trainer.state.params, stage)
            trainer.log(step, metrics)
        return trainer.finish()


def rm_scorer(ctx, stage):
    """Rewards [P, G] from the reward model of stage `stage.reward_model` (saved by `stages/rm.py`)."""
    from nemocascade.rewards import rm as rm_rewards  # RLHF stages only
    from nemocascade.stages import rm as rm_stage

    scorer = rm_rewards.RewardModelScorer.load(
        rm_stage.rm_path(ctx.workdir, stage.reward_model), ctx.model_cfg, ctx.tokenizer, mesh=ctx.mesh,
        batch_size=stage.prompts_per_step * stage.group_size, max_len=stage.rm_max_len)

    def score(records, texts, lengths):
        G = stage.group_size
        s = scorer.score([r["prompt"] for r in records for _ in range(G)], texts).reshape(len(records), G)
        if stage.reward_mode == "scalar":
            return s
        return np.stack([rm_rewards.pairwise_rewards(rm_rewards.bt_preferences(row), lens, stage.conciseness_bonus,
                                                     stage.quality_gate) for row, lens in zip(s, lengths)])
    return score


KIND = common.StageKind("grpo", DEFAULTS, run, check)
