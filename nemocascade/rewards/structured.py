"""Structured-output reward (domain ``json``) and the small JSON Schema validator it uses.

C2's multi-domain RL includes structured output: the response must be a JSON object that satisfies a
given schema. :func:`score` is 1.0 iff

1. the final text (``nemocascade.chat.strip_think``; an unfinished think block -> 0) is a JSON object,
   either bare or as the only content of one ```` ```json ```` (or plain ```` ``` ````) fence;
2. it parses strictly (:func:`loads_strict`: no duplicate keys, no NaN/Infinity);
3. it satisfies ``answer["schema"]`` exactly (:func:`schema_errors`);
4. every key in ``answer["values"]`` has exactly that value (:func:`same_value`: ``1`` is not ``true``).

``answer`` is the JSON string ``{"schema": {...}, "values": {...}}`` written by ``data/structured.py``.
Malformed JSON on either side scores 0.0 (a completion over ``limits.MAX_COMPLETION_CHARS`` too, before
parsing; ``json.loads`` is linear, refuses ints over 4300 digits and nesting deeper than the stack); any
other exception is a bug here, which the verifier pool scores 0.0 and counts (``verifier_errors``).

The validator implements a strict subset of JSON Schema, enough for tool arguments and records:
``type`` (object, string, integer, boolean, array), ``properties``, ``required``,
``additionalProperties`` (``false``, or ``true``/absent = allowed), ``enum`` and ``items`` (one schema
for every element). It is stricter than the standard in two documented ways: ``integer`` means a JSON
number written without a fraction or exponent (``34.0`` is not an integer; ``true`` never is), and an
unsupported keyword is an error (fail closed), never silently ignored. No dependency: ``jsonschema``
would accept ``34.0`` and ignore unknown keywords.
"""

from __future__ import annotations

import json
import re

from nemocascade.chat import strip_think
from nemocascade.rewards.limits import bounded_completion

SUPPORTED_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "enum", "items"})
_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}
_FENCE_RE = re.compile(r"^```(?:json)?[ \t]*\n(.*?)\n?```$", re.DOTALL)
# What malformed JSON raises: a parse error or an over-long int (ValueError), nesting deeper than the stack
# (RecursionError), a well-formed answer of the wrong shape (TypeError, KeyError, AttributeError).
MALFORMED = (ValueError, RecursionError, TypeError, KeyError, AttributeError)


def schema_errors(value, schema: dict, path: str = "$") -> list[str]:
    """Every way ``value`` violates ``schema`` (the subset in the module docstring), as ``"path: why"``.

    An empty list means valid. Never raises on a bad *value*; a bad *schema* (unknown keyword or type)
    is reported as an error too, so an unverifiable answer can never score.
    """
    if not isinstance(schema, dict):
        return [f"{path}: schema must be an object, got {type(schema).__name__}"]
    unknown = sorted(set(schema) - SUPPORTED_KEYWORDS)
    if unknown:
        return [f"{path}: unsupported schema keywords {unknown}"]
    if "type" in schema:
        check = _TYPES.get(schema["type"])
        if check is None:
            return [f"{path}: unsupported type {schema['type']!r}"]
        if not check(value):
            return [f"{path}: expected {schema['type']}, got {_json_type(value)}"]
    errors = []
    if "enum" in schema and not any(same_value(value, option) for option in schema["enum"]):
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing required key {key!r}")
        additional = schema.get("additionalProperties", True)
        if not isinstance(additional, bool):
            errors.append(f"{path}: additionalProperties must be true or false")
        elif not additional:
            errors += [f"{path}: unexpected key {k!r}" for k in value if k not in properties]
        for key, sub in properties.items():
            if key in value:
                errors += schema_errors(value[key], sub, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{path}[{i}]")
    return errors


def _json_type(value) -> str:
    for name, check in _TYPES.items():
        if check(value):
            return name
    return "null" if value is None else type(value).__name__


def same_value(a, b) -> bool:
    """Equal as JSON values: same type at every level (``True != 1``, ``1 != 1.0``), same content."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate keys in {keys}")
    return dict(pairs)


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def loads_strict(text: str):
    """``json.loads`` that rejects duplicate object keys and NaN/Infinity (ValueError)."""
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)


def final_json(completion: str):
    """The JSON value of a completion's final text (bare or in one fence); ValueError if none."""
    final = strip_think(completion)
    m = _FENCE_RE.match(final)
    return loads_strict(m.group(1) if m is not None else final)


@bounded_completion
def score(completion: str, answer: str) -> float:
    """1.0 iff the final JSON object satisfies the schema and the expected values (module docstring)."""
    try:
        spec = json.loads(answer)
        value = final_json(completion)
        if not isinstance(value, dict) or schema_errors(value, spec["schema"]):
            return 0.0
        expected = spec.get("values", {})
        return 1.0 if all(k in value and same_value(value[k], v) for k, v in expected.items()) else 0.0
    except MALFORMED:
        return 0.0
