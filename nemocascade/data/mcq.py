"""Procedural STEM-style multiple choice (C2 "multi-domain RL": STEM MCQ), with an imperfect teacher.

A short question and four options A-D, drawn from four small families over a closed vocabulary:

    arith    "What is 23+48?"                  options 71 / 61 / 72 / 81   (2-digit + or -)
    compare  "Which is largest?"               options 9 / 52 / 488 / 61
    convert  "How many cm are in 7 m?"         options 700 / 7000 / 7 / 107
    science  "Which of these is a mammal?"     options cat / owl / iron / Vega (fixed fact table)

    prompt:    "What is 23+48?\\nA. 61\\nB. 71\\nC. 81\\nD. 72"
    reasoning: "3+8=11, write 1 carry 1; 2+4+1=7, write 7; so 23+48=71; A 61 no, B 71 yes; so B"
    response:  "The answer is \\boxed{B}."        answer: "B"

**Imperfect teacher.** With probability ``teacher_error_rate`` the teacher makes its family's
systematic slip, and its trace then argues, consistently, for the option the slip leads to (which
is always one of the four):

    arith    forgets the first carry/borrow (``nemocascade.data.math``), on carry problems only;
    compare  orders the numbers as strings ("9" > "488"), wrong only when that changes the pick;
    convert  uses a factor with one zero too many ("1 m = 1000 cm");
    science  swaps a category with its twin (mammal/bird, metal/gas, planet/star, fish/insect).

Held-out split: by the canonical question (family, stem content and the *set* of option values),
so the same question with its options in another order never crosses splits. ``answer`` is always
the correct letter.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from nemocascade.data import math as dmath
from nemocascade.data.domains import Domain, check_args, family_weights, register, split_of
from nemocascade.rewards import mcq as mcq_reward

DOMAIN = "mcq"
LETTERS = "ABCD"
DEFAULT_FAMILIES = {"arith": 0.3, "compare": 0.25, "convert": 0.25, "science": 0.2}
UNITS = (("m", "cm", 100), ("km", "m", 1000), ("kg", "g", 1000), ("cm", "mm", 10),
         ("L", "mL", 1000), ("h", "min", 60), ("min", "s", 60), ("t", "kg", 1000))
KINDS = {
    "mammal": ("cat", "dog", "whale", "horse", "bat", "cow"),
    "bird": ("owl", "duck", "hawk", "crow", "hen", "swan"),
    "metal": ("iron", "gold", "copper", "tin", "zinc", "silver"),
    "gas": ("oxygen", "helium", "neon", "hydrogen", "argon", "nitrogen"),
    "planet": ("Mars", "Venus", "Earth", "Jupiter", "Saturn", "Mercury"),
    "star": ("Sun", "Sirius", "Vega", "Rigel", "Polaris", "Altair"),
    "fish": ("shark", "trout", "salmon", "cod", "tuna", "carp"),
    "insect": ("ant", "bee", "moth", "wasp", "fly", "beetle"),
}
TWIN = {"mammal": "bird", "metal": "gas", "planet": "star", "fish": "insect"}
TWIN.update({v: k for k, v in TWIN.items()})
KIND_OF = {item: kind for kind, items in KINDS.items() for item in items}


@dataclasses.dataclass(frozen=True)
class Question:
    """A question: ``key`` its canonical identity (the split key), ``options[0]`` the right option,
    ``slip`` the teacher's wrong pick (None when the slip does not change the answer) and
    ``explain(order, slipped)`` the trace up to the letter, given the options in display order."""

    key: str
    stem: str
    options: tuple[str, ...]
    slip: str | None
    explain: Callable[[list[str], bool], tuple[str, str]]  # -> (reasoning, chosen option)


def _distinct(rng, first: list[int], pool: list[int], k: int = 4) -> list[int]:
    """``first`` then values of ``pool`` in a random order, no repeats, ``k`` in all."""
    out = list(dict.fromkeys(first))
    for v in (pool[i] for i in rng.permutation(len(pool))):
        if len(out) == k:
            break
        if v not in out:
            out.append(v)
    return out


def arith_question(rng) -> Question:
    a, b = int(rng.integers(10, 100)), int(rng.integers(10, 100))
    op = "+" if rng.random() < 0.5 else "-"
    p = dmath.Problem(op, max(a, b), min(a, b)) if op == "-" else dmath.Problem(op, a, b)
    traces = {s: dmath.solve(p, forget_carry=s) for s in (False, True)}
    v, w = traces[False][1], traces[True][1]
    values = _distinct(rng, [v, w], [x for x in (v + 10, v - 10, v + 1, v - 1, v + 11, v - 9) if x >= 0])

    def explain(order, slipped):
        trace, value = traces[slipped]
        return trace, str(value)
    # The distractors are drawn at random, so the key is the problem alone.
    return Question(f"arith:{p.key}", f"What is {p.a}{p.op}{p.b}?", tuple(map(str, values)),
                    str(w) if w != v else None, explain)


def compare_question(rng) -> Question:
    values = []
    while len(values) < 4:
        digits = int(rng.integers(1, 4))
        x = int(rng.integers(10 ** (digits - 1) if digits > 1 else 1, 10**digits))
        if x not in values:
            values.append(x)
    most = "largest" if rng.random() < 0.5 else "smallest"
    pick = max if most == "largest" else min
    right, slip = pick(values), int(pick(map(str, values)))  # the slip: string order

    def explain(order, slipped):
        chain = sorted(values, key=str) if slipped else sorted(values)
        chosen = slip if slipped else right
        return f"{'<'.join(map(str, chain))}, so the {most} is {chosen}", str(chosen)
    ordered = [right] + [x for x in values if x != right]
    key = f"compare:{most}:{','.join(map(str, sorted(values)))}"
    return Question(key, f"Which is {most}?", tuple(map(str, ordered)), str(slip) if slip != right else None,
                    explain)


def convert_question(rng) -> Question:
    big, small, factor = UNITS[int(rng.integers(len(UNITS)))]
    q = int(rng.integers(2, 21))
    # Distinct for q >= 2, factor >= 10: q < q+factor < q*factor < 10*q*factor.
    values = (q * factor, q * factor * 10, q, q + factor)

    def explain(order, slipped):
        f = factor * 10 if slipped else factor  # the slip: one zero too many in the factor
        return f"1 {big} = {f} {small}, {q}*{f}={q * f}", str(q * f)
    return Question(f"convert:{big}:{q}", f"How many {small} are in {q} {big}?", tuple(map(str, values)),
                    str(values[1]), explain)


def _article(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


def science_question(rng) -> Question:
    kinds = sorted(KINDS)
    kind = kinds[int(rng.integers(len(kinds)))]
    twin = TWIN[kind]
    others = [k for k in kinds if k not in (kind, twin)]
    picked = [kind, twin] + [others[i] for i in rng.choice(len(others), 2, replace=False)]
    items = [KINDS[k][int(rng.integers(len(KINDS[k])))] for k in picked]
    right, slip = items[0], items[1]

    def explain(order, slipped):
        def kind_of(item):  # the slip swaps the asked category with its twin
            k = KIND_OF[item]
            return {kind: twin, twin: kind}.get(k, k) if slipped else k
        facts = ", ".join(f"{item} is {_article(kind_of(item))}" for item in order)
        chosen = slip if slipped else right
        return f"{facts}; the {kind} is {chosen}", chosen
    key = f"science:{kind}:{','.join(sorted(items))}"
    return Question(key, f"Which of these is {_article(kind)}?", tuple(items), slip, explain)


FAMILIES: dict[str, Callable] = {
    "arith": arith_question, "compare": compare_question, "convert": convert_question,
    "science": science_question}


def prompt_text(stem: str, order: list[str]) -> str:
    return stem + "".join(f"\n{letter}. {option}" for letter, option in zip(LETTERS, order))


def option_checks(order: list[str], chosen: str) -> str:
    """The trace's last steps: the options in display order, each checked against the chosen value, up to the
    first match: ``A 9 no, B 28 no, C 18 yes``. Each check is local (this option against the value the trace
    worked out), so the letter to write is the latest one in the trace: a small model does not learn to look an
    option up in a list."""
    checks = []
    for letter, option in zip(LETTERS, order):
        checks.append(f"{letter} {option} {'yes' if option == chosen else 'no'}")
        if option == chosen:
            break
    return ", ".join(checks)


def response_text(letter: str) -> str:
    return f"The answer is \\boxed{{{letter}}}."


def generate(rng: np.random.Generator, n: int, *, split: str | None = "train",
             teacher_error_rate: float = 0.0, families: dict[str, float] | None = None,
             test_every: int = 10) -> list[dict]:
    """``n`` MCQ records (domains.py record contract), deterministic given ``rng`` and the options.

    Args:
        split: keep only questions with ``split_of(question.key, test_every) == split``
            (``None``: no filtering).
        teacher_error_rate: probability of the family's systematic slip (module docstring).
        families: family name -> sampling weight (default :data:`DEFAULT_FAMILIES`).
    """
    families = DEFAULT_FAMILIES if families is None else families
    names, weights = family_weights(families, FAMILIES, "mcq")
    check_args(split, teacher_error_rate)

    records, attempts = [], 0
    while len(records) < n:
        attempts += 1
        if attempts > 100 * n * test_every + 1000:
            raise ValueError(f"found only {len(records)} of {n} mcq questions for split {split!r}")
        family = names[int(rng.choice(len(names), p=weights / weights.sum()))]
        q = FAMILIES[family](rng)
        if split is not None and split_of(q.key, test_every) != split:
            continue
        order = [q.options[i] for i in rng.permutation(4)]
        # Always draw, so the question stream does not depend on the rate.
        slipped = bool(rng.random() < teacher_error_rate) and q.slip is not None
        reasoning, chosen = q.explain(order, slipped)
        letter = LETTERS[order.index(chosen)]
        records.append({
            "domain": DOMAIN,
            "prompt": prompt_text(q.stem, order),
            "reasoning": f"{reasoning}; {option_checks(order, chosen)}; so {letter}",
            "response": response_text(letter),
            "answer": LETTERS[order.index(q.options[0])],
            "id": f"{DOMAIN}/{split or 'all'}/{len(records)}/{q.key}",
        })
    return records


register(Domain(
    # 3: the trace checks the options in order up to the chosen one (option_checks)
    name=DOMAIN, generate=generate, verifier=mcq_reward.score, version="3",
    description="procedural STEM multiple choice (A-D) with a systematically slipping teacher"))
