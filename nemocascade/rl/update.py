"""The on-policy update every RL stage kind runs (GRPO, RLHF, MOPD and its GKD variants), over device arrays:

    batch = rollouts.training_batch(...)        the kept groups' rows, gathered on the device
    frozen = FrozenRoles(...)(batch)            the reference's / teachers' log-probs, each role its own jit
    state, metrics = step(state, batch | frozen)   rewards -> group advantages -> objective -> gradients
                                                -> optax chain, one jit (`policy_step`)

The objective (nemocascade/objectives.py) decides what the frozen roles must provide; the optax chain
(nemocascade/optim.py) clips, applies AdamW and zeroes frozen parameters. The frozen roles run in their own jits,
fed the device-resident batch: by XLA's accounting the peak is the same as with the role's pass fused into the
step (SmolLM2-135M's shape, pg + kl: 4,736 MiB both ways at 32 x 256 tokens with remat, 64,240 vs 64,242 MiB at
64 x 384 without; benchmarks/frozen_roles_memory.py), and one compiled pass serves every teacher of the same shape.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from nemocascade import losses, train_state
from nemocascade.models import forward, forward_hidden, head_logprobs, lm_head

TEACHER_INPUTS = frozenset({"teacher_logp", "teacher_logits"})


class FrozenRoles:
    """Scores a batch under the frozen roles an objective needs: the reference (``ref_logp``) and, per row,
    that row's teacher (``teacher_logp``; ``teacher_logits`` [N, T, K] log-probabilities over the vocabulary
    or the teacher's top ``topk`` tokens, with ``teacher_support``). Roles are params pytrees on the policy's
    mesh; each is scored in its own jitted pass (one compile per shape, shared by all teachers), `micro_batches`
    groups of rows at a time, as the step trains them: a pass holds one micro-batch's activations."""

    def __init__(self, model_cfg, needs, reference=None, teachers=(), teacher_of_domain=None, topk: int = 0,
                 micro_batches: int = 1):
        """`teacher_of_domain`: int array, run-domain index -> index into `teachers`."""
        self.needs, self.reference, self.teachers, self.topk = frozenset(needs), reference, tuple(teachers), topk
        self.teacher_of_domain = None if teacher_of_domain is None else jnp.asarray(teacher_of_domain, jnp.int32)
        if "ref_logp" in self.needs and reference is None:
            raise ValueError("the objective needs ref_logp but no reference params were given")
        if self.needs & TEACHER_INPUTS and not self.teachers:
            raise ValueError("the objective needs a teacher but no teacher params were given")
        self._logp = jax.jit(_by_rows(functools.partial(_sampled_logp, model_cfg), micro_batches))
        self._teacher = jax.jit(_by_rows(functools.partial(_teacher_pass, model_cfg, "teacher_logits" in self.needs,
                                                           topk), micro_batches), donate_argnums=3)

    def __call__(self, batch) -> dict:
        out = {}
        inputs = {k: batch[k] for k in ("tokens", "positions", "valid")}  # all a pass reads, one row per rollout
        if "ref_logp" in self.needs:
            out["ref_logp"] = self._logp(self.reference, inputs)
        if self.needs & TEACHER_INPUTS:
            rows = self.teacher_of_domain[batch["domain_idx"]]
            scored = None
            for k, params in enumerate(self.teachers):  # static shapes: every teacher scores every row
                scored = self._teacher(params, inputs, rows == k, scored)
            out |= scored
        return out


