"""Multiple-choice reward: 1.0 iff the final chosen letter (A-D) after ``</think>`` equals the key.

The choice is read from the final text (``nemocascade.chat.strip_think``; an unfinished think block -> 0):

1. if it contains a ``\\boxed{...}``, the LAST box decides: its content, stripped, may be ``B``,
   ``(B)``, ``B.`` or ``\\text{B}``; anything else in the box (``B or C``, ``71``) -> 0;
2. otherwise the LAST ``Answer: B`` (case-insensitive ``answer``, optional parentheses) decides;
3. neither -> 0.

Letters are upper case A-D only: ``\\boxed{b}`` is malformed, not a guess that happens to match.
A completion over ``limits.MAX_COMPLETION_CHARS`` scores 0; the rest is linear (``rewards.math.last_boxed``
and one regex without nested repetition).
"""

from __future__ import annotations

import re

from nemocascade.chat import strip_think
from nemocascade.rewards.limits import bounded_completion
from nemocascade.rewards.math import last_boxed

LETTERS = "ABCD"
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")  # as in rewards/math.py: a box opens here
_BOXED_LETTER_RE = re.compile(r"^\s*(?:([A-D])\.?|\(([A-D])\)|\\text\s*\{\s*([A-D])\s*\})\s*$")
_ANSWER_RE = re.compile(r"\b(?i:answer)\s*:\s*\(?([A-D])\)?(?![A-Za-z0-9])")


def extract_choice(final: str) -> str | None:
    """The chosen letter of a final response (module docstring), or None if there is none."""
    if _BOX_RE.search(final):
        box = last_boxed(final)
        m = _BOXED_LETTER_RE.match(box) if box is not None else None  # None box: unbalanced -> 0
        return next((g for g in m.groups() if g), None) if m is not None else None
    found = _ANSWER_RE.findall(final)
    return found[-1] if found else None


@bounded_completion
def score(completion: str, answer: str) -> float:
    """1.0 iff the chosen letter equals ``answer`` (one of A-D); raises only on a bug (the pool counts it)."""
    key = str(answer).strip()
    if len(key) != 1 or key not in LETTERS:
        return 0.0
    return 1.0 if extract_choice(strip_think(completion)) == key else 0.0
