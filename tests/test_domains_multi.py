"""Multi-domain and long-context RL domains: mcq, json (structured output), tool, longctx.

Verifiers: hand-worked (completion, answer, expected) cases. Generators: determinism, held-out split by
problem key, and the imperfect teacher checked against independent re-derivations from the prompt text:
gold responses score 1 at teacher_error_rate=0, and the slipped ones score 0 at rate 1.
"""

import json
import re

import numpy as np
import pytest

from nemocascade.data import longctx as dlong
from nemocascade.data import mcq as dmcq
from nemocascade.data import domains
from nemocascade.data import structured as djson
from nemocascade.data import tool as dtool
from nemocascade.data.domains import verifier
from nemocascade.rewards import mcq as rmcq
from nemocascade.rewards import structured as rjson
from nemocascade.rewards import tool as rtool

T = "<think>\nmaybe \\boxed{A}? Answer: A\n</think>\n"  # a finished think block whose guesses must not count


def completion(record):
    return f"<think>\n{record['reasoning']}\n</think>\n{record['response']}<|im_end|>"


# ------------------------------------------------------------------------------------------ mcq reward

@pytest.mark.parametrize("final,answer,expected", [
    ("The answer is \\boxed{B}.", "B", 1.0),
    ("The answer is \\boxed{C}.", "B", 0.0),
    ("\\boxed{(B)}", "B", 1.0),
    ("\\boxed{ B. }", "B", 1.0),
    ("\\boxed{\\text{B}}", "B", 1.0),
    ("\\boxed{b}", "B", 0.0),  # lower case is malformed
    ("\\boxed{B or C}", "B", 0.0),
    ("\\boxed{71}", "B", 0.0),
    ("\\boxed{B", "B", 0.0),  # unbalanced box: cut off
    ("\\boxed{A} no wait, \\boxed{B}", "B", 1.0),  # the last box decides
    ("Answer: C. \\boxed{B}", "B", 1.0),  # a box beats an "Answer:" line
    ("\\boxed{B} Answer: C", "C", 0.0),
    ("Answer: B", "B", 1.0),
    ("answer: (B)", "B", 1.0),
    ("Answer: A, no. Answer: D", "D", 1.0),
    ("Answer: Bob", "B", 0.0),
    ("B", "B", 0.0),  # a bare letter is not an answer format
    ("", "B", 0.0),
    ("\\boxed{B}", "E", 0.0),  # malformed key
    ("\\boxed{B}", "BB", 0.0),
])
def test_mcq_score_hand_worked(final, answer, expected):
    assert rmcq.score(T + final, answer) == expected
    assert verifier("mcq")(T + final, answer) == expected


def test_mcq_score_reads_only_the_finished_final_text():
    assert rmcq.score("<think>\nThe answer is \\boxed{B}.", "B") == 0.0  # think never closed
    assert rmcq.score("<think>\n\\boxed{B}\n</think>\nno idea", "B") == 0.0
    assert rmcq.score("\\boxed{B}<|im_end|>", "B") == 1.0  # non-thinking mode


# ------------------------------------------------------------------------------- JSON schema validator

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "pet": {"type": "string", "enum": ["cat", "dog"]}, "ok": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"type": "string"}}}}


@pytest.mark.parametrize("value,errors", [
    ({"name": "Ann", "age": 3}, []),
    ({"name": "Ann", "age": 3, "pet": "dog", "ok": False, "tags": ["a", "b"]}, []),
    ({"name": "Ann", "age": 3, "tags": []}, []),
    ({"name": "Ann", "age": True}, ["$.age: expected integer, got boolean"]),  # bool is not an integer
    ({"name": "Ann", "age": 3.0}, ["$.age: expected integer, got float"]),
    ({"name": "Ann", "age": "3"}, ["$.age: expected integer, got string"]),
    ({"name": "Ann", "age": 3, "ok": 1}, ["$.ok: expected boolean, got integer"]),
    ({"name": "Ann"}, ["$: missing required key 'age'"]),
    ({"name": "Ann", "age": 3, "x": 1}, ["$: unexpected key 'x'"]),
    ({"name": "Ann", "age": 3, "pet": "fish"}, ["$.pet: 'fish' is not one of ['cat', 'dog']"]),
    ({"name": "Ann", "age": 3, "tags": ["a", 1]}, ["$.tags[1]: expected string, got integer"]),
    ({"name": None, "x": 0}, ["$: missing required key 'age'", "$: unexpected key 'x'",
                              "$.name: expected string, got null"]),
    (["Ann", 3], ["$: expected object, got array"]),
])
def test_schema_errors_hand_worked(value, errors):
    assert rjson.schema_errors(value, SCHEMA) == errors


