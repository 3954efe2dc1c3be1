"""A stage's loss: a weighted sum of named per-token terms, reduced once (METHOD.md "GRPO", "MOPD").

    L(theta) = sum_k  w_k(step) * aggregate_sum(l_k, mask) / normaliser

A term is a small pure function ``term(x, **options) -> (l [N, T], metrics {name: [N, T]})``: a per-token
loss and per-token diagnostics. ``x`` holds, [N, T] and aligned with the next-token targets unless noted:

  logp            log pi_theta(y_t) of the sampled tokens (differentiable)
  logits          the policy's logits [N, T, V] (differentiable), only for terms registered with
                  ``logits=True``: otherwise the step computes ``logp`` chunk by chunk and no [N, T, V] exists
  mask            1 on the tokens that count (response tokens)
  sampler_logp    log pi_inf(y_t) as the sampler drew y_t
  advantages      [N], group-normalised (needs "advantages": rollouts are scored by the stage's rewards)
  ref_logp        the frozen reference's log-probs of y_t (needs "ref_logp")
  teacher_logp    the row's teacher's log-probs of y_t (needs "teacher_logp")
  teacher_logits  the row's teacher's log-probabilities [N, T, K] over its top K tokens, or the whole
                  vocabulary (K = V) when the stage's ``distill_topk`` is None (needs "teacher_logits")
  teacher_support [N, T, K] token ids of those K (only with a distill_topk)

``needs`` tells the on-policy step what to compute before the update: a frozen role is scored only when a
term with non-zero weight reads it. ``options`` names the keys of the stage's ``objective`` dict a term reads
(``kl_estimator``; an experiment's term may add its own).

A stage's ``objective`` dict is read here; its keys and defaults are ``DEFAULTS``.

Every term's loss goes through the stage's one ``aggregation`` (losses.AGGREGATIONS) with a normaliser taken
on the *global* batch, so micro-batch gradients sum to the full-batch gradient for every term. Diagnostics
are token means over the global batch. A weight is a float (0 drops the term: no compute at all) or an
optax schedule over the stage's steps, ``{"schedule": "linear", "init_value": 0.0, "end_value": 0.05,
"transition_steps": 100}``.

A new term, from anywhere (an experiment file included)::

    @objectives.register("length", needs=())
    def length_penalty(x):
        return jnp.ones_like(x["logp"]), {}      # reduced with the stage's aggregation, like every term
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import optax

from nemocascade import losses
from nemocascade.errors import unknown_keys

INPUTS = ("advantages", "ref_logp", "teacher_logp", "teacher_logits")  # what a term may need scored first
SCHEDULES = {"constant": optax.constant_schedule, "linear": optax.linear_schedule,
             "cosine_decay": optax.cosine_decay_schedule, "warmup_cosine_decay": optax.warmup_cosine_decay_schedule,
             "piecewise_constant": optax.piecewise_constant_schedule, "exponential_decay": optax.exponential_decay,
             "polynomial": optax.polynomial_schedule}


@dataclasses.dataclass(frozen=True)
class Term:
    name: str
    fn: Callable  # (x, **options) -> (per-token loss [N, T], {metric: per-token value [N, T]})
    needs: frozenset  # of INPUTS
    options: tuple  # keys of the objective dict passed to fn as keyword arguments
    logits: bool = False  # reads x["logits"] (the whole [N, T, V]): the step must materialise them


TERMS: dict[str, Term] = {}


def register(name: str, *, needs=(), options=(), logits: bool = False):
    """Decorator: add ``fn`` as objective term ``name`` (a stage's ``objective.terms.<name>`` weight selects it).
    Registering the same function again (a config file loaded twice) is fine; another function under a taken
    name is a ValueError, so an experiment cannot replace a built-in by accident. ``logits=True``: the term
    reads ``x["logits"]`` ([N, T, V]); without it the step never builds them (see the module docstring)."""
    unknown = sorted(set(needs) - set(INPUTS))
    if unknown:
        raise ValueError(f"term {name!r} needs {unknown}: not inputs the step computes; known: {INPUTS}")

    def add(fn):
        old = TERMS.get(name)
        if old is not None and (old.fn.__module__, old.fn.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"objective term {name!r} is already registered by {old.fn.__module__}")
        TERMS[name] = Term(name, fn, frozenset(needs), tuple(options), bool(logits))
        return fn
    return add


# --------------------------------------------------------------------------------------------- built-ins


@register("pg", needs=("advantages",))
def policy_gradient(x):
    """GRPO's strictly on-policy term -A_i log pi(y_it) (C1/C2 Eq. 1). One update per sampled batch makes the ratio
    pi / pi_old identically 1 and grad ratio = grad log pi there, so PPO's clip never acts and is omitted: the
    value is not the surrogate's, the gradient is."""
    return -jax.lax.stop_gradient(x["advantages"])[:, None] * x["logp"], {}


@register("kl", needs=("ref_logp",), options=("kl_estimator",))
def kl_to_reference(x, kl_estimator):
    """KL(pi || pi_ref) per sampled token, estimator k1/k2/k3 (losses.kl_penalty); logged as ``kl``."""
    kl = losses.kl_penalty(x["logp"], x["ref_logp"], kl_estimator)
    return kl, {"kl": jax.lax.stop_gradient(kl)}


@register("entropy", logits=True)
def entropy_bonus(x):
    """-H(pi) per position: a positive weight rewards entropy (0 in Cascade RL)."""
    return -losses.token_entropy(x["logits"]), {}


@register("mopd", needs=("teacher_logp",), options=("is_low", "is_high"))
def mopd(x, is_low, is_high):
    """MOPD's sampled-token reverse KL with the truncated IS band (losses.mopd_token_loss; C2 section 4.4)."""
    per_token, weight, in_band = losses.mopd_token_loss(x["logp"], x["teacher_logp"], x["sampler_logp"],
                                                        is_low, is_high)
    return per_token, {"is_weight_mean": weight, "is_clip_frac": 1.0 - in_band}


def _student_on_support(x):
    """(student logits, teacher log-probs) on the teacher's support: the vocabulary, or its top K tokens, over
    which both renormalise (a divergence between the two distributions restricted to those K)."""
    support = x.get("teacher_support")
    s = x["logits"] if support is None else jnp.take_along_axis(x["logits"], support, -1)
    return s, x["teacher_logits"]


@register("forward_kl", needs=("teacher_logits",), logits=True)
def forward_kl(x):
    """KL(teacher || student) over the vocabulary or the teacher's top K (GKD; losses.forward_kl)."""
    return losses.forward_kl(*_student_on_support(x)), {}


@register("reverse_kl", needs=("teacher_logits",), logits=True)
def reverse_kl(x):
    """KL(student || teacher) over the vocabulary or the teacher's top K (losses.reverse_kl)."""
    return losses.reverse_kl(*_student_on_support(x)), {}


@register("gjsd", needs=("teacher_logits",), options=("gjsd_beta",), logits=True)
def gjsd(x, gjsd_beta):
    """Generalised Jensen-Shannon divergence JSD(beta) (GKD; losses.generalized_jsd)."""
    return losses.generalized_jsd(*_student_on_support(x), gjsd_beta), {}


@register("nll")
def negative_log_likelihood(x):
    """-log pi(y_t): SFT's loss on the batch's own tokens (here: the sampled ones)."""
    return -x["logp"], {}


# ----------------------------------------------------------------------------------------- the objective


class _Inputs(dict):
    """A term's ``x``: a missing ``logits`` says how to get them."""

    def __init__(self, x, term: str):
        super().__init__(x)
        self.term = term

    def __missing__(self, key):
        if key == "logits":
            raise KeyError(f"objective term {self.term!r} reads x['logits'] but was registered without logits=True "
                           "(objectives.register): the step builds the [N, T, V] logits only for terms that ask")
        raise KeyError(key)


@dataclasses.dataclass(frozen=True)
class Objective:
    """The terms with non-zero weight, each with its weight (step -> float) and options; one aggregation."""
    terms: tuple  # of (Term, weight: Callable[[step], float], options: dict)
    aggregation: str

    @property
    def needs(self) -> frozenset:
        return frozenset().union(*(t.needs for t, _, _ in self.terms))

    @property
    def reads_logits(self) -> bool:
        """Some term reads the policy's whole [N, T, V] logits."""
        return any(t.logits for t, _, _ in self.terms)

    @property
    def names(self) -> tuple:
        return tuple(t.name for t, _, _ in self.terms)

    def term_losses(self, x, normalizer, num_tokens):
        """({term: reduced loss}, metrics): unweighted values; metrics are global-batch token means."""
        values, metrics = {}, {}
        for term, _, options in self.terms:
            per_token, diagnostics = term.fn(_Inputs(x, term.name), **options)
            values[term.name] = losses.aggregate_sum(per_token, x["mask"], self.aggregation) / normalizer
            for k, v in diagnostics.items():
                metrics[k] = jnp.sum(x["mask"] * v) / num_tokens
        return values, metrics

    def weights(self, step) -> dict:
        return {term.name: weight(step) for term, weight, _ in self.terms}


def build(objective: Mapping) -> Objective:
    """The Objective of a stage's ``objective`` dict (keys it lacks take ``DEFAULTS``). Problems raise one
    ValueError naming every bad key."""
    bad = problems(objective)
    if bad:
        raise ValueError("; ".join(bad))
    o = _settings(objective)
    terms = [(TERMS[name], _weight_fn(w), {k: o[k] for k in TERMS[name].options})
             for name, w in o["terms"].items() if _is_on(w)]
    return Objective(tuple(terms), o["aggregation"])


def problems(objective: Mapping) -> list[str]:
    """What is wrong with an ``objective`` dict, as ``objective.<key>: problem`` lines (empty: fine)."""
    o = _settings(objective)
    options = {k for t in TERMS.values() for k in t.options}
    bad = unknown_keys("objective", o, set(DEFAULTS) | options)
    bad += [] if o["aggregation"] in losses.AGGREGATIONS else [
        f"objective.aggregation={o['aggregation']!r}; choose one of {losses.AGGREGATIONS}"]
    for name, w in o["terms"].items():
        if name not in TERMS:
            bad.append(f"objective.terms.{name}: unknown term; terms: {tuple(TERMS)}")
        elif _is_schedule(w):
            try:
                _weight_fn(w)(0)
            except Exception as err:  # noqa: BLE001 - reported with the key it came from
                bad.append(f"objective.terms.{name}: bad schedule {dict(w)} ({type(err).__name__}: {err}); "
                           f"schedules: {tuple(SCHEDULES)}, each with its optax keyword arguments")
        elif not isinstance(w, (int, float)) or isinstance(w, bool):
            bad.append(f"objective.terms.{name}={w!r}: a weight is a number or a schedule dict")
        if name in TERMS:
            bad += [f"objective.terms.{name}: reads objective.{k}, which this objective lacks"
                    for k in TERMS[name].options if k not in o]
    if not any(_is_on(w) for w in o["terms"].values()):
        bad.append(f"objective.terms={dict(o['terms'])}: every weight is 0, nothing would train")
    bad += [f"objective.kl_estimator={o['kl_estimator']!r}; choose one of {losses.KL_ESTIMATORS}"] if (
        o["kl_estimator"] not in losses.KL_ESTIMATORS) else []
    bad += [f"objective.is_low={o['is_low']}, is_high={o['is_high']}: need 0 < is_low <= 1 <= is_high"] if not (
        0 < o["is_low"] <= 1 <= o["is_high"]) else []
    bad += [f"objective.gjsd_beta={o['gjsd_beta']} must lie in (0, 1)"] if not 0 < o["gjsd_beta"] < 1 else []
    bad += [f"objective.distill_topk={o['distill_topk']} must be None or >= 1"] if (
        o["distill_topk"] is not None and o["distill_topk"] < 1) else []
    return bad + ([f"objective.micro_batches={o['micro_batches']} must be >= 1"] if o["micro_batches"] < 1 else [])


def needs(objective: Mapping) -> frozenset:
    """What the known, non-zero terms of an ``objective`` dict read (INPUTS); unknown terms are ``problems``'."""
    terms = _settings(objective)["terms"]
    return frozenset().union(*(TERMS[k].needs for k, w in terms.items() if k in TERMS and _is_on(w)))


def _is_on(w) -> bool:
    return _is_schedule(w) or (isinstance(w, (int, float)) and w != 0)


def _is_schedule(w) -> bool:
    return isinstance(w, Mapping) or hasattr(w, "to_dict")


def _weight_fn(w) -> Callable:
    if not _is_schedule(w):
        return lambda step, w=float(w): w
    kwargs = dict(w.to_dict() if hasattr(w, "to_dict") else w)
    name = kwargs.pop("schedule", None)
    if name not in SCHEDULES:
        raise ValueError(f"schedule={name!r} is not one of {tuple(SCHEDULES)}")
    return SCHEDULES[name](**kwargs)


DEFAULTS = dict(
    terms=dict(pg=1.0, kl=0.0, entropy=0.0),  # term -> weight: a float (0 = off) or an optax schedule dict
    aggregation="token_mean",  # losses.AGGREGATIONS
    kl_estimator="k3",  # term kl
    is_low=0.5, is_high=2.0,  # term mopd: the truncated importance-sampling band
    gjsd_beta=0.5, distill_topk=None,  # terms forward_kl / reverse_kl / gjsd: the teacher's top K (None: vocabulary)
    teachers={},  # domain -> checkpoint name for the teacher terms; a domain not listed uses "best:<domain>"
    micro_batches=1,  # the update splits its rows into this many, gradients summed (exact: global normalisers)
)


def _settings(objective: Mapping) -> dict:
    return {**DEFAULTS, **(objective.to_dict() if hasattr(objective, "to_dict") else objective)}
