"""SentencePiece tokenizer trained on the run's own corpus at first use and cached next to the run.

No tokenizer is ever downloaded: `load_or_train(path, corpus, vocab_size)` loads `path` if it exists, else
trains on `corpus()` and writes the model atomically. Teachers in MOPD are checkpoints of the same run,
so they share this tokenizer by construction (METHOD.md "MOPD").

Vocabulary layout and the contract every model/sampler relies on:
  * id 0 = `<pad>` (dropped by `decode`), 1 = `<unk>`, 2 = `<s>` (bos), 3 = `</s>` (`sp_eos_id`);
  * `<|im_start|>`, `<|im_end|>`, `<think>`, `</think>` and "\\n" are user-defined symbols: each always
    encodes to exactly one id, never merged with its neighbours, wherever it appears in the text;
  * `eos_id` is the id of `<|im_end|>`: the chat turn terminator the sampler stops on, not `</s>`;
  * digits are split one per token (`split_digits`) so numbers are spelled digit by digit for arithmetic;
  * the 256 byte pieces (`byte_fallback`) cover any character the vocabulary lacks, and whitespace is kept
    as is (identity normalisation, no dummy prefix, no whitespace collapsing), so
    `decode(encode(s)) == s` for every str s. The one character SentencePiece itself cannot round-trip is
    its own whitespace marker U+2581 "▁" (it decodes to a space); `encode` spells it as its UTF-8 bytes.

Because the byte pieces and specials take 265 ids, `vocab_size` must be above 265 plus the number of
distinct characters the corpus keeps (about 300 for ASCII text). With `hard_vocab_limit=False` a small
corpus may yield fewer pieces than requested: size embeddings from `Tokenizer.vocab_size`.
"""

import os
from collections.abc import Callable, Iterable, Iterator
from io import BytesIO
from typing import Protocol, runtime_checkable

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from nemocascade import files
from nemocascade.files import atomic_write
from nemocascade.chat import SPECIAL_TOKENS

# "\n" is a symbol of its own: SentencePiece's trainer treats input as lines, and a newline piece that can
# never merge keeps multi-line text (code, reasoning) exact and lets us train on lines (see `_lines`).
USER_SYMBOLS = (*SPECIAL_TOKENS, "\n")
PAD_ID, UNK_ID, BOS_ID, SP_EOS_ID = 0, 1, 2, 3
_SPACE_MARK = "\u2581"  # SentencePiece's internal whitespace marker "▁"
_MAX_LINE_BYTES = 1 << 16  # longer lines are skipped by the trainer (default 4192 would drop long code)


@runtime_checkable
class TextTokenizer(Protocol):
    """What pipelines, sampler and evaluation use of a tokenizer. Our SentencePiece `Tokenizer` and a real
    checkpoint's vocabulary (`nemocascade.hf_tokenizer.HFTokenizer`) both provide it."""
    vocab_size: int
    pad_id: int
    eos_id: int  # the id generation stops on

    def encode(self, text: str) -> list[int]: ...  # no bos/eos added

    def decode(self, ids) -> str: ...

    def token_id(self, piece: str) -> int: ...

    def id_to_piece(self, i: int) -> str: ...


class Tokenizer:
    """A loaded SentencePiece model with the chat special tokens (see module docstring for the contract)."""

    def __init__(self, model_path: str):
        self._load(files.read_bytes(model_path))

    @classmethod
    def from_serialized(cls, proto: bytes) -> "Tokenizer":
        """Build from serialized ModelProto bytes (what `load_or_train` writes to disk)."""
        tok = cls.__new__(cls)
        tok._load(proto)
        return tok

    def _load(self, proto: bytes) -> None:
        self._proto = proto
        self._sp = spm.SentencePieceProcessor(model_proto=proto)
        self.vocab_size: int = self._sp.vocab_size()
        self.pad_id: int = self._sp.pad_id()
        self.bos_id: int = self._sp.bos_id()
        self.sp_eos_id: int = self._sp.eos_id()
        missing = [p for p in USER_SYMBOLS if self._sp.piece_to_id(p) == self._sp.unk_id()]
        if missing or (self.pad_id, self.bos_id, self.sp_eos_id) != (PAD_ID, BOS_ID, SP_EOS_ID):
            raise ValueError(
                f"not a nemocascade tokenizer: missing user symbols {missing}, pad/bos/eos ids "
                f"{(self.pad_id, self.bos_id, self.sp_eos_id)} (expected {(PAD_ID, BOS_ID, SP_EOS_ID)})")
        # The sampler stops on the end of the assistant turn, not on SentencePiece's </s>.
        self.eos_id: int = self.token_id(SPECIAL_TOKENS[1])
        self._marker_bytes = [self.token_id(f"<0x{b:02X}>") for b in _SPACE_MARK.encode()]

    # Picklable through the model bytes, so grain worker processes can receive a Tokenizer.
    def __getstate__(self) -> dict:
        return {"proto": self._proto}

    def __setstate__(self, state: dict) -> None:
        self._load(state["proto"])

    def serialized(self) -> bytes:
        """The serialized ModelProto (identical to the .model file contents)."""
        return self._proto

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; no bos/eos added (the chat template carries its own markers)."""
        if _SPACE_MARK not in text:
            return self._sp.encode(text)
        # A literal "▁" would come back as a space; spell it as its UTF-8 byte pieces instead.
        ids: list[int] = []
        for i, part in enumerate(text.split(_SPACE_MARK)):
            if i:
                ids.extend(self._marker_bytes)
            ids.extend(self._sp.encode(part))
        return ids

    def decode(self, ids) -> str:
        """Text of a 1-D sequence of ids (list, tuple or np array); pad ids are dropped."""
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(f"decode expects a 1-D sequence of int ids, got shape {arr.shape} "
                             f"dtype {arr.dtype}")
        bad = arr[(arr < 0) | (arr >= self.vocab_size)]
        if bad.size:
            raise ValueError(f"decode: id {int(bad[0])} is outside the vocabulary [0, {self.vocab_size})")
        return self._sp.decode([int(i) for i in arr if i != self.pad_id])

    def token_id(self, piece: str) -> int:
        """Id of a vocabulary piece, e.g. token_id("</think>"); KeyError naming the piece if absent."""
        i = self._sp.piece_to_id(piece)
        if i == self._sp.unk_id() and piece != self._sp.id_to_piece(i):
            raise KeyError(f"piece {piece!r} is not in the tokenizer vocabulary")
        return i

    def id_to_piece(self, i: int) -> str:
        """The vocabulary piece of id `i` (for debugging token streams)."""
        return self._sp.id_to_piece(int(i))


def _lines(texts: Iterable[str]) -> Iterator[str]:
    """Non-empty lines of every text. Nothing merges across "\\n" (a user symbol), so training on lines
    loses no statistics, and keeps long multi-line documents under the trainer's per-sentence limit."""
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"tokenizer corpus item {i} is {type(text).__name__}, expected str")
        yield from (line for line in text.split("\n") if line)


