"""GRPO stage pieces: the jitted update (micro-batching == full batch, no-op when everything was
filtered, the gradient of the pg term on a hand-checked case), batch building with filters, curriculum."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nemocascade import objectives, train_state
from nemocascade.models import ModelConfig, forward, init_params
from nemocascade.rl import filters, update
from nemocascade.rl.rollouts import RolloutSource
from nemocascade.stages import common, grpo, onpolicy

from conftest import logged

CFG = ModelConfig(vocab_size=17, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32)


def _stage(**kw):
    return common.stage_config("grpo", grpo.DEFAULTS, **kw)


def _batch(n=8, length=10, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, CFG.vocab_size, (n, length)).astype(np.int32)
    mask = np.zeros((n, length - 1), np.float32)
    for i in range(n):  # responses of different lengths after a 4-token prompt
        mask[i, 3:3 + 1 + i % 5] = 1.0
    return {"tokens": tokens, "valid": np.ones((n, length), bool),
            "positions": np.tile(np.arange(length, dtype=np.int32), (n, 1)), "mask": mask,
            "sampler_logp": np.zeros((n, length - 1), np.float32),
            "advantages": rng.normal(size=n).astype(np.float32), "has_data": np.float32(1)}


def _update_fn(stage, tx, cfg=CFG):
    """The jitted on-policy update the stage loop runs, for `stage`'s objective."""
    objective = objectives.build(stage.objective, stage.aggregation, stage)
    return jax.jit(lambda s, b: update.policy_update(s, b, model_cfg=cfg, tx=tx, objective=objective,
                                                     micro_batches=stage.micro_batches))


def _step(stage, batch, tx=None, params=None):
    tx = logged(tx or optax.sgd(1.0))
    params = params if params is not None else init_params(CFG, jax.random.key(0))
    state = train_state.create(params, tx, jax.random.key(0))
    return _update_fn(stage, tx)(state, {**batch, "domain_idx": np.zeros(len(batch["tokens"]), np.int32)})


def _build(groups, stage, target, **kw):
    return update.build_batch(groups, overlong=stage.overlong, adv_eps=stage.adv_eps, target=target, **kw)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "constant"])
