"""Instruction-following reward: 1.0 iff the final response satisfies every verifiable constraint.

METHOD.md "Rewards per domain": rule-based verifiers of IFEval/IFBench-style constraints (length, case,
keywords, format, JSON, ...) -> {0, 1} for all constraints satisfied.

A constraint is a JSON-able dict ``{"type": family, **kwargs}``; a record's ``answer`` is the JSON list of
its constraints, e.g. ``'[{"type": "word_count", "max": 12}, {"type": "no_commas"}]'``.
:data:`CHECKERS` maps each family to ``checker(response, **kwargs) -> bool``.

Where IFEval (Zhou et al. 2023) or IFBench (Pyatkin et al. 2025) defines the same family we use its rule,
so numbers stay comparable: words are ``\\w+`` runs, sentences come from IFEval's regex splitter (ported
below), keyword inclusion and frequency count case-insensitive *substrings*, forbidden words are
case-insensitive *whole words*. The IFBench types mapped onto these families (``data/ifbench.py``) are
checked for agreement with IFBench's own code in ``tests/test_instruct.py``. Departures, all stricter:
``json_format`` wants an object or array, ``sections`` wants headers ``SECTION 1..N`` exactly,
``postscript`` wants the marker at the start of a line, and :func:`score` gives 0 to an empty response
(IFBench's strict evaluation does the same) so that e.g. "all lowercase" cannot be won by saying nothing.

Bounded (``rewards/limits.py``): a completion over ``MAX_COMPLETION_CHARS`` scores 0, and every checker
is linear in the response. IFEval's line-start patterns ``^\\s*...`` are written ``^[^\\S\\n]*...``: the
same lines match (the match starts on the bullet's own line, not on a blank line before it), without
retrying a whole run of blank lines from each of its line starts (quadratic time).
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Callable

from nemocascade.chat import strip_think
from nemocascade.rewards.limits import bounded_completion

_WORD_RE = re.compile(r"\w+")
_PUNCT = str.maketrans("", "", string.punctuation)


def _int(n, name: str = "n") -> int:
    """``n`` as a non-negative int (IFBench stores counts as floats, ``2.0``); ValueError otherwise."""
    if isinstance(n, bool) or not isinstance(n, (int, float)) or n != int(n) or n < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {n!r}")
    return int(n)


def _word(w, name: str = "keyword") -> str:
    if not isinstance(w, str) or not w.strip():
        raise ValueError(f"{name} must be a non-empty string, got {w!r}")
    return w.strip()


def _words(ws, name: str = "keywords") -> list[str]:
    if not isinstance(ws, (list, tuple)) or not ws:
        raise ValueError(f"{name} must be a non-empty list of strings, got {ws!r}")
    return [_word(w, name) for w in ws]


def _in_range(count: int, min: int | None, max: int | None) -> bool:
    if min is None and max is None:
        raise ValueError("give at least one of min / max")
    return (min is None or count >= _int(min, "min")) and (max is None or count <= _int(max, "max"))


# ------------------------------------------------------------------------------- IFEval's sentence splitter
# Ported verbatim (rules and order) from IFEval's instructions_util.split_into_sentences, which IFBench
# ships unchanged: sentence counts and "keyword in the N-th sentence" then agree with both benchmarks.
_ALPHABETS = "([A-Za-z])"
_PREFIXES = "(Mr|St|Mrs|Ms|Dr)[.]"
_SUFFIXES = "(Inc|Ltd|Jr|Sr|Co)"
_STARTERS = (r"(Mr|Mrs|Ms|Dr|Prof|Capt|Cpt|Lt|He\s|She\s|It\s|They\s|Their\s|Our\s|We\s|But\s|However\s"
             r"|That\s|This\s|Wherever)")
_ACRONYMS = "([A-Z][.][A-Z][.](?:[A-Z][.])?)"
_WEBSITES = "[.](com|net|org|io|gov|edu|me)"
_DIGITS = "([0-9])"
_MULTIPLE_DOTS = r"\.{2,}"


def split_sentences(text: str) -> list[str]:
    """IFEval's rule-based sentence splitter (abbreviations, acronyms, decimals and URLs do not split)."""
    text = " " + text + "  "
    text = text.replace("\n", " ")
    text = re.sub(_PREFIXES, "\\1<prd>", text)
    text = re.sub(_WEBSITES, "<prd>\\1", text)
    text = re.sub(_DIGITS + "[.]" + _DIGITS, "\\1<prd>\\2", text)
    text = re.sub(_MULTIPLE_DOTS, lambda m: "<prd>" * len(m.group(0)) + "<stop>", text)
    text = text.replace("Ph.D.", "Ph<prd>D<prd>")
    text = re.sub(r"\s" + _ALPHABETS + "[.] ", " \\1<prd> ", text)
    text = re.sub(_ACRONYMS + " " + _STARTERS, "\\1<stop> \\2", text)
    text = re.sub(_ALPHABETS + "[.]" + _ALPHABETS + "[.]" + _ALPHABETS + "[.]", "\\1<prd>\\2<prd>\\3<prd>", text)
    text = re.sub(_ALPHABETS + "[.]" + _ALPHABETS + "[.]", "\\1<prd>\\2<prd>", text)
    text = re.sub(" " + _SUFFIXES + "[.] " + _STARTERS, " \\1<stop> \\2", text)
    text = re.sub(" " + _SUFFIXES + "[.]", " \\1<prd>", text)
    text = re.sub(" " + _ALPHABETS + "[.]", " \\1<prd>", text)
    text = text.replace(".\u201d", "\u201d.").replace('."', '".').replace('!"', '"!').replace('?"', '"?')
    text = text.replace(".", ".<stop>").replace("?", "?<stop>").replace("!", "!<stop>")
    text = text.replace("<prd>", ".")
    sentences = [s.strip() for s in text.split("<stop>")]
    if sentences and not sentences[-1]:
        sentences = sentences[:-1]
    return sentences


