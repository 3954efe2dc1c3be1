"""Real procedural math from reasoning-gym (domain ``"rg_math"``), verified by the boxed-answer math reward.

reasoning-gym (Open-Thought, ``pip install reasoning-gym``) ships seeded, verifiable generators; we use
the ones whose answer is one number or fraction, so ``rewards.math.score`` checks them exactly:
GSM-symbolic (templated grade-school word problems, with a worked solution), basic arithmetic, chain
sums, and a few more in :data:`SUPPORTED`. Everything is generated locally; nothing is downloaded.

Record: ``reasoning`` is the dataset's own worked solution when it has one (GSM-symbolic's ``answer_cot``
without the final ``#### N`` line), else ""; the problem key is ``name/question``. Items come from
``create_dataset(name, seed=s)`` with ``s`` drawn from the caller's rng, so a build is deterministic given its rng.

Held-out split: by a hash of the question text (``split_of(question)``), so an identical question can
never land in both splits.
"""

from __future__ import annotations

import functools

import numpy as np

from nemocascade.data.domains import Domain, check_args, register, split_of
from nemocascade.rewards import math as math_reward

DOMAIN = "rg_math"
DEFAULT_DATASETS = ("gsm_symbolic", "basic_arithmetic", "chain_sum")
# Datasets whose answers are single integers / decimals / fractions, so their gold responses score 1.0 under
# rewards.math.score (tests/test_reasoning_gym.py). Others (sorting, factor lists, ...) need their own verifier.
SUPPORTED = DEFAULT_DATASETS + ("leg_counting", "simple_equations", "gcd", "lcm", "products",
                                "fraction_simplification", "letter_counting", "count_bits")
# Domains (registry name -> default datasets, description): each is its own domain for the stage order, the
# rewards (all graded by the boxed-answer verifier: rewards/__init__.py) and the per-domain held-out tables.
FAMILIES = {
    DOMAIN: (DEFAULT_DATASETS, "reasoning-gym procedural math (GSM-symbolic, arithmetic, chain sums), boxed answers"),
    "rg_arith": (("chain_sum", "products"), "reasoning-gym sums and products, boxed answers"),
    "rg_count": (("letter_counting", "leg_counting", "count_bits"), "reasoning-gym counting (letters in words, "
                 "animals' legs, 1 bits), boxed answers"),
}
_CHUNK = 256  # items per created dataset; a fresh seed is drawn when one runs out


def _solution(item: dict) -> str:
    """The dataset's own worked solution, minus its final ``#### answer`` line; "" if it has none."""
    cot = (item.get("metadata") or {}).get("answer_cot") or ""
    lines = [line for line in cot.strip().splitlines() if not line.startswith("####")]
    return "\n".join(lines).strip()


def generate(rng: np.random.Generator, n: int, *, split: str | None = "train",
             datasets: list[str] | tuple[str, ...] | dict[str, float] | None = None,
             configs: dict[str, dict] | None = None, test_every: int = 10, instruction: str = "",
             domain: str = DOMAIN) -> list[dict]:
    """``n`` records drawn from reasoning-gym datasets (domains.py record contract), deterministic given ``rng``.

    Args:
        datasets: names (equal weights) or name -> weight (default: the ``domain``'s family in
            :data:`FAMILIES`); each must be in :data:`SUPPORTED`.
        configs: optional name -> extra keyword arguments for ``reasoning_gym.create_dataset``
            (e.g. ``{"chain_sum": {"max_terms": 3}}``).
        instruction: appended to every question (e.g. how to format the answer, for a pretrained model that
            was never taught our ``\\boxed{}`` convention); not part of the split key.
    """
    import reasoning_gym  # imported here: a heavy optional dependency, only needed to build rg_math data

    if domain not in FAMILIES:
        raise ValueError(f"domain {domain!r} is not a reasoning-gym family; known: {sorted(FAMILIES)}")
    weights = dict.fromkeys(FAMILIES[domain][0] if datasets is None else datasets, 1.0)
    if isinstance(datasets, dict):
        weights = dict(datasets)
    unknown = sorted(set(weights) - set(SUPPORTED))
    if unknown or not weights:
        raise ValueError(f"datasets must be a non-empty subset of {list(SUPPORTED)}; unsupported: {unknown}")
    names = sorted(weights)
    probs = np.array([weights[k] for k in names], dtype=np.float64)
    if (probs < 0).any() or probs.sum() <= 0:
        raise ValueError(f"dataset weights must be >= 0 with a positive sum, got {weights}")
    probs /= probs.sum()
    check_args(split)
    configs = configs or {}

    streams: dict[str, list] = {}  # name -> [dataset, next index]
    records, attempts = [], 0
    max_attempts = 100 * n * test_every + 1000
    while len(records) < n:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(f"found only {len(records)} of {n} rg_math records for split {split!r}")
        name = names[int(rng.choice(len(names), p=probs))]
        if name not in streams or streams[name][1] == _CHUNK:
            streams[name] = [reasoning_gym.create_dataset(name, seed=int(rng.integers(2**31)), size=_CHUNK,
                                                          **configs.get(name, {})), 0]
        dataset, index = streams[name]
        streams[name][1] += 1
        item = dataset[index]
        question, answer = str(item["question"]).strip(), str(item["answer"]).strip()
        if split is not None and split_of(question, test_every) != split:
            continue
        records.append({
            "domain": domain,
            "prompt": f"{question} {instruction}" if instruction else question,
            "reasoning": _solution(item),
            "response": f"The answer is \\boxed{{{answer.strip('$')}}}.",
            "answer": answer,
            # problem key (domains.problem_key) "name/question": a question drawn twice counts once in evaluation
            "id": f"{domain}/{split or 'all'}/{len(records)}/{name}/{question}",
        })
    return records


for _name, (_datasets, _description) in FAMILIES.items():
    register(Domain(name=_name, generate=functools.partial(generate, domain=_name), verifier=math_reward.score,
                    version="2", description=_description))
