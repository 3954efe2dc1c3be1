"""GRPO stage pieces: the jitted update (micro-batching == full batch, the gradient of the pg term on a
hand-checked case, group advantages and overlong handling inside it), the training batch gathered on the device,
curriculum; the data path from sampler to update without a device-to-host transfer."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from nemocascade import objectives, train_state
from nemocascade.models import ModelConfig, forward, init_params
from nemocascade.rl import filters, update
from nemocascade.rl import rollouts
from nemocascade.rl.rollouts import RolloutSource
from nemocascade.stages import common, grpo


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
            "rewards": rng.normal(size=(n // 4, 4)).astype(np.float32), "truncated": np.zeros((n // 4, 4), bool)}


def _advantages(rewards, eps=1e-6):
    """numpy: (r - mean_g r) / (std_g r + eps) per group, flattened to rows."""
    r = np.asarray(rewards, np.float64)
    return ((r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + eps)).reshape(-1)


def _update_fn(stage, tx, cfg=CFG):
    """The jitted on-policy update the stage loop runs, for `stage`'s objective."""
    objective = objectives.build(stage.objective)
    return jax.jit(update.policy_step(tx, model_cfg=cfg, objective=objective,
                                      micro_batches=stage.objective.micro_batches))


def _step(stage, batch, tx=None, params=None):
    tx = tx or optax.sgd(1.0)
    params = params if params is not None else init_params(CFG, jax.random.key(0))
    state = train_state.create(params, tx, jax.random.key(0))
    return _update_fn(stage, tx)(state, {**batch, "domain_idx": np.zeros(len(batch["tokens"]), np.int32)})


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "constant"])
def test_micro_batches_give_the_full_batch_update(aggregation):
    batch = _batch()
    full, m_full = _step(_stage(objective=dict(aggregation=aggregation)), batch)
    micro, m_micro = _step(_stage(objective=dict(aggregation=aggregation, micro_batches=4)), batch)
    for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(micro.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(m_full["loss"], m_micro["loss"], rtol=1e-5)


def test_pg_gradient_equals_hand_formula():
    """d/dtheta of -sum m A logp / sum m, checked against jax.grad of the same formula written out
    with the model's own log-probs (independent of the objective's terms)."""
    batch = _batch(n=4, seed=3)
    params = init_params(CFG, jax.random.key(1))
    new, _ = _step(_stage(), batch, params=params)

    def hand(p):
        logits = forward(p, CFG, batch["tokens"][:, :-1])
        lp = jax.nn.log_softmax(logits)
        lp = jnp.take_along_axis(lp, batch["tokens"][:, 1:, None], -1)[..., 0]
        return -jnp.sum(batch["mask"] * _advantages(batch["rewards"])[:, None] * lp) / batch["mask"].sum()

    g = jax.grad(hand)(params)
    for p0, p1, gi in zip(jax.tree.leaves(params), jax.tree.leaves(new.params), jax.tree.leaves(g)):
        np.testing.assert_allclose(np.asarray(p0 - p1), np.asarray(gi), atol=1e-6)


def test_advantages_and_overlong_hand_worked():
    rewards = np.array([[1, 0, 0, 1], [1, 1, 0, 1]], np.float32)
    trunc = np.array([[0, 0, 1, 0], [0, 0, 0, 0]], bool)
    # hand-worked: group 0 mean .5 std .5 -> +-.5/(.5+eps); group 1 mean .75 std sqrt(3)/4=.4330
    eps = 1e-6
    a0 = [0.5 / (0.5 + eps), -0.5 / (0.5 + eps), -0.5 / (0.5 + eps), 0.5 / (0.5 + eps)]
    s1 = np.sqrt(0.1875)
    a1 = [0.25 / (s1 + eps)] * 2 + [-0.75 / (s1 + eps), 0.25 / (s1 + eps)]
    mask = np.ones((8, 4), np.float32)
    adv, m = jax.jit(update.advantages, static_argnums=3)(rewards, trunc, mask, "filter")
    np.testing.assert_allclose(adv, a0 + a1, rtol=1e-6)
    assert np.asarray(m).sum(1).tolist() == [4, 4, 0, 4] + [4] * 4  # the truncated rollout leaves the loss only
    adv, m = update.advantages(rewards, trunc, mask, "penalty")  # reward 0 (already 0 here), stays in the loss
    np.testing.assert_allclose(adv, a0 + a1, rtol=1e-6)
    assert np.asarray(m).sum() == 32
    adv, _ = update.advantages(np.array([[1, 1, 0, 1]], np.float32), np.array([[0, 1, 0, 0]], bool),
                               mask[:4], "penalty")  # penalised: rewards 1 0 0 1
    np.testing.assert_allclose(adv, a0, rtol=1e-6)


def _rows(tokens, valid, mask):
    """Host arrays [N, L] (mask [N, L-1]) as the device Rows the sampler hands over."""
    return rollouts.Rows(*jax.device_put((tokens, valid, np.cumsum(valid, 1).astype(np.int32), mask,
                                          -0.5 * mask)))


def test_training_batch_gathers_kept_groups_pads_and_cuts_columns():
    """Two sampling rounds of 2 groups x 2 rollouts; groups 1 (round 0) and 2 (round 1) kept. The batch holds
    their rows in that order, padded with zero rows to a multiple of 4 groups (at most the target of 3), and the
    columns every kept row leaves empty cut to the width ladder: used 20..40 (21 columns) -> 32, from column 20."""
    from nemocascade.mesh import make_mesh

    W, G = 60, 2
    tokens = np.arange(W, dtype=np.int32)[None].repeat(4, 0) + 100 * np.arange(4)[:, None]
    valid = np.zeros((4, W), bool)
    valid[2, 20:41] = True  # round 0, group 1, rollout 0: columns 20..40
    valid[3, 25:33] = True
    valid[0, 0:60] = True  # a dropped group may use every column: it must not widen the batch
    mask = valid[:, 1:].astype(np.float32)
    r0, r1 = _rows(tokens, valid, mask), _rows(tokens + 1000, valid[[2, 3, 0, 1]], mask[[2, 3, 0, 1]])
    kept = {"group_id": np.array([1, 2]), "rewards": np.array([[1, 0], [0, 1]], np.float32),
            "truncated": np.array([[0, 1], [0, 0]], bool), "domain_idx": np.array([0, 1], np.int32),
            "first": np.array([20, 20]), "end": np.array([41, 41])}
    b = rollouts.training_batch([r0, r1], kept, target=3, G=G, mesh=make_mesh())
    assert b["tokens"].shape == (6, 32) and b["mask"].shape == (6, 31)
    assert np.asarray(b["tokens"])[:4, 0].tolist() == [220, 320, 1020, 1120]  # rows 2, 3 of each round
    assert np.asarray(b["tokens"])[4:].sum() == 0 and np.asarray(b["valid"])[4:].sum() == 0  # padding rows
    np.testing.assert_array_equal(np.asarray(b["mask"])[0], mask[2, 20:51])  # targets stay aligned
    np.testing.assert_array_equal(np.asarray(b["sampler_logp"])[1], -0.5 * mask[3, 20:51])
    assert np.asarray(b["valid"]).sum() == valid[2:].sum() * 2  # nothing used was cut
    np.testing.assert_array_equal(b["rewards"], [[1, 0], [0, 1], [0, 0]])
    assert np.asarray(b["domain_idx"]).tolist() == [0, 0, 1, 1, 0, 0]
    assert np.asarray(b["truncated"]).tolist() == [[False, True], [False, False], [False, False]]


def test_length_curriculum_sub_stages():
    stage = _stage(rollout=dict(length_curriculum=((0, 64), (10, 96), (30, 128))))
    assert [rollouts.max_new_tokens_at(stage.rollout, s) for s in (0, 9, 10, 29, 30, 99)] == [64, 64, 96, 96, 128,
                                                                                              128]


def test_unknown_stage_key_is_named():
    with pytest.raises(KeyError, match="bogus"):
        _stage(bogus=1)


def test_kl_term_gradient_equals_hand_k3():
    """objective = 0.5 * KL_k3(pi || pi_ref) only: the update is -0.5 * grad of the masked-mean k3
    estimator exp(ref - logp) - (ref - logp) - 1, written out here with the model's log-probs."""
    batch = _batch(n=4, seed=5)
    params = init_params(CFG, jax.random.key(2))
    ref = init_params(CFG, jax.random.key(3))
    stage = _stage(objective=dict(terms=dict(pg=0.0, kl=0.5, entropy=0.0)))
    tx = optax.sgd(1.0)
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
    """The real sampler + training_batch + policy step on a toy task: reward 1 iff the first response token
    is even. A random policy scores ~0.5; 15 on-policy GRPO steps must push it above 0.9."""
    from nemocascade import sampling
    from nemocascade.mesh import make_mesh

    cfg = ModelConfig(vocab_size=16, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)
    stage = _stage(rollout=dict(group_size=8))
    tx = optax.adam(1e-2)
    state = train_state.create(init_params(cfg, jax.random.key(0)), tx, jax.random.key(0))
    step = _update_fn(stage, tx, cfg)
    mesh = make_mesh()
    prompts = jnp.asarray(np.random.default_rng(0).integers(1, 16, (8, 4)), jnp.int32)
    lens = jnp.full((8,), 4, jnp.int32)

    def rollout(params, key):
        s = sampling.sample(params, cfg, prompts, lens, key, max_new_tokens=3, eos_id=-1, num_samples=8)
        rewards = (np.asarray(s.tokens[:, 0]) % 2 == 0).astype(np.float32).reshape(8, 8)
        groups = {"rewards": rewards, "truncated": np.zeros((8, 8), bool), "domain_idx": np.zeros(8, np.int32),
                  "group_id": np.arange(8), "first": np.zeros(8, int), "end": np.full(8, 7)}
        return rollouts.to_rows(s, width=4, pad_id=0), groups

    first = rollout(state.params, jax.random.key(100))[1]["rewards"].mean()
    for i in range(15):
        rows, groups = rollout(state.params, jax.random.key(i))
        state, _ = step(state, rollouts.training_batch([rows], groups, 8, 8, mesh))
    last = np.mean([rollout(state.params, jax.random.key(200 + k))[1]["rewards"].mean() for k in range(3)])
    assert 0.25 < first < 0.75, first
    assert last > 0.9, (first, last)


def test_column_window_keeps_every_used_column_on_the_width_ladder():
    from nemocascade.rl.rollouts import bucket_width, column_window
    # the ladder, worked by hand: 16 x {1, 2, 3, 4, 6, 8, 12, 16, 24}
    assert [bucket_width(n, 16) for n in (1, 17, 33, 49, 65, 97, 129, 193, 257, 385)] == \
        [16, 32, 48, 64, 96, 128, 192, 256, 384, 512]
    # used columns first..end-1 of 100 -> (start, width): widened left first, never past the rows' own width
    for first, end, want in [(5, 40, (5, 48)), (70, 98, (68, 32)), (2, 99, (0, 100)), (50, 51, (50, 16))]:
        assert column_window(first, end, 100, 16) == want


class _ByteTok:
    pad_id, eos_id = 0, 1

    @staticmethod
    def encode(text):
        return [2 + b % 60 for b in text.encode()]

    @staticmethod
    def decode(ids):
        return "".join(chr(97 + i % 26) for i in ids)


def test_rollout_source_samples_as_the_sampler_does_alone():
    """The source's rows and groups are one sampler call's samples in record order at the stage's prompt width,
    scored once, rewards in step."""
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
    stage = _stage(rollout=dict(group_size=3, prompts_per_step=4))
    src = RolloutSource(ctx, stage, iter([]), epoch_len=4, scorer=scorer)
    records = [{"id": f"p{i}", "prompt": "x" * (20 * i + 1), "domain": "math", "answer": "0"} for i in range(4)]
    rng = jax.random.key(3)
    sampled, stats = src.sample(params, records, 5, rng)
    groups, tokens = sampled.groups, np.asarray(sampled.rows.tokens).reshape(4, 3, -1)
    assert seen == [["p0", "p1", "p2", "p3"]]
    assert tokens.shape == (4, 3, 128 + 5) and groups["rewards"].shape == (4, 3)
    toks, lens = pipeline.encode_prompts(_ByteTok, [r["prompt"] for r in records], 128, thinking=False,
                                         bucket=sampling.PROMPT_BUCKET)
    s = sampling.sample(params, cfg, toks, lens, rng, max_new_tokens=5, eos_id=1, pad_id=0, num_samples=3)
    np.testing.assert_array_equal(tokens[:, :, -5:], np.asarray(s.tokens).reshape(4, 3, 5))
    assert groups["first"].tolist() == (128 - np.asarray(lens)).tolist()
    np.testing.assert_array_equal(groups["rewards"], np.asarray(s.lengths).reshape(4, 3) % 3)
    assert set(stats) == {"generate_s", "score_s"} and stats["generate_s"] > 0

    # rollout.sample_chunks=2: two sampler calls of two prompts each (keys folded by the chunk's first record),
    # rows and groups in record order, scored once
    seen.clear()
    src = RolloutSource(ctx, _stage(rollout=dict(group_size=3, prompts_per_step=4, sample_chunks=2)), iter([]),
                        epoch_len=4, scorer=scorer)
    sampled, _ = src.sample(params, records, 5, rng)
    assert seen == [["p0", "p1", "p2", "p3"]]
    halves = [sampling.sample(params, cfg, toks[i:i + 2], lens[i:i + 2], jax.random.fold_in(rng, i), max_new_tokens=5,
                              eos_id=1, pad_id=0, num_samples=3) for i in (0, 2)]
    np.testing.assert_array_equal(np.asarray(sampled.rows.tokens)[:, -5:],
                                  np.concatenate([np.asarray(h.tokens) for h in halves]))
    np.testing.assert_array_equal(sampled.groups["rewards"].reshape(-1),
                                  np.concatenate([np.asarray(h.lengths) for h in halves]) % 3)
    assert sampled.rows.tokens.shape == (12, 128 + 5)


def test_no_device_to_host_transfer_between_sampling_and_the_update():
    """From the sampler's rows to the updated state nothing leaves the device: the training batch, a frozen role's
    pass and the update trace with the rows (tokens, masks, log-probs) as abstract values, so no host code can read
    them (a conversion to numpy raises on a tracer; jax's transfer guard does not see device-to-host copies on the
    CPU backend). The host sends only the kept groups' indices, rewards and flags."""
    import types

    import ml_collections

    from nemocascade.mesh import make_mesh

    cfg = ModelConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32)
    params = init_params(cfg, jax.random.key(1))
    ctx = types.SimpleNamespace(
        cfg=ml_collections.ConfigDict(dict(seed=0, thinking=False, eval=dict(max_prompt_len=128),
                                           data=dict(domains=("math",)))),
        tokenizer=_ByteTok(), model_cfg=cfg, mesh=make_mesh(), pool=None)
    stage = _stage(rollout=dict(group_size=4, prompts_per_step=2), objective=dict(terms=dict(pg=1.0, kl=0.1)),
                   filters=dict(overlong="filter"))
    src = RolloutSource(ctx, stage, iter([]), epoch_len=2, scorer=lambda records, texts, lengths: lengths % 2)
    records = [{"id": f"p{i}", "prompt": "x" * (9 * i + 3), "domain": "math", "answer": "0"} for i in range(2)]
    sampled, _ = src.sample(params, records, 6, jax.random.key(0))
    kept = sampled.groups | {"group_id": np.arange(2)}
    objective = objectives.build(stage.objective)
    roles = update.FrozenRoles(cfg, objective.needs, reference=params)
    tx = optax.adam(1e-3)
    step = jax.jit(update.policy_step(tx, model_cfg=cfg, objective=objective, overlong="filter"))
    state = train_state.create(params, tx, jax.random.key(0))

    def device_part(rows, state):
        batch = rollouts.training_batch([rows], kept, 2, 4, ctx.mesh)
        return step(state, batch | roles(batch))

    shapes = jax.eval_shape(device_part, sampled.rows, state)
    assert shapes[1]["loss"].shape == ()
    new, metrics = device_part(sampled.rows, state)
    assert np.isfinite(float(metrics["loss"])) and int(new.step) == 1

    def leaky(rows, state):  # the check can fail: a host read of the tokens
        return device_part(rows._replace(tokens=jnp.asarray(np.asarray(rows.tokens))), state)
    with pytest.raises(jax.errors.TracerArrayConversionError):
        jax.eval_shape(leaky, sampled.rows, state)


