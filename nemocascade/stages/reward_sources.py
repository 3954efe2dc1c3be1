"""Where an on-policy stage's rewards come from: a registry of reward sources, chosen by the stage's
`reward.source` (METHOD.md "Rewards per domain"). The stage's `reward` dict (`REWARD_DEFAULTS`) is read here alone.

A source builds, once per stage, a scorer of the protocol

    rewards = scorer(records, texts, lengths)     # P records, P x G response texts (after the think block is
                                                  # the scorer's to cut), lengths [P, G] -> rewards [P, G]
    scorer.take_metrics() -> {name: value}        # what it measured since the last call, for metrics.jsonl

Built in: "verifier" (each domain's verifier, or the one `reward.verifiers` names, in the sandboxed pool: counts
of calls that timed out, raised or crashed), "reward_model" (the Bradley-Terry model an earlier `rm` stage trained,
named by `reward.model`), "judge" (a generative judge named by `reward.judge`: C2's pairwise GenRM or the
reference-answer judge). A source's own keys (`model`, `judge`) are read by it alone: set while another source is
chosen, they are an error. An experiment adds a source with `register` and selects it with `reward.source=NAME`.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Callable

import ml_collections
import numpy as np

from nemocascade import checkpoint, evaluation
from nemocascade.data import domains
from nemocascade.errors import unknown_keys
from nemocascade.models import pretrained
from nemocascade.rewards import judge as judge_lib
from nemocascade.rewards import rm_scorer
from nemocascade.rewards.pool import OUTCOMES
from nemocascade.stages import rm

REWARD_MODES = ("scalar", "pairwise", "reference")
REWARD_DEFAULTS = dict(
    source="verifier",  # "verifier" (each domain's), "reward_model", "judge", or one an experiment registers
    verifiers={},  # source "verifier": domain -> a rewards.REWARDS key (or another domain) instead of its own
    # RLHF (METHOD.md "Rewards per domain"): `model` names the earlier `rm` stage whose BT reward model scores the
    # text after </think>; mode "scalar" = its score, "pairwise" = Cascade 2's aggregation (mean Pr(i beats j) over
    # the group, ties broken by ranking, optional quality-gated conciseness bonus)
    model="", mode="scalar", conciseness_bonus=0.0, quality_gate=0.5,
    # source "judge": a generative judge (rewards/judge.py), a frozen causal LM on the policy's mesh: "stage:NAME" /
    # "best:DOMAIN" (a checkpoint of this run), "gguf" (SmolLM2-135M-Instruct), "gguf:PATH", "hf:PATH". Mode
    # "pairwise": C2's GenRM (every pair of a group judged in both orders, then the aggregation above);
    # "reference": Pr(the response gives the record's answer), C2's long-context judge
    judge="", judge_mode="logprob", judge_max_len=384, judge_batch_size=64,
)
JUDGE_SOURCES = ("stage:", "best:", "gguf", "hf:")


@dataclasses.dataclass(frozen=True)
class RewardSource:
    name: str
    build: Callable  # (ctx, stage) -> scorer (module docstring)
    check: Callable  # (stage, earlier: {name: stage config}) -> ["key: problem", ...]
    keys: dict  # `reward` key -> its value when unused: keys only this source reads


SOURCES: dict[str, RewardSource] = {}


def register(name: str, build: Callable, check: Callable | None = None, keys: dict | None = None) -> None:
    """Add reward source `name` (a stage selects it with `reward.source=name`). Registering the same build function
    again (a config file loaded twice) is fine; another one under a taken name is a ValueError."""
    old = SOURCES.get(name)
    if old is not None and (old.build.__module__, old.build.__qualname__) != (build.__module__, build.__qualname__):
        raise ValueError(f"reward source {name!r} is already registered by {old.build.__module__}")
    SOURCES[name] = RewardSource(name, build, check or (lambda stage, earlier: []), dict(keys or {}))


def problems(stage, earlier: dict) -> list[str]:
    """What is wrong with a stage's `reward` dict, as `reward.<key>: problem` lines (empty: fine)."""
    r = stage.reward
    unknown = unknown_keys("reward", r, REWARD_DEFAULTS)
    if unknown:
        return unknown
    chosen = SOURCES.get(r.source)
    if chosen is None:
        return [f"reward.source={r.source!r}: no such source; registered: {sorted(SOURCES)}"]
    plain = lambda v: v.to_dict() if hasattr(v, "to_dict") else v  # noqa: E731
    bad = [f"reward.{k}={plain(r[k])!r}: read only by reward.source={s.name!r}, not by the stage's {chosen.name!r}"
           for s in SOURCES.values() if s is not chosen for k, unused in s.keys.items() if plain(r[k]) != unused]
    bad += [f"reward.mode={r.mode!r}; choose one of {REWARD_MODES}"] if r.mode not in REWARD_MODES else []
    return bad + chosen.check(stage, earlier)


