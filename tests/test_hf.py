"""HF checkpoints: our forward and KV-cache greedy decoding match transformers' Llama / Qwen2 / Qwen3 / Qwen3-MoE and
Nemotron-H (Mamba-2 + attention + MoE) on tiny random models saved with `save_pretrained` (one sharded, one with tied
embeddings, GQA with an explicit head_dim); load -> save -> load is bitwise; transformers loads what we save; a mesh
load places every tensor in its sharding with the same numbers; unsupported checkpoints fail naming the file and key."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nemocascade import sampling  # noqa: E402
from nemocascade.models import hf  # noqa: E402

V = 97
COMMON = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
# family -> (config class, model class, config kwargs, save kwargs)
FAMILIES = {
    # GQA 4:2 with head_dim 12 != hidden/heads = 8, eps 1e-5, saved in 6 shards
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-5),
              dict(max_shard_size="20KB")),
    # q/k/v bias, theta in rope_parameters (transformers 5)
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(num_key_value_heads=4, rope_parameters={"rope_type": "default", "rope_theta": 1e6}), {}),
    # QK-norm, tied embeddings, one kv head
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=1, head_dim=16, tie_word_embeddings=True),
              {}),
    # every MLP a mixture of 4 experts, 2 per token, renormalised top-k probabilities; saved one tensor per expert
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                       norm_topk_prob=True, router_aux_loss_coef=0.01), {}),
    # hybrid (Nemotron-H): Mamba-2, MoE (sigmoid router, 2 groups, shared expert), attention without rotary
    # embeddings, relu2 MLP, Mamba-2 again; scan chunks of 4 so an 11-token sequence spans three of them
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM",
                   dict(layers_block_type=["linear_attention", "moe", "full_attention", "mlp", "linear_attention"],
                        num_hidden_layers=None, num_key_value_heads=2, head_dim=8, mamba_num_heads=4,
                        mamba_head_dim=8, ssm_state_size=8, n_groups=2, conv_kernel=4, chunk_size=4,
                        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                        moe_shared_expert_intermediate_size=16, n_group=2, topk_group=1, routed_scaling_factor=1.5),
                   {}),
}
EXPECTED = {  # what config_from_hf must read, pinned by hand from the kwargs above
    "llama": dict(n_kv_heads=2, head_dim=12, norm_eps=1e-5, rope_theta=1e4, qkv_bias=False, qk_norm=False,
                  tie_embeddings=False),
    "qwen2": dict(n_kv_heads=4, head_dim=8, norm_eps=1e-6, rope_theta=1e6, qkv_bias=True, qk_norm=False,
                  tie_embeddings=False),
    "qwen3": dict(n_kv_heads=1, head_dim=16, norm_eps=1e-6, rope_theta=1e4, qkv_bias=False, qk_norm=True,
                  tie_embeddings=True),
    "qwen3_moe": dict(n_kv_heads=2, head_dim=8, qkv_bias=False, qk_norm=True, tie_embeddings=False, n_experts=4,
                      n_experts_per_tok=2, d_ff_expert=16, d_ff_shared=0, norm_topk_prob=True, router_aux_coef=0.01),
    "nemotron_h": dict(layer_pattern="ME*-M", n_layers=5, rope=False, mlp_act="relu2", router="sigmoid",
                       n_experts=4, n_expert_groups=2, topk_groups=1, routed_scaling=1.5, d_ff_shared=16,
                       mamba_heads=4, mamba_head_dim=8, ssm_state=8, mamba_groups=2, mamba_chunk=4, norm_eps=1e-5),
}


def _hf_model(family, seed=0):
    cfg_cls, model_cls, kw, _ = FAMILIES[family]
    torch.manual_seed(seed)
    kw = {k: v for k, v in (COMMON | kw).items() if v is not None}
    model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**kw)).eval()
    with torch.no_grad():  # norms away from 1 and weights large enough that logits spread over a few units
        for name, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
        for name, b in model.named_buffers():  # the MoE router's selection bias (Nemotron-H)
            if "e_score_correction_bias" in name:
                b.copy_(0.1 * torch.randn_like(b))
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> (transformers model, directory it was saved to)."""
    out = {}
    for family, (_, _, _, save_kw) in FAMILIES.items():
        model = _hf_model(family)
        path = str(tmp_path_factory.mktemp(family))
        model.save_pretrained(path, **save_kw)
        out[family] = (model, path)
    assert os.path.exists(os.path.join(out["llama"][1], "model.safetensors.index.json"))
    return out


