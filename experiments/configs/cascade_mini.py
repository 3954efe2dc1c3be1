"""Cascade RL in miniature (issue: "cascade driver, MOPD, per-stage regression table"):

    SFT (math + if + code) -> IF-RL -> math RL -> code RL -> MOPD (teacher per domain: its best checkpoint)

with every domain evaluated after every stage (eval_table.md, plots/eval_by_stage.png), the question being
the one Cascade RL asks: does each RL stage raise its own domain, what does it cost the others, and does MOPD
pull the regressed domains back toward their teachers?

    python experiments/run.py --config=cascade_mini          # <= 30 minutes on 2 CPU cores
    python experiments/run.py --config=cascade_mini:tiny     # a few minutes (tests, notebooks)

Every domain's SFT teacher is imperfect (a systematic slip on a share of problems: a dropped carry, a
violated constraint, an off-by-one program), so each RL stage has headroom its verifier can find.
"""
import ml_collections

from _common import grpo_stage, multi_base
from nemocascade.stages import common, mopd, sft

DOMAINS = ("math", "if", "code")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = multi_base("cascade_mini", {"math": dict(teacher_error_rate=0.6), "if": dict(teacher_error_rate=0.5),
                                    "code": dict(teacher_error_rate=0.5)})
    c.variant = arg
    c.reward.timeout_s = 8.0  # above the code sandbox's own wall limit
    c.stages.sft = common.stage_config(
        "sft", sft.DEFAULTS, domains=list(DOMAINS), steps=900, batch_size=32, seq_len=160, checkpoint_every=100,
        eval_every=300, eval_n=64,
        optim=dict(lr=3e-3, schedule="cosine", warmup_steps=100, weight_decay=0.01, min_lr_frac=0.05))
    c.stages.if_rl = grpo_stage(["if"], 60)
    c.stages.math_rl = grpo_stage(["math"], 60)
    c.stages.code_rl = grpo_stage(["code"], 60)
    c.stages.mopd = common.stage_config(  # teachers: best held-out checkpoint per domain (METHOD.md "MOPD")
        "mopd", mopd.DEFAULTS, domains=list(DOMAINS), steps=40, prompts_per_step=24, group_size=4,
        max_new_tokens=112, checkpoint_every=20, eval_every=20, eval_n=64,
        teachers={d: f"best:{d}" for d in DOMAINS},  # listed, so `--config.stages.mopd.teachers.math=stage:sft` works
        optim=dict(lr=2e-4, b1=0.9, b2=0.95, schedule="linear_warmup", warmup_steps=10, warmup_init=0.1,
                   grad_clip=1.0))
    c.stage_order = ("sft", "if_rl", "math_rl", "code_rl", "mopd")
    if arg == "tiny":
        c.model.update(n_layers=2)
        for d in DOMAINS:
            c.data.domains[d].update(num_train=1500, num_test=48)
        c.data.domains.math.opts.update(max_digits=2, families={"add": 0.5, "sub": 0.5})
        c.tokenizer.update(vocab_size=640, corpus_size=1000)
        c.eval.update(n=32, batch_size=32)
        c.stages.sft.update(steps=150, eval_every=0, checkpoint_every=50)
        for name in ("if_rl", "math_rl", "code_rl"):
            c.stages[name].update(steps=3, prompts_per_step=4, group_size=4, eval_every=0,
                                  length_curriculum=((0, 64),))
        c.stages.mopd.update(steps=3, prompts_per_step=6, group_size=2, max_new_tokens=64, eval_every=0)
    elif arg not in (None, ""):
        raise ValueError(f"cascade_mini: unknown variant {arg!r}; known: tiny")
    return c
