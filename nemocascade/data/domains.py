"""Domain registry: every example carries its domain, and the domain picks its generator.

A *domain* (``math``, ``if``, ``code``, ...) is registered once as a :class:`Domain` (generator, verifier,
environment) in :data:`DOMAINS`. Everything downstream (data building, rewards, teachers, metrics) looks
the domain up by the ``"domain"`` field of the example -- a dict lookup, never an if/elif chain
on strings (STYLE.md).

Record contract (every example of every domain) -- a flat dict of ``str``::

    {"domain":    "math",                        # registry key
     "prompt":    "What is 23+48?",              # user turn text
     "reasoning": "3+8=11, write 1 carry 1; ...", # teacher's worked steps (the think block)
     "response":  "The answer is \\boxed{71}.",  # final text after </think>
     "answer":    "71",                          # ground truth for the verifier
     "id":        "math/train/0/add/+:23:48"}    # stable, unique within a build

Structured ground truth (e.g. unit tests for ``code``) goes into ``answer`` as a JSON string, so
that every domain shares one on-disk schema (see ``tfds_builder.py``).

Splits: every domain's ``generate`` takes ``split="train" | "val" | "test" | None`` and keeps
only problems whose *canonical problem key* lands in that split under :func:`split_of`. The
split is decided by a hash of the problem itself, not the record id, so the same problem can
never appear in two splits, whatever its surface wording. ``val`` is what a run chooses on
(``best:`` teachers, quick evals); ``test`` is what it reports.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable

import numpy as np

from nemocascade.rewards import REWARDS

RECORD_KEYS = ("domain", "prompt", "reasoning", "response", "answer", "id")
SPLITS = ("train", "val", "test")
# Stable per-split stream index for `split_rng`; never reorder (it would change every dataset).
_SPLIT_STREAM = {"train": 0, "test": 1, "val": 2}


@dataclasses.dataclass(frozen=True)
class Domain:
    """One domain, registered once: its data, its verifier and (for multi-turn rollouts) its environment.

    Attributes:
        name: registry key; equals the ``"domain"`` field of every record it generates.
        generate: ``generate(rng: np.random.Generator, n: int, *, split="train", **opts)
            -> list[dict]`` returning ``n`` records (see module docstring), deterministic given
            ``rng`` and ``opts``; ``split`` is ``"train"``, ``"val"``, ``"test"`` or ``None`` (no filtering).
        verifier: ``verifier(completion: str, answer: str) -> float``, a module-level function (verifier pool
            workers unpickle it) that scores bad input 0.0 without raising (``rewards/``).
        env: the environment (``envs.ENVS``) that answers a multi-turn episode's turns; None: one-turn only.
        version: bump whenever ``generate`` changes its output for the same inputs, so that
            cached builds (``tfds_builder.prepare``) are not silently reused.
        description: one line for humans.
    """

    name: str
    generate: Callable[..., list[dict[str, str]]]
    verifier: Callable[[str, str], float]
    env: str | None = None
    version: str = "1"
    description: str = ""


DOMAINS: dict[str, Domain] = {}


def register(domain: Domain, *, overwrite: bool = False) -> Domain:
    """Adds ``domain`` to :data:`DOMAINS` under its name and returns it; ``ValueError`` if the name is taken
    and not ``overwrite`` (e.g. a notebook re-running a cell)."""
    if not isinstance(domain, Domain):
        raise TypeError(f"domains.register expects a Domain, got {type(domain).__name__}")
    if domain.name in DOMAINS and not overwrite:
        raise ValueError(f"domain {domain.name!r} is already registered; pass overwrite=True")
    DOMAINS[domain.name] = domain
    return domain


def get_domain(name: str) -> Domain:
    """Returns the registered domain; ``KeyError`` listing the known domains otherwise."""
    try:
        return DOMAINS[name]
    except KeyError:
        raise KeyError(f"unknown domain {name!r}; known domains: {sorted(DOMAINS)}") from None


def verifier(key: str) -> Callable[[str, str], float]:
    """The reward function `key` names: a domain's own verifier, or one of ``rewards.REWARDS`` (verifiers a stage
    may train with instead, ``stages.<name>.rewards``); KeyError naming both otherwise."""
    if key in DOMAINS:
        return DOMAINS[key].verifier
    try:
        return REWARDS[key]
    except KeyError:
        raise KeyError(f"no reward {key!r}: neither a domain ({sorted(DOMAINS)}) nor one of rewards.REWARDS "
                       f"({sorted(REWARDS)})") from None


def split_of(key: str, test_every: int = 10) -> str:
    """Split of a canonical problem key, from ``h = blake2b(key) % test_every``: ``"test"`` iff h = 0,
    ``"val"`` iff h = 1, else ``"train"``.

    A cryptographic hash (not Python's salted ``hash``) so the assignment is the same in every
    process and on every machine. About ``1/test_every`` of all problems go to test, as many to val.
    """
    if test_every < 3:
        raise ValueError(f"test_every must be >= 3, got {test_every}")
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return ("test", "val")[h] if (h := int.from_bytes(digest, "big") % test_every) < 2 else "train"


def problem_key(record: dict) -> str:
    """The record's canonical problem key, the part of its ``id`` after ``domain/split/index/`` (what
    :func:`split_of` hashed); the prompt for an id without one (a real dataset's ``name/task_id``).

    Two records with one key are one problem in two surface wordings: evaluation counts them once, since a
    repeat is not an independent item and counting it would shrink every interval."""
    parts = record["id"].split("/", 3)
    return parts[3] if len(parts) == 4 else record["prompt"]


def first_distinct(source, n: int | None = None) -> list[dict]:
    """The first `n` records of `source` (a sequence, read lazily) with distinct problem keys (``problem_key``); all
    of them when `n` is None or the source holds fewer: the items evaluation scores."""
    seen, out = set(), []
    for i in range(len(source)):
        if n is not None and len(out) == n:
            break
        r = source[i]
        if (key := problem_key(r)) not in seen:
            seen.add(key)
            out.append(r)
    return out


def check_args(split, teacher_error_rate: float = 0.0) -> None:
    """The arguments every generator shares: ValueError naming the bad one."""
    if split not in (*SPLITS, None):
        raise ValueError(f"split must be 'train', 'val', 'test' or None, got {split!r}")
    if not 0.0 <= teacher_error_rate <= 1.0:
        raise ValueError(f"teacher_error_rate must be in [0, 1], got {teacher_error_rate}")


def family_weights(families: dict[str, float], known, domain: str) -> tuple[list[str], np.ndarray]:
    """(sorted family names, their weights) of a generator's `families` option; ValueError naming unknown
    families or bad weights. Sorted, so the order of the dict does not change the data."""
    unknown = sorted(set(families) - set(known))
    if unknown:
        raise ValueError(f"unknown {domain} families {unknown}; known: {sorted(known)}")
    names = sorted(families)
    weights = np.array([families[f] for f in names], dtype=np.float64)
    if (weights < 0).any() or weights.sum() <= 0:
        raise ValueError(f"families weights must be >= 0 with a positive sum, got {families}")
    return names, weights


def split_rng(seed: int, split: str) -> np.random.Generator:
    """Independent, reproducible random stream for (seed, split)."""
    if split not in _SPLIT_STREAM:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return np.random.default_rng(np.random.SeedSequence([seed, _SPLIT_STREAM[split]]))


def validate_record(record: Any, index: int = 0) -> dict[str, str]:
    """Checks the record contract; ``ValueError`` names the row and the bad key."""
    if not isinstance(record, dict):
        raise ValueError(f"row {index}: record must be a dict, got {type(record).__name__}")
    keys = set(record)
    if keys != set(RECORD_KEYS):
        raise ValueError(
                f"row {index}: record keys must be {list(RECORD_KEYS)}; missing "
                f"{sorted(set(RECORD_KEYS) - keys)}, unexpected {sorted(keys - set(RECORD_KEYS))}")
    for key in RECORD_KEYS:
        if not isinstance(record[key], str):
            raise ValueError(
                    f"row {index}: field {key!r} must be str, got {type(record[key]).__name__}")
    return record


def generate_split(domain: str, split: str, n: int, seed: int, **opts) -> list[dict[str, str]]:
    """``n`` validated records of ``domain`` for ``split``, from the stream ``split_rng(seed, split)``.

    This is exactly what ``tfds_builder.prepare`` writes to disk, so in-memory and on-disk
    datasets agree record for record.
    """
    spec = get_domain(domain)
    records = spec.generate(split_rng(seed, split), n, split=split, **opts)
    if len(records) != n:
        raise ValueError(f"domain {domain!r} generated {len(records)} records, expected {n}")
    ids = set()
    for i, record in enumerate(records):
        validate_record(record, i)
        if record["domain"] != domain:
            raise ValueError(f"row {i}: field 'domain' is {record['domain']!r}, expected {domain!r}")
        if record["id"] in ids:
            raise ValueError(f"row {i}: duplicate id {record['id']!r}")
        ids.add(record["id"])
    return records
