"""MOPD against GRPO from the same checkpoint, math only, equal steps (Cascade 2 section 4.4, Figure 3).

    sft (cascade_math's) -> grpo (cascade_math's: the strongest math checkpoint, MOPD's teacher)
    from stage:sft, side branches:   grpo_arm  (GRPO, verifiable reward)
                                     mopd_arm  (MOPD, teacher best:math)
Both arms start from the SFT checkpoint, take the same number of steps with the same prompts per step and
the same rollout budget per prompt, and are evaluated on the same held-out problems every few steps;
plots/mopd_vs_grpo.png draws both curves. The first two stages are exactly cascade_math's: a copy of a finished
cascade_math workdir (with "config" in its summary.json renamed) skips them as done.

    python experiments/run.py --config=mopd_vs_grpo
"""
import ml_collections

from nemocascade import configs
from nemocascade.stages import common, mopd


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = configs.load("cascade_math" + (f":{arg}" if arg else ""))
    c.name = "mopd_vs_grpo"
    steps, every = (40, 5) if arg != "tiny" else (4, 2)
    arm = dict(steps=steps, eval_every=every, eval_n=c.stages.grpo.eval_n, checkpoint_every=every,
               handoff=dict(init_from="stage:sft", side_branch=True))
    c.stages.grpo_arm = ml_collections.ConfigDict(c.stages.grpo.to_dict())
    r = c.stages.grpo.rollout
    c.stages.grpo_arm.update(arm, rollout=dict(length_curriculum=((0, r.length_curriculum[-1][1]),)))
    c.stages.mopd_arm = common.stage_config(
        "mopd", mopd.DEFAULTS, domains=["math"], rollout=dict(prompts_per_step=r.prompts_per_step,
                                                              group_size=r.group_size,
                                                              max_new_tokens=r.length_curriculum[-1][1]),
        objective=dict(teachers={"math": "best:math"}), optim=dict(c.stages.grpo.optim.to_dict()), **arm)
    c.stage_order = ("sft", "grpo", "grpo_arm", "mopd_arm")
    c.compare = dict(stages=("grpo_arm", "mopd_arm"), key="eval/math/pass@1", start_stage="sft", domain="math")
    return c