def _by_rows(fn, micro_batches: int):
    """`fn(params, *rows)` (every leaf of `rows` and of its result [N, ...]) over `micro_batches` groups of rows in
    turn (`lax.map`): the same values, with one group's activations alive at a time."""
    if micro_batches == 1:
        return fn

    def run(params, *rows):
        split = lambda x: x.reshape(micro_batches, x.shape[0] // micro_batches, *x.shape[1:])  # noqa: E731
        out = jax.lax.map(lambda r: fn(params, *r), jax.tree.map(split, rows))
        return jax.tree.map(lambda y: y.reshape(-1, *y.shape[2:]), out)
    return run


LOGITS_BUDGET = 2 ** 26  # float32 elements (256 MiB) of [rows, positions, vocab] logits built at once


def logit_chunk(batch, vocab: int) -> int:
    """Positions per chunk so one chunk's logits fit LOGITS_BUDGET elements; 0 when the whole batch's do."""
    rows, width = batch["tokens"].shape
    chunk = max(LOGITS_BUDGET // (rows * vocab), 1)
    return 0 if chunk >= width - 1 else chunk


def _inputs(batch):
    return batch["tokens"][:, :-1], batch["positions"][:, :-1], batch["valid"][:, :-1]


def _next_token_logits(params, model_cfg, batch):
    """Logits at every position but the last, aligned with the targets batch["tokens"][:, 1:]."""
    return forward(params, model_cfg, *_inputs(batch))


def token_outputs(params, model_cfg, batch, full_logits: bool = False) -> dict:
    """The policy's (or a frozen role's) values on the batch, aligned with the targets batch["tokens"][:, 1:]:
    ``logp`` [N, T] of the targets, ``entropy`` [N, T] (no gradient) and, with `full_logits`, ``logits``
    [N, T, V]. Without `full_logits` a batch whose logits exceed LOGITS_BUDGET gets them chunk by chunk
    (models.head_logprobs): [N, T, V] is never built, in the forward pass or the backward."""
    targets = batch["tokens"][:, 1:]
    chunk = 0 if full_logits else logit_chunk(batch, model_cfg.vocab_size)
    h, aux = forward_hidden(params, model_cfg, *_inputs(batch), with_aux=True)
    moe = {"router_aux": aux} if model_cfg.moe else {}  # the load-balancing loss over the batch's real tokens
    if chunk:
        logp, entropy = head_logprobs(params, model_cfg, h, targets, chunk)
        return {"logp": logp, "entropy": entropy} | moe
    logits = lm_head(params, model_cfg, h)
    out = {"logp": losses.token_logprobs(logits, targets),
           "entropy": jax.lax.stop_gradient(losses.token_entropy(logits))}
    return out | moe | ({"logits": logits} if full_logits else {})


def _sampled_logp(model_cfg, params, batch):
    return token_outputs(params, model_cfg, batch)["logp"]


def _teacher_pass(model_cfg, full: bool, topk: int, params, batch, rows, acc):
    """This teacher's values on `rows` (bool [N]), the accumulated other teachers' values elsewhere."""
    if full:
        logp_all = jax.nn.log_softmax(_next_token_logits(params, model_cfg, batch).astype(jnp.float32), -1)
        new = {"teacher_logp": jnp.take_along_axis(logp_all, batch["tokens"][:, 1:, None], -1)[..., 0]}
        if topk:
            new["teacher_logits"], new["teacher_support"] = jax.lax.top_k(logp_all, topk)
        else:
            new["teacher_logits"] = logp_all
    else:
        new = {"teacher_logp": _sampled_logp(model_cfg, params, batch)}
    if acc is None:
        return new
    pick = lambda a, b: jnp.where(rows.reshape(-1, *([1] * (a.ndim - 1))), a, b)  # noqa: E731
    return jax.tree.map(pick, new, acc)


def advantages(rewards, truncated, mask, overlong: str):
    """(advantages [N], loss mask [N, T]) of P x G rollouts' rewards and truncation flags [P, G] (N = P x G).
    DAPO's overlong handling: "filter" drops a truncated rollout from the loss while its reward stays in its
    group's statistics; "penalty" rewards it 0; "none". A = (r - mean_g r) / (std_g r + 1e-6) (C1/C2 Eq. 1)."""
    if overlong == "penalty":
        rewards = jnp.where(truncated, 0.0, rewards)
    if overlong == "filter":
        mask = mask * ~truncated.reshape(-1, 1)
    return losses.group_advantages(rewards).reshape(-1), mask


def prepare(batch, step, *, objective, domains=(), overlong: str = "none"):
    """What every micro-batch reads, computed once over the whole batch (`train_state.make_step`'s `prepare`): the
    group advantages (`advantages`, with `overlong`), the objective's normaliser, token counts overall and per
    domain, and the term weights at `step`. batch: tokens/valid/positions [N, L]; mask, sampler_logp [N, L-1];
    domain_idx [N]; rewards and truncated [P, G] (N = P x G, a group's rows adjacent); plus what FrozenRoles
    added. `domains`: (run-domain index, name) pairs to log reverse KL per domain."""
    rows = dict(batch)
    rows["advantages"], rows["mask"] = advantages(rows.pop("rewards"), rows.pop("truncated"), rows["mask"], overlong)
    row_tokens = jnp.sum(rows["mask"], -1)
    weights = objective.weights(step)
    shared = dict(normalizer=losses.loss_normalizer(rows["mask"], objective.aggregation), weights=weights,
                  n_tok=jnp.maximum(jnp.sum(row_tokens), 1.0),
                  domain_tokens={name: jnp.maximum(jnp.sum(jnp.where(rows["domain_idx"] == i, row_tokens, 0.0)), 1.0)
                                 for i, name in domains})
    return rows, shared, {f"weight/{k}": w for k, w in weights.items()}


def policy_loss(params, rows, shared, *, model_cfg, objective, micro_batches: int = 1, domains=()):
    """The weighted sum of `objective`'s terms (objectives.Objective) on `rows`, every reduction over the whole
    batch's normaliser (`shared`, from `prepare`): summed over micro-batches it is the full batch's loss."""
    x = {**rows, **token_outputs(params, model_cfg, rows, full_logits=objective.reads_logits)}
    values, metrics = objective.term_losses(x, shared["normalizer"], shared["n_tok"])
    metrics |= {f"term/{k}": v for k, v in values.items()} | _diagnostics(x, shared["n_tok"], domains,
                                                                           shared["domain_tokens"])
    loss = sum(shared["weights"][k] * v for k, v in values.items())
    if "router_aux" in x:  # a mixture of experts' load-balancing loss, each micro-batch's the mean over its tokens
        loss = loss + model_cfg.router_aux_coef * x["router_aux"] / micro_batches
        metrics["router_aux"] = x["router_aux"] / micro_batches
    return loss, metrics


def policy_objective(*, model_cfg, objective, micro_batches: int = 1, domains=(), overlong: str = "none"):
    """(loss, step options): `policy_loss` and what `train_state.make_step` steps it with (`prepare`,
    `micro_batches`); the stage loop hands both to `common.Trainer`."""
    loss = functools.partial(policy_loss, model_cfg=model_cfg, objective=objective, micro_batches=micro_batches,
                             domains=domains)
    return loss, dict(prepare=functools.partial(prepare, objective=objective, domains=domains, overlong=overlong),
                      micro_batches=micro_batches)


def policy_step(tx, *, grad_clip: float = 0.0, **kw):
    """The on-policy update as one function, `step(state, batch) -> (state, metrics)`: `train_state.make_step` of
    `policy_objective(**kw)`, as the stage loop builds it."""
    loss, options = policy_objective(**kw)
    return train_state.make_step(loss, tx, grad_clip=grad_clip, **options)


def _diagnostics(x, n_tok, domains, domain_tokens) -> dict:
    """Token means over the global batch, not part of the loss: policy entropy, sampler-vs-trainer log-prob
    gap, and with a teacher the reverse KL log pi - log pi_teacher overall and per domain (it should fall)."""
    sg = jax.lax.stop_gradient
    m = x["mask"]
    out = {"entropy": jnp.sum(m * x["entropy"]) / n_tok,
           "logp_mismatch": jnp.sum(m * jnp.abs(sg(x["logp"]) - x["sampler_logp"])) / n_tok}
    if "teacher_logp" in x:
        rkl = m * (sg(x["logp"]) - x["teacher_logp"])
        out["reverse_kl"] = jnp.sum(rkl) / n_tok
        for i, name in domains:
            out[f"reverse_kl/{name}"] = jnp.sum(jnp.where((x["domain_idx"] == i)[:, None], rkl, 0.0)) / \
                domain_tokens[name]
    return out
