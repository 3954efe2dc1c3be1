"""Tests for nemocascade.data: domain registry, procedural math + imperfect teacher, tfds build, grain pipelines."""

import json
import pickle
import re

import numpy as np
import pytest

from nemocascade import chat
from nemocascade.data import math as dmath
from nemocascade.data import domains, pipeline

SPECIALS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")


class CharTokenizer:
    """Char-level fake with the real tokenizer's interface: pad 0, specials 1..4, chars ord+10."""

    pad_id = 0
    eos_id = 2  # "<|im_end|>"

    def encode(self, text):
        ids, i = [], 0
        while i < len(text):
            for k, sp in enumerate(SPECIALS):
                if text.startswith(sp, i):
                    ids.append(k + 1)
                    i += len(sp)
                    break
            else:
                ids.append(ord(text[i]) + 10)
                i += 1
        return ids

    def decode(self, ids):
        return "".join(SPECIALS[t - 1] if t <= 4 else chr(t - 10) for t in ids if t != 0)


TOK = CharTokenizer()


def _record(i, prompt="1+2", reasoning="r", response="\\boxed{3}"):
    return {"domain": "math", "prompt": prompt, "reasoning": reasoning, "response": response,
            "answer": "3", "id": f"t/{i}"}


# ----------------------------------------------------------------------------- domains


def test_get_domain_unknown_lists_known():
    assert domains.get_domain("math").name == "math"
    with pytest.raises(KeyError, match=r"unknown domain 'chess'; known domains: \[.*'math'"):
        domains.get_domain("chess")


def test_register_refuses_duplicates_and_validates_records():
    spec = domains.Domain("math", dmath.generate, domains.verifier("math"))
    with pytest.raises(ValueError, match="'math' is already registered"):
        domains.register(spec)
    bad = dict(_record(0), answer=3)
    with pytest.raises(ValueError, match=r"row 7: field 'answer' must be str"):
        domains.validate_record(bad, 7)
    missing = {k: v for k, v in _record(0).items() if k != "reasoning"}
    with pytest.raises(ValueError, match=r"row 0: .*missing \['reasoning'\]"):
        domains.validate_record(missing)


def test_split_of_matches_blake2b_reference():
    import hashlib

    keys = [f"+:{a}:{b}" for a in range(60) for b in range(60)]
    h = [int(hashlib.blake2b(k.encode(), digest_size=8).hexdigest(), 16) % 10 for k in keys]
    ref = ["test" if v == 0 else "val" if v == 1 else "train" for v in h]
    got = [domains.split_of(k, 10) for k in keys]
    assert got == ref
    assert 0.08 < got.count("test") / len(keys) < 0.12 and 0.08 < got.count("val") / len(keys) < 0.12


# ----------------------------------------------------------------------------- math traces


@pytest.mark.parametrize("problem,forget,reasoning", [
    (dmath.Problem("+", 23, 48), False, "3+8=11, write 1 carry 1; 2+4+1=7, write 7; so 23+48=71"),
    (dmath.Problem("+", 23, 48), True, "3+8=11, write 1; 2+4=6, write 6; so 23+48=61"),
    (dmath.Problem("+", 95, 7), False, "5+7=12, write 2 carry 1; 9+0+1=10, write 10; so 95+7=102"),
    (dmath.Problem("+", 50, 60), True, "0+0=0, write 0; 5+6=11, write 11; so 50+60=110"),
    (dmath.Problem("-", 52, 48), False, "12-8=4, write 4 borrow 1; 5-4-1=0, write 0; so 52-48=4"),
    (dmath.Problem("-", 52, 48), True, "12-8=4, write 4; 5-4=1, write 1; so 52-48=14"),
    (dmath.Problem("-", 105, 7), False,
     "15-7=8, write 8 borrow 1; 10-0-1=9, write 9 borrow 1; 1-0-1=0, write 0; so 105-7=98"),
    (dmath.Problem("-", 23, 48), False,
     "23<48, swap: 48-23; 8-3=5, write 5; 4-2=2, write 2; so 23-48=-25"),
    (dmath.Problem("*", 23, 7), False, "3*7=21, write 1 carry 2; 2*7+2=16, write 16; so 23*7=161"),
    (dmath.Problem("*", 23, 7), True, "3*7=21, write 1; 2*7=14, write 14; so 23*7=141"),
])
def test_solve_hand_worked(problem, forget, reasoning):
    got, result = dmath.solve(problem, forget_carry=forget)
    assert got == reasoning
    assert result == int(reasoning.rsplit("=", 1)[1])


