"""RLHF rewards from a learned reward model: the scalar BT scorer (Cascade 1) and the pairwise
aggregation of Cascade 2 (METHOD.md "Rewards per domain": RLHF).

    rm_text(prompt, final)        what the RM reads: the request and the final answer in non-thinking form
    final_text(completion)        the text after </think> (the whole text when thinking never finished)
    RewardModelScorer.score       [N] scalar rewards of (prompt, completion) pairs, jitted, fixed batch shape
    bt_preferences(scores)        [G, G] Pr(i beats j) = sigmoid(r_i - r_j) of one prompt's G rollouts
    pairwise_rewards(pref, ...)   [G] Cascade 2 rewards: mean pairwise win prob., tie-break, conciseness bonus

The RM never sees the think block (METHOD.md "Chat template and modes"): both RM training
(`nemocascade.stages.rm`) and scoring render ``chat.render_prompt(prompt, thinking=False) +
chat.render_completion("", final, thinking=False)``, i.e. the answer as a non-thinking turn, so train and
score inputs have one format. Unlike a verifier, an unfinished think block is not scored 0 here: the RM
scores what the model wrote instead (the text after ``<think>``), and the RM has learnt that such text is
no answer. Unlike the ``REWARDS`` entries these run in the trainer process (a jitted forward pass), not in
the verifier pool.
"""
from __future__ import annotations

import functools

import jax
import numpy as np

from nemocascade import chat, checkpoint
from nemocascade import mesh as mesh_lib
from nemocascade.models import reward_model, transformer


def final_text(completion: str) -> str:
    """The answer part of an assistant turn: after the last ``</think>``; the whole text (after ``<think>``)
    when the think block is unfinished; minus one trailing ``<|im_end|>``."""
    reasoning, final = chat.split_think(completion)
    return final if chat.THINK_CLOSE in completion else reasoning or final


def rm_text(prompt: str, final: str) -> str:
    """The text the RM scores (module docstring): the chat prompt and ``final`` as a non-thinking turn."""
    return chat.render_prompt(prompt, thinking=False) + chat.render_completion("", final, thinking=False)


def encode_rm(tokenizer, prompt: str, final: str, max_len: int) -> list[int]:
    """Token ids of ``rm_text``, truncated to the first ``max_len`` (the score is then read at the cut)."""
    return tokenizer.encode(rm_text(prompt, final))[:max_len]


def load(path: str, model_cfg: transformer.ModelConfig, mesh=None):
    """RM params saved with ``checkpoint.save_params`` (``stages.rm``), placed on ``mesh`` (default: one device)."""
    mesh = mesh if mesh is not None else mesh_lib.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
    return checkpoint.load_params(path, reward_model.abstract_params(model_cfg, mesh))


class RewardModelScorer:
    """Scalar rewards of whole assistant turns from a BT reward model (module docstring).

    Every call pads to ``[batch_size, max_len]`` (right padding; dummy rows fill the last batch), so one
    compiled forward pass serves every call. With ``mesh``, params and batches are placed on it.
    """

    def __init__(self, rm_params, model_cfg: transformer.ModelConfig, tokenizer, *, batch_size: int, max_len: int,
                 mesh=None):
        if batch_size < 1 or max_len < 2:
            raise ValueError(f"batch_size must be >= 1 and max_len >= 2, got {batch_size}, {max_len}")
        self.model_cfg, self.tokenizer, self.batch_size, self.max_len, self.mesh = (
            model_cfg, tokenizer, batch_size, max_len, mesh)
        if mesh is not None:
            rm_params = jax.device_put(rm_params, reward_model.param_shardings(model_cfg, mesh))
        self.params = rm_params

    @classmethod
    def load(cls, path: str, model_cfg, tokenizer, **kw) -> "RewardModelScorer":
        return cls(load(path, model_cfg, kw.get("mesh")), model_cfg, tokenizer, **kw)

    def score_texts(self, prompts: list[str], finals: list[str]) -> np.ndarray:
        """Rewards [N] float32 of final answers (no think block) to ``prompts``."""
        if len(prompts) != len(finals):
            raise ValueError(f"{len(prompts)} prompts but {len(finals)} answers")
        out = np.zeros((len(prompts),), np.float32)
        B, L = self.batch_size, self.max_len
        for start in range(0, len(prompts), B):
            rows = [encode_rm(self.tokenizer, p, f, L) for p, f in zip(prompts[start:start + B],
                                                                       finals[start:start + B])]
            n = len(rows)
            rows += [rows[-1]] * (B - n)
            tokens = np.full((B, L), self.tokenizer.pad_id, np.int32)
            valid = np.zeros((B, L), bool)
            for b, ids in enumerate(rows):
                tokens[b, :len(ids)], valid[b, :len(ids)] = ids, True
            batch = (tokens, valid)
            if self.mesh is not None:
                batch = mesh_lib.shard_batch(self.mesh, batch)
            scores = _scores(self.params, *batch, cfg=self.model_cfg)
            out[start:start + n] = np.asarray(mesh_lib.to_host(scores))[:n]
        return out

    def score(self, prompts: list[str], completions: list[str]) -> np.ndarray:
        """Rewards [N] float32 of whole assistant turns (starting with ``<think>\\n``): the RM reads
        ``final_text(completion)`` rendered by ``rm_text``."""
        return self.score_texts(prompts, [final_text(c) for c in completions])


