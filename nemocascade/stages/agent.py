"""Agent stage kind: GRPO over multi-turn episodes (Cascade 2's execution-based agentic SWE RL, its last stage).

The on-policy loop of stages/onpolicy.py with episodes for rollouts (`EpisodeSource`): each of the G rollouts of a
prompt is an episode in its domain's environment (nemocascade/envs.py: `swe_repair` runs the tests on the patch the
model wrote and answers with their output), the policy taking up to `episodes.max_turns` turns, one KV cache
throughout (rl/episodes.py); the environment rewards the episode, so the stage has no `reward` part. Only the
model's tokens are trained on (observations are masked out).

C2's solve-rate prefilter (optional, `prefilter.prompts`): before training, the first `prompts` distinct train
problems are sampled `samples` times each by the starting policy; those solved every time are dropped, and a
`drop_unsolved` share of those never solved; the stage draws from the rest.
"""
from __future__ import annotations

import json
import os
import time

import jax
import numpy as np

from nemocascade import envs, files
from nemocascade.data import domains as domains_lib
from nemocascade.errors import unknown_keys
from nemocascade.mesh import shard_batch
from nemocascade.rl import episodes
from nemocascade.rl import rollouts as rollouts_lib
from nemocascade.run_log import progress
from nemocascade.stages import common, grpo, onpolicy

EPISODE_DEFAULTS = dict(
    max_turns=3, envs={},  # domain -> environment name (default: the domain's own, Domain.env)
    max_total_tokens=None,  # per episode after the prompt, the model's and the observations' tokens (None:
    # max_turns x max_new_tokens); each turn's limit is the rollout's max_new_tokens
    max_obs_tokens=128,
    stop_tokens=(),  # vocabulary pieces that also end a turn, e.g. ("</tool_call>",) with a Qwen tokenizer
)
PREFILTER_DEFAULTS = dict(prompts=None, samples=16, drop_unsolved=0.9)  # prompts None: no prefilter
DEFAULTS = {k: v for k, v in grpo.DEFAULTS.items() if k != "reward"} | dict(
    episodes=dict(EPISODE_DEFAULTS), prefilter=dict(PREFILTER_DEFAULTS))


def check(stage, earlier: dict) -> list[str]:
    """The loop's parts (onpolicy.loop_problems), then `episodes` and `prefilter`, as `part.key: problem` lines."""
    return onpolicy.loop_problems(stage) + episode_problems(stage) + prefilter_problems(stage)


def episode_problems(stage) -> list[str]:
    e = stage.episodes
    bad = unknown_keys("episodes", e, EPISODE_DEFAULTS)
    if bad or e.max_turns < 1:
        return bad or [f"episodes.max_turns={e.max_turns} must be >= 1"]
    bad = [f"episodes.envs.{d}={v!r}: no such environment; registered: {sorted(envs.ENVS)}"
           for d, v in e.envs.items() if v not in envs.ENVS]
    bad += [f"episodes.envs names domain {d!r}, not one of the stage's domains {list(stage.domains)}"
            for d in e.envs if d not in stage.domains]
    bad += [f"domains: {d!r} has no environment; set episodes.envs.{d} to one of {sorted(envs.ENVS)}"
            for d in stage.domains if d not in e.envs and envs.env_name(d) is None]
    max_new = stage.rollout.max_new_tokens
    bad += [f"rollout.sample_chunks={stage.rollout.sample_chunks}: episodes run all their rows at once (1 only)"
            ] if stage.rollout.sample_chunks != 1 else []
    bad += [f"episodes.max_total_tokens={e.max_total_tokens} must be None or >= rollout.max_new_tokens={max_new}"
            ] if e.max_total_tokens is not None and e.max_total_tokens < max_new else []
    return bad + ([f"episodes.max_obs_tokens={e.max_obs_tokens} must be >= 16"] if e.max_obs_tokens < 16 else [])


def prefilter_problems(stage) -> list[str]:
    f = stage.prefilter
    bad = unknown_keys("prefilter", f, PREFILTER_DEFAULTS)
    if bad or f.prompts is None:
        return bad
    bad = [f"prefilter.prompts={f.prompts} must be None or >= 1"] if f.prompts < 1 else []
    bad += [f"prefilter.samples={f.samples} must be >= 1"] if f.samples < 1 else []
    return bad + ([f"prefilter.drop_unsolved={f.drop_unsolved} must lie in [0, 1]"]
                  if not 0 <= f.drop_unsolved <= 1 else [])


