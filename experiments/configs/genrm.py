"""RLHF with Cascade 2's pairwise generative reward model (issue 19), at toy scale:

    sft        on "pref" (two-part chat requests; the teacher pads half its answers) and "judge_pref" (which of a
               pref pair is better, "Verdict: A|B"): the policy and, from the same checkpoint, the judge
    rlhf       GRPO on "pref" rewarded by the GenRM: the SFT checkpoint judges every pair of a group in both orders
               (log-probability verdicts), Cascade 2's aggregation with its conciseness bonus; KL 0.03 (the paper's
               RLHF row)

After every stage both domains are scored on held-out items: "pref" by the rule-based proxy judge (the ground
truth the GenRM never sees), "judge_pref" by the verdict's accuracy (the judge's own held-out pairwise accuracy;
its ids end in /A or /B, the chosen answer's position). The RLHF stage logs judge_s, judge_position_bias and
judge_inconsistent per step.

    python experiments/run.py --config=genrm
    python experiments/run.py --config=genrm:tiny      # seconds of each stage, for CI
    python experiments/run.py --config=genrm:judge_branch   # [ours] the judge trained 300 more steps on judge_pref
"""
import ml_collections

from _common import grpo_stage, multi_base, variants
from nemocascade.stages import common, sft

# compound: two-part requests (2,160 of them; a quarter held out at test_every=4), so test scores n >= 500 distinct
# requests; judge_pref judges pairs of the same requests
OPTS = dict(compound=True, test_every=4)
DOMAINS = {"pref": dict(teacher_error_rate=0.5, **OPTS), "judge_pref": dict(teacher_error_rate=0.0, **OPTS)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    tags = variants("genrm", arg, ("tiny", "judge_branch"))
    c = multi_base("genrm", DOMAINS)
    c.variant = arg
    c.tokenizer.update(vocab_size=768, corpus_size=2000)
    for d in DOMAINS:
        c.data.domains[d].num_test = 4000  # ~540 distinct test requests exist; 4000 records reach 500 of them
    c.eval.update(max_prompt_len=256, max_new_tokens=64)
    c.stages.sft = common.stage_config(
        "sft", sft.DEFAULTS, domains=list(DOMAINS), steps=400, batch_size=16, seq_len=288, pack=True,
        checkpoint_every=100, eval_every=200, eval_n=64,
        optim=dict(lr=3e-3, schedule="cosine", warmup_steps=40, weight_decay=0.01, min_lr_frac=0.05))
    c.stages.rlhf = grpo_stage(["pref"], 20, rollout=dict(prompts_per_step=8, group_size=8,
                                                          length_curriculum=((0, 64),)),
                               eval_every=10, filters=dict(dynamic=False),
                               reward=dict(source="judge", judge="stage:sft", mode="pairwise", conciseness_bonus=0.1,
                                           judge_max_len=352, judge_batch_size=112))
    c.stage_order = ("sft", "rlhf")
    if "judge_branch" in tags:  # [ours] a judge trained further: 300 more steps on judge_pref alone, a side branch
        c.stages.judge_sft = common.stage_config(
            "sft", sft.DEFAULTS, domains=["judge_pref"], steps=300, batch_size=16, seq_len=288, pack=True,
            checkpoint_every=100, eval_every=0, handoff=dict(init_from="stage:sft", side_branch=True),
            optim=dict(lr=1e-3, schedule="cosine", warmup_steps=30, weight_decay=0.01, min_lr_frac=0.05))
        c.stages.rlhf.reward.judge = "stage:judge_sft"
        c.stage_order = ("sft", "judge_sft", "rlhf")
    if "tiny" in tags:
        c.model.update(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=192)
        c.tokenizer.update(vocab_size=512, corpus_size=400)
        for d in DOMAINS:
            c.data.domains[d].update(num_train=400, num_test=16)
        c.eval.update(n=8, val_n=8, batch_size=16, avg_k=2)
        c.stages.sft.update(steps=20, eval_every=0, checkpoint_every=20)
        c.stages.rlhf.update(steps=2, rollout=dict(prompts_per_step=2, group_size=3), eval_every=0, checkpoint_every=2,
                             reward=dict(judge_batch_size=12))
        if "judge_sft" in c.stages:
            c.stages.judge_sft.update(steps=10, checkpoint_every=10)
    return c
