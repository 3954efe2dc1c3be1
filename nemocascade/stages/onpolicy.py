"""The one on-policy stage loop: GRPO, RLHF and MOPD (with its GKD variants) are configurations of it.

Each step, strictly on-policy (METHOD.md "GRPO as used in every RL stage", "MOPD"):
  1. sample B prompts x G rollouts from the *current* params (jitted sampler, KV cache);
  2. score: the stage's reward source (stages/reward_sources.py: each domain's verifier, a reward model, a judge),
     (for monitoring too, where no term trains on them); group filters (max-reward mask, dynamic
     filter with bounded refill);
  3. the kept groups' rows gathered on the device (rl/rollouts.py: training_batch);
  4. the frozen roles the objective reads: the reference (= the params the stage started from, no copy) and
     each prompt's teacher (`teachers`: domain -> checkpoint, default `best:<domain>`);
  5. exactly one optimiser update on `objective` (rl/update.py: policy_update, which computes the group
     advantages A_i = (r_i - mean_g r) / (std_g r + eps) from the rewards, after the overlong filter or penalty,
     when a term reads them).

What differs between kinds is only configuration: GRPO `objective=dict(pg=1, kl=...)` with `rewards` (RLHF:
`reward=dict(source="reward_model", model=` an earlier `rm` stage`)`); MOPD `objective=dict(mopd=1)`,
`aggregation="seq_mean_token_mean"`, no reward, a learning rate warming up from 0.1x. Any mixture of terms is
one config away.

Left out on purpose: PPO epochs / clipping (one update per batch: the ratio is always 1), value functions,
asynchronous rollouts.
"""
from __future__ import annotations

import functools
import json
import os
import time
from collections import defaultdict

import jax
import numpy as np

from nemocascade import checkpoint, envs, files, losses, objectives, optim
from nemocascade.data import domains as domains_lib
from nemocascade.rl import filters
from nemocascade.rl import rollouts as rollouts_lib
from nemocascade.rl import update
from nemocascade.run_log import progress
from nemocascade.stages import common, reward_sources

DEFAULTS = dict(
    max_prompt_len=0,  # 0: config.eval.max_prompt_len; long-context stages raise it
    mix={},  # domain -> weight of its share of the prompt stream (unnamed domains weigh 1; {} = equal shares)
    prompts_per_step=16, group_size=8, micro_batches=1,
    score_overlap=1,  # rollouts generate in this many chunks of prompts; the verifiers score chunk c while c+1
    # generates (rl/rollouts.py `pipelined`; the largest divisor of the prompt count at most this). 1 (no overlap)
    # by default: smaller sampler batches cost more than cheap verifiers save (SmolLM2 GRPO 2x4x96, 2 chunks:
    # generate 9.15 s vs 5.92 s, score 0.01 s); raise it where verifiers are slow (sandboxed code)
    max_new_tokens=96,  # response budget; `length_curriculum` ((start_step, max_new_tokens), ...) overrides it
    length_curriculum=(),  # in sub-stages, C1 math RL style
    temperature=1.0, top_p=1.0, top_k=0,
    # the loss (nemocascade/objectives.py): term -> weight (a float, 0 = off, or an optax schedule dict)
    objective=dict(pg=1.0, kl=0.0, entropy=0.0), aggregation="token_mean",
    kl_estimator="k3",  # term kl
    is_low=0.5, is_high=2.0,  # term mopd: truncated importance-sampling band
    gjsd_beta=0.5, distill_topk=0,  # terms forward_kl / reverse_kl / gjsd: over the teacher's top K (0: vocabulary)
    teachers={},  # domain -> checkpoint name for teacher terms; a domain not listed uses "best:<domain>"
    dynamic_filter=False, refill_rounds=3, overlong="none", mask_if_max_reward_below=-1.0,
    epoch_filter=False,  # C1's epoch filter (rl/filters.py EpochFilter, its readmission rates)
    # what scores rollouts: read by stages/reward_sources.py alone (its REWARD_DEFAULTS)
    reward=dict(reward_sources.REWARD_DEFAULTS),
    # multi-turn rollouts (rl/episodes.py, nemocascade/envs.py): > 1 turns, each domain's environment answers every
    # turn (its tests' output, a tool's result) and rewards the episode; the verifiers above are not used
    max_turns=1, envs={},  # domain -> environment name (default: the domain's own, Domain.env)
    max_total_tokens=0,  # per episode after the prompt, the model's and the observations' tokens (0: max_turns x
    # max_new_tokens, max_new_tokens being each turn's limit)
    max_obs_tokens=128,
    stop_tokens=(),  # vocabulary pieces that also end a turn, e.g. ("</tool_call>",) with a Qwen tokenizer
    # C2's SWE RL data filter, before the stage: the first `prefilter_prompts` distinct train problems, sampled
    # `prefilter_samples` times each by the starting policy; drop those solved every time and a
    # `prefilter_drop_unsolved` share of those never solved; the stage draws from the rest (0: off)
    prefilter_prompts=0, prefilter_samples=16, prefilter_drop_unsolved=0.9,
)