def _ref_first_carry(op, a, b):
    """Independent reference: (column index j of the first inter-column carry/borrow, its size) or None.

    A carry leaves column j (not the last) iff the low j+1 digits overflow (add, mul) or the low
    j+1 digits of a are smaller than those of b (subtraction with a >= b).
    """
    if op == "-" and a < b:
        a, b = b, a
    width = max(len(str(a)), len(str(b)))
    for j in range(width - 1):
        m = 10 ** (j + 1)
        if op == "-" and a % m < b % m:
            return j, 1
        low = a % m + b % m if op == "+" else (a % m) * b
        if op != "-" and low >= m:
            return j, low // m
    return None


def _ref_teacher_answer(op, a, b, forget):
    """What the teacher writes: the truth, or the truth shifted by the dropped carry at 10^(j+1)."""
    truth = {"+": a + b, "-": a - b, "*": a * b}[op]
    first = _ref_first_carry(op, a, b)
    if not forget or first is None:
        return truth
    j, c = first
    shift = c * 10 ** (j + 1)
    if op == "-":
        return truth + shift if a >= b else truth - shift  # negative results: |a-b| is off
    return truth - shift


def _parse(record):
    op, a, b = record["id"].rsplit("/", 1)[1].split(":")
    boxed = int(re.fullmatch(r"The answer is \\boxed\{(-?\d+)\}\.", record["response"]).group(1))
    final = int(record["reasoning"].rsplit("=", 1)[1])
    return op, int(a), int(b), boxed, final


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_teacher_error_extremes(rate):
    rng = np.random.default_rng(1)
    records = dmath.generate(rng, 3000, teacher_error_rate=rate, allow_negative=True, split=None)
    n_carry = 0
    for r in records:
        op, a, b, boxed, final = _parse(r)
        carry = _ref_first_carry(op, a, b) is not None
        n_carry += carry
        assert r["answer"] == str({"+": a + b, "-": a - b, "*": a * b}[op]), r
        assert boxed == final == _ref_teacher_answer(op, a, b, forget=rate == 1.0), r
        if rate == 1.0:
            assert (boxed != int(r["answer"])) == carry, r
    assert 0.3 < n_carry / len(records) < 0.8  # both kinds are well represented


def test_teacher_error_is_the_mode_at_0_6():
    records = dmath.generate(np.random.default_rng(2), 4000, teacher_error_rate=0.6)
    wrong = [_parse(r)[3] != int(r["answer"]) for r in records
             if _ref_first_carry(*_parse(r)[:3]) is not None]
    assert len(wrong) > 1500
    assert abs(np.mean(wrong) - 0.6) < 0.04


def test_generate_is_deterministic_with_unique_ids_and_word_problems():
    a = dmath.generate(np.random.default_rng(3), 500, teacher_error_rate=0.5)
    b = dmath.generate(np.random.default_rng(3), 500, teacher_error_rate=0.5)
    assert a == b
    assert len({r["id"] for r in a}) == 500
    words = [r for r in a if "/word/" in r["id"]]
    assert 50 < len(words) < 150  # default weight 0.2
    for r in words:  # the prompt's numbers are the problem's operands
        op, x, y, _, _ = _parse(r)
        assert str(x) in r["prompt"] and str(y) in r["prompt"]
        assert r["reasoning"].startswith(f"{x}{op}{y}: ")


def test_instruction_is_appended_and_changes_nothing_else():
    plain = dmath.generate(np.random.default_rng(4), 20, teacher_error_rate=0.6)
    told = dmath.generate(np.random.default_rng(4), 20, teacher_error_rate=0.6, instruction="Box it.")
    assert [r["prompt"] + " Box it." for r in plain] == [r["prompt"] for r in told]
    drop = lambda r: {k: v for k, v in r.items() if k != "prompt"}  # noqa: E731
    assert [drop(r) for r in plain] == [drop(r) for r in told]


