"""Procedural SWE repair (C2 "SWE RL"): fix one bug in a small Python function, given a failing test.

Two function templates over a list, each in four variants (above/below x sum/count, max/min x
value/index), with one injected bug from four families:

    bound    loop stops one early          range(len(xs))   -> range(len(xs) - 1)
    compare  comparison reversed           xs[i] > 4        -> xs[i] < 4
    arith    wrong arithmetic operator     total = total + xs[i] -> total = total - xs[i]
    return   wrong variable returned       return total     -> return count

    prompt:    "Fix the bug.\\n```python\\n<buggy function>\\n```\\nFailing: assert sum_above([3, 7, 2]) == 7, got 0"
    reasoning: "The comparison is reversed: < should be >."
    response:  "```python\\n<fixed function>\\n```"
    answer:    '{"fix": <golden code>, "buggy": <buggy code>, "tests": [<shown test>, <2 hidden tests>]}'

``rewards/swe.py`` scores a response against ``answer`` two ways: agentless (similarity to the golden
fix, C1) and by execution of ``tests`` (agentic stage).

**Imperfect teacher.** With probability ``teacher_error_rate`` the teacher repairs the right line
the wrong way, on the ``bound`` and ``compare`` families only (the others are always right): it
*shifts* a short loop instead of widening it (``range(len(xs) - 1)`` -> ``range(1, len(xs))``) and
treats a reversed comparison as a boundary error (``<`` -> ``<=`` where ``>`` is right). Its patch is
close to the golden one (agentless similarity just under 1) and may pass the shown test, but the first
hidden test is drawn to tell the slip from the fix, so its execution reward is 0.

Length: the longest of the short domains, since the response is the whole function (prompt ~110 tokens,
reasoning + response ~85).

Held-out split: by the problem key bug/function/list name[/threshold][/wrong operator], which names the buggy
function's code one to one (the tests are drawn).
"""

from __future__ import annotations

import json

import numpy as np

from nemocascade.data.domains import Domain, check_args, register, split_of
from nemocascade.rewards import swe as swe_reward

DOMAIN = "swe"
LIST_NAMES = ("xs", "nums", "vals", "data")
BUGS = ("bound", "compare", "arith", "return")
MIRROR = {">": "<", "<": ">"}

ACCUMULATE = """def {f}({xs}):
    total = 0
    count = 0
    for i in {range}:
        if {xs}[i] {cmp} {k}:
            total = total {op_total} {xs}[i]
            count = count {op_count} 1
    return {ret}"""
ARGBEST = """def {f}({xs}):
    best = {xs}[0]
    pos = 0
    for i in {range}:
        if {xs}[i] {cmp} best:
            best = {xs}[i]
            pos = i
    return {ret}"""
# name -> (template, golden slots that differ by variant); both templates loop with `range`.
FUNCTIONS = {
    "sum_above": (ACCUMULATE, {"cmp": ">", "ret": "total"}),
    "sum_below": (ACCUMULATE, {"cmp": "<", "ret": "total"}),
    "count_above": (ACCUMULATE, {"cmp": ">", "ret": "count"}),
    "count_below": (ACCUMULATE, {"cmp": "<", "ret": "count"}),
    "max_value": (ARGBEST, {"cmp": ">", "ret": "best"}),
    "min_value": (ARGBEST, {"cmp": "<", "ret": "best"}),
    "max_index": (ARGBEST, {"cmp": ">", "ret": "pos"}),
    "min_index": (ARGBEST, {"cmp": "<", "ret": "pos"}),
}
OTHER_VAR = {"total": "count", "count": "total", "best": "pos", "pos": "best"}


def _golden_slots(name: str, xs: str) -> dict[str, str]:
    template, slots = FUNCTIONS[name]
    start = "" if template is ACCUMULATE else "1, "
    return {"range": f"range({start}len({xs}))", "op_total": "+", "op_count": "+", **slots}


