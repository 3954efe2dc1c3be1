"""What every stage kind shares: the run context, and a `Trainer` that owns one stage's state,
jitted step, checkpoints (periodic, final, and on interruption), resume and logging.

A stage kind module (`sft.py`, `grpo.py`, ...) builds its step function and its data iterator, then
drives `Trainer.steps()`; everything about *where* state lives and how it survives a crash is here.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import resource
import sys
from typing import Any, Callable

import grain
import jax
import ml_collections
import optax

from nemocascade import checkpoint, compiles, evaluation, interrupts, lora, optim, train_state
from nemocascade.data import domains, pipeline
from nemocascade.configs import stage_order
from nemocascade.errors import Diverged, RunStop
from nemocascade.mesh import replicated, shard_batch, to_host
from nemocascade.models import ModelConfig
from nemocascade.run_log import RunLog, progress

COMMON_DEFAULTS = dict(
    kind="", domains=("math",), steps=100, checkpoint_every=50, eval_n=64, eval_every=0,
    # Where the stage starts, read by the driver (nemocascade/cascade.py): the main line's params (the last
    # finished stage that is not a side branch) unless `init_from` names a checkpoint ("stage:sft", "best:math";
    # nemocascade/named_checkpoints.py). A `side_branch` stage does not advance the main line.
    handoff=dict(init_from=None, side_branch=False),
    # LoRA (nemocascade/lora.py): rank > 0 trains low-rank adapters on the `targets` matrices, the start params
    # frozen; the stage hands on (and saves as final) the merged params. 0: every param trains
    lora=dict(lora.DEFAULTS),
)


@dataclasses.dataclass(frozen=True)
class StageKind:
    """Everything the driver knows about a stage kind; each kind module defines one as `KIND` and
    `stages/kinds.py` registers it (an experiment adds its own with `kinds.register`)."""
    name: str
    defaults: dict  # the kind's config keys and defaults, on top of COMMON_DEFAULTS
    run: Callable  # (ctx, name, stage, params) -> params the next stage starts from
    check: Callable  # (stage, earlier: {name: stage config} of the stages before it) -> list of "key: problem"
    #                 strings (empty: fine); run for every stage before anything trains
    check_data: Callable | None = None  # (ctx, name, stage) -> problem or None, once tokenizer and data exist
    teacher_refs: Callable | None = None  # stage -> {domain: checkpoint ref}, for kinds that distil
    trains_policy: bool = True  # False: trains something else (a reward model) and hands the policy on unchanged


@dataclasses.dataclass(frozen=True)
class RunContext:
    """Everything a stage needs from the run; built once, complete, by `nemocascade.cascade.setup`. The driver
    hands each stage a copy with its `start_stage` (`dataclasses.replace`); nothing below assigns to it."""
    cfg: ml_collections.ConfigDict
    workdir: str
    mesh: jax.sharding.Mesh
    model_cfg: ModelConfig
    tokenizer: Any
    sources: dict[str, dict[str, Any]]  # domain -> split -> record source
    log: RunLog
    param_shardings: Any
    pool: Any  # rewards.pool.VerifierPool
    checkpoints: Any = None  # named_checkpoints.NamedCheckpoints: `stage:<name>`, `best:<domain>` -> a checkpoint
    abstract_params: Any = None  # ShapeDtypeStructs with shardings, to load any named checkpoint
    eval_sets: dict = dataclasses.field(default_factory=dict)  # name -> (records, number left out as too long)
    start_stage: str | None = None  # the stage whose params (and optimizer state) the current stage starts from

    def records(self, domain: str, split: str, n: int | None = None) -> list[dict]:
        """The first `n` (all: None) records of a domain's split ("train", "val", "test")."""
        src = self.sources[domain][split]
        n = len(src) if n is None else min(n, len(src))
        return [src[i] for i in range(n)]

    def eval_records(self, domain: str, split: str, n: int | None = None) -> list[dict]:
        """The first `n` distinct problems of a split (every one, if it holds fewer), for evaluation: a generator
        may draw the same problem twice (a small problem space), or in another surface wording (its canonical key,
        `domains.problem_key`, is the same), and a repeat is not a new independent item: counting it would shrink
        every interval. So the configs generate more test and validation records than they score. `n` in
        summary.json is the number of distinct problems scored."""
        return domains.first_distinct(self.sources[domain][split], n)  # the split holds more than are scored


PARTS = ("handoff", "optim", "lora", "rollout", "objective", "filters", "reward", "episodes", "prefilter")


