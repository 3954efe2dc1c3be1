"""Packed SFT rows (several examples per row): the model, the SFT step and the pipeline; SFT mixture weights.

The reference for each is the unpacked computation on the same examples (padded rows, one example per
row), which the rest of the suite pins against transformers and hand-counted masks.
"""
import collections
import functools
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nemocascade.data import pipeline
from nemocascade.models import transformer as tf
from nemocascade.stages import common, sft
from nemocascade import train_state

from test_data import TOK, _record

CFG = tf.ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64)


def _pack(seqs, masks, length):
    """Hand-packed row: the sequences back to back, then zero padding."""
    tokens = np.zeros(length, np.int32)
    loss_mask = np.zeros(length, np.float32)
    seg = np.zeros(length, np.int32)
    pos = np.zeros(length, np.int32)
    at = 0
    for k, (s, m) in enumerate(zip(seqs, masks)):
        tokens[at:at + len(s)], loss_mask[at:at + len(s)] = s, m
        seg[at:at + len(s)], pos[at:at + len(s)] = k + 1, np.arange(len(s))
        at += len(s)
    return tokens, loss_mask, seg, pos


def _examples(rng, lengths):
    seqs = [rng.integers(1, CFG.vocab_size, n).astype(np.int32) for n in lengths]
    masks = [np.r_[np.zeros(n // 2), np.ones(n - n // 2)].astype(np.float32) for n in lengths]
    return seqs, masks


def test_packed_forward_equals_each_sequence_alone():
    params = tf.init_params(CFG, jax.random.key(0))
    seqs, masks = _examples(np.random.default_rng(0), [5, 7, 3])
    tokens, _, seg, pos = _pack(seqs, masks, 18)
    packed = tf.forward(params, CFG, jnp.asarray(tokens[None]), positions=jnp.asarray(pos[None]),
                        segment_ids=jnp.asarray(seg[None]))[0]
    at = 0
    for s in seqs:
        alone = tf.forward(params, CFG, jnp.asarray(s[None]))[0]
        np.testing.assert_allclose(packed[at:at + len(s)], alone, atol=2e-5, rtol=0)
        at += len(s)
    # without segment ids the second sequence would see the first: the mask is what isolates them
    leaky = tf.forward(params, CFG, jnp.asarray(tokens[None]), positions=jnp.asarray(pos[None]))[0]
    assert np.abs(np.asarray(leaky[5:12]) - np.asarray(packed[5:12])).max() > 1e-3


def test_packed_sft_step_equals_unpacked_step():
    """Same examples, two layouts: one per padded row, or packed two rows; the token-mean loss, its
    gradient and hence the update are the same."""
    seqs, masks = _examples(np.random.default_rng(1), [6, 9, 4, 7])
    L = 16
    unpacked = {"tokens": np.zeros((4, L), np.int32), "loss_mask": np.zeros((4, L), np.float32)}
    for b, (s, m) in enumerate(zip(seqs, masks)):
        unpacked["tokens"][b, :len(s)], unpacked["loss_mask"][b, :len(s)] = s, m
    rows = [_pack(seqs[:2], masks[:2], L), _pack(seqs[2:], masks[2:], L)]
    packed = {k: np.stack([r[i] for r in rows]) for i, k in enumerate(("tokens", "loss_mask", "segment_ids",
                                                                       "positions"))}
    tx = optax.sgd(0.1)
    params = tf.init_params(CFG, jax.random.key(1))
    out = {}
    for name, batch in (("unpacked", unpacked), ("packed", packed)):
        state = train_state.create(params, tx, jax.random.key(0))
        step = train_state.make_step(functools.partial(sft.sft_loss, model_cfg=CFG), tx)
        state, m = step(state, jax.tree.map(jnp.asarray, batch))
        out[name] = (state.params, m)
    (p_u, m_u), (p_p, m_p) = out["unpacked"], out["packed"]
    assert float(m_u["tokens"]) == float(m_p["tokens"]) == sum(float(m[1:].sum()) for m in masks)
    np.testing.assert_allclose(float(m_p["loss"]), float(m_u["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(m_p["grad_norm"]), float(m_u["grad_norm"]), rtol=1e-4)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=0), p_p, p_u)


def _source(n):
    return [_record(i, prompt=f"q{i}" + "x" * (i % 5), reasoning=f"step {i}" + "y" * (3 * (i % 4)),
                    response=f"\\boxed{{{i}}}") for i in range(n)]


def test_packed_pipeline_rows_hold_whole_examples():
    source = _source(24)
    seq_len = 160  # the examples are 42-58 tokens: two or three per row
    it = iter(pipeline.sft_dataset(source, TOK, seq_len=seq_len, batch_size=4, seed=0, pack=True))
    seen, fill = [], []
    for _ in range(6):
        batch = next(it)
        assert set(batch) == {"tokens", "loss_mask", "segment_ids", "positions"}
        assert all(v.shape == (4, seq_len) for v in batch.values())
        for toks, mask, seg, pos in zip(batch["tokens"], batch["loss_mask"], batch["segment_ids"],
                                        batch["positions"]):
            fill.append((seg > 0).mean())
            assert (toks[seg == 0] == 0).all() and (mask[seg == 0] == 0).all()
            for k in range(1, seg.max() + 1):
                sel = seg == k
                assert (np.diff(np.flatnonzero(sel)) == 1).all()  # contiguous
                np.testing.assert_array_equal(pos[sel], np.arange(sel.sum()))
                i = int(TOK.decode(toks[sel]).split("user\nq")[1].split("x")[0].split("<")[0])
                want = pipeline.encode_example(source[i], TOK, seq_len, pad=False)
                np.testing.assert_array_equal(toks[sel], want["tokens"])  # whole, unsplit
                np.testing.assert_array_equal(mask[sel], want["loss_mask"])
                seen.append(i)
    assert len(seen) >= 48 and set(seen) == set(range(24))  # 24 rows: two epochs, none lost or split
    assert np.mean(fill) > 0.75, fill  # unpacked, these ~50-token examples would fill ~32% of a row


def test_packed_pipeline_resume_is_exact():
    ds = pipeline.sft_dataset(_source(10), TOK, seq_len=64, batch_size=3, seed=5, pack=True)
    it = iter(ds)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    expected = [next(it) for _ in range(4)]
    resumed = iter(pipeline.sft_dataset(_source(10), TOK, seq_len=64, batch_size=3, seed=5, pack=True))
    resumed.set_state(state)
    for want in expected:
        got = next(resumed)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


def test_sft_mixture_weights_set_each_domains_share():
    """`sft.mix`: a 3:1:1 mixture interleaves 30/10/10 of every 50 records; bad weights name the key."""
    ctx = types.SimpleNamespace(sources={d: {"train": [{"domain": d, "i": i} for i in range(100)]}
                                         for d in ("a", "b", "c")})
    mixed = common.mixture_source(ctx, ["a", "b", "c"], "train", {"a": 3})
    assert collections.Counter(mixed[i]["domain"] for i in range(50)) == {"a": 30, "b": 10, "c": 10}
    equal = common.mixture_source(ctx, ["a", "b", "c"], "train", {})
    assert collections.Counter(equal[i]["domain"] for i in range(60)) == {"a": 20, "b": 20, "c": 20}
    with pytest.raises(ValueError, match=r"not in the stage \['d'\]"):
        common.mixture_source(ctx, ["a", "b"], "train", {"d": 2})
    with pytest.raises(ValueError, match=r"non-positive \{'b': 0\}"):
        common.mixture_source(ctx, ["a", "b"], "train", {"b": 0})
