"""Host-side (numpy) filters that act on a batch of rollout groups before the GRPO update (METHOD.md).

A batch holds P prompts x G rollouts; ``rewards`` is float [P, G].
  dynamic_filter_keep   drop groups whose G rewards are all equal (zero advantage, zero gradient).
  OVERLONG_MODES        what to do with truncated rollouts (applied in the step: rl/update.py `advantages`).
  max_reward_keep       drop prompts where no rollout scores above a threshold (agentless SWE).
  EpochFilter           C1 epoch-level prompt filtering for math (drop 0% / 100% prompts, re-admit some).
  RefillBuffer          bounded resampling that refills a dynamically filtered batch and never aborts.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from nemocascade.errors import unknown_keys

OVERLONG_MODES = ("filter", "penalty", "none")
# A stage's `filters` dict, read here and by the on-policy loop (stages/onpolicy.py sample_groups)
DEFAULTS = dict(
    dynamic=False,  # DAPO's dynamic filter: drop groups whose rewards are all equal ...
    refill_rounds=3,  # ... and sample again, at most this many rounds a step, to refill the batch
    overlong="none",  # a truncated rollout: "filter" (out of the loss), "penalty" (reward 0) or "none"
    max_reward_below=None,  # drop a group whose best reward is not above this (agentless SWE: 0.5); None: off
    epoch=False,  # C1's epoch filter (EpochFilter, its readmission rates)
)


def problems(stage, trains_on_rewards: bool) -> list[str]:
    """What is wrong with a stage's `filters` dict, as `filters.<key>: problem` lines (empty: fine)."""
    f = stage.filters
    bad = unknown_keys("filters", f, DEFAULTS)
    if bad:
        return bad
    bad += [f"filters.refill_rounds={f.refill_rounds} must be >= 1"] if f.refill_rounds < 1 else []
    bad += [f"filters.overlong={f.overlong!r}; choose one of {OVERLONG_MODES}"] if f.overlong not in OVERLONG_MODES \
        else []
    if not trains_on_rewards:  # the reward filters act on groups the loss never reads
        bad += [f"filters.{k}: filters groups by reward, but no objective term trains on rewards"
                for k in ("dynamic", "epoch", "max_reward_below") if f[k] not in (False, None)]
    return bad


def _check_rewards(rewards, name="rewards"):
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.ndim != 2:
        raise ValueError(f"{name} must be [num_prompts, group_size], got shape {rewards.shape}")
    bad = np.flatnonzero(~np.isfinite(rewards).all(axis=1))
    if bad.size:
        raise ValueError(f"{name} has non-finite values in rows {bad.tolist()}: {rewards[bad[0]].tolist()}")
    return rewards


def dynamic_filter_keep(rewards):
    """bool [P]: True for groups whose rewards are not all equal (DAPO dynamic sampling).

    An all-equal group has advantage 0 for every rollout (group_advantages), so it adds no gradient
    and only dilutes the token-mean denominator.
    """
    rewards = _check_rewards(rewards)
    return (rewards != rewards[:, :1]).any(axis=1)


def max_reward_keep(rewards, threshold):
    """bool [P]: True where the best rollout scores strictly above ``threshold``
    (``filters.max_reward_below``; agentless SWE uses 0.5)."""
    rewards = _check_rewards(rewards)
    return rewards.max(axis=1) > threshold


