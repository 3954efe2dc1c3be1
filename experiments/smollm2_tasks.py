"""Which tasks leave SmolLM2-135M-Instruct headroom for RL after a short SFT? Measured on validation.

    python experiments/smollm2_tasks.py --workdir=/tmp/smollm2_tasks            # ~30 min on 2 CPU cores

Every candidate is a reasoning-gym generator at an easy setting, asked for its answer as `\\boxed{N}` (the
format the prompt states; graded exactly by the math verifier, never by taking the reply's last number).
The script scores SmolLM2 greedy on `--n` validation items per candidate, runs one short SFT on a mixture of
every candidate's training items (the gold answer as the target, non-thinking mode), and scores again at
`--eval_at` steps. A task is a candidate for an RL stage when it sits between 20% and 70% after SFT (issue
16). Writes `tasks.json` (per task and checkpoint: pass@1, n, 95% interval) and prints a table.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import time

import jax
import ml_collections
import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from nemocascade import evaluation, optim, train_state  # noqa: E402
from nemocascade.models import pretrained  # noqa: E402
from nemocascade.data import pipeline  # noqa: E402
from nemocascade.data import reasoning_gym as rgm  # noqa: E402
from nemocascade.mesh import make_mesh, shard_batch  # noqa: E402
from nemocascade.rewards.pool import VerifierPool  # noqa: E402
from nemocascade.stages.sft import sft_loss  # noqa: E402

INSTRUCTION = "Give only the final answer, as \\boxed{N}."
# name -> (reasoning-gym dataset, its settings): easy ends of each generator, single-number answers.
CANDIDATES = {
    "add_2x2": ("chain_sum", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2)),
    # two 2-digit terms: a uniform space of 16,200 questions (1-2 digits draws the digit count first, so one-digit
    # questions repeat and distinct items skew toward the rarer two-digit ones)
    "add_2d": ("chain_sum", dict(min_terms=2, max_terms=2, min_digits=2, max_digits=2)),
    "chain_3x2": ("chain_sum", dict(min_terms=3, max_terms=3, min_digits=1, max_digits=2)),
    "arith_2x2": ("basic_arithmetic", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2,
                                           operators=("+", "-", "*"), allow_parentheses=False,
                                           allow_negation=False)),
    "mul_2x1": ("products", dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2)),
    "legs_2x5": ("leg_counting", dict(min_animals=1, max_animals=2, min_instances=1, max_instances=5)),
    "letters_3w": ("letter_counting", dict(min_words=1, max_words=3)),
    "letters_6w": ("letter_counting", dict(min_words=3, max_words=6)),
    "letters_10w": ("letter_counting", dict(min_words=6, max_words=10)),
    "bits_255": ("count_bits", dict(min_n=1, max_n=255)),
    "gcd_50": ("gcd", dict(min_value=1, max_value=50)),
    "gcd_100": ("gcd", dict(min_value=1, max_value=100)),
    "lcm_20": ("lcm", dict(min_value=1, max_value=20)),
    "lcm_50": ("lcm", dict(min_value=1, max_value=50)),
    "eq_2x20": ("simple_equations", dict(min_terms=2, max_terms=2, min_value=1, max_value=20)),
}

flags.DEFINE_string("workdir", "/tmp/smollm2_tasks", "where tasks.json goes")
flags.DEFINE_list("tasks", list(CANDIDATES), "candidate names")
flags.DEFINE_integer("n", 100, "validation items per task")
flags.DEFINE_integer("num_train", 400, "training items per task")
flags.DEFINE_integer("batch_size", 16, "SFT batch")
flags.DEFINE_integer("seq_len", 96, "SFT sequence length")
flags.DEFINE_float("lr", 2e-5, "SFT peak learning rate (cosine, 10% warmup)")
flags.DEFINE_list("eval_at", ["0", "40", "80"], "SFT steps after which to score (0 = the starting model)")
flags.DEFINE_integer("max_new_tokens", 24, "greedy tokens per answer")
flags.DEFINE_integer("seed", 0, "data and SFT seed")
FLAGS = flags.FLAGS


def records(task: str, split: str, n: int, seed: int, distinct: bool = False) -> list[dict]:
    """`n` records of a task's split; `distinct`: `n` different questions (a repeat is not an independent item:
    lcm up to 20 has ~400 questions, ~40 of them in validation), or as many as the split has."""
    dataset, settings = CANDIDATES[task]
    rng = np.random.default_rng([seed, list(CANDIDATES).index(task), ("train", "val", "test").index(split)])
    out = rgm.generate(rng, 20 * n if distinct else n, split=split, datasets=[dataset], configs={dataset: settings},
                       instruction=INSTRUCTION)
    if distinct:
        out = list({r["prompt"]: r for r in out}.values())[:n]
    return [{**r, "id": f"{task}/{r['id']}"} for r in out]


def main(_):
    unknown = sorted(set(FLAGS.tasks) - set(CANDIDATES))
    if unknown:
        raise app.UsageError(f"--tasks: unknown {unknown}; known: {sorted(CANDIDATES)}")
    os.makedirs(FLAGS.workdir, exist_ok=True)
    eval_at = sorted({int(s) for s in FLAGS.eval_at})
    steps = eval_at[-1]
    mesh = make_mesh(dict(data=1, fsdp=-1, tensor=1))
    model_cfg, params, tokenizer = pretrained.load(
        ml_collections.ConfigDict(dict(kind="gguf", path="", num_layers=0)), mesh, param_dtype="float32")
    val = {t: records(t, "val", FLAGS.n, FLAGS.seed, distinct=True) for t in FLAGS.tasks}
    train = [r for t in FLAGS.tasks for r in records(t, "train", FLAGS.num_train, FLAGS.seed)]
    pool = VerifierPool(2, 5.0)
    results: dict[str, dict] = {t: {} for t in FLAGS.tasks}

    def score(step: int):
        t0 = time.perf_counter()
        for t in FLAGS.tasks:
            r = evaluation.evaluate(params, model_cfg, tokenizer, val[t], pool, batch_size=32, max_prompt_len=128,
                                    max_new_tokens=FLAGS.max_new_tokens, rng=jax.random.key(0), thinking=False,
                                    mesh=mesh)
            results[t][str(step)] = {k: r[k] for k in ("pass@1", "n", "ci95", "mean_len")}
            print(f"step {step:4d}  {t:12s} {100 * r['pass@1']:5.1f}%  [{100 * r['ci95'][0]:.1f}, "
                  f"{100 * r['ci95'][1]:.1f}]  n={r['n']}", flush=True)
        print(f"  scored in {time.perf_counter() - t0:.0f} s", flush=True)
        with open(os.path.join(FLAGS.workdir, "tasks.json"), "w") as f:
            json.dump({"flags": {k: FLAGS[k].value for k in ("tasks", "n", "num_train", "batch_size", "seq_len",
                                                              "lr", "eval_at", "max_new_tokens", "seed")},
                       "results": results}, f, indent=1)

    if 0 in eval_at:
        score(0)
    o = ml_collections.ConfigDict(dict(optim.DEFAULTS))
    o.update(lr=FLAGS.lr, schedule="cosine", warmup_steps=max(1, steps // 10), weight_decay=0.0)
    tx, _ = optim.make_optimizer(o, steps)
    state = train_state.create(params, tx, jax.random.key(FLAGS.seed))
    step_fn = jax.jit(train_state.make_step(functools.partial(sft_loss, model_cfg=model_cfg), tx), donate_argnums=0)
    batches = iter(pipeline.sft_dataset(train, tokenizer, FLAGS.seq_len, FLAGS.batch_size, FLAGS.seed,
                                        thinking=False))
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        state, metrics = step_fn(state, shard_batch(mesh, next(batches)))
        if step % 10 == 0:
            print(f"sft step {step}: loss {float(metrics['loss']):.3f}  ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
        if step in eval_at:
            params = state.params
            score(step)
    pool.close()
    rows = [[t] + [f"{100 * results[t][str(s)]['pass@1']:.1f}" for s in eval_at] for t in FLAGS.tasks]
    print("\n| task | " + " | ".join(f"step {s}" for s in eval_at) + " |")
    print("|:--|" + "--:|" * len(eval_at))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    app.run(main)
