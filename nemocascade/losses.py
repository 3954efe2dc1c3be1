"""Pure, jittable loss functions for SFT, GRPO, MOPD and reward models (METHOD.md).

Shapes: ``B``/``N`` sequences (responses), ``T`` positions, ``V`` vocabulary. Every ``mask`` is 1 on the
tokens that count (response tokens, not prompt or padding) and 0 elsewhere; any numeric or bool dtype.
All reductions run in float32 whatever the dtype of the logits. Shapes, ranks and integer dtypes are asserted at
each function's boundary with chex (at trace time under jit; a failure is an AssertionError naming the argument);
a bad option (an unknown estimator, a band, a coefficient) is a ValueError.

Contents:
  token_cross_entropy   SFT next-token loss.
  token_logprobs        log pi(y_t) of the sampled tokens; token_entropy.
  group_advantages      GRPO group-normalised advantages (C1/C2 Eq. 1).
  kl_penalty            per-token k1/k2/k3 KL estimators (Schulman 2020).
  loss_normalizer       the denominator of the one reduction, on the global batch (micro-batch-exact).
  aggregate_sum         the one reduction (token_mean / seq_mean_token_mean / constant), over loss_normalizer.
  mopd_token_loss       multi-domain on-policy distillation's per-token loss (C2 section 4.4).
  forward_kl / reverse_kl / generalized_jsd   full-distribution distillation losses (GKD), per token.
  bradley_terry_loss    pairwise reward-model loss (RLHF, C1 scalar RM).
The objective terms (objectives.py) combine these: GRPO is the `pg` term (+ `kl`), MOPD the `mopd` term.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import optax

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "constant")
KL_ESTIMATORS = ("k1", "k2", "k3")

# The IS band is inclusive. exp(log r) in float32 can land an ulp or two off 0.5 / 2.0 on some backends,
# so the edges get a relative slack far below any ratio that matters.
_BAND_RTOL = 1e-6


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def _check_same_shape(ref_name, ref, **others):
    for name, x in others.items():
        if x is not None:
            chex.assert_equal_shape([ref, x], custom_message=f"{name} must have the shape of {ref_name}")


def _check_logits_and_ids(logits, ids, ids_name):
    """logits [B, T, V] and integer ids [B, T]."""
    chex.assert_rank(logits, 3, custom_message="logits must be [B, T, V]")
    chex.assert_type(ids, int, custom_message=f"{ids_name} must be integer token ids")
    chex.assert_equal_shape_prefix([logits, ids], 2, custom_message=f"logits' leading dims must equal {ids_name}'s")


def _masked_mean(x, mask):
    """sum(mask * x) / max(sum(mask), 1): 0 when nothing is valid, never NaN."""
    mask = _f32(mask)
    return jnp.sum(mask * x) / jnp.maximum(jnp.sum(mask), 1.0)


# ----------------------------------------------------------------------------------------------- SFT


def token_cross_entropy(logits, targets, mask):
    """Masked token-mean cross entropy for SFT.

    ``loss = sum_{b,t} m_{b,t} * nll_{b,t} / max(sum m, 1)`` with ``nll = -log softmax(logits)[target]``.

    Args: logits [B,T,V]; targets int [B,T]; mask [B,T].
    Returns: (loss, metrics) with metrics ``nll`` (= loss), ``tokens`` (sum of mask) and ``accuracy``
    (masked mean of ``argmax(logits) == target``).
    """
    _check_same_shape("targets", targets, mask=mask)
    _check_logits_and_ids(logits, targets, "targets")
    nll = optax.softmax_cross_entropy_with_integer_labels(_f32(logits), targets)
    loss = _masked_mean(nll, mask)
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    metrics = {"nll": loss, "tokens": jnp.sum(_f32(mask)), "accuracy": _masked_mean(correct, mask)}
    return loss, metrics


# --------------------------------------------------------------------------------- per-token stats


def token_logprobs(logits, tokens):
    """``log softmax(logits)[b, t, tokens[b, t]]`` in float32. logits [B,T,V], tokens int [B,T] -> [B,T]."""
    _check_logits_and_ids(logits, tokens, "tokens")
    logp = jax.nn.log_softmax(_f32(logits), axis=-1)
    return jnp.take_along_axis(logp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def token_entropy(logits):
    """Entropy of softmax(logits) at each position: ``H = -sum_v p_v log p_v``. [B,T,V] -> [B,T].

    Tokens masked with ``-inf`` logits have p = 0 and contribute 0 (not NaN), also in the gradient.
    """
    logp = jax.nn.log_softmax(_f32(logits), axis=-1)
    p = jnp.exp(logp)
    safe_logp = jnp.where(p > 0, logp, 0.0)  # avoid 0 * -inf in the value and in the gradient
    return -jnp.sum(p * safe_logp, axis=-1)


# ---------------------------------------------------------------------------------------------- GRPO


def group_advantages(rewards, eps=1e-6):
    """GRPO advantage (C1/C2 Eq. 1): ``A_{p,i} = (r_{p,i} - mean_i r_p) / (std_i r_p + eps)``.

    rewards [P, G] (P prompts, G rollouts each); population std (ddof=0). A group whose rewards are all
    equal gets advantage 0 for every rollout. Returns float32 [P, G].
    """
    chex.assert_rank(rewards, 2, custom_message="rewards must be [num_prompts, group_size]")
    r = _f32(rewards)
    mean = jnp.mean(r, axis=-1, keepdims=True)
    std = jnp.std(r, axis=-1, keepdims=True)
    return (r - mean) / (std + eps)


def kl_penalty(logp, ref_logp, estimator="k3"):
    """Per-token estimators of KL(pi || pi_ref) from sampled-token log-probs (Schulman, "Approximating KL").

    With ``d = ref_logp - logp`` (y ~ pi):
      k1 = -d = logp - ref_logp           (unbiased, can be negative)
      k2 = 0.5 * d^2                      (biased, low variance)
      k3 = exp(d) - d - 1                 (unbiased, always >= 0; our default, METHOD.md [ours])
    Gradients flow through ``logp`` only; ``ref_logp`` is a frozen reference.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator={estimator!r} is unknown; expected one of {KL_ESTIMATORS}")
    _check_same_shape("logp", logp, ref_logp=ref_logp)
    d = jax.lax.stop_gradient(_f32(ref_logp)) - _f32(logp)
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    return jnp.exp(d) - d - 1.0


