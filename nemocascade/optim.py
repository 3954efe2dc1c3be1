"""Optimisers as optax chains built from config (`config.stages.<name>.optim`).

    [optax.clip_by_global_norm] -> AdamW(b1, b2, eps, weight_decay, lr schedule)
      -> [zero the updates of frozen parameters]

The chain only updates; what a step logs about its gradient (`grad_norm` before clipping, `clipped`) the step
computes itself (`train_state.make_step`). `freeze`: regular expressions over parameter paths
("layers/0/attn/.*", "embed"); matching parameters get zero updates (their Adam moments are still kept).

Besides the chain, the part says what a stage starts with and how much it forgives: `state` "reset" (a fresh
optimiser state) or "keep" (the Adam moments and count of the stage it starts from, its schedule restarted:
`stages/common.py`), and `max_nonfinite_steps`, the skipped non-finite updates in a row that stop the run.

Schedules: `constant`, `cosine` (linear warm-up from `warmup_init` x lr, then cosine to `min_lr_frac` x lr)
and `linear_warmup` (warm-up then constant: MOPD's "0.1x over 30 steps", METHOD.md).
"""
from __future__ import annotations

import re
import jax
import optax

from nemocascade.errors import unknown_keys

SCHEDULES = ("constant", "cosine", "linear_warmup")
STATES = ("reset", "keep")
DEFAULTS = dict(lr=3e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0, schedule="constant",
                warmup_steps=0, warmup_init=0.0, min_lr_frac=0.1, freeze=(), state="reset", max_nonfinite_steps=3)


def problems(o) -> list[str]:
    """"optim.<key>: problem" for each bad key of a stage's `optim` part (empty: fine); checked once, at start."""
    out = unknown_keys("optim", o.keys(), DEFAULTS)
    if out:
        return out
    if not o.lr > 0:
        out.append(f"optim.lr must be > 0, got {o.lr}")
    if o.schedule not in SCHEDULES:
        out.append(f"optim.schedule={o.schedule!r} unknown; choose one of {SCHEDULES}")
    if o.state not in STATES:
        out.append(f"optim.state={o.state!r}; choose one of {STATES}")
    if not (isinstance(o.max_nonfinite_steps, int) and o.max_nonfinite_steps >= 1):
        out.append(f"optim.max_nonfinite_steps must be an int >= 1, got {o.max_nonfinite_steps!r}")
    for pattern in _patterns(o.freeze):
        try:
            re.compile(pattern)
        except re.error as err:
            out.append(f"optim.freeze: {pattern!r} is not a regular expression ({err})")
    return out


def _patterns(freeze) -> list[str]:
    return [freeze] if isinstance(freeze, str) else list(freeze)


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
    raise ValueError(f"optim.schedule={o.schedule!r} unknown; choose one of {SCHEDULES}")  # see `problems`


def make_optimizer(o, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optax chain for one stage; `o` is the stage's `optim` ConfigDict, valid (`problems`)."""
    patterns = _patterns(o.freeze)
    schedule = make_schedule(o, total_steps)
    parts = [optax.clip_by_global_norm(o.grad_clip)] if o.grad_clip else []  # 0: no clipping
    parts.append(optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay))
    if patterns:
        parts.append(optax.masked(optax.set_to_zero(), frozen_mask(patterns)))
    return optax.chain(*parts), schedule


def path_name(path) -> str:
    """A parameter's name as `freeze` and `lora.targets` match it: its pytree key path joined by '/'
    ("layers/wq", "embed")."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def frozen_mask(patterns):
    """params -> bool pytree: True where the '/'-joined key path matches one of `patterns` (re.fullmatch)."""
    compiled = [re.compile(p) for p in patterns]

    def mask(params):
        def frozen(path, _):
            return any(p.fullmatch(path_name(path)) for p in compiled)
        return jax.tree_util.tree_map_with_path(frozen, params)
    return mask
