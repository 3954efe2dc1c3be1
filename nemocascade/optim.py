"""Optimisers as optax chains built from config (`config.stages.<name>.optim`).

    grad clipping -> AdamW(b1, b2, eps, weight_decay) with a learning-rate schedule

Schedules: `constant`, `cosine` (linear warm-up from `warmup_init` x lr, then cosine to `min_lr_frac` x lr)
and `linear_warmup` (warm-up then constant: MOPD's "0.1x over 30 steps", METHOD.md).
"""
from __future__ import annotations

import optax

SCHEDULES = ("constant", "cosine", "linear_warmup")
DEFAULTS = dict(lr=3e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0, schedule="constant",
                warmup_steps=0, warmup_init=0.0, min_lr_frac=0.1)


def make_schedule(o, total_steps: int) -> optax.Schedule:
    warm = int(o.warmup_steps)
    init = float(o.warmup_init) * o.lr
    if o.schedule == "constant":
        return optax.constant_schedule(o.lr)
    if o.schedule == "linear_warmup":
        return optax.linear_schedule(init, o.lr, max(warm, 1)) if warm else optax.constant_schedule(o.lr)
    if o.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(init, o.lr, warm, max(total_steps, warm + 1),
                                                  end_value=o.lr * o.min_lr_frac)
    raise ValueError(f"optim.schedule={o.schedule!r} unknown; choose one of {SCHEDULES}")


def make_optimizer(o, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optax chain for one stage; `o` is the stage's `optim` ConfigDict (keys of DEFAULTS)."""
    unknown = sorted(set(o.keys()) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown optim key(s) {unknown}; known: {sorted(DEFAULTS)}")
    if o.lr <= 0:
        raise ValueError(f"optim.lr must be > 0, got {o.lr}")
    schedule = make_schedule(o, total_steps)
    parts = [optax.clip_by_global_norm(o.grad_clip)] if o.grad_clip else []
    parts.append(optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay))
    return optax.chain(*parts), schedule
