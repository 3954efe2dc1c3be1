"""Hugging Face checkpoints in and out: Llama, Qwen2, Qwen3 and Qwen3-MoE safetensors <-> our ModelConfig + params.

`load(path, mesh)` reads `config.json` and `model.safetensors` (or the shards listed in
`model.safetensors.index.json`) and returns `(ModelConfig, params)`. With a mesh every parameter is built
by `jax.make_array_from_callback` in its final sharding: each device's callback reads only its slice of
each layer's tensor (`safe_open(...).get_slice`, memory-mapped), so no host ever holds a full copy per
device. `save(config, params, path)` writes a directory `transformers.AutoModelForCausalLM` loads.

Layout. HF stores one `nn.Linear` weight [out, in] per layer; we store all layers stacked on a leading
axis for `lax.scan`, with heads split out: wq [L, D, H, Dh] = q_proj.weight.T reshaped,
wo [L, H, Dh, D] = o_proj.weight.T reshaped, w_gate [L, D, F] = gate_proj.weight.T, lm_head [D, V] =
lm_head.weight.T. RoPE is HF's "rotate half" layout and RMSNorm is HF's float32 formula (see
`transformer.py`), so the weights need no permutation. `from_hf_tensors` is the one translation both
this module and `gguf.py` use.

Anything the model function does not implement (rope scaling, partial rotary, sliding windows, an
o_proj or MLP bias) is refused with an error naming the file and key instead of loading a model that
would compute something else.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, so safetensors' numpy slices can hold BF16)
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from nemocascade import mesh as mesh_lib
from nemocascade.models import hybrid, param_shardings
from nemocascade.models import transformer as tf

# model_type -> (architecture class, qkv_bias, qk_norm). Everything else is shared by the families; qwen3_moe is
# qwen3 with every MLP a mixture of experts (MOE_FAMILIES).
FAMILIES = {
    "llama": ("LlamaForCausalLM", False, False),
    "qwen2": ("Qwen2ForCausalLM", True, False),
    "qwen3": ("Qwen3ForCausalLM", False, True),
    "qwen3_moe": ("Qwen3MoeForCausalLM", False, True),
}
MOE_FAMILIES = {"qwen3_moe"}
DEFAULT_ROPE_THETA = 10_000.0  # transformers' `default_theta` for these families
DEFAULT_RMS_EPS = 1e-6         # LlamaConfig / Qwen2Config / Qwen3Config default

# our leaf name -> (HF tensor name, layout kind); layer tensors have "{i}" for the layer index.
_LAYER = "model.layers.{i}."
TENSORS = {
    "embed": ("model.embed_tokens.weight", "same"),
    "final_norm": ("model.norm.weight", "same"),
    "lm_head": ("lm_head.weight", "T"),
    "attn_norm": (_LAYER + "input_layernorm.weight", "same"),
    "mlp_norm": (_LAYER + "post_attention_layernorm.weight", "same"),
    "wq": (_LAYER + "self_attn.q_proj.weight", "in_heads"),
    "wk": (_LAYER + "self_attn.k_proj.weight", "in_heads"),
    "wv": (_LAYER + "self_attn.v_proj.weight", "in_heads"),
    "wo": (_LAYER + "self_attn.o_proj.weight", "out_heads"),
    "bq": (_LAYER + "self_attn.q_proj.bias", "bias_heads"),
    "bk": (_LAYER + "self_attn.k_proj.bias", "bias_heads"),
    "bv": (_LAYER + "self_attn.v_proj.bias", "bias_heads"),
    "q_norm": (_LAYER + "self_attn.q_norm.weight", "same"),
    "k_norm": (_LAYER + "self_attn.k_norm.weight", "same"),
    "w_gate": (_LAYER + "mlp.gate_proj.weight", "T"),
    "w_up": (_LAYER + "mlp.up_proj.weight", "T"),
    "w_down": (_LAYER + "mlp.down_proj.weight", "T"),
    # mixture of experts (Qwen3-MoE as saved on the Hub: one tensor per expert; "{e}" the expert index)
    "router": (_LAYER + "mlp.gate.weight", "T"),
    "we_gate": (_LAYER + "mlp.experts.{e}.gate_proj.weight", "T"),
    "we_up": (_LAYER + "mlp.experts.{e}.up_proj.weight", "T"),
    "we_down": (_LAYER + "mlp.experts.{e}.down_proj.weight", "T"),
}


def tensor_spec(cfg, top: str, leaf: str | None = None):
    """(HF name template, layout kind, [(placeholder, values)] for the leaf's stacked leading axes) of params[top]
    (leaf None) or params[top][leaf]: layers ("i") and experts ("e"), each value one HF tensor."""
    if cfg.layer_pattern:
        return hybrid.tensor_spec(cfg, top, leaf)
    template, kind = TENSORS[top if leaf is None else leaf]
    stack = [] if leaf is None else [("i", list(range(cfg.n_layers)))]
    return template, kind, stack + ([("e", list(range(cfg.n_experts)))] if "{e}" in template else [])


def _leaves(cfg):
    """(top, leaf or None, shape) of every param of `cfg`."""
    for top, sub in tf.param_shapes(cfg).items():
        if isinstance(sub, dict):
            yield from ((top, leaf, shape) for leaf, shape in sub.items())
        else:
            yield top, None, sub


def _names(template: str, stack) -> list[str]:
    """Every HF tensor of a leaf, in the order of its stacked axes."""
    return [template.format(**dict(zip((p for p, _ in stack), ix)))
            for ix in itertools.product(*(values for _, values in stack))]


# ----------------------------------------------------------------------------------------------------
# config.json <-> ModelConfig


def _rope_theta(hf: dict, where: str) -> float:
    """rope_theta from transformers 5's `rope_parameters` or the legacy top-level key; only the
    default (unscaled, full-dimension) rotary embedding is implemented."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if any(isinstance(v, dict) for v in rope.values()):
        raise ValueError(f"{where}: per-layer-type rope_parameters {sorted(rope)} are not supported")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"{where}: rope_type {kind!r} (rope scaling) is not supported; only 'default'")
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor={partial} is not supported; only 1.0")
    return float(rope.get("rope_theta", hf.get("rope_theta", DEFAULT_ROPE_THETA)))


