"""Code extraction in linear time, and the size cap on the final answer (issue 12, item 5)."""

import json
import time

import pytest

from nemocascade.rewards import code as code_reward
from nemocascade.rewards import swe as swe_reward

TESTS = "assert add(1, 2) == 3\nassert add(-4, 4) == 0\nassert add(10, 5) == 15\n"
RIGHT = "def add(a, b):\n    return a + b\n"
SWE_ANSWER = json.dumps({"fix": "def f(x):\n    return x + 1", "buggy": "def f(x):\n    return x - 1",
                         "tests": ["assert f(1) == 2", "assert f(5) == 6"]})


def _answer(tests: str) -> str:
    return json.dumps({"tests": tests, "entry_point": "add"})


def _completion(program: str) -> str:
    return f"<think>\nplan\n</think>\n```python\n{program}```"


ADVERSARIAL = {
    # Openers that no line-start closer follows: the old regex retried its lazy body from each one,
    # ~40 s on 200 KB of either of the first two (0.4 s on 20 KB, quadratic).
    "openers_after_text": "x```\n" * 40_000,
    "python_openers_after_text": "text ```py\n" * 20_000,
    "line_start_openers": "```python\n" * 20_000,
    "other_language_blocks": "```js\n```python\n" * 15_000,
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_extraction_is_linear_on_200kb(name):
    text = ADVERSARIAL[name][:200_000]
    assert len(text) == 200_000
    start = time.monotonic()
    code_reward.extract_code(text)
    assert time.monotonic() - start < 1.0


def test_over_long_answers_score_0_before_extraction():
    huge = _completion(RIGHT + "#" * 70_000 + "\n")  # the final text is over MAX_ANSWER_CHARS (64K)
    start = time.monotonic()
    assert code_reward.score(huge, _answer(TESTS)) == 0.0
    assert swe_reward.execution_score(huge, SWE_ANSWER) == 0.0
    assert swe_reward.agentless_score(huge, SWE_ANSWER) == -1.0
    assert time.monotonic() - start < 0.1
    assert code_reward.score(_completion(RIGHT + "#" * 60_000 + "\n"), _answer(TESTS)) == 1.0
    # Long reasoning is not the answer: 300K characters of thinking before a short program still score.
    long_think = "<think>\n" + "let me think. " * 22_000 + "\n</think>\n```python\n" + RIGHT + "```"
    assert len(long_think) > 300_000
    assert code_reward.score(long_think, _answer(TESTS)) == 1.0


def test_extraction_rules():
    from nemocascade.rewards.extract import last_python_block

    assert last_python_block("```python\na\n```\n```js\nb\n```\n") == "a\n"  # another language: skipped
    assert last_python_block("```js\nb\n```\ntext\n```py\nc\n```") == "c\n"
    assert last_python_block("say ```python\nd\n  ```") == "d\n"  # opener after text, indented closer
    assert last_python_block("```PYTHON3 \ne\n```\n```\nf\n```") == "f\n"
    assert last_python_block("```python\ng\n") is None  # never closed
    assert last_python_block("```python\n```") == ""
    assert last_python_block("no fence") is None
