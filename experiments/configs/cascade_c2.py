"""Nemotron-Cascade 2's stage order at small scale (METHOD.md "Stage order"):

    SFT -> IF-RL -> multi-domain RL (mcq + json + tool) -> MOPD -> RLHF -> long-context RL -> code RL
        -> SWE RL (agentless, then execution-based agentic: multi-turn episodes, nemocascade/stages/agent.py)

plus what it needs off the main line: `rlhf_branch` (RLHF from the SFT checkpoint as a side branch: Cascade 2's RLHF
teacher). As in Cascade 2 the judges are language models: the SFT also trains on `judge_pref` and `judge_longctx`,
and that checkpoint judges RLHF (pairwise GenRM, both orders) and long-context RL (answer against the reference);
Cascade 1 keeps its Bradley-Terry RM (`rm`, from `base`). MOPD's three teachers, as the paper: math <- the SFT
checkpoint, pref (chat) <- the RLHF side branch, if / mcq / json / tool <- one multi-domain teacher, the checkpoint
with the best validation mean over the four (`best:if+mcq+json+tool`). Every domain is evaluated after every stage.
Paper defaults per stage (METHOD.md's table, `_common.PAPER_STAGE`); `:kl` is the named departure with KL 0.05 in
every RL stage but RLHF's 0.03.

    python experiments/run.py --config=cascade_c2          # 45 min measured at n=64 evals with the BT RM (before
                                                           # the judges); n=500 and the judges add (unmeasured)
    python experiments/run.py --config=cascade_c2:tiny     # minutes; the same stages with a few steps each
    python experiments/run.py --config=cascade_c2:kl
"""
import ml_collections

from _common import grpo_stage, kl_variant, multi_base, variants
from nemocascade.stages import common, mopd, rm, sft

# domain -> imperfect-teacher options (a systematic slip on a share of problems: headroom for each RL stage)
DOMAINS = {
    "math": dict(teacher_error_rate=0.6), "if": dict(teacher_error_rate=0.5), "mcq": dict(teacher_error_rate=0.5),
    "json": dict(teacher_error_rate=0.5), "tool": dict(teacher_error_rate=0.5), "pref": dict(teacher_error_rate=0.5),
    "longctx": dict(teacher_error_rate=0.5, num_facts=8), "code": dict(teacher_error_rate=0.5),
    "swe": dict(teacher_error_rate=0.5),
}
LONG = dict(max_prompt_len=224)  # long-context and SWE prompts (measured: ~130-210 tokens at vocab 1024)
# Every RL stage: 8 prompts x 8 rollouts, 16-24 steps (cascade_math and cascade_demo use 16 x 8). Measured on 2 CPU
# cores: 3-8 s a step, 1-2.5 min a stage plus ~1 min evaluating all domains; the SFT's 700 packed steps take 15 min.
RL = dict(rollout=dict(prompts_per_step=8), eval_every=8)
LONG_RL = dict(rollout=dict(prompts_per_step=8, **LONG), eval_every=8)


def base(name: str, arg: str | None) -> ml_collections.ConfigDict:
    """Model, data and the stages both Cascade orders share; each config sets `stage_order`."""
    tags = variants(name, arg, ("tiny", "kl"))
    c = multi_base(name, DOMAINS)
    c.variant = arg
    c.model.update(d_model=160, n_layers=4, n_heads=5, n_kv_heads=1, head_dim=32, d_ff=480)
    c.tokenizer.update(vocab_size=1536, corpus_size=2000)
    c.data.domains.longctx.update(LONG)
    c.data.domains.swe.update(LONG)
    c.reward.timeout_s = 8.0  # above the sandbox's own wall limit (swe_exec runs tests for up to 5 s)
    # Packed rows (examples average ~100 tokens, longest 219): 16 rows of 224 carry ~30 examples a step at a
    # third of the cost of 32 padded rows of 288 (measured 1.2 s vs 3.8 s a step on 2 CPU cores).
    c.stages.sft = common.stage_config(
        "sft", sft.DEFAULTS, domains=list(DOMAINS), steps=700, batch_size=16, seq_len=224, pack=True,
        checkpoint_every=100, eval_every=350, eval_n=32,
        optim=dict(lr=3e-3, schedule="cosine", warmup_steps=70, weight_decay=0.01, min_lr_frac=0.05))
    c.stages.rm = common.stage_config("rm", rm.DEFAULTS, domains=["pref"], steps=100, batch_size=32, seq_len=96,
                                      checkpoint_every=50, optim=dict(lr=1e-3, warmup_steps=10, schedule="cosine"))
    rlhf = dict(reward=dict(source="reward_model", model="rm", mode="pairwise", conciseness_bonus=0.1),
                filters=dict(dynamic=False))  # KL 0.03
    c.stages.rlhf = grpo_stage(["pref"], 20, **RL, **rlhf)
    c.stages.if_rl = grpo_stage(["if"], 24, **RL)
    c.stages.code_rl = grpo_stage(["code"], 24, **RL)
    c.stages.longctx_rl = grpo_stage(["longctx"], 16, **LONG_RL)
    c.stages.swe_agentless = grpo_stage(["swe"], 16, filters=dict(max_reward_below=0.5), **LONG_RL)
    c.stages.swe_exec = grpo_stage(["swe"], 16, reward=dict(verifiers={"swe": "swe_exec"}), **LONG_RL)
    if "tiny" not in tags:  # the real benchmarks, by name, after every stage (a tiny model scores ~0: a floor);
        # n=0: every item whose prompt fits in max_prompt_len
        c.eval.sets = {name: dict(n=0, max_prompt_len=1024, max_new_tokens=64) for name in ("humaneval", "ifbench")}
    else:
        c.model.update(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=384)
        c.tokenizer.update(vocab_size=1024, corpus_size=400)
        for d in DOMAINS:
            c.data.domains[d].update(num_train=400, num_test=16)
        c.eval.update(n=8, batch_size=16)
        c.stages.sft.update(steps=60, eval_every=0, checkpoint_every=60)
        c.stages.rm.update(steps=10, checkpoint_every=10, eval_pairs=32)
    return c


