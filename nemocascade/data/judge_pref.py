"""Judging the "pref" domain's pairs (domain ``"judge_pref"``): the SFT data a generative judge is trained on.

Each record asks, in the judging prompt a `rewards.judge.Judge` reads (`pair_instruction`), which of two answers
to a "pref" request is better; the two are that request's chosen and rejected answers, in either order:

    prompt:    "Two assistants answered the same request. ... [Request] Give one tip for sleep. [Response A]
                I don't know. [Response B] Keep your room dark for better sleep. ... Reply with A or B."
    reasoning: ""                  (the verdict alone: what the judge's log-probability mode reads)
    response:  "Verdict: B"        answer: "B"       (scored by rewards/verdict.py, strictly)

Order. In training the chosen answer is A or B at random; in the held-out splits it is A in even-numbered records
and B in odd ones, so accuracy by position (ids end in ``/A`` or ``/B``) measures the judge's position bias.

Splits and pairs are "pref"'s own (`preference.generate` with the same split), so no held-out request is judged
in training. With ``teacher_error_rate`` the target verdict is flipped (a noisy labeller); ``compound`` is pref's.
"""
from __future__ import annotations

import json

import numpy as np

from nemocascade.data import preference
from nemocascade.data.domains import Domain, check_args, register
from nemocascade.rewards import verdict
from nemocascade.rewards.verdict import PAIR_OPTIONS, judging_record, pair_instruction

DOMAIN = "judge_pref"


def generate(rng: np.random.Generator, n: int, *, split: str | None = "train", teacher_error_rate: float = 0.0,
             test_every: int = 10, compound: bool = False) -> list[dict]:
    """``n`` judging records over ``n`` "pref" pairs of `split` (module docstring), deterministic given ``rng``."""
    check_args(split, teacher_error_rate)
    records = []
    pairs = preference.generate(rng, n, split=split, test_every=test_every, compound=compound)
    for k, pair in enumerate(pairs):
        answer = json.loads(pair["answer"])
        chosen_first = bool(rng.integers(2)) if split == "train" else k % 2 == 0
        a, b = (answer["chosen"], answer["rejected"]) if chosen_first else (answer["rejected"], answer["chosen"])
        right = PAIR_OPTIONS[0 if chosen_first else 1]
        records.append(judging_record(DOMAIN, pair_instruction(pair["prompt"], a, b), right,
                                      f"{DOMAIN}/{pair['id'].split('/', 1)[1]}/{answer['kind']}/{right}",
                                      rng.random() < teacher_error_rate))
    return records


def rejected_kind(record: dict) -> str:
    """The kind of the worse answer a record judges ("verbose", "off_topic", ...), from its id (`generate`:
    ``judge_pref/<pref id>/<kind>/<A|B>``)."""
    return record["id"].split("/")[-2]


register(Domain(
    name=DOMAIN, generate=generate, verifier=verdict.score, version="2",
    description="judge which of a 'pref' request's two answers is better (a generative judge's SFT data)"))
