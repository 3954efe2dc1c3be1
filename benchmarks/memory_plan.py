"""Per-device memory of real model sizes on fake meshes, from XLA's own accounting: no weights, no accelerator.

    python benchmarks/memory_plan.py                                   # every model x mesh below (minutes)
    python benchmarks/memory_plan.py --models=qwen3-8b --meshes=8,16 --json=plan.json

Each model's three programs are compiled ahead of time on abstract shapes (`jax.jit(f).lower(...).compile()`) on
a mesh of fake CPU devices, with the policy, the frozen reference and the MOPD teachers as params pytrees placed
by the same sharding rules on the one mesh:

  sample   prefill + `lax.while_loop` decode with the KV cache (`sampling.sample`): the rollout batch, or one
           of its `--sample_chunks` chunks (`rollout.sample_chunks`);
  step     the on-policy update (`rl.update.policy_step`: GRPO's objective, AdamW, micro-batches, remat);
  teacher  one frozen role's pass over the training batch (`rl.update.FrozenRoles`: MOPD's teacher log-probs);
  judge    with `--judge=MODEL`: a generative judge of that size resident on the same mesh, and its verdict pass
           (`rewards.judge`'s log-probability mode) over `judge_batch` judging prompts of `judge_len` tokens (C2's
           GenRM reads the request and two responses; a step asks prompts x group x (group - 1) of them).

`compiled.memory_analysis()` gives each program's per-device arguments, outputs, temporaries and aliasing. What
stays resident between programs (policy params and AdamW moments, the reference, the teachers) is counted from
the shardings; a program's peak is its own arguments, temporaries and outputs plus whatever resident state it
does not take as an argument. The plan's number is the largest peak over the three programs; it is XLA's CPU
compile's accounting (the TPU/GPU compilers fuse differently, so read it as an estimate to within tens of
percent, not a guarantee), and it leaves out the runtime's own reserve. Fits: the accelerator memory sizes in
ACCELERATORS that hold the peak with 10% to spare.

`--target=tpu:TOPOLOGY` compiles with the TPU compiler for that topology's chips instead (no TPU needed): its
accounting is the TPU's own, and a program that does not fit a chip is the compiler's refusal, printed as a row.
Each program's peak is printed against its floor (`floors`: the resident roles and state plus what the program
cannot do without). `--json` writes {"results": [{"model", "topology", "shapes", "programs": {NAME: {"peak_gib",
"fits", "floor_gib", "optimal_s", "flops", "bytes", "error", ...}}}]}; optimal_s, flops and bytes are the
compiler's and count a loop's body once (the layer scan, the micro-batch scan, decode), so they are not the
program's whole cost.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import time

_MAX_DEVICES = 64
if "jax" not in sys.modules:  # the device count is fixed when JAX starts
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={_MAX_DEVICES}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from nemocascade import mesh as mesh_lib  # noqa: E402
from nemocascade import objectives, optim, sampling, train_state  # noqa: E402
from nemocascade.preflight import tree_bytes_per_device as _bytes  # noqa: E402
from nemocascade.models import ModelConfig, init_params, param_shardings  # noqa: E402
from nemocascade.rl import rollouts, update  # noqa: E402

GiB = 2 ** 30
# the published configs (config.json of each checkpoint); compute in bfloat16, params and AdamW moments in float32
MODELS = {
    # smollm2_cascade's model as its GGUF describes it (models/gguf.config_from_gguf), as a run loads it: float32
    # params, bfloat16 compute on an accelerator, no remat (the shipped config sets none)
    "smollm2-135m": ModelConfig(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
                                d_ff=1536, rope_theta=100000.0, norm_eps=1e-5, tie_embeddings=True, dtype="bfloat16"),
    "qwen3-8b": ModelConfig(vocab_size=151936, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128,
                            d_ff=12288, rope_theta=1e6, qk_norm=True, dtype="bfloat16", remat=True),
    "qwen3-30b-a3b": ModelConfig(vocab_size=151936, d_model=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim=128,
                                 d_ff=6144, rope_theta=1e6, qk_norm=True, n_experts=128, n_experts_per_tok=8,
                                 d_ff_expert=768, norm_topk_prob=True, router_aux_coef=0.001, dtype="bfloat16",
                                 remat=True),
    # Cascade 2's base (NVIDIA-Nemotron-3-Nano-30B-A3B: 23 Mamba-2, 23 MoE and 6 attention layers; values as in
    # NVIDIA's Megatron-Bridge recipe and the checkpoint's config.json)
    "nemotron-3-nano-30b-a3b": ModelConfig(
        vocab_size=131072, d_model=2688, n_layers=52, n_heads=32, n_kv_heads=2, head_dim=128, d_ff=1856,
        norm_eps=1e-5, rope=False, mlp_act="relu2",
        layer_pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
        n_experts=128, n_experts_per_tok=6, d_ff_expert=1856, d_ff_shared=3712, router="sigmoid", norm_topk_prob=True,
        routed_scaling=2.5, mamba_heads=64, mamba_head_dim=64, ssm_state=128, mamba_groups=8, conv_kernel=4,
        mamba_chunk=128, dtype="bfloat16", remat=True),
}
# devices -> mesh per model kind: FSDP everywhere, tensor parallel from 16 devices, experts split from 8 (MoE)
MESHES = {
    "dense": {1: {"fsdp": 1}, 8: {"fsdp": 8}, 16: {"fsdp": 8, "tensor": 2}, 64: {"fsdp": 16, "expert": 2, "tensor": 2}},
    "moe": {8: {"fsdp": 4, "expert": 2}, 16: {"fsdp": 4, "expert": 4}, 64: {"fsdp": 8, "expert": 8}},
}
ACCELERATORS = {"TPU v5e 16G": 16, "TPU v4 32G": 32, "A100 40G": 40, "A100/H100 80G": 80, "TPU v5p 95G": 95,
                "H200 141G": 141}


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The run's shapes: a step trains prompts x group rows of prompt_len + max_new tokens."""
    prompts: int = 64
    group: int = 16
    prompt_len: int = 1024
    max_new: int = 3072
    micro_batches: int = 16
    sample_chunks: int = 1  # rollout.sample_chunks: the sampler compiles prompts / sample_chunks prompts
    teachers: int = 2
    judge_batch: int = 64
    judge_len: int = 7168  # prompt_len + 2 x max_new / ... : the request and two whole responses


