"""Composable objectives (nemocascade/objectives.py) and the one on-policy update (rl/update.py).

Pinned: the gradient of a mixed objective (pg + kl + entropy + MOPD + full reverse KL, seq_mean_token_mean)
with respect to the policy's logits against a hand-derived numpy gradient; micro-batched == full-batch
updates for every built-in term; scheduled weights; zero-weight terms absent from the compiled step; the
optax chain's logged records (clip, per-term gradient norms, frozen parameters)."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from nemocascade import objectives, optim, train_state
from nemocascade.models import ModelConfig, init_params
from nemocascade.rl import update
from nemocascade.stages import common, onpolicy


CFG = ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32)
SETTINGS = {"kl_estimator": "k3", "is_low": 0.5, "is_high": 2.0, "gjsd_beta": 0.3}


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_mixed_objective_gradient_equals_numpy_derivation():
    """d/dz of  w_pg*pg + w_kl*k3 + w_ent*(-H) + w_mopd*mopd + w_rkl*KL(pi||teacher)  under seq_mean_token_mean,
    z = the policy's logits, derived by hand: d logp(y)/dz_v = 1[v=y] - p_v, dH/dz_v = -p_v (log p_v + H),
    d KL(p||t)/dz_v = p_v (log p_v - log t_v - KL)."""
    rng = np.random.default_rng(0)
    N, T, V = 4, 5, 7
    z = rng.normal(size=(N, T, V))
    y = rng.integers(0, V, (N, T))
    mask = np.zeros((N, T))
    mask[0, :3] = mask[1, 1:5] = mask[2, 2:3] = 1  # row 3 is empty: not counted by the mean over responses
    adv = rng.normal(size=N)
    t_logits = _log_softmax(rng.normal(size=(N, T, V)))  # the teacher's log-probabilities
    onehot = np.eye(V)[y]
    lp_all = _log_softmax(z)
    p = np.exp(lp_all)
    logp = (lp_all * onehot).sum(-1)
    ref_logp = logp + rng.normal(scale=0.3, size=(N, T))
    sampler_logp = logp - rng.choice([0.0, 0.3, -1.0, 1.0], size=(N, T))  # some tokens outside the IS band
    t_logp = (t_logits * onehot).sum(-1)
    w = {"pg": 1.0, "kl": 0.3, "entropy": 0.05, "mopd": 0.7, "reverse_kl": 0.2}

    # per-token coefficient of the reduction: m / |V(y_i)| / (number of non-empty responses)
    n_i = mask.sum(1)
    c = mask / np.maximum(n_i, 1)[:, None] / (n_i > 0).sum()
    dlogp = onehot - p  # d logp(y_t) / dz_v
    d = ref_logp - logp
    ratio = np.exp(logp - sampler_logp)
    is_w = np.where((ratio >= 0.5) & (ratio <= 2.0), ratio, 0.0)
    H = -(p * lp_all).sum(-1)
    kl_t = (p * (lp_all - t_logits)).sum(-1)
    coef_logp = w["pg"] * -adv[:, None] + w["kl"] * (1 - np.exp(d)) + w["mopd"] * -(is_w * (t_logp - logp))
    want = c[..., None] * (coef_logp[..., None] * dlogp
                           + w["entropy"] * p * (lp_all + H[..., None])
                           + w["reverse_kl"] * p * (lp_all - t_logits - kl_t[..., None]))

    objective = objectives.build(dict(terms=w, aggregation="seq_mean_token_mean", **SETTINGS))
    assert objective.needs == {"advantages", "ref_logp", "teacher_logp", "teacher_logits"}
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    batch = {"mask": f32(mask), "advantages": f32(adv), "ref_logp": f32(ref_logp), "sampler_logp": f32(sampler_logp),
             "teacher_logp": f32(t_logp), "teacher_logits": f32(t_logits)}
    normalizer = float((n_i > 0).sum())

    def loss(logits):
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), y[..., None], -1)[..., 0]
        x = {**batch, "logits": logits, "logp": logp}
        values, _ = objective.term_losses(x, normalizer, mask.sum())
        return sum(w[k] * v for k, v in values.items())

    got = jax.grad(loss)(f32(z))
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-6)


def _batch(n=8, length=9, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.zeros((n, length - 1), np.float32)
    for i in range(n - 1):  # different lengths; the last row is padding
        mask[i, 2:3 + i % 5] = 1.0
    return {"tokens": rng.integers(1, CFG.vocab_size, (n, length)).astype(np.int32),
            "valid": np.ones((n, length), bool), "positions": np.tile(np.arange(length, dtype=np.int32), (n, 1)),
            "mask": mask, "sampler_logp": rng.normal(-2.5, 0.5, (n, length - 1)).astype(np.float32),
            "rewards": rng.normal(size=(2, n // 2)).astype(np.float32), "truncated": np.zeros((2, n // 2), bool),
            "domain_idx": np.arange(n, dtype=np.int32) % 2}


def _stage(**kw):
    return common.stage_config("grpo", onpolicy.DEFAULTS, **kw)


def _run(spec, aggregation, micro_batches=1, tx=None, steps=1, topk=0, batch=None, grad_clip=0.0):
    stage = _stage(objective=dict(terms=spec, aggregation=aggregation, distill_topk=topk or None, gjsd_beta=0.3))
    objective = objectives.build(stage.objective)
    params = init_params(CFG, jax.random.key(0))
    roles = update.FrozenRoles(CFG, objective.needs, reference=init_params(CFG, jax.random.key(1)),
                               teachers=(init_params(CFG, jax.random.key(2)), init_params(CFG, jax.random.key(3))),
                               teacher_of_domain=[0, 1], topk=topk)
    tx = tx or optax.sgd(1.0)
    state = train_state.create(params, tx, jax.random.key(0))
    fn = jax.jit(update.policy_step(tx, model_cfg=CFG, objective=objective, micro_batches=micro_batches,
                                    grad_clip=grad_clip, domains=((0, "a"), (1, "b"))))
    batch = batch or _batch()
    batch = batch | roles(batch)
    metrics = []
    for _ in range(steps):
        state, m = fn(state, batch)
        metrics.append(m)
    return params, state, metrics


TERMS = ["pg", "kl", "entropy", "mopd", "forward_kl", "reverse_kl", "gjsd", "nll"]


@pytest.mark.parametrize("term", TERMS)
def test_micro_batches_equal_the_full_batch_for_every_term(term):
    aggregation = "token_mean" if term in ("entropy", "nll") else "seq_mean_token_mean"
    _, full, (m_full,) = _run({term: 1.0}, aggregation)
    _, micro, (m_micro,) = _run({term: 1.0}, aggregation, micro_batches=4)
    for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(micro.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)
    for k in m_full:
        np.testing.assert_allclose(m_micro[k], m_full[k], rtol=1e-5, atol=1e-7, err_msg=k)
    assert float(m_full["grad_norm"]) > 0


def test_top_k_distillation_micro_batches_and_full_vocabulary_limit():
    # top-k = V is the full vocabulary, up to the order of the support
    _, full, (m_full,) = _run({"forward_kl": 1.0}, "seq_mean_token_mean")
    _, topv, (m_topv,) = _run({"forward_kl": 1.0}, "seq_mean_token_mean", topk=CFG.vocab_size)
    np.testing.assert_allclose(m_topv["loss"], m_full["loss"], rtol=1e-5)
    _, a, (ma,) = _run({"gjsd": 1.0}, "token_mean", topk=3)
    _, b, (mb,) = _run({"gjsd": 1.0}, "token_mean", topk=3, micro_batches=2)
    np.testing.assert_allclose(ma["loss"], mb["loss"], rtol=1e-5)
    assert 0 < float(ma["loss"]) < float(_run({"gjsd": 1.0}, "token_mean")[2][0]["loss"]) * 10


def test_scheduled_weight_follows_its_optax_schedule():
    spec = {"pg": 1.0, "kl": {"schedule": "linear", "init_value": 0.0, "end_value": 0.2, "transition_steps": 4}}
    _, _, metrics = _run(spec, "token_mean", steps=3)
    assert [round(float(m["weight/kl"]), 6) for m in metrics] == [0.0, 0.05, 0.1]
    for m in metrics:  # the loss is the weighted sum of the logged term values
        np.testing.assert_allclose(m["loss"], m["term/pg"] + m["weight/kl"] * m["term/kl"], rtol=1e-5)


def test_zero_weight_terms_are_not_in_the_compiled_step():
    def n_eqns(spec):
        objective = objectives.build(dict(terms=spec, aggregation="token_mean", **SETTINGS))
        tx = optax.sgd(1.0)
        state = train_state.create(init_params(CFG, jax.random.key(0)), tx, jax.random.key(0))
        return len(jax.make_jaxpr(update.policy_step(tx, model_cfg=CFG, objective=objective))(state, _batch()).eqns)
    assert n_eqns({"pg": 1.0, "entropy": 0.0, "kl": 0.0}) == n_eqns({"pg": 1.0})
    assert n_eqns({"pg": 1.0, "entropy": 0.1}) > n_eqns({"pg": 1.0})
    # and a frozen role only a zero-weight term reads is never scored
    spec = dict(terms={"pg": 1.0, "kl": 0.0, "mopd": 0.0}, aggregation="token_mean", **SETTINGS)
    assert objectives.build(spec).needs == {"advantages"}
    assert update.FrozenRoles(CFG, {"advantages"})(_batch()) == {}


def test_gradient_norm_and_clipping_are_logged_by_the_step():
    o = ml_collections.ConfigDict(dict(optim.DEFAULTS))
    o.update(lr=1e-2, grad_clip=0.05)
    tx, _ = optim.make_optimizer(o, 10)
    spec = {"pg": 1.0, "kl": 0.5}
    _, _, (m,) = _run(spec, "token_mean", tx=tx, grad_clip=o.grad_clip)
    # SGD at lr 1 moves the params by the gradient itself: its norm, from the params, is what the step logs
    params, state, (plain,) = _run(spec, "token_mean")
    moved = np.sqrt(sum(np.sum((np.asarray(a) - np.asarray(b)) ** 2)
                        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(state.params))))
    np.testing.assert_allclose(plain["grad_norm"], moved, rtol=1e-4)
    np.testing.assert_allclose(m["grad_norm"], moved, rtol=1e-4)  # the norm before clipping
    assert float(m["clipped"]) == 1.0 and moved > 0.05 and float(plain["clipped"]) == 0.0


def test_frozen_parameters_do_not_move():
    o = ml_collections.ConfigDict(dict(optim.DEFAULTS))
    o.update(lr=1e-2, freeze=("embed", "layers/.*/attn/.*"))
    tx, _ = optim.make_optimizer(o, 10)
    params, state, _ = _run({"pg": 1.0}, "token_mean", tx=tx)
    flat = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    moved = {jax.tree_util.keystr(k): not np.array_equal(np.asarray(v), np.asarray(flat[k]))
             for k, v in jax.tree_util.tree_flatten_with_path(state.params)[0]}
    frozen = [k for k in moved if k.startswith("['embed']") or "['attn']" in k]
    assert frozen and not any(moved[k] for k in frozen)
    assert any(moved[k] for k in moved if k not in frozen)


def test_objective_problems_name_the_key():
    bad = objectives.problems(dict(terms={"pg": 1.0, "kll": 0.1, "kl": "x", "entropy": {"schedule": "cosine"}},
                                   aggregation="tok", kl_estimator="k4", micro_batches=0, klestimator="k3"))
    assert any(b.startswith("objective.terms.kll: unknown term") for b in bad)
    assert any(b.startswith("objective.terms.kl='x': a weight is a number") for b in bad)
    assert any(b.startswith("objective.terms.entropy: bad schedule") for b in bad)
    assert any(b.startswith("objective.aggregation='tok'") for b in bad)
    assert any(b.startswith("objective.kl_estimator='k4'") for b in bad)
    assert any(b.startswith("objective.micro_batches=0") for b in bad)
    assert any(b.startswith("objective.klestimator: unknown key") for b in bad)
    assert objectives.problems(dict(terms={"pg": 0.0})) == [
        "objective.terms={'pg': 0.0}: every weight is 0, nothing would train"]


def test_a_term_name_cannot_be_taken_twice():
    with pytest.raises(ValueError, match="'pg' is already registered by nemocascade.objectives"):
        objectives.register("pg")(lambda x: (x["logp"], {}))
    with pytest.raises(ValueError, match="needs \\['rewards'\\]"):
        objectives.register("r", needs=("rewards",))


@pytest.mark.parametrize("term", ["pg", "kl", "mopd"])
def test_chunked_log_probs_give_the_update_of_the_whole_logits(term, monkeypatch):
    # a budget of 2 positions x 8 rows x vocab: the policy, reference and teacher passes run in chunks of 2
    # positions (4 chunks for 8 targets, the last one padded) and must give the same update and metrics
    _, whole, (m_whole,) = _run({term: 1.0}, "seq_mean_token_mean")
    monkeypatch.setattr(update, "LOGITS_BUDGET", 2 * 8 * CFG.vocab_size + 5)
    assert update.logit_chunk(_batch(), CFG.vocab_size) == 2
    _, chunked, (m_chunked,) = _run({term: 1.0}, "seq_mean_token_mean")
    for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(chunked.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)
    assert set(m_whole) == set(m_chunked)
    for k in m_whole:
        np.testing.assert_allclose(m_chunked[k], m_whole[k], rtol=1e-5, atol=1e-7, err_msg=k)
    assert float(m_whole["grad_norm"]) > 0 and float(m_whole["entropy"]) > 0


def test_a_term_reading_logits_unannounced_is_told_how():
    @objectives.register("_peek_logits")
    def peek(x):
        return x["logits"][..., 0], {}

    objective = objectives.build(dict(terms={"_peek_logits": 1.0}, aggregation="token_mean", **SETTINGS))
    assert not objective.reads_logits
    assert objectives.build(dict(terms={"entropy": 1.0}, aggregation="token_mean", **SETTINGS)).reads_logits
    with pytest.raises(KeyError, match=r"'_peek_logits' reads x\['logits'\].*logits=True"):
        objective.term_losses({"logp": jnp.zeros((1, 2)), "mask": jnp.ones((1, 2))}, 1.0, 2.0)
    objectives.TERMS.pop("_peek_logits")
