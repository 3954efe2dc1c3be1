"""What every stage kind shares: the run context, and a `Trainer` that owns one stage's state,
jitted step, checkpoints (periodic, final, and on interruption), resume and logging.

A stage kind module (`sft.py`, `grpo.py`, ...) builds its step function and its data iterator, then
drives `Trainer.steps()`; everything about *where* state lives and how it survives a crash is here.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Callable

import grain
import jax
import ml_collections

from nemocascade import checkpoint, evaluation, optim, train_state
from nemocascade.configs import stage_order
from nemocascade.mesh import replicated, shard_batch, to_host
from nemocascade.models import ModelConfig
from nemocascade.run_log import RunLog, progress

COMMON_DEFAULTS = dict(kind="", domains=("math",), steps=100, checkpoint_every=50, eval_n=64, eval_every=0)


@dataclasses.dataclass
class RunContext:
    """Everything a stage needs from the run; built once by `nemocascade.cascade.setup`."""
    cfg: ml_collections.ConfigDict
    workdir: str
    mesh: jax.sharding.Mesh
    model_cfg: ModelConfig
    tokenizer: Any
    sources: dict[str, dict[str, Any]]  # domain -> split -> record source
    log: RunLog
    param_shardings: Any
    pool: Any  # rewards.pool.VerifierPool

    def test_records(self, domain: str, n: int | None = None) -> list[dict]:
        src = self.sources[domain]["test"]
        n = len(src) if n is None else min(n, len(src))
        return [src[i] for i in range(n)]


def stage_config(kind: str, kind_defaults: dict, **overrides) -> ml_collections.ConfigDict:
    """A stage's ConfigDict: common keys + the kind's defaults + `optim`, then `overrides`.
    Unknown keys are an error naming them (ConfigDict is locked)."""
    cfg = ml_collections.ConfigDict({**COMMON_DEFAULTS, **kind_defaults, "kind": kind,
                                     "optim": dict(optim.DEFAULTS)})
    cfg.domains = list(cfg.domains)
    for key, value in overrides.items():
        if key not in cfg:
            raise KeyError(f"stage of kind {kind!r} has no key {key!r}; keys: {sorted(cfg.keys())}")
        if key == "optim":
            cfg.optim.update(value)
        else:
            cfg[key] = value
    cfg.lock()
    return cfg


def stage_index(ctx: RunContext, name: str) -> int:
    """Position of the stage in the run (seeds its data order and RNG)."""
    return stage_order(ctx.cfg).index(name)


def optimizer(stage):
    return optim.make_optimizer(stage.optim, stage.steps)


def mixture_source(ctx: RunContext, domains, split: str):
    """One domain's source, or an equal-weight interleaving of several (grain MapDataset.mix)."""
    missing = [d for d in domains if d not in ctx.sources]
    if missing:
        raise KeyError(f"stage asks for domain(s) {missing} but the run prepared {sorted(ctx.sources)}; "
                       f"add them to config.data")
    if len(domains) == 1:
        return ctx.sources[domains[0]][split]
    return grain.MapDataset.mix([grain.MapDataset.source(ctx.sources[d][split]) for d in domains])


def quick_eval(ctx: RunContext, params, stage) -> dict[str, float]:
    """Greedy pass@1 on the first `stage.eval_n` held-out examples of each of the stage's domains."""
    out = {}
    for domain in stage.domains:
        res = evaluation.evaluate(params, ctx.model_cfg, ctx.tokenizer, ctx.test_records(domain, stage.eval_n),
                                         ctx.pool, rng=jax.random.key(0), **eval_settings(ctx))
        out[f"eval/{domain}/pass@1"] = res["pass@1"]
    return out


def eval_settings(ctx: RunContext) -> dict:
    e = ctx.cfg.eval
    return dict(batch_size=e.batch_size, max_prompt_len=e.max_prompt_len, max_new_tokens=e.max_new_tokens,
                thinking=ctx.cfg.thinking, mesh=ctx.mesh)