def shrink(c: ml_collections.ConfigDict) -> None:
    """tiny: every RL / distillation stage takes 2 steps of 4 x 2 rollouts."""
    for name, stage in c.stages.items():
        if stage.kind in ("grpo", "agent", "mopd"):
            stage.update(steps=2, rollout=dict(prompts_per_step=4, group_size=2), eval_every=0, checkpoint_every=2)
            if stage.kind != "mopd":
                stage.rollout.length_curriculum = ((0, 48),)
            else:
                stage.rollout.max_new_tokens = 48


# Cascade 2's judges are language models: the SFT also learns to judge (which of a pref pair is better; does a
# longctx response give the reference answer), and that checkpoint judges RLHF (pairwise GenRM) and long-context RL
JUDGES = {"judge_pref": dict(teacher_error_rate=0.0), "judge_longctx": dict(teacher_error_rate=0.0, num_facts=8)}
JUDGE = dict(source="judge", judge="stage:sft", judge_max_len=352, judge_batch_size=128)  # stages' `reward` keys


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = base("cascade_c2", arg)
    for d, opts in JUDGES.items():
        c.data.domains[d] = dict(num_train=20_000, num_test=c.data.domains.math.num_test, opts=dict(opts))
    c.data.domains.judge_pref.max_prompt_len = 192  # a request and two answers
    c.data.domains.judge_longctx.max_prompt_len = 320  # the longctx context, the reference and a response
    c.stages.sft.domains = list(c.stages.sft.domains) + list(JUDGES)
    c.stages.rlhf.reward.update(model="", **JUDGE)  # pairwise GenRM (mode, conciseness bonus: base's)
    c.stages.longctx_rl.reward.update(mode="reference", **JUDGE)
    c.stages.rlhf_branch = ml_collections.ConfigDict(c.stages.rlhf.to_dict())
    c.stages.rlhf_branch.update(handoff=dict(init_from="stage:sft", side_branch=True))
    c.stages.multi_rl = grpo_stage(["mcq", "json", "tool"], 24, **RL)  # merged: short, cheap verifiers (METHOD.md)
    c.stages.mopd = common.stage_config(
        "mopd", mopd.DEFAULTS, domains=["math", "pref", "if", "mcq", "json", "tool"], steps=20,
        rollout=dict(prompts_per_step=12, group_size=4, max_new_tokens=112), checkpoint_every=10, eval_every=10,
        eval_n=32, objective=dict(teachers={"math": "stage:sft", "pref": "stage:rlhf_branch",
                                            **{d: "best:if+mcq+json+tool" for d in ("if", "mcq", "json", "tool")}}),
        optim=dict(lr=2e-4, b1=0.9, b2=0.95, schedule="linear_warmup", warmup_steps=10, warmup_init=0.1,
                   grad_clip=1.0))
    # C2's last stage, execution-based agentic SWE RL: up to 3 turns of 112 tokens in the swe_repair environment
    # (it runs the tests on the patch and answers with the failing one), 448 tokens per episode in all
    c.stages.swe_exec = grpo_stage(["swe"], 16, kind="agent", episodes=dict(max_turns=3, max_total_tokens=448,
                                                                           max_obs_tokens=160), **LONG_RL)
    c.stage_order = ("sft", "rlhf_branch", "if_rl", "multi_rl", "mopd", "rlhf", "longctx_rl", "code_rl",
                     "swe_agentless", "swe_exec")
    if "tiny" in variants("cascade_c2", arg, ("tiny", "kl")):
        for d in JUDGES:
            c.data.domains[d].update(num_train=400, num_test=16)
    finish(c, arg)
    return c


def finish(c: ml_collections.ConfigDict, arg: str | None) -> None:
    """The variants that act on the whole stage list: `kl` (every RL stage), `tiny` (every RL stage shrunk)."""
    tags = variants(c.name, arg, ("tiny", "kl"))
    if "kl" in tags:
        kl_variant(c)
    if "tiny" in tags:
        shrink(c)