def test_a_step_with_every_group_filtered_trains_nothing_and_moves_on(tmp_path):
    """filters.max_reward_below=1.5: no rollout can earn more than 1, so every group is dropped and the host skips
    the update: the step counter still moves (the checkpoint is at the last step), the params are the start's,
    and the metrics rows say 0 kept groups and carry no loss."""
    from conftest import final_params, tiny_math_config
    from nemocascade import cascade

    cfg = tiny_math_config("cascade_math:tiny", tmp_path)
    cfg.stage_order = ("grpo",)
    cfg.eval_init = True  # saves the start params (checkpoints/final/init)
    cfg.stages.grpo.update(steps=3, rollout=dict(prompts_per_step=2, group_size=2, length_curriculum=((0, 8),)),
                           filters=dict(max_reward_below=1.5), checkpoint_every=10, eval_every=0)
    wd = str(tmp_path / "run")
    cascade.run(cfg, wd, "skip_test")
    rows = [json.loads(line) for line in open(f"{wd}/metrics.jsonl") if '"grpo"' in line]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["kept_groups"] == 0 and "loss" not in r for r in rows)
    assert max(int(s) for s in os.listdir(f"{wd}/checkpoints/grpo") if s.isdigit()) == 3
    start, end = final_params(wd, "init"), final_params(wd, "grpo")
    for a, b in zip(jax.tree.leaves(start), jax.tree.leaves(end), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
