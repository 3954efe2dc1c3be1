"""Proxy judge for the "pref" (RLHF) domain: a transparent, rule-based score of a chat answer in [0, 1].

RLHF *trains* on a learned Bradley-Terry reward model (``nemocascade.models.reward_model``,
``nemocascade.rewards.rm_scorer``), which can be gamed. Held-out *evaluation* therefore uses this proxy, whose
rules are the ones the "pref" data encodes (``nemocascade.data.preference``): held-out "pref" pass@1 is
the mean proxy score of greedy answers. Four checks on the final text (after ``</think>``, via
``nemocascade.chat.strip_think``):

    helpful     not an "I don't know"-style refusal (``UNHELPFUL_MARKERS``)
    on_topic    one of the request's topic keywords occurs (case-insensitive substring); every one of them for a
                two-part request (``require_all`` in the answer)
    no_repeat   no sentence occurs twice and no word 4-gram occurs twice (catches loops like "a b a b a b")
    length_ok   min_words <= word count <= max_words (the request asks for one or two short sentences)

    score = 0                                         if the text is empty or not helpful
          = (on_topic + no_repeat + length_ok) / 3    otherwise

so the chosen answer of every pair scores 1 and every rejected one (verbose, repetitive, off-topic,
unhelpful) scores at most 2/3. An unfinished think block has no final text and scores 0.

``answer`` is the record's JSON: ``{"chosen", "rejected", "kind", "topic", "keywords", "min_words",
"max_words"}`` (only the last three are read here). A malformed answer scores 0, and so does a completion
over ``limits.MAX_COMPLETION_CHARS`` (every check is linear in the text); any other exception is a bug,
counted by the verifier pool.
"""

from __future__ import annotations

import json
import re

from nemocascade.chat import strip_think
from nemocascade.rewards.limits import bounded_completion
from nemocascade.rewards.structured import MALFORMED

UNHELPFUL_MARKERS = ("don't know", "do not know", "not sure", "cannot help", "can't help")
_WORD_RE = re.compile(r"[a-z0-9']+")
_SENTENCE_RE = re.compile(r"[^.!?]+[.!?]?")
NGRAM = 4
CHECKS = ("helpful", "on_topic", "no_repeat", "length_ok")


def words(text: str) -> list[str]:
    """Lower-case words (letters, digits, apostrophes); punctuation is not a word."""
    return _WORD_RE.findall(text.lower())


def sentences(text: str) -> list[str]:
    """Sentences split at . ! ?, normalised to their words joined by single spaces (empty ones dropped)."""
    out = (" ".join(words(s)) for s in _SENTENCE_RE.findall(text))
    return [s for s in out if s]


def is_helpful(text: str) -> bool:
    low = text.lower().replace("\u2019", "'")
    return bool(words(text)) and not any(m in low for m in UNHELPFUL_MARKERS)


def on_topic(text: str, keywords, require_all: bool = False) -> bool:
    """One of `keywords` occurs in `text` (case-insensitive substring); every one of them with `require_all`."""
    low = text.lower()
    return (all if require_all else any)(k.lower() in low for k in keywords)


def no_repeat(text: str) -> bool:
    sents = sentences(text)
    if len(set(sents)) != len(sents):
        return False
    w = words(text)
    grams = [tuple(w[i:i + NGRAM]) for i in range(len(w) - NGRAM + 1)]
    return len(set(grams)) == len(grams)


def length_ok(text: str, min_words: int, max_words: int) -> bool:
    return min_words <= len(words(text)) <= max_words


def checks(final: str, spec: dict) -> dict[str, bool]:
    """Each of the four checks on a final text (no think block) given the parsed ``answer`` JSON."""
    return {"helpful": is_helpful(final),
            "on_topic": on_topic(final, spec["keywords"], bool(spec.get("require_all"))),
            "no_repeat": no_repeat(final),
            "length_ok": length_ok(final, int(spec["min_words"]), int(spec["max_words"]))}


def judge(final: str, spec: dict) -> float:
    """The proxy score of a final text (no think block) given the parsed ``answer`` JSON."""
    c = checks(final, spec)
    if not c["helpful"]:
        return 0.0
    return (c["on_topic"] + c["no_repeat"] + c["length_ok"]) / 3


@bounded_completion
def score(completion: str, answer: str) -> float:
    """Proxy score of a whole assistant turn (module docstring); raises only on a bug."""
    try:
        return judge(strip_think(completion), json.loads(answer))
    except MALFORMED:  # a malformed answer: no reward
        return 0.0
