"""Bounded verifiers (nemocascade/rewards/limits.py): hostile completions score 0 in well under a second in
every domain, and a verifier that raises or runs too long costs one reward and is counted.

Before the bounds, each math and instruction case below took 1 s to minutes (quadratic brace peeling and
unit stripping, a line-start regex retried over a run of blank lines, sympy up to math_verify's whole-second
alarms) or scored 1 where it should not. Their bounded cost is milliseconds, or the 0.5 s sympy budget for
what reaches the math fallback, so 1 s leaves room for a loaded machine.
"""

import dataclasses
import gc
import json
import re
import signal
import threading
import time

import numpy as np
import pytest

from nemocascade import evaluation
from nemocascade.data import domains
from nemocascade.data.domains import verifier
from nemocascade.rewards import instruct
from nemocascade.rewards import math as math_reward
from nemocascade.rewards.pool import VerifierPool

LIMIT_S = 1.0


@pytest.fixture(scope="module", autouse=True)
def warm_sympy():
    """The first fallback imports sympy (~0.4 s): not what these tests time."""
    assert math_reward.score(r"\boxed{2\sqrt{3}}", r"\sqrt{12}") == 1.0


def _timed(fn, *args):
    """(fn(*args), seconds), the verifier's own time: the cyclic GC is run first and held off during the call.
    Late in the suite (98%, the test process's heap holding jax, torch and transformers) a normalisation that takes
    17 ms took 1.15 s, most likely a full collection landing inside the timed call; an earlier 1.43 s call on a 0.5 s
    budget came at the same point. Pool workers, where verifiers run in training, hold a small heap."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        value = fn(*args)
        return value, time.perf_counter() - start
    finally:
        gc.enable()


def _cf(n: int) -> str:
    return "\\frac{1}{x+" + _cf(n - 1) + "}" if n else "1"


# (name, completion, reference): each scores 0 now; before, each took >= 1 s or scored 1.
HOSTILE_MATH = [
    ("deep_braces", "\\boxed{" + "{" * 5000 + "5" + "}" * 5001, "5"),  # was 1.7 s and 1.0
    ("nested_boxes", "\\boxed{" * 4000 + "5" + "}" * 4000, "5"),
    ("nested_fbox", "\\fbox{" * 4000 + "5" + "}" * 4000, "5"),
    ("nested_text", "\\boxed{" + "\\text{" * 4000 + "5" + "}" * 4001, "5"),
    ("unit_words", "\\boxed{5" + " cm" * 5000 + " m}", "5"),
    ("unit_spaces", "\\boxed{5" + " " * 30000 + "m}", "5"),
    ("digits_100k", "\\boxed{" + "9" * 100_000 + "}", "9" * 100_000),  # over MAX_ANSWER_CHARS: was 1.0
    # sympy: each ran to math_verify's 1 s alarm; now refused before sympy, or cut at the 0.5 s budget
    ("power_of_power", r"\boxed{(9999^{9999})^{9999}}", "5"),
    ("big_product", "\\boxed{" + "9999^{9999}\\cdot" * 20 + "1}", "5"),
    ("huge_sum", r"\boxed{\sum_{k=1}^{9999}k^{9999}}", "5"),
    ("deep_parens", "\\boxed{" + "(" * 190 + "1" + ")" * 190 + "}", "5"),
    ("factorial_of_power", r"\boxed{(9^{9})!}", "5"),
    ("nested_factorial", r"\boxed{(100!)!}", "5"),  # off the main thread: 0.75 s, in C; now refused
    ("huge_binomial", r"\boxed{\binom{99999999}{49999999}}", "5"),
    # 39711 terms to expand: cut at the budget, it once took 1.4 s in CI's suite; now refused before sympy
    ("polynomial_power", r"\boxed{(x+y+z+1)^{60}}", "5"),
    ("nested_polynomial_power", r"\boxed{{((x+y)+(z+1))}^{60}}", "5"),
]


@pytest.mark.parametrize("name,completion,answer", HOSTILE_MATH, ids=[c[0] for c in HOSTILE_MATH])
def test_hostile_math_answers_score_zero_fast(name, completion, answer):
    value, elapsed = _timed(math_reward.score, completion, answer)
    assert value == 0.0 and elapsed < LIMIT_S, (value, elapsed)


def test_hostile_math_fast_off_the_main_thread():
    # signal timers are main-thread only; in a thread the budget is an asynchronous exception. Before, a
    # helper thread ran sympy unbounded and was abandoned after 3 s, slowing every later call.
    out = []

    to_sympy = [case for case in HOSTILE_MATH if case[0] in ("factorial_of_power", "huge_binomial")]  # cut at
    # the budget

    def run():
        for _, completion, answer in to_sympy:
            out.append(_timed(math_reward.score, completion, answer))
        out.append(_timed(math_reward.score, r"\boxed{2\sqrt{3}}", r"\sqrt{12}"))

    before = set(threading.enumerate())  # other tests' threads (TensorBoard writers, orbax) may still run
    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert [v for v, _ in out] == [0.0, 0.0, 1.0]
    # The asynchronous exception lands at the thread's next bytecode, after whatever C call sympy is in; idle
    # these take 0.50-0.63 s, and one took 1.06 s in CI's suite (many threads on 2 cores). 2 s is still well
    # under the unbounded 3 s + leftover thread of before, which the check below catches anyway.
    assert max(t for _, t in out) < 2 * LIMIT_S, out
    deadline = time.monotonic() + 1.0  # a watchdog thread may take a moment to notice its call returned
    while (left := set(threading.enumerate()) - before) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not left, left  # nothing the verifier started is left running


def test_normaliser_is_linear():
    # Each of these took seconds before (a brace match per peeled layer, a unit regex that backtracks).
    cases = [("{" * 20000 + "5" + "}" * 20000, "5"),
             ("\\boxed{" * 6000 + "5" + "}" * 6000, "5"),
             ("\\text{" * 8000 + "5" + "}" * 8000, "5"),
             ("5" + " cm" * 20000, "5"),
             ("5" + " " * 100_000 + "apples", "5")]
    for raw, canonical in cases:
        value, elapsed = _timed(math_reward._normalise, raw)
        assert value == canonical and elapsed < 0.5, (raw[:20], elapsed)


def _instr(constraint: dict) -> str:
    return json.dumps([constraint])


HOSTILE_IF = [  # IFEval's r"^\s*..." retries a whole run of blank lines from each of its line starts
    ("bullets", "x" + "\n" * 80_000 + "x", _instr({"type": "bullet_list", "n": 1})),
    ("sections", "x" + "\n" * 80_000 + "x", _instr({"type": "sections", "n": 1})),
    ("postscript", "x" + "\n" * 80_000 + "x", _instr({"type": "postscript"})),
    ("bullets_spaced", "x" + " \n" * 40_000 + "x", _instr({"type": "bullet_list", "n": 1})),
]


@pytest.mark.parametrize("name,completion,answer", HOSTILE_IF, ids=[c[0] for c in HOSTILE_IF])
def test_hostile_instruction_responses_score_zero_fast(name, completion, answer):
    value, elapsed = _timed(instruct.score, completion, answer)
    assert value == 0.0 and elapsed < LIMIT_S, (value, elapsed)


def test_line_start_patterns_count_as_ifeval():
    # ^[^\S\n]* instead of IFEval's ^\s*: the same lines match, so the same counts.
    rng = np.random.default_rng(0)
    for _ in range(3000):
        text = "".join(rng.choice(["*", "-", " ", "\n", "\t", "\r", "x", "SECTION", "1", "P.S."],
                                  size=int(rng.integers(0, 16))))
        stars = re.findall(r"^\s*\*[^\*].*$", text, flags=re.MULTILINE)
        dashes = re.findall(r"^\s*-.*$", text, flags=re.MULTILINE)
        assert all(instruct.bullet_list(text, n) == (len(stars) + len(dashes) == n) for n in range(4)), repr(text)
        sections = [int(k) for k in re.findall(r"^\s*SECTION\s+(\d+)\b", text, flags=re.MULTILINE)]
        assert instruct.sections(text, 1) == (sections == [1]), repr(text)
        ps = re.search(r"^\s*p\.\s?s\.", text.lower(), flags=re.MULTILINE) is not None
        assert instruct.postscript(text) == ps, repr(text)
    _, elapsed = _timed(instruct.bullet_list, "x" + "\n" * 80_000 + "x", 1)
    assert elapsed < LIMIT_S


PAD = " " * 1_000_001  # stripped by strip_think, so only the completion's length changes
JSON_ANSWER = json.dumps({"schema": {"type": "object", "properties": {"a": {"type": "integer"}}}, "values": {"a": 1}})
TOOL_ANSWER = json.dumps({"name": "f", "arguments": {"a": 1}})
PREF_ANSWER = json.dumps({"keywords": ["sleep"], "min_words": 3, "max_words": 40})
CORRECT = {  # domain -> (a completion that scores 1, its answer)
    "math": (r"\boxed{5}", "5"),
    "mcq": (r"\boxed{B}", "B"),
    "if": ("all quiet here", _instr({"type": "lowercase"})),
    "json": ('{"a": 1}', JSON_ANSWER),
    "tool": ('<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', TOOL_ANSWER),
    "pref": ("Keep your room dark for better sleep.", PREF_ANSWER),
}


@pytest.mark.parametrize("domain", sorted(CORRECT))
def test_over_long_completion_scores_zero(domain):
    reward = verifier(domain)
    completion, answer = CORRECT[domain]
    assert reward(completion, answer) == 1.0
    value, elapsed = _timed(reward, completion + PAD, answer)
    assert value == 0.0 and elapsed < LIMIT_S


def test_math_answer_length_cap():
    assert math_reward.score("\\boxed{" + "7" * 1000 + "}", "7" * 1000) == 1.0
    assert math_reward.score("\\boxed{" + "7" * 1001 + "}", "7" * 1001) == 0.0  # MAX_ANSWER_CHARS


N = 200_000
ADVERSARIAL = {  # domain -> 200 KB texts built to make its parser slow; none may take 1 s
    "math": ["\\boxed{" * (N // 7), "\\boxed{" + "{" * N + "5" + "}" * (N + 1),
             "\\boxed{" + "\\left(" * (N // 6) + "}", "\\boxed{" + "\\frac{" * (N // 6) + "1" + "}{2}" * (N // 6) + "}",
             "\\boxed{" + "\\text{a}" * (N // 8) + "}", "\\boxed{5" + " ab" * (N // 3) + " a}",
             "\\boxed{1" + ",000" * (N // 4) + ".5}"],
    "mcq": ["answer:" + " " * N, "\\boxed{" * (N // 7), "\\boxed{" + " " * N + "A.}"],
    "if": ["x" + "\n" * N + "x", "[" * N, "<<" * (N // 2), "Mr. A. B. C. D.e.f. " * (N // 20), "." * N],
    "json": ["[" * N + "]" * N, '{"a":' * (N // 5) + "1" + "}" * (N // 5), '{"a": ' + "9" * N + "}",
             "```json\n" + "`" * N, "```\n" * (N // 4) + "x"],
    "tool": ["<tool_call>" + "[" * N + "]" * N + "</tool_call>", "<tool_call>" * (N // 11),
             '<tool_call>{"name": "f", "arguments": {"a": ' + "9" * N + "}}</tool_call>"],
    "pref": ["I don't know " + "sleep." * (N // 6), "I don't know " + "a" * N],
}
ANSWERS = {"math": "5", "mcq": "B", "json": JSON_ANSWER, "tool": TOOL_ANSWER, "pref": PREF_ANSWER,
           "if": json.dumps([{"type": t, "n": 1} for t in ("bullet_list", "sections", "placeholders")]
                            + [{"type": "title"}, {"type": "postscript"}, {"type": "json_format"},
                               {"type": "sentence_count", "max": 3}, {"type": "word_count", "max": 5}])}


def test_every_domain_bounded_on_200kb_adversarial_text():
    for domain, texts in ADVERSARIAL.items():
        reward = verifier(domain)
        for text in texts:
            value, elapsed = _timed(reward, text, ANSWERS[domain])
            assert value == 0.0 and elapsed < LIMIT_S, (domain, text[:30], value, elapsed)


# ------------------------------------------------------------------ failures cost one reward, counted
def raises(completion, answer):
    raise RuntimeError("a verifier bug")


def spins(completion, answer):
    while True:
        pass


def test_score_texts_counts_failures_per_call():
    records = [{"domain": "math", "answer": "5"}, {"domain": "mcq", "answer": "B"}, {"domain": "if", "answer": "[]"}]
    texts = [r"\boxed{5}", r"\boxed{B}", "anything"]
    with VerifierPool(num_workers=0, timeout_s=0.3) as pool:
        scores, counts = evaluation.score_texts(pool, texts, records, {"mcq": raises, "if": spins})
    assert scores == [1.0, 0.0, 0.0]
    assert counts == {"verifier_timeouts": 1, "verifier_errors": 1, "verifier_crashes": 0}


def test_evaluate_reports_the_counts_beside_pass_at_1(monkeypatch):
    monkeypatch.setattr(evaluation, "generate", lambda *a, **k: ([r"\boxed{5}", "x", "y"], [3, 1, 1]))
    monkeypatch.setitem(domains.DOMAINS, "mcq", dataclasses.replace(domains.DOMAINS["mcq"], verifier=raises))
    records = [{"domain": "math", "answer": "5"}, {"domain": "mcq", "answer": "B"}, {"domain": "mcq", "answer": "C"}]
    with VerifierPool(num_workers=0, timeout_s=0.3) as pool:
        out = evaluation.evaluate(None, None, None, records, pool, batch_size=1, max_prompt_len=1,
                                  max_new_tokens=1, rng=None)
    assert out == {"pass@1": pytest.approx(1 / 3), "n": 3, "mean_len": pytest.approx(5 / 3),
                   "verifier_timeouts": 0, "verifier_errors": 2, "verifier_crashes": 0,
                   "scores": [1.0, 0.0, 0.0], "ci95": pytest.approx([0.0615, 0.7923], abs=1e-4)}  # Wilson 1/3


def test_a_verifier_bug_is_counted_not_hidden(monkeypatch):
    # Bad input scores 0.0 inside the verifier; an exception is a bug, and the pool counts it.
    def broken(s):
        raise NameError("typo")

    monkeypatch.setattr(math_reward, "_normalise", broken)
    with pytest.raises(NameError):
        math_reward.score(r"\boxed{5}", "5")
    with VerifierPool(num_workers=0) as pool:
        assert pool.score(math_reward.score, [(r"\boxed{5}", "5"), ("no box", "5")]) == [0.0, 0.0]
        assert pool.last_stats == {"timeouts": 0, "errors": 1, "crashes": 0}


# ------------------------------------------------------------------ the in-process time limit
def test_time_limit_restores_the_previous_handler_and_timer():
    from nemocascade.rewards.limits import call_with_timeout

    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *a: fired.append(time.monotonic()))
    try:
        start = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 1.0)  # someone else's alarm, due in 1 s
        assert call_with_timeout(0.2, spins, "", "") == (None, True)
        assert call_with_timeout(5.0, len, "abc") == (3, False)
        assert 0.5 < signal.getitimer(signal.ITIMER_REAL)[0] < 0.85  # still due at its own time
        time.sleep(1.2)
        assert len(fired) == 1 and 0.95 < fired[0] - start < 1.3
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_nested_limits_each_catch_their_own():
    from nemocascade.rewards.limits import call_with_timeout

    def inner_then_spin():
        assert call_with_timeout(0.1, spins, "", "") == (None, True)  # the inner budget runs out first
        spins("", "")

    start = time.monotonic()
    assert call_with_timeout(0.4, inner_then_spin) == (None, True)
    assert 0.35 < time.monotonic() - start < 0.9
    # an outer deadline that comes first interrupts the inner call, and the outer call reports it
    start = time.monotonic()
    assert call_with_timeout(0.2, call_with_timeout, 5.0, spins, "", "") == (None, True)
    assert time.monotonic() - start < 0.7
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_time_limit_off_the_main_thread():
    from nemocascade.rewards.limits import call_with_timeout

    out = []
    worker = threading.Thread(target=lambda: out.append(_timed(call_with_timeout, 0.3, spins, "", "")))
    worker.start()
    worker.join(5.0)
    assert out and out[0][0] == (None, True) and out[0][1] < 0.8


def swallows_once_then_spins(completion, answer):
    """As when the interruption lands in a finalizer (gc during the call): Python reports it as unraisable
    and drops it, and the call runs on."""
    try:
        spins(completion, answer)
    except BaseException:
        pass
    spins(completion, answer)


@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_swallowed_interruption_is_repeated(where):
    from nemocascade.rewards.limits import call_with_timeout

    out = []
    run = lambda: out.append(_timed(call_with_timeout, 0.2, swallows_once_then_spins, "", ""))  # noqa: E731
    if where == "main":
        run()
    else:
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(5.0)
    assert out and out[0][0] == (None, True) and out[0][1] < 0.8, out
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_factorial_refusal_spares_real_answers():
    # (a!)! is refused before sympy (a factorial sympy computes in C, which no clock interrupts); a plain
    # factorial or a factorial of a sum still compares.
    assert math_reward._too_costly("(100!)!") and math_reward._too_costly("{(2+3!)}!")
    assert not math_reward._too_costly("(n+1)!") and not math_reward._too_costly("(n+1)!\\,(n-1)!")
    assert math_reward.score(r"\boxed{(n+1)!}", "(n+1)!") == 1.0
    assert math_reward.score(r"\boxed{5!}", "120") == 1.0