def _bug_slots(rng, name: str, xs: str, bug: str, golden: dict) -> tuple[dict, dict | None, str, str | None]:
    """(buggy slots, teacher-slip slots or None, right diagnosis, slipped diagnosis or None)."""
    if bug == "bound":
        start = 0 if FUNCTIONS[name][0] is ACCUMULATE else 1
        lo = f"{start}, " if start else ""
        bad, slip = f"range({lo}len({xs}) - 1)", f"range({start + 1}, len({xs}))"
        return ({"range": bad}, {"range": slip}, f"The loop skips the last item: {bad} should be {golden['range']}.",
                f"The loop skips an item: {bad} should be {slip}.")
    if bug == "compare":
        good, bad = golden["cmp"], MIRROR[golden["cmp"]]
        slip = bad + "="  # the slip: a boundary fix of a reversed comparison
        return ({"cmp": bad}, {"cmp": slip}, f"The comparison is reversed: {bad} should be {good}.",
                f"The comparison misses equality: {bad} should be {slip}.")
    if bug == "arith":
        slot = "op_total" if golden["ret"] == "total" else "op_count"
        bad = "-" if rng.random() < 0.5 else "*"
        return {slot: bad}, None, f"The {golden['ret']} update uses {bad} instead of +.", None
    if bug == "return":
        bad = OTHER_VAR[golden["ret"]]
        return {"ret": bad}, None, f"It returns {bad} instead of {golden['ret']}.", None
    raise ValueError(f"unknown bug family {bug!r}; known: {BUGS}")


def _function(code: str, name: str):
    namespace: dict = {}
    exec(compile(code, f"<{name}>", "exec"), namespace)  # our own generated code, not model output
    return namespace[name]


def _run(fn, xs: list[int]):
    try:
        return fn(list(xs))
    except Exception as e:  # a buggy index can raise; the test then fails with that error
        return type(e).__name__


def _case(rng, top: int = 10) -> list[int]:
    return [int(v) for v in rng.integers(0, top, int(rng.integers(3, 7)))]


def _distinguishing(rng, good, bad, tries: int = 200, top: int = 10) -> list[int] | None:
    """A drawn input on which ``bad`` returns something other than ``good``; None if none in ``tries``."""
    for _ in range(tries):
        case = _case(rng, top)
        if _run(good, case) != _run(bad, case):
            return case
    return None


def code_block(code: str) -> str:
    return f"```python\n{code}\n```"


def generate(rng: np.random.Generator, n: int, *, split: str | None = "train",
             teacher_error_rate: float = 0.0, bugs: tuple[str, ...] = BUGS, test_every: int = 10,
             wide: bool = False, retry_rate: float = 0.0, domain: str = DOMAIN) -> list[dict]:
    """``n`` SWE repair records (domains.py record contract), deterministic given ``rng`` and the options.

    Args:
        split: keep only problems with ``split_of(key, test_every) == split`` (problem key; ``None``: all).
        teacher_error_rate: probability of the teacher's wrong repair on ``bound``/``compare`` bugs.
        bugs: bug families to draw from, uniformly (default all four).
        wide: thresholds 1-29 (not 1-8) and list values 0-39 (not 0-9): ~2,370 distinct problems instead of
            ~690, so a split of 1/4 holds over 500.
        retry_rate: the share of records that are a second turn (`retry_prompt`): the conversation so far (the
            problem, a first repair that fails the shown test, the swe_repair environment's answer) is the prompt,
            the right repair the target (domain "swe_retry": retry_rate 1).
    """
    check_args(split, teacher_error_rate)
    unknown = sorted(set(bugs) - set(BUGS))
    if unknown or not bugs:
        raise ValueError(f"bugs must be a non-empty subset of {BUGS}, got {bugs}")
    bugs = sorted(set(bugs))
    records, attempts = [], 0
    while len(records) < n:
        attempts += 1
        if attempts > 100 * n * test_every + 1000:
            raise ValueError(f"found only {len(records)} of {n} swe problems for split {split!r}")
        bug = bugs[int(rng.integers(len(bugs)))]
        names = sorted(f for f, (t, _) in FUNCTIONS.items() if bug != "arith" or t is ACCUMULATE)
        name = names[int(rng.integers(len(names)))]
        xs = LIST_NAMES[int(rng.integers(len(LIST_NAMES)))]
        template = FUNCTIONS[name][0]
        k = int(rng.integers(1, 30 if wide else 9))
        top = 40 if wide else 10
        golden = _golden_slots(name, xs)
        bad, slip, why, slip_why = _bug_slots(rng, name, xs, bug, golden)
        fill = dict(f=name, xs=xs, k=k)
        fix, buggy = template.format(**fill, **golden), template.format(**fill, **{**golden, **bad})
        slipped_code = template.format(**fill, **{**golden, **slip}) if slip else None
        # the problem key names the buggy code one to one; the threshold k is in ACCUMULATE only
        key = (f"{bug}/{name}/{xs}" + (f"/{k}" if template is ACCUMULATE else "")
               + (f"/{next(iter(bad.values()))}" if bug == "arith" else ""))
        if split is not None and split_of(key, test_every) != split:
            continue
        # Tests: the shown one fails the buggy code, the first hidden one the slip (when there is one).
        fns = {c: _function(c, name) for c in (fix, buggy, slipped_code) if c is not None}
        shown = _distinguishing(rng, fns[fix], fns[buggy], top=top)
        caught = _distinguishing(rng, fns[fix], fns[slipped_code], top=top) if slip else _case(rng, top)
        if shown is None or caught is None:
            continue  # no telling input drawn (rare); draw another problem
        cases = [shown, caught, _case(rng, top)]
        tests = [f"assert {name}({case}) == {_run(fns[fix], case)}" for case in cases]
        slipped = bool(rng.random() < teacher_error_rate) and slip is not None
        prompt = f"Fix the bug.\n{code_block(buggy)}\nFailing: {tests[0]}, got {_run(fns[buggy], shown)}"
        if retry_rate and rng.random() < retry_rate:
            prompt, why = retry_prompt(rng, prompt, why, name, template, fill, golden, buggy, fns[fix], tests[0],
                                       shown)
        records.append({
            "domain": domain,
            "prompt": prompt,
            "reasoning": slip_why if slipped else why,
            "response": code_block(slipped_code if slipped else fix),
            "answer": json.dumps({"fix": fix, "buggy": buggy, "tests": tests}),
            "id": f"{domain}/{split or 'all'}/{len(records)}/{key}",
        })
    return records


