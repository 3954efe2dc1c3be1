"""Tokenizer contract: id layout, single-id specials, digit splitting, exact round-trip of arbitrary text,
pickling, and load_or_train caching / atomic writes. Tokenizers are trained here on a synthetic corpus."""

import os
import pickle
import random

import numpy as np
import pytest

from nemocascade import tokenizer as tokenizer_lib
from nemocascade.tokenizer import Tokenizer, load_or_train, train_tokenizer

SPECIALS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def synthetic_corpus(n=1500, seed=0):
    """Chat-like and code-like texts. "12345" and "2024" are very frequent, so BPE *would* merge them
    into multi-digit pieces without split_digits."""
    rng = random.Random(seed)
    words = "the cat sat on a mat and then we add numbers to get an answer".split()
    texts = []
    for i in range(n):
        body = " ".join(rng.choices(words, k=rng.randint(3, 12)))
        if i % 3 == 0:
            texts.append(f"<|im_start|>user\n{body} 12345 2024<|im_end|>\n<think>\n{body}\n</think>\n")
        elif i % 3 == 1:
            texts.append(f"def f(x):\n    return x + {rng.randint(0, 999)}\n\n  {body}")
        else:
            texts.append(f"{body}. 12345 + 2024 = 14369")
    return texts


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer(synthetic_corpus(), str(tmp_path_factory.mktemp("tok") / "sp"), vocab_size=320)


def test_id_layout(tok):
    assert tok.vocab_size == 320
    assert (tok.pad_id, tok.bos_id, tok.sp_eos_id) == (0, 2, 3)
    assert tok.id_to_piece(0) == "<pad>" and tok.id_to_piece(1) == "<unk>"
    # User symbols follow the 4 control pieces in declaration order; eos is <|im_end|>, not </s>.
    assert [tok.token_id(s) for s in SPECIALS + ["\n"]] == [4, 5, 6, 7, 8]
    assert tok.eos_id == 5 != tok.sp_eos_id
    assert tok.token_id("<0x00>") == 9 and tok.token_id("<0xFF>") == 264


@pytest.mark.parametrize("special", SPECIALS)
def test_specials_are_single_unmerged_ids(tok, special):
    sid = tok.token_id(special)
    assert tok.encode(special) == [sid]
    # Glued to letters, digits, spaces and other specials it is still exactly one id, never merged.
    for left, right in [("abc", "def"), ("1", "2"), (" ", " "), ("<think>", "</think>"), ("\n", "<")]:
        assert tok.encode(left + special + right) == tok.encode(left) + [sid] + tok.encode(right)
    # A partial special is not the special.
    assert sid not in tok.encode(special[:-1])


def test_digits_are_split(tok):
    ids = tok.encode("12345")
    assert [tok.id_to_piece(i) for i in ids] == ["1", "2", "3", "4", "5"]
    ids = tok.encode("x = 2024")
    assert [tok.id_to_piece(i) for i in ids][-4:] == ["2", "0", "2", "4"]


def test_newline_is_one_id(tok):
    nl = tok.token_id("\n")
    assert tok.encode("a\n\nb") == tok.encode("a") + [nl, nl] + tok.encode("b")


def test_byte_fallback_for_unseen_characters(tok):
    # "日" = UTF-8 E6 97 A5; never seen in the corpus, so it is spelled as three byte pieces.
    assert [tok.id_to_piece(i) for i in tok.encode("日")] == ["<0xE6>", "<0x97>", "<0xA5>"]
    # SentencePiece's own whitespace marker "▁" (E2 96 81) would decode as a space; we spell it in bytes.
    assert [tok.id_to_piece(i) for i in tok.encode("▁")] == ["<0xE2>", "<0x96>", "<0x81>"]