def test_family_weights_and_option_errors():
    ab = dmath.generate(np.random.default_rng(0), 30, families={"add": 1, "mul": 2})
    assert ab == dmath.generate(np.random.default_rng(0), 30, families={"mul": 2, "add": 1})
    mul = dmath.generate(np.random.default_rng(0), 50, families={"mul": 1.0})
    assert all(re.fullmatch(r"What is \d{1,2}\*[2-9]\?", r["prompt"]) for r in mul)
    small = dmath.generate(np.random.default_rng(0), 200, families={"add": 1}, max_digits=1)
    assert {len(r["prompt"]) for r in small} == {len("What is 1+2?")}
    with pytest.raises(ValueError, match=r"unknown math families \['div'\]"):
        dmath.generate(np.random.default_rng(0), 1, families={"div": 1.0})
    with pytest.raises(ValueError, match="teacher_error_rate must be in"):
        dmath.generate(np.random.default_rng(0), 1, teacher_error_rate=1.5)
    with pytest.raises(ValueError, match="max_digits must be in"):
        dmath.generate(np.random.default_rng(0), 1, max_digits=0)


def test_train_val_test_disjoint_by_problem():
    splits = {s: domains.generate_split("math", s, n, seed=0) for s, n in (("train", 4000), ("val", 600),
                                                                          ("test", 600))}
    key = lambda r: r["id"].rsplit("/", 1)[1]  # noqa: E731
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not {key(r) for r in splits[a]} & {key(r) for r in splits[b]}, (a, b)
        assert not {r["prompt"] for r in splits[a]} & {r["prompt"] for r in splits[b]}, (a, b)
    for s, records in splits.items():
        assert all(domains.split_of(key(r)) == s for r in records)
        assert all(r["id"].startswith(f"math/{s}/") for r in records)


def test_rendered_examples_fit_a_small_context():
    records = domains.generate_split("math", "train", 2000, seed=0)
    lengths = [len(TOK.encode(chat.render_prompt(r["prompt"])
                              + chat.render_completion(r["reasoning"], r["response"])))
               for r in records]
    assert max(lengths) <= 180  # char-level; a SentencePiece tokenizer makes it shorter


# ----------------------------------------------------------------------------- pipeline


def test_encode_example_hand_counted():
    # prompt "<|im_start|>user\n1+2<|im_end|>\n<|im_start|>assistant\n<think>\n":
    #   1 + len("user\n")=5 + 3 + 1 + 1 + 1 + len("assistant\n")=10 + 1 + 1 = 24 tokens
    # completion "r\n</think>\n\\boxed{3}<|im_end|>": 1 + 1 + 1 + 1 + 9 + 1 = 14 tokens
    c = lambda s: [ord(ch) + 10 for ch in s]  # noqa: E731
    prompt = [1, *c("user\n1+2"), 2, *c("\n"), 1, *c("assistant\n"), 3, *c("\n")]
    completion = [*c("r\n"), 4, *c("\n\\boxed{3}"), 2]
    assert (len(prompt), len(completion)) == (24, 14)

    ex = pipeline.encode_example(_record(0), TOK, seq_len=48)
    assert ex["tokens"].dtype == np.int32 and ex["loss_mask"].dtype == np.float32
    np.testing.assert_array_equal(ex["tokens"], prompt + completion + [0] * 10)
    np.testing.assert_array_equal(ex["loss_mask"], [0] * 24 + [1] * 14 + [0] * 10)
    assert TOK.decode(ex["tokens"][ex["loss_mask"] == 1]) == "r\n</think>\n\\boxed{3}<|im_end|>"

    cut = pipeline.encode_example(_record(0), TOK, seq_len=30)
    np.testing.assert_array_equal(cut["tokens"], (prompt + completion)[:30])
    np.testing.assert_array_equal(cut["loss_mask"], [0] * 24 + [1] * 6)


