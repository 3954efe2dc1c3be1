"""RLHF pieces: the Bradley-Terry loss, the scalar RM's last-token read-out under padding, Cascade 2's pairwise
aggregation, the "pref" preference domain and its proxy judge, and an RM trained on "pref" pairs that ranks
held-out pairs far above chance (through the RM stage, with its checkpoint, resume and saved RM)."""
import collections
import json
import math
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from nemocascade import chat, losses
from nemocascade.data import domains, preference
from nemocascade.mesh import make_mesh
from nemocascade.models import ModelConfig, forward_hidden, init_params, param_shardings, reward_model
from nemocascade.models.transformer import left_pad_positions
from nemocascade.data.domains import verifier
from nemocascade.rewards import pref, rm_scorer
from nemocascade.run_log import RunLog
from nemocascade.stages import common, rm
from nemocascade.tokenizer import load_or_train

# ------------------------------------------------------------------------------ Bradley-Terry loss


def test_bradley_terry_hand_example():
    # gaps 2 and -1: -log sigmoid(2) = log(1 + e^-2) = 0.126928, -log sigmoid(-1) = log(1 + e) = 1.313262
    loss, m = losses.bradley_terry_loss(jnp.array([2.0, 0.0]), jnp.array([0.0, 1.0]))
    assert float(loss) == pytest.approx((0.126928011 + 1.313261687) / 2, abs=1e-6)
    assert float(m["accuracy"]) == 0.5 and float(m["reward_gap"]) == pytest.approx(0.5)
    # margin 1: gaps 1 and -2 -> log(1 + e^-1) = 0.313262, log(1 + e^2) = 2.126928
    loss, _ = losses.bradley_terry_loss(jnp.array([2.0, 0.0]), jnp.array([0.0, 1.0]), margin=1.0)
    assert float(loss) == pytest.approx((0.313261687 + 2.126928011) / 2, abs=1e-6)
    # equal scores: loss log 2, and a tie is not a win
    loss, m = losses.bradley_terry_loss(jnp.zeros(3), jnp.zeros(3))
    assert float(loss) == pytest.approx(math.log(2), abs=1e-7) and float(m["accuracy"]) == 0.0


def test_bradley_terry_matches_numpy_value_and_gradient():
    rng = np.random.default_rng(0)
    rc, rr = rng.normal(0, 3, 64), rng.normal(0, 3, 64)
    margin = 0.5
    gap = rc - rr - margin
    ref = np.mean(-np.log(1.0 / (1.0 + np.exp(-gap))))
    loss, m = losses.bradley_terry_loss(jnp.asarray(rc, jnp.float32), jnp.asarray(rr, jnp.float32), margin)
    assert float(loss) == pytest.approx(ref, rel=1e-5)
    assert float(m["accuracy"]) == pytest.approx(np.mean(rc > rr))
    g = jax.grad(lambda c: losses.bradley_terry_loss(c, jnp.asarray(rr, jnp.float32), margin)[0])(
        jnp.asarray(rc, jnp.float32))
    np.testing.assert_allclose(np.asarray(g), -(1.0 / (1.0 + np.exp(gap))) / len(rc), rtol=1e-4, atol=1e-8)
    # stable for huge gaps: softplus, not log(sigmoid)
    loss, _ = losses.bradley_terry_loss(jnp.array([200.0, -200.0]), jnp.array([0.0, 0.0]))
    assert float(loss) == pytest.approx(100.0, rel=1e-6)


# ------------------------------------------------------------------------------ scalar RM read-out

CFG = ModelConfig(vocab_size=17, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32)