def check(stage, earlier: dict) -> list[str]:
    """What is wrong with an on-policy stage's settings, as `key: problem` lines (empty: fine); run at
    validation. `earlier`: the stages before it (`reward.model` must name one of kind "rm")."""
    B, G = stage.prompts_per_step, stage.group_size
    bad = objectives.problems(stage.objective, stage.aggregation, stage)
    trains_on_rewards = "advantages" in objectives.needs(stage.objective)
    bad += [f"group_size={G}: the group baseline needs >= 2 rollouts per prompt (one is always its own mean: "
            "advantage 0, nothing trains)"] if trains_on_rewards and G < 2 else []
    bad += [f"{k}={stage[k]} must be >= 1" for k in ("prompts_per_step", "group_size", "max_new_tokens",
                                                      "refill_rounds", "score_overlap") if stage[k] < 1]
    bad += [f"micro_batches={stage.micro_batches} must divide prompts_per_step*group_size={B * G}"] if (
        stage.micro_batches < 1 or (B * G) % stage.micro_batches) else []
    curriculum = list(stage.length_curriculum)
    if curriculum and (min(s for s, _ in curriculum) != 0 or min(n for _, n in curriculum) < 1):
        bad.append(f"length_curriculum={curriculum}: needs an entry at step 0 and max_new_tokens >= 1 everywhere "
                   "(room for a response)")
    bad += [f"kl_estimator={stage.kl_estimator!r}; choose one of {losses.KL_ESTIMATORS}"] if (
        stage.kl_estimator not in losses.KL_ESTIMATORS) else []
    bad += [f"is_low={stage.is_low}, is_high={stage.is_high}: need 0 < is_low <= 1 <= is_high"] if not (
        0 < stage.is_low <= 1 <= stage.is_high) else []
    bad += [f"gjsd_beta={stage.gjsd_beta} must lie in (0, 1)"] if not 0 < stage.gjsd_beta < 1 else []
    bad += [f"distill_topk={stage.distill_topk} must be >= 0"] if stage.distill_topk < 0 else []
    bad += [f"overlong={stage.overlong!r}; choose one of {filters.OVERLONG_MODES}"] if (
        stage.overlong not in filters.OVERLONG_MODES) else []
    if not trains_on_rewards:  # the reward filters act on groups the loss never reads
        bad += [f"{k}: filters groups by reward, but no objective term trains on rewards" for k, off in (
            ("dynamic_filter", False), ("epoch_filter", False), ("mask_if_max_reward_below", -1.0)) if stage[k] != off]
    bad += common.sampling_problems(stage) + reward_sources.problems(stage, earlier)
    return bad + episode_problems(stage) + prefilter_problems(stage)


def episode_problems(stage) -> list[str]:
    if stage.max_turns < 1:
        return [f"max_turns={stage.max_turns} must be >= 1"]
    if stage.max_turns == 1:
        return [f"envs={dict(stage.envs)}: environments act between turns; set max_turns > 1"] if stage.envs else []
    bad = [f"max_turns={stage.max_turns}: domain {d!r} has no environment; set envs.{d} to one of {sorted(envs.ENVS)}"
           for d in stage.domains if envs.env_name(d, stage.envs) is None]
    bad += [f"envs.{d}={e!r}: no such environment; registered: {sorted(envs.ENVS)}" for d, e in stage.envs.items()
            if e not in envs.ENVS]
    bad += [f"envs names domain {d!r}, not one of the stage's domains {list(stage.domains)}" for d in stage.envs
            if d not in stage.domains]
    bad += [f"max_turns={stage.max_turns}: the environment rewards episodes; reward.source={stage.reward.source!r} "
            "cannot"] if stage.reward.source != "verifier" else []
    bad += [f"max_total_tokens={stage.max_total_tokens} must be 0 or >= max_new_tokens={stage.max_new_tokens}"] if (
        0 < stage.max_total_tokens < stage.max_new_tokens) else []
    bad += [f"max_obs_tokens={stage.max_obs_tokens} must be >= 16"] if stage.max_obs_tokens < 16 else []
    return bad


