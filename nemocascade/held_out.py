"""What a run scores after every stage (`cascade.run` calls it): every domain of the run, every agent evaluation
(`config.eval.agents`) and every named evaluation set, on the held-out test items (greedy pass@1, avg@k where asked)
and on validation; the per-item test scores kept in eval_scores/<stage>.json and paired against an earlier stage's.
`validate` checks the `config.eval` keys this reads, before a run starts."""
from __future__ import annotations

import json
import os

import jax

from nemocascade import envs, evaluation, files, hosts, stats
from nemocascade.errors import BadInput
from nemocascade.rl import episodes
from nemocascade.stages import common

# config.eval.avg_k_domains: which domains an RL stage's avg@k covers. "trained": its own (cheaper); "all": every
# domain, so that each stage's avg@k has a paired comparison with its start's on every domain
AVG_K_DOMAINS = ("trained", "all")  # the first is the default
VAL_N = 200  # validation items per domain after each stage, unless config.eval.val_n says otherwise (0: all)
AGENT_KEYS = ("max_turns", "max_new_tokens", "max_total_tokens", "max_obs_tokens", "envs", "avg_k")
# an agent evaluation's optional keys at their defaults: 0 = no episode budget beyond max_turns x max_new_tokens;
# observations cut to 128 tokens; greedy only
AGENT_DEFAULTS = {"max_total_tokens": 0, "max_obs_tokens": 128, "avg_k": 0}


def agent(max_turns: int, max_new_tokens: int, **kw) -> dict:
    """A `config.eval.agents` entry with every optional key present (`AGENT_DEFAULTS`, overridden by `kw`), so
    that each can be set from the command line (`--config.eval.agents.multi.avg_k=4`); `envs` stays optional
    (domain -> environment, else the domain's own)."""
    _check_agent_keys("agent evaluation", kw)
    return {"max_turns": max_turns, "max_new_tokens": max_new_tokens} | AGENT_DEFAULTS | kw


def _check_agent_keys(where: str, keys) -> None:
    unknown = sorted(set(keys) - set(AGENT_KEYS))
    if unknown:
        raise BadInput(f"{where}: unknown key(s) {unknown}; known: {list(AGENT_KEYS)}")


def avg_k_domains(cfg) -> str:
    return cfg.eval.get("avg_k_domains", AVG_K_DOMAINS[0])


def validate(cfg) -> None:
    """`errors.BadInput` naming the bad `config.eval` key (sizes, avg@k sampling, agents, named sets)."""
    for key in ("batch_size", "max_prompt_len", "max_new_tokens"):
        if cfg.eval[key] <= 0:
            raise BadInput(f"config.eval.{key} must be > 0, got {cfg.eval[key]}")
    sampled = eval_sampling(cfg)
    if sampled["avg_k"] < 0 or not sampled["temperature"] > 0 or not 0 < sampled["top_p"] <= 1:
        raise BadInput("config.eval: avg_k must be >= 0 (0: greedy only), temperature > 0 and 0 < top_p <= 1; got "
                       + ", ".join(f"{k}={v}" for k, v in sampled.items()))
    for name, agent in cfg.eval.get("agents", {}).items():
        _check_agent_keys(f"config.eval.agents.{name}", agent)
        if agent.get("avg_k", AGENT_DEFAULTS["avg_k"]) < 0:
            raise BadInput(f"config.eval.agents.{name}.avg_k must be >= 0 (0: greedy only), got {agent.avg_k}")
    if avg_k_domains(cfg) not in AVG_K_DOMAINS:
        raise BadInput(f"config.eval.avg_k_domains={cfg.eval.avg_k_domains!r}: one of {AVG_K_DOMAINS}")
    for set_name in cfg.eval.get("sets", {}):
        if set_name not in evaluation.EVAL_SETS:
            raise BadInput(f"config.eval.sets.{set_name}: unknown evaluation set; "
                           f"known: {sorted(evaluation.EVAL_SETS)}")


def eval_sets(cfg, tokenizer) -> dict:
    """name -> (the records scored, the number left out as too long) of every named evaluation set
    (`config.eval.sets`): its first `n` items (0: all) whose prompt fits its `max_prompt_len`."""
    out = {}
    for name, sc in cfg.eval.get("sets", {}).items():
        everything = evaluation.load_eval_set(name)
        fit = evaluation.fitting(tokenizer, everything, sc.get("max_prompt_len", cfg.eval.max_prompt_len),
                                 cfg.thinking)
        out[name] = (fit[:sc.get("n", 0) or None], len(everything) - len(fit))
    return out