def count_words(text: str) -> int:
    """Number of ``\\w+`` runs (IFEval/IFBench ``count_words``: nltk's ``RegexpTokenizer(r"\\w+")``)."""
    return len(_WORD_RE.findall(text))


# --------------------------------------------------------------------------------------------- checkers
def word_count(text: str, min: int | None = None, max: int | None = None) -> bool:
    """min <= number of words <= max (either bound may be omitted). IFBench ``count:word_count_range``."""
    return _in_range(count_words(text), min, max)


def sentence_count(text: str, min: int | None = None, max: int | None = None) -> bool:
    """min <= number of sentences (:func:`split_sentences`) <= max."""
    return _in_range(len(split_sentences(text)), min, max)


def lowercase(text: str) -> bool:
    """No uppercase letter (IFEval: ``value == value.lower()``)."""
    return text == text.lower()


def uppercase(text: str) -> bool:
    """No lowercase letter (IFEval: ``value == value.upper()``)."""
    return text == text.upper()


def include_keywords(text: str, keywords: list[str]) -> bool:
    """Every keyword occurs, case-insensitive substring (IFEval ``keywords:existence``)."""
    low = text.lower()
    return all(k.lower() in low for k in _words(keywords))


def exclude_words(text: str, words: list[str]) -> bool:
    """No forbidden word occurs as a whole word, case-insensitive (IFEval ``keywords:forbidden_words``)."""
    return not any(re.search(r"\b" + re.escape(w) + r"\b", text, flags=re.IGNORECASE) for w in _words(words))


_RELATIONS = {"exactly": lambda c, n: c == n, "at least": lambda c, n: c >= n, "at most": lambda c, n: c <= n}


def keyword_frequency(text: str, keyword: str, n: int, relation: str = "exactly") -> bool:
    """Case-insensitive, non-overlapping substring count of ``keyword`` is exactly / at least / at most ``n``.

    Same count as IFEval ``keywords:frequency`` and IFBench ``count:keywords_multiple``.
    """
    if relation not in _RELATIONS:
        raise ValueError(f"relation must be one of {sorted(_RELATIONS)}, got {relation!r}")
    return _RELATIONS[relation](text.lower().count(_word(keyword).lower()), _int(n))


def _unquoted(text: str) -> str:
    return text.strip().strip('"').strip().lower()