def prefilter_problems(stage) -> list[str]:
    if not stage.prefilter_prompts:
        return []
    bad = [f"prefilter_prompts={stage.prefilter_prompts} must be >= 0"] if stage.prefilter_prompts < 0 else []
    bad += [f"prefilter_samples={stage.prefilter_samples} must be >= 1"] if stage.prefilter_samples < 1 else []
    bad += [f"prefilter_drop_unsolved={stage.prefilter_drop_unsolved} must lie in [0, 1]"] if not (
        0 <= stage.prefilter_drop_unsolved <= 1) else []
    bad += [f"prefilter_prompts: the filter counts verifier / environment solves; reward.source="
            f"{stage.reward.source!r} scores instead"] if stage.reward.source != "verifier" else []
    return bad


def max_new_tokens_at(stage, step: int) -> int:
    if not stage.length_curriculum:
        return stage.max_new_tokens
    return max((s, n) for s, n in stage.length_curriculum if s <= step)[1]


def teacher_refs(stage) -> dict[str, str]:
    """domain -> teacher checkpoint name for every domain of the stage; {} when no term reads a teacher."""
    if not objectives.needs(stage.objective) & update.TEACHER_INPUTS:
        return {}
    extra = sorted(set(stage.teachers) - set(stage.domains))
    if extra:
        raise ValueError(f"stage teachers name domain(s) {extra} that the stage does not train on "
                         f"(domains: {list(stage.domains)})")
    return {d: stage.teachers.get(d, f"best:{d}") for d in stage.domains}


def load_teachers(ctx, name: str, stage) -> tuple[tuple, np.ndarray]:
    """Distinct teacher params (on the student's mesh) and run-domain index -> teacher index."""
    refs = teacher_refs(stage)
    resolved = {d: ctx.checkpoints.stage_of(ref) for d, ref in refs.items()}
    print(f"[{name}] teachers: " + ", ".join(f"{d} <- {refs[d]} ({s})" for d, s in resolved.items()), flush=True)
    order = list(dict.fromkeys(resolved.values()))
    params = tuple(checkpoint.load_params(ctx.checkpoints.path(f"stage:{s}"), ctx.abstract_params) for s in order)
    of_domain = [order.index(resolved[d]) if d in resolved else 0 for d in ctx.cfg.data.domains]
    return params, np.asarray(of_domain, np.int32)


def run(ctx: common.RunContext, name: str, stage, params):
    """Train `stage.steps` on-policy steps from `params` (settings checked by `check` at validation)."""
    B = stage.prompts_per_step
    objective = objectives.build(stage.objective, stage.aggregation, stage)
    tx, schedule = optim.make_optimizer(stage.optim, stage.steps)
    teachers, teacher_of_domain = load_teachers(ctx, name, stage) if objective.needs & update.TEACHER_INPUTS \
        else ((), None)
    roles = update.FrozenRoles(ctx.model_cfg, objective.needs, teachers=teachers,
                               reference=params if "ref_logp" in objective.needs else None,
                               teacher_of_domain=teacher_of_domain, topk=stage.distill_topk)
    kept = solve_rate_prefilter(ctx, name, stage, params) if stage.prefilter_prompts else None
    data_iter, epoch_len = common.prompt_stream(ctx, name, stage, kept)
    epoch_filter = filters.EpochFilter(seed=ctx.cfg.seed) if stage.epoch_filter else None
    rollouts = rollouts_lib.RolloutSource(ctx, stage, data_iter, epoch_len, epoch_filter,
                                          scorer=reward_sources.build(ctx, stage))
    run_domains = list(ctx.cfg.data.domains)
    step_fn = functools.partial(update.policy_update, model_cfg=ctx.model_cfg, tx=tx, objective=objective,
                                micro_batches=stage.micro_batches, overlong=stage.overlong,
                                grad_clip=stage.optim.grad_clip,
                                domains=tuple((run_domains.index(d), d) for d in stage.domains))
    trainer = common.Trainer(ctx, name, stage, params, tx, step_fn, data_iter=data_iter,
                             extra_state_fns=(rollouts.state_dict, rollouts.load_state_dict))
    with trainer:
        for step in trainer.steps():
            max_new = max_new_tokens_at(stage, step)
            rng = jax.random.fold_in(jax.random.wrap_key_data(trainer.state.rng), step)
            rows, kept, first, fstats, timing = sample_groups(rollouts, trainer.params, stage, max_new, rng)
            t0 = time.perf_counter()
            if fstats["kept"]:  # every group filtered out: no update, the step counter moves on
                batch = rollouts_lib.training_batch(rows, kept, B, stage.group_size, ctx.mesh)
                metrics = trainer.update(batch | roles(batch))
            else:
                metrics = trainer.skip()
            timing["train_s"] = time.perf_counter() - t0
            metrics |= dict(timing) | rollouts_lib.rollout_metrics(first, run_domains)
            metrics |= {"lr": float(schedule(step)), "max_new_tokens": max_new, "kept_groups": fstats["kept"],
                        "refill_rounds": fstats["rounds"]}
            metrics |= rollouts.scorer.take_metrics()
            if stage.eval_every and (step + 1) % stage.eval_every == 0:
                metrics |= common.quick_eval(ctx, trainer.params, stage)
            trainer.log(step, metrics)
        return trainer.finish()


