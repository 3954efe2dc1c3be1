"""nemocascade.losses against loop-based numpy references and hand-worked numbers."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nemocascade import losses, objectives

RNG = np.random.default_rng(0)


def _objective(spec, aggregation="token_mean", normalizer=None, kl_estimator="k3", **x):
    """A loss as training computes it: the objective's weighted terms reduced once (objectives.Objective) ->
    (loss, {term: its value} | the terms' diagnostics). x: logp, mask and what the terms read."""
    obj = objectives.build(dict(terms=spec, aggregation=aggregation, kl_estimator=kl_estimator))
    x = {k: jnp.asarray(v, jnp.float32) for k, v in x.items()}
    norm = losses.loss_normalizer(x["mask"], aggregation) if normalizer is None else normalizer
    values, metrics = obj.term_losses(x, norm, jnp.maximum(jnp.sum(x["mask"]), 1.0))
    w = obj.weights(0)
    return sum(w[k] * v for k, v in values.items()), values | metrics


def grpo(logp, adv, mask, kl_coef=0.0, ref_logp=None, kl_estimator="k3", aggregation="token_mean", normalizer=None):
    """GRPO's objective: pg (+ kl_coef x KL to the reference)."""
    spec = {"pg": 1.0} | ({"kl": kl_coef} if kl_coef else {})
    ref = {} if ref_logp is None else {"ref_logp": ref_logp}
    return _objective(spec, aggregation, normalizer, kl_estimator, logp=logp, advantages=adv, mask=mask, **ref)


def mopd(lt, lteach, ls, mask, normalizer=None):
    """MOPD's objective (seq_mean_token_mean, the IS band [0.5, 2])."""
    return _objective({"mopd": 1.0}, "seq_mean_token_mean", normalizer, logp=lt, teacher_logp=lteach,
                      sampler_logp=ls, mask=mask)


def _np_log_softmax_row(row):
    m = max(row)
    lse = m + math.log(sum(math.exp(v - m) for v in row))
    return [v - lse for v in row]


def _random_mask(n, t, rng):
    mask = (rng.random((n, t)) < 0.7).astype(np.float32)
    mask[0, :] = 1.0  # at least one full row
    return mask


# ------------------------------------------------------------------------------------------- SFT


def test_token_cross_entropy_matches_numpy_loop():
    b, t, v = 3, 5, 7
    logits = RNG.normal(size=(b, t, v)).astype(np.float32)
    targets = RNG.integers(0, v, size=(b, t))
    mask = _random_mask(b, t, RNG)
    tot, cnt, correct = 0.0, 0.0, 0.0
    for i in range(b):
        for j in range(t):
            if mask[i, j]:
                ls = _np_log_softmax_row(list(logits[i, j]))
                tot += -ls[targets[i, j]]
                cnt += 1
                correct += float(int(np.argmax(logits[i, j])) == targets[i, j])
    loss, m = jax.jit(losses.token_cross_entropy)(logits, targets, mask)
    np.testing.assert_allclose(loss, tot / cnt, rtol=1e-5)
    np.testing.assert_allclose(m["nll"], tot / cnt, rtol=1e-5)
    assert float(m["tokens"]) == cnt
    np.testing.assert_allclose(m["accuracy"], correct / cnt, rtol=1e-6)


def test_token_cross_entropy_hand_worked():
    # Two tokens, V=2. Token 0: logits [0, 0] target 0 -> nll = log 2 = 0.693147, argmax=0 correct.
    # Token 1: logits [0, ln 3] target 0 -> p0 = 1/4, nll = ln 4 = 1.386294, argmax=1 wrong.
    # Token 2 is masked out. loss = (ln 2 + ln 4)/2 = 1.5 ln 2 = 1.039721; accuracy 1/2.
    logits = np.array([[[0.0, 0.0], [0.0, math.log(3.0)], [5.0, -5.0]]], np.float32)
    targets = np.array([[0, 0, 1]])
    mask = np.array([[1, 1, 0]])
    loss, m = losses.token_cross_entropy(logits, targets, mask)
    np.testing.assert_allclose(loss, 1.5 * math.log(2.0), rtol=1e-6)
    np.testing.assert_allclose(m["accuracy"], 0.5)
    assert float(m["tokens"]) == 2.0


def test_token_cross_entropy_empty_mask_is_zero_and_bad_shape_raises():
    loss, m = losses.token_cross_entropy(np.zeros((1, 2, 3)), np.zeros((1, 2), int), np.zeros((1, 2)))
    assert float(loss) == 0.0 and float(m["accuracy"]) == 0.0
    with pytest.raises(AssertionError, match="mask must have the shape of targets"):
        losses.token_cross_entropy(np.zeros((1, 2, 3)), np.zeros((1, 2), int), np.zeros((1, 3)))


# ------------------------------------------------------------------------------- logprobs / entropy


def test_token_logprobs_and_entropy_match_numpy_loop():
    n, t, v = 2, 4, 6
    logits_bf16 = jnp.asarray(3 * RNG.normal(size=(n, t, v)), jnp.bfloat16)
    logits = np.asarray(logits_bf16.astype(jnp.float32))  # the reference sees the same rounded values
    tokens = RNG.integers(0, v, size=(n, t))
    want_lp = np.zeros((n, t))
    want_h = np.zeros((n, t))
    for i in range(n):
        for j in range(t):
            ls = _np_log_softmax_row(list(logits[i, j]))
            want_lp[i, j] = ls[tokens[i, j]]
            want_h[i, j] = -sum(math.exp(l) * l for l in ls)
    lp = losses.token_logprobs(logits_bf16, tokens)  # computed in float32 from bf16 logits
    assert lp.dtype == jnp.float32
    np.testing.assert_allclose(lp, want_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(losses.token_entropy(logits), want_h, rtol=1e-5, atol=1e-6)


def test_token_entropy_hand_worked_and_minus_inf():
    # Uniform over 4 -> ln 4; one-hot (others -inf) -> exactly 0, and the gradient stays finite.
    logits = np.array([[[1.0, 1.0, 1.0, 1.0], [2.0, -np.inf, -np.inf, -np.inf]]], np.float32)
    np.testing.assert_allclose(losses.token_entropy(logits), [[math.log(4.0), 0.0]], atol=1e-6)
    g = jax.grad(lambda x: losses.token_entropy(x).sum())(jnp.asarray(logits))
    assert np.isfinite(np.asarray(g)).all()
    # Entropy is maximal at the uniform point: gradient 0 there.
    np.testing.assert_allclose(g[0, 0], np.zeros(4), atol=1e-6)


# ------------------------------------------------------------------------------------ advantages


def test_group_advantages_hand_worked():
    # [1,0,0,1]: mean 0.5, population std 0.5 -> +-0.5/(0.5+eps).
    # [1,0,0,0]: mean 0.25, std sqrt(0.1875) = 0.4330127
    #   -> 0.75/0.4330127 = 1.7320508 and -0.25/0.4330127 = -0.5773503.
    # [3,3,3,3]: all equal -> 0.
    eps = 1e-6
    adv = losses.group_advantages(np.array([[1, 0, 0, 1], [1, 0, 0, 0], [3, 3, 3, 3]], np.float32), eps)
    a = 0.5 / (0.5 + eps)
    np.testing.assert_allclose(adv[0], [a, -a, -a, a], rtol=1e-6)
    np.testing.assert_allclose(adv[1], [1.7320508, -0.5773503, -0.5773503, -0.5773503], rtol=1e-5)
    np.testing.assert_array_equal(adv[2], np.zeros(4))


def test_group_advantages_matches_numpy_loop():
    r = RNG.normal(size=(5, 8))
    want = np.zeros_like(r)
    for p in range(5):
        mean = sum(r[p]) / 8
        std = math.sqrt(sum((x - mean) ** 2 for x in r[p]) / 8)
        for g in range(8):
            want[p, g] = (r[p, g] - mean) / (std + 1e-6)
    np.testing.assert_allclose(losses.group_advantages(r), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(AssertionError, match="rewards must be"):
        losses.group_advantages(np.zeros(4))


# ------------------------------------------------------------------------------------------- KL


def test_kl_penalty_estimators_hand_worked():
    # logp = ln 0.5, ref = ln 0.25: d = ref - logp = -ln 2 = -0.693147.
    # k1 = ln 2 = 0.693147; k2 = 0.5 * ln2^2 = 0.240227;
    # k3 = e^{-ln2} + ln 2 - 1 = 0.5 + 0.693147 - 1 = 0.193147.
    logp = np.array([[math.log(0.5)]], np.float32)
    ref = np.array([[math.log(0.25)]], np.float32)
    np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k1"), [[0.693147]], rtol=1e-5)
    np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k2"), [[0.240227]], rtol=1e-5)
    np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k3"), [[0.193147]], rtol=1e-5)
    with pytest.raises(ValueError, match="k4"):
        losses.kl_penalty(logp, ref, "k4")


def test_kl_penalty_matches_numpy_loop():
    logp = -np.abs(RNG.normal(size=(3, 4)))
    ref = -np.abs(RNG.normal(size=(3, 4)))
    for est in ("k1", "k2", "k3"):
        want = np.zeros((3, 4))
        for i in range(3):
            for j in range(4):
                d = ref[i, j] - logp[i, j]
                want[i, j] = {"k1": -d, "k2": 0.5 * d * d, "k3": math.exp(d) - d - 1}[est]
        np.testing.assert_allclose(losses.kl_penalty(logp, ref, est), want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ GRPO


def _np_grpo(logp, adv, mask, aggregation, kl_coef=0.0, ref=None, est="k3"):
    """Loop reference for GRPO's objective (pg + kl)."""
    n, t = logp.shape
    per_resp, tot, cnt = [], 0.0, 0.0
    for i in range(n):
        s, c = 0.0, 0.0
        for j in range(t):
            if mask[i, j]:
                l = -adv[i] * logp[i, j]
                if kl_coef:
                    d = ref[i, j] - logp[i, j]
                    l += kl_coef * {"k1": -d, "k2": 0.5 * d * d, "k3": math.exp(d) - d - 1}[est]
                s += l
                c += 1
        tot += s
        cnt += c
        if c:
            per_resp.append(s / c)
    if aggregation == "token_mean":
        return tot / cnt
    if aggregation == "seq_mean_token_mean":
        return sum(per_resp) / len(per_resp)
    return tot / (n * t)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "constant"])
def test_grpo_loss_matches_numpy_loop(aggregation):
    n, t = 4, 6
    logp = -np.abs(RNG.normal(size=(n, t))).astype(np.float32)
    ref = -np.abs(RNG.normal(size=(n, t))).astype(np.float32)
    adv = RNG.normal(size=n).astype(np.float32)
    mask = _random_mask(n, t, RNG)
    mask[2] = 0.0  # an empty response
    loss, m = grpo(logp, adv, mask, aggregation=aggregation)
    np.testing.assert_allclose(loss, _np_grpo(logp, adv, mask, aggregation), rtol=1e-5)
    np.testing.assert_allclose(m["pg"], loss, rtol=1e-6)
    loss_kl, m_kl = grpo(logp, adv, mask, kl_coef=0.03, ref_logp=ref, kl_estimator="k3",
                                     aggregation=aggregation)
    np.testing.assert_allclose(loss_kl, _np_grpo(logp, adv, mask, aggregation, 0.03, ref), rtol=1e-5)
    np.testing.assert_allclose(m_kl["pg"], loss, rtol=1e-6)
    kl_mean = sum(math.exp(ref[i, j] - logp[i, j]) - (ref[i, j] - logp[i, j]) - 1
                  for i in range(n) for j in range(t) if mask[i, j]) / mask.sum()
    np.testing.assert_allclose(m_kl["kl"], kl_mean, rtol=1e-5)


def test_grpo_loss_hand_worked():
    # Response 0: A=+1, tokens logp [-1, -2] (both valid); response 1: A=-1, logp [-3, (masked) -9].
    # Per-token -A*logp: [1, 2], [-3]. token_mean = (1+2-3)/3 = 0.
    # seq_mean_token_mean = mean(1.5, -3) = -0.75. constant = 0 / (2*2) = 0.
    logp = np.array([[-1.0, -2.0], [-3.0, -9.0]], np.float32)
    adv = np.array([1.0, -1.0], np.float32)
    mask = np.array([[1, 1], [1, 0]], np.float32)
    assert abs(float(grpo(logp, adv, mask)[0])) < 1e-7
    np.testing.assert_allclose(grpo(logp, adv, mask, aggregation="seq_mean_token_mean")[0], -0.75)
    # With A=+1 on both: token_mean = (1+2+3)/3 = 2; constant = 6/4 = 1.5; normalizer=10 -> 0.6.
    ones = np.ones(2, np.float32)
    np.testing.assert_allclose(grpo(logp, ones, mask)[0], 2.0)
    np.testing.assert_allclose(grpo(logp, ones, mask, aggregation="constant")[0], 1.5)
    np.testing.assert_allclose(grpo(logp, ones, mask, normalizer=10.0)[0], 0.6)


def test_grpo_gradient_is_minus_mask_adv_over_count():
    n, t = 3, 5
    logp = -np.abs(RNG.normal(size=(n, t))).astype(np.float32)
    adv = RNG.normal(size=n).astype(np.float32)
    mask = _random_mask(n, t, RNG)
    g = jax.grad(lambda lp: grpo(lp, adv, mask)[0])(jnp.asarray(logp))
    np.testing.assert_allclose(g, -mask * adv[:, None] / mask.sum(), rtol=1e-6, atol=1e-8)
    # Advantages are constants: no gradient reaches them.
    ga = jax.grad(lambda a: grpo(logp, a, mask)[0])(jnp.asarray(adv))
    np.testing.assert_array_equal(ga, np.zeros(n))


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "constant"])
def test_grpo_micro_batches_sum_to_full_batch(aggregation):
    # A tiny linear "policy": logits = x @ W, logp of the sampled tokens. Split 6 responses into 3
    # micro-batches of 2, pass the global normalizer to each, sum losses and parameter gradients.
    n, t, d, v = 6, 5, 4, 7
    x = RNG.normal(size=(n, t, d)).astype(np.float32)
    tokens = RNG.integers(0, v, size=(n, t))
    adv = RNG.normal(size=n).astype(np.float32)
    ref = -np.abs(RNG.normal(size=(n, t))).astype(np.float32)
    mask = _random_mask(n, t, RNG)
    mask[3] = 0.0
    w = jnp.asarray(RNG.normal(size=(d, v)).astype(np.float32))

    @jax.jit
    def loss_and_grad(w, sl_x, sl_tok, sl_adv, sl_ref, sl_mask, normalizer):
        def loss_fn(w):
            logp = losses.token_logprobs(sl_x @ w, sl_tok)
            return grpo(logp, sl_adv, sl_mask, kl_coef=0.1, ref_logp=sl_ref,
                                    aggregation=aggregation, normalizer=normalizer)[0]
        return jax.value_and_grad(loss_fn)(w)

    def run(sl, normalizer):
        return loss_and_grad(w, x[sl], tokens[sl], adv[sl], ref[sl], mask[sl], normalizer)

    full, g_full = run(slice(None), None)
    norm = losses.loss_normalizer(mask, aggregation)
    parts = [run(slice(k, k + 2), norm) for k in range(0, n, 2)]
    np.testing.assert_allclose(sum(p[0] for p in parts), full, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(sum(p[1] for p in parts), g_full, rtol=1e-6, atol=1e-6)
    # Without the global normalizer the micro-batch means do NOT add up (guards the test itself).
    local = sum(run(slice(k, k + 2), None)[0] for k in range(0, n, 2))
    assert abs(float(local) - float(full)) > 1e-3


def test_loss_normalizer_hand_worked():
    mask = np.array([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert float(losses.loss_normalizer(mask, "token_mean")) == 3.0
    assert float(losses.loss_normalizer(mask, "seq_mean_token_mean")) == 2.0
    assert float(losses.loss_normalizer(mask, "constant")) == 9.0
    assert float(losses.loss_normalizer(np.zeros((2, 2)), "token_mean")) == 1.0


def test_grpo_loss_bad_arguments_raise():
    z = np.zeros((2, 3), np.float32)
    a = np.zeros(2, np.float32)
    with pytest.raises(ValueError, match="aggregation='sum'"):
        grpo(z, a, z, aggregation="sum")
    with pytest.raises(ValueError, match="kl_estimator='k9'"):
        grpo(z, a, z, kl_coef=0.03, ref_logp=z, kl_estimator="k9")
    with pytest.raises(KeyError, match="ref_logp"):
        grpo(z, a, z, kl_coef=0.03)


# ------------------------------------------------------------------------------------------ MOPD


def _np_mopd(lt, lteach, ls, mask, lo=0.5, hi=2.0):
    n, t = lt.shape
    resp, tok, rkl, wsum, out = [], 0, 0.0, 0.0, 0
    for i in range(n):
        s, c = 0.0, 0
        for j in range(t):
            if not mask[i, j]:
                continue
            a = lteach[i, j] - lt[i, j]
            r = math.exp(lt[i, j] - ls[i, j])
            w = r if lo <= r <= hi else 0.0
            s += w * a * lt[i, j]
            c += 1
            rkl += lt[i, j] - lteach[i, j]
            wsum += w
            out += not (lo <= r <= hi)
        tok += c
        if c:
            resp.append(s / c)
    return -sum(resp) / len(resp), rkl / tok, wsum / tok, out / tok


def test_mopd_loss_matches_numpy_loop():
    n, t = 5, 6
    lt = -np.abs(RNG.normal(size=(n, t))).astype(np.float32)
    lteach = -np.abs(RNG.normal(size=(n, t))).astype(np.float32)
    ls = (lt + 0.6 * RNG.normal(size=(n, t))).astype(np.float32)  # some ratios leave the band
    mask = _random_mask(n, t, RNG)
    mask[4] = 0.0
    loss, m = jax.jit(mopd)(lt, lteach, ls, mask)
    want_loss, _, want_w, want_clip = _np_mopd(lt, lteach, ls, mask)
    assert 0.0 < want_clip < 1.0
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(m["is_weight_mean"], want_w, rtol=1e-5)
    np.testing.assert_allclose(m["is_clip_frac"], want_clip, rtol=1e-6)


def test_mopd_hand_worked_and_band_edges():
    # One response, 5 valid tokens; sampler logp = 0 so ratio = exp(logp_train) = pi_train.
    # pi_train = [0.5, 0.49, 1.0, 0.25, 0.5]; teacher logp = 0 everywhere, so a_t = -logp_train.
    # ratio 0.5 inside (w=0.5), 0.49 outside (w=0), 1.0 inside (w=1, a=0), 0.25 outside, 0.5 inside.
    # sum w*a*logp = 0.5 * (ln2)(-ln2) * 2 = -(ln 2)^2 = -0.480453; / 5 tokens; loss = +0.0960906.
    p = np.array([[0.5, 0.49, 1.0, 0.25, 0.5]])
    lt = np.log(p).astype(np.float32)
    zeros = np.zeros_like(lt)
    mask = np.ones_like(lt)
    loss, m = mopd(lt, zeros, zeros, mask)
    np.testing.assert_allclose(loss, math.log(2) ** 2 / 5, rtol=1e-5)
    np.testing.assert_allclose(m["is_clip_frac"], 2 / 5, rtol=1e-6)
    np.testing.assert_allclose(m["is_weight_mean"], (0.5 + 1.0 + 0.5) / 5, rtol=1e-6)
    # Upper edge: sampler logp = ln 0.5 and train logp = 0 -> ratio exactly 2.0 -> weight 2.0;
    # ratio 2.01 -> weight 0. Teacher = train = 0 makes a_t = 0 and the loss 0, so read the weights.
    ls = np.log(np.array([[0.5, 1 / 2.01]])).astype(np.float32)
    _, m = mopd(np.zeros_like(ls), zeros[:, :2], ls, np.ones_like(ls))
    np.testing.assert_allclose(m["is_weight_mean"], 2.0 / 2, rtol=1e-6)
    np.testing.assert_allclose(m["is_clip_frac"], 0.5)


def test_mopd_gradient_respects_stop_gradients():
    n, t = 4, 5
    lt = -np.abs(RNG.normal(size=(n, t))).astype(np.float32)
    lteach = -np.abs(RNG.normal(size=(n, t))).astype(np.float32)
    ls = (lt + 0.5 * RNG.normal(size=(n, t))).astype(np.float32)
    mask = _random_mask(n, t, RNG)
    mask[1] = 0.0
    g = jax.grad(lambda x: mopd(x, lteach, ls, mask)[0])(jnp.asarray(lt))
    ratio = np.exp(lt.astype(np.float64) - ls)
    w = np.where((ratio >= 0.5) & (ratio <= 2.0), ratio, 0.0)
    a = lteach - lt
    n_tok = mask.sum(1, keepdims=True)
    n_resp = (n_tok > 0).sum()
    want = -w * a * mask / np.maximum(n_tok, 1) / n_resp
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-7)
    # Teacher and sampler log-probs receive no gradient.
    for argnum in (1, 2):
        gz = jax.grad(lambda *a: mopd(*a)[0], argnums=argnum)(lt, lteach, ls, mask)
        np.testing.assert_array_equal(gz, np.zeros((n, t)))


def test_mopd_normalizer_splits_over_micro_batches_and_empty_is_zero():
    n, t = 4, 3
    lt = -np.abs(RNG.normal(size=(n, t))).astype(np.float32)
    lteach = -np.abs(RNG.normal(size=(n, t))).astype(np.float32)
    mask = np.ones((n, t), np.float32)
    mask[2] = 0.0
    full = mopd(lt, lteach, lt, mask)[0]
    parts = sum(mopd(lt[k:k + 2], lteach[k:k + 2], lt[k:k + 2], mask[k:k + 2],
                                 normalizer=3.0)[0] for k in (0, 2))
    np.testing.assert_allclose(parts, full, rtol=1e-6)
    empty, m = mopd(lt, lteach, lt, np.zeros_like(mask))
    assert float(empty) == 0.0
    with pytest.raises(AssertionError, match="logp_sampler must have the shape"):
        mopd(lt, lteach, lt[:, :2], mask)


# --------------------------------------------------------------------- full-distribution (GKD)


def _np_dists(student, teacher, beta):
    n, t, _ = student.shape
    fkl, rkl, jsd = (np.zeros((n, t)) for _ in range(3))
    for i in range(n):
        for j in range(t):
            ps = [math.exp(x) for x in _np_log_softmax_row(list(student[i, j]))]
            pt = [math.exp(x) for x in _np_log_softmax_row(list(teacher[i, j]))]
            pm = [beta * a + (1 - beta) * b for a, b in zip(pt, ps)]
            fkl[i, j] = sum(a * math.log(a / b) for a, b in zip(pt, ps))
            rkl[i, j] = sum(b * math.log(b / a) for a, b in zip(pt, ps))
            jsd[i, j] = (beta * sum(a * math.log(a / m) for a, m in zip(pt, pm))
                         + (1 - beta) * sum(b * math.log(b / m) for b, m in zip(ps, pm)))
    return fkl, rkl, jsd


def test_full_distribution_divergences_match_numpy_loop():
    s = RNG.normal(size=(2, 3, 5)).astype(np.float32)
    te = RNG.normal(size=(2, 3, 5)).astype(np.float32)
    fkl, rkl, jsd = _np_dists(s, te, 0.3)
    np.testing.assert_allclose(losses.forward_kl(s, te), fkl, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(losses.reverse_kl(s, te), rkl, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(losses.generalized_jsd(s, te, 0.3), jsd, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="beta=1.0"):
        losses.generalized_jsd(s, te, 1.0)


def test_jsd_hand_worked():
    # p_S = [1, 0] (logit -inf), p_T = [0.5, 0.5], beta = 0.5: M = [0.75, 0.25].
    # KL(T||M) = 0.5 ln(0.5/0.75) + 0.5 ln(0.5/0.25) = 0.5(-0.405465) + 0.5(0.693147) = 0.143841.
    # KL(S||M) = ln(1/0.75) = 0.287682. JSD = 0.5 * (0.143841 + 0.287682) = 0.215762.
    s = np.array([[[0.0, -np.inf]]], np.float32)
    te = np.zeros((1, 1, 2), np.float32)
    np.testing.assert_allclose(losses.generalized_jsd(s, te, 0.5), [[0.215762]], rtol=1e-5)
    # Reverse KL(S||T) = 1 * ln(1/0.5) = ln 2 (finite although p_S has a zero).
    np.testing.assert_allclose(losses.reverse_kl(s, te), [[math.log(2)]], rtol=1e-6)


# ------------------------------------------------------------------ with and without jit (chex variants)


class LossesWithAndWithoutJit(chex.TestCase):
    """Every loss gives the numpy references' numbers traced by jit and run eagerly, and its boundary assertions
    fire in both (under jit at trace time)."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_sft_and_token_functions(self):
        rng = np.random.default_rng(1)
        logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
        targets = rng.integers(0, 5, size=(2, 3))
        mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
        want = [-_np_log_softmax_row(list(logits[i, j]))[targets[i, j]] for i, j in ((0, 0), (0, 1), (1, 0))]
        loss, _ = self.variant(losses.token_cross_entropy)(logits, targets, mask)
        np.testing.assert_allclose(loss, np.mean(want), rtol=1e-5)
        lp = self.variant(losses.token_logprobs)(logits, targets)
        np.testing.assert_allclose([lp[0, 0], lp[0, 1], lp[1, 0]], -np.array(want), rtol=1e-5)
        with pytest.raises(AssertionError, match="targets must be integer"):
            self.variant(losses.token_cross_entropy)(logits, targets.astype(np.float32), mask)
        with pytest.raises(AssertionError, match="logits must be"):
            self.variant(losses.token_logprobs)(logits[0], targets)

    @chex.variants(with_jit=True, without_jit=True)
    def test_grpo(self):
        rng = np.random.default_rng(2)
        logp = -np.abs(rng.normal(size=(3, 4))).astype(np.float32)
        ref = -np.abs(rng.normal(size=(3, 4))).astype(np.float32)
        adv = rng.normal(size=3).astype(np.float32)
        mask = _random_mask(3, 4, rng)
        for aggregation in ("token_mean", "seq_mean_token_mean"):
            fn = self.variant(functools.partial(grpo, kl_coef=0.03, aggregation=aggregation))
            loss, _ = fn(logp, adv, mask, ref_logp=ref)
            np.testing.assert_allclose(loss, _np_grpo(logp, adv, mask, aggregation, 0.03, ref), rtol=1e-5)
        a = 0.5 / (0.5 + 1e-6)  # mean 0.5, population std 0.5
        np.testing.assert_allclose(self.variant(losses.group_advantages)(np.array([[1.0, 0.0, 0.0, 1.0]])),
                                   [[a, -a, -a, a]], rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_mopd_and_divergences(self):
        rng = np.random.default_rng(3)
        lt = -np.abs(rng.normal(size=(4, 5))).astype(np.float32)
        lteach = -np.abs(rng.normal(size=(4, 5))).astype(np.float32)
        ls = (lt + 0.6 * rng.normal(size=(4, 5))).astype(np.float32)
        mask = _random_mask(4, 5, rng)
        loss, m = self.variant(mopd)(lt, lteach, ls, mask)
        want_loss, _, _, _ = _np_mopd(lt, lteach, ls, mask)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
        s, te = rng.normal(size=(2, 2, 4)).astype(np.float32), rng.normal(size=(2, 2, 4)).astype(np.float32)
        fkl, rkl, jsd = _np_dists(s, te, 0.5)
        np.testing.assert_allclose(self.variant(losses.forward_kl)(s, te), fkl, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(self.variant(losses.reverse_kl)(s, te), rkl, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(self.variant(losses.generalized_jsd)(s, te), jsd, rtol=1e-4, atol=1e-6)
        with pytest.raises(AssertionError, match="logp_teacher must have the shape of logp_train"):
            self.variant(mopd)(lt, lteach[:, :4], ls, mask)

    @chex.variants(with_jit=True, without_jit=True)
    def test_bradley_terry(self):
        # gaps [ln 3, 0]: -log sigmoid(ln 3) = ln(4/3), -log sigmoid(0) = ln 2; accuracy 1/2 (a tie is wrong)
        loss, m = self.variant(losses.bradley_terry_loss)(np.array([math.log(3.0), 1.0]), np.array([0.0, 1.0]))
        np.testing.assert_allclose([loss, m["accuracy"]], [(math.log(4 / 3) + math.log(2)) / 2, 0.5], rtol=1e-6)
        with pytest.raises(AssertionError, match="r_chosen must be"):
            self.variant(losses.bradley_terry_loss)(np.zeros((2, 1)), np.zeros((2, 1)))
