"""Procedural structured output (domain ``json``, C2 multi-domain RL), with an imperfect teacher.

The prompt gives a small schema (3 keys from a fixed pool: string, integer, boolean, an enum of three
words, or a string list) and the facts to fill in, plus one fact the schema does *not* ask for;
the response is the JSON object. Facts use one regular spelling per type (booleans "yes"/"no"):

    prompt:    "Write JSON. Schema: age integer, pet cat|dog|fish, member boolean.
                Facts: member no; color red; age 34; pet dog."
    reasoning: "age 34, pet \\"dog\\", member false; drop color"
    response:  '{"age": 34, "pet": "dog", "member": false}'
    answer:    '{"schema": {"type": "object", ...}, "values": {"age": 34, "pet": "dog", "member": false}}'

The schema in ``answer`` is the JSON Schema subset that ``nemocascade.rewards.structured`` validates
(``additionalProperties: false``, every key required).

**Imperfect teacher.** With probability ``teacher_error_rate`` the teacher copies *every* fact,
including the one the schema lacks ("...; keep color \\"red\\"") -- an extra key, so the object fails
``additionalProperties: false`` and scores 0. Every problem has such a fact, so the slip always bites.

Held-out split: by the canonical problem (schema and values, the extra fact included, as sorted
JSON); the order of keys in the schema and of the facts is surface wording.
"""

from __future__ import annotations

import json

import numpy as np

from nemocascade.data.math import NAMES
from nemocascade.data.domains import Domain, check_args, register, split_of
from nemocascade.rewards import structured as structured_reward

DOMAIN = "json"
# key -> (kind, the values a fact may take); kind is a JSON Schema type, "enum" or "list".
FIELDS = {
    "name": ("string", NAMES),
    "city": ("string", ("Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo")),
    "age": ("integer", tuple(range(1, 100))),
    "score": ("integer", tuple(range(0, 101))),
    "pet": ("enum", ("cat", "dog", "fish", "bird", "frog")),
    "color": ("enum", ("red", "blue", "green", "black", "white")),
    "member": ("boolean", (True, False)),
    "active": ("boolean", (True, False)),
    "tags": ("list", ("new", "vip", "old", "late")),
}
NUM_KEYS = 3


def _draw_value(rng, key: str):
    kind, values = FIELDS[key]
    if kind == "list":
        k = int(rng.integers(1, 3))
        return [values[i] for i in sorted(rng.choice(len(values), k, replace=False))]
    return values[int(rng.integers(len(values)))]


def _property(rng, key: str, value) -> dict:
    """The JSON Schema of ``key``; an enum lists 3 of its words, ``value`` among them, sorted."""
    kind, values = FIELDS[key]
    if kind == "enum":
        others = [v for v in values if v != value]
        picked = [value] + [others[i] for i in rng.choice(len(others), 2, replace=False)]
        return {"type": "string", "enum": sorted(picked)}
    if kind == "list":
        return {"type": "array", "items": {"type": "string"}}
    return {"type": kind}


def _schema_word(prop: dict) -> str:
    if "enum" in prop:
        return "|".join(prop["enum"])
    return "string list" if prop["type"] == "array" else prop["type"]


def _fact(key: str, value) -> str:
    if isinstance(value, bool):
        return f"{key} {'yes' if value else 'no'}"
    return f"{key} {', '.join(value) if isinstance(value, list) else value}"


def generate(rng: np.random.Generator, n: int, *, split: str | None = "train",
             teacher_error_rate: float = 0.0, test_every: int = 10) -> list[dict]:
    """``n`` structured-output records (domains.py record contract), deterministic given ``rng``.

    Args:
        split: keep only problems with ``split_of(key, test_every) == split`` (``None``: all).
        teacher_error_rate: probability that the teacher also copies the fact the schema lacks.
    """
    check_args(split, teacher_error_rate)
    pool = sorted(FIELDS)
    records, attempts = [], 0
    while len(records) < n:
        attempts += 1
        if attempts > 100 * n * test_every + 1000:
            raise ValueError(f"found only {len(records)} of {n} json problems for split {split!r}")
        keys = [pool[i] for i in rng.choice(len(pool), NUM_KEYS + 1, replace=False)]
        keys, extra = keys[:NUM_KEYS], keys[NUM_KEYS]  # keys in the order the schema shows them
        values = {k: _draw_value(rng, k) for k in keys + [extra]}
        props = {k: _property(rng, k, values[k]) for k in keys}
        schema = {"type": "object", "properties": props, "required": keys, "additionalProperties": False}
        key = json.dumps({"props": props, "values": values}, sort_keys=True, separators=(",", ":"))
        if split is not None and split_of(key, test_every) != split:
            continue
        facts = [_fact(k, values[k]) for k in (keys + [extra])]
        facts = [facts[i] for i in rng.permutation(len(facts))]
        slipped = bool(rng.random() < teacher_error_rate)  # always drawn: same problems at every rate
        written = keys + [extra] if slipped else keys
        obj = {k: values[k] for k in written}
        typed = ", ".join(f"{k} {json.dumps(values[k])}" for k in keys)
        records.append({
            "domain": DOMAIN,
            "prompt": (f"Write JSON. Schema: {', '.join(f'{k} {_schema_word(props[k])}' for k in keys)}. "
                       f"Facts: {'; '.join(facts)}."),
            "reasoning": f"{typed}; {'keep' if slipped else 'drop'} {extra}" + (
                f" {json.dumps(values[extra])}" if slipped else ""),
            "response": json.dumps(obj),
            "answer": json.dumps({"schema": schema, "values": {k: values[k] for k in keys}}),
            "id": f"{DOMAIN}/{split or 'all'}/{len(records)}/{key}",
        })
    return records


register(Domain(
    name=DOMAIN, generate=generate, verifier=structured_reward.score, version="1",
    description="structured output: fill a small JSON schema from facts (teacher copies an extra fact)"))