def test_schema_subset_semantics():
    open_schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert rjson.schema_errors({"a": 1, "b": "extra"}, open_schema) == []  # additionalProperties absent
    assert rjson.schema_errors(True, {"enum": [1]}) == ["$: True is not one of [1]"]
    assert rjson.schema_errors(1, {"enum": [1, "x"]}) == []
    assert rjson.schema_errors(5, {"type": "integer", "minimum": 0}) == [
        "$: unsupported schema keywords ['minimum']"]  # fail closed, never ignore a keyword
    assert rjson.schema_errors(5, {"type": "number"}) == ["$: unsupported type 'number'"]
    assert rjson.same_value([1, {"a": True}], [1, {"a": True}])
    assert not rjson.same_value([1, {"a": True}], [1, {"a": 1}])
    assert not rjson.same_value(1, 1.0)
    with pytest.raises(ValueError, match="duplicate keys"):
        rjson.loads_strict('{"a": 1, "a": 2}')
    with pytest.raises(ValueError, match="NaN is not JSON"):
        rjson.loads_strict('{"a": NaN}')


JSON_ANSWER = json.dumps({"schema": {"type": "object", "additionalProperties": False, "required": ["age", "ok"],
                                     "properties": {"age": {"type": "integer"}, "ok": {"type": "boolean"}}},
                          "values": {"age": 34, "ok": False}})


@pytest.mark.parametrize("final,expected", [
    ('{"age": 34, "ok": false}', 1.0),
    ('{"ok": false, "age": 34}', 1.0),  # key order is free
    ('```json\n{"age": 34, "ok": false}\n```', 1.0),
    ('```\n{"age": 34, "ok": false}\n```', 1.0),
    ('```json\n{"age": 34, "ok": false}```', 1.0),
    ('```json\n{"age": 34, "ok": false}\n```\n```json\n{"age": 34, "ok": false}\n```', 0.0),  # two fences
    ('Here: ```json\n{"age": 34, "ok": false}\n```', 0.0),  # only the object, or only one fence
    ('{"age": 34, "ok": false} done', 0.0),
    ('{"age": 35, "ok": false}', 0.0),  # valid but not the facts
    ('{"age": 34, "ok": 0}', 0.0),
    ('{"age": "34", "ok": false}', 0.0),
    ('{"age": 34}', 0.0),
    ('{"age": 34, "ok": false, "color": "red"}', 0.0),
    ('{"age": 34, "ok": false, "age": 34}', 0.0),  # duplicate key
    ('[{"age": 34, "ok": false}]', 0.0),
    ('{"age": 34, "ok": false', 0.0),
    ("", 0.0),
])
def test_json_score_hand_worked(final, expected):
    assert rjson.score(T + final, JSON_ANSWER) == expected
    assert verifier("json")(T + final, JSON_ANSWER) == expected


def test_json_score_values_only_where_specified_and_bad_answers():
    partial = json.dumps({"schema": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                     "b": {"type": "string"}}},
                          "values": {"a": 1}})
    assert rjson.score('{"a": 1, "b": "anything"}', partial) == 1.0
    assert rjson.score('{"a": 1, "b": 2}', partial) == 0.0  # unspecified values still need the right type
    assert rjson.score('{"a": 1}', "not json") == 0.0
    assert rjson.score("<think>\n{\"age\": 34, \"ok\": false}", JSON_ANSWER) == 0.0  # think never closed


# ---------------------------------------------------------------------------------------- tool reward

TOOL_ANSWER = json.dumps({"name": "add_item", "arguments": {"item": "pens", "count": 3}})