def build(ctx, stage):
    return SOURCES[stage.reward.source].build(ctx, stage)


def verifiers(stage) -> dict:
    """domain -> the verifier that scores it in `stage` (`reward.verifiers`, else the domain's own; a stage without
    a `reward` dict, SFT's, uses each domain's own). An unknown name raises KeyError / ValueError naming it."""
    chosen = stage.reward.verifiers if "reward" in stage else {}
    for d in chosen:
        if d not in stage.domains:
            raise ValueError(f"reward.verifiers names domain {d!r}, not one of the stage's domains "
                             f"{list(stage.domains)}")
    return {d: domains.verifier(chosen.get(d, d)) for d in stage.domains}


# ---------------------------------------------------------------------------------------------- verifier


class VerifierScorer:
    """Each rollout scored by its domain's verifier (`reward.verifiers`, else the domain's own) in the
    run's sandboxed pool; `take_metrics` gives verifier_timeouts / _errors / _crashes (each such call scored 0)."""

    def __init__(self, ctx, stage):
        self.pool = ctx.pool
        self.rewards = verifiers(stage)
        self._counts = dict.fromkeys((f"verifier_{k}" for k in OUTCOMES), 0)

    def __call__(self, records, texts, lengths):
        G = np.shape(lengths)[1]
        scores, counts = evaluation.score_texts(self.pool, texts, [r for r in records for _ in range(G)],
                                                self.rewards)
        for k, v in counts.items():
            self._counts[k] += v
        return np.asarray(scores, np.float32).reshape(len(records), G)

    def take_metrics(self) -> dict:
        out, self._counts = self._counts, dict.fromkeys(self._counts, 0)
        return out


def verifier_problems(stage, earlier: dict) -> list[str]:
    return [f"reward.mode={stage.reward.mode!r}: read by reward.source 'reward_model' or 'judge'; the verifier "
            "scores each rollout alone"] if stage.reward.mode != "scalar" else []


register("verifier", VerifierScorer, verifier_problems, keys={"verifiers": {}})


# ------------------------------------------------------------------------------ reward model and judge


def group_rewards(prefs, lengths, stage) -> np.ndarray:
    """[P, G] Cascade 2 rewards of each group's [G, G] Pr(i beats j) (`rm_scorer.pairwise_rewards`, the stage's
    conciseness bonus and quality gate): one aggregation for the BT RM and the generative judge."""
    return np.stack([rm_scorer.pairwise_rewards(p, lens, stage.reward.conciseness_bonus, stage.reward.quality_gate)
                     for p, lens in zip(prefs, lengths)])


RM_MAX_LEN = 160  # tokens of the final answer's text the reward model reads


class RewardModelScorer:
    """Rewards from the BT reward model of stage `reward.model` (saved by `stages/rm.py`), on the text after
    </think>: its score (`reward.mode="scalar"`) or C2's pairwise aggregation over the group ("pairwise")."""

    def __init__(self, ctx, stage):
        self.stage = stage
        self.rm = rm_scorer.RewardModelScorer.load(
            rm.rm_path(ctx.workdir, stage.reward.model), ctx.model_cfg, ctx.tokenizer, mesh=ctx.mesh,
            batch_size=stage.rollout.prompts_per_step * stage.rollout.group_size, max_len=RM_MAX_LEN)

    def __call__(self, records, texts, lengths):
        G = np.shape(lengths)[1]
        s = self.rm.score([r["prompt"] for r in records for _ in range(G)], texts).reshape(len(records), G)
        if self.stage.reward.mode == "scalar":
            return s
        return group_rewards([rm_scorer.bt_preferences(row) for row in s], lengths, self.stage)

    def take_metrics(self) -> dict:
        return {}