def test_sft_dataset_batches_masks_and_epoch_coverage():
    source = [_record(i, prompt=f"q{i}", reasoning=f"step {i}", response=f"\\boxed{{{i}}}")
              for i in range(12)]
    it = iter(pipeline.sft_dataset(source, TOK, seq_len=64, batch_size=4, seed=0))
    seen = []
    for _ in range(3):  # exactly one epoch
        batch = next(it)
        assert batch["tokens"].shape == (4, 64) and batch["tokens"].dtype == np.int32
        assert batch["loss_mask"].shape == (4, 64) and batch["loss_mask"].dtype == np.float32
        for toks, mask in zip(batch["tokens"], batch["loss_mask"]):
            i = int(re.search(r"user\nq(\d+)<", TOK.decode(toks)).group(1))
            seen.append(i)
            assert TOK.decode(toks[mask == 1]) == f"step {i}\n</think>\n\\boxed{{{i}}}<|im_end|>"
            n_prompt = len(TOK.encode(chat.render_prompt(source[i]["prompt"])))
            assert mask[:n_prompt].sum() == 0 and mask[n_prompt] == 1
            assert (toks[mask == 0][n_prompt:] == 0).all()  # the rest is padding
    assert sorted(seen) == list(range(12))


def test_sft_dataset_resume_is_exact():
    source = [_record(i, prompt=f"q{i}") for i in range(10)]  # batches straddle epochs
    ds = pipeline.sft_dataset(source, TOK, seq_len=40, batch_size=4, seed=5)
    it = iter(ds)
    for _ in range(3):
        next(it)
    state = it.get_state()
    state = json.loads(json.dumps(state))  # JSON round trip, as a checkpoint would do
    expected = [next(it) for _ in range(4)]
    resumed = iter(pipeline.sft_dataset(source, TOK, seq_len=40, batch_size=4, seed=5))
    resumed.set_state(state)
    for want in expected:
        got = next(resumed)
        np.testing.assert_array_equal(got["tokens"], want["tokens"])
        np.testing.assert_array_equal(got["loss_mask"], want["loss_mask"])


def test_prompt_dataset_lists_resume_and_seed():
    source = [_record(i) for i in range(9)]
    it = iter(pipeline.prompt_dataset(source, batch_size=3, seed=1))
    first_epoch = [next(it) for _ in range(3)]
    assert all(isinstance(b, list) and len(b) == 3 for b in first_epoch)
    assert sorted(r["id"] for b in first_epoch for r in b) == sorted(r["id"] for r in source)
    state = json.loads(json.dumps(it.get_state()))
    expected = [[r["id"] for r in next(it)] for _ in range(5)]
    again = iter(pipeline.prompt_dataset(source, batch_size=3, seed=1))
    again.set_state(state)
    assert [[r["id"] for r in next(again)] for _ in range(5)] == expected
    same_seed = iter(pipeline.prompt_dataset(source, batch_size=3, seed=1))
    assert [r["id"] for r in next(same_seed)] == [r["id"] for r in first_epoch[0]]


def test_encode_prompts_left_pads_and_names_long_row():
    tokens, lengths = pipeline.encode_prompts(TOK, ["a", "bcd"], max_len=30)
    # chat overhead around the user text is 21 tokens (see test_encode_example_hand_counted)
    np.testing.assert_array_equal(lengths, [22, 24])
    assert tokens.dtype == np.int32 and lengths.dtype == np.int32
    np.testing.assert_array_equal(tokens[0, :8], 0)
    np.testing.assert_array_equal(tokens[0, 8:], TOK.encode(chat.render_prompt("a")))
    np.testing.assert_array_equal(tokens[1, :6], 0)
    assert tokens[1, 6] == 1 and tokens[1, -1] == ord("\n") + 10
    with pytest.raises(ValueError, match=r"prompt row 1 needs 31 tokens > max_len=30"):
        pipeline.encode_prompts(TOK, ["a", "x" * 10], max_len=30)


def test_encode_prompts_bucket_pads_to_a_multiple_of_it_at_most_max_len():
    full, lengths = pipeline.encode_prompts(TOK, ["a", "bcd"], max_len=60)
    for bucket, width in ((8, 24), (16, 32), (25, 25), (32, 32), (64, 60)):  # longest prompt: 24 tokens
        tokens, lens = pipeline.encode_prompts(TOK, ["a", "bcd"], max_len=60, bucket=bucket)
        assert tokens.shape == (2, width), bucket
        np.testing.assert_array_equal(lens, lengths)
        np.testing.assert_array_equal(tokens, full[:, 60 - width:])  # the same rows, less left padding