def evaluate_all(ctx: common.RunContext, params, split: str = "test", stage=None) -> tuple[dict, dict]:
    """Held-out score of every domain of the run (C1's per-stage table), not only the stage's own, on `split`
    (the first `eval.n` test items, or the first `eval.val_n` validation items), and on test also every named
    evaluation set (`config.eval.sets`: name -> {n, max_prompt_len, max_new_tokens}):
    (summary eval {name: {"pass@1", "n", "ci95", ...}}, per-item scores {name: [score per item]}).

    On test, avg@k (`eval.avg_k` samples per item) beside greedy pass@1: for an RL `stage`, on the domains it
    trained, at its own sampling temperature and top-p (code RL's 0.95); otherwise (SFT, the starting model, a
    stage that does not sample) on every domain at `eval.temperature` / `eval.top_p`; `eval.avg_k_domains="all"`:
    every domain for an RL stage too. Per-item scores: {name: [greedy score]} and, where avg@k was measured,
    {"avg@k/<name>": [mean of the item's k samples]}."""
    out = {}
    n = ctx.cfg.eval.n if split == "test" else ctx.cfg.eval.get("val_n", VAL_N)
    sampled, sampled_domains = eval_sampling(ctx.cfg), ()
    rl = stage is not None and "rollout" in stage
    if rl:  # an RL stage samples at its own settings
        sampled |= {"temperature": stage.rollout.temperature, "top_p": stage.rollout.top_p}
    if split == "test" and sampled["avg_k"]:
        own_only = rl and avg_k_domains(ctx.cfg) == "trained"
        sampled_domains = tuple(stage.domains if own_only else ctx.cfg.data.domains)
    for i, domain in enumerate(ctx.cfg.data.domains):
        records = ctx.eval_records(domain, split, n or None)  # distinct items only
        out[domain] = evaluation.evaluate(params, ctx.model_cfg, ctx.tokenizer, records, ctx.pool,
                                          rng=jax.random.key(i), **common.eval_settings(ctx, domain),
                                          **(sampled if domain in sampled_domains else {}),
                                          desc=f"eval {split} {domain}")
    for i, (domain, name, agent) in enumerate(agent_evals(ctx.cfg)):  # agents in environments, beside the above
        records = ctx.eval_records(domain, split, n or None)
        out[f"{domain}@{name}"] = evaluation.evaluate_episodes(
            params, ctx.model_cfg, ctx.tokenizer, records, [envs.env_name(domain, agent.get("envs"))] * len(records),
            agent_settings(ctx, agent), batch_size=ctx.cfg.eval.batch_size, rng=jax.random.key(2000 + i),
            mesh=ctx.mesh, desc=f"eval {split} {domain}@{name}", temperature=sampled["temperature"],
            top_p=sampled["top_p"], avg_k=agent.get("avg_k", AGENT_DEFAULTS["avg_k"]) if split == "test" else 0)
    for name, sc in ctx.cfg.eval.get("sets", {}).items() if split == "test" else ():
        settings = common.eval_settings(ctx) | {k: sc[k] for k in ("max_prompt_len", "max_new_tokens") if k in sc}
        records, too_long = ctx.eval_sets[name]
        out[name] = evaluation.evaluate(params, ctx.model_cfg, ctx.tokenizer, records, ctx.pool,
                                        rng=jax.random.key(1000), **settings) | {"skipped_too_long": too_long}
    items = {name: result.pop("scores") for name, result in out.items()}
    items |= {f"avg@k/{name}": result.pop("avg@k_scores") for name, result in out.items() if "avg@k_scores" in result}
    return out, items


def agent_evals(cfg) -> list[tuple]:
    """(domain, name, settings) of every agent evaluation `config.eval.agents` names (name -> {max_turns,
    max_new_tokens per turn, max_total_tokens, max_obs_tokens, envs, avg_k}), on each run domain with an
    environment: scored as "<domain>@<name>". `avg_k` (default 0) > 0: on test also avg@k, k sampled episodes per
    item at the eval's (after an RL stage: that stage's) temperature and top-p."""
    return [(d, name, a) for name, a in cfg.eval.get("agents", {}).items() for d in cfg.data.domains
            if envs.env_name(d, a.get("envs"))]


def agent_settings(ctx, agent):
    """Greedy episodes with an agent evaluation's budgets (`agent_evals`); unset keys from `config.eval`."""
    e = ctx.cfg.eval
    turns, per_turn = agent.get("max_turns", 1), agent.get("max_new_tokens", e.max_new_tokens)
    return episodes.Settings(max_turns=turns, max_new_tokens=per_turn,
                             max_total_tokens=agent.get("max_total_tokens", AGENT_DEFAULTS["max_total_tokens"]),
                             max_obs_tokens=agent.get("max_obs_tokens", AGENT_DEFAULTS["max_obs_tokens"]),
                             max_prompt_len=e.max_prompt_len,
                             greedy=True, thinking=ctx.cfg.thinking)


def eval_sampling(cfg) -> dict:
    """avg@k's settings from `config.eval` (avg_k 0: greedy pass@1 only)."""
    return {k: cfg.eval.get(k, default) for k, default in (("avg_k", 0), ("temperature", 1.0), ("top_p", 1.0))}


def item_scores_path(ctx, stage_name: str) -> str:
    return os.path.join(ctx.workdir, "eval_scores", f"{stage_name}.json")


def evaluate_and_keep_items(ctx, stage_name: str, params, stage=None) -> tuple[dict, dict, dict]:
    """(test eval, validation eval, per-item test scores) of `params` after `stage` (None: the starting model);
    the per-item scores also go to eval_scores/<stage_name>.json, for later stages' paired comparisons."""
    scores, items = evaluate_all(ctx, params, stage=stage)
    if hosts.is_lead():
        files.atomic_write(item_scores_path(ctx, stage_name), json.dumps(items))
    return scores, evaluate_all(ctx, params, "val")[0], items


def paired_gains(ctx, before_stage: str | None, items: dict) -> dict:
    """{eval name: {"mean_gain", "ci95"}} of per-item test scores `items` against `before_stage`'s on the same
    items (paired bootstrap, `stats.paired_diff_ci95`); {} when that stage's per-item scores are not on disk."""
    path = item_scores_path(ctx, before_stage) if before_stage else ""
    if not path or not files.exists(path):
        return {}
    before = files.read_json(path)
    out = {}
    for name, after in items.items():
        if len(before.get(name, ())) == len(after):
            gain, ci = stats.paired_diff_ci95(before[name], after)
            out[name] = {"mean_gain": gain, "ci95": ci}
    return out


def split_avg_k(paired: dict) -> tuple[dict, dict]:
    """Paired gains -> (greedy pass@1's, avg@k's by domain: the `avg@k/<name>` items)."""
    return ({k: v for k, v in paired.items() if not k.startswith("avg@k/")},
            {k.split("/", 1)[1]: v for k, v in paired.items() if k.startswith("avg@k/")})