class Trainer:
    """One stage's training state on the mesh, its jitted step, checkpoints and metrics.

    Use as a context manager around the step loop: leaving it with an exception (Ctrl-C, preemption
    signal turned into KeyboardInterrupt, an error) saves a checkpoint of the last completed step first.
    """

    def __init__(self, ctx: RunContext, name: str, stage, params, tx, step_fn: Callable, data_iter=None,
                 extra_state_fns: tuple[Callable, Callable] | None = None):
        self.ctx, self.name, self.stage, self.data_iter = ctx, name, stage, data_iter
        mesh = ctx.mesh
        rng = jax.random.fold_in(jax.random.key(ctx.cfg.seed), stage_index(ctx, name))
        state_shape = jax.eval_shape(lambda p: train_state.create(p, tx, rng), params)
        self.state_shardings = train_state.shardings(state_shape, ctx.param_shardings, mesh)
        self.ckpt = checkpoint.StageCheckpointer(os.path.join(ctx.workdir, "checkpoints", name),
                                                 save_interval_steps=max(int(stage.checkpoint_every), 1))
        self._extra = extra_state_fns  # (get, set) of extra host state to checkpoint (e.g. filters)
        latest = self.ckpt.latest_step()
        if latest is not None:
            abstract = checkpoint.abstract_like(state_shape, self.state_shardings)
            self.state, data_state = self.ckpt.restore(abstract, latest)
            if data_iter is not None and data_state.get("iterator") is not None:
                data_iter.set_state(data_state["iterator"])
            if self._extra and data_state.get("extra") is not None:
                self._extra[1](data_state["extra"])
            ctx.log.truncate_after(name, latest - 1)
            print(f"[{name}] resumed from checkpoint step {latest}", file=sys.stderr)
        else:
            self.state = jax.jit(lambda p: train_state.create(p, tx, rng), out_shardings=self.state_shardings)(params)
            ctx.log.truncate_after(name, -1)
        self._data_state = self._snapshot()
        self._step = jax.jit(step_fn, donate_argnums=0, out_shardings=(self.state_shardings, replicated(mesh)))
        self._bar = None

    # -- the loop
    def steps(self):
        start = int(self.state.step)
        self._bar = progress(range(start, self.stage.steps), desc=self.name, total=self.stage.steps - start)
        with self._bar:
            for step in self._bar:
                yield step
                self.ckpt.save(step + 1, self.state, self._data_state)

    def put(self, batch):
        return shard_batch(self.ctx.mesh, batch)

    def update(self, batch, *args) -> dict[str, float]:
        """One jitted step; returns the step's metrics on the host. The data state snapshot advances
        together with the model state so a checkpoint never pairs mismatched ones."""
        snapshot = self._snapshot()
        self.state, metrics = self._step(self.state, batch, *args)
        self._data_state = snapshot
        return {k: float(v) for k, v in to_host(metrics).items()}

    def log(self, step: int, metrics: dict):
        self.ctx.log.log_step(self.name, step, metrics)
        if hasattr(self._bar, "set_postfix"):
            self._bar.set_postfix({k: f"{v:.4g}" for k, v in metrics.items() if k in ("loss", "reward", "kl")},
                                  refresh=False)

    def finish(self):
        if self.ckpt.latest_step() != int(self.state.step):
            self.ckpt.save(int(self.state.step), self.state, self._data_state, force=True)
        self.ckpt.close()
        return self.state.params

    def _snapshot(self) -> dict:
        return {"iterator": self.data_iter.get_state() if self.data_iter is not None else None,
                "extra": self._extra[0]() if self._extra else None}

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            try:
                step = int(self.state.step)
                if self.ckpt.latest_step() != step:
                    self.ckpt.save(step, self.state, self._data_state, force=True)
                print(f"[{self.name}] interrupted: saved checkpoint at step {step}", file=sys.stderr)
            except Exception as err:  # donated buffers mid-step: the last periodic checkpoint stands
                print(f"[{self.name}] interrupted mid-step, could not save ({err}); resume will use "
                      f"checkpoint step {self.ckpt.latest_step()}", file=sys.stderr)
            self.ckpt.close()
        return False
