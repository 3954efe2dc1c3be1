"""LoRA (Hu et al. 2021): a stage trains low-rank adapters beside frozen params; the model applies the merge

    W' = W + (alpha / rank) * A @ B        A: [in, rank] ~ N(0, 1/in),  B: [rank, out] = 0

so the merged model starts equal to the base, exactly. `targets` is a regular expression over parameter names
(`optim.path_name`: "layers/wq", "embed"; re.fullmatch), and only weight matrices qualify (norms and biases never
do). Params stacked over layers keep that leading axis on their adapters: one A and one B per layer. A weight
with several axes on one side is the matrix of its flattened sides: the output is the `embed` axis for a weight
that writes into the residual stream (wo [heads, head_dim] -> [embed], w_down, the embedding [vocab] -> [embed]),
else everything after the input axis (wq [embed] -> [heads, head_dim], w_gate, lm_head). Adapters are float32
(their optimiser sees full precision) and hold A as [layers, in, rank], B as [layers, rank, out].

Sharding: adapters and their optimiser state are replicated on the mesh (`common.Trainer`); at rank r they hold
r * (in + out) numbers per matrix, small next to the base. The merge runs on the base's shardings.

`over_adapters` wraps a stage's loss; the rest of the wiring (merged params for sampling, evaluation and the next
stage) is `stages/common.py`'s `Trainer`.
"""
from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp

from nemocascade import optim
from nemocascade.errors import unknown_keys
from nemocascade.models import ModelConfig, param_axes

# alpha: the paper's scaling alpha / rank with alpha fixed, so that changing the rank needs no new learning rate
# (Hu et al. 2021, 4.1: with Adam, tuning alpha is like tuning the lr); 16 = the common 2 x rank 8
DEFAULTS = dict(rank=0, alpha=16.0, targets=r"layers/(wq|wk|wv|wo|w_gate|w_up|w_down)")


def matrices(model_cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """name -> (leading layer axes, input axes) of every weight matrix of the model (what `targets` may name)."""
    flat = jax.tree_util.tree_flatten_with_path(param_axes(model_cfg), is_leaf=lambda x: isinstance(x, tuple))[0]
    out = {}
    for path, axes in flat:
        lead = int(axes[0] == "layers")
        n = len(axes) - lead
        if n >= 2:
            out[optim.path_name(path)] = (lead, n - 1 if axes[-1] == "embed" else 1)
    return out


def problems(lora) -> list[str]:
    """What is wrong with a stage's `lora` ConfigDict, as `lora.<key>...` lines (empty: fine); run at validation.
    `targets` is matched against the matrices of any model of the family (the run's own are checked by `init`)."""
    bad = unknown_keys("lora", lora.keys(), DEFAULTS)
    rank, alpha, targets = (lora.get(k, DEFAULTS[k]) for k in ("rank", "alpha", "targets"))
    if not isinstance(rank, int) or rank < 0:
        bad.append(f"lora.rank={rank!r} must be an integer >= 0 (0: no LoRA, the stage trains every param)")
    if not (isinstance(alpha, (int, float)) and alpha > 0):
        bad.append(f"lora.alpha={alpha!r} must be > 0 (the update is scaled by alpha / rank)")
    try:
        re.compile(targets)
    except (re.error, TypeError) as err:
        return bad + [f"lora.targets={targets!r} is not a regular expression ({err})"]
    names = sorted(matrices(ModelConfig(vocab_size=2)))
    if not any(re.fullmatch(targets, n) for n in names):
        bad.append(f"lora.targets={targets!r} matches no weight matrix; their names: {names}")
    return bad


def init(rng: jax.Array, params, model_cfg: ModelConfig, rank: int, targets: str) -> dict:
    """Adapters for the matrices of `params` whose names fully match `targets`: {"a": A, "b": B} in place of each
    such leaf, in a nested dict mirroring `params`. Only the shapes of `params` are read. ValueError naming
    `lora.targets` when it matches no matrix of this model."""
    chosen = {n: m for n, m in matrices(model_cfg).items() if re.fullmatch(targets, n)}
    if not chosen:
        raise ValueError(f"lora.targets={targets!r} matches no weight matrix of the model; their names: "
                         f"{sorted(matrices(model_cfg))}")
    shapes = {optim.path_name(p): w.shape for p, w in jax.tree_util.tree_flatten_with_path(params)[0]}
    out = {}
    for key, (name, (lead, n_in)) in zip(jax.random.split(rng, len(chosen)), sorted(chosen.items())):
        shape = shapes[name]
        rows, cols = math.prod(shape[lead:lead + n_in]), math.prod(shape[lead + n_in:])
        a = jax.random.normal(key, (*shape[:lead], rows, rank), jnp.float32) / math.sqrt(rows)
        node = out
        *parents, leaf = name.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = {"a": a, "b": jnp.zeros((*shape[:lead], rank, cols), jnp.float32)}
    return out


def merge(base, adapters, alpha: float, rank: int):
    """`base` with W + (alpha / rank) * A @ B on every adapted matrix (the others returned as they are), computed in
    float32 and cast back to W's dtype. Pure: jit it, differentiate it with respect to `adapters`."""
    scale = alpha / rank

    def walk(w, ad):
        if isinstance(w, dict):
            return {k: walk(v, ad[k]) if k in ad else v for k, v in w.items()}
        delta = jnp.matmul(ad["a"], ad["b"], precision=jax.lax.Precision.HIGHEST).reshape(w.shape)
        return (w.astype(jnp.float32) + scale * delta).astype(w.dtype)
    return walk(base, adapters)


def over_adapters(loss, alpha: float, rank: int):
    """A loss over params as a loss over adapters: `loss(params, rows, shared)` becomes `(adapters, rows, shared,
    base)`, the model applying `merge(base, adapters)`; the gradient, the optax chain and the update see only the
    adapters. The frozen base is the step's last argument (`train_state.make_step`'s `frozen`), never donated."""
    return lambda adapters, rows, shared, base: loss(merge(base, adapters, alpha, rank), rows, shared)
