"""reasoning-gym as a math source (domain "rg_math"): determinism, split, and gold answers that verify."""

import numpy as np
import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym not installed (pip install reasoning-gym)")

from nemocascade.chat import render_completion  # noqa: E402
from nemocascade.data import generate_split, split_of  # noqa: E402
from nemocascade.data import reasoning_gym as rgm  # noqa: E402
from nemocascade.data.domains import verifier  # noqa: E402
from nemocascade.rewards import math as math_reward  # noqa: E402


def test_deterministic_and_contract():
    a = rgm.generate(np.random.default_rng(7), 60, split="train")
    b = rgm.generate(np.random.default_rng(7), 60, split="train")
    assert a == b
    c = rgm.generate(np.random.default_rng(8), 60, split="train")
    assert [r["prompt"] for r in a] != [r["prompt"] for r in c]
    records = generate_split("rg_math", "test", 20, seed=0)  # validates the record contract
    assert {r["domain"] for r in records} == {"rg_math"}
    assert {r["id"].split("/")[3] for r in a} == set(rgm.DEFAULT_DATASETS)


def test_split_disjoint():
    train = rgm.generate(np.random.default_rng(0), 400, split="train")
    test = rgm.generate(np.random.default_rng(0), 60, split="test")
    assert all(split_of(r["prompt"]) == "train" for r in train)
    assert all(split_of(r["prompt"]) == "test" for r in test)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}


def test_gold_response_scores_one_and_a_wrong_one_zero():
    records = rgm.generate(np.random.default_rng(1), 180, split=None, datasets=list(rgm.SUPPORTED))
    assert {r["id"].split("/")[3] for r in records} == set(rgm.SUPPORTED)
    reward = verifier("rg_math")
    assert reward is math_reward.score
    for r, other in zip(records, records[1:] + records[:1]):
        gold = "<think>\n" + render_completion(r["reasoning"], r["response"])
        assert reward(gold, r["answer"]) == 1.0, r
        if other["answer"].strip("$") != r["answer"].strip("$"):  # another problem's answer is a wrong one
            wrong = "<think>\n" + render_completion(r["reasoning"], other["response"])
            assert reward(wrong, r["answer"]) == 0.0, (r, other)


def test_gsm_symbolic_keeps_its_own_solution():
    records = rgm.generate(np.random.default_rng(2), 5, split=None, datasets=["gsm_symbolic"])
    for r in records:
        assert r["reasoning"] and "####" not in r["reasoning"]
        assert r["response"] == f"The answer is \\boxed{{{r['answer']}}}."
        assert r["answer"] in r["reasoning"]  # the worked solution ends at the answer it reaches
    plain = rgm.generate(np.random.default_rng(2), 5, split=None, datasets=["chain_sum"])
    assert all(r["reasoning"] == "" for r in plain)


def test_rejects_unsupported_datasets():
    with pytest.raises(ValueError, match="number_sorting"):
        rgm.generate(np.random.default_rng(0), 1, datasets=["number_sorting"])


def test_families_are_domains_with_their_own_name_and_the_boxed_verifier():
    for name, (datasets, _) in rgm.FAMILIES.items():
        records = generate_split(name, "val", 6, seed=0)
        assert {r["domain"] for r in records} == {name}
        assert {r["id"].split("/")[3] for r in records} <= set(datasets)
        assert verifier(name) is math_reward.score
        assert verifier(name)("The answer is \\boxed{" + records[0]["answer"] + "}.", records[0]["answer"]) == 1.0
    with pytest.raises(ValueError, match="not a reasoning-gym family"):
        rgm.generate(np.random.default_rng(0), 1, domain="rg_nope")


def test_a_question_drawn_twice_is_one_problem():
    """Two 1-digit terms repeat often: evaluation (RunContext.eval_records) must count such a question once."""
    from nemocascade.data.domains import problem_key
    records = rgm.generate(np.random.default_rng(0), 300, split=None, datasets=["chain_sum"],
                           configs={"chain_sum": dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)})
    questions = {r["prompt"] for r in records}
    assert len(questions) < len(records)  # the space (10 x 10 x 2 operators) forces repeats
    assert len({problem_key(r) for r in records}) == len(questions)