def test_last_valid_index_hand_example():
    valid = np.array([[0, 0, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], bool)
    assert reward_model.last_valid_index(jnp.asarray(valid)).tolist() == [4, 1, 5, 5]


def test_rm_scores_read_the_last_real_token_of_left_and_right_padded_rows():
    policy = jax.jit(init_params, static_argnums=0)(CFG, jax.random.key(0))
    params = reward_model.init_rm(policy, CFG, jax.random.key(1), head_std=1.0)
    rng = np.random.default_rng(0)
    rows = [rng.integers(1, CFG.vocab_size, n).astype(np.int32) for n in (5, 5, 5, 9)]
    T = 9
    tokens = rng.integers(1, CFG.vocab_size, (4, T)).astype(np.int32)  # padding slots hold junk, not pad ids
    valid = np.zeros((4, T), bool)
    for b, (ids, left) in enumerate(zip(rows, (4, 0, 2, 0))):  # left-, right-, both-sided and no padding
        tokens[b, left:left + len(ids)], valid[b, left:left + len(ids)] = ids, True
    scores = jax.jit(reward_model.rm_scores, static_argnums=1)
    got = scores(params, CFG, jnp.asarray(tokens), left_pad_positions(jnp.asarray(valid)), jnp.asarray(valid))
    hidden = jax.jit(lambda p, t: forward_hidden(p, CFG, t))
    want = []
    for ids in rows:  # each row alone, unpadded: the head on its final hidden state
        h = hidden(params, jnp.asarray(ids)[None])
        want.append(float(h[0, -1] @ params["rm_head"]["w"] + params["rm_head"]["b"]))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    assert len(set(np.round(want, 4))) == 4  # distinct rows: a wrong read-out position could not pass
    # the body is the policy, untouched; a zero head (the default) scores everything 0
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(policy), jax.tree.leaves(
        {k: v for k, v in params.items() if k != "rm_head"})))
    zero = reward_model.init_rm(policy, CFG, jax.random.key(1))
    assert np.all(np.asarray(scores(zero, CFG, jnp.asarray(tokens), None, jnp.asarray(valid))) == 0)


def test_rm_param_shardings_cover_the_head():
    mesh = make_mesh()
    shard = reward_model.param_shardings(CFG, mesh)
    assert jax.tree.structure(shard) == jax.tree.structure(reward_model.init_rm(
        init_params(CFG, jax.random.key(0)), CFG, jax.random.key(0)))
    assert shard["rm_head"]["w"].spec == jax.sharding.PartitionSpec(None)
    assert shard["layers"] == param_shardings(CFG, mesh)["layers"]


# ------------------------------------------------------------------------------ Cascade 2 pairwise rewards

# base = [0.55, 0.55, 0.40]; Copeland (wins - losses) = [2, 0, -2]; the smallest gap 0.15 > 2 * 1e-3, so
# eps = 1e-3 and the tie-break adds 1e-3 * (C + 2) / 4 = [1e-3, 5e-4, 0].
PREF3 = np.array([[0.5, 0.55, 0.55], [0.45, 0.5, 0.65], [0.45, 0.35, 0.5]])


def test_pairwise_rewards_mean_and_tie_break_by_copeland():
    np.testing.assert_allclose(rm_scorer.pairwise_rewards(PREF3), [0.551, 0.5505, 0.40], atol=1e-12)
    # the diagonal is ignored
    np.testing.assert_allclose(rm_scorer.pairwise_rewards(PREF3 + np.eye(3)), [0.551, 0.5505, 0.40], atol=1e-12)
    # a cycle (each beats the next 0.9 to 0.1): equal means and equal Copeland scores stay tied
    cyc = np.array([[0.5, 0.9, 0.1], [0.1, 0.5, 0.9], [0.9, 0.1, 0.5]])
    r = rm_scorer.pairwise_rewards(cyc)
    assert np.ptp(r) == 0 and r[0] == pytest.approx(0.5005)
    # a tiny gap shrinks eps so the tie-break never reorders different means
    close = np.array([[0.5, 0.5001], [0.4999, 0.5]])  # base [0.5001, 0.4999], gap 2e-4 -> eps 1e-4
    np.testing.assert_allclose(rm_scorer.pairwise_rewards(close), [0.5001 + 1e-4, 0.4999], atol=1e-12)
    assert rm_scorer.pairwise_rewards(np.full((1, 1), 0.5)).tolist() == [0.5]


def test_pairwise_rewards_quality_gated_conciseness_bonus():
    # gated (base >= 0.5): rollouts 0 and 1, lengths 30 and 20 -> bonus 0.1 * (30 - L) / 10 = [0, 0.1];
    # rollout 2 is the shortest but below the gate: no bonus
    r = rm_scorer.pairwise_rewards(PREF3, lengths=[30, 20, 10], conciseness_bonus=0.1, quality_gate=0.5)
    np.testing.assert_allclose(r, [0.551, 0.6505, 0.40], atol=1e-12)
    r = rm_scorer.pairwise_rewards(PREF3, lengths=[30, 20, 10], conciseness_bonus=0.1, quality_gate=0.3)
    np.testing.assert_allclose(r, [0.551, 0.6005, 0.50], atol=1e-12)  # all gated: (30 - L) / 20
    np.testing.assert_allclose(rm_scorer.pairwise_rewards(PREF3, lengths=[7, 7, 7], conciseness_bonus=0.1),
                               [0.551, 0.5505, 0.40], atol=1e-12)


