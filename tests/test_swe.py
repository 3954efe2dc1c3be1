"""SWE repair: the procedural bugs, the agentless reward (C1) and the execution reward.

The generated code is ours, so these tests run it in-process with ``exec`` to re-check the generator
independently of ``nemocascade.rewards.code`` (whose sandbox ``execution_score`` uses).
"""

import difflib
import importlib.util
import json
import re

import numpy as np
import pytest

from nemocascade.data import domains
from nemocascade.data import swe as dswe
from nemocascade.data.domains import verifier
from nemocascade.rewards import swe as rswe

T = "<think>\nthe bug is on line 2\n</think>\n"
FIX = "def f(x):\n    return x + 1"
BUGGY = "def f(x):\n    return x - 1"
ANSWER = json.dumps({"fix": FIX, "buggy": BUGGY, "tests": ["assert f(1) == 2", "assert f(5) == 6"]})
HAS_SANDBOX = importlib.util.find_spec("nemocascade.rewards.code") is not None
needs_sandbox = pytest.mark.skipif(
    not HAS_SANDBOX, reason="nemocascade.rewards.code (passes_tests) is written by another helper; not there yet")


def fenced(code, lang="python"):
    return f"{T}```{lang}\n{code}\n```"


# ------------------------------------------------------------------------------------ agentless

def test_agentless_hand_worked_similarity():
    # a = "def f(x):\n    return x * 2", b = FIX = "def f(x):\n    return x + 1": 26 characters each.
    # Longest common block: the 23-character prefix "def f(x):\n    return x "; in the tails "* 2" / "+ 1"
    # the longest common block is the middle " ". M = 23 + 1 = 24, ratio = 2*24 / (26+26) = 12/13.
    assert rswe.agentless_score(fenced("def f(x):\n    return x * 2"), ANSWER) == pytest.approx(12 / 13, abs=1e-12)
    assert 12 / 13 == pytest.approx(0.923076923076923)
    # Layout and comments do not count: both sides are ast.unparse'd first.
    assert rswe.similarity("def f(x):  # hi\n  return x*2", FIX) == pytest.approx(12 / 13, abs=1e-12)


@pytest.mark.parametrize("text,expected", [
    (fenced(FIX), 1.0),
    (fenced("def f(x):\n    # fixed\n    return (x + 1)\n"), 1.0),  # same AST
    (fenced(FIX, lang="py"), 1.0),
    (fenced(FIX, lang=""), 1.0),
    (fenced(BUGGY), 0.0),  # unchanged
    (fenced("def f(x):\n        return x-1"), 0.0),  # unchanged up to layout
    (fenced("def f(x):\n    return x +"), -1.0),  # does not parse
    (fenced(""), -1.0),  # empty block
    (fenced("# only a comment"), -1.0),
    (T + FIX, -1.0),  # no code block
    ("<think>\n```python\n" + FIX + "\n```", -1.0),  # think never closed: no final text
    (fenced(BUGGY) + "\nBetter:\n```python\n" + FIX + "\n```", 1.0),  # the last block counts
    (fenced(FIX) + "\nOr:\n```python\n" + BUGGY + "\n```", 0.0),
])
def test_agentless_score_cases(text, expected):
    assert rswe.agentless_score(text, ANSWER) == expected
    assert verifier("swe")(text, ANSWER) == expected


def test_agentless_similarity_matches_difflib_and_bad_answer():
    code = "def f(y):\n    return y + 1"
    a, b = "def f(y):\n    return y + 1", FIX
    ref = difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
    assert rswe.agentless_score(fenced(code), ANSWER) == pytest.approx(ref)
    assert 0.0 < ref < 1.0
    assert rswe.agentless_score(fenced(FIX), "not json") == 0.0


# ------------------------------------------------------------------------------------- generator

def _fn(code):
    name = re.match(r"def (\w+)\(", code)[1]
    namespace = {}
    exec(code, namespace)
    return namespace[name]


def _passes(code, tests):
    namespace = {}
    exec(code, namespace)
    try:
        for t in tests:
            exec(t, namespace)
    except AssertionError:
        return False
    return True


