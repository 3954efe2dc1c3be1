"""Procedural function-writing tasks (domain ``"code"``) with an imperfect teacher.

Small enough for a ~1M-parameter model: one-line functions from ten families, each with one small
integer parameter ``k``, stated and solved with fixed templates::

    prompt:    "Write a function f(x) that returns the larger of x and 7."
    reasoning: "Compare x with 7 and return the larger one."
    response:  "```python\\ndef f(x):\\n    return x if x > 7 else 7\\n```"
    answer:    '{"tests": "assert f(-4) == 7\\nassert f(0) == 7\\n...", "entry_point": "f"}'

The tests are four asserts on inputs chosen per family and k so that every family's slip below fails at
least one of them; their expected values come from evaluating the teacher's own correct expression, so
the correct program passes by construction. ``nemocascade.rewards.code`` runs them in the sandbox.

**Imperfect teacher.** With probability ``teacher_error_rate`` the teacher makes its family's one
systematic slip (a one-token change: a wrong operator, a flipped comparison, an off-by-one slice or
count) and its plan says what the slipped code does, so reasoning and response agree on a wrong program
(as the forgotten carry of ``data/math.py``). Above 0.5 the slip is the mode: greedy imitation fails,
while the correct program is still sampled often enough for the verifiable reward to reinforce it.

Held-out split: by the canonical task ``"family:k"`` (e.g. ``"max:7"``); 1000 tasks a family, so the test split
holds ~1000 and an evaluation of 500 items scores 500 distinct programs.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable

import numpy as np

from nemocascade.data.domains import Domain, check_args, family_weights, register, split_of
from nemocascade.rewards import code as code_reward

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
    """Below and above k (so ``<`` vs ``>`` differs), k + 3 (so ``%`` vs ``//`` does, for every k >= 2)."""
    return (-4, k - 7, k + 3, 25)


def _lists(k: int) -> tuple:
    """A list longer than k + 1 (so slices differ) and lists that contain k (so ``>`` vs ``>=`` differs)."""
    return (list(range(1, k + 3)), [k, k, k + 2], [], [k + 1, 0, k, 9, 3, 8, 2])


def _strs(k: int) -> tuple:
    """Short strings (a repeat of each stays short), one of them empty."""
    return ("ab", "hi", "", "x")


def _long_strs(k: int) -> tuple:
    """Strings longer than k (so ``s[:k]`` vs ``s[:k + 1]`` differs), one of them short."""
    return ("abcdefghij" * (k // 10 + 1), "hi", "", "hello world" * (k // 11 + 1))


K = tuple(range(1, 1001))  # 1000 tasks a family (module docstring, held-out split)

FAMILIES: dict[str, Family] = {
    "add": Family("x", "x plus {k}", "Add {k} to x.", "x + {k}",
                  "Subtract {k} from x.", "x - {k}", K, _ints),
    "sub": Family("x", "x minus {k}", "Subtract {k} from x.", "x - {k}",
                  "Add {k} to x.", "x + {k}", K, _ints),
    "mul": Family("x", "x times {k}", "Multiply x by {k}.", "x * {k}",
                  "Add {k} to x.", "x + {k}", tuple(range(2, 1002)), _ints),
    "mod": Family("x", "the remainder of x divided by {k}", "Take x modulo {k}.", "x % {k}",
                  "Divide x by {k} and round down.", "x // {k}", tuple(range(2, 1002)), _ints),
    "max": Family("x", "the larger of x and {k}", "Compare x with {k} and return the larger one.",
                  "x if x > {k} else {k}", "Compare x with {k} and return the smaller one.",
                  "x if x < {k} else {k}", tuple(range(-500, 500)), _ints),
    "min": Family("x", "the smaller of x and {k}", "Compare x with {k} and return the smaller one.",
                  "x if x < {k} else {k}", "Compare x with {k} and return the larger one.",
                  "x if x > {k} else {k}", tuple(range(-500, 500)), _ints),
    "sum_first": Family("xs", "the sum of the first {k} items of xs", "Sum the first {k} items of xs.",
                        "sum(xs[:{k}])", "Sum the first {k} items of xs and one more.", "sum(xs[:{k} + 1])",
                        K, _lists),
    "count_gt": Family("xs", "how many items of xs are greater than {k}",
                       "Count the items of xs that are greater than {k}.", "sum(1 for v in xs if v > {k})",
                       "Count the items of xs that are at least {k}.", "sum(1 for v in xs if v >= {k})",
                       tuple(range(0, 1000)), _lists),
    "repeat": Family("s", "s repeated {k} times", "Repeat s {k} times.", "s * {k}",
                     "Repeat s {k} times and once more.", "s * ({k} + 1)", tuple(range(2, 1002)), _strs),
    "prefix": Family("s", "the first {k} characters of s", "Take the first {k} characters of s.", "s[:{k}]",
                     "Take the first {k} characters of s and one more.", "s[:{k} + 1]", K, _long_strs),
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
        split: keep only tasks with ``split_of(task.key, test_every) == split`` (``None``: all). A family's
            tasks are drawn without replacement (a task repeats only after every task of its family in the
            split has been drawn), and never cross splits.
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

    records, order = [], {}  # family -> its tasks not drawn yet in this pass, in a random order
    for i in range(n):
        family = names[int(rng.choice(len(names), p=probs))]
        if not order.get(family):  # this pass is used up: a new random order of the family's pool
            order[family] = [pools[family][j] for j in rng.permutation(len(pools[family]))]
        task = order[family].pop()
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


register(Domain(
    # 2: k up to 1000, inputs that follow k, draws without replacement
    name=DOMAIN, generate=generate, verifier=code_reward.score, version="2",
    description="procedural one-line Python functions with an imperfect (one-slip) teacher"))
