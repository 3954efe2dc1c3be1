"""GRPO stage kind exactly as Cascade RL uses it (METHOD.md "GRPO as used in every RL stage"), RLHF included.

A configuration of the one on-policy loop (stages/onpolicy.py): the objective

    pg       -sum_{i,t} m A_i log pi(y_it) / normaliser   (token mean over the *global* batch, DAPO)
    kl       sum m * KL_k{1,2,3}(pi || pi_ref) / normaliser  (frozen reference = the stage's start)
    entropy  -sum m * H(pi) / normaliser                     (a bonus; 0 in Cascade RL)

with rewards from each prompt's domain verifier, or (RLHF) from the reward model an earlier `rm` stage
trained (`reward.model`, `reward.mode`). A `rollout.length_curriculum` grows the response budget in sub-stages.
"""
from __future__ import annotations

from nemocascade.stages import common, onpolicy

DEFAULTS = onpolicy.DEFAULTS | dict(rollout=onpolicy.DEFAULTS["rollout"] | dict(length_curriculum=((0, 96),)))

KIND = common.StageKind("grpo", DEFAULTS, onpolicy.run, onpolicy.check, teacher_refs=onpolicy.teacher_refs)
