"""The "code" domain (procedural one-line functions, imperfect teacher) and HumanEval as "code" records."""

import json

import numpy as np
import pytest

from nemocascade import chat, sandbox
from nemocascade.data import code as dcode
from nemocascade.data import domains, humaneval
from nemocascade.rewards import code as code_reward


def _completion(record: dict) -> str:
    """The whole assistant turn as the policy would write it (thinking mode)."""
    return chat.THINK_OPEN + "\n" + chat.render_completion(record["reasoning"], record["response"])


def test_a_record_by_hand():
    task = dcode.Task("max", 7)
    assert task.key == "max:7"
    assert dcode.prompt_text(task) == "Write a function f(x) that returns the larger of x and 7."
    assert dcode.plan(task) == "Compare x with 7 and return the larger one."
    assert dcode.response_text(task) == "```python\ndef f(x):\n    return x if x > 7 else 7\n```"
    assert dcode.response_text(task, slip=True) == "```python\ndef f(x):\n    return x if x < 7 else 7\n```"
    assert json.loads(dcode.answer_json(task)) == {
        "tests": "assert f(-4) == 7\nassert f(0) == 7\nassert f(10) == 10\nassert f(25) == 25\n", "entry_point": "f"}
    # count_gt: [3, 3, 5] has one item > 3 and three >= 3, so the slip fails.
    assert dcode.tests_text(dcode.Task("count_gt", 3)).splitlines()[1] == "assert f([3, 3, 5]) == 1"


def test_generate_is_deterministic_and_short():
    a = dcode.generate(np.random.default_rng(0), 60, teacher_error_rate=0.3)
    b = dcode.generate(np.random.default_rng(0), 60, teacher_error_rate=0.3)
    assert a == b and len(a) == 60
    assert a != dcode.generate(np.random.default_rng(1), 60, teacher_error_rate=0.3)
    for r in a:
        assert r["domain"] == "code" and set(r) == set(domains.RECORD_KEYS)
        assert len(r["prompt"].split()) <= 40
        assert len((r["reasoning"] + " " + r["response"]).split()) <= 60
    assert len(dcode.all_tasks()) == 10 * 1000  # ten families, k over 1000 values each


def test_splits_are_disjoint_by_canonical_task():
    train = domains.generate_split("code", "train", 300, seed=0)
    test = domains.generate_split("code", "test", 100, seed=0)
    key = lambda r: r["id"].rsplit("/", 1)[1]  # noqa: E731
    train_keys, test_keys = {key(r) for r in train}, {key(r) for r in test}
    assert train_keys and test_keys and not train_keys & test_keys
    assert all(domains.split_of(k) == "train" for k in train_keys)
    assert all(domains.split_of(k) == "test" for k in test_keys)
    with pytest.raises(ValueError, match="no code task"):  # 1 key in 10^9 is held out: none of mod's 1000
        dcode.generate(np.random.default_rng(0), 1, split="test", families={"mod": 1.0}, test_every=10**9)


def test_500_test_items_are_500_distinct_programs():
    # Drawn without replacement: ~100 test tasks a family, ~50 draws each. With replacement (and the 118 tasks of
    # before) 500 items held 13 distinct programs.
    test = domains.generate_split("code", "test", 500, seed=0)
    assert len({r["id"].rsplit("/", 1)[1] for r in test}) == 500
    # a family's tasks all come once before any comes twice
    twice = dcode.generate(np.random.default_rng(0), 250, split="test", families={"repeat": 1.0})
    keys = [r["id"].rsplit("/", 1)[1] for r in twice]
    pool = sum(domains.split_of(t.key) == "test" for t in dcode.all_tasks() if t.family == "repeat")
    assert pool < 250 and len(set(keys[:pool])) == pool and set(keys[pool:]) <= set(keys[:pool])


def test_every_slip_breaks_a_test():
    # In-process over all 10,000 tasks (our own templates, not model code): the slipped expression differs
    # from the correct one on at least one of the task's test inputs.
    for task in dcode.all_tasks():
        fam = dcode.FAMILIES[task.family]
        ok, slip = fam.body.format(k=task.k), fam.slip_body.format(k=task.k)
        env = {"__builtins__": {"sum": sum}}
        assert any(eval(ok, env, {fam.arg: v}) != eval(slip, env, {fam.arg: v}) for v in fam.inputs(task.k)), task


def test_teacher_programs_pass_at_rate_0_and_fail_at_rate_1_in_the_sandbox():
    right = dcode.generate(np.random.default_rng(3), 20, split=None, teacher_error_rate=0.0)
    wrong = dcode.generate(np.random.default_rng(3), 20, split=None, teacher_error_rate=1.0)
    assert [r["prompt"] for r in right] == [r["prompt"] for r in wrong]  # same tasks, other programs
    assert len({r["id"].rsplit("/", 1)[1].split(":")[0] for r in right}) >= 6  # most families drawn
    sources = []
    for r in right + wrong:
        tests = json.loads(r["answer"])["tests"]
        sources.append(code_reward.extract_code(r["response"]) + "\n" + tests)
    results = sandbox.run_many(sources, timeout_s=5.0)
    assert [res.ok for res in results] == [True] * 20 + [False] * 20
    assert all("AssertionError" in res.stderr for res in results[20:])
    # ... and the reward agrees on the whole assistant turn.
    assert code_reward.score(_completion(right[0]), right[0]["answer"]) == 1.0
    assert code_reward.score(_completion(wrong[0]), wrong[0]["answer"]) == 0.0


def test_teacher_error_rate_sets_the_share_of_slips():
    records = dcode.generate(np.random.default_rng(0), 1000, split=None, teacher_error_rate=0.6)
    slips = sum(r["response"] != _correct_response(r) for r in records)
    assert abs(slips / 1000 - 0.6) < 0.05  # binomial sd ~0.015


def _correct_response(record: dict) -> str:
    family, k = record["id"].rsplit("/", 1)[1].split(":")
    return dcode.response_text(dcode.Task(family, int(k)))


def test_humaneval_loads_164_code_records_whose_canonical_solutions_pass():
    records = humaneval.load()
    assert len(records) == 164 and len({r["id"] for r in records}) == 164
    assert records[0]["id"] == "humaneval/HumanEval/0" and all(r["domain"] == "code" for r in records)
    for r in records:
        domains.validate_record(r)
        answer = json.loads(r["answer"])
        assert answer["tests"].endswith(f"check({answer['entry_point']})\n")
        assert r["prompt"].endswith(answer["prompt"])
    sample = records[::17]  # 10 problems across the set
    assert [code_reward.score(_completion(r), r["answer"]) for r in sample] == [1.0] * 10
    # A solution that returns nothing fails the same tests.
    broken = json.loads(sample[1]["answer"])
    assert code_reward.score("<think>\n</think>\n```python\n    return None\n```", json.dumps(broken)) == 0.0
    assert humaneval.load(3) == records[:3]
