"""Sampler: greedy decoding equals an argmax loop over the full forward pass; EOS, masks, filters."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nemocascade import sampling
from nemocascade.models import transformer as tf

CFG = tf.ModelConfig(vocab_size=23, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48)


def _params():
    # large random weights make the argmax sequence non-trivial (not one token repeated)
    p = tf.init_params(CFG, jax.random.key(0))
    leaves, treedef = jax.tree.flatten(p)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    return jax.tree.unflatten(treedef, [x + jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def _reference_greedy(params, prompt, n):
    seq = list(prompt)
    logps = []
    for _ in range(n):
        logits = tf.forward(params, CFG, jnp.asarray([seq], jnp.int32))[0, -1]
        tok = int(jnp.argmax(logits))
        logps.append(float(jax.nn.log_softmax(logits)[tok]))
        seq.append(tok)
    return seq[len(prompt):], logps


def test_greedy_equals_argmax_loop_over_full_forward():
    params = _params()
    prompts = [[3, 4, 5, 6], [7, 8]]
    prompt_len, N = 4, 7
    toks = np.zeros((2, prompt_len), np.int32)
    for b, p in enumerate(prompts):
        toks[b, prompt_len - len(p):] = p
    out = sampling.sample(params, CFG, jnp.asarray(toks), jnp.asarray([4, 2]), jax.random.key(0),
                          max_new_tokens=N, eos_id=-1, greedy=True)
    for b, p in enumerate(prompts):
        ref, ref_lp = _reference_greedy(params, p, N)
        assert np.asarray(out.tokens[b]).tolist() == ref
        np.testing.assert_allclose(np.asarray(out.logprobs[b]), ref_lp, atol=1e-5)
    assert np.asarray(out.truncated).tolist() == [True, True]
    assert np.asarray(out.lengths).tolist() == [N, N]
    assert len(set(np.asarray(out.tokens[0]).tolist())) > 1


@pytest.mark.parametrize("chunk", [0, 16])
def test_long_greedy_decode_equals_one_full_forward(chunk):
    """80 greedy tokens from a prefill that attends over the prompt's slots only and a decode over the cache (dense,
    or read 16 slots at a time up to the filled ones): every token is the argmax of one causal forward pass over
    prompt + response, its log-prob too."""
    params = _params()
    prompts = [[3, 4, 5, 6, 9], [7, 8]]
    N = 80
    toks = np.zeros((2, 5), np.int32)
    for b, p in enumerate(prompts):
        toks[b, 5 - len(p):] = p
    out = sampling.sample(params, CFG, jnp.asarray(toks), jnp.asarray([5, 2]), jax.random.key(0),
                          max_new_tokens=N, eos_id=-1, greedy=True, chunk=chunk)
    for b, p in enumerate(prompts):
        resp = np.asarray(out.tokens[b]).tolist()
        logits = tf.forward(params, CFG, jnp.asarray([p + resp], jnp.int32))[0, len(p) - 1:-1]
        assert np.asarray(jnp.argmax(logits, -1)).tolist() == resp
        lp = jax.nn.log_softmax(logits)[jnp.arange(N), jnp.asarray(resp)]
        np.testing.assert_allclose(np.asarray(out.logprobs[b]), np.asarray(lp), atol=1e-4)
        assert len(set(resp[40:])) > 1  # not one token repeated


def test_eos_stops_row_and_masks_rest():
    params = _params()
    toks = jnp.asarray([[3, 4, 5, 6], [0, 0, 7, 8]], jnp.int32)
    ref0, _ = _reference_greedy(params, [3, 4, 5, 6], 7)
    eos = ref0[2]  # make the third greedy token of row 0 the EOS
    out = sampling.sample(params, CFG, toks, jnp.asarray([4, 2]), jax.random.key(0), max_new_tokens=7,
                          eos_id=eos, greedy=True)
    row = np.asarray(out.tokens[0])
    first = ref0.index(eos)
    assert row[:first + 1].tolist() == ref0[:first + 1]
    assert (row[first + 1:] == 0).all()
    assert np.asarray(out.mask[0]).tolist() == [1.0] * (first + 1) + [0.0] * (7 - first - 1)
    assert int(out.lengths[0]) == first + 1 and not bool(out.truncated[0])
    assert (np.asarray(out.logprobs[0])[first + 1:] == 0).all()


def test_num_samples_repeats_prompts_and_sequences_helper():
    params = _params()
    toks = jnp.asarray([[0, 3, 4], [5, 6, 7]], jnp.int32)
    out = sampling.sample(params, CFG, toks, jnp.asarray([2, 3]), jax.random.key(1), max_new_tokens=5,
                          eos_id=-1, num_samples=3)
    assert out.tokens.shape == (6, 5)
    assert np.asarray(out.prompts).tolist() == [[0, 3, 4]] * 3 + [[5, 6, 7]] * 3
    # sampler log-probs equal the trainer's full-forward log-probs on the same sequences
    tokens, valid, positions, rmask = sampling.sequences(out)
    logits = tf.forward(params, CFG, tokens, positions, valid)
    lp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(lp * rmask)[:, 2:], np.asarray(out.logprobs), atol=1e-5)


def test_filter_logits_top_k_top_p_hand_example():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
    keep = lambda x: np.isfinite(np.asarray(x))[0].tolist()  # noqa: E731
    assert keep(sampling.filter_logits(logits, 1.0, 1.0)) == [True] * 4
    assert keep(sampling.filter_logits(logits, 1.0, 0.7)) == [True, True, False, False]   # 0.5 < 0.7 -> add 0.3
    assert keep(sampling.filter_logits(logits, 1.0, 0.5)) == [True, False, False, False]  # mass before 2nd = 0.5
    assert keep(sampling.filter_logits(logits, 1.0, 0.81)) == [True, True, True, False]
    assert keep(sampling.filter_logits(logits, 1.0, 1.0, top_k=2)) == [True, True, False, False]


def test_sampling_frequencies_follow_temperature_distribution():
    # one-token vocabulary distribution check against the exact softmax
    cfg = tf.ModelConfig(vocab_size=5, d_model=8, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=8, d_ff=8)
    params = tf.init_params(cfg, jax.random.key(3))
    params["lm_head"] = params["lm_head"] * 200
    prompt = jnp.asarray([[1, 2]], jnp.int32)
    probs = np.asarray(jax.nn.softmax(tf.forward(params, cfg, prompt)[0, -1] / 2.0))
    out = sampling.sample(params, cfg, prompt, jnp.asarray([2]), jax.random.key(4), max_new_tokens=1,
                          eos_id=-1, temperature=2.0, num_samples=4000)
    freq = np.bincount(np.asarray(out.tokens[:, 0]), minlength=5) / 4000
    assert np.max(np.abs(freq - probs)) < 0.03


def test_prefix_sharing_gives_the_tokens_of_repeated_prompts():
    # G samples of a prompt (its prefill done once, the cache copied G times) == the prompt repeated G times
    # and sampled once each: same key, so the same draws; logprobs to float tolerance
    params = _params()
    toks = jnp.asarray([[0, 3, 4], [5, 6, 7]], jnp.int32)
    lens = jnp.asarray([2, 3])
    kw = dict(max_new_tokens=6, eos_id=-1, temperature=8.0)  # flat enough that samples differ
    shared = sampling.sample(params, CFG, toks, lens, jax.random.key(5), num_samples=3, **kw)
    repeated = sampling.sample(params, CFG, jnp.repeat(toks, 3, 0), jnp.repeat(lens, 3), jax.random.key(5), **kw)
    assert np.asarray(shared.tokens).tolist() == np.asarray(repeated.tokens).tolist()
    np.testing.assert_allclose(np.asarray(shared.logprobs), np.asarray(repeated.logprobs), atol=1e-5)
    assert len({tuple(r) for r in np.asarray(shared.tokens[:3]).tolist()}) > 1  # the G samples differ


def test_greedy_first_row_is_the_greedy_answer_and_the_others_are_the_samples():
    # evaluation's one-prefill greedy + avg@k: row 0 of each prompt's G equals greedy decoding of that prompt, and
    # rows 1.. equal what sampling the prompt G times gives there (same key: the same uniforms per row)
    params = _params()
    toks = jnp.asarray([[0, 3, 4], [5, 6, 7]], jnp.int32)
    lens = jnp.asarray([2, 3])
    kw = dict(max_new_tokens=6, eos_id=-1, temperature=8.0)
    mixed = sampling.sample(params, CFG, toks, lens, jax.random.key(5), num_samples=3, greedy_first=True, **kw)
    greedy = sampling.sample(params, CFG, toks, lens, jax.random.key(5), greedy=True, **kw)
    sampled = sampling.sample(params, CFG, toks, lens, jax.random.key(5), num_samples=3, **kw)
    mixed_t, sampled_t = np.asarray(mixed.tokens), np.asarray(sampled.tokens)
    assert mixed_t[0::3].tolist() == np.asarray(greedy.tokens).tolist()
    keep = np.arange(6) % 3 != 0
    assert mixed_t[keep].tolist() == sampled_t[keep].tolist()
    assert mixed_t[0].tolist() != sampled_t[0].tolist()  # at T = 8 the sampled row 0 is not the greedy one
    np.testing.assert_allclose(np.asarray(mixed.logprobs[0::3]), np.asarray(greedy.logprobs), atol=1e-5)


def test_prefill_last_only_equals_last_column_of_full_logits():
    params = _params()
    toks = jnp.asarray([[0, 3, 4, 9], [5, 6, 7, 8]], jnp.int32)
    valid = toks > 0
    pos = tf.left_pad_positions(valid)
    full, _ = tf.forward_cached(params, CFG, toks, pos, valid, tf.init_cache(CFG, 2, 6), 0)
    last, _ = tf.forward_cached(params, CFG, toks, pos, valid, tf.init_cache(CFG, 2, 6), 0, last_only=True)
    np.testing.assert_allclose(np.asarray(last[:, 0]), np.asarray(full[:, -1]), rtol=1e-6, atol=1e-6)


def _nucleus_by_sort(logits, top_p):
    """numpy reference: sort, keep the prefix whose mass before each token is < top_p."""
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    keep = np.zeros(p.shape, bool)
    for b in range(p.shape[0]):
        order = np.argsort(-p[b], kind="stable")
        before = np.cumsum(p[b, order]) - p[b, order]
        kept = order[before < top_p]
        keep[b] = p[b] >= p[b, kept].min()  # ties with the last kept token stay
    return keep


def test_top_p_bisection_keeps_the_sorted_nucleus():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((64, 300)) * rng.uniform(0.3, 4.0, (64, 1))).astype(np.float32)
    for top_p in (0.1, 0.5, 0.9, 0.95, 0.999):
        got = np.isfinite(np.asarray(sampling.filter_logits(jnp.asarray(logits), 1.0, top_p)))
        np.testing.assert_array_equal(got, _nucleus_by_sort(logits.astype(np.float64), top_p), err_msg=str(top_p))


def test_draw_follows_the_distribution_and_never_draws_excluded_tokens():
    probs = np.asarray([0.4, 0.0, 0.25, 0.2, 0.0, 0.1, 0.05])
    logits = jnp.log(jnp.asarray(np.tile(probs, (20000, 1)), jnp.float32))  # log 0 = -inf: excluded
    toks = np.asarray(sampling.draw(logits, jax.random.key(0)))
    freq = np.bincount(toks, minlength=7) / toks.size
    assert freq[1] == 0 and freq[4] == 0
    # 20000 draws: binomial sd <= 0.0035, so 0.012 is > 3 sd
    np.testing.assert_allclose(freq, probs, atol=0.012)


def test_left_padding_width_does_not_change_the_samples():
    # prompt-length buckets (PROMPT_BUCKET) pad a batch less: the same prompts with 2 or 7 pad columns give the
    # same tokens and logprobs (padded keys are masked, positions start at each row's first real token)
    params = _params()
    rows, lens = [[3, 4, 5], [7, 8]], jnp.asarray([3, 2])
    padded = lambda w: jnp.asarray([[0] * (w - len(r)) + r for r in rows], jnp.int32)  # noqa: E731
    kw = dict(max_new_tokens=6, eos_id=-1, temperature=8.0, num_samples=2)
    a = sampling.sample(params, CFG, padded(5), lens, jax.random.key(3), **kw)
    b = sampling.sample(params, CFG, padded(10), lens, jax.random.key(3), **kw)
    assert np.asarray(a.tokens).tolist() == np.asarray(b.tokens).tolist()
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), rtol=1e-5, atol=1e-5)


def test_chunked_decode_attention_is_the_cpu_default_only(monkeypatch):
    assert sampling.attn_chunk(None) == sampling.ATTN_CHUNK and sampling.attn_chunk(0) == 0
    monkeypatch.setattr(sampling.jax, "default_backend", lambda: "gpu")
    assert sampling.attn_chunk(None) == 0 and sampling.attn_chunk(32) == 32
