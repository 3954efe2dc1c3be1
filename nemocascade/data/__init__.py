"""Data: the domain registry, procedural domains, on-disk builds and grain input pipelines.

    domains.py       Domain (generator, verifier, environment), DOMAINS, register, get_domain, verifier, split_of
    math.py          procedural arithmetic with an imperfect teacher (registers "math")
    code.py humaneval.py  procedural one-line functions (registers "code"); HumanEval as a "code" eval set
    instruct.py      procedural instruction following with a slipping teacher (registers "if")
    reasoning_gym.py reasoning-gym's procedural math datasets (registers "rg_math")
    ifbench.py       the real IFBench prompts mapped onto our constraint families (evaluation only)
    mcq.py structured.py tool.py longctx.py swe.py   multi-domain, long-context and SWE RL domains
    preference.py    chat preference pairs for RLHF with a reward model (registers "pref")
    judge_pref.py    which of a "pref" pair is better, as a generative judge reads it (registers "judge_pref")
    judge_longctx.py does a longctx response give the reference answer (registers "judge_longctx")
    tfds_builder.py  prepare(): build once to array_record, read back as str records
    pipeline.py      sft_dataset, prompt_dataset, encode_prompts

Importing this package registers every built-in domain.
"""

from nemocascade.data import math  # noqa: F401  (registers the "math" domain)
from nemocascade.data import code  # noqa: F401  (registers the "code" domain)
from nemocascade.data import instruct  # noqa: F401  (registers the "if" domain)
from nemocascade.data import reasoning_gym  # noqa: F401  (registers the "rg_math" domain)
from nemocascade.data import longctx, mcq, structured, swe, tool  # noqa: F401  (mcq json tool longctx swe)
from nemocascade.data import preference  # noqa: F401  (registers the "pref" domain)
from nemocascade.data import judge_longctx, judge_pref  # noqa: F401  (judges' SFT data: pref pairs, longctx answers)
from nemocascade.data.domains import (DOMAINS, RECORD_KEYS, Domain, generate_split, get_domain, register, split_of,
                                      verifier)

__all__ = ["DOMAINS", "RECORD_KEYS", "Domain", "generate_split", "get_domain", "register", "split_of", "verifier"]
