"""Math reward: 1.0 iff the final ``\\boxed{...}`` answer after ``</think>`` equals the reference.

METHOD.md "Rewards per domain": extract the final answer from the text *after* ``</think>`` and compare
it by rule (numeric / symbolic equivalence) -> {0, 1}.

Pipeline of :func:`score` (every step can only *lose* the reward):

0. Size: a completion over ``limits.MAX_COMPLETION_CHARS`` -> 0 before any regex runs, a boxed answer
   over :data:`MAX_ANSWER_CHARS` -> 0 before it is normalised. Every step below is linear in its input
   (braces matched in one pass, no backtracking regex), so hostile output costs milliseconds.
1. Final text (``nemocascade.chat.strip_think``): after the LAST ``</think>``; a ``<think>`` with no
   ``</think>`` is an unfinished reasoning trace -> 0; no think tag at all -> the whole text.
2. Answer: the LAST top-level ``\\boxed{...}`` / ``\\boxed {...}`` / ``\\fbox{...}`` of the final text,
   its braces matched by a counter (an unbalanced last box -> 0). Text outside the box is ignored.
   The reference may be bare (``3/4``) or boxed itself.
3. Fast path (microseconds, decides most cases): a cheap normaliser (``$``, ``\\left``/``\\right``,
   spacing, ``\\dfrac``/``\\tfrac``, ``\\text{}``, units, ``%``, degrees, ``x =`` prefixes, thousands
   separators, unicode minus) then
     - equal canonical strings -> 1;
     - both sides exact rationals (integers, decimals, ``a/b``, ``\\frac{a}{b}``) -> compare with
       ``fractions.Fraction``. Decimals are exact: ``0.33`` is not ``1/3``.
4. Fallback, only when the fast path cannot decide (``\\sqrt{12}`` vs ``2\\sqrt{3}``, ``\\pi/2`` vs
   ``\\frac{\\pi}{2}``, sets, intervals, ...): ``math_verify`` under a time limit. Inputs that are too
   long, too deeply nested or contain power towers / huge exponents are refused before they reach sympy
   (they would hang or blow up memory), so they return in microseconds. What passes runs under one
   wall-clock budget of :data:`_FALLBACK_TIMEOUT_S` for both parses and the comparison
   (``limits.call_with_timeout``: a signal timer in the main thread, as in a
   :class:`~nemocascade.rewards.pool.VerifierPool` worker; an asynchronous exception in other threads);
   running out of it -> 0. math_verify's own ``signal.alarm`` limits stay off: they are whole seconds
   and would cancel an enclosing timer.

Bad input of any kind scores 0.0 without raising; an exception out of :func:`score` is a bug here, which
the pool scores 0.0 and counts (``verifier_errors``).
"""

from __future__ import annotations

import functools
import logging
import re
from fractions import Fraction
from math import comb

from nemocascade.chat import strip_think
from nemocascade.rewards.limits import bounded_completion, call_with_timeout

# Boxed answers in MATH / AIME / Olympiad sets are at most a few hundred characters (a matrix, a long
# expression); past this a "number" is digit spam and a "formula" is nesting spam.
MAX_ANSWER_CHARS = 1_000
_FALLBACK_TIMEOUT_S = 0.5  # both parses + verify; real comparisons take 10-100 ms, hostile ones forever
_MAX_FALLBACK_CHARS = 400  # a longer boxed answer is garbage; sympy on it is slow, never useful
_MAX_BRACE_DEPTH = 12  # ( [ { together: sympy's parser is slow on deep nesting
_MAX_EXPONENT_DIGITS = 4  # 2^{10000} is fine to compare; 2^{100000} starts costing seconds
# Digits summed over the exponents >= 100: (9999^{9999})^{9999} and twenty 9999^{9999} multiplied pass the
# check above power by power, then run sympy to the budget; 2^{100} 3^{100} still compares.
_MAX_BIG_EXPONENT_DIGITS = 6
# Terms in the expansion of a power of a sum with variables: (x+y+z+1)^{60} has C(63, 3) = 39711, which sympy
# expands until the budget runs out (and its clean-up can run past it). No boxed answer expands to this many
# terms; (x+1)^{60} (61 terms) and (a+b+c)^{10} (66) still compare.
_MAX_EXPANSION_TERMS = 1_000


