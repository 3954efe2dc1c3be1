"""LoRA (nemocascade/lora.py, stages/common.py Trainer): the merge against numpy, the adapters' gradient through the
on-policy update against the chain rule, validation naming the key, and a tiny SFT -> GRPO cascade with LoRA on
both stages: checkpoints hold adapters, the base stays as it was, each stage hands on its start plus a low-rank
update, and a GRPO stage interrupted mid-way resumes to the same params."""
import dataclasses
import functools
import os

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from nemocascade import cascade, configs, errors, lora, objectives, optim, train_state
from nemocascade.run_log import load_metrics
from nemocascade.models import ModelConfig, init_params
from nemocascade.rl import update
from nemocascade.stages import common, grpo, kinds, rm

from conftest import final_params, tiny_math_config, tiny_sft_config

CFG = ModelConfig(vocab_size=17, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32)
TARGETS = lora.DEFAULTS["targets"]
LAYER_MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def _names(tree) -> list[str]:
    return sorted(optim.path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0])


def _random_b(adapters, seed=1):
    """The adapters with B drawn at random (B starts at zero, which hides any mistake in the product)."""
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda p, x: rng.normal(size=x.shape).astype(np.float32) if p[-1].key == "b" else x, adapters)


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_zero_b_merges_to_the_base_exactly(param_dtype):
    cfg = dataclasses.replace(CFG, param_dtype=param_dtype)
    params = init_params(cfg, jax.random.key(0))
    adapters = lora.init(jax.random.key(1), params, cfg, 4, TARGETS)
    assert _names(adapters) == sorted(f"layers/{m}/{ab}" for m in LAYER_MATRICES for ab in "ab")
    merged = jax.jit(functools.partial(lora.merge, alpha=16.0, rank=4))(params, adapters)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(merged)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_merge_is_w_plus_scaled_a_b_on_each_layer():
    params = init_params(CFG, jax.random.key(0))
    rank, alpha = 3, 5.0
    adapters = _random_b(lora.init(jax.random.key(1), params, CFG, rank, "layers/(wq|wo)|embed"))
    L, D, H, Dh = CFG.n_layers, CFG.d_model, CFG.n_heads, CFG.head_dim
    wq, wo = adapters["layers"]["wq"], adapters["layers"]["wo"]
    # wq reads the embedding and writes heads x head_dim; wo the reverse; the embedding writes d_model per token
    assert (wq["a"].shape, wq["b"].shape) == ((L, D, rank), (L, rank, H * Dh))
    assert (wo["a"].shape, wo["b"].shape) == ((L, H * Dh, rank), (L, rank, D))
    assert adapters["embed"]["a"].shape == (CFG.vocab_size, rank)
    assert np.std(np.asarray(wq["a"])) == pytest.approx(1 / np.sqrt(D), rel=0.3)  # N(0, 1/in)
    merged = lora.merge(params, adapters, alpha, rank)
    s = alpha / rank
    for name, ad in (("wq", wq), ("wo", wo)):
        a, b = np.asarray(ad["a"][1], np.float64), np.asarray(ad["b"][1], np.float64)
        w = np.asarray(params["layers"][name][1])
        want = w + s * (a @ b).reshape(w.shape)  # layer 1 alone, in numpy
        np.testing.assert_allclose(np.asarray(merged["layers"][name][1]), want, rtol=1e-6, atol=1e-6)
    e = adapters["embed"]
    np.testing.assert_allclose(np.asarray(merged["embed"]), np.asarray(params["embed"]) + s * np.asarray(e["a"]) @
                               np.asarray(e["b"]), rtol=1e-6, atol=1e-6)
    for name in ("wk", "w_up", "attn_norm"):  # not targeted: the same arrays
        assert merged["layers"][name] is params["layers"][name]


def test_targets_that_name_no_matrix_of_this_model_are_refused():
    tied = dataclasses.replace(CFG, tie_embeddings=True)
    with pytest.raises(ValueError, match=r"lora\.targets='lm_head' matches no weight matrix of the model"):
        lora.init(jax.random.key(0), init_params(tied, jax.random.key(0)), tied, 2, "lm_head")
    with pytest.raises(ValueError, match=r"lora\.targets='layers/attn_norm' matches no weight matrix"):
        lora.init(jax.random.key(0), init_params(CFG, jax.random.key(0)), CFG, 2, "layers/attn_norm")


