"""Reward functions by domain (METHOD.md "Rewards per domain").

The domain is a field on every example and picks its verifier here, through a dict, never an if/elif
chain (STYLE.md). Every entry has the signature ``reward(completion: str, answer: str) -> float``, is a
module-level function (so :class:`~nemocascade.rewards.pool.VerifierPool` workers can unpickle it) and
scores bad input (malformed, over-long or pathological) 0.0 without raising (size and time bounds:
``rewards/limits.py``). An exception is a verifier bug: the pool scores that item 0.0 and counts it
(``verifier_errors`` in the RL metrics). Adding a domain = one module + one entry.
"""

from collections.abc import Callable

from nemocascade.rewards import code, instruct, math
from nemocascade.rewards import mcq, pref, structured, swe, tool, verdict

REWARDS: dict[str, Callable[[str, str], float]] = {
    "math": math.score,
    "code": code.score,
    "if": instruct.score,
    # reasoning-gym families (data/reasoning_gym.py FAMILIES): numbers / fractions, the boxed-answer verifier
    "rg_math": math.score, "rg_arith": math.score, "rg_count": math.score,
    "mcq": mcq.score, "json": structured.score, "tool": tool.score, "longctx": math.score,  # longctx: boxed number
    "swe": swe.agentless_score, "swe_exec": swe.execution_score,
    "swe_retry": swe.agentless_score,  # the second turn's repair, scored as swe
    # pref: evaluation only, a rule-based proxy judge; RLHF trains on the learned RM (rewards/rm_scorer.py)
    "pref": pref.score,
    "judge_pref": verdict.score,  # a generative judge's SFT domains: the right verdict, strictly parsed
    "judge_longctx": verdict.score,
}


def get_reward(domain: str) -> Callable[[str, str], float]:
    """The reward function registered for ``domain``; KeyError naming the known domains otherwise."""
    try:
        return REWARDS[domain]
    except KeyError:
        known = sorted(REWARDS)
        raise KeyError(f"no reward registered for domain {domain!r}; known domains: {known}") from None