@bounded_completion
def score(completion: str, answer: str, in_think: bool = False) -> float:
    """1.0 if ``completion``'s final boxed answer equals ``answer`` (module docstring), else 0.0.

    ``in_think=True``: the completion was generated after a thinking-mode prompt (its ``<think>`` is in
    the prompt), so a completion with no ``</think>`` is unfinished -> 0 (see ``chat.strip_think``).
    Malformed, over-long or pathological input of any kind scores 0.0; it raises only on a bug.
    """
    return 1.0 if _is_correct(completion, answer, in_think) else 0.0


def _is_correct(completion: str, answer, in_think: bool) -> bool:
    final = strip_think(completion, in_think=in_think)  # "" when the think block never closed
    pred = last_boxed(final)
    answer = str(answer)  # datasets sometimes store the reference as int/float
    gold = last_boxed(answer) if _BOX_RE.search(answer) else answer
    if pred is None or gold is None or len(pred) > MAX_ANSWER_CHARS:
        return False
    p, g = _normalise(pred), _normalise(gold)
    if not p or not g:
        return False
    if p == g:
        return True
    rp, rg = _to_fraction(p), _to_fraction(g)
    if rp is not None and rg is not None:
        return rp == rg
    if _too_costly(pred) or _too_costly(gold):
        return False
    return _math_verify_equal(pred, gold)


# --------------------------------------------------------------------------------------- extraction
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """Content of the last top-level ``\\boxed{..}``/``\\fbox{..}`` in ``text``; None if absent or unbalanced.

    Braces are matched with a counter (a regex cannot match nested braces). A box inside another box
    is part of the outer one's content: ``\\boxed{\\boxed{5}}`` -> ``\\boxed{5}`` (the normaliser peels it).
    """
    found, pos = None, 0
    while (m := _BOX_RE.search(text, pos)) is not None:
        close = _matching_brace(text, m.end() - 1)
        if close is None:
            return None  # the last top-level box never closes: the answer is cut off
        found, pos = text[m.end():close], close + 1
    return found


_BRACE_TOKEN_RE = re.compile(r"\\.|[{}]", re.DOTALL)  # \{ and \} are literal braces (sets), not grouping


def _matching_brace(text: str, open_idx: int) -> int | None:
    """Index of the ``}`` that closes ``text[open_idx] == '{'``, skipping escaped ``\\{``/``\\}``."""
    depth = 0
    for m in _BRACE_TOKEN_RE.finditer(text, open_idx):
        c = m.group()
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return m.start()
    return None


def _brace_pairs(s: str) -> dict[int, int]:
    """``{index of a '{': index of the '}' closing it}`` for every closed group, in one pass over ``s``.

    Same pairs as :func:`_matching_brace` at each ``{``; loops that would call that once per group use
    this instead, so that ``{{{{...}}}}`` costs linear, not quadratic, time.
    """
    pairs, stack = {}, []
    for m in _BRACE_TOKEN_RE.finditer(s):
        c = m.group()
        if c == "{":
            stack.append(m.start())
        elif c == "}" and stack:
            pairs[stack.pop()] = m.start()
    return pairs