def stage_config(kind: str, kind_defaults: dict, **overrides) -> ml_collections.ConfigDict:
    """A stage's ConfigDict: common keys + the kind's defaults + `optim`, then `overrides`; an override of a part
    (`PARTS`: `rollout=dict(group_size=16)`) sets that dict's keys, the rest keep their defaults (a dict value
    inside a part, `objective.terms`, replaces the default's whole). Unknown keys are
    an error naming them (ConfigDict is locked); unknown keys inside a part are reported by validation, naming the
    stage, by the module that reads the part."""
    cfg = ml_collections.ConfigDict({**COMMON_DEFAULTS, **kind_defaults, "kind": kind,
                                     "optim": dict(optim.DEFAULTS)})
    cfg.domains = list(cfg.domains)
    for key, value in overrides.items():
        if key not in cfg:
            raise KeyError(f"stage of kind {kind!r} has no key {key!r}; keys: {sorted(cfg.keys())}")
        if key in PARTS:  # its keys one by one; a dict inside (objective.terms) is replaced whole
            for k, v in dict(value).items():
                cfg[key][k] = v
        else:
            cfg[key] = value
    cfg.lock()
    return cfg


def prompt_stream(ctx: RunContext, name: str, stage, records: list[dict] | None = None):
    """(iterator of `rollout.prompts_per_step` train records of the stage's domains, records per epoch) for an
    RL stage; seeded by the stage's index so each stage of a run sees its own order. `records`: draw from these
    instead (a prefiltered set)."""
    r = stage.rollout
    source = records if records is not None else mixture_source(ctx, stage.domains, "train", r.mix)
    batches = pipeline.prompt_dataset(source, r.prompts_per_step, seed=ctx.cfg.seed + stage_index(ctx, name))
    return iter(batches), len(source)


def stage_index(ctx: RunContext, name: str) -> int:
    """Position of the stage in the run (seeds its data order and RNG)."""
    return stage_order(ctx.cfg).index(name)


def optimizer(stage):
    return optim.make_optimizer(stage.optim, stage.steps)


def mixture_source(ctx: RunContext, domains, split: str, weights=None):
    """One domain's source, or an interleaving of several (grain MapDataset.mix): equal shares, or in
    proportion to `weights` (domain -> weight > 0; domains not named weigh 1)."""
    missing = [d for d in domains if d not in ctx.sources]
    if missing:
        raise KeyError(f"stage asks for domain(s) {missing} but the run prepared {sorted(ctx.sources)}; "
                       f"add them to config.data")
    weights = dict(weights or {})
    unknown, nonpositive = pipeline.bad_mix_weights(domains, weights)
    if unknown or nonpositive:
        problems = ([f"domains not in the stage {sorted(unknown)}"] if unknown else []) + (
            [f"non-positive {nonpositive}"] if nonpositive else [])
        raise ValueError(f"mixture weights: {' and '.join(problems)}; the stage's domains are {list(domains)}")
    if len(domains) == 1:
        return ctx.sources[domains[0]][split]
    return grain.MapDataset.mix([grain.MapDataset.source(ctx.sources[d][split]) for d in domains],
                                weights=[float(weights.get(d, 1.0)) for d in domains])


def quick_eval(ctx: RunContext, params, stage) -> dict[str, float]:
    """Greedy pass@1 on the first `stage.eval_n` validation examples of each of the stage's domains (what a run
    watches and may choose on; the test split is for the tables)."""
    out = {}
    for domain in stage.domains:
        res = evaluation.evaluate(params, ctx.model_cfg, ctx.tokenizer, ctx.eval_records(domain, "val", stage.eval_n),
                                         ctx.pool, rng=jax.random.key(0), **eval_settings(ctx, domain))
        out[f"eval/{domain}/pass@1"] = res["pass@1"]
    return out


def eval_settings(ctx: RunContext, domain: str | None = None) -> dict:
    """Sampling settings of held-out evaluation: `config.eval`, where a domain's data config may raise
    `max_prompt_len` / `max_new_tokens` (long-context inputs)."""
    e = ctx.cfg.eval
    out = dict(batch_size=e.batch_size, max_prompt_len=e.max_prompt_len, max_new_tokens=e.max_new_tokens,
               thinking=ctx.cfg.thinking, mesh=ctx.mesh)
    dc = ctx.cfg.data.domains.get(domain) if domain else None
    return out | {k: dc[k] for k in ("max_prompt_len", "max_new_tokens") if dc is not None and dc.get(k)}


def peak_rss_mb() -> float:
    """The process's resident-memory peak so far, MiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)


def tree_bytes(tree) -> int:
    """Bytes of a pytree's arrays (global shapes: the whole array however it is sharded)."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree) if hasattr(x, "dtype"))


