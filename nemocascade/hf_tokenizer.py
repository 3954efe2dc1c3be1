"""A Hugging Face `tokenizers.Tokenizer` behind the interface of our SentencePiece `Tokenizer`.

`HFTokenizer` gives a real model's own vocabulary the `nemocascade.tokenizer.TextTokenizer` interface (all that
the pipelines, sampler and evaluation use), so a pretrained checkpoint (`models.hf.load`, `models.gguf.load_gguf`)
is prompted and decoded with the ids it was trained on:

  * `encode` adds no bos/eos (as ours: the chat template carries its markers); special tokens written in
    the text (`<|im_start|>`) encode to their single id;
  * `eos_id` is the token the sampler stops on (for ChatML models such as SmolLM2 that is `<|im_end|>`);
  * `decode` drops pad ids, except where the pad id is the eos id (SmolLM2 pads with `<|im_end|>`, a
    real token of every finished turn).

`byte_level_bpe` builds the GPT-2 style byte-level BPE that a GGUF's `tokenizer.ggml.*` metadata describes;
`apply_chat_template` renders a checkpoint's Jinja chat template the way transformers does (same sandbox,
same `tojson`), without needing transformers at run time.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence

import jinja2
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

# llama.cpp's `tokenizer.ggml.pre` -> pre-tokenizer. "smollm" (like "starcoder") splits every digit off
# first, then applies the GPT-2 regex (llama.cpp's llm_tokenizer_bpe and SmolLM2's own tokenizer.json).
_GPT2 = lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # noqa: E731
PRE_TOKENIZERS = {
    "gpt2": _GPT2,
    "smollm": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _GPT2()]),
    "starcoder": lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _GPT2()]),
}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types


def byte_level_bpe(tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int] | None = None,
                   pre: str = "gpt2") -> Tokenizer:
    """Byte-level BPE from a vocabulary (id order), "a b" merge rules (priority order) and llama.cpp token
    types: CONTROL tokens become special added tokens, USER_DEFINED ones plain added tokens, both matched
    whole in the text (as llama.cpp does) instead of being cut into pieces."""
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"tokenizer.ggml.pre={pre!r} is not supported; supported: {sorted(PRE_TOKENIZERS)}")
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges], dropout=None,
                     continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    types = list(token_types or ())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == USER_DEFINED])
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ValueError(f"tokenizer has {tok.get_vocab_size(with_added_tokens=True)} ids for {len(tokens)} "
                         "vocabulary entries (duplicate tokens?)")
    return tok


def _template_env() -> ImmutableSandboxedEnvironment:
    """The Jinja environment transformers renders chat templates in (utils/chat_template_utils.py)."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes HTML characters; templates expect plain JSON
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


class HFTokenizer:
    """A `tokenizers.Tokenizer` with the `TextTokenizer` interface (see module docstring)."""

    def __init__(self, tokenizer: Tokenizer, *, eos_token: str, pad_token: str | None = None,
                 bos_token: str | None = None, chat_template: str | None = None):
        self._tok = tokenizer
        self.eos_token, self.bos_token, self.chat_template = eos_token, bos_token, chat_template
        self.pad_token = pad_token if pad_token is not None else eos_token  # no pad token: pad with eos
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_id: int = self.token_id(eos_token)
        self.pad_id: int = self.token_id(self.pad_token)
        self.bos_id: int | None = None if bos_token is None else self.token_id(bos_token)

    @classmethod
    def from_dir(cls, path: str) -> "HFTokenizer":
        """From a Hugging Face directory: tokenizer.json, tokenizer_config.json and, where transformers 5
        keeps it, chat_template.jinja."""
        tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            conf = json.load(f)

        def content(key):  # a special token is spelled as a string or as an AddedToken dict
            value = conf.get(key)
            return value.get("content") if isinstance(value, dict) else value

        template = conf.get("chat_template")
        jinja_path = os.path.join(path, "chat_template.jinja")
        if template is None and os.path.exists(jinja_path):
            with open(jinja_path) as f:
                template = f.read()
        if content("eos_token") is None:
            raise ValueError(f"{path}/tokenizer_config.json: no eos_token (the sampler needs a stop token)")
        return cls(tok, eos_token=content("eos_token"), pad_token=content("pad_token"),
                   bos_token=content("bos_token"), chat_template=template)

    def save(self, path: str) -> None:
        """Write `path/tokenizer.json` and `path/tokenizer_config.json` (special tokens, chat template): what
        `from_dir` and transformers' `AutoTokenizer.from_pretrained` read, without needing transformers here."""
        os.makedirs(path, exist_ok=True)
        self._tok.save(os.path.join(path, "tokenizer.json"))
        conf = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": self.eos_token, "pad_token": self.pad_token,
                "bos_token": self.bos_token, "chat_template": self.chat_template, "clean_up_tokenization_spaces": False}
        with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
            json.dump({k: v for k, v in conf.items() if v is not None}, f, indent=2, ensure_ascii=False)

    # Picklable through the tokenizer's JSON, so grain worker processes can receive it.
    def __getstate__(self) -> dict:
        return {"json": self._tok.to_str(), "eos_token": self.eos_token, "pad_token": self.pad_token,
                "bos_token": self.bos_token, "chat_template": self.chat_template}

    def __setstate__(self, state: dict) -> None:
        self.__init__(Tokenizer.from_str(state.pop("json")), **state)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; no bos/eos added."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """Text of a 1-D sequence of ids; pad ids are dropped unless the pad id is the eos id."""
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"decode expects a 1-D sequence of int ids, got shape {arr.shape} dtype {arr.dtype}")
        bad = arr[(arr < 0) | (arr >= self.vocab_size)]
        if bad.size:
            raise ValueError(f"decode: id {int(bad[0])} is outside the vocabulary [0, {self.vocab_size})")
        drop = self.pad_id if self.pad_id != self.eos_id else None
        return self._tok.decode([int(i) for i in arr if i != drop], skip_special_tokens=False)

    def token_id(self, piece: str) -> int:
        """Id of a vocabulary piece; KeyError naming the piece if absent."""
        i = self._tok.token_to_id(piece)
        if i is None:
            raise KeyError(f"piece {piece!r} is not in the tokenizer vocabulary")
        return i

    def id_to_piece(self, i: int) -> str:
        return self._tok.id_to_token(int(i))

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text the checkpoint's chat template renders for `messages` ([{"role", "content"}])."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        template = _template_env().from_string(self.chat_template)
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=self.bos_token or "", eos_token=self.eos_token)

    def to_transformers(self):
        """The same tokenizer as a `transformers.PreTrainedTokenizerFast` (needs transformers: the [hf] extra)."""
        from transformers import PreTrainedTokenizerFast
        return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(self._tok.to_str()),
                                       eos_token=self.eos_token, pad_token=self.pad_token, bos_token=self.bos_token,
                                       chat_template=self.chat_template)
