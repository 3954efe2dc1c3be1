"""Sharding on 8 fake CPU devices: forward, loss and gradients on the (data, fsdp, tensor) mesh, and a mixture
of experts' (and a Nemotron-H hybrid's) on the (fsdp, expert, tensor) mesh, equal the single-device ones; policy,
reference and teacher params live on the same mesh with the same shardings; traced under the mesh (activations
pinned, blockwise attention) they still equal the single-device dense ones. Runs in a subprocess because the
device count is fixed when JAX starts."""
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding
    from nemocascade import losses, mesh as mesh_lib, sampling
    from nemocascade.models import ModelConfig, forward, init_params, init_sharded, param_shardings

    import sys
    assert jax.device_count() == 8, jax.devices()
    kind = sys.argv[1]
    moe, hybrid, on_expert = kind in ("moe", "hybrid"), kind == "hybrid", kind != "dense"
    experts = dict(n_experts=4, n_experts_per_tok=2, d_ff_expert=16, d_ff_shared=16, norm_topk_prob=True,
                   router_aux_coef=0.01)
    if hybrid:  # Nemotron-H: Mamba-2, attention, MLP and MoE layers, a sigmoid router with expert groups
        experts |= dict(layer_pattern="ME*-M", n_layers=5, rope=False, mlp_act="relu2", router="sigmoid",
                        n_expert_groups=2, topk_groups=1, mamba_heads=4, mamba_head_dim=4, ssm_state=6,
                        mamba_groups=2, conv_kernel=3, mamba_chunk=4)
    cfg = ModelConfig(**{**dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64),
                         **(experts if moe else {})})
    axes = {"fsdp": 2, "expert": 2, "tensor": 2} if on_expert else {"data": 2, "fsdp": 2, "tensor": 2}
    mesh = mesh_lib.make_mesh(axes)
    batch_axes = ("fsdp", "expert") if on_expert else ("data", "fsdp")
    group = (lambda tree, name: tree["moe" if name.startswith("we_") else "attn"]) if hybrid else (
        lambda tree, name: tree["layers"])  # where a weight lives: hybrid params are grouped by layer kind
    mlp = "we_up" if moe else "w_up"
    shard = param_shardings(cfg, mesh)
    if moe:  # each device holds half the experts
        assert group(shard, "we_up")["we_up"].spec == jax.sharding.PartitionSpec(None, "expert", "fsdp", "tensor")

    single = init_params(cfg, jax.random.key(0))
    policy = init_sharded(cfg, mesh, jax.random.key(0))
    # sharded init gives the same numbers as the single-device init (up to float rounding under jit)
    for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(policy)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-8)
    reference = jax.device_put(single, shard)
    teacher = jax.device_put(init_params(cfg, jax.random.key(1)), shard)
    for role in (policy, reference, teacher):
        for x, s in zip(jax.tree.leaves(role), jax.tree.leaves(shard)):
            assert x.sharding.is_equivalent_to(s, x.ndim), (x.sharding, s)
    specs = {str(s.spec) for s in jax.tree.leaves(shard)}
    assert any("tensor" in sp for sp in specs) and any("fsdp" in sp for sp in specs), specs
    # a dense model on an expert axis shards over it too (one more data-parallel axis); with experts, only they do
    assert group(shard, "wq")["wq"].spec == jax.sharding.PartitionSpec(
        None, ("fsdp", "expert") if kind == "dense_expert" else "fsdp", "tensor", None)

    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 64, (8, 12)).astype(np.int32)
    mask = (rng.random((8, 11)) > 0.3).astype(np.float32)

    def loss_fn(p, tokens, mask, cfg):  # with experts, plus the load-balancing loss
        logits, aux = forward(p, cfg, tokens[:, :-1], with_aux=True)
        return losses.token_cross_entropy(logits, tokens[:, 1:], mask)[0] + cfg.router_aux_coef * aux

    def run(p, tokens, mask, cfg=cfg):
        fn = lambda p, t, m: (forward(p, cfg, t), *jax.value_and_grad(loss_fn)(p, t, m, cfg))  # noqa: E731
        return jax.jit(fn)(p, tokens, mask)

    cpu0 = jax.devices()[0]
    ref = run(jax.device_put(single, cpu0), jax.device_put(tokens, cpu0), jax.device_put(mask, cpu0))
    batch = mesh_lib.shard_batch(mesh, {"tokens": tokens, "mask": mask})
    assert batch["tokens"].sharding.spec == jax.sharding.PartitionSpec(batch_axes, None)
    out = run(policy, batch["tokens"], batch["mask"])
    # traced under the mesh, as a run is (activations pinned by mesh.constrain), with blockwise attention (blocks
    # of 4 over 11 tokens): the values of the single-device dense reference too
    blockwise = ModelConfig(**{**cfg.__dict__, "attention": "blockwise", "attention_block": 4})
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        pinned = run(policy, batch["tokens"], batch["mask"], blockwise)

    def rel(a, b):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12)
    assert rel(out[0], ref[0]) <= 1e-5, rel(out[0], ref[0])
    assert rel(out[1], ref[1]) <= 1e-5, rel(out[1], ref[1])
    for g, gr in zip(jax.tree.leaves(out[2]), jax.tree.leaves(ref[2])):
        assert rel(g, gr) <= 1e-5, rel(g, gr)
    for a, b in zip(jax.tree.leaves(pinned), jax.tree.leaves(ref)):
        assert rel(a, b) <= 1e-5, rel(a, b)
    # gradients come back sharded like their parameters
    g_mlp = group(out[2], mlp)[mlp]
    assert g_mlp.sharding.is_equivalent_to(group(shard, mlp)[mlp], g_mlp.ndim)

    # the sampler on the mesh gives the same greedy tokens as on one device
    prompts = tokens[:, :5]
    lens = np.full((8,), 5, np.int32)
    kw = dict(max_new_tokens=6, eos_id=-1, greedy=True)
    s_ref = sampling.sample(jax.device_put(single, cpu0), cfg, jnp.asarray(prompts), jnp.asarray(lens),
                            jax.random.key(0), **kw)
    pb = mesh_lib.shard_batch(mesh, {"p": prompts, "l": lens})
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        s_out = sampling.sample(policy, cfg, pb["p"], pb["l"], jax.random.key(0), **kw)
    np.testing.assert_array_equal(np.asarray(s_out.tokens), np.asarray(s_ref.tokens))
    print("SHARDING-OK")
""")


# hybrid (Mamba-2 state on the mesh) runs under -m slow: CI's default suite stays within its 20 minutes
@pytest.mark.parametrize("kind", ["dense", "dense_expert", "moe", pytest.param("hybrid", marks=pytest.mark.slow)])
def test_sharded_forward_loss_grads_equal_single_device(kind):
    """dense: a (data, fsdp, tensor) mesh; dense_expert: a dense model on (fsdp, expert, tensor), its weights
    sharded over the expert axis too; moe: a mixture of experts on (fsdp, expert, tensor), experts split
    over the expert axis, the loss with its load-balancing term; hybrid: Nemotron-H's Mamba-2 + attention + MLP +
    MoE pattern on that mesh (the sampler's cache then holds conv and SSM states)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, kind], env=env, cwd=root, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "SHARDING-OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