class Trainer:
    """One stage's training state on the mesh, its jitted step, checkpoints and metrics.

    With `stage.lora.rank` > 0 the state holds LoRA adapters (replicated) and their optimiser state, not the
    params: those stay frozen, every step receives them (`lora.over_adapters`), checkpoints store only the adapters (a
    resume is handed the same start params by the driver), and `params` / `finish()` give the merged params.

    Use as a context manager around the step loop. SIGINT/SIGTERM (`nemocascade.interrupts`) stop the loop at
    the next step boundary, after that step's metrics row and a checkpoint are written; leaving it with any other
    exception (a second Ctrl-C, an error) saves a checkpoint of the last completed step first. Updates that are
    not finite are skipped (`train_state.make_step`) and `optim.max_nonfinite_steps` of them in a row stop the run.
    """

    def __init__(self, ctx: RunContext, name: str, stage, params, tx, loss: Callable, data_iter=None,
                 extra_state_fns: tuple[Callable, Callable] | None = None, param_shardings=None, **step_options):
        """`loss(params, rows, shared) -> (scalar, metrics)`: the stage's, stepped by `train_state.make_step` with
        `step_options` (prepare, micro_batches). `param_shardings`: shardings of `params` when they are not the
        policy's (e.g. a reward model); default `ctx.param_shardings`."""
        self.ctx, self.name, self.stage, self.data_iter = ctx, name, stage, data_iter
        mesh = ctx.mesh
        rng = jax.random.fold_in(jax.random.key(ctx.cfg.seed), stage_index(ctx, name))
        shardings = ctx.param_shardings if param_shardings is None else param_shardings
        self._frozen, self._merge = (), None  # LoRA: (the base,) that every step receives; the jitted merge
        if stage.lora.rank:
            params, shardings, loss = self._use_lora(params, shardings, loss, jax.random.split(rng)[1])
        state_shape = jax.eval_shape(lambda p: train_state.create(p, tx, rng), params)
        self.state_shardings = train_state.shardings(state_shape, shardings, mesh)
        self.ckpt = checkpoint.StageCheckpointer(os.path.join(ctx.workdir, "checkpoints", name),
                                                 save_interval_steps=max(int(stage.checkpoint_every), 1))
        self._extra = extra_state_fns  # (get, set) of extra host state to checkpoint (e.g. filters)

        def init():
            state = jax.jit(lambda p: train_state.create(p, tx, rng), out_shardings=self.state_shardings)(params)
            if stage.optim.state == "keep" and ctx.start_stage is not None:
                state = state.replace(opt_state=self._carried_opt_state(state))
            return state
        abstract = checkpoint.abstract_like(state_shape, self.state_shardings)
        self.state, data_state = self.ckpt.restore_or_init(abstract, init)
        if data_iter is not None and data_state.get("iterator") is not None:
            data_iter.set_state(data_state["iterator"])
        if self._extra and data_state.get("extra") is not None:
            self._extra[1](data_state["extra"])
        ctx.log.truncate_after(name, int(self.state.step) - 1)  # the rows of steps a resume runs again
        if data_state:
            print(f"[{name}] resumed from checkpoint step {int(self.state.step)}", file=sys.stderr)
        self._data_state = self._snapshot()
        step = train_state.make_step(loss, tx, grad_clip=stage.optim.grad_clip, **step_options)
        self._step = jax.jit(step, donate_argnums=0,
                             out_shardings=(self.state_shardings, replicated(mesh)))
        self._advance = jax.jit(lambda s: s.replace(step=s.step + 1), donate_argnums=0)
        self._bar = None
        self._nonfinite_run = 0  # consecutive skipped steps
        self._diverged = ""  # why the run must stop after the current step, once too many were skipped
        self._compiles = compiles.Since()  # XLA compilations per logged step (metrics: compiles, compile_s)
        # memory (metrics: state_mb, peak_rss_mb): what the optimiser updates and keeps (params or LoRA adapters,
        # Adam moments), and the process's resident peak so far (`peak_rss_mb`: a run's earlier stages count)
        self._state_mb = tree_bytes(self.state) / 2**20

    def _use_lora(self, params, shardings, loss, rng):
        """LoRA: keep `params` as the frozen base; -> (fresh adapters, their shardings (replicated), the loss over
        adapters)."""
        lo, mesh = self.stage.lora, self.ctx.mesh
        try:
            adapters = jax.jit(lambda r: lora.init(r, params, self.ctx.model_cfg, lo.rank, lo.targets),
                               out_shardings=replicated(mesh))(rng)
        except ValueError as err:  # targets that name no matrix of this model
            raise ValueError(f"config.stages.{self.name}.{err}") from None
        self._frozen = (params,)
        self._merge = jax.jit(functools.partial(lora.merge, alpha=lo.alpha, rank=lo.rank), out_shardings=shardings)
        return adapters, jax.tree.map(lambda _: replicated(mesh), adapters), lora.over_adapters(loss, lo.alpha, lo.rank)

    def _carried_opt_state(self, fresh):
        """optim.state="keep": the optimiser state the start stage ended with (Adam moments and count),
        with this stage's schedule counters reset so its warm-up and decay run from its own step 0."""
        src = self.ctx.start_stage
        prev = checkpoint.StageCheckpointer(os.path.join(self.ctx.workdir, "checkpoints", src))
        try:
            if prev.latest_step() is None:
                raise FileNotFoundError(f"no checkpoint in {prev.directory}")
            old, _ = prev.restore(checkpoint.abstract_like(fresh, self.state_shardings))
        except Exception as err:
            raise ValueError(f"config.stages.{self.name}.optim.state='keep': cannot take the optimiser state "
                             f"of stage {src!r} ({type(err).__name__}: {err}). Both stages need the same optimiser "
                             f"structure (grad_clip on/off, AdamW); use 'reset' otherwise.") from err
        finally:
            prev.close()
        own = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731  (schedule counters restart)
        return jax.tree.map(lambda new, o: new if own(new) else o, fresh.opt_state, old.opt_state, is_leaf=own)

    # -- the loop
    def steps(self):
        start = int(self.state.step)
        self._bar = progress(range(start, self.stage.steps), desc=self.name, total=self.stage.steps - start)
        with self._bar:
            for step in self._bar:
                yield step
                signalled = interrupts.requested()
                self.ckpt.save(step + 1, self.state, self._data_state, force=bool(signalled or self._diverged))
                if self._diverged:
                    raise Diverged(self._diverged)
                if signalled:
                    interrupts.check(f"after {self.name} step {step + 1}/{self.stage.steps} (checkpoint saved)")

    def put(self, batch):
        return shard_batch(self.ctx.mesh, batch)

    def lower_step(self, batch):
        """The step lowered for `batch` (arrays or their shapes), as `update` would run it (`preflight`)."""
        return self._step.lower(self.state, batch, *self._frozen)

    def update(self, batch, *args) -> dict[str, float]:
        """One jitted step; returns the step's metrics on the host. The data state snapshot advances
        together with the model state so a checkpoint never pairs mismatched ones."""
        snapshot = self._snapshot()
        self.state, metrics = self._step(self.state, batch, *self._frozen, *args)
        self._data_state = snapshot
        metrics = {k: float(v) for k, v in to_host(metrics).items()}
        if not metrics["skipped_nonfinite"]:
            self._nonfinite_run = 0
            return metrics
        self._nonfinite_run += 1
        step = int(self.state.step) - 1
        bad = {k for k, v in metrics.items() if not math.isfinite(v)}
        what = sorted(bad) or ["params"]  # finite loss and gradient: the new params were not
        print(f"[{self.name}] step {step}: non-finite {what}, update skipped "
              f"({self._nonfinite_run}/{self.stage.optim.max_nonfinite_steps} in a row)", file=sys.stderr)
        if self._nonfinite_run >= self.stage.optim.max_nonfinite_steps:  # `steps` stops after this step is logged
            self._diverged = (f"stage {self.name!r}: {self._nonfinite_run} non-finite updates in a row (last at step "
                              f"{step}: {what}); stopped with the last good params in checkpoint "
                              f"{self.ckpt.directory}/{int(self.state.step)}. Lower config.stages.{self.name}.optim.lr "
                              "or raise optim.max_nonfinite_steps")
        return {k: v for k, v in metrics.items() if k not in bad}  # NaN has no place in metrics.jsonl

    def skip(self) -> dict:
        """A step with nothing to train on (every group filtered out): only the step counter moves."""
        self._data_state = self._snapshot()
        self.state = self._advance(self.state)
        return {}

    def log(self, step: int, metrics: dict):
        metrics = {**metrics, **self._compiles.take(), "state_mb": self._state_mb, "peak_rss_mb": peak_rss_mb()}
        self.ctx.log.log_step(self.name, step, metrics)
        if hasattr(self._bar, "set_postfix"):
            self._bar.set_postfix({k: f"{v:.4g}" for k, v in metrics.items() if k in ("loss", "reward", "kl")},
                                  refresh=False)

    @property
    def params(self):
        """The params the model applies now (sampling, evaluation): the state's, or with LoRA the base merged with
        the current adapters."""
        return self.state.params if self._merge is None else self._merge(self._frozen[0], self.state.params)

    def finish(self):
        """Save the last step (if not saved yet) and return the params the next stage starts from (`params`)."""
        if self.ckpt.latest_step() != int(self.state.step):
            self.ckpt.save(int(self.state.step), self.state, self._data_state, force=True)
        self.ckpt.close()
        return self.params

    def _snapshot(self) -> dict:
        return {"iterator": self.data_iter.get_state() if self.data_iter is not None else None,
                "extra": self._extra[0]() if self._extra else None}

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, RunStop):  # stopped on purpose, state already saved
            self.ckpt.close()
        elif exc_type is not None:
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