def config_from_hf(hf: dict, param_dtype: str = "float32", where: str = "config.json") -> tf.ModelConfig:
    """Our ModelConfig for an HF Llama / Qwen2 / Qwen3 config dict (`where` names it in errors)."""
    kind = hf.get("model_type")
    if kind == "nemotron_h":
        return tf.ModelConfig(**hybrid.config_from_hf(hf, param_dtype, where))
    if kind not in FAMILIES:
        raise ValueError(f"{where}: model_type {kind!r} is not supported; supported: {sorted(FAMILIES)}")
    _, qkv_bias, qk_norm = FAMILIES[kind]
    unsupported = {
        "hidden_act": hf.get("hidden_act", "silu") != "silu",
        "attention_bias": bool(hf.get("attention_bias", False)),  # llama/qwen3: also an o_proj bias
        "mlp_bias": bool(hf.get("mlp_bias", False)),
        "use_sliding_window": bool(hf.get("use_sliding_window", False)),
    }
    for key, bad in unsupported.items():
        if bad:
            raise ValueError(f"{where}: {key}={hf[key]!r} is not supported by nemocascade's transformer")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if key not in hf:
            raise ValueError(f"{where}: missing key {key!r}")
    moe = {}
    if kind in MOE_FAMILIES:
        if "num_experts" not in hf and "num_local_experts" in hf:  # transformers 5 saves it under this name
            hf = {**hf, "num_experts": hf["num_local_experts"]}
        for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            if key not in hf:
                raise ValueError(f"{where}: missing key {key!r}")
        if hf.get("decoder_sparse_step", 1) != 1 or hf.get("mlp_only_layers"):
            raise ValueError(f"{where}: decoder_sparse_step={hf.get('decoder_sparse_step')} / mlp_only_layers="
                             f"{hf.get('mlp_only_layers')} (dense layers between sparse ones) are not supported; "
                             "every layer must be a mixture of experts")
        moe = dict(n_experts=hf["num_experts"], n_experts_per_tok=hf["num_experts_per_tok"],
                   d_ff_expert=hf["moe_intermediate_size"], norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
                   router_aux_coef=float(hf.get("router_aux_loss_coef", 0.001)))
    n_heads = hf["num_attention_heads"]
    return tf.ModelConfig(
        vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=n_heads, n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads, d_ff=hf["intermediate_size"],
        rope_theta=_rope_theta(hf, where), norm_eps=float(hf.get("rms_norm_eps", DEFAULT_RMS_EPS)),
        qk_norm=qk_norm, qkv_bias=qkv_bias, tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        dtype="auto", param_dtype=param_dtype, init_std=float(hf.get("initializer_range", 0.02)), **moe)