def solve_rate_prefilter(ctx, name: str, stage, params) -> list[dict]:
    """The train problems the stage keeps after C2's filter (DEFAULTS: prefilter_*), sampled at the stage's own
    settings (multi-turn too) from `params`. Decided once: the kept ids and the solve counts go to
    `<workdir>/prefilter/<stage>.json`, which a resumed stage reads instead of sampling again."""
    examined = domains_lib.first_distinct(common.mixture_source(ctx, stage.domains, "train"), stage.prefilter_prompts)
    path = os.path.join(ctx.workdir, "prefilter", f"{name}.json")
    if files.exists(path):
        ids = set(json.loads(files.read_text(path))["kept_ids"])
        return [r for r in examined if r["id"] in ids]
    K, B = stage.prefilter_samples, stage.prompts_per_step
    scorer = reward_sources.build(ctx, stage)
    source = rollouts_lib.RolloutSource(ctx, stage, iter(()), 1, scorer=scorer, group_size=K)
    solved = []
    rng = jax.random.key(ctx.cfg.seed + 7919)
    for start in progress(range(0, len(examined), B), desc=f"[{name}] prefilter x{K}"):
        part = examined[start:start + B]
        part += [part[-1]] * (B - len(part))  # one compiled shape
        sampled, _ = source.sample(params, part, max_new_tokens_at(stage, 0), jax.random.fold_in(rng, start))
        solved += (sampled.groups["rewards"] >= 1.0).sum(1)[:len(examined) - start].tolist()
    solved = np.asarray(solved)
    kept = [r for r, k in zip(examined, prefilter_keep(solved, K, stage.prefilter_drop_unsolved, ctx.cfg.seed)) if k]
    if not kept:
        raise ValueError(f"stage {name!r}: the prefilter kept none of {len(examined)} problems (solved {K}/{K}: "
                         f"{int((solved == K).sum())}, 0/{K}: {int((solved == 0).sum())}); lower "
                         "prefilter_drop_unsolved or raise prefilter_prompts")
    counts = {str(k): int((solved == k).sum()) for k in range(K + 1)}
    files.atomic_write(path, json.dumps({"examined": len(examined), "samples": K, "solved_counts": counts,
                                         "kept": len(kept), "kept_ids": [r["id"] for r in kept]}))
    print(f"[{name}] prefilter: kept {len(kept)} of {len(examined)} (solved {K}/{K}: {counts[str(K)]}, "
          f"0/{K}: {counts['0']})", flush=True)
    return kept


def prefilter_keep(solved, samples: int, drop_unsolved: float, seed: int) -> np.ndarray:
    """C2's filter over solve counts (of `samples` tries each): drop every problem solved every time and, by a draw
    seeded by `seed`, a `drop_unsolved` share of those never solved -> keep mask."""
    solved = np.asarray(solved)
    unlucky = np.random.default_rng(seed).random(solved.shape) < drop_unsolved
    return ~((solved == samples) | ((solved == 0) & unlucky))


def sample_groups(rollouts, params, stage, max_new: int, rng):
    """`prompts_per_step` prompts x G rollouts, sampled again (up to `refill_rounds`, always B prompts a round: one
    compiled sampler) while the reward filters drop groups -> (each round's device rows, the kept groups (host,
    with `group_id`: the index into the rounds' rows), the first round's groups, filter stats, timings summed
    over rounds). The filters read only the host's rewards; the rows stay on the device."""
    B = stage.prompts_per_step
    buf = filters.RefillBuffer(B, stage.refill_rounds if stage.dynamic_filter else 1)
    timing, first, rows = defaultdict(float), None, []
    while not buf.ready():
        sampled, t = rollouts.sample(params, rollouts.prompts(B), max_new, jax.random.fold_in(rng, len(rows)))
        for k, v in t.items():  # seconds add up over rounds; the agent's means: the first round's
            if k.endswith("_s") or rows == []:
                timing[k] += v
        groups = sampled.groups | {"group_id": B * len(rows) + np.arange(B)}
        rows.append(sampled.rows)
        first = first or groups
        keep = np.ones(B, bool)
        if stage.dynamic_filter:
            keep &= filters.dynamic_filter_keep(groups["rewards"])
        if stage.mask_if_max_reward_below != DEFAULTS["mask_if_max_reward_below"]:
            keep &= filters.max_reward_keep(groups["rewards"], stage.mask_if_max_reward_below)
        buf.add(groups, keep)
    kept, fstats = buf.take()
    return rows, kept, first, fstats, timing