def start_with(text: str, phrase: str) -> bool:
    """Starts with ``phrase``, case-insensitive, ignoring surrounding whitespace and double quotes."""
    return _unquoted(text).startswith(_word(phrase, "phrase").lower())


def end_with(text: str, phrase: str) -> bool:
    """Ends with ``phrase``, case-insensitive, ignoring surrounding whitespace and double quotes (IFEval
    ``startend:end_checker``)."""
    return _unquoted(text).endswith(_word(phrase, "phrase").lower())


def bullet_list(text: str, n: int) -> bool:
    """Exactly ``n`` markdown bullet lines, ``* item`` or ``- item`` (IFEval ``number_bullet_lists``)."""
    stars = re.findall(r"^[^\S\n]*\*[^\*].*$", text, flags=re.MULTILINE)
    dashes = re.findall(r"^[^\S\n]*-.*$", text, flags=re.MULTILINE)
    return len(stars) + len(dashes) == _int(n)


def sections(text: str, n: int) -> bool:
    """Section headers are exactly ``SECTION 1`` .. ``SECTION n``, in order, each at the start of a line."""
    found = [int(k) for k in re.findall(r"^[^\S\n]*SECTION\s+(\d+)\b", text, flags=re.MULTILINE)]
    return found == list(range(1, _int(n) + 1))


def json_format(text: str) -> bool:
    """The whole response, minus a markdown code fence (as IFEval strips it), parses as a JSON object or array."""
    text = text.strip()
    for fence in ("```json", "```Json", "```JSON", "```"):
        text = text.removeprefix(fence)
    text = text.removesuffix("```").strip()
    try:
        return isinstance(json.loads(text), (dict, list))
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the interpreter's stack
        return False


def no_commas(text: str) -> bool:
    """No ``,`` anywhere (IFEval ``punctuation:no_comma``)."""
    return "," not in text


def quotation(text: str) -> bool:
    """Wrapped in double quotation marks (IFEval ``startend:quotation``)."""
    text = text.strip()
    return len(text) > 1 and text[0] == '"' and text[-1] == '"'


def placeholders(text: str, n: int) -> bool:
    """At least ``n`` square-bracket placeholders like ``[name]`` (IFEval ``number_placeholders``)."""
    # Counts the same as IFEval's r"\[.*?\]" (a "]" counts iff the bracket before it on its line is "["),
    # without its quadratic time on a run of unclosed "[".
    return len(re.findall(r"\[[^\[\]\n]*\]", text)) >= _int(n)


def title(text: str) -> bool:
    """A non-empty title in double angular brackets, ``<<like this>>`` (IFEval ``detectable_format:title``)."""
    # IFEval's r"<<[^\n]+>>" matches at most once per line, from its first "<<" to its last ">>"; found
    # directly here, because that regex backtracks quadratically on a long run of "<<".
    for line in text.split("\n"):
        start, end = line.find("<<"), line.rfind(">>")
        if start >= 0 and end >= start + 3 and line[start:end + 2].lstrip("<").rstrip(">").strip():
            return True
    return False


def postscript(text: str, marker: str = "P.S.") -> bool:
    """A line starts with the postscript marker, case-insensitive (``P.S.`` also matches ``P. S.``)."""
    patterns = {"P.S.": r"p\.\s?s\.", "P.P.S": r"p\.\s?p\.\s?s"}
    pattern = patterns.get(marker) or re.escape(_word(marker, "marker").lower())
    return re.search(r"^[^\S\n]*" + pattern, text.lower(), flags=re.MULTILINE) is not None


# IFBench (out-of-distribution) families, each the same rule as the IFBench checker named in its docstring.
def unique_words(text: str, n: int) -> bool:
    """At least ``n`` distinct lower-cased, punctuation-stripped whitespace tokens (``count:unique_word_count``)."""
    return len({w.strip(string.punctuation + " ") for w in text.lower().split()}) >= _int(n)


def max_word_repeats(text: str, n: int) -> bool:
    """No word (lower-cased, punctuation removed) occurs more than ``n`` times (``words:repeats``)."""
    counts = Counter(text.lower().translate(_PUNCT).split())
    return all(c <= _int(n) for c in counts.values())


