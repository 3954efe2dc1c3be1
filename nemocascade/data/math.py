"""Procedural math problems with worked solutions from an *imperfect teacher*.

Small enough for a ~1-5M parameter transformer to learn on CPU in minutes: multi-digit addition,
subtraction, small multiplication, and short word problems, each solved with a compact, regular
column algorithm that spells every digit step:

    What is 23+48?   reasoning: "3+8=11, write 1 carry 1; 2+4+1=7, write 7; so 23+48=71"
    What is 52-48?   reasoning: "12-8=4, write 4 borrow 1; 5-4-1=0, write 0; so 52-48=4"
    What is 23*7?    reasoning: "3*7=21, write 1 carry 2; 2*7+2=16, write 16; so 23*7=161"
    response (all):  "The answer is \\boxed{71}."

Columns go right to left over the operands padded with zeros; the last column of ``+`` and ``*``
writes its whole value, so only a carry/borrow *between* columns exists.

**Imperfect teacher** (what leaves headroom for RL after SFT). A problem is a *carry
problem* (:func:`needs_carry`) if some column passes a carry or borrow to the next. On such a
problem the teacher, with probability ``teacher_error_rate``, forgets the first carry/borrow: it
writes the column digit but neither announces nor adds the carry, and finishes consistently, so
reasoning and response agree on a wrong number (``a+b - 10^(j+1)``, ``a-b + 10^(j+1)``, or
``a*b - c*10^(j+1)`` for a dropped carry ``c`` out of column ``j``). At a rate of ~0.6 the wrong
trace is the mode, so greedy imitation fails exactly on carry problems, while the correct trace
is still sampled ~40% of the time for a verifiable reward to reinforce. No-carry problems are
always solved correctly, and the record's ``answer`` is always the true value.

Held-out split: by the canonical key of the *problem* (``Problem.key``, e.g. ``"+:23:48"``), so a
word problem about 23+48 and the bare "What is 23+48?" always fall in the same split.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from nemocascade.data.domains import Domain, check_args, family_weights, register, split_of
from nemocascade.rewards import math as math_reward

DOMAIN = "math"
OPS = ("+", "-", "*")
DEFAULT_FAMILIES = {"add": 0.35, "sub": 0.25, "mul": 0.2, "word": 0.2}
NAMES = ("Tom", "Ann", "Sam", "Mia", "Leo", "Eva", "Max", "Zoe")
ITEMS = ("apples", "pens", "books", "cards", "coins", "shells", "stamps", "marbles")
# One template per operation; {a} op {b} is the canonical problem (subtraction keeps a >= b).
WORD_TEMPLATES = {
    "+": "{name} has {a} {item} and buys {b} more. How many {item} now?",
    "-": "{name} has {a} {item} and gives {b} away. How many {item} are left?",
    "*": "{name} buys {b} bags of {a} {item}. How many {item} in total?",
}


@dataclasses.dataclass(frozen=True)
class Problem:
    """A canonical arithmetic problem ``a op b``; the surface wording is not part of it."""

    op: str  # "+", "-" or "*"
    a: int
    b: int

    @property
    def key(self) -> str:
        """Canonical identity used for the train/test split, e.g. ``"+:23:48"``."""
        return f"{self.op}:{self.a}:{self.b}"

    @property
    def value(self) -> int:
        """The true result."""
        return {"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op]


def _digits(x: int, width: int) -> list[int]:
    """Little-endian digits of ``x`` padded with zeros to ``width``."""
    return [int(c) for c in reversed(str(x).rjust(width, "0"))]


def _add_columns(a: int, b: int, forget: bool) -> tuple[list[str], int, bool]:
    width = max(len(str(a)), len(str(b)))
    xs, ys = _digits(a, width), _digits(b, width)
    steps, written, carry, carried = [], [], 0, False
    for i, (x, y) in enumerate(zip(xs, ys)):
        s = x + y + carry
        lhs = f"{x}+{y}" + ("+1" if carry else "")
        if i == width - 1:  # last column writes its whole value
            steps.append(f"{lhs}={s}, write {s}")
            written.append(str(s)[::-1])
            break
        step, carry = f"{lhs}={s}, write {s % 10}", s // 10
        if carry and forget and not carried:
            carry = 0  # the teacher's systematic slip: the first carry is dropped
        elif carry:
            step += " carry 1"
        carried = carried or s >= 10
        steps.append(step)
        written.append(str(s % 10))
    return steps, int("".join(written)[::-1]), carried


def _sub_columns(a: int, b: int, forget: bool) -> tuple[list[str], int, bool]:
    """Column subtraction for ``a >= b``: a borrow adds 10 to this column, 1 to the next b digit."""
    width = len(str(a))
    xs, ys = _digits(a, width), _digits(b, width)
    steps, written, borrow, borrowed = [], [], 0, False
    for x, y in zip(xs, ys):
        out = 1 if x - borrow < y else 0
        d = x + 10 * out - y - borrow
        step = f"{x + 10 * out}-{y}" + ("-1" if borrow else "") + f"={d}, write {d}"
        if out and forget and not borrowed:
            # Forgotten borrow: the teacher still writes d (it silently took the 10), but does not
            # pay it back on the next column.
            borrow = 0
        else:
            borrow = out
            step += " borrow 1" if out else ""
        borrowed = borrowed or bool(out)
        steps.append(step)
        written.append(str(d))
    return steps, int("".join(written)[::-1]), borrowed


def _mul_columns(a: int, b: int, forget: bool) -> tuple[list[str], int, bool]:
    """``a`` (any digits) times single-digit ``b``."""
    width = len(str(a))
    xs = _digits(a, width)
    steps, written, carry, carried = [], [], 0, False
    for i, x in enumerate(xs):
        s = x * b + carry
        lhs = f"{x}*{b}" + (f"+{carry}" if carry else "")
        if i == width - 1:
            steps.append(f"{lhs}={s}, write {s}")
            written.append(str(s)[::-1])
            break
        step, carry = f"{lhs}={s}, write {s % 10}", s // 10
        if carry and forget and not carried:
            carry = 0
        elif carry:
            step += f" carry {carry}"
        carried = carried or s >= 10
        steps.append(step)
        written.append(str(s % 10))
    return steps, int("".join(written)[::-1]), carried


def _columns(p: Problem, forget: bool) -> tuple[str, int, bool]:
    """(column trace, result, whether a carry/borrow crosses columns) for ``p``."""
    if p.op == "+":
        steps, result, carried = _add_columns(p.a, p.b, forget)
    elif p.op == "*":
        if not 0 <= p.b <= 9:
            raise ValueError(f"multiplication needs a single-digit second operand, got {p.key}")
        steps, result, carried = _mul_columns(p.a, p.b, forget)
    elif p.op == "-":
        big, small = max(p.a, p.b), min(p.a, p.b)
        steps, result, carried = _sub_columns(big, small, forget)
        if p.a < p.b:  # negative result: subtract the other way round and negate
            steps.insert(0, f"{p.a}<{p.b}, swap: {p.b}-{p.a}")
            result = -result
    else:
        raise ValueError(f"unknown op {p.op!r} in problem {p!r}")
    steps.append(f"so {p.a}{p.op}{p.b}={result}")
    return "; ".join(steps), result, carried


def needs_carry(problem: Problem) -> bool:
    """True iff solving ``problem`` passes a carry (or borrow) from one column to the next."""
    return _columns(problem, forget=False)[2]


def solve(problem: Problem, forget_carry: bool = False) -> tuple[str, int]:
    """The teacher's worked solution: ``(reasoning, final number)``.

    ``forget_carry=True`` drops the first carry/borrow (no effect on problems without one); the
    reasoning then ends in the wrong number it returns. Deterministic.
    """
    if problem.op not in OPS or problem.a < 0 or problem.b < 0:
        raise ValueError(f"unsupported problem {problem!r}: need op in '+-*' and a, b >= 0")
    reasoning, result, _ = _columns(problem, forget_carry)
    return reasoning, result


def response_text(result: int) -> str:
    """The final text after ``</think>``."""
    return f"The answer is \\boxed{{{result}}}."


# --- problem families: (rng, opts) -> (Problem, prompt text, reasoning prefix) -----------------

def _operand(rng: np.random.Generator, max_digits: int, low: int = 0) -> int:
    """Digit count uniform in [1, max_digits], then uniform among numbers with that many digits
    (one-digit numbers start at ``low``), so short and long operands are equally common."""
    k = int(rng.integers(1, max_digits + 1))
    return int(rng.integers(low if k == 1 else 10 ** (k - 1), 10**k))


def add_problem(rng, opts):
    p = Problem("+", _operand(rng, opts["max_digits"]), _operand(rng, opts["max_digits"]))
    return p, f"What is {p.a}+{p.b}?", ""


def sub_problem(rng, opts):
    a, b = _operand(rng, opts["max_digits"]), _operand(rng, opts["max_digits"])
    if not opts["allow_negative"] and a < b:
        a, b = b, a
    p = Problem("-", a, b)
    return p, f"What is {p.a}-{p.b}?", ""


def mul_problem(rng, opts):
    p = Problem("*", _operand(rng, opts["mul_digits"]), int(rng.integers(2, 10)))
    return p, f"What is {p.a}*{p.b}?", ""


def word_problem(rng, opts):
    op = "+-*"[int(rng.integers(0, 3))]
    name, item = NAMES[int(rng.integers(len(NAMES)))], ITEMS[int(rng.integers(len(ITEMS)))]
    # Operands >= 2 keep the stories sensible ("gives 0 away", "1 apples").
    a = _operand(rng, opts["word_digits"], low=2)
    b = int(rng.integers(2, 10)) if op == "*" else _operand(rng, opts["word_digits"], low=2)
    if op == "-" and a < b:  # "gives away" more than it has is not a sensible story
        a, b = b, a
    p = Problem(op, a, b)
    prompt = WORD_TEMPLATES[op].format(name=name, item=item, a=a, b=b)
    return p, prompt, f"{a}{op}{b}: "


FAMILIES: dict[str, Callable] = {
    "add": add_problem, "sub": sub_problem, "mul": mul_problem, "word": word_problem}


def generate(rng: np.random.Generator, n: int, *, split: str | None = "train",
             teacher_error_rate: float = 0.0, max_digits: int = 3, mul_digits: int = 2,
             word_digits: int = 2, allow_negative: bool = False,
             families: dict[str, float] | None = None, test_every: int = 10, instruction: str = "") -> list[dict]:
    """``n`` math records (domains.py record contract), deterministic given ``rng`` and the options.

    Args:
        split: keep only problems with ``split_of(problem.key, test_every) == split``
            (``None``: no filtering). Problems may repeat within a split (each draw gets its own
            teacher trace), never across splits.
        teacher_error_rate: probability that the teacher forgets the first carry/borrow on a
            carry problem (module docstring). 0.0 = perfect; ~0.6 makes the error the mode.
        max_digits: operand digits for ``add``/``sub``; ``mul_digits``: first factor of
            ``mul`` (the second is 2..9); ``word_digits``: operands of word problems.
        allow_negative: let ``sub`` produce ``a < b`` (negative results).
        families: family name -> sampling weight (default :data:`DEFAULT_FAMILIES`); the
            order of the dict does not matter.
        instruction: appended to every prompt (after a space), e.g. the answer format a pretrained chat model
            is asked for; "" (default): none.
    """
    families = DEFAULT_FAMILIES if families is None else families
    names, weights = family_weights(families, FAMILIES, "math")
    for key, v in (("max_digits", max_digits), ("mul_digits", mul_digits),
                   ("word_digits", word_digits)):
        if not 1 <= v <= 18:
            raise ValueError(f"{key} must be in [1, 18], got {v}")
    check_args(split, teacher_error_rate)
    opts = dict(max_digits=max_digits, mul_digits=mul_digits, word_digits=word_digits,
                allow_negative=allow_negative)
    probs = weights / weights.sum()

    records, attempts = [], 0
    max_attempts = 100 * n * test_every + 1000  # guards a problem space with no key in `split`
    while len(records) < n:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(
                f"found only {len(records)} of {n} math problems for split {split!r} in "
                f"{max_attempts} draws; the problem space is too small (raise max_digits)")
        family = names[int(rng.choice(len(names), p=probs))]
        problem, prompt, prefix = FAMILIES[family](rng, opts)
        if split is not None and split_of(problem.key, test_every) != split:
            continue
        # Always draw, so the record stream does not depend on which problems carry.
        forget = bool(rng.random() < teacher_error_rate) and needs_carry(problem)
        reasoning, result = solve(problem, forget_carry=forget)
        records.append({
            "domain": DOMAIN,
            "prompt": f"{prompt} {instruction}" if instruction else prompt,
            "reasoning": prefix + reasoning,
            "response": response_text(result),
            "answer": str(problem.value),
            "id": f"{DOMAIN}/{split or 'all'}/{len(records)}/{family}/{problem.key}",
        })
    return records


register(Domain(
    name=DOMAIN, generate=generate, verifier=math_reward.score, version="1",
    description="procedural arithmetic with an imperfect (carry-forgetting) teacher"))