class EpochFilter:
    """C1 epoch-level prompt filtering for math RL (METHOD.md "Group filters").

    During an epoch, ``update`` accumulates each prompt's rewards (each in [0, 1]; accuracy = mean).
    ``end_epoch`` classifies every prompt seen this epoch: accuracy 0 -> "hard", 1 -> "easy", otherwise it
    is no longer classified. Classified prompts are dropped from the next epoch, except that each is
    re-admitted with probability ``p_readmit_hard`` / ``p_readmit_easy``; the draw is fresh every epoch,
    also for prompts that stayed dropped (and so produced no new rewards) - they keep their last class.
    A re-admitted prompt that is sampled again is re-classified from its new rewards.
    Draws use one seeded numpy Generator over the sorted prompt ids, so a run is reproducible and the
    state (``state_dict``) is JSON-serialisable.
    """

    def __init__(self, p_readmit_hard=0.1, p_readmit_easy=0.01, seed=0):
        for name, p in (("p_readmit_hard", p_readmit_hard), ("p_readmit_easy", p_readmit_easy)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name}={p} must lie in [0, 1]")
        self.p_readmit_hard = float(p_readmit_hard)
        self.p_readmit_easy = float(p_readmit_easy)
        self.seed = int(seed)
        self._rng = np.random.default_rng(self.seed)
        self.epoch = 0
        self._sums: dict[str, float] = {}    # this epoch: sum of rewards per prompt
        self._counts: dict[str, int] = {}    # this epoch: number of rollouts per prompt
        self._status: dict[str, str] = {}    # last classification: "hard" | "easy"
        self._dropped: set[str] = set()      # excluded from the current epoch

    def update(self, prompt_ids, rewards):
        """Accumulate one batch: ``prompt_ids`` list of P str, ``rewards`` [P, G] with values in [0, 1]."""
        rewards = _check_rewards(rewards)
        prompt_ids = list(prompt_ids)
        if len(prompt_ids) != rewards.shape[0]:
            raise ValueError(f"got {len(prompt_ids)} prompt_ids for rewards with {rewards.shape[0]} rows")
        for pid, row in zip(prompt_ids, rewards):
            if not isinstance(pid, str):
                raise ValueError(f"prompt id {pid!r} must be a str")
            if row.min() < 0.0 or row.max() > 1.0:
                raise ValueError(f"prompt {pid!r} has rewards {row.tolist()} outside [0, 1]; "
                                 "EpochFilter reads the mean reward as accuracy")
            self._sums[pid] = self._sums.get(pid, 0.0) + float(row.sum())
            self._counts[pid] = self._counts.get(pid, 0) + row.size

    def end_epoch(self) -> None:
        """Classify this epoch's prompts and draw which classified prompts the next epoch re-admits."""
        for pid, n in self._counts.items():
            acc = self._sums[pid] / n
            if acc == 0.0:
                self._status[pid] = "hard"
            elif acc == 1.0:
                self._status[pid] = "easy"
            else:
                self._status.pop(pid, None)
        ids = sorted(self._status)
        draws = self._rng.random(len(ids))
        p = {"hard": self.p_readmit_hard, "easy": self.p_readmit_easy}
        self._dropped = {pid for pid, u in zip(ids, draws) if u >= p[self._status[pid]]}
        self._sums, self._counts = {}, {}
        self.epoch += 1

    def keep(self, prompt_id) -> bool:
        """Whether ``prompt_id`` takes part in the current epoch."""
        return prompt_id not in self._dropped

    def summary(self) -> dict[str, int]:
        """Counts for logging: classified hard / easy prompts and how many are dropped this epoch."""
        hard = sum(1 for s in self._status.values() if s == "hard")
        return {"epoch": self.epoch, "hard": hard, "easy": len(self._status) - hard,
                "dropped": len(self._dropped)}

    def state_dict(self) -> dict[str, Any]:
        return {
            "p_readmit_hard": self.p_readmit_hard, "p_readmit_easy": self.p_readmit_easy, "seed": self.seed,
            "epoch": self.epoch, "sums": dict(self._sums), "counts": dict(self._counts),
            "status": dict(self._status), "dropped": sorted(self._dropped),
            "rng": self._rng.bit_generator.state,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        missing = {"p_readmit_hard", "p_readmit_easy", "seed", "epoch", "sums", "counts", "status", "dropped",
                   "rng"} - set(d)
        if missing:
            raise ValueError(f"EpochFilter state is missing keys {sorted(missing)}")
        self.p_readmit_hard, self.p_readmit_easy = float(d["p_readmit_hard"]), float(d["p_readmit_easy"])
        self.seed, self.epoch = int(d["seed"]), int(d["epoch"])
        self._sums = {k: float(v) for k, v in d["sums"].items()}
        self._counts = {k: int(v) for k, v in d["counts"].items()}
        self._status = dict(d["status"])
        self._dropped = set(d["dropped"])
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = d["rng"]


class RefillBuffer:
    """Bounded refill of a dynamically filtered batch (METHOD.md: "bounded and degrade gracefully").

    Usage, once per training step::

        buf = RefillBuffer(target=B, max_rounds=4)
        while not buf.ready():
          groups = sample_and_score(n=buf.short_by or B)      # pytree, leaves with leading dim P
          buf.add(groups, dynamic_filter_keep(groups["rewards"]))
        batch, stats = buf.take()   # stats["kept"] may be < B, even 0: the trainer skips or shrinks

    ``take`` returns at most ``target`` groups, in sampling order; the surplus of the last round is
    discarded, not carried into the next step, because those groups were sampled from the current policy
    and the next step must stay strictly on-policy. After ``take`` the buffer is empty and reusable.
    stats: rounds (sampling rounds used), kept (groups returned), dropped (groups the keep masks removed),
    surplus (kept groups discarded above target), short_by (target - kept).
    """

    def __init__(self, target: int, max_rounds: int):
        if target < 1:
            raise ValueError(f"target={target} must be >= 1")
        if max_rounds < 1:
            raise ValueError(f"max_rounds={max_rounds} must be >= 1")
        self.target, self.max_rounds = int(target), int(max_rounds)
        self._reset()

    def _reset(self):
        self._chunks: list[Any] = []
        self._treedef = None
        self._empty = None  # zero-length template, so an empty take still has the batch's structure
        self._rounds = self._kept = self._dropped = 0

    @property
    def short_by(self) -> int:
        return max(self.target - self._kept, 0)

    def ready(self) -> bool:
        return self._kept >= self.target or self._rounds >= self.max_rounds

    def add(self, groups, keep) -> None:
        """Add one sampling round: ``groups`` pytree of arrays with leading dim P, ``keep`` bool [P]."""
        keep = np.asarray(keep)
        if keep.ndim != 1 or keep.dtype != np.bool_:
            raise ValueError(f"keep must be a 1-D bool mask, got dtype {keep.dtype} shape {keep.shape}")
        leaves, treedef = jax.tree_util.tree_flatten_with_path(groups)
        for path, leaf in leaves:
            if np.ndim(leaf) == 0 or np.shape(leaf)[0] != keep.shape[0]:
                raise ValueError(f"groups leaf {jax.tree_util.keystr(path)} has shape {np.shape(leaf)}; its "
                                 f"leading dim must equal len(keep) = {keep.shape[0]}")
        if self._treedef is None:
            self._treedef = treedef
            self._empty = jax.tree.map(lambda x: np.asarray(x)[:0], groups)
        elif treedef != self._treedef:
            raise ValueError(f"groups structure {treedef} differs from the first round's {self._treedef}")
        self._rounds += 1
        self._dropped += int((~keep).sum())
        if keep.any():
            self._chunks.append(jax.tree.map(lambda x: np.asarray(x)[keep], groups))
            self._kept += int(keep.sum())

    def take(self):
        """Return (groups with leading dim min(kept, target), stats) and empty the buffer.

        With nothing added at all the groups are None.
        """
        kept = min(self._kept, self.target)
        stats = {"rounds": self._rounds, "kept": kept, "dropped": self._dropped,
                 "surplus": self._kept - kept, "short_by": self.target - kept}
        if self._chunks:
            groups = jax.tree.map(lambda *xs: np.concatenate(xs, axis=0)[:kept], *self._chunks)
        else:
            groups = self._empty
        self._reset()
        return groups, stats
