"""Held-out evaluation of one domain: sample (greedy by default) on the test split, score with the
domain's reward in the verifier pool, report pass@1 (mean reward) and n."""
from __future__ import annotations

import dataclasses
import importlib

import jax
import numpy as np

from nemocascade import chat, sampling, stats
from nemocascade import mesh as mesh_lib
from nemocascade.data import domains, pipeline
from nemocascade.rl import episodes
from nemocascade.rewards.pool import OUTCOMES
from nemocascade.run_log import progress


def generate(params, model_cfg, tokenizer, records, *, batch_size, max_prompt_len, max_new_tokens,
             rng, thinking=True, greedy=True, temperature=1.0, top_p=1.0, num_samples=1, greedy_first=False,
             mesh=None, desc=None):
    """Completions (decoded text, think-prefix included in thinking mode) for `records`, in order,
    `num_samples` per record (adjacent; with `greedy_first` the first of them greedy, `sampling.sample`), and
    their lengths in generated tokens. Batches are padded to `batch_size` so one compiled sampler serves every
    batch. `desc`: show a progress bar over the batches."""
    texts, lengths = [], []
    starts = range(0, len(records), batch_size)
    for start in progress(starts, desc=desc) if desc else starts:
        chunk = records[start:start + batch_size]
        prompts = [r["prompt"] for r in chunk]
        prompts += [prompts[-1]] * (batch_size - len(chunk))
        toks, lens = pipeline.encode_prompts(tokenizer, prompts, max_prompt_len, thinking=thinking,
                                             bucket=sampling.PROMPT_BUCKET)
        toks, lens = mesh_lib.shard_batch(mesh, (toks, lens)) if mesh is not None else (toks, lens)
        out = sampling.sample(params, model_cfg, toks, lens,
                              jax.random.fold_in(rng, start), max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_id,
                              pad_id=tokenizer.pad_id, temperature=temperature, top_p=top_p,
                              greedy=greedy, num_samples=num_samples, greedy_first=greedy_first)
        n = len(chunk) * num_samples
        tokens, mask, lens = mesh_lib.to_host((out.tokens, out.mask, out.lengths))
        texts += chat.decode_responses(tokenizer, tokens[:n], mask[:n], thinking)
        lengths += lens[:n].tolist()
    return texts, lengths


def score_texts(pool, texts, records, rewards: dict | None = None) -> tuple[list[float], dict[str, int]]:
    """Each text scored by the reward of its record's domain (`rewards[domain]` if given, else the domain's
    registered reward), in the verifier pool; order kept. Also returns how many calls timed out, raised or
    crashed their worker (each scored 0.0), as metrics: {"verifier_timeouts", "verifier_errors",
    "verifier_crashes"}."""
    scores = [0.0] * len(texts)
    counts = {f"verifier_{k}": 0 for k in OUTCOMES}
    by_domain = {}
    for i, r in enumerate(records):
        by_domain.setdefault(r["domain"], []).append(i)
    for domain, idx in by_domain.items():
        fn = (rewards or {}).get(domain) or domains.verifier(domain)
        for i, s in zip(idx, pool.score(fn, [(texts[i], records[i]["answer"]) for i in idx])):
            scores[i] = s
        for k in OUTCOMES:
            counts[f"verifier_{k}"] += pool.last_stats[k]
    return scores, counts