def _diff(a, b):
    return [(x, y) for x, y in zip(a.split("\n"), b.split("\n")) if x != y]


def test_generator_bugs_tests_and_teacher():
    good = dswe.generate(np.random.default_rng(3), 200, teacher_error_rate=0.0, split=None)
    bad = dswe.generate(np.random.default_rng(3), 200, teacher_error_rate=1.0, split=None)
    assert [r["prompt"] for r in good] == [r["prompt"] for r in bad]
    families, slipped = {}, 0
    for g, b in zip(good, bad):
        ans = json.loads(g["answer"])
        bug = g["id"].split("/")[3]
        families[bug] = families.get(bug, 0) + 1
        assert g["response"] == f"```python\n{ans['fix']}\n```"
        assert f"```python\n{ans['buggy']}\n```" in g["prompt"]
        ((line_bad, line_fix),) = _diff(ans["buggy"], ans["fix"])  # exactly one line differs
        pattern = {"bound": r"\s+for i in range\(.*\):", "compare": r"\s+if .* [<>] .*:",
                   "arith": r"\s+(total|count) = \1 [-*+] .*", "return": r"\s+return (total|count|best|pos)"}[bug]
        assert re.fullmatch(pattern, line_bad) and re.fullmatch(pattern, line_fix)
        # The shown test fails the buggy code with the shown output; the golden code passes all tests.
        m = re.search(r"Failing: (assert (\w+)\((\[.*\])\) == (\S+)), got (\S+)$", g["prompt"])
        assert m[1] == ans["tests"][0] and len(ans["tests"]) == 3
        assert str(_fn(ans["buggy"])(json.loads(m[3]))) == m[5] != m[4]
        assert _passes(ans["fix"], ans["tests"]) and not _passes(ans["buggy"], ans["tests"][:1])
        assert rswe.agentless_score(f"<think>\n{g['reasoning']}\n</think>\n{g['response']}", g["answer"]) == 1.0
        if b["response"] != g["response"]:
            slipped += 1
            assert bug in ("bound", "compare")
            code = re.fullmatch(r"```python\n(.*)\n```", b["response"], re.DOTALL)[1]
            assert not _passes(code, ans["tests"])  # the first hidden test catches the slip
            score = rswe.agentless_score(f"<think>\n{b['reasoning']}\n</think>\n{b['response']}", b["answer"])
            assert 0.9 < score < 1.0
        else:
            assert bug in ("arith", "return")
    assert slipped == families["bound"] + families["compare"]
    assert all(30 < families[f] < 70 for f in dswe.BUGS)  # uniform over the four families


def test_generator_slips_hand_worked():
    (r,) = dswe.generate(np.random.default_rng(0), 1, bugs=("compare",), teacher_error_rate=1.0, split=None)
    ans = json.loads(r["answer"])
    ((bad, fix),) = _diff(ans["buggy"], ans["fix"])
    op_fix = re.search(r" ([<>]) ", fix)[1]
    op_bad = {">": "<", "<": ">"}[op_fix]
    assert bad == fix.replace(f" {op_fix} ", f" {op_bad} ")
    assert r["reasoning"] == f"The comparison misses equality: {op_bad} should be {op_bad}=."
    assert f" {op_bad}= " in r["response"]
    (r,) = dswe.generate(np.random.default_rng(0), 1, bugs=("bound",), teacher_error_rate=1.0, split=None)
    ans = json.loads(r["answer"])
    xs = re.match(r"def \w+\((\w+)\)", ans["fix"])[1]
    ((bad, fix),) = _diff(ans["buggy"], ans["fix"])
    start = "1, " if "best" in ans["fix"] else ""
    assert fix.strip() == f"for i in range({start}len({xs})):"
    assert bad.strip() == f"for i in range({start}len({xs}) - 1):"
    assert f"for i in range({int(bool(start)) + 1}, len({xs})):" in r["response"]