def episode_settings(stage, max_new: int, ctx) -> episodes.Settings:
    """The stage's budgets (its `episodes` part) at its `rollout` sampling settings."""
    e, r = stage.episodes, stage.rollout
    return episodes.Settings(
        max_turns=e.max_turns, max_new_tokens=max_new, max_total_tokens=e.max_total_tokens,
        max_obs_tokens=e.max_obs_tokens, max_prompt_len=rollouts_lib.prompt_width(stage, ctx),
        temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, thinking=ctx.cfg.thinking,
        stop_tokens=tuple(e.stop_tokens))


class EpisodeSource(rollouts_lib.RolloutSource):
    """RolloutSource whose G rollouts per record are episodes in the record's environment, rewarded by it. The
    agent loop runs on the host (each turn is decoded for the environment), so its rows go to the device here."""

    sampler = None  # episodes decode turn by turn (sampling.decode_turn), not in one sampler call: preflight skips it

    def sample(self, params, records, max_new: int, rng):
        ctx, stage = self.ctx, self.stage
        t = time.perf_counter()
        settings = episode_settings(stage, max_new, ctx)
        names = [envs.env_name(r["domain"], stage.episodes.envs) for r in records]
        traj = episodes.run_episodes(params, ctx.model_cfg, ctx.tokenizer, records, names, settings, rng, ctx.mesh,
                                     self.G)
        domain_index = {d: i for i, d in enumerate(ctx.cfg.data.domains)}
        g = episodes.trajectory_groups(traj, [domain_index[r["domain"]] for r in records], self.G,
                                       settings.max_prompt_len, settings.budget)
        if self.epoch_filter:
            self.epoch_filter.update([r["id"] for r in records], g["rewards"])
        used = g["valid"].any(1)  # [P, L]: the columns some rollout of the group uses
        groups = {k: g[k] for k in ("rewards", "truncated", "lengths", "domain_idx")} | {
            "first": used.argmax(1), "end": used.shape[1] - used[:, ::-1].argmax(1)}
        Rows = rollouts_lib.Rows
        rows = Rows(*shard_batch(ctx.mesh, [g[k].reshape(-1, *g[k].shape[2:]) for k in Rows._fields]))
        wall = time.perf_counter() - t
        stats = {"generate_s": wall - traj.env_s, "score_s": traj.env_s}
        return rollouts_lib.Rollouts(rows, groups), stats | episodes.episode_metrics(traj)

    def take_metrics(self) -> dict:
        return {}  # the environments reward; no scorer counts anything


def run(ctx: common.RunContext, name: str, stage, params):
    kept = solve_rate_prefilter(ctx, name, stage, params) if stage.prefilter.prompts else None
    return onpolicy.run(ctx, name, stage, params, source=EpisodeSource, records=kept)


def solve_rate_prefilter(ctx, name: str, stage, params) -> list[dict]:
    """The train problems the stage keeps after C2's filter (module docstring), sampled at the stage's own settings
    from `params`. Decided once: the kept ids and the solve counts go to `<workdir>/prefilter/<stage>.json`, which
    a resumed stage reads instead of sampling again."""
    f = stage.prefilter
    examined = domains_lib.first_distinct(common.mixture_source(ctx, stage.domains, "train"), f.prompts)
    path = os.path.join(ctx.workdir, "prefilter", f"{name}.json")
    if files.exists(path):
        ids = set(json.loads(files.read_text(path))["kept_ids"])
        return [r for r in examined if r["id"] in ids]
    K, B = f.samples, stage.rollout.prompts_per_step
    source = EpisodeSource(ctx, stage, iter(()), 1, group_size=K)
    solved = []
    rng = jax.random.key(ctx.cfg.seed + 7919)
    for start in progress(range(0, len(examined), B), desc=f"[{name}] prefilter x{K}"):
        part = examined[start:start + B]
        part += [part[-1]] * (B - len(part))  # one compiled shape
        sampled, _ = source.sample(params, part, rollouts_lib.max_new_tokens_at(stage.rollout, 0),
                                   jax.random.fold_in(rng, start))
        solved += (sampled.groups["rewards"] >= 1.0).sum(1)[:len(examined) - start].tolist()
    solved = np.asarray(solved)
    kept = [r for r, k in zip(examined, prefilter_keep(solved, K, f.drop_unsolved, ctx.cfg.seed)) if k]
    if not kept:
        raise ValueError(f"stage {name!r}: the prefilter kept none of {len(examined)} problems (solved {K}/{K}: "
                         f"{int((solved == K).sum())}, 0/{K}: {int((solved == 0).sum())}); lower "
                         "prefilter.drop_unsolved or raise prefilter.prompts")
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


KIND = common.StageKind("agent", DEFAULTS, run, check, teacher_refs=onpolicy.teacher_refs)
