"""Procedural function-writing tasks (domain ``"code"``) with an imperfect teacher.

Small enough for a ~1M-parameter model: one-line functions from ten families, each with one small
integer parameter ``k``, stated and solved with fixed templates::

    prompt:    "Write a function f(x) that returns the larger of x and 7."
    reasoning: "Compare x with 7 and return the larger one."
    response:  "```python\\ndef f(x):\\n    return x if x > 7 else 7\\n```"
    answer:    '{"tests": "assert f(-4) == 7\\nassert f(0) == 7\\n...", "entry_point": "f"}'

The tests are four asserts on fixed inputs per family, chosen so that every family's slip below fails at
least one of them; their expected values come from evaluating the teacher's own correct expression, so
the correct program passes by construction. ``nemocascade.rewards.code`` runs them in the sandbox.

**Imperfect teacher.** With probability ``teacher_error_rate`` the teacher makes its family's one
systematic slip (a one-token change: a wrong operator, a flipped comparison, an off-by-one slice or
count) and its plan says what the slipped code does, so reasoning and response agree on a wrong program
(as the forgotten carry of ``data/math.py``). Above 0.5 the slip is the mode: greedy imitation fails,
while the correct program is still sampled often enough for the verifiable reward to reinforce it.

Held-out split: by the canonical task ``"family:k"`` (e.g. ``"max:7"``); 118 tasks in all.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable

import numpy as np

from nemocascade.data.domains import DomainSpec, check_args, family_weights, register_domain, split_of

DOMAIN = "code"
ENTRY_POINT = "f"


@dataclasses.dataclass(frozen=True)
class Family:
    """One task family; ``{k}`` in the texts is the task's parameter."""

    arg: str  # the function's argument: "x" (int), "xs" (list of int) or "s" (str)
    task: str  # what f returns, in words
    plan: str
    body: str  # the returned expression
    slip_plan: str
    slip_body: str
    ks: tuple[int, ...]  # allowed k
    inputs: Callable[[int], tuple]  # k -> the four test inputs


def _ints(k: int) -> tuple:
    """Below and above every k (so ``<`` vs ``>`` differs), and a multiple of 7 (so ``%`` vs ``//`` does)."""
    return (-4, 0, 7, 25)


def _lists(k: int) -> tuple:
    """Lists that contain k (so ``>`` vs ``>=`` differs) and are longer than k + 1 (so slices differ)."""
    return ([1, 2, 3, 4, 5, 6, 7], [k, k, k + 2], [], [k + 1, 0, k, 9, 3, 8, 2])


def _strs(k: int) -> tuple:
    return ("abcdefgh", "hi", "", "hello world")


FAMILIES: dict[str, Family] = {
    "add": Family("x", "x plus {k}", "Add {k} to x.", "x + {k}",
                  "Subtract {k} from x.", "x - {k}", tuple(range(1, 20)), _ints),
    "sub": Family("x", "x minus {k}", "Subtract {k} from x.", "x - {k}",
                  "Add {k} to x.", "x + {k}", tuple(range(1, 20)), _ints),
    "mul": Family("x", "x times {k}", "Multiply x by {k}.", "x * {k}",
                  "Add {k} to x.", "x + {k}", tuple(range(2, 10)), _ints),
    "mod": Family("x", "the remainder of x divided by {k}", "Take x modulo {k}.", "x % {k}",
                  "Divide x by {k} and round down.", "x // {k}", tuple(range(2, 10)), _ints),
    "max": Family("x", "the larger of x and {k}", "Compare x with {k} and return the larger one.",
                  "x if x > {k} else {k}", "Compare x with {k} and return the smaller one.",
                  "x if x < {k} else {k}", tuple(range(0, 20)), _ints),
    "min": Family("x", "the smaller of x and {k}", "Compare x with {k} and return the smaller one.",
                  "x if x < {k} else {k}", "Compare x with {k} and return the larger one.",
                  "x if x > {k} else {k}", tuple(range(0, 20)), _ints),
    "sum_first": Family("xs", "the sum of the first {k} items of xs", "Sum the first {k} items of xs.",
                        "sum(xs[:{k}])", "Sum the first {k} items of xs and one more.", "sum(xs[:{k} + 1])",
                        tuple(range(1, 6)), _lists),
    "count_gt": Family("xs", "how many items of xs are greater than {k}",
                       "Count the items of xs that are greater than {k}.", "sum(1 for v in xs if v > {k})",
                       "Count the items of xs that are at least {k}.", "sum(1 for v in xs if v >= {k})",
                       tuple(range(0, 10)), _lists),
    "repeat": Family("s", "s repeated {k} times", "Repeat s {k} times.", "s * {k}",
                     "Repeat s {k} times and once more.", "s * ({k} + 1)", tuple(range(2, 6)), _strs),
    "prefix": Family("s", "the first {k} characters of s", "Take the first {k} characters of s.", "s[:{k}]",
                     "Take the first {k} characters of s and one more.", "s[:{k} + 1]",
                     tuple(range(1, 6)), _strs),
}