@functools.partial(jax.jit, static_argnames="cfg")  # one compile per (config, shape), shared by all scorers
def _scores(params, tokens, valid, *, cfg):
    return reward_model.rm_scores(params, cfg, tokens, transformer.left_pad_positions(valid), valid)


# ---------------------------------------------------------------------------- pairwise (Cascade 2)


def bt_preferences(scores) -> np.ndarray:
    """``pref[i, j] = sigmoid(r_i - r_j)``: Pr(i beats j) under a Bradley-Terry RM. [G] -> [G, G] float64."""
    r = np.asarray(scores, np.float64)
    d = r[:, None] - r[None, :]
    return 0.5 * (1.0 + np.tanh(0.5 * d))  # = sigmoid(d), without overflow for large |d|


def pairwise_rewards(pref, lengths=None, conciseness_bonus: float = 0.0, quality_gate: float = 0.5,
                     tie_eps: float = 1e-3, tie_tol: float = 1e-9) -> np.ndarray:
    """Cascade 2's RLHF reward of each of G rollouts from a pairwise judge (C2 section on RLHF; the tie-break
    and bonus formulas are [ours]). ``pref`` [G, G]: ``pref[i, j]`` = Pr(i beats j); the diagonal is ignored.

        base_i     = mean_{j != i} pref[i, j]
        copeland_i = #{j: pref[i, j] > pref[j, i]} - #{j: pref[i, j] < pref[j, i]}     (in [-(G-1), G-1])
        reward_i   = base_i + eps * (copeland_i + G - 1) / (2 (G - 1))
        eps        = min(tie_eps, gap / 2),  gap = the smallest difference > tie_tol between two base values

    so the tie-break never reorders rollouts whose mean scores differ, and rollouts with equal means are
    ranked by their Copeland score (pairwise wins minus losses); equal in both, they stay tied.

    Conciseness bonus (with ``lengths`` [G] and ``conciseness_bonus`` > 0), only among the rollouts whose
    ``base_i >= quality_gate``, so a short bad answer never gains:

        reward_i += conciseness_bonus * (L_max - L_i) / (L_max - L_min)     (L over the gated rollouts)

    the shortest gated rollout gets the whole bonus, the longest none (nobody when all have one length).
    Returns float64 [G]. G = 1 gives [0.5] (nothing to compare with).
    """
    p = np.asarray(pref, np.float64)
    if p.ndim != 2 or p.shape[0] != p.shape[1]:
        raise ValueError(f"pref must be a square [G, G] matrix, got shape {p.shape}")
    G = p.shape[0]
    if G == 1:
        return np.full((1,), 0.5)
    off = ~np.eye(G, dtype=bool)
    base = np.where(off, p, 0.0).sum(axis=1) / (G - 1)
    copeland = (np.where(off, np.sign(p - p.T), 0.0)).sum(axis=1)
    values = np.unique(base)
    gaps = np.diff(values)
    gaps = gaps[gaps > tie_tol]
    eps = min(tie_eps, gaps.min() / 2) if gaps.size else tie_eps
    reward = base + eps * (copeland + G - 1) / (2 * (G - 1))
    if conciseness_bonus and lengths is not None:
        lengths = np.asarray(lengths, np.float64)
        if lengths.shape != (G,):
            raise ValueError(f"lengths must have shape ({G},), got {lengths.shape}")
        gated = base >= quality_gate
        if gated.any():
            lo, hi = lengths[gated].min(), lengths[gated].max()
            if hi > lo:
                reward = reward + np.where(gated, conciseness_bonus * (hi - lengths) / (hi - lo), 0.0)
    return reward