def _hf_logits(model, tokens, mask=None):
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(tokens), dtype=torch.long),
                     attention_mask=None if mask is None else torch.as_tensor(mask, dtype=torch.long)).logits.numpy()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_full_forward_matches_transformers(saved, family):
    model, path = saved[family]
    cfg, params = hf.load(path)
    for key, value in EXPECTED[family].items():
        assert getattr(cfg, key) == value, (key, getattr(cfg, key))
    assert ("lm_head" in params) != cfg.tie_embeddings
    tokens = np.random.default_rng(1).integers(0, V, (2, 11)).astype(np.int32)
    ref = _hf_logits(model, tokens)
    ours = np.asarray(hf.forward(cfg, params, tokens))
    assert ours.dtype == np.float32 and ours.shape == (2, 11, V)
    assert np.abs(ref).max() > 1.0  # the comparison is not between near-zero logits
    diff = np.abs(ours - ref).max()
    print(f"{family}: max |logits - transformers| = {diff:.2e}")
    assert diff <= 1e-4


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kv_cache_greedy_matches_generate(saved, family):
    """Left-padded batch of two prompts: our sampler's greedy tokens equal transformers' generate, and the
    log-prob of each chosen token equals log_softmax of generate's per-step logits."""
    model, path = saved[family]
    cfg, params = hf.load(path)
    rng = np.random.default_rng(2)
    prompt_len, N = 6, 5
    lens = np.array([6, 3], np.int32)
    prompts = rng.integers(1, V, (2, prompt_len)).astype(np.int32)
    mask = np.arange(prompt_len)[None] >= (prompt_len - lens)[:, None]
    prompts[~mask] = 0
    out = sampling.sample(params, cfg, jnp.asarray(prompts), jnp.asarray(lens), jax.random.key(0),
                          max_new_tokens=N, eos_id=-1, greedy=True)
    with torch.no_grad():
        gen = model.generate(torch.as_tensor(prompts, dtype=torch.long),
                             attention_mask=torch.as_tensor(mask, dtype=torch.long), max_new_tokens=N,
                             min_new_tokens=N, do_sample=False, pad_token_id=0, eos_token_id=None,
                             output_logits=True, return_dict_in_generate=True)
    ref_tokens = gen.sequences[:, prompt_len:].numpy()
    np.testing.assert_array_equal(np.asarray(out.tokens), ref_tokens)
    ref_lp = torch.log_softmax(torch.stack(gen.logits, 1), -1).numpy()
    ref_lp = np.take_along_axis(ref_lp, ref_tokens[..., None], -1)[..., 0]
    diff = np.abs(np.asarray(out.logprobs) - ref_lp).max()
    print(f"{family}: greedy decode, max |logprob - transformers| = {diff:.2e}")
    assert diff <= 1e-4


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_round_trip_is_bitwise_and_transformers_loads_ours(saved, family, tmp_path):
    model, path = saved[family]
    cfg, params = hf.load(path)
    hf.save(cfg, params, str(tmp_path))
    cfg2, params2 = hf.load(str(tmp_path))
    assert cfg2 == cfg
    for (k, a), b in zip(jax.tree.leaves_with_path(params), jax.tree.leaves(params2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(k))
    # the saved tensors are exactly the original checkpoint's
    ours = hf.to_hf_tensors(cfg, params)
    for name, p in model.state_dict().items():
        if name in ours:
            np.testing.assert_array_equal(ours[name], p.numpy(), err_msg=name)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert type(reloaded).__name__ == FAMILIES[family][1]
    tokens = np.random.default_rng(3).integers(0, V, (1, 9))
    assert np.abs(_hf_logits(reloaded, tokens) - _hf_logits(model, tokens)).max() <= 1e-5


def test_bfloat16_checkpoint_keeps_its_precision(tmp_path):
    model = _hf_model("qwen2", seed=4).to(torch.bfloat16)
    model.save_pretrained(str(tmp_path / "src"))
    cfg, params = hf.load(str(tmp_path / "src"))
    assert cfg.param_dtype == "bfloat16" and params["layers"]["wq"].dtype == jnp.bfloat16
    q = model.model.layers[1].self_attn.q_proj.weight.detach().float().numpy()  # [H*Dh, D]
    np.testing.assert_array_equal(np.asarray(params["layers"]["wq"][1], np.float32), q.T.reshape(32, 4, 8))
    hf.save(cfg, params, str(tmp_path / "out"))
    cfg2, params2 = hf.load(str(tmp_path / "out"))
    assert cfg2 == cfg
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        assert a.dtype == b.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def _edit_config(src, dst, **changes):
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return str(dst)


def test_unsupported_or_broken_checkpoints_name_the_problem(saved, tmp_path):
    path = saved["qwen2"][1]
    with pytest.raises(ValueError, match=r"config\.json: model_type 'gemma' is not supported"):
        hf.load(_edit_config(path, tmp_path / "a", model_type="gemma"))
    with pytest.raises(ValueError, match="rope_type 'llama3'"):
        hf.load(_edit_config(path, tmp_path / "b", rope_parameters={"rope_type": "llama3", "factor": 8.0}))
    with pytest.raises(ValueError, match="use_sliding_window"):
        hf.load(_edit_config(path, tmp_path / "c", use_sliding_window=True))
    # a qwen2 checkpoint relabelled llama: its q/k/v biases have no place in a Llama
    with pytest.raises(ValueError, match=r"self_attn\.k_proj\.bias"):
        hf.load(_edit_config(path, tmp_path / "d", model_type="llama"))
    # a shard index that lists a tensor no shard holds: the loader names it
    dst = shutil.copytree(saved["llama"][1], tmp_path / "e")
    with open(dst / "model.safetensors.index.json") as f:
        index = json.load(f)
    del index["weight_map"]["model.layers.1.mlp.up_proj.weight"]
    with open(dst / "model.safetensors.index.json", "w") as f:
        json.dump(index, f)
    with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight' is missing"):
        hf.load(str(dst))
    dst = shutil.copytree(path, tmp_path / "f")
    os.remove(dst / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor model.safetensors.index.json"):
        hf.load(str(dst))


MESH_SCRIPT = textwrap.dedent("""
    import sys, jax, numpy as np
    from nemocascade import mesh as mesh_lib
    from nemocascade.models import hf, param_shardings
    assert jax.device_count() == 8
    mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    for path in sys.argv[1:]:
        cfg, single = hf.load(path)
        cfg2, sharded = hf.load(path, mesh=mesh)
        assert cfg2 == cfg
        shard = param_shardings(cfg, mesh)
        for (k, a), b, s in zip(jax.tree.leaves_with_path(single), jax.tree.leaves(sharded), jax.tree.leaves(shard)):
            assert b.sharding.is_equivalent_to(s, b.ndim), (k, b.sharding, s)
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(k))
            for piece in b.addressable_shards:  # every device holds exactly its block
                np.testing.assert_array_equal(np.asarray(piece.data), np.asarray(a)[piece.index])
        assert sharded["layers"]["wq"].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
        tokens = np.arange(16, dtype=np.int32).reshape(2, 8) % cfg.vocab_size
        np.testing.assert_allclose(np.asarray(hf.forward(cfg, sharded, tokens)),
                                   np.asarray(hf.forward(cfg, single, tokens)), atol=1e-5)
    print("MESH-LOAD-OK")
""")


def test_load_onto_mesh_places_each_shard(saved):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", MESH_SCRIPT, saved["llama"][1], saved["qwen2"][1]], env=env,
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "MESH-LOAD-OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