def test_generator_deterministic_and_split_by_buggy_code():
    """The split hashes the problem key, which names the buggy code one to one: no buggy code is in train and test,
    and two records share a key iff they share the buggy code (wide or not)."""
    a = dswe.generate(np.random.default_rng(7), 60, teacher_error_rate=0.5)
    assert a == dswe.generate(np.random.default_rng(7), 60, teacher_error_rate=0.5)
    for i, r in enumerate(a):
        domains.validate_record(r, i)
    train = domains.generate_split("swe", "train", 400, seed=0)
    test = domains.generate_split("swe", "test", 60, seed=0)
    code = lambda r: json.loads(r["answer"])["buggy"]  # noqa: E731
    assert all(domains.split_of(domains.problem_key(r)) == "train" for r in train)
    assert all(domains.split_of(domains.problem_key(r)) == "test" for r in test)
    assert not {code(r) for r in train} & {code(r) for r in test}
    distinct = []
    for wide in (False, True):
        recs = dswe.generate(np.random.default_rng(1), 1500, split=None, wide=wide)
        keys, codes = {domains.problem_key(r) for r in recs}, {code(r) for r in recs}
        assert len(keys) == len(codes) == len({(domains.problem_key(r), code(r)) for r in recs})
        distinct.append(len(keys))
    assert distinct[1] > 1.5 * distinct[0], distinct
    with pytest.raises(ValueError, match="bugs must be a non-empty subset"):
        dswe.generate(np.random.default_rng(0), 1, bugs=("typo",))


# ------------------------------------------------------------------------------------- execution

@needs_sandbox
def test_execution_score_runs_the_tests():
    assert rswe.execution_score(fenced(FIX), ANSWER) == 1.0
    assert rswe.execution_score(fenced("def f(x):\n    return 1 + x"), ANSWER) == 1.0  # any passing repair
    assert rswe.execution_score(fenced(BUGGY), ANSWER) == 0.0
    assert rswe.execution_score(fenced("def f(x):\n    return x +"), ANSWER) == 0.0
    assert rswe.execution_score(T + FIX, ANSWER) == 0.0
    assert verifier("swe_exec")(fenced(FIX), ANSWER) == 1.0


@needs_sandbox
def test_execution_score_on_generated_records():
    good = dswe.generate(np.random.default_rng(4), 12, bugs=("bound", "compare"), split=None)
    bad = dswe.generate(np.random.default_rng(4), 12, bugs=("bound", "compare"), teacher_error_rate=1.0,
                        split=None)
    for g, b in zip(good, bad):
        assert rswe.execution_score(f"<think>\n{g['reasoning']}\n</think>\n{g['response']}", g["answer"]) == 1.0
        assert rswe.execution_score(f"<think>\n{b['reasoning']}\n</think>\n{b['response']}", b["answer"]) == 0.0


def test_retry_records_are_second_turns_as_the_environment_builds_them():
    """retry_rate: train records whose prompt is the conversation so far. Rendered, it is the problem, a first repair,
    and the swe_repair environment's own answer to that repair (envs.SweRepair.step, run here in the sandbox); the
    target is the golden fix. Domain swe_retry holds only such records, in every split."""
    from nemocascade import chat, envs

    recs = dswe.generate(np.random.default_rng(3), 60, split="train", wide=True, test_every=4, retry_rate=0.5)
    retries = [r for r in recs if chat.IM_START in r["prompt"]]
    assert 15 <= len(retries) <= 45
    only = domains.generate_split("swe_retry", "test", 20, seed=0, wide=True, test_every=4)
    assert all(chat.IM_START in r["prompt"] and r["domain"] == "swe_retry" for r in only)
    assert all(domains.split_of(domains.problem_key(r), 4) == "test" for r in only)
    for r in retries[:4]:
        first_user, rest = r["prompt"].split(f"{chat.IM_END}\n{chat.IM_START}assistant\n{chat.THINK_OPEN}\n", 1)
        first_turn, answer = rest.split(f"\n{chat.IM_START}user\n")
        assert first_user.startswith("Fix the bug.") and first_turn.endswith(chat.IM_END)
        step = envs.make_env("swe_repair", {**r, "prompt": first_user}).step(chat.THINK_OPEN + "\n" + first_turn)
        assert not step.done and step.observation == answer
        assert json.loads(r["answer"])["fix"] in r["response"]
