"""MOPD stage step: the update equals a hand-written MOPD gradient with each row's own teacher, the per-domain
reverse KL matches numpy, the full-distribution objectives reduce as documented; teacher registry and manifest."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nemocascade import named_checkpoints, objectives, train_state
from nemocascade.models import ModelConfig, forward, init_params
from nemocascade.rl import update
from nemocascade.stages import common, mopd


CFG = ModelConfig(vocab_size=13, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32)
LR = 0.1


def _stage(**kw):
    return common.stage_config("mopd", mopd.DEFAULTS, domains=["math", "if"], **kw)


def _batch(n=6, length=9, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.zeros((n, length - 1), np.float32)
    for i in range(n - 1):  # the last row is padding: no valid token
        mask[i, 3:4 + i % 4] = 1.0
    return {"tokens": rng.integers(1, CFG.vocab_size, (n, length)).astype(np.int32),
            "valid": np.ones((n, length), bool), "positions": np.tile(np.arange(length, dtype=np.int32), (n, 1)),
            "mask": mask, "sampler_logp": np.zeros((n, length - 1), np.float32),
            "teacher_idx": np.array([0, 1, 0, 1, 1, 0], np.int32), "domain_idx": np.array([0, 1, 0, 1, 1, 0], np.int32)}


def _logp(params, b):
    logits = forward(params, CFG, b["tokens"][:, :-1], b["positions"][:, :-1], b["valid"][:, :-1])
    return jnp.take_along_axis(jax.nn.log_softmax(logits), b["tokens"][:, 1:, None], -1)[..., 0]


def _setup(stage, seed=0):
    """(params, teacher params, state, step(state, batch, teachers)): the frozen-role passes, then the one
    on-policy update, as the stage loop runs them. Rows of domain i ("math", "if") get teacher i."""
    params = init_params(CFG, jax.random.key(seed))
    teacher_params = (init_params(CFG, jax.random.key(10)), init_params(CFG, jax.random.key(11)))
    tx = optax.sgd(LR)
    state = train_state.create(params, tx, jax.random.key(0))
    objective = objectives.build(stage.objective)
    update_fn = jax.jit(update.policy_step(tx, model_cfg=CFG, objective=objective, domains=((0, "math"), (1, "if"))))

    def step(state, batch, teachers):
        roles = update.FrozenRoles(CFG, objective.needs, teachers=teachers, teacher_of_domain=[0, 1],
                                   topk=stage.objective.distill_topk)
        n = len(batch["mask"])  # no reward: MOPD's objective reads no advantages
        batch = {k: v for k, v in batch.items() if k != "teacher_idx"}
        batch |= {"rewards": np.full((1, n), np.nan, np.float32), "truncated": np.zeros((1, n), bool)}
        return update_fn(state, batch | roles(batch))
    return params, teacher_params, state, step


def test_mopd_step_matches_hand_gradient_with_per_row_teachers():
    b = _batch()
    b["sampler_logp"] = None  # filled below: pi_inf != pi_train so the IS band matters
    params, teacher_params, state, step = _setup(_stage())
    lp = np.asarray(_logp(params, b))
    # sampler log-probs: ratio pi_train/pi_inf = exp(delta) with some tokens outside [0.5, 2]
    delta = np.random.default_rng(1).choice([0.0, 0.3, -0.4, 1.0, -1.0], size=lp.shape)
    b["sampler_logp"] = (lp - delta).astype(np.float32)
    t_lp = np.where(b["teacher_idx"][:, None] == 0, np.asarray(_logp(teacher_params[0], b)),
                    np.asarray(_logp(teacher_params[1], b)))
    ratio = np.exp(delta)
    w = np.where((ratio >= 0.5) & (ratio <= 2.0), ratio, 0.0)
    adv = t_lp - lp
    m = b["mask"]
    n_tok = m.sum(1)

    def hand(p):  # METHOD.md: -mean_responses[(1/|V|) sum_t w a log pi_train]
        per = jnp.sum(m * w * adv * _logp(p, b), 1) / np.maximum(n_tok, 1)
        return -jnp.sum(per) / (n_tok > 0).sum()

    g = jax.grad(hand)(params)
    new, metrics = step(state, b, teacher_params)
    for p0, p1, gi in zip(jax.tree.leaves(params), jax.tree.leaves(new.params), jax.tree.leaves(g)):
        np.testing.assert_allclose(np.asarray(p0 - p1), LR * np.asarray(gi), atol=1e-6)
    np.testing.assert_allclose(metrics["loss"], hand(params), rtol=1e-5)
    rkl = (lp - t_lp) * m
    np.testing.assert_allclose(metrics["reverse_kl"], rkl.sum() / m.sum(), rtol=1e-5)
    for i, d in enumerate(("math", "if")):
        rows = b["domain_idx"] == i
        np.testing.assert_allclose(metrics[f"reverse_kl/{d}"], rkl[rows].sum() / m[rows].sum(), rtol=1e-5)
    in_band = ((ratio >= 0.5) & (ratio <= 2.0)) * m
    np.testing.assert_allclose(metrics["is_clip_frac"], 1 - in_band.sum() / m.sum(), rtol=1e-5)


@pytest.mark.parametrize("needs,topk", [({"teacher_logp", "ref_logp"}, 0), ({"teacher_logits"}, 4)])
def test_frozen_roles_in_micro_batches_equal_one_pass(needs, topk):
    """Three micro-batches of two rows each (per-row teachers, the reference, top-k logits) give what one pass over
    the six rows gives: each row's own teacher's log-probs, per row, against `_logp` by hand."""
    b = _batch()
    params = init_params(CFG, jax.random.key(0))
    teachers = (init_params(CFG, jax.random.key(10)), init_params(CFG, jax.random.key(11)))
    kw = dict(reference=params, teachers=teachers, teacher_of_domain=[0, 1], topk=topk)
    whole = update.FrozenRoles(CFG, needs, **kw)(b)
    split = update.FrozenRoles(CFG, needs, micro_batches=3, **kw)(b)
    assert sorted(whole) == sorted(split)
    for k in whole:
        np.testing.assert_allclose(np.asarray(split[k]), np.asarray(whole[k]), atol=1e-6, err_msg=k)
    if "teacher_logp" in needs:
        by_hand = np.where((b["teacher_idx"] == 0)[:, None], _logp(teachers[0], b), _logp(teachers[1], b))
        np.testing.assert_allclose(np.asarray(split["teacher_logp"]), by_hand, atol=1e-5)
        np.testing.assert_allclose(np.asarray(split["ref_logp"]), np.asarray(_logp(params, b)), atol=1e-5)


def test_student_equal_to_teacher_has_zero_loss_and_gradient():
    b = _batch()
    params, _, state, step = _setup(_stage())
    b["sampler_logp"] = np.asarray(_logp(params, b))
    new, metrics = step(state, b, (params, params))
    assert float(metrics["reverse_kl"]) == pytest.approx(0.0, abs=1e-7)
    assert float(metrics["grad_norm"]) == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize("objective", ["forward_kl", "reverse_kl", "gjsd"])
def test_full_distribution_objectives_reduce_per_response_then_mean(objective):
    b = _batch()
    stage = _stage(objective=dict(terms={"mopd": 0.0, objective: 1.0}, gjsd_beta=0.3))
    params, teacher_params, state, step = _setup(stage)
    _, metrics = step(state, b, teacher_params)

    def log_softmax(x):
        x = np.asarray(x, np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    run = lambda p: forward(p, CFG, b["tokens"][:, :-1], b["positions"][:, :-1], b["valid"][:, :-1])  # noqa: E731
    ls = log_softmax(run(params))
    lt = np.where(b["teacher_idx"][:, None, None] == 0, log_softmax(run(teacher_params[0])),
                  log_softmax(run(teacher_params[1])))
    ps, pt = np.exp(ls), np.exp(lt)
    if objective == "forward_kl":
        per_tok = (pt * (lt - ls)).sum(-1)
    elif objective == "reverse_kl":
        per_tok = (ps * (ls - lt)).sum(-1)
    else:
        pm = 0.3 * pt + 0.7 * ps
        per_tok = 0.3 * (pt * (lt - np.log(pm))).sum(-1) + 0.7 * (ps * (ls - np.log(pm))).sum(-1)
    m = b["mask"]
    n_tok = m.sum(1)
    want = ((m * per_tok).sum(1) / np.maximum(n_tok, 1)).sum() / (n_tok > 0).sum()
    np.testing.assert_allclose(metrics["loss"], want, rtol=1e-4)


def test_teacher_refs_default_to_best_per_domain_and_reject_foreign_domains():
    refs = mopd.KIND.teacher_refs
    assert refs(_stage(objective=dict(teachers={"if": "stage:ifrl"}))) == {"math": "best:math", "if": "stage:ifrl"}
    with pytest.raises(ValueError, match="code"):
        refs(_stage(objective=dict(teachers={"code": "stage:x"})))
    # the objective decides: no term reads a teacher, no teacher is loaded
    assert refs(_stage(objective=dict(terms={"mopd": 0.0, "nll": 1.0}))) == {}


def test_registry_best_per_domain_keeps_the_earlier_stage_on_ties(tmp_path):
    reg = named_checkpoints.NamedCheckpoints(str(tmp_path))
    reg.add_stage("sft", "/p/sft", {"math": 0.5, "if": 0.2})
    reg.add_stage("ifrl", "/p/ifrl", {"math": 0.5, "if": 0.6})
    reg.add_stage("rlhf", "/p/rlhf", {"math": 0.4, "if": 0.7}, side_branch=True, started_from="sft")
    assert reg.stage_of("best:math") == "sft"  # tie 0.5 = 0.5: the earlier checkpoint stays
    assert reg.stage_of("best:if") == "rlhf"  # side branches count
    assert reg.path("stage:ifrl") == "/p/ifrl" and reg.score("best:if", "math") == 0.4
    reg.add_stage("inside", str(tmp_path / "final" / "inside"), {"math": 0.0})  # under the registry's directory
    assert reg.data["stages"]["inside"]["path"] == os.path.join("final", "inside")  # recorded relative to it
    assert reg.path("stage:inside") == str(tmp_path / "final" / "inside")
    again = named_checkpoints.NamedCheckpoints(str(tmp_path))  # persisted
    assert again.stage_of("best:if") == "rlhf"
    with pytest.raises(KeyError, match="best:code"):
        reg.stage_of("best:code")
    with pytest.raises(KeyError, match="start with"):
        reg.stage_of("sft")
    # one teacher for several domains: the best mean (sft 0.35, ifrl 0.55, rlhf 0.55: the tie keeps ifrl)
    assert reg.stage_of("best:math+if") == "ifrl"
    reg.add_stage("later", "/p/later", {"math": 0.6, "if": 0.52})  # mean 0.56
    assert reg.stage_of("best:if+math") == "later"
    with pytest.raises(KeyError, match="best:math\\+code"):
        reg.stage_of("best:math+code")  # no stage scored code


def test_manifest_refuses_a_resume_with_another_teacher(tmp_path):
    first = {"rewards": {"mopd/math": "nemocascade.rewards.math.score"}, "teachers": {"mopd": {"math": "best:math"}}}
    named_checkpoints.check_manifest(str(tmp_path), first)
    named_checkpoints.check_manifest(str(tmp_path), json.loads(json.dumps(first)))  # same mapping: fine
    extended = {"rewards": {**first["rewards"], "arm/math": "nemocascade.rewards.math.score"},
                "teachers": first["teachers"]}
    named_checkpoints.check_manifest(str(tmp_path), extended)  # a stage added to the run: recorded, not refused
    assert "arm/math" in json.load(open(tmp_path / "manifest.json"))["rewards"]
    changed = {**first, "teachers": {"mopd": {"math": "stage:sft"}}}
    with pytest.raises(ValueError, match=r"teachers\['mopd'\].*best:math.*stage:sft"):
        named_checkpoints.check_manifest(str(tmp_path), changed)