def _train_proto(texts: Iterable[str], vocab_size: int, model_type: str) -> bytes:
    """Train in memory (`sentence_iterator` in, `model_writer` out) and return the ModelProto bytes."""
    if model_type not in ("bpe", "unigram"):
        raise ValueError(f"model_type={model_type!r}: expected 'bpe' or 'unigram'")
    out, corpus_error = BytesIO(), []

    def sentences():
        # The trainer wraps exceptions raised inside the iterator into an opaque RuntimeError; stop the
        # iteration instead and re-raise the corpus's own error after the trainer returns.
        try:
            yield from _lines(texts)
        except Exception as e:  # noqa: BLE001 - re-raised below, unchanged
            corpus_error.append(e)

    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences(), model_writer=out, vocab_size=vocab_size,
            model_type=model_type, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=SP_EOS_ID,
            user_defined_symbols=list(USER_SYMBOLS), split_digits=True, byte_fallback=True,
            normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=False,
            allow_whitespace_only_pieces=True,  # runs of spaces (code indentation) may become one piece
            hard_vocab_limit=False, max_sentence_length=_MAX_LINE_BYTES,
            input_sentence_size=2_000_000, shuffle_input_sentence=True,  # caps trainer memory
            num_threads=os.cpu_count() or 1, minloglevel=2)
    except RuntimeError as e:
        if corpus_error:
            raise corpus_error[0] from None
        if "Vocabulary size is smaller than required_chars" in str(e):
            raise ValueError(f"vocab_size={vocab_size} is too small for this corpus: 256 byte pieces, "
                             f"{4 + len(USER_SYMBOLS)} specials and every kept character need an id ({e})"
                             ) from e
        raise
    if corpus_error:
        raise corpus_error[0]
    return out.getvalue()


def train_tokenizer(texts: Iterable[str], model_prefix: str, vocab_size: int,
                    model_type: str = "bpe") -> Tokenizer:
    """Train on `texts` (any iterable of str, consumed once) and write `{model_prefix}.model`."""
    proto = _train_proto(texts, vocab_size, model_type)
    atomic_write(model_prefix + ".model", proto)
    return Tokenizer.from_serialized(proto)


def load_or_train(path: str, corpus: Callable[[], Iterable[str]], vocab_size: int,
                  model_type: str = "bpe") -> Tokenizer:
    """Load the .model file at `path`, or train on `corpus()` and save it there first.

    `corpus` is only called when training is needed. A cached model trained with a different
    `vocab_size` or `model_type` raises instead of silently changing the model's vocabulary.
    """
    if files.exists(path):
        tok = Tokenizer(path)
        pb = sentencepiece_model_pb2
        spec = pb.ModelProto.FromString(tok.serialized()).trainer_spec
        cached = (spec.vocab_size, pb.TrainerSpec.ModelType.Name(spec.model_type).lower())
        if cached != (vocab_size, model_type.lower()):
            raise ValueError(f"cached tokenizer {path} was trained with (vocab_size, model_type)={cached}, "
                             f"requested ({vocab_size}, {model_type!r}); delete it or use another path")
        return tok
    proto = _requested(_train_proto(corpus(), vocab_size, model_type), vocab_size)
    atomic_write(path, proto)
    return Tokenizer.from_serialized(proto)


def _requested(proto: bytes, vocab_size: int) -> bytes:
    """`proto` with the requested vocab_size in its trainer spec (the trainer records the pieces it filled, fewer
    when the corpus is small), so a resumed run's request matches the cached file."""
    model = sentencepiece_model_pb2.ModelProto.FromString(proto)
    model.trainer_spec.vocab_size = vocab_size
    return model.SerializeToString()
