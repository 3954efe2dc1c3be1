"""Pieces the experiment configs share (model, tokenizer, data, eval, a domain-wise GRPO stage), as big_vision's
configs/common.py. A config imports them with `from _common import ...` (`nemocascade.configs.load` puts this
folder on the import path; so does running a config file as a script)."""
import ml_collections

from nemocascade.stages import common, kinds

NUM_HELD_OUT = 2000  # test and validation records generated per domain; eval.n / val_n distinct ones are scored


def math_base(name: str) -> ml_collections.ConfigDict:
    """The pieces every math experiment shares (model, tokenizer, data, eval); stages are added on top."""
    c = ml_collections.ConfigDict()
    c.name = name
    c.seed = 0
    c.thinking = True
    c.mesh = dict(data=1, fsdp=-1, expert=1, tensor=1)
    # vocab_size comes from the trained tokenizer
    c.model = dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=384,
                   rope_theta=10_000.0, qk_norm=False, qkv_bias=False, tie_embeddings=True,
                   dtype="auto", param_dtype="float32", remat=False)  # auto: bfloat16 on TPU/GPU, float32 on CPU
    c.tokenizer = dict(path="", vocab_size=384, corpus_size=5000)
    c.data = ml_collections.ConfigDict()
    c.data.data_dir = ""
    c.data.seed = -1  # the records' draw: -1 = the run's seed; fixed, seeds vary training only (cascade.data_seed)
    c.data.domains = ml_collections.ConfigDict()
    # NUM_HELD_OUT: the generators repeat problems (math, seed 0: 384 distinct problem keys in 500 test records,
    # 1244 in 2000)
    c.data.domains.math = dict(num_train=20_000, num_test=NUM_HELD_OUT, opts=dict(teacher_error_rate=0.0))
    # n test items, val_n validation items per domain; avg@k on test: avg_k samples per item, after an RL stage on
    # its own domains at its temperature / top-p, after SFT on every domain at eval.temperature / top_p
    # (avg_k_domains "all": an RL stage's avg@k on every domain, not only its own; held_out.AVG_K_DOMAINS)
    c.eval = dict(n=500, val_n=200, batch_size=128, max_prompt_len=64, max_new_tokens=112, avg_k=4, temperature=1.0,
                  top_p=1.0, avg_k_domains="trained")
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
        c.data.domains[domain] = dict(num_train=20_000, num_test=NUM_HELD_OUT, opts=dict(opts))
    c.eval.update(n=500, max_prompt_len=96, max_new_tokens=112)
    return c


# METHOD.md "Paper defaults per stage" (Cascade 2 Tab. 8-10): what a GRPO stage training these domains sets on top
# of the shared base (no KL, refill up to 3 rounds). Math RL is not in Cascade 2's table (its math teacher is the SFT
# checkpoint): [ours] no overlong treatment there, as cascade_math has always run.
PAPER_STAGE = {  # part -> key -> value
    "if": dict(filters=dict(overlong="penalty")),  # IF-RL: a truncated rollout gets reward 0 and stays in the batch
    "mcq": dict(filters=dict(overlong="filter")), "json": dict(filters=dict(overlong="filter")),  # multi-domain
    "tool": dict(filters=dict(overlong="filter")),
    "pref": dict(filters=dict(overlong="filter"),
                 objective=dict(terms=dict(pg=1.0, kl=0.03, entropy=0.0))),  # RLHF: the one stage with KL
    "longctx": dict(filters=dict(overlong="filter")),
    "code": dict(filters=dict(overlong="filter"), rollout=dict(top_p=0.95)),
}
# Cascade 2's multi-domain RL mix: ~55% STEM multiple choice, 30% tool calling, 15% structured output
MULTI_DOMAIN_MIX = {"mcq": 0.55, "tool": 0.30, "json": 0.15}
KL_VARIANT = 0.05  # the `kl` variants' coefficient: KL to each stage's start, as every stage had before issue 14


def grpo_stage(domains, steps: int, kind: str = "grpo", **kw) -> ml_collections.ConfigDict:
    """A domain-wise GRPO stage with the paper's defaults for its domains (`PAPER_STAGE`, the multi-domain mix):
    16 x 8, dynamic filter with up to 3 sampling rounds to refill it, no KL, warm-up from 0.1x; `kw` overrides
    any key, a part's keys one by one (a departure a toy needs belongs in a named variant, e.g. `kl_variant`).
    `kind="agent"`: the same over multi-turn episodes (nemocascade/stages/agent.py)."""
    base = dict(checkpoint_every=20, eval_every=20, eval_n=64,
                rollout=dict(prompts_per_step=16, group_size=8, length_curriculum=((0, 112),)),
                filters=dict(dynamic=True, refill_rounds=3),
                objective=dict(terms=dict(pg=1.0, kl=0.0, entropy=0.0), kl_estimator="k3"),
                optim=dict(lr=2e-4, b1=0.9, b2=0.95, schedule="linear_warmup", warmup_steps=10, warmup_init=0.1,
                           grad_clip=1.0))
    mix = {d: w for d, w in MULTI_DOMAIN_MIX.items() if d in domains}
    if len(domains) > 1 and len(mix) == len(domains):
        base["rollout"]["mix"] = mix
    for part in (paper_settings(domains), kw):  # a part's keys update the part; other keys replace
        for k, v in part.items():
            base[k] = base[k] | dict(v) if k in common.PARTS and k in base else v
    return kinds.stage_config(kind, domains=list(domains), steps=steps, **base)


def paper_settings(domains) -> dict:
    """The `PAPER_STAGE` settings every one of `domains` shares (a stage over domains that the paper trains
    apart, e.g. a recovery arm over all of them, takes only what they agree on) -> {part: {key: value}}."""
    entries = [{(p, k): v for p, d in PAPER_STAGE.get(dom, {}).items() for k, v in d.items()} for dom in domains]
    out = {}
    for (p, k), v in entries[0].items():
        if all(e.get((p, k), object()) == v for e in entries):
            out.setdefault(p, {})[k] = v
    return out


def variants(config: str, arg: str | None, known: tuple[str, ...]) -> set[str]:
    """The comma-separated variant tags of `arg` (`"tiny,kl"` -> {"tiny", "kl"}); an unknown tag is an error
    naming the known ones."""
    tags = {t for t in (arg or "").split(",") if t}
    unknown = sorted(tags - set(known))
    if unknown:
        raise ValueError(f"{config}: unknown variant {','.join(unknown)!r}; known: {', '.join(known)} "
                         "(combine with commas, e.g. tiny,kl)")
    return tags


def kl_variant(c: ml_collections.ConfigDict, coef: float = KL_VARIANT) -> None:
    """The named `kl` departure: KL `coef` to its start in every GRPO stage that the paper runs without KL (RLHF
    keeps its 0.03). A tiny model may need it for stability; it also damps forgetting, so regression tables from
    it are not the paper's."""
    for stage in c.stages.values():
        if stage.kind in ("grpo", "agent") and stage.objective.terms.get("kl", 0.0) == 0.0:
            stage.objective.terms.kl = coef
