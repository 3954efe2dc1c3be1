"""SFT a small transformer from scratch on procedural math, then report held-out greedy pass@1.

    python experiments/run.py --config=sft_math --workdir=runs/sft_math
    python experiments/run.py --config=sft_math:tiny --workdir=runs/smoke     # ~2 minutes on 2 CPU cores
"""
import ml_collections

from _common import math_base, math_tiny
from nemocascade.stages import common, sft


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = math_base("sft_math")
    c.variant = arg
    c.stages.sft = common.stage_config("sft", sft.DEFAULTS, domains=["math"], steps=1000, batch_size=32,
                                       seq_len=128, checkpoint_every=100, eval_every=100, eval_n=128,
                                       optim=dict(lr=3e-3, schedule="cosine", warmup_steps=100,
                                                  weight_decay=0.01, min_lr_frac=0.05))
    c.stage_order = ("sft",)
    if arg == "tiny":
        math_tiny(c)
        c.stages.sft.update(steps=400, seq_len=80, checkpoint_every=100, eval_every=100, eval_n=64)
    elif arg not in (None, ""):
        raise ValueError(f"sft_math: unknown variant {arg!r}; known: tiny")
    return c