def config_to_hf(cfg: tf.ModelConfig) -> dict:
    """The config.json of `cfg`: qk_norm -> qwen3 (qwen3_moe with experts), qkv_bias -> qwen2, neither -> llama; a
    hybrid layer pattern -> nemotron_h."""
    if cfg.layer_pattern:
        return hybrid.config_to_hf(cfg)
    kinds = [k for k, (_, bias, norm) in FAMILIES.items()
             if (bias, norm) == (cfg.qkv_bias, cfg.qk_norm) and (k in MOE_FAMILIES) == cfg.moe]
    if not kinds:
        raise ValueError("no HF family has both qkv_bias and qk_norm (Qwen3's attention_bias also biases o_proj)"
                         if not cfg.moe else "a mixture of experts exports as qwen3_moe only: qk_norm and no qkv_bias")
    if cfg.d_ff_shared:
        raise ValueError("qwen3_moe has no shared expert: model.d_ff_shared must be 0 to export")
    kind = kinds[0]
    moe = dict(num_experts=cfg.n_experts, num_experts_per_tok=cfg.n_experts_per_tok,
               moe_intermediate_size=cfg.d_ff_expert, norm_topk_prob=cfg.norm_topk_prob,
               router_aux_loss_coef=cfg.router_aux_coef, decoder_sparse_step=1, mlp_only_layers=[]) if cfg.moe else {}
    return moe | {
        "architectures": [FAMILIES[kind][0]], "model_type": kind, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps, "attention_bias": False,
        # transformers >= 5 reads rope_parameters, 4.x the top-level rope_theta: write both.
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta}, "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_embeddings, "initializer_range": cfg.init_std, "dtype": cfg.param_dtype,
    }


# ----------------------------------------------------------------------------------------------------
# HF tensors -> our params (shared with gguf.py)


def hf_names(cfg: tf.ModelConfig) -> list[str]:
    """Every HF tensor name the params of `cfg` come from."""
    out = []
    for top, leaf, _ in _leaves(cfg):
        template, _, stack = tensor_spec(cfg, top, leaf)
        out += _names(template, stack)
    return out


def _bounds(s: slice, n: int) -> tuple[int, int]:
    start, stop, step = s.indices(n)
    if step != 1:
        raise ValueError(f"strided shard index {s} is not supported")
    return start, stop