def retry_prompt(rng, prompt: str, why: str, name: str, template: str, fill: dict, golden: dict, buggy: str, fix_fn,
                 test: str, shown: list[int]) -> tuple[str, str]:
    """(the user text of a second turn, its diagnosis). The first repair fails the shown test: in ACCUMULATE
    functions half the time the fix with the threshold miscopied (the diagnosis then names the threshold the
    problem had), else the buggy function back unchanged (the diagnosis is the bug's). The text, put through
    `chat.render_prompt` in thinking mode, is exactly the conversation rl/episodes.py builds: the problem, the first
    turn (its diagnosis, its code), and the environment's answer in `envs.SweRepair`'s words."""
    from nemocascade import chat

    attempt, reason = buggy, why
    if template is ACCUMULATE and rng.random() < 0.5:
        k2 = max(1, fill["k"] + int(rng.choice([-3, -2, -1, 1, 2, 3])))
        miscopied = template.format(**{**fill, "k": k2}, **golden)
        if _run(_function(miscopied, name), shown) != _run(fix_fn, shown):
            attempt, reason = miscopied, f"The threshold is {k2}: the problem has {fill['k']}."
    got = _run(_function(attempt, name), shown)
    first = chat.render_completion(why, code_block(attempt), thinking=True)
    answer = f"Fix the bug.\n{code_block(attempt)}\nFailing: {test}, got {got}"
    return (f"{prompt}{chat.IM_END}\n{chat.IM_START}assistant\n{chat.THINK_OPEN}\n{first}\n{chat.IM_START}user\n"
            f"{answer}"), reason


def generate_retries(rng: np.random.Generator, n: int, **opts) -> list[dict]:
    """Domain "swe_retry": swe records that are all second turns (`generate`'s retry_rate=1)."""
    return generate(rng, n, **opts, retry_rate=1.0, domain=RETRY_DOMAIN)


RETRY_DOMAIN = "swe_retry"
register(Domain(
    name=DOMAIN, generate=generate, verifier=swe_reward.agentless_score, env="swe_repair",
    version="2",  # 2: problem keys that identify the problem
    description="SWE repair: fix one injected bug in a small function (teacher mis-repairs some bugs)"))
register(Domain(
    name=RETRY_DOMAIN, generate=generate_retries, verifier=swe_reward.agentless_score, version="1",
    description="SWE repair, second turn: the problem, a failed first repair and the tests' answer, then the fix"))
