"""MOPD stage kind: Multi-domain On-Policy Distillation (Cascade 2 section 4.4, METHOD.md "MOPD").

A configuration of the one on-policy loop (stages/onpolicy.py). Each prompt's domain picks its teacher
(`objective.teachers`: domain -> checkpoint, default `best:<domain>`, the strongest held-out checkpoint of that domain
so far; nemocascade/named_checkpoints.py), and the objective is the `mopd` term: per sampled token the advantage
a_t = sg[log pi_teacher - log pi_train], the truncated importance weight w_t = sg[pi_train / pi_inf] inside
[is_low, is_high] (0 outside), loss -mean_responses[(1/|V|) sum_t w_t a_t log pi_train]: the per-response
token mean is `objective.aggregation="seq_mean_token_mean"`. No outcome reward, no group baseline; the configs warm the
learning rate up linearly from 0.1x (METHOD.md: early grad norms are large). Logged: reverse KL
mean(log pi_train - log pi_teacher) overall and per domain (it should fall toward 0), the IS-weight
statistics, and the rollouts' verifier reward, for monitoring only.

The full-distribution alternatives of METHOD.md (GKD family) are other terms: `objective.terms=dict(forward_kl=1)`,
`reverse_kl`, `gjsd` (beta = `objective.gjsd_beta`), over the vocabulary or the teacher's top
`objective.distill_topk` tokens.
Every teacher is a params pytree on the student's mesh, scored in its own jitted pass over the whole batch;
each row keeps its own teacher's values (K teachers: K forward passes, the price of static shapes).
"""
from __future__ import annotations

from nemocascade.stages import common, onpolicy

DEFAULTS = onpolicy.DEFAULTS | dict(
    rollout=onpolicy.DEFAULTS["rollout"] | dict(group_size=4),
    objective=onpolicy.DEFAULTS["objective"] | dict(terms=dict(mopd=1.0, forward_kl=0.0, reverse_kl=0.0, gjsd=0.0),
                                                    aggregation="seq_mean_token_mean"),
)

KIND = common.StageKind("mopd", DEFAULTS, onpolicy.run, onpolicy.check, teacher_refs=onpolicy.teacher_refs)