def test_on_policy_step_over_adapters_is_the_chain_rule_of_the_full_step():
    """At B = 0 the adapters' gradient is dL/dA = s g B^T = 0 and dL/dB = s A^T g, with g the full params' gradient
    (read off a full-params SGD step with lr 1); the LoRA step never changes the base it is handed."""
    params = init_params(CFG, jax.random.key(0))
    rng = np.random.default_rng(0)
    n, T = 8, 10
    tokens = rng.integers(1, CFG.vocab_size, (n, T)).astype(np.int32)
    mask = np.zeros((n, T - 1), np.float32)
    mask[:, 3:7] = 1
    batch = {"tokens": tokens, "valid": np.ones((n, T), bool), "mask": mask,
             "positions": np.tile(np.arange(T, dtype=np.int32), (n, 1)),
             "sampler_logp": np.zeros((n, T - 1), np.float32),
             "rewards": rng.normal(size=(2, n // 2)).astype(np.float32),
             "truncated": np.zeros((2, n // 2), bool), "domain_idx": np.zeros(n, np.int32)}
    stage = common.stage_config("grpo", grpo.DEFAULTS)
    tx = optax.sgd(1.0)
    objective = objectives.build(stage.objective)
    loss = functools.partial(update.policy_loss, model_cfg=CFG, objective=objective)
    prepare = functools.partial(update.prepare, objective=objective)
    full, m_full = jax.jit(train_state.make_step(loss, tx, prepare=prepare))(
        train_state.create(params, tx, jax.random.key(0)), batch)
    rank, alpha = 2, 4.0
    adapters = lora.init(jax.random.key(1), params, CFG, rank, TARGETS)
    base = jax.tree.map(np.array, params)
    new, m_lora = jax.jit(train_state.make_step(lora.over_adapters(loss, alpha, rank), tx, prepare=prepare))(
        train_state.create(adapters, tx, jax.random.key(0)), batch, params)
    np.testing.assert_allclose(m_lora["loss"], m_full["loss"], rtol=1e-6)  # the merged model is the base
    for name in ("wq", "wo", "w_down"):
        g = np.asarray(params["layers"][name] - full.params["layers"][name], np.float64)
        a = np.asarray(adapters["layers"][name]["a"], np.float64)
        g = g.reshape(a.shape[0], a.shape[1], -1)  # [layers, in, out]
        np.testing.assert_array_equal(np.asarray(new.params["layers"][name]["a"]), np.asarray(a, np.float32))
        want_b = -(alpha / rank) * np.einsum("lir,lio->lro", a, g)
        np.testing.assert_allclose(np.asarray(new.params["layers"][name]["b"]), want_b, rtol=1e-4, atol=1e-7)
    for x, y in zip(jax.tree.leaves(base), jax.tree.leaves(params)):
        np.testing.assert_array_equal(x, np.asarray(y))


# ------------------------------------------------------------------------------------------ validation

@pytest.mark.parametrize("stage, lora_cfg, message", [
    ("sft", dict(rank=-1), r"config\.stages\.sft\.lora\.rank=-1 must be an integer >= 0"),
    ("grpo", dict(rank=4, targets="layers/nothing"), r"config\.stages\.grpo\.lora\.targets='layers/nothing' matches no "
     r"weight matrix"),
    ("grpo", dict(rank=4, targets="layers/(wq"), r"config\.stages\.grpo\.lora\.targets='layers/\(wq' is not a regular"),
    ("sft", dict(rank=4, alpha=0.0), r"config\.stages\.sft\.lora\.alpha=0\.0 must be > 0"),
    ("sft", dict(rnak=4), r"config\.stages\.sft\.lora\.rnak: unknown key; known: \['alpha', 'rank', 'targets'\]"),
    ("grpo", dict(rank=4, state="keep"), r"config\.stages\.grpo\.lora\.rank=4: a LoRA stage trains fresh "
     r"adapters"),
])
def test_bad_lora_config_names_the_key(stage, lora_cfg, message):
    cfg = configs.load("cascade_math:tiny")
    node = cfg.stages[stage]
    with node.unlocked():  # as stage_config(..., lora=...) leaves it: keys of the dict given, unknown ones too
        node.optim.state = lora_cfg.pop("state", "reset")
        node.lora.update(lora_cfg)
    with pytest.raises(errors.BadInput, match=message):
        cascade.validate(cfg)


def test_defaults_are_off_and_the_reward_model_stage_refuses_lora():
    for kind in kinds.KINDS.values():
        assert common.stage_config(kind.name, kind.defaults).lora.rank == 0
    assert rm.check(common.stage_config("rm", rm.DEFAULTS), {}) == []
    (problem,) = rm.check(common.stage_config("rm", rm.DEFAULTS, lora=dict(rank=2)), {})
    assert problem.startswith("lora.rank=2: an RM stage trains a new scalar head")


# ------------------------------------------------------------------------------------------ through the driver

RANK = 2


def _tiny_lora_cfg(tmp):
    c = tiny_math_config("cascade_math:tiny", tmp)
    c.stages.sft.update(steps=3, batch_size=4, seq_len=96, checkpoint_every=2, eval_every=0)
    c.stages.grpo.update(steps=2, rollout=dict(prompts_per_step=2, group_size=2, length_curriculum=((0, 16),)),
                         checkpoint_every=1, eval_every=0, optim=dict(lr=3e-3, schedule="constant", warmup_steps=0))
    # the tiny model earns no reward: keep its groups (no dynamic filter) and train a term that has a gradient
    c.stages.grpo.filters.dynamic = False
    c.stages.grpo.objective.terms.entropy = 0.01
    for s in ("sft", "grpo"):
        c.stages[s].lora.rank = RANK
    return c


def _host(tree):
    return jax.tree.map(np.array, tree)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A tiny SFT -> GRPO cascade with LoRA on both: (config, workdir, {stage: the start params it was handed, as a
    host copy taken before it ran, and whether they still held those values afterwards})."""
    tmp = tmp_path_factory.mktemp("lora")
    cfg = _tiny_lora_cfg(tmp)
    starts = {}

    def recording(kind):
        def run(ctx, name, stage, params):
            before = _host(params)
            out = kind.run(ctx, name, stage, params)
            after = _host(params)  # a donated base would be unreadable now
            starts[name] = (before, all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(before),
                                                                             jax.tree.leaves(after))))
            return out
        return dataclasses.replace(kind, run=run)

    with pytest.MonkeyPatch.context() as mp:
        for k in ("sft", "grpo"):
            mp.setitem(kinds.KINDS, k, recording(kinds.KINDS[k]))
        wd = str(tmp / "run")
        cascade.run(cfg, wd, "cascade_math", "tiny")
    return cfg, wd, starts


def _assert_low_rank_update(start, final):
    """`final` = `start` except the default targets, each changed by a nonzero update of rank <= RANK per layer."""
    for (path, s), f in zip(jax.tree_util.tree_flatten_with_path(start)[0], jax.tree.leaves(final)):
        name, s, f = optim.path_name(path), np.asarray(s, np.float64), np.asarray(f, np.float64)
        if name.split("/")[-1] not in LAYER_MATRICES:
            np.testing.assert_array_equal(f, s, err_msg=name)
            continue
        lead, n_in = lora.matrices(ModelConfig(vocab_size=2))[name]
        for layer in range(s.shape[0]):
            delta = (f[layer] - s[layer]).reshape(int(np.prod(s.shape[1:1 + n_in])), -1)
            sv = np.linalg.svd(delta, compute_uv=False)
            assert sv[0] > 0, name
            assert np.all(sv[RANK:] < 1e-3 * sv[0]), (name, sv[:RANK + 2] / sv[0])


def test_lora_stages_train_adapters_and_hand_on_merged_params(lora_run):
    cfg, wd, starts = lora_run
    sft_final, grpo_final = final_params(wd, "sft"), final_params(wd, "grpo")
    (sft_start, sft_kept), (grpo_start, grpo_kept) = starts["sft"], starts["grpo"]
    assert sft_kept and grpo_kept  # the frozen base is never written to, nor donated
    for x, y in zip(jax.tree.leaves(grpo_start), jax.tree.leaves(sft_final)):  # the next stage gets merged params
        np.testing.assert_array_equal(x, np.asarray(y))
    _assert_low_rank_update(sft_start, sft_final)
    _assert_low_rank_update(grpo_start, grpo_final)
    # the stage's checkpoints hold the adapters and their optimiser state only; merged into the start, the last
    # one gives the final params
    with ocp.StandardCheckpointer() as ck:
        state = ck.restore(os.path.join(wd, "checkpoints", "sft", "3", "state"))
    assert _names(state["params"]) == sorted(f"layers/{m}/{ab}" for m in LAYER_MATRICES for ab in "ab")
    merged = lora.merge(sft_start, state["params"], cfg.stages.sft.lora.alpha, RANK)
    for x, y in zip(jax.tree.leaves(merged), jax.tree.leaves(sft_final)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def _nbytes(tree) -> int:
    return sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree))


def test_logged_state_memory_is_the_adapters_and_their_adam_moments(lora_run):
    """`state_mb` (every step's metrics): what the optimiser updates and keeps; with LoRA the adapters and Adam's
    two moments of the same shapes, i.e. 3x the adapters' bytes (plus the step counters and the RNG key), far less
    than the full params it would be without LoRA."""
    cfg, wd, _ = lora_run
    rows = [r for r in load_metrics(os.path.join(wd, "metrics.jsonl")) if r["stage"] == "sft" and "state_mb" in r]
    assert rows and all(r["peak_rss_mb"] > 0 for r in rows)
    with ocp.StandardCheckpointer() as ck:
        adapters = ck.restore(os.path.join(wd, "checkpoints", "sft", "3", "state"))["params"]
    expected = 3 * _nbytes(adapters)
    assert 0 <= rows[-1]["state_mb"] * 2**20 - expected < 1024, (rows[-1]["state_mb"] * 2**20, expected)
    assert 3 * _nbytes(final_params(wd, "sft")) > 20 * expected


def test_interrupted_lora_stage_resumes_to_the_same_params(lora_run, tmp_path, monkeypatch):
    """The GRPO stage stopped after its first step: the resume takes its base from the SFT stage's saved params
    (what the driver hands a stage on every start) and the adapters from its checkpoint."""
    cfg, wd, _ = lora_run
    cut = str(tmp_path / "cut")
    original = common.Trainer.log

    def interrupting_log(self, step, metrics):
        original(self, step, metrics)
        if self.name == "grpo" and step == 0:
            raise KeyboardInterrupt

    monkeypatch.setattr(common.Trainer, "log", interrupting_log)
    with pytest.raises(KeyboardInterrupt):
        cascade.run(cfg, cut, "cascade_math", "tiny")
    resumed = []

    def recording_log(self, step, metrics):
        resumed.append((self.name, step))
        original(self, step, metrics)

    monkeypatch.setattr(common.Trainer, "log", recording_log)
    cascade.run(cfg, cut, "cascade_math", "tiny")
    assert resumed == [("grpo", 1)]  # SFT done, GRPO's first step restored from its checkpoint, not run again
    for stage in ("sft", "grpo"):
        for x, y in zip(jax.tree.leaves(final_params(wd, stage)), jax.tree.leaves(final_params(cut, stage))):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_rank_zero_is_the_full_params_path(tmp_path, monkeypatch):
    """rank 0 (the default) whatever alpha and targets say: no adapter is made or merged, the checkpoints hold the
    full params (today's path; measured bit for bit equal to the tree before LoRA)."""
    def refuse(*a, **k):
        raise AssertionError("LoRA code ran at rank 0")

    monkeypatch.setattr(lora, "init", refuse)
    monkeypatch.setattr(lora, "merge", refuse)
    cfg = tiny_sft_config(tmp_path, steps=2)
    cfg.stages.sft.lora.update(alpha=3.0, targets="embed")
    wd = str(tmp_path / "run")
    cascade.run(cfg, wd, "sft_math", "tiny")
    with ocp.StandardCheckpointer() as ck:
        state = ck.restore(os.path.join(wd, "checkpoints", "sft", "2", "state"))
    final = final_params(wd, "sft")
    assert _names(state["params"]) == _names(final)
    for x, y in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(final)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
