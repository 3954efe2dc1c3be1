"""Checking answers against a reference (domain ``"judge_longctx"``): the SFT data of C2's long-context answer judge.

Each record shows a "longctx" question (its whole context), the reference answer and a candidate response, in the
prompt an answer judge reads (`rewards.verdict.reference_instruction`); the candidate is the right answer or another
code from the same context (the distractor a reader slips to), half each:

    prompt:    "Check a response against the reference answer. [Question] The code of box 17 is 482. ... What is
                the code of box 5? [Reference answer] 301 [Response] The answer is \\boxed{482}. ... Yes or No."
    reasoning: ""           response: "Verdict: No"          answer: "No"      (scored by rewards/verdict.py)

Splits are longctx's own (the question's key), so no held-out question is judged in training.
"""
from __future__ import annotations

import re

import numpy as np

from nemocascade.data import longctx
from nemocascade.data.domains import Domain, check_args, register
from nemocascade.rewards import verdict
from nemocascade.data.math import response_text
from nemocascade.rewards.verdict import REFERENCE_OPTIONS, judging_record, reference_instruction

DOMAIN = "judge_longctx"
_CODE = re.compile(r"The code of box \d+ is (\d+)\.")


def generate(rng: np.random.Generator, n: int, *, split: str | None = "train", teacher_error_rate: float = 0.0,
             num_facts: int = 16, hops: int = 1, test_every: int = 10) -> list[dict]:
    """``n`` answer-checking records over ``n`` longctx questions of `split` (module docstring)."""
    check_args(split, teacher_error_rate)
    records = []
    for q in longctx.generate(rng, n, split=split, num_facts=num_facts, hops=hops, test_every=test_every):
        others = sorted({c for c in _CODE.findall(q["prompt"]) if c != q["answer"]})
        right = bool(rng.integers(2))
        candidate = q["answer"] if right else others[int(rng.integers(len(others)))]
        verdict = REFERENCE_OPTIONS[0 if right else 1]
        records.append(judging_record(DOMAIN, reference_instruction(q["prompt"], q["answer"], response_text(candidate)),
                                      verdict, f"{DOMAIN}/{q['id'].split('/', 1)[1]}/{candidate}",
                                      rng.random() < teacher_error_rate))
    return records


register(Domain(
    name=DOMAIN, generate=generate, verifier=verdict.score, version="1",
    description="check a longctx response against the reference answer (an answer judge's SFT data)"))