def test_reward_model_source_scores_groups_scalar_and_pairwise():
    """The RLHF reward source over a stub RM scoring each group of 2 (0, ln 3): "scalar" hands the scores on, per
    group; "pairwise" is C2's aggregation (pinned above) of their BT preferences (test_bt_preferences), per group."""
    from nemocascade.stages import common, grpo, reward_sources

    class StubRM:
        def score(self, prompts, texts):
            return np.tile([0.0, math.log(3.0)], len(prompts) // 2)

    for mode in ("scalar", "pairwise"):
        stage = common.stage_config("grpo", grpo.DEFAULTS, domains=["pref"], rollout=dict(group_size=2),
                                    reward=dict(source="reward_model", model="rm", mode=mode))
        scorer = object.__new__(reward_sources.RewardModelScorer)
        scorer.stage, scorer.rm = stage, StubRM()
        got = scorer([{"prompt": "a"}, {"prompt": "b"}], ["x"] * 4, np.array([[5, 5], [5, 5]]))
        want = ([0.0, math.log(3.0)] if mode == "scalar" else
                rm_scorer.pairwise_rewards(rm_scorer.bt_preferences([0.0, math.log(3.0)])))
        np.testing.assert_allclose(got, [want, want], atol=1e-12)
    assert scorer.take_metrics() == {}


def test_bt_preferences():
    p = rm_scorer.bt_preferences([0.0, math.log(3.0)])
    np.testing.assert_allclose(p, [[0.5, 0.25], [0.75, 0.5]], atol=1e-12)
    np.testing.assert_allclose(rm_scorer.pairwise_rewards(p), [0.25, 0.751], atol=1e-12)
    assert np.isfinite(rm_scorer.bt_preferences([1e4, -1e4])).all()
    s = np.random.default_rng(0).normal(size=8)
    p = rm_scorer.bt_preferences(s)
    np.testing.assert_allclose(p + p.T, 1.0, atol=1e-12)
    assert np.argsort(rm_scorer.pairwise_rewards(p)).tolist() == np.argsort(s).tolist()


def test_final_text_and_rm_text():
    assert rm_scorer.final_text("<think>\nplan\n</think>\nDogs bark.<|im_end|>") == "Dogs bark."
    assert rm_scorer.final_text("<think>\nstill thinking") == "still thinking"  # unfinished: the whole text
    assert rm_scorer.rm_text("Hi?", "Dogs bark.") == (
        "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n<think></think>\nDogs bark.<|im_end|>")


# ------------------------------------------------------------------------------ proxy judge

SPEC = json.dumps({"chosen": "x", "rejected": "y", "kind": "verbose", "topic": "sleep", "keywords": ["sleep"],
                   "min_words": 3, "max_words": 10})


def _turn(final):
    return f"<think>\nTopic: sleep.\n</think>\n{final}<|im_end|>"


@pytest.mark.parametrize("completion,expected", [
    (_turn("Keep your room dark for better sleep."), 1.0),
    ("<think>\nKeep your room dark for better sleep.", 0.0),           # unfinished think block
    (_turn(""), 0.0),
    (_turn("I don't know."), 0.0),
    (_turn("Sleep? I DON\u2019T KNOW."), 0.0),                         # curly apostrophe, upper case
    (_turn("Walk your dog every day."), 2 / 3),                         # off topic
    (_turn("That is a good question. Keep your room dark for better sleep."), 2 / 3),  # 12 words > 10
    (_turn("Sleep well. Sleep well."), 2 / 3),                          # a sentence repeated
    (_turn("sleep is good sleep is good sleep is good"), 2 / 3),        # a loop: 4-gram repeated
    (_turn("Sleep."), 2 / 3),                                           # 1 word < 3
    (_turn("Walk the dog. Walk the dog."), 1 / 3),                     # off topic and repeated
])
def test_proxy_judge_hand_cases(completion, expected):
    assert verifier("pref") is pref.score
    assert pref.score(completion, SPEC) == pytest.approx(expected)


def test_proxy_judge_never_raises():
    assert pref.score(_turn("Sleep well now."), "not json") == 0.0
    assert pref.score(_turn("Sleep well now."), json.dumps({"keywords": ["sleep"]})) == 0.0


# ------------------------------------------------------------------------------ the "pref" domain


def test_pref_generate_is_deterministic_valid_and_short():
    gen = domains.get_domain("pref").generate
    a = gen(np.random.default_rng(5), 300)
    assert a == gen(np.random.default_rng(5), 300) and a != gen(np.random.default_rng(6), 300)
    vocab = set()
    for i, r in enumerate(a):
        domains.validate_record(r, i)
        pair = json.loads(r["answer"])
        assert r["response"] == pair["chosen"] and pref.score(_turn(pair["chosen"]), r["answer"]) == 1.0
        assert pref.score(_turn(pair["rejected"]), r["answer"]) <= 2 / 3
        assert len(pref.words(r["prompt"])) <= 40 and len(pref.words(r["reasoning"] + " " + r["response"])) <= 60
        vocab |= set(pref.words(" ".join((r["prompt"], r["reasoning"], pair["chosen"], pair["rejected"]))))
    assert len({r["id"] for r in a}) == 300 and len(vocab) < 500
    assert set(collections.Counter(json.loads(r["answer"])["kind"] for r in a)) == set(preference.KINDS)
    only = gen(np.random.default_rng(0), 50, kinds={"off_topic": 1.0})
    assert {json.loads(r["answer"])["kind"] for r in only} == {"off_topic"}
    with pytest.raises(ValueError, match="kinds="):
        gen(np.random.default_rng(0), 1, kinds={"rude": 1.0})


def test_pref_topics_are_separable_by_keyword():
    for topic, (keyword, table) in preference.TOPICS.items():
        for sentence in (s for sents in table.values() for s in sents):
            assert keyword in sentence.lower(), sentence
            assert not [k for t, (k, _) in preference.TOPICS.items() if t != topic and k in sentence.lower()]
    for text in preference.FILLER + preference.UNHELPFUL:
        assert not [k for k, _ in preference.TOPICS.values() if k in text.lower()]


def test_pref_split_is_by_request_and_no_heldout_answer_leaks_into_training():
    key = domains.problem_key
    train = domains.generate_split("pref", "train", 1500, seed=0)
    test = domains.generate_split("pref", "test", 200, seed=0)
    assert all(domains.split_of(key(r)) == "train" for r in train)
    assert all(domains.split_of(key(r)) == "test" for r in test)
    assert not {key(r) for r in train} & {key(r) for r in test}
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    train_texts = {t for r in train for t in (json.loads(r["answer"])["chosen"], json.loads(r["answer"])["rejected"])}
    assert not {json.loads(r["answer"])["chosen"] for r in test} & train_texts


def test_pref_imperfect_teacher_pads_its_response_only():
    gen = domains.get_domain("pref").generate
    good = gen(np.random.default_rng(3), 100, split=None, teacher_error_rate=0.0)
    bad = gen(np.random.default_rng(3), 100, split=None, teacher_error_rate=1.0)
    assert [r["answer"] for r in good] == [r["answer"] for r in bad]
    assert [r["prompt"] for r in good] == [r["prompt"] for r in bad]
    assert all(pref.score(_turn(r["response"]), r["answer"]) == 1.0 for r in good)
    assert all(pref.score(_turn(r["response"]), r["answer"]) == pytest.approx(2 / 3) for r in bad)
    assert all("friendly extra words" in r["reasoning"] for r in bad)


# ------------------------------------------------------------------------------ RM stage end to end


def _ctx(tmp_path, num_train=2000):
    train = domains.generate_split("pref", "train", num_train, 0)
    test = domains.generate_split("pref", "test", 256, 0)
    tok = load_or_train(str(tmp_path / "t.model"), lambda: (
        chat.render_prompt(r["prompt"]) + chat.render_completion(r["reasoning"], r["response"]) for r in train), 512)
    mcfg = ModelConfig(vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                       d_ff=192, tie_embeddings=True)
    mesh = make_mesh()
    cfg = ml_collections.ConfigDict(dict(seed=0, stage_order=("rm",)))
    return common.RunContext(cfg, str(tmp_path), mesh, mcfg, tok, {"pref": {"train": train, "test": test}},
                             RunLog(str(tmp_path), "test", None, 0), param_shardings(mcfg, mesh), None)


def test_rm_stage_learns_heldout_preferences(tmp_path):
    """40 steps x 16 pairs from a random policy. Measured: held-out pairwise accuracy 0.867 on 256 pairs
    (verbose, repetitive, unhelpful 1.0; off-topic 0.37: the RM scores texts it saw preferred, and the
    held-out off-topic answer is such a text, so beating it needs reading the prompt, which it has not learnt)."""
    ctx = _ctx(tmp_path)
    stage = common.stage_config("rm", rm.DEFAULTS, steps=40, batch_size=16, seq_len=80, eval_pairs=256,
                                checkpoint_every=20, optim=dict(lr=1e-3))
    policy = init_params(ctx.model_cfg, jax.random.key(0))
    before = [np.asarray(x).copy() for x in jax.tree.leaves(policy)]
    out = rm.run(ctx, "rm", stage, policy)
    assert out is policy and all(np.array_equal(a, np.asarray(b)) for a, b in zip(before, jax.tree.leaves(out)))

    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == list(range(40))
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)  # zero head: every score 0
    assert np.mean([r["loss"] for r in rows[-10:]]) < 0.5
    acc = rows[-1]["eval/pref/pairwise_acc"]
    assert acc >= 0.75, rows[-1]
    for kind in ("verbose", "unhelpful", "repetitive"):  # 0.875 for one kind in the packages installed 2026-12-06
        # (b1ab5cc gives the same numbers there), 1.0 each before
        assert rows[-1][f"eval/pref/pairwise_acc/{kind}"] >= 0.85, rows[-1]

    # the saved RM scores the held-out pairs exactly as the stage did; the stage resumes without retraining
    scorer = rm_scorer.RewardModelScorer.load(rm.rm_path(str(tmp_path), "rm"), ctx.model_cfg, ctx.tokenizer,
                                              batch_size=16, max_len=80)
    test = ctx.sources["pref"]["test"]
    pairs = [json.loads(r["answer"]) for r in test]
    completions = lambda side: [f"<think>\nplan\n</think>\n{p[side]}<|im_end|>" for p in pairs]  # noqa: E731
    prompts = [r["prompt"] for r in test]
    wins = scorer.score(prompts, completions("chosen")) > scorer.score(prompts, completions("rejected"))
    assert float(wins.mean()) == pytest.approx(acc)
    rm_params, scores = rm.train_rm(ctx, "rm", stage, policy)
    assert scores["eval/pref/pairwise_acc"] == pytest.approx(acc)
    assert len([json.loads(line) for line in open(tmp_path / "metrics.jsonl")]) == 40