@pytest.mark.parametrize("final,expected", [
    ('<tool_call>{"name": "add_item", "arguments": {"item": "pens", "count": 3}}</tool_call>', 1.0),
    ('Sure. <tool_call>\n{"arguments": {"count": 3, "item": "pens"}, "name": "add_item"}\n</tool_call>', 1.0),
    ('<tool_call>{"name": "add_items", "arguments": {"item": "pens", "count": 3}}</tool_call>', 0.0),
    ('<tool_call>{"name": "add_item", "arguments": {"item": "pens", "count": "3"}}</tool_call>', 0.0),
    ('<tool_call>{"name": "add_item", "arguments": {"item": "pens"}}</tool_call>', 0.0),
    ('<tool_call>{"name": "add_item", "arguments": {"item": "pens", "count": 3, "x": 1}}</tool_call>', 0.0),
    ('<tool_call>{"name": "add_item", "arguments": {"item": "pens", "count": 3}, "id": 1}</tool_call>', 0.0),
    ('<tool_call>{"name": "add_item", "arguments": {"item": "pens", "count": 3.0}}</tool_call>', 0.0),
    ('<tool_call>{"name": "add_item", "arguments": {"item": "pens", "count": 3}}</tool_call>'
     '<tool_call>{"name": "add_item", "arguments": {"item": "pens", "count": 3}}</tool_call>', 0.0),
    ('</tool_call>{"name": "add_item", "arguments": {"item": "pens", "count": 3}}<tool_call>', 0.0),
    ('<tool_call>{"name": "add_item", "arguments": {"item": "pens", "count": 3}}', 0.0),
    ('<tool_call>{"name": "add_item", "arguments": {"item": "pens", "count": 3}</tool_call>', 0.0),
    ('<tool_call>{"name": "add_item", "arguments": ["pens", 3]}</tool_call>', 0.0),
    ('{"name": "add_item", "arguments": {"item": "pens", "count": 3}}', 0.0),
])
def test_tool_score_hand_worked(final, expected):
    assert rtool.score(T + final, TOOL_ANSWER) == expected
    assert verifier("tool")(T + final, TOOL_ANSWER) == expected


def test_tool_score_bool_is_not_int():
    answer = json.dumps({"name": "set_light", "arguments": {"room": "hall", "on": True}})
    assert rtool.score('<tool_call>{"name": "set_light", "arguments": {"room": "hall", "on": true}}</tool_call>',
                       answer) == 1.0
    assert rtool.score('<tool_call>{"name": "set_light", "arguments": {"room": "hall", "on": 1}}</tool_call>',
                       answer) == 0.0


# ----------------------------------------------------------------------------------- longctx reward

def test_rewards_are_registered_and_picklable():
    import pickle

    for domain in ("mcq", "json", "tool", "longctx", "swe", "swe_exec"):
        fn = verifier(domain)
        assert pickle.loads(pickle.dumps(fn)) is fn  # VerifierPool workers receive them pickled
    assert domains.get_domain("json").name == "json"


def test_longctx_reward_is_the_boxed_number():
    assert verifier("longctx")(T + "The answer is \\boxed{482}.", "482") == 1.0
    assert verifier("longctx")(T + "The answer is \\boxed{428}.", "482") == 0.0
    assert verifier("longctx")(T + "The code is 482.", "482") == 0.0


# ------------------------------------------------------------------------------ generators: shared

GENERATORS = {"mcq": {}, "json": {}, "tool": {}, "longctx": {"num_facts": 12}}


@pytest.mark.parametrize("domain", sorted(GENERATORS))
def test_generate_deterministic_and_valid(domain):
    gen = domains.get_domain(domain).generate
    a = gen(np.random.default_rng(5), 200, teacher_error_rate=0.5, **GENERATORS[domain])
    assert a == gen(np.random.default_rng(5), 200, teacher_error_rate=0.5, **GENERATORS[domain])
    assert a != gen(np.random.default_rng(6), 200, teacher_error_rate=0.5, **GENERATORS[domain])
    for i, r in enumerate(a):
        domains.validate_record(r, i)
        assert r["domain"] == domain
    assert len({r["id"] for r in a}) == 200
    with pytest.raises(ValueError, match="teacher_error_rate must be in"):
        gen(np.random.default_rng(0), 1, teacher_error_rate=-0.1)