@dataclasses.dataclass(frozen=True)
class Task:
    """A canonical task: a family and its parameter."""

    family: str
    k: int

    @property
    def key(self) -> str:
        """Canonical identity used for the train/test split, e.g. ``"max:7"``."""
        return f"{self.family}:{self.k}"


def all_tasks() -> list[Task]:
    """Every canonical task, in a fixed order."""
    return [Task(name, k) for name, fam in FAMILIES.items() for k in fam.ks]


def prompt_text(task: Task) -> str:
    fam = FAMILIES[task.family]
    return f"Write a function {ENTRY_POINT}({fam.arg}) that returns {fam.task.format(k=task.k)}."


def program(task: Task, slip: bool = False) -> str:
    """The teacher's program (with its family's slip if ``slip``)."""
    fam = FAMILIES[task.family]
    body = (fam.slip_body if slip else fam.body).format(k=task.k)
    return f"def {ENTRY_POINT}({fam.arg}):\n    return {body}\n"


def plan(task: Task, slip: bool = False) -> str:
    fam = FAMILIES[task.family]
    return (fam.slip_plan if slip else fam.plan).format(k=task.k)


def tests_text(task: Task) -> str:
    """Four asserts; expected values from evaluating the correct expression here (our own, trusted code)."""
    fam = FAMILIES[task.family]
    expr = fam.body.format(k=task.k)
    lines = []
    for value in fam.inputs(task.k):
        expected = eval(expr, {"__builtins__": {"sum": sum}}, {fam.arg: value})  # our own template, not model code
        lines.append(f"assert {ENTRY_POINT}({value!r}) == {expected!r}")
    return "\n".join(lines) + "\n"


def answer_json(task: Task) -> str:
    return json.dumps({"tests": tests_text(task), "entry_point": ENTRY_POINT})


def response_text(task: Task, slip: bool = False) -> str:
    return f"```python\n{program(task, slip)}```"


def generate(rng: np.random.Generator, n: int, *, split: str | None = "train", teacher_error_rate: float = 0.0,
             families: dict[str, float] | None = None, test_every: int = 10) -> list[dict]:
    """``n`` code records (domains.py record contract), deterministic given ``rng`` and the options.

    Args:
        split: keep only tasks with ``split_of(task.key, test_every) == split`` (``None``: all). Tasks
            repeat within a split (the task space is small), never across splits.
        teacher_error_rate: probability that the teacher makes its family's slip (module docstring).
        families: family name -> sampling weight (default: all of :data:`FAMILIES`, equally).
    """
    families = dict.fromkeys(FAMILIES, 1.0) if families is None else families
    names, weights = family_weights(families, FAMILIES, "code")
    check_args(split, teacher_error_rate)
    # Tasks of each family in the split, so a draw never has to be rejected.
    pools = {f: [t for t in all_tasks() if t.family == f and (split is None or split_of(t.key, test_every) == split)]
             for f in names}
    weights = np.array([w if pools[f] else 0.0 for f, w in zip(names, weights)])
    if weights.sum() <= 0:
        raise ValueError(f"no code task of families {names} falls in split {split!r} (test_every={test_every})")
    probs = weights / weights.sum()

    records = []
    for i in range(n):
        family = names[int(rng.choice(len(names), p=probs))]
        task = pools[family][int(rng.integers(len(pools[family])))]
        slip = bool(rng.random() < teacher_error_rate)
        records.append({
            "domain": DOMAIN,
            "prompt": prompt_text(task),
            "reasoning": plan(task, slip),
            "response": response_text(task, slip),
            "answer": answer_json(task),
            "id": f"{DOMAIN}/{split or 'all'}/{i}/{task.key}",
        })
    return records


register_domain(DomainSpec(
    name=DOMAIN, generate=generate, version="1",
    description="procedural one-line Python functions with an imperfect (one-slip) teacher"))
