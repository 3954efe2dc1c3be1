"""Tool-calling reward: 1.0 iff the final text makes exactly the expected call, else 0.0.

Rules, all required (the final text comes from ``nemocascade.chat.strip_think``; an unfinished think
block -> 0):

1. exactly one ``<tool_call>`` and one ``</tool_call>``, in that order (text around the block is allowed);
2. the block's content parses strictly as JSON (``rewards.structured.loads_strict``: no duplicate keys)
   into an object with exactly the keys ``name`` and ``arguments``;
3. ``name`` is the expected function name;
4. ``arguments`` is an object with exactly the expected keys, each value equal to the expected one with
   the same JSON type at every level (``"3"`` is not ``3``, ``1`` is not ``true``).

``answer`` is the JSON string ``{"name": ..., "arguments": {...}}`` written by ``data/tool.py``.
Malformed JSON on either side scores 0.0 (as in ``rewards/structured.py``), and so does a completion over
``limits.MAX_COMPLETION_CHARS``; any other exception is a bug, counted by the verifier pool.
"""

from __future__ import annotations

import json

from nemocascade.chat import strip_think
from nemocascade.rewards.limits import bounded_completion
from nemocascade.rewards.structured import MALFORMED, loads_strict, same_value

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def parse_call(final: str) -> dict | None:
    """The one tool call in ``final`` as ``{"name", "arguments"}``, or None if malformed (rules 1-2)."""
    if final.count(OPEN) != 1 or final.count(CLOSE) != 1:
        return None
    start, end = final.index(OPEN) + len(OPEN), final.index(CLOSE)
    if end < start:
        return None
    call = loads_strict(final[start:end])
    if not isinstance(call, dict) or set(call) != {"name", "arguments"} or not isinstance(call["arguments"], dict):
        return None
    return call


@bounded_completion
def score(completion: str, answer: str) -> float:
    """1.0 iff the completion's single tool call equals the expected one (module docstring)."""
    try:
        expected = json.loads(answer)
        call = parse_call(strip_think(completion))
        if call is None:
            return 0.0
        return 1.0 if same_value(call["name"], expected["name"]) and same_value(
            call["arguments"], expected["arguments"]) else 0.0
    except MALFORMED:  # malformed JSON in the call or the answer: no reward
        return 0.0