def _read(src, kind: str, index: tuple[slice, ...], shape: tuple[int, ...]) -> np.ndarray:
    """The block `index` of our per-layer array (shape `shape`), read from the HF tensor `src` (anything
    that takes numpy-style 2-D slices: a safetensors slice or a numpy array) without reading the rest."""
    b = [_bounds(s, n) for s, n in zip(index, shape)]
    if kind == "same":
        return np.asarray(src[tuple(slice(*x) for x in b)])
    if kind == "T":  # ours [a, b] = hf [b, a]
        (a0, a1), (b0, b1) = b
        return np.asarray(src[b0:b1, a0:a1]).T
    dh = shape[-1] if kind != "out_heads" else shape[1]
    if kind == "in_heads":  # ours [D, N, Dh] = hf [N*Dh, D]
        (d0, d1), (n0, n1), (k0, k1) = b
        x = np.asarray(src[n0 * dh:n1 * dh, d0:d1]).reshape(n1 - n0, dh, d1 - d0)
        return x[:, k0:k1].transpose(2, 0, 1)
    if kind == "out_heads":  # ours [N, Dh, D] = hf [D, N*Dh]
        (n0, n1), (k0, k1), (d0, d1) = b
        return np.asarray(src[d0:d1, n0 * dh:n1 * dh]).T.reshape(n1 - n0, dh, d1 - d0)[:, k0:k1]
    if kind == "conv":  # ours [C, K] = hf [C, 1, K] (a depthwise Conv1d's weight)
        (c0, c1), (k0, k1) = b
        return np.asarray(src[c0:c1, 0:1, k0:k1])[:, 0, :]
    if kind == "bias_heads":  # ours [N, Dh] = hf [N*Dh]
        (n0, n1), (k0, k1) = b
        return np.asarray(src[n0 * dh:n1 * dh]).reshape(n1 - n0, dh)[:, k0:k1]
    raise ValueError(f"unknown layout kind {kind!r}")


def _hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The HF tensor shape that holds our per-layer array of `shape`."""
    if kind == "T":
        return shape[::-1]
    if kind == "in_heads":
        return (shape[1] * shape[2], shape[0])
    if kind == "out_heads":
        return (shape[2], shape[0] * shape[1])
    if kind == "bias_heads":
        return (shape[0] * shape[1],)
    if kind == "conv":
        return (shape[0], 1, shape[1])
    return shape


def from_hf_tensors(cfg: tf.ModelConfig, get: Callable[[str], tuple[object, tuple[int, ...]]], mesh=None):
    """Our params pytree from HF-named tensors.

    get(name) -> (src, shape): `src` takes numpy-style slices, `shape` is its full shape; it raises
    KeyError naming the tensor (and file) when absent. With `mesh`, each leaf is created in its
    `param_shardings` sharding and each device's callback reads only its own block of each layer.
    """
    dtype = jnp.dtype(cfg.param_dtype)
    shardings = None if mesh is None else param_shardings(cfg, mesh)

    def leaf(top: str, name: str | None, shape: tuple[int, ...], sharding):
        template, kind, stack = tensor_spec(cfg, top, name)
        per = shape[len(stack):]
        for n in _names(template, stack):  # check every tensor's presence and shape before reading any
            got = tuple(get(n)[1])
            if got != _hf_shape(kind, per):
                raise ValueError(f"tensor {n!r} has shape {got}, expected {_hf_shape(kind, per)} for {cfg}")
        cache = {}
        placeholders = [p for p, _ in stack]

        def read(prefix, ranges, index):
            if not ranges:
                return _read(get(template.format(**dict(zip(placeholders, prefix))))[0], kind, index, per)
            axis = len(prefix)
            return np.stack([read(prefix + (stack[axis][1][j],), ranges[1:], index) for j in range(*ranges[0])])

        def block(index):
            # devices that replicate a dim ask for the same block: read it once
            key = tuple(_bounds(s, n) for s, n in zip(index, shape))
            if key not in cache:
                cache[key] = read((), key[:len(stack)], index[len(stack):]).astype(dtype)
            return cache[key]

        if sharding is None:
            return jnp.asarray(block(tuple(slice(None) for _ in shape)))
        return jax.make_array_from_callback(shape, sharding, block)

    out = {}
    for top, name, shape in _leaves(cfg):
        if name is None:
            out[top] = leaf(top, None, shape, shardings and shardings[top])
        else:
            out.setdefault(top, {})[name] = leaf(top, name, shape, shardings and shardings[top][name])
    return out


# ----------------------------------------------------------------------------------------------------
# Public API


def _weight_files(path: str) -> dict[str, str]:
    """tensor name -> safetensors file, from the shard index or the single file."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {k: os.path.join(path, v) for k, v in weight_map.items()}
    single = os.path.join(path, "model.safetensors")
    if not os.path.exists(single):
        raise FileNotFoundError(f"{path}: neither model.safetensors nor model.safetensors.index.json")
    with safe_open(single, framework="numpy") as f:
        return {k: single for k in f.keys()}