def number_count(text: str, n: int) -> bool:
    """Exactly ``n`` digit runs once punctuation is removed, so ``3.5`` is one number (``count:numbers``)."""
    return len(re.findall(r"\d+", text.translate(_PUNCT))) == _int(n)


def keyword_in_sentence(text: str, keyword: str, n: int) -> bool:
    """The ``n``-th sentence (1-based) contains ``keyword``, case-insensitive substring (``sentence:keyword``)."""
    sentences, n = split_sentences(text), _int(n)
    return 1 <= n <= len(sentences) and _word(keyword).lower() in sentences[n - 1].lower()


def no_whitespace(text: str) -> bool:
    """No whitespace character at all (``format:no_whitespace``)."""
    return not any(c.isspace() for c in text)


def no_consecutive_first_letter(text: str) -> bool:
    """No two consecutive words share their first letter (``words:no_consecutive``)."""
    words = text.lower().translate(_PUNCT).split()
    return all(a[0] != b[0] for a, b in zip(words, words[1:]))


_PRIMES = frozenset((2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97))


def prime_word_lengths(text: str) -> bool:
    """Every word (punctuation removed) has a prime number of characters (``words:prime_lengths``)."""
    return all(len(w) in _PRIMES for w in text.translate(_PUNCT).split())


CHECKERS: dict[str, Callable[..., bool]] = {
    "word_count": word_count,
    "sentence_count": sentence_count,
    "lowercase": lowercase,
    "uppercase": uppercase,
    "include_keywords": include_keywords,
    "exclude_words": exclude_words,
    "keyword_frequency": keyword_frequency,
    "start_with": start_with,
    "end_with": end_with,
    "bullet_list": bullet_list,
    "sections": sections,
    "json_format": json_format,
    "no_commas": no_commas,
    "quotation": quotation,
    "placeholders": placeholders,
    "title": title,
    "postscript": postscript,
    "unique_words": unique_words,
    "max_word_repeats": max_word_repeats,
    "number_count": number_count,
    "keyword_in_sentence": keyword_in_sentence,
    "no_whitespace": no_whitespace,
    "no_consecutive_first_letter": no_consecutive_first_letter,
    "prime_word_lengths": prime_word_lengths,
}


# ------------------------------------------------------------------------------------------------ scoring
def check(response: str, constraint: dict) -> bool:
    """Whether ``response`` satisfies one constraint; ValueError/TypeError for a malformed constraint."""
    if not isinstance(constraint, dict) or "type" not in constraint:
        raise ValueError(f"a constraint is a dict with a 'type' key, got {constraint!r}")
    kwargs = dict(constraint)
    family = kwargs.pop("type")
    if family not in CHECKERS:
        raise ValueError(f"unknown constraint family {family!r}; known: {sorted(CHECKERS)}")
    return bool(CHECKERS[family](response, **kwargs))


def check_all(response: str, constraints: list[dict]) -> list[bool]:
    """Per-constraint verdicts for ``response`` (the final text, think block already removed).

    Raises on a malformed constraint list, so that data bugs surface here rather than as silent zeros.
    """
    if not isinstance(constraints, list) or not constraints:
        raise ValueError(f"constraints must be a non-empty list, got {constraints!r}")
    return [check(response, c) for c in constraints]


@bounded_completion
def score(completion: str, answer: str, in_think: bool = False) -> float:
    """1.0 iff the final response of ``completion`` satisfies every constraint of ``answer``, else 0.0.

    ``answer`` is the JSON list of constraints. The final response is the text after ``</think>``
    (``chat.strip_think``; an unfinished think block gives "" and so 0); an empty response scores 0.
    ``in_think`` as in ``rewards.math.score``. A malformed completion or constraint list scores 0.0; any
    other exception is a bug here, which the verifier pool scores 0.0 and counts (``verifier_errors``).
    """
    response = strip_think(completion, in_think=in_think)
    if not response:
        return 0.0
    try:
        return 1.0 if all(check_all(response, json.loads(answer))) else 0.0
    except (ValueError, TypeError):  # a malformed constraint list (check_all says which), or an int of > 4300 digits
        return 0.0