# --------------------------------------------------------------------------------------- normaliser
_REPLACE = [  # (old, new), applied in order before any regex
    ("\u2212", "-"), ("\\$", ""), ("$", ""), ("\\(", ""), ("\\)", ""), ("\\[", ""), ("\\]", ""),
    ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\displaystyle", ""), ("{,}", ","),
    ("^{\\circ}", ""), ("^\\circ", ""), ("\\circ", ""), ("\u00b0", ""), ("\\degree", ""),
    ("\\%", ""), ("%", ""), ("\\!", ""), ("\\,", " "), ("\\;", " "), ("\\:", " "), ("\\ ", " "),
    ("\\qquad", " "), ("\\quad", " "), ("~", " "),
]
_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right)(?![a-zA-Z])")
_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textrm|textit|mathrm|mathbf|mbox)\s*\{")
_VAR_EQ_RE = re.compile(r"^\s*(?:[a-zA-Z](?:_\{?\w+\}?)?|\\[a-zA-Z]+)\s*=\s*([^=]+)$")
# Unit words have >= 2 letters: "2 x" is a product, not 2 of unit x (one-letter units go to math_verify).
_UNIT_WORD_RE = re.compile(r"[a-zA-Z]{2,}(?:\^\{?\d\}?)?")
_TOKEN_RE = re.compile(r"\S+")
_ARG_CMD_RE = re.compile(r"\\(frac|sqrt)")


def _normalise(s: str) -> str:
    """Canonical string for the fast path: same value and same spelling -> same string.

    Only *removes* notation (wrappers, units, spacing); it never evaluates anything.
    """
    s = s.strip()
    for old, new in _REPLACE:
        s = s.replace(old, new)
    s = _LEFT_RIGHT_RE.sub("", s)
    s = _unwrap_text(s)
    if (m := _VAR_EQ_RE.match(s)) is not None:
        s = m.group(1)  # "x = 5" -> "5"
    s = s.strip().rstrip(".").strip()
    s = _strip_units(s)
    s = re.sub(r"\s+", "", s)
    s = _brace_args(s)
    pairs, lo, hi = _brace_pairs(s), 0, len(s) - 1
    while lo < hi:  # peel "{5}" and a box nested in the box, "\\boxed{\\fbox{5}}": s[lo:hi + 1] is left
        if s[lo] == "{" and pairs.get(lo) == hi:
            lo, hi = lo + 1, hi - 1
        elif (m := _BOX_RE.match(s, lo)) is not None and pairs.get(m.end() - 1) == hi:
            lo, hi = m.end(), hi - 1
        else:
            break
    return s[lo:hi + 1]


def _strip_units(s: str) -> str:
    """``5 apples`` -> ``5``: drop the trailing run of unit words, only when what remains is a plain number."""
    tokens = list(_TOKEN_RE.finditer(s))
    k = len(tokens)
    while k > 1 and _UNIT_WORD_RE.fullmatch(tokens[k - 1].group()):
        k -= 1
    if k == len(tokens):
        return s
    number = s[:tokens[k - 1].end()]
    return number if _to_fraction(number.replace(" ", "")) is not None else s


def _unwrap_text(s: str) -> str:
    """``\\text{5 cm}`` -> `` 5 cm `` (spaces keep a unit separable from the number before it).

    Left to right; an unclosed ``\\text{`` and everything after it stay as they are.
    """
    pairs, cuts = _brace_pairs(s), []
    for m in _TEXT_CMD_RE.finditer(s):
        close = pairs.get(m.end() - 1)
        if close is None:
            break
        cuts += [(m.start(), m.end()), (close, close + 1)]
    out, pos = [], 0
    for start, end in sorted(cuts):
        out += [s[pos:start], " "]
        pos = end
    out.append(s[pos:])
    return "".join(out)


def _brace_args(s: str) -> str:
    """Brace the one-character arguments of ``\\frac``/``\\sqrt``: ``\\frac34`` -> ``\\frac{3}{4}``."""
    pairs, out, pos = _brace_pairs(s), [], 0
    for m in _ARG_CMD_RE.finditer(s):
        if m.start() < pos:
            continue
        out.append(s[pos:m.end()])
        pos = m.end()
        for _ in range(2 if m.group(1) == "frac" else 1):
            if pos >= len(s):
                break
            if s[pos] == "{":
                close = pairs.get(pos)
                if close is None:
                    break
                out.append(s[pos:close + 1])
                pos = close + 1
            elif s[pos] != "\\":
                out.append("{" + s[pos] + "}")
                pos += 1
    out.append(s[pos:])
    return "".join(out)


# ------------------------------------------------------------------------------------ exact numbers
_NUMBER_RE = re.compile(r"^(?:\d+(?:\.\d*)?|\.\d+)$")
_THOUSANDS_RE = re.compile(r"^\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_FRAC_RE = re.compile(r"^\\frac\{([^{}]*)\}\{([^{}]*)\}$")


def _to_fraction(s: str) -> Fraction | None:
    """Exact value of a whitespace-free integer / decimal / ``a/b`` / ``\\frac{a}{b}``; None otherwise."""
    if len(s) > 200:  # Fraction() of a long decimal is quadratic; int() refuses > 4300 digits
        return None
    while len(s) >= 2 and (s[0], s[-1]) in {("(", ")"), ("{", "}")} and "," not in s:
        s = s[1:-1]
    sign = 1
    while s[:1] in ("-", "+"):
        sign, s = (-sign if s[0] == "-" else sign), s[1:]
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    if _NUMBER_RE.match(s):
        return sign * Fraction(s)
    if (m := _FRAC_RE.match(s)) is not None or s.count("/") == 1:
        num, den = m.groups() if m is not None else s.split("/")
        a, b = _to_fraction(num), _to_fraction(den)
        if a is None or b is None or b == 0:
            return None
        return sign * a / b
    return None


# -------------------------------------------------------------------------------------- fallback
_POWER_RE = re.compile(r"\^\s*(\{)?")
_BIG_FACTORIAL_RE = re.compile(r"\d{4,}\s*!")  # 100000! costs sympy seconds


def _too_costly(s: str) -> bool:
    """True for input sympy would choke on: long, deeply nested, a power tower, huge exponents, a factorial of
    a factorial."""
    if len(s) > _MAX_FALLBACK_CHARS or _BIG_FACTORIAL_RE.search(s):
        return True
    s = s.replace("**", "^")
    # per open group: holds a factorial? (100!)! is a factorial sympy computes in C, where no clock can interrupt it
    groups = [False]
    opens, opener = [], {}  # indices of the open brackets; a closing bracket's index -> its opening one's
    for i, c in enumerate(s):
        if c in "({[":
            groups.append(False)
            opens.append(i)
            if len(groups) > _MAX_BRACE_DEPTH + 1:
                return True
        elif c in ")}]" and len(groups) > 1:
            opener[i] = opens.pop()
            inner = groups.pop()
            if inner and s[i + 1:].lstrip().startswith("!"):
                return True
            groups[-1] |= inner
        elif c == "!":
            groups[-1] = True
    exponent_digits = 0
    for m in _POWER_RE.finditer(s):
        if m.group(1):
            close = _matching_brace(s, m.end() - 1)
            exponent = s[m.end():close] if close is not None else s[m.end():]
        else:
            exponent = re.match(r"-?[\d.]*", s[m.end():]).group(0)
            if s[m.end() + len(exponent):].lstrip().startswith("^"):
                return True  # "10^10^10"
        digits = [len(d) for d in re.findall(r"\d+", exponent)]
        exponent_digits += sum(d for d in digits if d >= 3)
        if "^" in exponent or max(digits, default=0) > _MAX_EXPONENT_DIGITS:
            return True
        if _expansion_terms(s, m.start(), exponent, opener) > _MAX_EXPANSION_TERMS:  # after: the exponent is short
            return True
    return exponent_digits > _MAX_BIG_EXPONENT_DIGITS


def _expansion_terms(s: str, caret: int, exponent: str, opener: dict[int, int]) -> int:
    """Terms in the expansion of the power at ``s[caret]`` when its base is a bracketed sum with a variable
    and its exponent a whole number: C(n + k - 1, k - 1) for k summands to the n (an upper bound where sums
    nest); 1 for anything else. ``opener`` maps each closing bracket of ``s`` to its opening one."""
    end = len(s[:caret].rstrip()) - 1
    start = opener.get(end)
    if start is None or not exponent.strip().isdigit():
        return 1
    base = s[start + 1:end]
    if not re.search(r"[a-zA-Z]", base):
        return 1  # a number: sympy evaluates it without expanding
    # summands at any depth, (x+y)+(z+1) being four; a sign that opens a term or an exponent is not one
    summands, prev = 1, "("
    for c in base:
        summands += c in "+-" and prev not in "+-*/^([{"
        prev = c if not c.isspace() else prev
    return comb(int(exponent) + summands - 1, summands - 1)


@functools.cache
def _math_verify():
    from math_verify import parse, verify  # slow import (sympy): only when the fast path can't decide

    # math_verify logs every timeout at ERROR with the whole input; in RL that is thousands of lines.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    # The first parse builds the LaTeX parser and the first verify warms sympy: on a loaded machine that alone can
    # outrun the budget and score a right answer 0. Done here, once per process, outside the budget.
    verify(parse("\\boxed{2\\sqrt{3}}", parsing_timeout=None), parse("\\boxed{\\sqrt{12}}", parsing_timeout=None),
           timeout_seconds=None)
    return parse, verify


def _mv_compare(pred: str, gold: str) -> bool:
    parse, verify = _math_verify()
    g = parse("\\boxed{" + gold + "}", parsing_timeout=None)  # our budget bounds it (module docstring)
    p = parse("\\boxed{" + pred + "}", parsing_timeout=None)
    return bool(g and p and verify(g, p, timeout_seconds=None))


def _math_verify_equal(pred: str, gold: str) -> bool:
    _math_verify()  # the first call imports sympy and warms its parser: not part of the budget
    equal, timed_out = call_with_timeout(_FALLBACK_TIMEOUT_S, _mv_compare, pred, gold)
    return bool(equal) and not timed_out