def test_rm_stage_rejects_keep_and_non_preference_domains(tmp_path):
    ctx = _ctx(tmp_path, num_train=64)
    policy = init_params(ctx.model_cfg, jax.random.key(0))
    keep = common.stage_config("rm", rm.DEFAULTS, optim=dict(state="keep"))
    assert rm.check(keep, {}) == ["optim.state='keep': an RM stage trains a new pytree (policy + scalar head), so "
                                  "there is no optimiser state to keep; use 'reset'"]
    ctx.sources["math"] = {"train": domains.generate_split("math", "train", 4, 0), "test": []}
    with pytest.raises(ValueError, match="no preference pairs"):
        rm.train_rm(ctx, "rm", common.stage_config("rm", rm.DEFAULTS, domains=["math"]), policy)


# ------------------------------------------------------------------------------ sharding (8 fake devices)

SHARDED = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from nemocascade import losses, mesh as mesh_lib
    from nemocascade.models import ModelConfig, init_params, reward_model
    from nemocascade.models.transformer import left_pad_positions

    assert jax.device_count() == 8
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64)
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    shard = reward_model.param_shardings(cfg, mesh)
    params = reward_model.init_rm(init_params(cfg, jax.random.key(0)), cfg, jax.random.key(1), head_std=1.0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 64, (8, 12)).astype(np.int32)
    valid = np.arange(12)[None] < rng.integers(3, 13, 8)[:, None]

    def loss(p, t, v):
        r = reward_model.rm_scores(p, cfg, t, left_pad_positions(v), v)
        return losses.bradley_terry_loss(r[:4], r[4:])[0]

    fn = jax.jit(jax.value_and_grad(loss))
    cpu0 = jax.devices()[0]
    ref = fn(jax.device_put(params, cpu0), jax.device_put(tokens, cpu0), jax.device_put(valid, cpu0))
    sharded = jax.device_put(params, shard)
    batch = mesh_lib.shard_batch(mesh, (tokens, valid))
    out = fn(sharded, *batch)
    np.testing.assert_allclose(float(out[0]), float(ref[0]), rtol=1e-5)
    for g, gr in zip(jax.tree.leaves(out[1]), jax.tree.leaves(ref[1])):
        np.testing.assert_allclose(np.asarray(g), np.asarray(gr), rtol=1e-4, atol=1e-6)
    # the body is sharded like the policy (fsdp x tensor), the head replicated
    assert sharded["layers"]["w_up"].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert sharded["rm_head"]["w"].sharding.is_fully_replicated and sharded["rm_head"]["b"].sharding.is_fully_replicated
    print("OK")
""")


@pytest.mark.slow
def test_rm_on_eight_fake_devices_matches_one_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SHARDED], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
