"""The one on-policy stage loop: GRPO, RLHF and MOPD (with its GKD variants) are configurations of it.

Each step, strictly on-policy (METHOD.md "GRPO as used in every RL stage", "MOPD"):
  1. sample B prompts x G rollouts from the *current* params (jitted sampler, KV cache);
  2. score: the stage's reward source (stages/reward_sources.py: each domain's verifier, a reward model, a judge),
     (for monitoring too, where no term trains on them); group filters (max-reward mask, dynamic
     filter with bounded refill);
  3. the kept groups' rows gathered on the device (rl/rollouts.py: training_batch);
  4. the frozen roles the objective reads: the reference (= the params the stage started from, no copy) and
     each prompt's teacher (`objective.teachers`: domain -> checkpoint, default `best:<domain>`);
  5. exactly one optimiser update on `objective` (rl/update.py: `prepare` computes the group
     advantages A_i = (r_i - mean_g r) / (std_g r + eps) from the rewards, after the overlong filter or penalty,
     when a term reads them).

What differs between kinds is only configuration: GRPO `objective=dict(terms=dict(pg=1, kl=...))` with rewards
(RLHF: `reward=dict(source="reward_model", model=` an earlier `rm` stage`)`); MOPD `objective=dict(terms=dict(mopd=1),
aggregation="seq_mean_token_mean")`, no reward, a learning rate warming up from 0.1x. Any mixture of terms is
one config away. The rollout kind is the one argument: one turn (`one_turn`, the default) or multi-turn episodes in
an environment (stages/agent.py passes its `EpisodeSource`).

Left out on purpose: PPO epochs / clipping (one update per batch: the ratio is always 1), value functions,
asynchronous rollouts.
"""
from __future__ import annotations

import time
from collections import defaultdict

import jax
import numpy as np

from nemocascade import checkpoint, objectives, preflight
from nemocascade.rl import filters
from nemocascade.rl import rollouts as rollouts_lib
from nemocascade.rl import update
from nemocascade.stages import common, reward_sources

# The stage's parts, each read (and validated) by one module: rollout (rl/rollouts.py), objective (objectives.py),
# filters (rl/filters.py), reward (stages/reward_sources.py)
DEFAULTS = dict(
    rollout=dict(rollouts_lib.DEFAULTS), objective=dict(objectives.DEFAULTS), filters=dict(filters.DEFAULTS),
    reward=dict(reward_sources.REWARD_DEFAULTS),
)


def check(stage, earlier: dict) -> list[str]:
    """What is wrong with an on-policy stage's settings, as `part.key: problem` lines (empty: fine); run at
    validation. `earlier`: the stages before it (`reward.model` must name one of kind "rm")."""
    return loop_problems(stage) + reward_sources.problems(stage, earlier)


def loop_problems(stage) -> list[str]:
    """The parts every on-policy stage has (rollout, objective, filters), then the checks that span them."""
    bad = rollouts_lib.problems(stage) + objectives.problems(stage.objective)
    trains_on_rewards = "advantages" in objectives.needs(stage.objective)
    bad += filters.problems(stage, trains_on_rewards)
    if bad:
        return bad
    B, G, M = stage.rollout.prompts_per_step, stage.rollout.group_size, stage.objective.micro_batches
    bad += [f"rollout.group_size={G}: the group baseline needs >= 2 rollouts per prompt (one is always its own "
            "mean: advantage 0, nothing trains)"] if trains_on_rewards and G < 2 else []
    return bad + ([f"objective.micro_batches={M} must divide rollout.prompts_per_step*group_size={B * G}"]
                  if (B * G) % M else [])


def teacher_refs(stage) -> dict[str, str]:
    """domain -> teacher checkpoint name for every domain of the stage; {} when no term reads a teacher."""
    if not objectives.needs(stage.objective) & update.TEACHER_INPUTS:
        return {}
    teachers = stage.objective.teachers
    extra = sorted(set(teachers) - set(stage.domains))
    if extra:
        raise ValueError(f"objective.teachers names domain(s) {extra} that the stage does not train on "
                         f"(domains: {list(stage.domains)})")
    return {d: teachers.get(d, f"best:{d}") for d in stage.domains}


def load_teachers(ctx, name: str, stage) -> tuple[tuple, np.ndarray]:
    """Distinct teacher params (on the student's mesh) and run-domain index -> teacher index."""
    refs = teacher_refs(stage)
    resolved = {d: ctx.checkpoints.stage_of(ref) for d, ref in refs.items()}
    print(f"[{name}] teachers: " + ", ".join(f"{d} <- {refs[d]} ({s})" for d, s in resolved.items()), flush=True)
    order = list(dict.fromkeys(resolved.values()))
    params = tuple(checkpoint.load_params(ctx.checkpoints.path(f"stage:{s}"), ctx.abstract_params) for s in order)
    of_domain = [order.index(resolved[d]) if d in resolved else 0 for d in ctx.cfg.data.domains]
    return params, np.asarray(of_domain, np.int32)