def test_micro_batches_give_the_full_batch_update(aggregation):
    batch = _batch()
    full, m_full = _step(_stage(aggregation=aggregation), batch)
    micro, m_micro = _step(_stage(aggregation=aggregation, micro_batches=4), batch)
    for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(micro.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(m_full["loss"], m_micro["loss"], rtol=1e-5)


def test_pg_gradient_equals_hand_formula():
    """d/dtheta of -sum m A logp / sum m, checked against jax.grad of the same formula written out
    with the model's own log-probs (independent of losses.grpo_loss)."""
    batch = _batch(n=4, seed=3)
    params = init_params(CFG, jax.random.key(1))
    new, _ = _step(_stage(), batch, params=params)

    def hand(p):
        logits = forward(p, CFG, batch["tokens"][:, :-1])
        lp = jax.nn.log_softmax(logits)
        lp = jnp.take_along_axis(lp, batch["tokens"][:, 1:, None], -1)[..., 0]
        return -jnp.sum(batch["mask"] * batch["advantages"][:, None] * lp) / batch["mask"].sum()

    g = jax.grad(hand)(params)
    for p0, p1, gi in zip(jax.tree.leaves(params), jax.tree.leaves(new.params), jax.tree.leaves(g)):
        np.testing.assert_allclose(np.asarray(p0 - p1), np.asarray(gi), atol=1e-6)


def test_all_filtered_step_changes_nothing_but_the_counter():
    batch = {**_batch(), "has_data": np.float32(0)}
    params = init_params(CFG, jax.random.key(0))
    new, _ = _step(_stage(), batch, tx=optax.adamw(1e-2), params=params)
    assert int(new.step) == 1
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _groups(rewards, truncated):
    P, G = rewards.shape
    return {"tokens": np.ones((P, G, 5), np.int32), "valid": np.ones((P, G, 5), bool),
            "positions": np.zeros((P, G, 5), np.int32), "mask": np.ones((P, G, 4), np.float32),
            "sampler_logp": np.zeros((P, G, 4), np.float32), "rewards": rewards, "truncated": truncated,
            "domain_idx": np.zeros(P, np.int32)}


def test_build_batch_advantages_overlong_and_padding():
    rewards = np.array([[1, 0, 0, 1], [1, 1, 0, 1]], np.float32)
    trunc = np.array([[0, 0, 1, 0], [0, 0, 0, 0]], bool)
    # hand-worked: group 0 mean .5 std .5 -> +-.5/(.5+eps); group 1 mean .75 std sqrt(3)/4=.4330
    eps = 1e-6
    a0 = [0.5 / (0.5 + eps), -0.5 / (0.5 + eps), -0.5 / (0.5 + eps), 0.5 / (0.5 + eps)]
    s1 = np.sqrt(0.1875)
    a1 = [0.25 / (s1 + eps)] * 2 + [-0.75 / (s1 + eps), 0.25 / (s1 + eps)]
    b = _build(_groups(rewards, trunc), _stage(overlong="filter"), target=3, group_bucket=0)
    np.testing.assert_allclose(b["advantages"], a0 + a1 + [0] * 4, rtol=1e-6)
    assert b["mask"].shape == (12, 4)
    assert b["mask"].sum(1).tolist() == [4, 4, 0, 4] + [4] * 4 + [0] * 4  # truncated masked, pad zero
    # penalty: the truncated rollout gets reward 0 (already 0 here) and stays in the loss
    b = _build(_groups(rewards, trunc), _stage(overlong="penalty"), target=2)
    assert b["mask"].sum() == 8 * 4 and b["has_data"] == 1
    empty = _build(_groups(rewards[:0], trunc[:0]), _stage(), target=2, group_bucket=0)
    assert empty["has_data"] == 0 and empty["mask"].shape == (8, 4) and empty["mask"].sum() == 0
    # default: pad only up to a multiple of group_bucket groups (4 here -> 2 groups + 2 zero groups)
    b = _build(_groups(rewards, trunc), _stage(), target=16)
    assert b["advantages"].shape == (16,) and b["mask"][8:].sum() == 0


def test_length_curriculum_sub_stages():
    stage = _stage(length_curriculum=((0, 64), (10, 96), (30, 128)))
    assert [onpolicy.max_new_tokens_at(stage, s) for s in (0, 9, 10, 29, 30, 99)] == [64, 64, 96, 96, 128, 128]


def test_unknown_stage_key_is_named():
    with pytest.raises(KeyError, match="bogus"):
        _stage(bogus=1)


def test_build_batch_cuts_all_padding_columns_in_buckets():
    rewards = np.array([[1, 0]], np.float32)
    g = _groups(rewards, np.zeros((1, 2), bool))
    W = 60
    tokens = np.arange(W, dtype=np.int32)[None, None].repeat(2, 1)
    valid = np.zeros((1, 2, W), bool)
    valid[0, 0, 20:41] = True  # longest prompt starts at 20, longest response ends at 40
    valid[0, 1, 25:33] = True
    mask = np.zeros((1, 2, W - 1), np.float32)
    mask[0, 0, 30:40] = 1
    g |= {"tokens": tokens, "valid": valid, "positions": tokens, "mask": mask, "sampler_logp": mask * -0.5}
    b = _build(g, _stage(), target=1)
    # used columns 20..40 (21) -> width 32 from the ladder, starting at the first used column: 20..51
    assert b["tokens"][0].tolist() == list(range(20, 52))
    assert b["mask"].shape == (2, 31) and b["mask"].sum() == 10
    np.testing.assert_array_equal(b["mask"][0], mask[0, 0, 20:51])


def test_kl_term_gradient_equals_hand_k3():
    """objective = 0.5 * KL_k3(pi || pi_ref) only: the update is -0.5 * grad of the masked-mean k3
    estimator exp(ref - logp) - (ref - logp) - 1, written out here with the model's log-probs."""
    batch = _batch(n=4, seed=5)
    params = init_params(CFG, jax.random.key(2))
    ref = init_params(CFG, jax.random.key(3))
    stage = _stage(objective=dict(pg=0.0, kl=0.5, entropy=0.0))
    tx = logged(optax.sgd(1.0))
    state = train_state.create(params, tx, jax.random.key(0))
    batch["domain_idx"] = np.zeros(4, np.int32)
    roles = update.FrozenRoles(CFG, {"ref_logp"}, reference=ref)
    new, metrics = _update_fn(stage, tx)(state, batch | roles(batch))

    def logp_of(p):
        lp = jax.nn.log_softmax(forward(p, CFG, batch["tokens"][:, :-1]))
        return jnp.take_along_axis(lp, batch["tokens"][:, 1:, None], -1)[..., 0]

    ref_lp = logp_of(ref)

    def hand(p):
        d = ref_lp - logp_of(p)
        return 0.5 * jnp.sum(batch["mask"] * (jnp.exp(d) - d - 1)) / batch["mask"].sum()

    g = jax.grad(hand)(params)
    for p0, p1, gi in zip(jax.tree.leaves(params), jax.tree.leaves(new.params), jax.tree.leaves(g)):
        np.testing.assert_allclose(np.asarray(p0 - p1), np.asarray(gi), atol=1e-6)
    np.testing.assert_allclose(metrics["kl"], 2 * hand(params), rtol=1e-5)


class _Ctx:
    class cfg:  # noqa: N801  (the only field RolloutSource reads at construction)
        seed = 0


def test_rollout_source_epoch_filter_drops_solved_prompts_at_epoch_end():
    records = [{"id": f"p{i}", "prompt": str(i), "domain": "math", "answer": "0"} for i in range(4)]
    batches = iter([records[:2], records[2:]] * 10)
    src = RolloutSource(_Ctx(), _stage(), batches, epoch_len=4, epoch_filter=filters.EpochFilter(0.0, 0.0, 0))
    assert [r["id"] for r in src.prompts(4)] == ["p0", "p1", "p2", "p3"]
    # epoch 1 results: p0 always solved (easy), p1 never (hard), p2/p3 mixed
    src.epoch_filter.update(["p0", "p1", "p2", "p3"], np.array([[1, 1], [0, 0], [1, 0], [0, 1]], np.float32))
    src.epoch_filter.end_epoch()  # what prompts() does when `drawn` crosses an epoch boundary
    assert [r["id"] for r in src.prompts(4)] == ["p2", "p3", "p2", "p3"]
    state = src.state_dict()
    clone = RolloutSource(_Ctx(), _stage(), iter([records[:2], records[2:]] * 10), epoch_len=4,
                          epoch_filter=filters.EpochFilter(0.0, 0.0, 0))
    clone.load_state_dict(json.loads(json.dumps(state)))
    assert clone.drawn == src.drawn and clone.epoch_filter.keep("p0") is False


def test_grpo_learns_a_verifiable_toy_reward():
    """The real sampler + build_batch + policy_update on a toy task: reward 1 iff the first response token
    is even. A random policy scores ~0.5; 15 on-policy GRPO steps must push it above 0.9."""
    from nemocascade import sampling

    cfg = ModelConfig(vocab_size=16, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)
    stage = _stage(group_size=8)
    tx = logged(optax.adam(1e-2))
    state = train_state.create(init_params(cfg, jax.random.key(0)), tx, jax.random.key(0))
    step = _update_fn(stage, tx, cfg)
    prompts = jnp.asarray(np.random.default_rng(0).integers(1, 16, (8, 4)), jnp.int32)
    lens = jnp.full((8,), 4, jnp.int32)

    def rollout(params, key):
        s = sampling.sample(params, cfg, prompts, lens, key, max_new_tokens=3, eos_id=-1, num_samples=8)
        rewards = (np.asarray(s.tokens[:, 0]) % 2 == 0).astype(np.float32).reshape(8, 8)
        tokens, valid, positions, rmask = jax.device_get(sampling.sequences(s))
        r = lambda x: np.asarray(x).reshape(8, 8, *np.shape(x)[1:])  # noqa: E731
        groups = {"tokens": r(tokens), "valid": r(valid), "positions": r(positions), "mask": r(rmask),
                  "sampler_logp": r(np.zeros_like(rmask)), "rewards": rewards,
                  "truncated": np.zeros((8, 8), bool), "domain_idx": np.zeros(8, np.int32)}
        return groups

    first = rollout(state.params, jax.random.key(100))["rewards"].mean()
    for i in range(15):
        state, _ = step(state, _build(rollout(state.params, jax.random.key(i)), stage, 8))
    last = np.mean([rollout(state.params, jax.random.key(200 + k))["rewards"].mean() for k in range(3)])
    assert 0.25 < first < 0.75, first
    assert last > 0.9, (first, last)


def test_trim_columns_keeps_every_used_column_on_the_width_ladder():
    from nemocascade.rl.rollouts import bucket_width, trim_columns
    # the ladder, worked by hand: 16 x {1, 2, 3, 4, 6, 8, 12, 16, 24}
    assert [bucket_width(n, 16) for n in (1, 17, 33, 49, 65, 97, 129, 193, 257, 385)] == \
        [16, 32, 48, 64, 96, 128, 192, 256, 384, 512]
    W = 100
    for lo, hi, want in [(5, 40, (5, 53)), (70, 98, (68, 100)), (2, 99, (0, 100)), (50, 51, (50, 66))]:
        valid = np.zeros((3, W), bool)
        valid[0, lo:hi - 1] = True
        valid[2, hi - 1] = True
        cols = np.tile(np.arange(W), (3, 1))
        batch = {"tokens": cols, "valid": valid, "positions": cols, "mask": cols[:, 1:] * 10, "rewards": np.ones(3)}
        out = trim_columns(batch, 16)
        assert (out["tokens"][0, 0], out["tokens"][0, -1] + 1) == want
        assert out["valid"].sum() == valid.sum()                      # nothing used was cut
        np.testing.assert_array_equal(out["mask"][0], np.arange(want[0] + 1, want[1]) * 10)  # targets stay aligned
        assert out["rewards"].shape == (3,)


def test_pipelined_dispatches_the_next_chunk_before_scoring_this_one():
    from nemocascade.rl.rollouts import chunk_count, pipelined
    assert [chunk_count(p, 2) for p in (1, 2, 3, 4, 16)] == [1, 2, 1, 2, 2]
    assert [chunk_count(p, 4) for p in (6, 9, 12)] == [3, 3, 4]
    events = []

    def generate(c):
        events.append(("generate", c))
        return jnp.full((2,), c)

    def score(c, host):
        events.append(("score", c))
        assert isinstance(host, np.ndarray) and host.tolist() == [c, c]
        return c * 10

    out, t = pipelined(3, generate, score)
    assert out == [0, 10, 20]
    assert events == [("generate", 0), ("generate", 1), ("score", 0), ("generate", 2), ("score", 1), ("score", 2)]
    assert 0 <= t["score_overlap_s"] <= t["score_s"] and t["generate_s"] > 0


class _ByteTok:
    pad_id, eos_id = 0, 1

    @staticmethod
    def encode(text):
        return [2 + b % 60 for b in text.encode()]

    @staticmethod
    def decode(ids):
        return "".join(chr(97 + i % 26) for i in ids)


def test_rollout_source_samples_in_chunks_as_the_sampler_does_alone():
    """score_overlap=2: prompts 0-1 and 2-3 are sampled as two calls (keys fold_in(rng, 0) and (rng, 1)) and
    scored by chunk; the groups are the two reference calls' samples in record order, rewards in step."""
    import types

    import ml_collections

    from nemocascade import sampling
    from nemocascade.data import pipeline
    from nemocascade.mesh import make_mesh

    cfg = ModelConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32)
    params = init_params(cfg, jax.random.key(1))
    seen = []

    def scorer(records, texts, lengths):
        seen.append([r["id"] for r in records])
        return lengths % 3

    ctx = types.SimpleNamespace(
        cfg=ml_collections.ConfigDict(dict(seed=0, thinking=False, eval=dict(max_prompt_len=128),
                                           data=dict(domains=("math",)))),
        tokenizer=_ByteTok(), model_cfg=cfg, mesh=make_mesh(), pool=None)
    stage = _stage(group_size=3, prompts_per_step=4, score_overlap=2)
    src = RolloutSource(ctx, stage, iter([]), epoch_len=4, scorer=scorer)
    records = [{"id": f"p{i}", "prompt": "x" * (20 * i + 1), "domain": "math", "answer": "0"} for i in range(4)]
    rng = jax.random.key(3)
    groups, stats = src.sample(params, records, 5, rng)
    assert seen == [["p0", "p1"], ["p2", "p3"]]
    assert groups["tokens"].shape == (4, 3, 128 + 5) and groups["rewards"].shape == (4, 3)
    for c in range(2):
        toks, lens = pipeline.encode_prompts(_ByteTok, [r["prompt"] for r in records[2 * c:2 * c + 2]], 128,
                                             thinking=False, bucket=sampling.PROMPT_BUCKET)
        s = sampling.sample(params, cfg, toks, lens, jax.random.fold_in(rng, c), max_new_tokens=5, eos_id=1,
                            pad_id=0, num_samples=3)
        np.testing.assert_array_equal(groups["tokens"][2 * c:2 * c + 2, :, -5:], np.asarray(s.tokens).reshape(2, 3, 5))
        np.testing.assert_array_equal(groups["rewards"][2 * c:2 * c + 2], np.asarray(s.lengths).reshape(2, 3) % 3)
    assert set(stats) >= {"generate_s", "score_s", "score_overlap_s", "verifier_timeouts"}
    assert 0 < stats["score_overlap_s"] <= stats["score_s"]