def load(path: str, mesh=None, param_dtype: str | None = None):
    """(ModelConfig, params) of the HF checkpoint directory `path` (Llama / Qwen2 / Qwen3).

    Params keep the checkpoint's precision: bfloat16 when every float tensor is BF16, else float32
    (F16 is widened); `param_dtype` overrides. Compute dtype "auto": float32 on CPU, bfloat16 on TPU/GPU
    (change `config.dtype`).
    With `mesh`, params are placed straight into `param_shardings(config, mesh)`.
    """
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{config_path}: no such file")
    with open(config_path) as f:
        hf_cfg = json.load(f)
    cfg = config_from_hf(hf_cfg, where=config_path)
    files = _weight_files(path)
    unused = [n for n in sorted(set(files) - set(hf_names(cfg)))
              if not n.endswith("rotary_emb.inv_freq")  # a buffer older Llama checkpoints saved
              and not (n == "lm_head.weight" and cfg.tie_embeddings)]  # some tied checkpoints keep a copy
    if unused:
        raise ValueError(f"{path}: tensors {unused[:5]} ({len(unused)} in all) have no place in the model "
                         f"{config_path} describes (a feature nemocascade does not implement?)")
    with contextlib.ExitStack() as stack:
        handles = {p: stack.enter_context(safe_open(p, framework="numpy")) for p in sorted(set(files.values()))}

        def get(name):
            if name not in files:
                raise KeyError(f"{path}: tensor {name!r} is missing from the checkpoint")
            sl = handles[files[name]].get_slice(name)
            return sl, tuple(sl.get_shape())

        if param_dtype is None:
            dtypes = {handles[p].get_slice(n).get_dtype() for n, p in files.items()}
            param_dtype = "bfloat16" if dtypes == {"BF16"} else "float32"
        cfg = dataclasses.replace(cfg, param_dtype=param_dtype)
        params = from_hf_tensors(cfg, get, mesh)
        jax.block_until_ready(params)  # the callbacks read the memory maps: finish before closing them
    return cfg, params


_jit_forward = jax.jit(tf.forward, static_argnums=1)


def forward(config: tf.ModelConfig, params, tokens):
    """Logits float32 [B, T, vocab] for int32 tokens [B, T] (no padding); jitted, one compile per shape."""
    return _jit_forward(params, config, jnp.asarray(tokens, jnp.int32))


def to_hf_tensors(config: tf.ModelConfig, params) -> dict[str, np.ndarray]:
    """HF-named numpy tensors of `params` (fetched to the host)."""
    params = mesh_lib.to_host(params)
    out = {}
    for top, sub in params.items():
        items = sub.items() if isinstance(sub, dict) else [(None, sub)]
        for name, value in items:
            template, kind, stack = tensor_spec(config, top, name)
            value = np.asarray(value)
            for ix, hf_name in zip(np.ndindex(value.shape[:len(stack)]), _names(template, stack)):
                x = value[ix]
                shape = x.shape
                if kind == "T":
                    y = x.T
                elif kind == "in_heads":
                    y = x.reshape(shape[0], -1).T
                elif kind == "out_heads":
                    y = x.reshape(-1, shape[2]).T
                elif kind == "bias_heads":
                    y = x.reshape(-1)
                elif kind == "conv":
                    y = x[:, None, :]
                else:
                    y = x
                out[hf_name] = np.ascontiguousarray(y)
    return out


def save(config: tf.ModelConfig, params, path: str) -> None:
    """Write `path/config.json` and `path/model.safetensors` (loadable by transformers' from_pretrained)."""
    hf_cfg = config_to_hf(config)
    os.makedirs(path, exist_ok=True)
    save_file(to_hf_tensors(config, params), os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2)
