"""Find and load experiment configs: `NAME[:VARIANT]` (a file in experiments/configs/) or `PATH[:VARIANT]`.

Configs follow big_vision: `get_config(arg)` returns an `ml_collections.ConfigDict`; the text after the
colon is `arg`. Used by `experiments/run.py`, tests and notebooks alike.
"""
from __future__ import annotations

import importlib.util
import os

import ml_collections

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "configs")


def known_configs() -> list[str]:
    return sorted(f[:-3] for f in os.listdir(CONFIG_DIR) if f.endswith(".py") and not f.startswith("_"))


def resolve(spec: str) -> tuple[str, str | None]:
    """`NAME[:VARIANT]` or `PATH[:VARIANT]` -> (path to the config file, variant or None)."""
    name, _, variant = spec.partition(":")
    path = name if (name.endswith(".py") or os.sep in name) else os.path.join(CONFIG_DIR, name + ".py")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no config {name!r} (looked for {path}); known: {known_configs()}")
    return path, (variant or None)


def stage_order(cfg) -> list[str]:
    """Stage names in run order. ConfigDict iterates its keys sorted, so the order is explicit data:
    `config.stage_order` (a tuple, or a comma-separated string from the command line)."""
    order = cfg.stage_order
    parts = [order] if isinstance(order, str) else list(order)  # `--config.stage_order=a,b` may arrive as ("a,b",)
    return [s.strip() for p in parts for s in str(p).split(",") if s.strip()]


def load(spec: str, **overrides):
    """The ConfigDict of `spec`, with dotted-key `overrides` applied (`{"stages.sft.steps": 5}`)."""
    path, variant = resolve(spec)
    module_spec = importlib.util.spec_from_file_location(f"nemocascade_config_{os.path.basename(path)[:-3]}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    cfg = module.get_config(variant)
    for key, value in overrides.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        if leaf not in node:
            raise KeyError(f"config has no key {key!r}")
        node[leaf] = value
    return cfg


# ---------------------------------------------------------------------------------------------------
# Shared pieces of the math experiments (sft_math, cascade_math), as big_vision's configs/common.py


def math_base(name: str) -> ml_collections.ConfigDict:
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
    c.stages = ml_collections.ConfigDict()  # name -> stage config; run order is c.stage_order
    c.stage_order = ()
    return c


def math_tiny(c: ml_collections.ConfigDict) -> None:
    """The `tiny` variant: 2-digit add/sub and a 0.44M-param model, so a whole run learns something in
    about two minutes on two CPU cores (tests, notebooks)."""
    c.model.update(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=384)
    c.data.domains.math.update(num_train=2000, num_test=64)
    c.data.domains.math.opts.update(max_digits=2, families={"add": 0.5, "sub": 0.5})
    c.eval.update(n=64, batch_size=64)


def multi_base(name: str, domains: dict[str, dict]) -> ml_collections.ConfigDict:
    """`math_base` for a multi-domain cascade: `domains` maps domain -> teacher/generator opts. A larger
    vocabulary (the tokenizer sees every domain's text) and longer SFT sequences than math alone."""
    c = math_base(name)
    c.tokenizer.update(vocab_size=1024, corpus_size=3000)
    c.data.domains = ml_collections.ConfigDict()
    for domain, opts in domains.items():
        c.data.domains[domain] = dict(num_train=20_000, num_test=300, opts=dict(opts))
    c.eval.update(n=128, max_prompt_len=96, max_new_tokens=112)
    return c


def grpo_stage(domains, steps: int, **kw) -> ml_collections.ConfigDict:
    """A domain-wise GRPO stage as cascade_math's (16 x 8, dynamic filter, KL 0.05 to the stage's start, warm-up
    from 0.1x); `kw` overrides any key."""
    from nemocascade.stages import common, grpo  # configs import stages, never the reverse

    base = dict(prompts_per_step=16, group_size=8, length_curriculum=((0, 112),), checkpoint_every=20,
                eval_every=20, eval_n=64, dynamic_filter=True, refill_rounds=1,
                objective=dict(pg=1.0, kl=0.05, entropy=0.0), kl_estimator="k3",
                optim=dict(lr=2e-4, b1=0.9, b2=0.95, schedule="linear_warmup", warmup_steps=10, warmup_init=0.1,
                           grad_clip=1.0))
    kw["optim"] = base["optim"] | dict(kw.get("optim", {}))  # override single optimiser keys, keep the rest
    return common.stage_config("grpo", grpo.DEFAULTS, domains=list(domains), steps=steps, **(base | kw))