def loss_normalizer(mask, aggregation="token_mean"):
    """The denominator an objective's sums are divided by, computed on a (global) mask [N, T].

    token_mean: ``sum(mask)``; seq_mean_token_mean: number of responses with >= 1 valid token;
    constant: ``N * T``. Floored at 1 so an empty batch gives loss 0, not NaN. Compute it once on the whole
    batch and pass it as ``normalizer=`` to every micro-batch: the micro-batch losses and gradients then
    sum to the full-batch ones exactly (METHOD.md: normalise over the global batch).
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation={aggregation!r} is unknown; expected one of {AGGREGATIONS}")
    mask = _f32(mask)
    if aggregation == "token_mean":
        count = jnp.sum(mask)
    elif aggregation == "seq_mean_token_mean":
        count = jnp.sum(jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)
    else:
        count = jnp.float32(mask.shape[0] * mask.shape[1])
    return jnp.maximum(count, 1.0)


def aggregate_sum(per_token, mask, aggregation):
    """The numerator matching ``loss_normalizer``: the reduced loss is ``aggregate_sum(...) / normalizer``.

    The one reduction every objective term goes through (nemocascade/objectives.py)."""
    mask = _f32(mask)
    if aggregation == "seq_mean_token_mean":
        n_tok = jnp.sum(mask, axis=-1)
        # Empty responses give 0 and are not counted by loss_normalizer either.
        return jnp.sum(jnp.sum(mask * per_token, axis=-1) / jnp.maximum(n_tok, 1.0))
    return jnp.sum(mask * per_token)  # token_mean and constant differ only in the normalizer


# ---------------------------------------------------------------------------------------------- MOPD


def mopd_token_loss(logp_train, logp_teacher, logp_sampler, is_low=0.5, is_high=2.0):
    """Multi-domain on-policy distillation's per-token loss (C2 section 4.4, METHOD.md "MOPD").

    Per sampled token y_t ~ pi_inf (only the sampled token, not the vocabulary):
      a_t   = sg[log pi_teacher(y_t) - log pi_train(y_t)]                      (token advantage)
      r_t   = exp(sg[log pi_train(y_t)] - log pi_inf(y_t))                     (train/sampler mismatch)
      w_t   = sg[r_t] * 1[is_low <= r_t <= is_high]       (outside the band: weight 0, NOT clipped)
      l_t   = -w_t a_t log pi_train(y_t)
    reduced by seq_mean_token_mean (`aggregate_sum`): the mean over responses with a valid token of each one's
    token mean. Returns ``(l, w, in_band)``, all [N, T] (w and the band indicator, float, for logging)."""
    if not 0 < is_low <= 1 <= is_high:
        raise ValueError(f"is_low={is_low}, is_high={is_high}: need 0 < is_low <= 1 <= is_high")
    chex.assert_rank(logp_train, 2, custom_message="logp_train must be [N, T]")
    _check_same_shape("logp_train", logp_train, logp_teacher=logp_teacher, logp_sampler=logp_sampler)
    logp_train = _f32(logp_train)
    sg_train = jax.lax.stop_gradient(logp_train)
    adv = jax.lax.stop_gradient(_f32(logp_teacher)) - sg_train
    ratio = jnp.exp(sg_train - jax.lax.stop_gradient(_f32(logp_sampler)))
    in_band = (ratio >= is_low * (1 - _BAND_RTOL)) & (ratio <= is_high * (1 + _BAND_RTOL))
    weight = jnp.where(in_band, ratio, 0.0)
    return -weight * adv * logp_train, weight, in_band.astype(jnp.float32)


# ------------------------------------------------------------- full-distribution distillation (GKD)


def forward_kl(student_logits, teacher_logits):
    """Per-token forward KL(teacher || student) = sum_v p_T (log p_T - log p_S). [N,T,V] x2 -> [N,T].

    Mode-covering (classic KD). Teacher is treated as a constant. Reduce with a masked mean.
    """
    _check_same_shape("student_logits", student_logits, teacher_logits=teacher_logits)
    log_s = jax.nn.log_softmax(_f32(student_logits), axis=-1)
    log_t = jax.nn.log_softmax(jax.lax.stop_gradient(_f32(teacher_logits)), axis=-1)
    p_t = jnp.exp(log_t)
    return jnp.sum(jnp.where(p_t > 0, p_t * (log_t - log_s), 0.0), axis=-1)


def reverse_kl(student_logits, teacher_logits):
    """Per-token reverse KL(student || teacher) = sum_v p_S (log p_S - log p_T). [N,T,V] x2 -> [N,T].

    Mode-seeking; the full-vocabulary counterpart of MOPD's sampled-token objective.
    """
    _check_same_shape("student_logits", student_logits, teacher_logits=teacher_logits)
    log_s = jax.nn.log_softmax(_f32(student_logits), axis=-1)
    log_t = jax.nn.log_softmax(jax.lax.stop_gradient(_f32(teacher_logits)), axis=-1)
    p_s = jnp.exp(log_s)
    return jnp.sum(jnp.where(p_s > 0, p_s * (log_s - log_t), 0.0), axis=-1)


def generalized_jsd(student_logits, teacher_logits, beta=0.5):
    """Per-token generalised Jensen-Shannon divergence (GKD, Agarwal et al. 2023, Eq. for JSD(beta)).

    ``M = beta * p_T + (1 - beta) * p_S``;  ``JSD_beta = beta * KL(p_T || M) + (1 - beta) * KL(p_S || M)``.
    beta = 0.5 is the symmetric JSD. beta must lie strictly in (0, 1): at the end points it is
    identically 0, use ``forward_kl`` / ``reverse_kl`` instead. [N,T,V] x2 -> [N,T].
    """
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta={beta} must lie in (0, 1); use forward_kl / reverse_kl for the end points")
    _check_same_shape("student_logits", student_logits, teacher_logits=teacher_logits)
    log_s = jax.nn.log_softmax(_f32(student_logits), axis=-1)
    log_t = jax.nn.log_softmax(jax.lax.stop_gradient(_f32(teacher_logits)), axis=-1)
    log_m = jnp.logaddexp(log_t + jnp.log(beta), log_s + jnp.log1p(-beta))

    def kl_to_m(log_p):
        p = jnp.exp(log_p)
        return jnp.sum(jnp.where(p > 0, p * (log_p - log_m), 0.0), axis=-1)

    return beta * kl_to_m(log_t) + (1.0 - beta) * kl_to_m(log_s)


# ------------------------------------------------------------------------------------ reward model


def bradley_terry_loss(r_chosen, r_rejected, margin=0.0):
    """Bradley-Terry reward-model loss (C1's scalar RM; Ouyang et al. 2022 Eq. 1).

    ``Pr(chosen > rejected) = sigmoid(r_c - r_r)``;  ``L = mean_i -log sigmoid(r_c,i - r_r,i - margin)``,
    computed as ``softplus(-(r_c - r_r - margin))`` (stable for any score gap). ``margin`` >= 0 asks for a
    gap of at least ``margin`` (Llama 2's margin loss); 0 is the plain BT loss.

    Args: r_chosen, r_rejected [N]. Returns (loss, metrics): ``accuracy`` = mean(r_c > r_r) (a tie counts
    as wrong), ``reward_gap`` = mean(r_c - r_r), ``reward_mean`` = mean over both.
    """
    chex.assert_rank(r_chosen, 1, custom_message="r_chosen must be [N]")
    _check_same_shape("r_chosen", r_chosen, r_rejected=r_rejected)
    gap = _f32(r_chosen) - _f32(r_rejected)
    loss = jnp.mean(jax.nn.softplus(-(gap - margin)))
    metrics = {"accuracy": jnp.mean((gap > 0).astype(jnp.float32)), "reward_gap": jnp.mean(gap),
               "reward_mean": 0.5 * (jnp.mean(_f32(r_chosen)) + jnp.mean(_f32(r_rejected)))}
    return loss, metrics