def one_turn(ctx, stage, data_iter, epoch_len, epoch_filter):
    """The default rollout kind: one sampled response per rollout, scored by the stage's reward source."""
    return rollouts_lib.RolloutSource(ctx, stage, data_iter, epoch_len, epoch_filter,
                                      scorer=reward_sources.build(ctx, stage))


def run(ctx: common.RunContext, name: str, stage, params, source=one_turn, records=None):
    """Train `stage.steps` on-policy steps from `params` (settings checked by `check` at validation). `source`: the
    rollout kind, (ctx, stage, data_iter, epoch_len, epoch_filter) -> a RolloutSource (`one_turn`; stages/agent.py:
    episodes); `records`: the train problems to draw from, when not all of the stage's domains' (a prefiltered
    set)."""
    B, o = stage.rollout.prompts_per_step, stage.objective
    objective = objectives.build(o)
    tx, schedule = common.optimizer(stage)
    teachers, teacher_of_domain = load_teachers(ctx, name, stage) if objective.needs & update.TEACHER_INPUTS \
        else ((), None)
    roles = update.FrozenRoles(ctx.model_cfg, objective.needs, teachers=teachers,
                               reference=params if "ref_logp" in objective.needs else None,
                               teacher_of_domain=teacher_of_domain, topk=o.distill_topk, micro_batches=o.micro_batches)
    data_iter, epoch_len = common.prompt_stream(ctx, name, stage, records)
    epoch_filter = filters.EpochFilter(seed=ctx.cfg.seed) if stage.filters.epoch else None
    rollouts = source(ctx, stage, data_iter, epoch_len, epoch_filter)
    run_domains = list(ctx.cfg.data.domains)
    loss, step_options = update.policy_objective(
        model_cfg=ctx.model_cfg, objective=objective, micro_batches=o.micro_batches, overlong=stage.filters.overlong,
        domains=tuple((run_domains.index(d), d) for d in stage.domains))
    trainer = common.Trainer(ctx, name, stage, params, tx, loss, data_iter=data_iter,
                             extra_state_fns=(rollouts.state_dict, rollouts.load_state_dict), **step_options)
    with trainer:
        preflight.onpolicy(ctx, name, stage, trainer, roles, rollouts)
        for step in trainer.steps():
            max_new = rollouts_lib.max_new_tokens_at(stage.rollout, step)
            rng = jax.random.fold_in(jax.random.wrap_key_data(trainer.state.rng), step)
            rows, kept, first, fstats, timing = sample_groups(rollouts, trainer.params, stage, max_new, rng)
            t0 = time.perf_counter()
            if fstats["kept"]:  # every group filtered out: no update, the step counter moves on
                batch = rollouts_lib.training_batch(rows, kept, B, stage.rollout.group_size, ctx.mesh)
                metrics = trainer.update(batch | roles(batch))
            else:
                metrics = trainer.skip()
            timing["train_s"] = time.perf_counter() - t0
            metrics |= dict(timing) | rollouts_lib.rollout_metrics(first, run_domains)
            metrics |= {"lr": float(schedule(step)), "max_new_tokens": max_new, "kept_groups": fstats["kept"],
                        "refill_rounds": fstats["rounds"]}
            metrics |= rollouts.take_metrics()
            if stage.eval_every and (step + 1) % stage.eval_every == 0:
                metrics |= common.quick_eval(ctx, trainer.params, stage)
            trainer.log(step, metrics)
        return trainer.finish()


def sample_groups(rollouts, params, stage, max_new: int, rng):
    """`prompts_per_step` prompts x G rollouts, sampled again (up to `filters.refill_rounds`, B prompts a round: one
    compiled sampler) while the reward filters drop groups -> (each round's device rows, the kept groups (host,
    with `group_id`: the index into the rounds' rows), the first round's groups, filter stats, timings summed
    over rounds). The filters read only the host's rewards; the rows stay on the device."""
    B, f = stage.rollout.prompts_per_step, stage.filters
    buf = filters.RefillBuffer(B, f.refill_rounds if f.dynamic else 1)
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
        if f.dynamic:
            keep &= filters.dynamic_filter_keep(groups["rewards"])
        if f.max_reward_below is not None:
            keep &= filters.max_reward_keep(groups["rewards"], f.max_reward_below)
        buf.add(groups, keep)
    kept, fstats = buf.take()
    return rows, kept, first, fstats, timing
