"""Verifiers (METHOD.md "Rewards per domain"): one module per kind of check.

A domain names its own verifier in its record (``data.domains.Domain.verifier``); ``REWARDS`` holds the verifiers a
stage may train with instead (``stages.<name>.rewards``: domain -> key, looked up by ``data.domains.verifier``).
Every verifier has the signature ``reward(completion: str, answer: str) -> float``, is a module-level function (so
:class:`~nemocascade.rewards.pool.VerifierPool` workers can unpickle it) and scores bad input (malformed, over-long
or pathological) 0.0 without raising (size and time bounds: ``rewards/limits.py``). An exception is a verifier bug:
the pool scores that item 0.0 and counts it (``verifier_errors`` in the RL metrics).
"""

from collections.abc import Callable

from nemocascade.rewards import swe

REWARDS: dict[str, Callable[[str, str], float]] = {
    "swe_exec": swe.execution_score,  # C2's execution-based SWE RL: the repaired function against the tests
}
