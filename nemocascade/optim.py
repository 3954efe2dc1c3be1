"""Optimisers as optax chains built from config (`config.stages.<name>.optim`).

    [sum per-term gradients] -> global-norm clipping -> AdamW(b1, b2, eps, weight_decay, lr schedule)
      -> [zero the updates of frozen parameters]

Each link that has something to report keeps it in its state and `logged(opt_state)` reads it back for
metrics.jsonl: `grad_norm` (before clipping) and `clipped`, and with per-term gradients (an on-policy stage's
`log_term_grad_norms`) `grad_norm/<term>`. `freeze`: regular expressions over parameter paths
("layers/0/attn/.*", "embed"); matching parameters get zero updates (their Adam moments are still kept).

Schedules: `constant`, `cosine` (linear warm-up from `warmup_init` x lr, then cosine to `min_lr_frac` x lr)
and `linear_warmup` (warm-up then constant: MOPD's "0.1x over 30 steps", METHOD.md).
"""
from __future__ import annotations

import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("constant", "cosine", "linear_warmup")
DEFAULTS = dict(lr=3e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0, schedule="constant",
                warmup_steps=0, warmup_init=0.0, min_lr_frac=0.1, freeze=())


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


def make_optimizer(o, total_steps: int, terms: tuple = ()) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optax chain for one stage; `o` is the stage's `optim` ConfigDict (keys of DEFAULTS). `terms`: the
    objective's term names when the step hands over one gradient per term ({term: grads}); () for one gradient."""
    unknown = sorted(set(o.keys()) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown optim key(s) {unknown}; known: {sorted(DEFAULTS)}")
    if o.lr <= 0:
        raise ValueError(f"optim.lr must be > 0, got {o.lr}")
    patterns = [o.freeze] if isinstance(o.freeze, str) else list(o.freeze)
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as err:
            raise ValueError(f"optim.freeze: {pattern!r} is not a regular expression ({err})") from None
    schedule = make_schedule(o, total_steps)
    parts = [sum_term_grads(tuple(terms)), clip_by_global_norm_logged(o.grad_clip),
             optax.adamw(schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay)]
    if patterns:
        parts.append(optax.masked(optax.set_to_zero(), frozen_mask(patterns)))
    return optax.chain(*parts), schedule


class TermGradNorms(NamedTuple):
    norms: dict  # term -> global norm of that term's (weighted) gradient at the last update


class ClipState(NamedTuple):
    grad_norm: jax.Array  # global norm of the summed gradient, before clipping
    clipped: jax.Array  # 1.0 when it was scaled down


def sum_term_grads(terms: tuple) -> optax.GradientTransformation:
    """Updates arrive as {term: grads} (one gradient per objective term): record each term's global norm, pass
    on their sum. With `terms=()` updates are one gradient already and pass through."""
    def init(params):
        return TermGradNorms({t: jnp.zeros([], jnp.float32) for t in terms})

    def update(updates, state, params=None):
        if not terms:
            return updates, state
        norms = {t: optax.global_norm(updates[t]) for t in terms}
        return jax.tree.map(lambda *g: sum(g[1:], g[0]), *(updates[t] for t in terms)), TermGradNorms(norms)
    return optax.GradientTransformation(init, update)


def clip_by_global_norm_logged(max_norm: float) -> optax.GradientTransformation:
    """optax.clip_by_global_norm (max_norm 0: no clipping) that records the norm and whether it clipped."""
    def init(params):
        return ClipState(jnp.zeros([], jnp.float32), jnp.zeros([], jnp.float32))

    def update(updates, state, params=None):
        norm = optax.global_norm(updates)
        if not max_norm:
            return updates, ClipState(norm, jnp.zeros([], jnp.float32))
        keep = norm < max_norm  # optax.clip_by_global_norm's rule and arithmetic, so numbers match it
        clipped = jax.tree.map(lambda g: jnp.where(keep, g, (g / norm.astype(g.dtype)) * max_norm), updates)
        return clipped, ClipState(norm, 1.0 - keep.astype(jnp.float32))
    return optax.GradientTransformation(init, update)


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


def logged(opt_state) -> dict:
    """The metrics the chain's links recorded at the last update (see the module docstring)."""
    out = {}
    is_record = lambda x: isinstance(x, (TermGradNorms, ClipState))  # noqa: E731
    for s in jax.tree.leaves(opt_state, is_leaf=is_record):
        if isinstance(s, ClipState):
            out |= {"grad_norm": s.grad_norm, "clipped": s.clipped}
        elif isinstance(s, TermGradNorms):
            out |= {f"grad_norm/{t}": v for t, v in s.norms.items()}
    return out
