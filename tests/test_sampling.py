"""Sampler: greedy decoding equals an argmax loop over the full forward pass; EOS, masks, filters."""
import jax
import jax.numpy as jnp
import numpy as np

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
