"""Procedural tool calling (C2 multi-domain RL), with an imperfect teacher.

The prompt lists 2-3 tools from a fixed library (name and typed parameters) and a one-line user
request that exactly one of them serves; the response is one tool call in the Hermes/Qwen format:

    prompt:    "Tools: add_item(item: string, count: integer); set_light(room: string, on: boolean).
                Request: Add 3 pens to my list."
    reasoning: "use add_item; item is \\"pens\\", count is 3"
    response:  '<tool_call>{"name": "add_item", "arguments": {"item": "pens", "count": 3}}</tool_call>'
    answer:    '{"name": "add_item", "arguments": {"item": "pens", "count": 3}}'

**Imperfect teacher.** With probability ``teacher_error_rate`` the teacher quotes two-digit integer
arguments as strings (``"count": "13"``, and ``count is "13"`` in its trace) -- a type error the verifier
(``nemocascade.rewards.tool``) scores 0. Only calls with an integer argument of 10 or more (in 4 of the 7
tools) are affected; the others are always right. So greedy imitation fails on part of the problems only:
when the slip quoted every integer, the SFT plateau sat at the share without integers (17%) at rate 0.6 and
near 80% at 0.5, one mode or the other.

Held-out split: by the request's content (tool name and arguments as sorted JSON); the choice and
order of the other listed tools is surface wording.
"""

from __future__ import annotations

import json

import numpy as np

from nemocascade.data.math import ITEMS, NAMES
from nemocascade.data.domains import DomainSpec, check_args, register_domain, split_of

DOMAIN = "tool"
# name -> ((param, type, values), ...), request template (booleans are spelled by the template).
TOOLS = {
    "get_weather": ((("city", "string", ("Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo")),
                     ("days", "integer", tuple(range(1, 15)))),
                    "What is the weather in {city} for {days} days?"),
    "set_alarm": ((("hour", "integer", tuple(range(1, 25))),
                   ("label", "string", ("gym", "work", "school", "lunch", "bus"))),
                  "Set an alarm at {hour} called {label}."),
    "send_message": ((("to", "string", NAMES), ("text", "string", ("hello", "call me", "on my way", "thanks"))),
                     "Send {to} the message: {text}."),
    "play_music": ((("genre", "string", ("jazz", "rock", "pop", "folk")), ("loud", "boolean", (True, False))),
                   "Play some {genre} music {loud}."),
    "add_item": ((("item", "string", ITEMS), ("count", "integer", tuple(range(2, 21)))),
                 "Add {count} {item} to my list."),
    "book_table": ((("name", "string", NAMES), ("people", "integer", tuple(range(2, 13)))),
                   "Book a table for {people} under {name}."),
    "set_light": ((("room", "string", ("kitchen", "bedroom", "hall", "office")), ("on", "boolean", (True, False))),
                  "Turn {on} the light in the {room}."),
}
BOOL_WORDS = {"loud": ("quietly", "loudly"), "on": ("off", "on")}  # (False, True) spellings


def signature(name: str) -> str:
    return f"{name}({', '.join(f'{p}: {t}' for p, t, _ in TOOLS[name][0])})"


def call_text(name: str, arguments: dict) -> str:
    """The response: one ``<tool_call>`` block holding ``{"name": ..., "arguments": {...}}``."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def generate(rng: np.random.Generator, n: int, *, split: str | None = "train",
             teacher_error_rate: float = 0.0, test_every: int = 10) -> list[dict]:
    """``n`` tool-calling records (domains.py record contract), deterministic given ``rng``.

    Args:
        split: keep only requests with ``split_of(key, test_every) == split`` (``None``: all).
        teacher_error_rate: probability that the teacher quotes integer arguments as strings.
    """
    check_args(split, teacher_error_rate)
    names = sorted(TOOLS)
    records, attempts = [], 0
    while len(records) < n:
        attempts += 1
        if attempts > 100 * n * test_every + 1000:
            raise ValueError(f"found only {len(records)} of {n} tool requests for split {split!r}")
        name = names[int(rng.integers(len(names)))]
        params, template = TOOLS[name]
        args = {p: values[int(rng.integers(len(values)))] for p, _, values in params}
        key = f"{name}:{json.dumps(args, sort_keys=True, separators=(',', ':'))}"
        if split is not None and split_of(key, test_every) != split:
            continue
        others = [x for x in names if x != name]
        listed = [name] + [others[i] for i in rng.choice(len(others), int(rng.integers(1, 3)), replace=False)]
        listed = [listed[i] for i in rng.permutation(len(listed))]
        words = {p: BOOL_WORDS[p][v] if isinstance(v, bool) else v for p, v in args.items()}
        slipped = bool(rng.random() < teacher_error_rate)  # always drawn: same problems at every rate
        written = {p: str(v) if slipped and t == "integer" and v >= 10 else v
                   for (p, t, _), v in zip(params, args.values())}
        records.append({
            "domain": DOMAIN,
            "prompt": f"Tools: {'; '.join(map(signature, listed))}. Request: {template.format(**words)}",
            "reasoning": f"use {name}; " + ", ".join(f"{p} is {json.dumps(v)}" for p, v in written.items()),
            "response": call_text(name, written),
            "answer": json.dumps({"name": name, "arguments": args}),
            "id": f"{DOMAIN}/{split or 'all'}/{len(records)}/{key}",
        })
    return records


register_domain(DomainSpec(
    name=DOMAIN, generate=generate, version="2",  # 2: only integers >= 10 are quoted
    description="tool calling: pick the tool and typed arguments (teacher quotes integers)"))