@pytest.mark.parametrize("domain", sorted(GENERATORS))
def test_train_test_disjoint_by_problem_key(domain):
    train = domains.generate_split(domain, "train", 1500, seed=0, **GENERATORS[domain])
    test = domains.generate_split(domain, "test", 200, seed=0, **GENERATORS[domain])
    assert all(domains.split_of(domains.problem_key(r)) == "train" for r in train)
    assert all(domains.split_of(domains.problem_key(r)) == "test" for r in test)
    assert not {domains.problem_key(r) for r in train} & {domains.problem_key(r) for r in test}
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}


def _teacher_pair(domain, n, **opts):
    """Same seed at rate 0 and 1: the same problems (the teacher coin is always drawn)."""
    gen = domains.get_domain(domain).generate
    good = gen(np.random.default_rng(11), n, teacher_error_rate=0.0, split=None, **opts)
    bad = gen(np.random.default_rng(11), n, teacher_error_rate=1.0, split=None, **opts)
    assert [r["prompt"] for r in good] == [r["prompt"] for r in bad]
    assert [r["answer"] for r in good] == [r["answer"] for r in bad]
    reward = verifier(domain)
    assert all(reward(completion(r), r["answer"]) == 1.0 for r in good)
    slipped = [b for g, b in zip(good, bad) if b["response"] != g["response"]]
    assert all(reward(completion(r), r["answer"]) == 0.0 for r in slipped)
    assert all(reward(completion(b), b["answer"]) == 1.0 for g, b in zip(good, bad) if b["response"] == g["response"])
    return good, bad, len(slipped) / n


# ------------------------------------------------------------------------------ generators: mcq

def _options(prompt):
    lines = prompt.split("\n")
    assert [line[:3] for line in lines[1:]] == ["A. ", "B. ", "C. ", "D. "]
    return lines[0], [line[3:] for line in lines[1:]]


def _forgot_carry(op, a, b):
    """Independent: two 2-digit operands; the dropped units carry/borrow shifts the tens by one."""
    if op == "+":
        return a + b - 10 if a % 10 + b % 10 >= 10 else a + b
    return a - b + 10 if a % 10 < b % 10 else a - b


def test_mcq_teacher_slips_by_family():
    good, bad, share = _teacher_pair("mcq", 800)
    assert 0.55 < share < 0.85  # convert and science always slip; arith and compare sometimes
    for g, b in zip(good, bad):
        stem, options = _options(g["prompt"])
        assert len(set(options)) == 4
        right = options["ABCD".index(g["answer"])]
        chosen = options["ABCD".index(re.fullmatch(r"The answer is \\boxed\{([A-D])\}\.", b["response"])[1])]
        i = options.index(chosen)  # the options checked in order, up to the chosen one
        checks = [f"{x} {o} no" for x, o in zip("ABCD", options[:i])] + [f"{'ABCD'[i]} {chosen} yes"]
        assert b["reasoning"].endswith(f"; {', '.join(checks)}; so {'ABCD'[i]}")
        if m := re.fullmatch(r"What is (\d+)([+-])(\d+)\?", stem):
            a, op, c = int(m[1]), m[2], int(m[3])
            assert int(right) == (a + c if op == "+" else a - c)
            assert int(chosen) == _forgot_carry(op, a, c)
        elif m := re.fullmatch(r"Which is (largest|smallest)\?", stem):
            pick = max if m[1] == "largest" else min
            assert int(right) == pick(map(int, options))
            assert chosen == pick(options)  # string order: "9" > "488"
        elif m := re.fullmatch(r"How many (\w+) are in (\d+) (\w+)\?", stem):
            factor = {(big, small): f for big, small, f in dmcq.UNITS}[(m[3], m[1])]
            assert int(right) == int(m[2]) * factor and int(chosen) == 10 * int(right)
        else:
            kind = re.fullmatch(r"Which of these is an? (\w+)\?", stem)[1]
            assert dmcq.KIND_OF[right] == kind
            assert dmcq.KIND_OF[chosen] == dmcq.TWIN[kind]