def evaluate(params, model_cfg, tokenizer, records, pool, *, batch_size, max_prompt_len,
             max_new_tokens, rng, thinking=True, mesh=None, avg_k=0, temperature=1.0, top_p=1.0, desc=None):
    """Greedy pass@1 on `records` (each scored by its own domain's reward). Returns {"pass@1", "n", "ci95" (95%
    interval of the mean, `stats.mean_ci95`), "mean_len", "scores" (per record, in order: for paired comparisons)}
    and the verifier failure counts of `score_texts` (a score of 0 that a timeout or a verifier bug produced is
    then visible in summary.json, not only in the training metrics).

    With `avg_k` > 0 also avg@k: `avg_k` samples per record at `temperature` / `top_p`, each record's mean score,
    then their mean over records ("avg@k", "k", "avg@k_ci95": the interval over records, whose k-sample means are
    the independent units; "avg@k_scores": those means, in order). `desc`: progress bars named after it."""
    # with avg@k, each prompt is prefilled once for its greedy answer and its k samples (`greedy_first`): the
    # prefill is most of this evaluation's cost (short answers); batch_size // (k + 1) records a batch (>= 1)
    k = avg_k if avg_k > 0 and records else 0
    G = k + 1
    per_batch = max(1, batch_size // G)
    if mesh is not None and k:  # whole prompts per batch shard (the mesh's "batch" axes), as far as it allows
        shards = int(np.prod([mesh.shape[a] for a in mesh_lib.RULES["batch"]]))
        per_batch = per_batch - per_batch % shards if per_batch >= shards else per_batch
    texts, lengths = generate(params, model_cfg, tokenizer, records, batch_size=per_batch,
                              max_prompt_len=max_prompt_len, max_new_tokens=max_new_tokens, rng=rng,
                              thinking=thinking, greedy=k == 0, temperature=temperature, top_p=top_p,
                              num_samples=G, greedy_first=k > 0, mesh=mesh,
                              desc=desc and (f"{desc} greedy+avg@{k}" if k else desc))
    all_scores, counts = score_texts(pool, texts, [r for r in records for _ in range(G)])
    by_record = np.asarray(all_scores, np.float64).reshape(len(records), G)
    scores, lengths = by_record[:, 0], lengths[::G]
    out = {"pass@1": float(np.mean(scores)) if len(scores) else 0.0, "n": len(records),
           "ci95": stats.mean_ci95(scores), "mean_len": float(np.mean(lengths)) if lengths else 0.0,
           "scores": [float(s) for s in scores], **counts}
    return out | (_avg_at_k(by_record[:, 1:].mean(axis=1), k) if k else {})


def _avg_at_k(per_record, k: int) -> dict:
    """avg@k's summary keys from each record's mean over its k samples (the records are the independent units)."""
    return {"avg@k": float(np.mean(per_record)), "k": int(k), "avg@k_ci95": stats.mean_ci95(per_record),
            "avg@k_scores": [float(x) for x in per_record]}


def evaluate_episodes(params, model_cfg, tokenizer, records, env_names, settings, *, batch_size, rng, mesh=None,
                      desc=None, avg_k=0, temperature=1.0, top_p=1.0):
    """Multi-turn agents on `records` (greedy, `settings`: rl/episodes.Settings), each in its environment
    `env_names[i]`; the episode's reward is the score. Returns `evaluate`'s keys ("pass@1", "n", "ci95",
    "mean_len" = the model's tokens, "scores") and the agent's: "turns" (mean), "turns_frac" {k: share of episodes
    with k turns}, "tool_errors" (mean per episode), "done_rate" (the environment ended the episode).

    With `avg_k` > 0 also avg@k as `evaluate` gives it ("avg@k", "k", "avg@k_ci95", "avg@k_scores"): `avg_k`
    episodes per record sampled at `temperature` / `top_p` (the policy RL optimises, which greedy decoding hides),
    each record's mean reward, the interval over records."""
    def batches(per_batch, run_settings, G, key_offset, label):
        """(records in the batch, its trajectories: G episodes each) per batch of `per_batch` records."""
        starts = range(0, len(records), per_batch)
        for start in progress(starts, desc=label) if label else starts:
            chunk, names = records[start:start + per_batch], env_names[start:start + per_batch]
            pad = per_batch - len(chunk)  # one compiled shape: the last batch repeats its last record
            yield len(chunk), episodes.run_episodes(params, model_cfg, tokenizer, chunk + [chunk[-1]] * pad,
                                                    names + [names[-1]] * pad, run_settings,
                                                    jax.random.fold_in(rng, key_offset + start), mesh, num_samples=G)

    scores, model_tokens, turns, errors, done = [], [], [], [], []
    for n, traj in batches(batch_size, settings, 1, 0, desc):
        scores += traj.rewards[:n].tolist()
        model_tokens += traj.model_tokens[:n].tolist()
        turns += traj.turns[:n].tolist()
        errors += traj.tool_errors[:n].tolist()
        done += traj.done[:n].tolist()
    turns_arr = np.asarray(turns)
    out = {"pass@1": float(np.mean(scores)) if scores else 0.0, "n": len(records), "ci95": stats.mean_ci95(scores),
           "mean_len": float(np.mean(model_tokens)) if scores else 0.0, "scores": [float(s) for s in scores],
           "turns": float(turns_arr.mean()) if scores else 0.0,
           "turns_frac": {str(k): float((turns_arr == k).mean()) for k in range(1, settings.max_turns + 1)},
           "tool_errors": float(np.mean(errors)) if scores else 0.0,
           "done_rate": float(np.mean(done)) if scores else 0.0}
    if avg_k > 0 and records:  # keys past every greedy batch's
        sampled = dataclasses.replace(settings, greedy=False, temperature=temperature, top_p=top_p)
        per_record = []
        for n, traj in batches(max(1, batch_size // avg_k), sampled, avg_k, len(records),
                               desc and f"{desc} avg@{avg_k}"):
            per_record += traj.rewards[:n * avg_k].reshape(n, avg_k).mean(axis=1).tolist()
        out |= _avg_at_k(per_record, avg_k)
    return out


# Real evaluation sets any config can name in `config.eval.sets` (name -> settings), evaluated after every
# stage next to the run's own domains. Loaded lazily: "module:function" returning records whose `domain`
# picks the reward (HumanEval -> code sandbox, IFBench -> instruction checkers).
EVAL_SETS = {
    "ifbench": "nemocascade.data.ifbench:records",
    "humaneval": "nemocascade.data.humaneval:load",
}


def load_eval_set(name: str) -> list[dict]:
    if name not in EVAL_SETS:
        raise KeyError(f"unknown evaluation set {name!r}; known: {sorted(EVAL_SETS)}")
    module, fn = EVAL_SETS[name].split(":")
    return getattr(importlib.import_module(module), fn)()


def fitting(tokenizer, records, max_prompt_len: int, thinking: bool = True) -> list[dict]:
    """The records whose chat-rendered prompt fits in `max_prompt_len` tokens (real benchmark prompts can be
    far longer than a tiny run's context; the caller reports how many were left out)."""
    return [r for r in records
            if len(tokenizer.encode(chat.render_prompt(r["prompt"], thinking=thinking))) <= max_prompt_len]
