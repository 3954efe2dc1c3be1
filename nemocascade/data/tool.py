"""Procedural tool calling (C2 multi-domain RL), with an imperfect teacher.

The prompt lists 2-3 tools from a fixed library (name and typed parameters) and a one-line user
request that exactly one of them serves; the response is one tool call in the Hermes/Qwen format:

    prompt:    "Tools: add_item(item: string, count: integer); set_alarm(hour: integer, label: string).
                Request: Add 3 pens to my list."
    reasoning: "use add_item; item is \\"pens\\", count is 3"
    response:  '<tool_call>{"name": "add_item", "arguments": {"item": "pens", "count": 3}}</tool_call>'
    answer:    '{"name": "add_item", "arguments": {"item": "pens", "count": 3}}'

**Imperfect teacher.** With probability ``teacher_error_rate`` the teacher quotes two-digit integer
arguments as strings (``"count": "13"``, and ``count is "13"`` in its trace) -- a type error the verifier
(``nemocascade.rewards.tool``) scores 0. Only calls with an integer argument of 10 or more (in 4 of the 7
tools, about a third of all requests) are affected; the others are always right. So greedy imitation fails on
part of the problems only; a slip on every integer would put nearly every request in the slip's mode or
none, depending on the rate.

Held-out split: by the request's content (tool name and arguments as sorted JSON); the choice and
order of the other listed tools is surface wording.
"""

from __future__ import annotations

import json

import numpy as np

from nemocascade.data.math import ITEMS, NAMES
from nemocascade.data.domains import Domain, check_args, register, split_of
from nemocascade.rewards import tool as tool_reward

DOMAIN = "tool"
# Value lists large enough that every tool has about 700-1500 distinct requests, so the test split (~10%) holds
# over 500 distinct requests rather than a few worded over and over with other tool lists.
CITIES = ("Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo", "Berlin", "Madrid", "Dublin", "Vienna", "Prague",
          "Athens", "Lisbon", "Warsaw", "Seoul", "Delhi", "Dubai", "Sydney", "Boston", "Denver", "Austin", "Miami",
          "Chicago", "Toronto", "Quito", "Bogota", "Nairobi", "Lagos", "Accra", "Manila", "Hanoi", "Bangkok",
          "Jakarta", "Moscow", "Kyiv", "Riga", "Minsk", "Sofia", "Zagreb", "Bern", "Milan", "Naples", "Porto",
          "Seville", "Munich", "Hamburg", "Geneva", "Zurich", "Lyon", "Nice")
LABELS = ("gym", "work", "school", "lunch", "bus", "train", "meds", "yoga", "dinner", "class", "meeting", "walk",
          "nap", "study", "call", "shop", "swim", "run", "piano", "tennis", "golf", "chess", "bake", "cook", "read",
          "write", "paint", "dance", "sing", "drive", "fly", "ship", "mail", "bank", "vet", "dentist", "doctor",
          "coffee", "tea", "water", "pills", "stretch")
PEOPLE = NAMES + ("Ben", "Amy", "Dan", "Ivy", "Joe", "Kim", "Ian", "Liz", "Ray", "Sue", "Ted", "Uma", "Vic", "Wes",
                  "Yan", "Ada", "Bob", "Cal", "Dee", "Eli", "Fay", "Gus", "Hal", "Ida", "Jay", "Kai", "Lou", "Ned")
TEXTS = ("hello", "call me", "on my way", "thanks", "see you soon", "running late", "good night", "good morning",
         "happy birthday", "I am home", "call you later", "miss you", "well done", "sounds good", "no problem",
         "take care", "be right back", "love you", "see you at noon", "lunch is ready", "where are you",
         "I am outside", "all done", "start without me", "on the train", "just landed", "almost there", "good luck")
GOODS = ITEMS + ("eggs", "lemons", "onions", "carrots", "bananas", "pears", "plums", "peaches", "cups", "plates",
                 "forks", "spoons", "knives", "bowls", "candles", "socks", "shirts", "hats", "gloves", "towels",
                 "batteries", "bulbs", "pencils", "erasers", "folders", "notebooks", "stickers", "buttons", "beads",
                 "ribbons", "tissues", "napkins", "bottles", "jars", "boxes", "bags", "tomatoes", "potatoes",
                 "cookies", "muffins", "bagels", "oranges", "grapes", "melons", "limes", "nails")
GENRES = ("jazz", "rock", "pop", "folk", "blues", "soul", "funk", "metal", "disco", "opera", "reggae", "techno",
          "country", "classical")
ROOMS = ("kitchen", "bedroom", "hall", "office", "garage", "garden", "attic", "basement", "bathroom", "studio",
         "porch", "lounge", "library", "nursery", "den", "patio", "cellar", "gym", "balcony", "pantry", "closet",
         "hallway", "laundry", "loft", "lobby", "workshop", "playroom", "sunroom", "terrace", "foyer", "shed", "barn",
         "cabin", "dining room", "guest room", "living room")
COLORS = ("red", "blue", "green", "white", "yellow", "orange", "pink", "purple", "warm", "cool", "gold", "teal",
          "amber", "violet")
# name -> ((param, type, values), ...), request template (booleans are spelled by the template). Integers of 10
# or more (the teacher's slip) in 4 tools: days 12/21, hour 15/24, count 11/19, people 11/19 of the values.
TOOLS = {
    "get_weather": ((("city", "string", CITIES), ("days", "integer", tuple(range(1, 22)))),
                    "What is the weather in {city} for {days} days?"),
    "set_alarm": ((("hour", "integer", tuple(range(1, 25))), ("label", "string", LABELS)),
                  "Set an alarm at {hour} called {label}."),
    "send_message": ((("to", "string", PEOPLE), ("text", "string", TEXTS)), "Send {to} the message: {text}."),
    "play_music": ((("genre", "string", GENRES), ("room", "string", ROOMS), ("loud", "boolean", (True, False))),
                   "Play some {genre} music in the {room} {loud}."),
    "add_item": ((("item", "string", GOODS), ("count", "integer", tuple(range(2, 21)))),
                 "Add {count} {item} to my list."),
    "book_table": ((("name", "string", PEOPLE), ("people", "integer", tuple(range(2, 21)))),
                   "Book a table for {people} under {name}."),
    "set_light": ((("room", "string", ROOMS), ("color", "string", COLORS), ("on", "boolean", (True, False))),
                  "Turn {on} the {color} light in the {room}."),
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


register(Domain(
    # 2: only integers >= 10 are quoted; 3: ~7000 requests
    name=DOMAIN, generate=generate, verifier=tool_reward.score, env="tool_exec", version="3",
    description="tool calling: pick the tool and typed arguments (teacher quotes integers)"))