def reward_model_problems(stage, earlier: dict) -> list[str]:
    src = stage.reward.model
    if not src or src not in earlier or earlier[src].kind != "rm":
        return [f"reward.model={src!r}: must name an earlier stage of kind 'rm' (earlier: {list(earlier)})"]
    return ["reward.mode='reference' needs reward.source='judge'"] if stage.reward.mode == "reference" else []


register("reward_model", RewardModelScorer, reward_model_problems, keys={"model": ""})


def load_judge(ctx, stage):
    """The stage's judge (rewards/judge.py) on the run's mesh: a checkpoint of this run, or a GGUF / HF model."""
    r = stage.reward
    spec = r.judge
    if spec.startswith(("stage:", "best:")):
        params = checkpoint.load_params(ctx.checkpoints.path(spec), ctx.abstract_params)
        model_cfg, tokenizer, thinking = ctx.model_cfg, ctx.tokenizer, ctx.cfg.thinking
    else:
        kind, _, path = spec.partition(":")
        model_cfg, params, tokenizer = pretrained.load(ml_collections.ConfigDict(dict(kind=kind, path=path,
                                                                                      num_layers=0)), ctx.mesh)
        thinking = False  # an imported instruct model answers in plain ChatML
    return judge_lib.Judge(params, model_cfg, tokenizer, mode=r.judge_mode, batch_size=r.judge_batch_size,
                           max_len=r.judge_max_len, seed=ctx.cfg.seed, thinking=thinking, mesh=ctx.mesh)


class JudgeScorer:
    """Rewards from the stage's judge, which never reads the think block: C2's GenRM (`reward_mode="pairwise"`:
    every pair of a group in both orders, then `group_rewards`) or the reference-answer judge (mode "reference").
    `take_metrics`: judge_s (seconds judging), judge_rows, judge_unparsable and, for GenRM, judge_position_bias
    and judge_inconsistent (rewards/judge.py)."""

    def __init__(self, ctx, stage):
        self.stage, self.judge = stage, load_judge(ctx, stage)
        self._extra: dict[str, list[float]] = defaultdict(list)

    def __call__(self, records, texts, lengths):
        stage, G = self.stage, np.shape(lengths)[1]
        finals = [rm_scorer.final_text(t) for t in texts]
        if stage.reward.mode == "reference":
            r = judge_lib.reference_rewards(self.judge, [r["prompt"] for r in records for _ in range(G)],
                                            [str(r["answer"]) for r in records for _ in range(G)], finals)
            return r.reshape(len(records), G)
        groups = [finals[k * G:(k + 1) * G] for k in range(len(records))]
        prefs, stats = judge_lib.pairwise_preferences_batch(self.judge, [r["prompt"] for r in records], groups)
        if stats["pairs"]:
            self._extra["judge_position_bias"].append(stats["position_bias"])
            self._extra["judge_inconsistent"].append(stats["inconsistent"])
        return group_rewards(prefs, lengths, stage)

    def take_metrics(self) -> dict:
        s = self.judge.take_stats()
        out = {"judge_s": s["seconds"], "judge_rows": s["rows"], "judge_unparsable": s["unparsable"]}
        out |= {k: float(np.mean(v)) for k, v in self._extra.items()}
        self._extra.clear()
        return out


def judge_problems(stage, earlier: dict) -> list[str]:
    r = stage.reward
    j = r.judge
    bad = [f"reward.judge={j!r}: reward.mode must be 'pairwise' (GenRM) or 'reference' (answer judge), not "
           "'scalar'"] if r.mode == "scalar" else []
    bad += [f"reward.judge={j!r}: choose 'stage:NAME', 'best:DOMAIN', 'gguf', 'gguf:PATH' or 'hf:PATH'"] if not (
        j.startswith(JUDGE_SOURCES) and j not in ("stage:", "best:", "hf:")) else []
    bad += [f"reward.judge={j!r}: no earlier stage {j[6:]!r} (earlier: {list(earlier)})"] if (
        j.startswith("stage:") and j[6:] not in earlier) else []
    bad += [f"reward.judge_mode={r.judge_mode!r}; choose one of {judge_lib.MODES}"] if (
        r.judge_mode not in judge_lib.MODES) else []
    bad += [f"reward.judge_batch_size={r.judge_batch_size} must be >= 1"] if r.judge_batch_size < 1 else []
    return bad + ([f"reward.judge_max_len={r.judge_max_len} must be >= 64"] if r.judge_max_len < 64 else [])


register("judge", JudgeScorer, judge_problems, keys={"judge": ""})
