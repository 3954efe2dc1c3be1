"""Data: the domain registry, procedural domains, on-disk builds and grain input pipelines.

    registry.py      DomainSpec, DOMAINS, register_domain, get_domain, split_of, generate_split
    math.py          procedural arithmetic with an imperfect teacher (registers "math")
    tfds_builder.py  prepare(): build once to array_record, read back as str records
    pipeline.py      sft_dataset, prompt_dataset, encode_prompts

Importing this package registers every built-in domain.
"""

from nemocascade.data import math  # noqa: F401  (registers the "math" domain)
from nemocascade.data.registry import (DOMAINS, RECORD_KEYS, DomainSpec, generate_split,
                                       get_domain, register_domain, split_of)

__all__ = ["DOMAINS", "RECORD_KEYS", "DomainSpec", "generate_split", "get_domain",
           "register_domain", "split_of"]
