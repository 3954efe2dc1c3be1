"""Math reward: hand-worked (completion, answer, expected) cases; see nemocascade/rewards/math.py."""

import threading
import time
from fractions import Fraction

import pytest

from nemocascade.data.domains import verifier
from nemocascade.rewards import math as math_reward
from nemocascade.rewards.math import last_boxed, score

T = "<think>\nLet me compute. Maybe \\boxed{1}? No.\n</think>\n"  # a finished reasoning block

CASES = [
    # --- numbers: integers, decimals, fractions, negatives
    (r"The answer is \boxed{42}.", "42", 1.0),
    (r"\boxed{71}", "17", 0.0),
    (r"\boxed{3/4}", "0.75", 1.0),
    (r"\boxed{\frac{3}{4}}", "0.75", 1.0),
    (r"\boxed{\dfrac34}", "3/4", 1.0),
    (r"\boxed{\tfrac{3}{4}}", r"\frac34", 1.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{2/4}", "1/2", 1.0),
    (r"\boxed{1.50}", "1.5", 1.0),
    (r"\boxed{0.33}", "1/3", 0.0),  # decimals are exact: a truncation is not the fraction
    (r"\boxed{\frac{-3}{4}}", "-0.75", 1.0),
    (r"\boxed{-\frac{3}{4}}", r"\frac{3}{4}", 0.0),
    (r"\boxed{-5}", "\u22125", 1.0),  # unicode minus in the reference
    (r"\boxed{-5}", "5", 0.0),
    (r"\boxed{\frac{1}{0}}", "0", 0.0),
    # --- thousands separators, units, text, currency, percent, degrees
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{1{,}000{,}000}", "1000000", 1.0),
    (r"\boxed{1,000}", "100", 0.0),
    (r"\boxed{5 apples}", "5", 1.0),
    (r"\boxed{\text{5 cm}}", "5", 1.0),
    (r"\boxed{12\text{ inches}}", "12", 1.0),
    (r"\boxed{\frac{3}{4}\text{ inches}}", "0.75", 1.0),
    (r"\boxed{\$5}", "5", 1.0),
    (r"$\boxed{5}$", "$5$", 1.0),
    (r"\boxed{5\%}", "5", 1.0),
    (r"\boxed{90^\circ}", "90", 1.0),
    (r"\boxed{90^{\circ}}", "90", 1.0),
    ("\\boxed{45\u00b0}", "45", 1.0),
    (r"\boxed{5 apples}", "6", 0.0),
    (r"\boxed{5 m}", "5", 1.0),
    (r"\boxed{2 x}", "2", 0.0),  # a one-letter word may be a variable, not a unit
    # --- "x =" forms, wrappers, spacing
    (r"\boxed{x = 5}", "5", 1.0),
    (r"\boxed{x=\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{5}", "y = 5", 1.0),
    (r"\boxed{x = 6}", "5", 0.0),
    (r"\boxed{\left( 3 \right)}", "3", 1.0),
    (r"\boxed{ 7 }", "7", 1.0),
    (r"\boxed {7}", "7", 1.0),
    (r"\fbox{7}", "7", 1.0),
    (r"\boxed{\boxed{7}}", "7", 1.0),
    (r"\boxed{8}", r"\boxed{8}", 1.0),  # a boxed reference is unboxed too
    # --- simple LaTeX: roots, pi (string-equal fast path or the math_verify fallback)
    (r"\boxed{\sqrt{2}}", r"\sqrt2", 1.0),
    (r"\boxed{2\sqrt{3}}", r"\sqrt{12}", 1.0),
    (r"\boxed{2\sqrt{3}}", r"3\sqrt{2}", 0.0),
    (r"\boxed{2 \pi}", r"2\pi", 1.0),
    (r"\boxed{\frac{\pi}{2}}", r"\pi/2", 1.0),
    (r"\boxed{\pi}", "3.14", 0.0),
    (r"\boxed{\{1,2\}}", r"\{2,1\}", 1.0),
    # --- which box counts
    (r"First \boxed{3}, then corrected: \boxed{4}", "4", 1.0),  # last box wins
    (r"First \boxed{4}, then corrected: \boxed{3}", "4", 0.0),
    (r"So the answer is 4, i.e. \boxed{5}", "4", 0.0),  # text outside the box is ignored
    ("The answer is 4.", "4", 0.0),  # no box at all
    (r"\boxed{4", "4", 0.0),  # unbalanced
    (r"\boxed{4} and then \boxed{5", "4", 0.0),  # last box unbalanced: cut-off answer, no fallback
    (r"\boxed{}", "4", 0.0),
    # --- think blocks
    (T + r"So \boxed{7}.", "7", 1.0),
    (T + r"So \boxed{7}.", "1", 0.0),  # the box inside the think block does not count
    (r"<think>the answer is \boxed{7}", "7", 0.0),  # never closed: unfinished
    (r"<think>\boxed{7}</think>The answer is 7.", "7", 0.0),  # box only before </think>
    (r"<think>a</think>\boxed{6}<think>b</think>\boxed{7}", "7", 1.0),  # after the LAST </think>
    ("\\boxed{7}<|im_end|>", "7", 1.0),
    # --- empty
    ("", "5", 0.0),
    (r"\boxed{5}", "", 0.0),
]

# Malformed / pathological model output: 0.0, no exception, and fast (refused before sympy sees it).
PATHOLOGICAL = [
    "}{" * 250,
    r"\boxed{10^10^10}",
    r"\boxed{2^{2^{40}}}",
    r"\boxed{9^{9^{9^{9}}}}",
    r"\boxed{10**10**10}",
    r"\boxed{100000!}",
    r"\boxed{" + r"\frac{" * 100 + "1" + "}{2}" * 100 + "}",
    r"\boxed{" + "x+y*" * 125 + "}",  # 500-char garbage
]
CASES += [(completion, "5", 0.0) for completion in PATHOLOGICAL]


@pytest.mark.parametrize("completion,answer,expected", CASES)
def test_score_table(completion, answer, expected):
    assert score(completion, answer) == expected


def test_pathological_inputs_skip_sympy():
    # Guarded inputs never reach math_verify; unguarded, the power towers and the nested fractions would
    # each spend the whole sympy budget. tests/test_verifier_bounds.py has the hostile cases in bulk.
    for completion in PATHOLOGICAL:
        start = time.perf_counter()
        assert score(completion, "5") == 0.0
        assert time.perf_counter() - start < 0.25, completion[:40]
    assert math_reward._too_costly("10^10^10") and math_reward._too_costly(r"2^{2^{40}}")
    assert math_reward._too_costly("x^{-123456}") and math_reward._too_costly("12345!")
    assert not math_reward._too_costly(r"2^{10}") and not math_reward._too_costly(r"\sqrt{12}")
    # brackets of every kind count towards the depth; big exponents count together
    assert math_reward._too_costly("(" * 13 + "1" + ")" * 13) and math_reward._too_costly(r"(9999^{9999})^{9999}")
    assert not math_reward._too_costly("[" * 12 + "1" + "]" * 12) and not math_reward._too_costly(r"2^{100}3^{100}")
    assert not math_reward._too_costly("+".join(f"x_{i}^{2}" for i in range(20)))  # small exponents are free
    # powers of sums: C(n+k-1, k-1) terms to expand, k summands to the n; refused past 1000
    assert math_reward._too_costly(r"(x+y+z+1)^{60}")  # C(63, 3) = 39711
    assert not math_reward._too_costly(r"(a+b+c+d)^{16}")  # C(19, 3) = 969
    assert math_reward._too_costly(r"(a+b+c+d)^{17}")  # C(20, 3) = 1140
    assert math_reward._too_costly(r"((a+b)-(c+d))^{17}")  # nested sums count too
    assert not math_reward._too_costly(r"(x+1)^{60}") and not math_reward._too_costly(r"(2+3+4+5)^{60}")  # 61; a number
    assert not math_reward._too_costly(r"(e^{-x}+x)^{100}")  # the exponent's sign is no summand: 101 terms


# The fast path on its own (the table above cannot tell it from the math_verify fallback).
@pytest.mark.parametrize("raw,canonical", [
    ("5 apples", "5"),
    (r"\text{5 cm}", "5"),
    (r"12\text{ inches}", "12"),
    ("2 x", "2x"),  # letters after a non-number are not units
    ("x = 5", "5"),
    (r"\theta = 30^\circ", "30"),
    (r"1{,}000", "1,000"),
    (r"\dfrac34", r"\frac{3}{4}"),
    (r"\tfrac{1}2", r"\frac{1}{2}"),
    (r"\sqrt2", r"\sqrt{2}"),
    (r"\left( 3 \right)", "(3)"),
    (r"\$5", "5"),
    (r"5\%", "5"),
    ("\u22127", "-7"),
    (r"\boxed{\fbox{7}}", "7"),
    ("{5}.", "5"),
])
def test_normalise(raw, canonical):
    assert math_reward._normalise(raw) == canonical


@pytest.mark.parametrize("s,value", [
    ("42", Fraction(42)),
    ("-0.75", Fraction(-3, 4)),
    ("1,000,000.5", Fraction(2000001, 2)),
    (r"\frac{-3}{4}", Fraction(-3, 4)),
    (r"-\frac{3}{4}", Fraction(-3, 4)),
    (r"\frac{1.5}{3}", Fraction(1, 2)),
    ("6/8", Fraction(3, 4)),
    ("(3)", Fraction(3)),
    ("0.33", Fraction(33, 100)),
    ("1/0", None),
    ("1,2", None),  # not a thousands group: a tuple, left to math_verify
    (r"\sqrt{2}", None),
    ("2x", None),
])
def test_to_fraction(s, value):
    assert math_reward._to_fraction(s) == value


def test_non_string_inputs_score_zero_or_compare():
    assert score(None, "5") == 0.0
    assert score(r"\boxed{5}", 5) == 1.0  # datasets may store the reference as a number
    assert score(r"\boxed{0.25}", 0.25) == 1.0


def test_in_think_means_prompt_opened_the_block():
    # Thinking-mode rollouts start after the prompt's "<think>\n": no </think> means unfinished.
    assert score(r"reasoning \boxed{7}", "7", in_think=True) == 0.0
    assert score("reasoning\n</think>\n" + r"\boxed{7}", "7", in_think=True) == 1.0
    assert score(r"reasoning \boxed{7}", "7") == 1.0  # non-thinking completion


def test_fallback_from_a_worker_thread():
    # Signal timers are main-thread only; the fallback's budget must still hold, and answer, in a thread.
    out = []
    t = threading.Thread(target=lambda: out.append(score(r"\boxed{2\sqrt{3}}", r"\sqrt{12}")))
    t.start()
    t.join()
    assert out == [1.0]


@pytest.mark.parametrize("text,expected", [
    (r"a \boxed{1} b \boxed{2} c", "2"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces are not grouping
    (r"\boxed{a{b}c}", "a{b}c"),
    (r"\fbox{3}", "3"),
    (r"\boxed{1} \boxed{2", None),
    ("no box", None),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_registry():
    assert verifier("math") is score  # the domain record's own
    with pytest.raises(KeyError, match=r"'chess'.*a domain \(\[.*'math'.*rewards.REWARDS \(\[.*'swe_exec'"):
        verifier("chess")
