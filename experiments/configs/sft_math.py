"""SFT a small transformer from scratch on procedural math, then report held-out greedy pass@1.

    python experiments/run.py --config=sft_math --workdir=runs/sft_math
    python experiments/run.py --config=sft_math:tiny --workdir=runs/smoke     # ~2 minutes on 2 CPU cores
"""
import ml_collections

from nemocascade.stages import common, sft


def base_config(name: str) -> ml_collections.ConfigDict:
    """The pieces every math experiment shares (model, tokenizer, data, eval); stages are added on top."""
    c = ml_collections.ConfigDict()
    c.name = name
    c.seed = 0
    c.thinking = True
    c.mesh = dict(data=1, fsdp=-1, tensor=1)
    # vocab_size comes from the trained tokenizer
    c.model = dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=384,
                   rope_theta=10_000.0, qk_norm=False, qkv_bias=False, tie_embeddings=True,
                   dtype="float32", param_dtype="float32", remat=False)
    c.tokenizer = dict(path="", vocab_size=384, corpus_size=5000)
    c.data = ml_collections.ConfigDict()
    c.data.data_dir = ""
    c.data.domains = ml_collections.ConfigDict()
    c.data.domains.math = dict(num_train=20_000, num_test=500, opts=dict(teacher_error_rate=0.0))
    c.eval = dict(n=500, batch_size=128, max_prompt_len=64, max_new_tokens=112)
    c.reward = dict(num_workers=2, timeout_s=5.0)
    c.stages = ml_collections.ConfigDict()
    return c


def shrink_to_tiny(c: ml_collections.ConfigDict) -> None:
    """The `tiny` variant: whole run in about two minutes on two CPU cores (tests, notebooks)."""
    c.model.update(d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=32, d_ff=192)
    c.data.domains.math.update(num_train=2000, num_test=64)
    c.eval.update(n=64, batch_size=64)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = base_config("sft_math")
    c.variant = arg
    c.stages.sft = common.stage_config("sft", sft.DEFAULTS, domains=["math"], steps=1500, batch_size=32,
                                       seq_len=160, checkpoint_every=250, eval_every=250, eval_n=128,
                                       optim=dict(lr=3e-3, schedule="cosine", warmup_steps=100,
                                                  weight_decay=0.01, min_lr_frac=0.05))
    if arg == "tiny":
        shrink_to_tiny(c)
        c.stages.sft.update(steps=200, checkpoint_every=100, eval_every=100, eval_n=64)
    elif arg not in (None, ""):
        raise ValueError(f"sft_math: unknown variant {arg!r}; known: tiny")
    return c