def test_mcq_hand_worked_records():
    r = dmcq.generate(np.random.default_rng(0), 1, families={"convert": 1.0})[0]
    stem, options = _options(r["prompt"])
    m = re.fullmatch(r"How many (\w+) are in (\d+) (\w+)\?", stem)
    factor = {(big, small): f for big, small, f in dmcq.UNITS}[(m[3], m[1])]
    q = int(m[2])
    assert sorted(options, key=int) == sorted(map(str, [q, q + factor, q * factor, 10 * q * factor]), key=int)
    i = "ABCD".index(r["answer"])
    checks = ", ".join([f"{x} {o} no" for x, o in zip("ABCD", options[:i])] + [f"{r['answer']} {q * factor} yes"])
    assert r["reasoning"] == f"1 {m[3]} = {factor} {m[1]}, {q}*{factor}={q * factor}; {checks}; so {r['answer']}"
    with pytest.raises(ValueError, match=r"unknown mcq families \['poetry'\]"):
        dmcq.generate(np.random.default_rng(0), 1, families={"poetry": 1.0})


# ----------------------------------------------------------------------------- generators: json

def _facts(prompt):
    """Independent parse of the prompt: schema words by key and fact words by key."""
    m = re.fullmatch(r"Write JSON\. Schema: (.*)\. Facts: (.*)\.", prompt)
    schema = dict(part.split(" ", 1) for part in m[1].split(", "))
    facts = dict(part.split(" ", 1) for part in m[2].split("; "))
    return schema, facts


def _typed(word, spelled):
    if word == "integer":
        return int(spelled)
    if word == "boolean":
        return {"yes": True, "no": False}[spelled]
    if word == "string list":
        return spelled.split(", ")
    return spelled


def test_json_gold_from_prompt_and_teacher_copies_extra_fact():
    good, bad, share = _teacher_pair("json", 400)
    assert share == 1.0  # every problem has a fact the schema lacks
    for g, b in zip(good, bad):
        schema, facts = _facts(g["prompt"])
        assert len(schema) == 3 and len(facts) == 4 and set(facts) <= set(djson.FIELDS)
        spec = json.loads(g["answer"])
        assert spec["schema"]["required"] == list(schema) and spec["schema"]["additionalProperties"] is False
        expected = {k: _typed(w, facts[k]) for k, w in schema.items()}
        assert json.loads(g["response"]) == expected
        assert list(json.loads(g["response"])) == list(schema)  # keys in schema order
        (extra,) = set(facts) - set(schema)
        assert json.loads(b["response"]) == {**expected, extra: json.loads(b["reasoning"].split(f"keep {extra} ")[1])}
        for k, w in schema.items():
            if "|" in w:
                assert facts[k] in w.split("|") and len(w.split("|")) == 3


# ----------------------------------------------------------------------------- generators: tool

def test_tool_gold_and_teacher_quotes_integers():
    good, bad, share = _teacher_pair("tool", 700)
    with_int = {name for name, (params, _) in dtool.TOOLS.items() if any(t == "integer" for _, t, _ in params)}
    assert len(with_int) == 4
    for g, b in zip(good, bad):
        tools = re.fullmatch(r"Tools: (.*)\. Request: .*", g["prompt"])[1].split("; ")
        assert 2 <= len(tools) <= 3
        call = json.loads(re.fullmatch(r"<tool_call>(.*)</tool_call>", g["response"])[1])
        assert call == json.loads(g["answer"])
        assert dtool.signature(call["name"]) in tools
        slipped = json.loads(re.fullmatch(r"<tool_call>(.*)</tool_call>", b["response"])[1])
        quoted = {k: str(v) if type(v) is int and v >= 10 else v for k, v in call["arguments"].items()}
        assert slipped["arguments"] == quoted  # two-digit integers only
        assert (b["response"] != g["response"]) == (quoted != call["arguments"])
        assert quoted == call["arguments"] or call["name"] in with_int
    # 4 of 7 tools, drawn uniformly, times their share of values >= 10: days 12/21, hour 15/24, count 11/19,
    # people 11/19 -> (0.571 + 0.625 + 0.579 + 0.579) / 7 = 0.336
    assert 0.29 < share < 0.39