# ----------------------------------------------------------------------------- tfds round trip

OPTS = {"teacher_error_rate": 0.6, "max_digits": 2}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from nemocascade.data import tfds_builder

    data_dir = str(tmp_path_factory.mktemp("tfds"))
    return data_dir, tfds_builder.prepare("math", data_dir, 60, 20, seed=3, **OPTS)


def test_tfds_round_trip_equals_generator(built):
    _, sources = built
    for split, n in (("train", 60), ("val", 20), ("test", 20)):
        src = sources[split]
        assert len(src) == n
        got = [src[i] for i in range(n)]
        assert got == domains.generate_split("math", split, n, seed=3, **OPTS)
        assert all(type(v) is str for r in got for v in r.values())
        assert src.__getitems__([2, 0]) == [got[2], got[0]]
        reopened = pickle.loads(pickle.dumps(src))  # what a grain worker process receives
        assert [reopened[i] for i in range(n)] == got
        assert repr(reopened) == repr(src)
        assert re.fullmatch(rf"RecordSource\(math_[0-9a-f]{{12}}/{split}, n={n}\)", repr(src))


def test_tfds_cache_reused_and_keyed_by_config(built, monkeypatch):
    from nemocascade.data import tfds_builder

    data_dir, sources = built
    a = tfds_builder.domain_config("math", 60, 20, 3, max_digits=2, teacher_error_rate=0.6)
    assert a.name == tfds_builder.domain_config("math", 60, 20, 3, **OPTS).name
    assert re.fullmatch(r"math_[0-9a-f]{12}", a.name)
    others = [tfds_builder.domain_config("math", 60, 20, 4, **OPTS),
              tfds_builder.domain_config("math", 61, 20, 3, **OPTS),
              tfds_builder.domain_config("math", 60, 20, 3, teacher_error_rate=0.5, max_digits=2)]
    assert len({a.name, *(c.name for c in others)}) == 4

    def boom(*args, **kwargs):
        raise AssertionError("regenerated a cached dataset")

    monkeypatch.setattr(tfds_builder, "generate_split", boom)
    again = tfds_builder.prepare("math", data_dir, 60, 20, seed=3, **OPTS)  # reuses files
    assert again["test"][5] == sources["test"][5]
    with pytest.raises(AssertionError, match="regenerated"):  # a new config does build
        tfds_builder.prepare("math", data_dir, 60, 20, seed=4, **OPTS)


def test_tfds_errors_and_pipeline_over_source(built):
    from nemocascade.data import tfds_builder

    data_dir, sources = built
    with pytest.raises(KeyError, match="known domains"):
        tfds_builder.prepare("chess", data_dir, 5, 5, seed=0)
    with pytest.raises(TypeError, match="'families'"):
        tfds_builder.domain_config("math", 5, 5, 0, families={1.0})
    batch = next(iter(pipeline.sft_dataset(sources["train"], TOK, 200, batch_size=8, seed=0)))
    assert batch["tokens"].shape == (8, 200)
    # Every row is a real record: its completion decodes to one of the train completions.
    completions = {f"{r['reasoning']}\n</think>\n{r['response']}<|im_end|>"
                   for r in (sources["train"][i] for i in range(60))}
    for toks, mask in zip(batch["tokens"], batch["loss_mask"]):
        assert TOK.decode(toks[mask == 1]) in completions


def test_pad_to_bucket_rounds_up_to_the_bucket_and_stops_at_most():
    pad_to_bucket = pipeline.pad_to_bucket
    assert [pad_to_bucket(n, 32) for n in (0, 1, 32, 33, 64)] == [0, 32, 32, 64, 64]
    assert pad_to_bucket(70, 32, most=80) == 80 and pad_to_bucket(70, 32, most=100) == 96
    tokens = np.arange(2 * 48).reshape(2, 48)  # left-padded rows of width 48, longest prompt 17 tokens
    cut, lengths = pipeline.bucket_left_padded(tokens, np.array([17, 3]), 16)
    assert cut.shape == (2, 32) and (cut == tokens[:, 16:]).all() and lengths.tolist() == [17, 3]