def _abstract(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _analysis(compiled) -> dict:
    m, c = compiled.memory_analysis(), compiled.cost_analysis()
    c = (c[0] if isinstance(c, list) else c) or {}
    return {**{k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp", "alias")},
            "flops": c.get("flops"), "bytes": c.get("bytes accessed"), "optimal_s": c.get("optimal_seconds")}


def floors(cfg: ModelConfig, mesh, shapes: Shapes, param_bytes: int) -> dict:
    """Each program's analytic memory floor per device, besides the resident roles: what it cannot do without.
    sample: its params and one chunk's KV cache; step and micro_batch: float32 gradients and remat's saved layer
    inputs (bfloat16) for one micro-batch; teacher and judge: nothing beyond their params (one layer at a time)."""
    dp = math.prod(mesh.shape[a] for a in mesh_lib.RULES["batch"] if a in mesh.shape)
    width = shapes.prompt_len + shapes.max_new
    attn_layers = cfg.layer_pattern.count("*") if cfg.layer_pattern else cfg.n_layers
    kv_heads = cfg.n_kv_heads / (mesh.shape["tensor"] if cfg.n_kv_heads % mesh.shape["tensor"] == 0 else 1)
    kv = shapes.prompts // shapes.sample_chunks * shapes.group / dp * width * attn_layers * kv_heads * cfg.head_dim * 4
    rows = shapes.prompts * shapes.group / shapes.micro_batches / dp
    acts = rows * width * cfg.d_model * 2 * cfg.n_layers
    return {"sample": param_bytes + kv, "step": param_bytes + acts, "micro_batch": param_bytes + acts,
            "teacher": param_bytes, "judge": 0}


def target_devices(target: str) -> list:
    """`cpu:N`: N of the fake CPU devices; `tpu:TOPOLOGY` (e.g. tpu:v5p:4x4x4): every chip of a real TPU topology,
    compiled for by the TPU compiler without a TPU (`pip install -e ".[tpu]"`)."""
    kind, _, rest = target.partition(":")
    if kind == "cpu":
        return jax.devices("cpu")[:int(rest)]
    if kind == "tpu":  # tpu:TOPOLOGY, or tpu:TOPOLOGY:N for its first N chips (tpu:v5e:2x2:1: one chip)
        from jax.experimental import topologies
        name, _, n = rest.rpartition(":") if rest.count(":") == 2 else (rest, "", "")
        devices = topologies.get_topology_desc(platform="tpu", topology_name=name).devices
        return devices[:int(n)] if n else devices
    raise SystemExit(f"--target={target!r}: expected cpu:N or tpu:TOPOLOGY (e.g. tpu:v5p:4x4x4)")


def _compile(lowered) -> dict:
    """A program's memory analysis, or its error when the compiler refuses it (out of memory is a row)."""
    try:
        return _analysis(lowered.compile())
    except Exception as e:  # noqa: BLE001  (XlaRuntimeError: RESOURCE_EXHAUSTED and its sizes)
        return {"error": str(e).split("\n")[0][:300]}


def plan(name: str, cfg: ModelConfig, devices: list, shapes: Shapes, judge: str = "") -> dict:
    axes = MESHES["moe" if cfg.moe else "dense"][len(devices)]
    mesh = mesh_lib.make_mesh(axes, devices)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # as a run traces its programs (cascade.py)
        return _plan(name, cfg, mesh, axes, shapes, judge)


def _plan(name, cfg, mesh, axes, shapes, judge) -> dict:
    shard = param_shardings(cfg, mesh)
    params = _abstract(jax.eval_shape(functools.partial(init_params, cfg), jax.random.key(0)), shard)
    o = ml_collections.ConfigDict(dict(optim.DEFAULTS) | dict(lr=1e-6))
    tx, _ = optim.make_optimizer(o, 100)
    state_shape = jax.eval_shape(lambda p: train_state.create(p, tx, jax.random.key(0)), params)
    state = _abstract(state_shape, train_state.shardings(state_shape, shard, mesh))
    rows, width = shapes.prompts * shapes.group, shapes.prompt_len + shapes.max_new

    def batch_of(n, shape, dtype):
        return jax.ShapeDtypeStruct((n, *shape), dtype, sharding=mesh_lib.batch_sharding(mesh, 1 + len(shape), n))

    out = {"model": name, "devices": mesh.size, "mesh": axes, "params_b": sum(math.prod(x.shape) for x in
                                                                            jax.tree.leaves(params)) / 1e9}
    resident = {"policy_state": _bytes(state), "reference": _bytes(params), "teachers": shapes.teachers *
                _bytes(params)}
    if judge:
        jcfg = MODELS[judge]
        jparams = _abstract(jax.eval_shape(functools.partial(init_params, jcfg), jax.random.key(0)),
                            param_shardings(jcfg, mesh))
        resident["judge"] = _bytes(jparams)
    out["resident_gib"] = {k: v / GiB for k, v in resident.items()}
    judge_b = resident.get("judge", 0)  # resident beside every program
    programs = {}

    t0 = time.perf_counter()
    sample = jax.jit(functools.partial(sampling.sample, cfg=cfg, max_new_tokens=shapes.max_new, eos_id=2,
                                       num_samples=shapes.group))
    prompts = batch_of(shapes.prompts // shapes.sample_chunks, (shapes.prompt_len,), jnp.int32)
    lens = batch_of(shapes.prompts // shapes.sample_chunks, (), jnp.int32)
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=mesh_lib.replicated(mesh))
    programs["sample"] = (_compile(sample.lower(params, prompt_tokens=prompts, prompt_lens=lens, rng=key)),
                          resident["policy_state"] - _bytes(params) + resident["reference"] + resident["teachers"]
                          + judge_b)

    objective = objectives.build(dict(terms={"pg": 1.0}))
    step = jax.jit(update.policy_step(tx, model_cfg=cfg, objective=objective, micro_batches=shapes.micro_batches),
                   donate_argnums=0)
    batch = rollouts.batch_shapes(mesh, shapes.prompts, shapes.group, width)
    programs["step"] = (_compile(step.lower(state, batch)), resident["reference"] + resident["teachers"] + judge_b)
    micro = jax.jit(update.policy_step(tx, model_cfg=cfg, objective=objective), donate_argnums=0)
    n_micro = shapes.prompts // shapes.micro_batches  # one micro-batch's prompts, each with its whole group
    one = rollouts.batch_shapes(mesh, n_micro, shapes.group, width)
    programs["micro_batch"] = (_compile(micro.lower(state, one)), resident["reference"] + resident["teachers"]
                               + judge_b)

    roles = update.FrozenRoles(cfg, {"teacher_logp"}, teachers=(params,), teacher_of_domain=np.zeros(1, np.int32),
                               micro_batches=shapes.micro_batches)
    rows_mask, inputs = batch_of(rows, (), jnp.bool_), {k: batch[k] for k in ("tokens", "positions", "valid")}
    programs["teacher"] = (_compile(roles._teacher.lower(params, inputs, rows_mask, None)),
                           resident["policy_state"] + resident["reference"] + resident["teachers"] - _bytes(params)
                           + judge_b)
    if judge:
        from nemocascade.rewards import judge as judge_lib

        n, L = shapes.judge_batch, shapes.judge_len
        lowered = judge_lib._next_logprobs.lower(jparams, batch_of(n, (L,), jnp.int32), batch_of(n, (L,), jnp.bool_),
                                                 batch_of(n, (2,), jnp.int32), cfg=jcfg)
        programs["judge"] = (_compile(lowered),
                             resident["policy_state"] + resident["reference"] + resident["teachers"])
    out["compile_s"] = time.perf_counter() - t0
    out["programs"] = {}
    # the step and its micro-batch take the policy state as their argument; the others see it resident
    floor = floors(cfg, mesh, shapes, _bytes(params))
    deviceless = mesh.devices.flat[0].platform != "cpu"  # a TPU topology: the compiler refuses what does not fit
    for prog, (m, others) in programs.items():
        base = {"floor_gib": (floor[prog] + others + (resident["policy_state"] if prog in ("step", "micro_batch")
                                                     else 0)) / GiB,
                "fits": ("error" not in m) if deviceless else None}
        if "error" in m:
            out["programs"][prog] = {**m, **base, "peak": float("inf"), "peak_gib": None}
            continue
        peak = m["argument"] + m["temp"] + m["output"] - m["alias"] + others
        sizes = {k: m[k] / GiB for k in ("argument", "output", "temp", "alias")}
        out["programs"][prog] = {**sizes, **base, "flops": m["flops"], "bytes": m["bytes"], "optimal_s": m["optimal_s"],
                                 "others_resident": others / GiB, "peak": peak / GiB, "peak_gib": peak / GiB,
                                 "error": None}
    out["peak_gib"] = max(p["peak"] for p in out["programs"].values())
    out["fits"] = [a for a, gib in ACCELERATORS.items() if out["peak_gib"] * 1.1 <= gib]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(m for m in MODELS if m != "smollm2-135m"))
    ap.add_argument("--meshes", default="8,16,64", help="fake CPU device counts (each <= 64), without --target")
    ap.add_argument("--target", default="", help="tpu:TOPOLOGY[:N] (e.g. tpu:v5p:4x4x4) or cpu:N; overrides --meshes")
    ap.add_argument("--attention", default="", help="model.attention for every model: auto, dense, blockwise, splash")
    ap.add_argument("--remat", default="", choices=("", "true", "false"), help="model.remat for every model")
    ap.add_argument("--json", default="")
    ap.add_argument("--judge", default="", help="a model of MODELS as a generative judge beside the policy")
    for f in dataclasses.fields(Shapes):
        ap.add_argument(f"--{f.name}", type=int, default=f.default)
    args = ap.parse_args()
    shapes = Shapes(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Shapes)})
    unknown = sorted(set(args.models.split(",")) - set(MODELS)) + ([args.judge] if args.judge and args.judge not in
                                                                   MODELS else [])
    if unknown:
        sys.exit(f"--models: unknown {unknown}; known {sorted(MODELS)}")
    targets = [args.target] if args.target else [f"cpu:{d}" for d in args.meshes.split(",")]
    over = ({"attention": args.attention} if args.attention else {}) | ({"remat": args.remat == "true"}
                                                                       if args.remat else {})
    models = {n: dataclasses.replace(MODELS[n], **over) for n in args.models.split(",")}
    print(f"shapes: {shapes}; targets {targets}; attention {args.attention or 'as each model says'}")
    results = []
    judged = f" judge pass ({args.judge}) |" if args.judge else ""
    header = (f"| model | target | mesh | params (B) | sample | step | one micro-batch | teacher pass |{judged} "
              "peak / device | fits (10% spare) |")
    print(header + "\n|:--|:--|:--|--:|--:|--:|--:|--:|" + ("--:|" if args.judge else "") + "--:|:--|", flush=True)
    cell = lambda p: p["error"] or f"{p['peak']:.1f} GiB ({p['peak'] / p['floor_gib']:.2f}x floor)"  # noqa: E731
    for name, cfg in models.items():
        for target in targets:
            r = plan(name, cfg, target_devices(target), shapes, args.judge)
            results.append({**r, "target": target, "topology": target, "shapes": dataclasses.asdict(shapes)})
            mesh = " x ".join(f"{k} {v}" for k, v in r["mesh"].items())
            p = r["programs"]
            print(f"| {name} | {target} | {mesh} | {r['params_b']:.1f} | {cell(p['sample'])} | {cell(p['step'])} | "
                  f"{cell(p['micro_batch'])} | {cell(p['teacher'])} | "
                  + (f"{cell(p['judge'])} | " if args.judge else "") + f"**{r['peak_gib']:.1f} GiB** | "
                  f"{', '.join(r['fits']) or 'none listed'} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shapes": dataclasses.asdict(shapes), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