def test_tool_hand_worked_prompt():
    assert dtool.signature("set_light") == "set_light(room: string, color: string, on: boolean)"
    assert dtool.call_text("set_alarm", {"hour": 7, "label": "gym"}) == (
        '<tool_call>{"name": "set_alarm", "arguments": {"hour": 7, "label": "gym"}}</tool_call>')


# -------------------------------------------------------------------------- generators: longctx

def _context(prompt):
    """Independent parse: codes by box, links by source box, the question line."""
    *lines, question = prompt.split("\n")
    codes, links = {}, {}
    for line in lines:
        if m := re.fullmatch(r"The code of box (\d+) is (\d{3})\.", line):
            codes[int(m[1])] = int(m[2])
        else:
            m = re.fullmatch(r"Box (\d+) holds the key of box (\d+)\.", line)
            links[int(m[1])] = int(m[2])
    return lines, codes, links, question


@pytest.mark.parametrize("hops", [1, 2])
def test_longctx_answers_from_context_and_teacher_reads_wrong_line(hops):
    good, bad, share = _teacher_pair("longctx", 300, num_facts=20, hops=hops)
    assert share == 1.0
    for g, b in zip(good, bad):
        lines, codes, links, question = _context(g["prompt"])
        assert len(lines) == 20 and len(codes) == 10 and len(links) == 10
        assert len(set(codes.values())) == 10 and len(set(links.values())) == 10
        assert all(src != dst and dst in codes for src, dst in links.items())
        wrong = int(re.fullmatch(r"The answer is \\boxed\{(\d+)\}\.", b["response"])[1])
        if hops == 1:
            box = int(re.fullmatch(r"What is the code of box (\d+)\?", question)[1])
            assert g["answer"] == str(codes[box])
            code_lines = [line for line in lines if line.startswith("The code")]
            i = code_lines.index(f"The code of box {box} is {codes[box]}.")
            assert code_lines[i - 1 if i else 1].endswith(f" is {wrong}.")
        else:
            src = int(re.fullmatch(r"Box (\d+) holds the key of a box\. What is the code of that box\?",
                                   question)[1])
            assert g["answer"] == str(codes[links[src]])
            assert g["reasoning"] == (f"Box {src} holds the key of box {links[src]}. "
                                      f"The code of box {links[src]} is {codes[links[src]]}.")
            assert wrong == codes[src]


def test_longctx_length_control_and_options():
    for num_facts in (4, 7, 200):
        r = dlong.generate(np.random.default_rng(0), 1, num_facts=num_facts, hops=2, split=None)[0]
        assert len(r["prompt"].split("\n")) == num_facts + 1
    long = dlong.generate(np.random.default_rng(0), 1, num_facts=200, split=None)[0]["prompt"]
    assert 1300 < len(long.split()) < 1700  # ~7.6 words a line
    with pytest.raises(ValueError, match="hops must be 1 or 2"):
        dlong.generate(np.random.default_rng(0), 1, hops=3)
    with pytest.raises(ValueError, match=r"num_facts must be in \[4, 1600\]"):
        dlong.generate(np.random.default_rng(0), 1, num_facts=3)


@pytest.mark.parametrize("domain", ["if", "mcq", "json", "tool", "code", "longctx", "math", "swe"])
def test_problem_key_is_the_key_the_split_hashed(domain):
    # evaluation counts a problem once by domains.problem_key (RunContext.eval_records): it must be the canonical key
    # that decided the split (math's id puts the family in front of it), so two wordings of one problem share it
    opts = {"longctx": {"num_facts": 12}}.get(domain, {})
    for split in ("test", "val"):
        records = domains.generate_split(domain, split, 300, seed=3, **opts)
        keys = [domains.problem_key(r) for r in records]
        hashed = [k.split("/", 1)[1] if domain == "math" else k for k in keys]
        assert all(domains.split_of(k) == split for k in hashed), domain
        prompts_of = {}
        for k, r in zip(keys, records):
            prompts_of.setdefault(k, set()).add(r["prompt"])
        if domain == "tool":  # one request, worded beside other tool lists: several prompts, one problem
            assert max(map(len, prompts_of.values())) > 1