ROUND_TRIP = [
    "",
    "hello world",
    "  two leading spaces and trailing  ",
    "line one\nline two\n\n\nafter blank lines\n",
    "\n\nstarts with newlines",
    "def f(x):\n    if x:\n\treturn 1\r\n",
    "<|im_start|>user\nWhat is 12345 + 2024?<|im_end|>\n<|im_start|>assistant\n<think>\n",
    "reason\n</think>\n\\boxed{14369}<|im_end|>",
    "unicode: naïve café — 日本語 😀 Ω≈ç√",
    "literal control names <s> </s> <pad> <unk> <0x41> stay text",
    "a▁b ▁▁ c▁",
    "   ",
    "\n",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_decode_drops_pad_and_takes_arrays(tok):
    text = "a cat\n 12"
    ids = tok.encode(text)
    padded = [tok.pad_id] + ids + [tok.pad_id] * 3
    assert tok.decode(padded) == text
    assert tok.decode(np.asarray(padded, np.int32)) == text
    assert tok.decode(np.asarray(ids, np.int64)) == text
    assert tok.decode([]) == ""


def test_decode_and_token_id_errors_name_the_bad_value(tok):
    with pytest.raises(ValueError, match="id 320 is outside"):
        tok.decode([5, 320])
    with pytest.raises(ValueError, match="id -1 is outside"):
        tok.decode(np.array([-1, 5]))
    with pytest.raises(ValueError, match="1-D"):
        tok.decode(np.zeros((2, 2), np.int32))
    with pytest.raises(KeyError, match="<tool_call>"):
        tok.token_id("<tool_call>")
    assert tok.token_id("<unk>") == 1  # the unk piece itself is present


def test_pickle_round_trip(tok):
    clone = pickle.loads(pickle.dumps(tok))
    assert isinstance(clone, Tokenizer)
    assert (clone.vocab_size, clone.pad_id, clone.eos_id, clone.bos_id, clone.sp_eos_id) == (
        tok.vocab_size, tok.pad_id, tok.eos_id, tok.bos_id, tok.sp_eos_id)
    for text in ROUND_TRIP:
        assert clone.encode(text) == tok.encode(text)


def test_train_tokenizer_writes_prefix_model(tmp_path):
    texts = synthetic_corpus(300)
    tok = train_tokenizer(iter(texts), str(tmp_path / "deep" / "dir" / "m"), vocab_size=300)
    assert sorted(os.listdir(tmp_path / "deep" / "dir")) == ["m.model"]  # no .vocab, no temp files
    loaded = Tokenizer(str(tmp_path / "deep" / "dir" / "m.model"))
    for text in texts[:20]:
        assert loaded.encode(text) == tok.encode(text)


def test_unigram_keeps_the_contract(tmp_path):
    tok = train_tokenizer(synthetic_corpus(300), str(tmp_path / "u"), vocab_size=300, model_type="unigram")
    assert [tok.encode(s) for s in SPECIALS] == [[4], [5], [6], [7]]
    assert [tok.id_to_piece(i) for i in tok.encode("2024")] == ["2", "0", "2", "4"]
    for text in ROUND_TRIP:
        assert tok.decode(tok.encode(text)) == text


def test_small_corpus_large_vocab_does_not_error(tmp_path):
    # hard_vocab_limit=False: a tiny corpus yields fewer pieces than asked for (265 ids are bytes+specials).
    tok = train_tokenizer(["a b c", "ab ab abc"], str(tmp_path / "s"), vocab_size=4096)
    assert 265 < tok.vocab_size < 4096
    assert tok.decode(tok.encode("abc\n<think>")) == "abc\n<think>"


def test_bad_training_inputs(tmp_path):
    with pytest.raises(ValueError, match="vocab_size=270 is too small"):
        train_tokenizer(synthetic_corpus(300), str(tmp_path / "x"), vocab_size=270)
    with pytest.raises(ValueError, match="model_type='wordpiece'"):
        train_tokenizer(["a"], str(tmp_path / "x"), vocab_size=300, model_type="wordpiece")
    with pytest.raises(TypeError, match="corpus item 1 is bytes"):
        train_tokenizer(["a", b"b"], str(tmp_path / "x"), vocab_size=300)
    assert not os.path.exists(tmp_path / "x.model")


def test_load_or_train_caches(tmp_path):
    path = str(tmp_path / "run" / "tokenizer" / "sp.model")
    calls = []

    def corpus():
        calls.append(1)
        return synthetic_corpus(300)

    first = load_or_train(path, corpus, vocab_size=300)
    assert calls == [1] and os.path.exists(path)
    assert os.listdir(os.path.dirname(path)) == ["sp.model"]
    mtime = os.stat(path).st_mtime_ns

    def no_corpus():
        raise AssertionError("load_or_train retrained although the model was cached")

    second = load_or_train(path, no_corpus, vocab_size=300)
    assert os.stat(path).st_mtime_ns == mtime
    for text in ROUND_TRIP:
        assert second.encode(text) == first.encode(text)
    with pytest.raises(ValueError, match=r"\(300, 'bpe'\), requested \(400, 'bpe'\)"):
        load_or_train(path, no_corpus, vocab_size=400)
    with pytest.raises(ValueError, match="requested \\(300, 'unigram'\\)"):
        load_or_train(path, no_corpus, vocab_size=300, model_type="unigram")


def test_load_or_train_interrupted_leaves_no_model(tmp_path, monkeypatch):
    path = tmp_path / "sp.model"

    def crash(src, dst):
        raise KeyboardInterrupt  # killed between writing the temp file and publishing it

    monkeypatch.setattr(tokenizer_lib.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        load_or_train(str(path), lambda: synthetic_corpus(300), vocab_size=300)
    assert os.listdir(tmp_path) == []  # neither a half-written model nor a stray temp file
    monkeypatch.undo()
    tok = load_or_train(str(path), lambda: synthetic_corpus(300), vocab_size=300)
    assert tok.decode(tok.encode("ok\n")) == "ok\n"


def test_load_or_train_resumes_a_tokenizer_with_fewer_pieces_than_requested(tmp_path):
    """A small corpus fills fewer pieces than requested (hard_vocab_limit off): the cached file is still the one that
    request trained, so a resumed run loads it; another request is still refused."""
    path = str(tmp_path / "sp.model")
    tok = load_or_train(path, lambda: synthetic_corpus(40), vocab_size=3000)
    assert tok.vocab_size < 3000

    def no_corpus():
        raise AssertionError("retrained")

    assert load_or_train(path, no_corpus, vocab_size=3000).vocab_size == tok.vocab_size
    with pytest.raises(ValueError, match="requested \\(3100, 'bpe'\\)"):
        load_or_train(path, no_corpus, vocab_size=3100)
