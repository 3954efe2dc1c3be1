"""Nemotron-Cascade 1's stage order at small scale (METHOD.md "Stage order"):

    SFT -> RLHF -> IF-RL -> math RL -> code RL -> SWE RL (agentless, then execution-based)

with `rm` (the Bradley-Terry reward model RLHF is scored by, trained from the SFT policy) ahead of RLHF.
Model, data, evaluation (HumanEval and IFBench included) and shared stages are cascade_c2's (`base`), so the two
orders are compared like for like. Cascade 1's one big regression was RLHF costing instruction following,
repaired by IF-RL.

    python experiments/run.py --config=cascade_c1          # 27 min measured at n=64 evals; n=500 adds (unmeasured)
    python experiments/run.py --config=cascade_c1:tiny
    python experiments/run.py --config=cascade_c1:kl       # the named departure: KL 0.05 in every RL stage but RLHF
"""
import importlib.util
import os

import ml_collections

from _common import grpo_stage

_spec = importlib.util.spec_from_file_location("cascade_c2_config", os.path.join(os.path.dirname(__file__),
                                                                                 "cascade_c2.py"))
c2 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(c2)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = c2.base("cascade_c1", arg)
    c.stages.rlhf.reward.update(mode="scalar", conciseness_bonus=0.0)  # C1: a scalar BT reward model
    # C1's epoch-level filter for math RL (METHOD.md): at 24 steps x 8 prompts of 20,000 no epoch ends, so it never
    # acts at this scale; a longer math_rl gets it as the paper ran it
    c.stages.math_rl = grpo_stage(["math"], 24, filters=dict(epoch=True), **c2.RL)
    c.stage_order = ("sft", "rm", "rlhf", "if_rl", "math_rl", "code_rl", "swe_agentless", "swe_exec")
    c2.finish(c, arg)
    return c
