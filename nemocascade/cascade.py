"""The cascade driver: a run is a list of stage configs executed in order (METHOD.md "Stage order").

    setup(cfg, workdir) -> RunContext      mesh, data (tfds array_record), tokenizer, model config, logs
    run(cfg, workdir)                      for each stage: train (or skip if done), save its final
                                           params, evaluate *every* domain, write summary.json + plots

Handoff between stages: a stage starts from the main line (the last finished stage that is not a side
branch) or from the checkpoint its `handoff.init_from` names (the `handoff` part is read here alone);
`optim.state` resets the optimiser (default) or keeps the start stage's Adam state; each stage's data iterator
and RNG are seeded by its index in the run and checkpointed with it, so a run interrupted anywhere resumes in the
right stage at the right step.
Named checkpoints (stage finals, best held-out per domain) and the manifest: nemocascade/named_checkpoints.py.

Stage kinds are records in `nemocascade/stages/kinds.py` (defaults, checks, run); this module names none.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import time

import jax

from nemocascade import chat, checkpoint, files, held_out, hosts, interrupts, lora, named_checkpoints, optim, plots
from nemocascade import workdir as workdir_lib
from nemocascade.configs import stage_order
from nemocascade.data import tfds_builder
from nemocascade.errors import BadInput, unknown_keys
from nemocascade.mesh import make_mesh
from nemocascade.models import ModelConfig, count_params, init_params, init_sharded, param_shardings
from nemocascade.models import pretrained as pretrained_lib
from nemocascade.rewards.pool import VerifierPool
from nemocascade.run_log import RunLog, load_metrics
from nemocascade.stages import common, kinds, reward_sources
from nemocascade.tokenizer import load_or_train

CURVE_KEYS = ("loss", "reward", "response_len")  # and every quick-eval key (eval/<domain>/pass@1) a stage logged


def validate(cfg) -> None:
    """Fail fast with `errors.BadInput` naming the bad key, before any expensive work: every stage of the
    cascade is checked here, not when it starts an hour into the run."""
    try:
        order = stage_order(cfg)
    except (AttributeError, TypeError) as err:
        raise BadInput(f"config.stage_order: {err}") from None
    if not order:
        raise BadInput("config.stage_order is empty: name the stages to run (e.g. --config.stage_order=sft,grpo)")
    for name in order:
        if name not in cfg.stages:
            near = difflib.get_close_matches(name, list(cfg.stages), n=1)
            raise BadInput(f"config.stage_order names {name!r}, not in config.stages ({sorted(cfg.stages)})"
                           + (f"; did you mean {near[0]!r}?" if near else ""))
    if len(set(order)) != len(order):
        raise BadInput(f"config.stage_order repeats a stage: {order}")
    batch_axis = _batch_axis_size(cfg)
    for name in order:
        _validate_stage(cfg, name, cfg.stages[name], order[:order.index(name)], batch_axis)
    held_out.validate(cfg)
    if cfg.reward.num_workers < 0 or not cfg.reward.timeout_s > 0:
        raise BadInput(f"config.reward: num_workers must be >= 0 and timeout_s > 0, got {dict(cfg.reward)}")
    p = cfg.get("pretrained") or {}  # data_dir and tokenizer.path are outputs too (made when missing): not checked
    if p.get("kind") not in (None, "", "gguf", "hf"):
        raise BadInput(f"config.pretrained.kind={p.kind!r}; choose 'gguf', 'hf' or '' (train from scratch)")
    if p.get("kind") and p.get("path") and not files.is_local(p.path):
        raise BadInput(f"config.pretrained.path={p.path!r}: a checkpoint to import is read from a local path "
                       "(GGUF and safetensors are memory-mapped); copy it to this host first")
    if p.get("kind") and p.get("path") and not os.path.exists(p.path):
        raise BadInput(f"config.pretrained.path={p.path!r} does not exist")


def _handoff_problems(h) -> list[str]:
    unknown = unknown_keys("handoff", h.keys(), common.COMMON_DEFAULTS["handoff"])
    if unknown:
        return unknown
    if h.init_from is not None and not isinstance(h.init_from, str):  # a named ref is checked with the teachers'
        return [f"handoff.init_from must be None or a checkpoint name, got {h.init_from!r}"]
    return []


def _batch_axis_size(cfg) -> int:
    """Devices the leading batch dim is split over (data x fsdp of config.mesh)."""
    try:
        mesh = make_mesh(dict(cfg.mesh))
    except ValueError as err:
        raise BadInput(f"config.mesh={dict(cfg.mesh)}: {err}") from None
    return mesh.shape["data"] * mesh.shape["fsdp"]


def _validate_stage(cfg, name, stage, earlier, batch_axis) -> None:
    at = f"config.stages.{name}"
    try:
        kind = kinds.get(stage.kind)
    except KeyError:
        raise BadInput(f"{at}.kind={stage.kind!r} unknown; known kinds: {sorted(kinds.KINDS)}") from None
    problems = kind.check(stage, {e: cfg.stages[e] for e in earlier})
    if stage.steps < 0:
        problems.append(f"steps must be >= 0, got {stage.steps}")
    problems += optim.problems(stage.optim) + _handoff_problems(stage.handoff) + lora.problems(stage.lora)
    if stage.lora.rank and stage.optim.state == "keep":
        problems.append(f"lora.rank={stage.lora.rank}: a LoRA stage trains fresh adapters, so there are no Adam "
                        "moments to keep (optim.state='keep'); use 'reset'")
    rows = (stage.batch_size if "batch_size" in stage else
            stage.rollout.prompts_per_step * stage.rollout.group_size if "rollout" in stage else 0)
    if rows >= 1 and rows % batch_axis:
        key = "batch_size" if "batch_size" in stage else "rollout.prompts_per_step"
        problems.append(f"{key}: a global batch of {rows} rows does not split over the mesh's "
                        f"{batch_axis} data x fsdp devices")
    if problems:
        raise BadInput(f"{at}.{problems[0]}" + (f" (and {len(problems) - 1} more: "
                                                f"{'; '.join(problems[1:])})" if len(problems) > 1 else ""))
    for d in stage.domains:
        if d not in cfg.data.domains:
            raise BadInput(f"{at}.domains names {d!r}, not in config.data.domains ({sorted(cfg.data.domains)})")
    refs = {"handoff.init_from": stage.handoff.init_from} if stage.handoff.init_from else {}
    try:
        if kind.teacher_refs:
            refs |= {f"objective.teachers.{d}": r for d, r in kind.teacher_refs(stage).items()}
        reward_sources.verifiers(stage)  # unknown verifier names fail here, not mid-run
    except (KeyError, ValueError) as err:
        raise BadInput(f"{at}: {err.args[0] if err.args else err}") from None
    for key, ref in refs.items():
        prefix, _, target = ref.partition(":")
        ok = ((prefix == "stage" and (target in earlier or (target == "init" and cfg.get("eval_init"))))
              or (prefix == "best" and target and all(d in cfg.data.domains for d in target.split("+"))))
        if not ok:
            raise BadInput(f"{at}.{key}={ref!r}: expected 'stage:<an earlier stage>' (earlier: {earlier}; "
                           f"'stage:init' with config.eval_init), 'best:<domain>' or 'best:<domain>+<domain>...' "
                           f"(domains: {sorted(cfg.data.domains)})")


def validate_data(ctx: common.RunContext) -> None:
    """The checks that need the tokenizer and data (e.g. SFT rows that leave room for a response)."""
    for name in stage_order(ctx.cfg):
        stage = ctx.cfg.stages[name]
        check = kinds.get(stage.kind).check_data
        problem = check(ctx, name, stage) if check and stage.steps > 0 else None
        if problem:
            raise BadInput(f"config.stages.{name}.{problem}")


def _corpus(sources, n):
    """Texts the tokenizer is trained on: rendered prompts and completions of the train splits."""
    def texts():
        for per_split in sources.values():
            src = per_split["train"]
            for i in range(min(n, len(src))):
                r = src[i]
                yield chat.render_prompt(r["prompt"]) + chat.render_completion(r["reasoning"], r["response"])
    return texts


DATA_SEED_FROM_RUN = -1  # config.data.seed's default: the records are drawn with the run's seed


def data_seed(cfg) -> int:
    """The seed the domains' train/test/validation records are drawn with: `data.seed`, or the run's `seed` when
    it is -1 or absent. Fixing it (`--config.data.seed=0`) varies only training across a sweep's seeds, on one
    data draw: the way to share a finished stage (e.g. seed 0's SFT) between seeds without a test item of one
    seed's draw in another's training split."""
    seed = cfg.data.get("seed", DATA_SEED_FROM_RUN)
    return cfg.seed if seed < 0 else int(seed)


def setup(cfg, workdir: str, config_name: str, variant: str | None, changes=()) -> tuple[common.RunContext, object]:
    """(everything a stage needs, the params of `config.pretrained` or None); the caller has validated `cfg` and
    holds the workdir (see `run`); `changes`: the allowed config changes of a resume (a changed `variant` key among
    them lets the run log take the new variant)."""
    mesh = make_mesh(dict(cfg.mesh))
    data_dir = cfg.data.data_dir or os.path.join(workdir, "data")
    # process 0 builds the datasets (and trains the tokenizer) while the others wait, then they load them
    sources = hosts.lead_first("data", lambda: {
        d: tfds_builder.prepare(d, data_dir, dc.num_train, dc.num_test, data_seed(cfg), num_val=dc.get("num_val"),
                                **dc.opts.to_dict())
        for d, dc in cfg.data.domains.items()})
    pretrained = None
    if cfg.get("pretrained") and cfg.pretrained.kind:
        model_cfg, params, tokenizer = pretrained_lib.load(cfg.pretrained, mesh, **pretrained_lib.run_numerics(cfg))
        pretrained = params
    else:
        tok_path = cfg.tokenizer.path or os.path.join(workdir, "tokenizer.model")
        tokenizer = hosts.lead_first("tokenizer", lambda: load_or_train(
            tok_path, _corpus(sources, cfg.tokenizer.corpus_size), cfg.tokenizer.vocab_size))
        model_cfg = ModelConfig.from_dict({**cfg.model.to_dict(), "vocab_size": tokenizer.vocab_size})
    log = RunLog(workdir, config_name, variant, cfg.seed, variant_change=any(k == "variant" for k, _, _ in changes))
    hosts.barrier("run log read")  # every process starts from the same summary and metrics before any is written
    pool = VerifierPool(cfg.reward.num_workers, cfg.reward.timeout_s)
    shardings = param_shardings(model_cfg, mesh)
    try:
        ctx = common.RunContext(cfg, workdir, mesh, model_cfg, tokenizer, sources, log, shardings, pool,
                                named_checkpoints.NamedCheckpoints(os.path.join(workdir, "checkpoints")),
                                abstract_params(model_cfg, shardings), held_out.eval_sets(cfg, tokenizer))
        validate_data(ctx)
    except BaseException:
        pool.close()
        log.close()
        raise
    return ctx, pretrained


def _scores_of(ctx, stage_name, split_key="eval"):
    """The summary's `eval` (test) or `val` of a finished stage or of the starting model (the policy an `rm`
    stage hands on)."""
    if stage_name == "init":
        return ctx.log.summary["init"][split_key]
    return next(s[split_key] for s in ctx.log.summary["stages"] if s["name"] == stage_name)


def _pass1(scores: dict) -> dict:
    return {d: e["pass@1"] for d, e in scores.items()}


def _final_path(ctx, name):
    return os.path.join(ctx.workdir, "checkpoints", "final", name)


def run(cfg, workdir: str, config_name: str, variant: str | None = None, allow_changes=(),
        redo_from: str | None = None) -> dict:
    """Run (or resume) the whole cascade; returns the summary dict (also in workdir/summary.json).

    The workdir is locked for the run (one run per workdir) and a resume must use the config the workdir was
    started with, except keys matching a pattern in `allow_changes` (nemocascade/workdir.py).

    `redo_from=STAGE` first discards STAGE and every stage that finished after it (`_redo_from`), then resumes:
    a finished prefix (SFT, the first RL stages) continues another way, e.g. with MOPD moved earlier, without
    training the prefix again. Config keys of the discarded stages (and `stage_order`) may then change when
    `allow_changes` names them; a kept stage's may not."""
    return _locked(cfg, workdir, allow_changes, lambda changes: _run_locked(cfg, workdir, config_name, variant,
                                                                           changes, redo_from))


def _redo_from(ctx, first: str, changes) -> None:
    """Discard stage `first` and every stage recorded after it, as if they had never run: their summary entries,
    metrics.jsonl rows (TensorBoard hides their steps), step and final checkpoints, per-item scores, registry and
    manifest entries; and a stage cut short after them (or `first` itself, cut short before it finished), which a
    resume would otherwise continue. A stage of the config that has not run here is nothing to discard (a sweep's
    seeds stand at different stages). What is kept must stay what it was (no allowed change of a kept stage's keys)
    and must open the new stage order. `summary["redone"]` records what was discarded. Interrupted, the same
    command finishes it: the files go first, the summary's entries last."""
    recorded = [s["name"] for s in ctx.log.summary["stages"]]
    ckpt = os.path.join(ctx.workdir, "checkpoints")
    # a stage cut short leaves step checkpoints and metrics rows but no summary entry; resumed, it would continue
    partial = [n for n in ctx.log.logged_stages() if n not in recorded]
    partial += [n for n in files.listdir(ckpt) if files.isdir(os.path.join(ckpt, n)) and n not in
                ("final", "rm", *recorded, *partial)]
    if first in recorded:  # it, what finished after it, and what was cut short after them
        kept, dropped = recorded[:recorded.index(first)], recorded[recorded.index(first):] + partial
    elif first in partial or first in ctx.cfg.stages:  # not finished here (yet): only its own leftovers go
        kept, dropped = recorded, [first] if first in partial else []
    else:
        raise BadInput(f"--redo_from={first}: {ctx.workdir} has no stage of that name and the config none either; "
                       f"finished: {recorded or 'none'}")
    changed_kept = [k for k, _, _ in changes if k.startswith("stages.") and k.split(".")[1] in kept]
    if changed_kept:
        raise BadInput(f"--redo_from={first} keeps stage(s) {sorted({k.split('.')[1] for k in changed_kept})}, but "
                       f"their config changed ({changed_kept}); redo from the first changed stage instead")
    order = list(stage_order(ctx.cfg))
    if set(order[:len(kept)]) != set(kept):
        raise BadInput(f"--redo_from={first} keeps {kept}, but the stage order {order} does not begin with them")
    if not dropped:
        print(f"[redo] nothing to discard: {first!r} has not run in {ctx.workdir}", flush=True)
        return
    if hosts.is_lead():
        for name in dropped:
            for path in (os.path.join(ckpt, name), _final_path(ctx, name), os.path.join(ckpt, "rm", name)):
                files.rmtree(path)
            files.remove(held_out.item_scores_path(ctx, name))
        named_checkpoints.drop_from_manifest(ckpt, dropped)
    ctx.checkpoints.drop(dropped)  # every process forgets them; process 0 rewrites the registry
    ctx.log.summary.setdefault("redone", []).append({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "dropped": dropped})
    ctx.log.drop_stages(dropped)  # writes the summary
    print(f"[redo] discarded {dropped}; kept {kept}", flush=True)


def _locked(cfg, workdir, allow_changes, body):
    """`body(changes)` with `cfg` validated, the workdir locked (one run per workdir) and its recorded config
    checked against `cfg` (`changes`: the allowed ones, nemocascade/workdir.py)."""
    validate(cfg)
    lock = workdir_lib.WorkdirLock(workdir)
    if hosts.is_lead():  # flock is per host: one holder per run
        lock.acquire()
    try:
        changes = workdir_lib.check_config(workdir, cfg.to_dict(), allow_changes)
        hosts.barrier("config checked")  # every process has read the recorded config before process 0 replaces it
        return body(changes)
    finally:
        lock.release()


def _run_locked(cfg, workdir, config_name, variant, changes, redo_from=None) -> dict:
    t_start = time.time()
    ctx, pretrained = setup(cfg, workdir, config_name, variant, changes)
    try:
        with jax.sharding.use_abstract_mesh(ctx.mesh.abstract_mesh):  # traced on it (mesh.constrain)
            ckpt_dir = os.path.join(workdir, "checkpoints")
            if redo_from:
                _redo_from(ctx, redo_from, changes)
            named_checkpoints.check_manifest(ckpt_dir,
                                             named_checkpoints.manifest(cfg, reward_sources.verifiers, _teacher_refs))
            workdir_lib.save_config(workdir, cfg.to_dict())  # every resume check passed: this is the run's config now
            if changes:
                ctx.log.record_config_changes(changes)
                print("resumed with allowed config changes: " + ", ".join(f"{k} {o!r} -> {n!r}" for k, o, n in changes),
                      flush=True)
            init = pretrained if pretrained is not None else init_sharded(ctx.model_cfg, ctx.mesh,
                                                                          jax.random.key(cfg.seed))
            del pretrained  # the run owns `init` now
            print(f"model: {count_params(init) / 1e6:.2f}M params, vocab {ctx.model_cfg.vocab_size}, "
                  f"devices {ctx.mesh.shape}", flush=True)
            if cfg.get("eval_init") and not ctx.log.summary.get("init"):  # the starting model's scores ("before")
                checkpoint.save_params(_final_path(ctx, "init"), init)
                _evaluate_init(ctx, init)
            main = None  # the last finished main-line stage: where the next stage starts by default
            loaded = (None, init)  # (stage name, params) in memory, so a handoff does not reload from disk
            for name in stage_order(cfg):
                interrupts.check(f"before stage {name!r}")
                stage = cfg.stages[name]
                if ctx.log.stage_done(name):
                    print(f"[{name}] already done", flush=True)
                    main = main if stage.handoff.side_branch else name
                    continue
                start = ctx.checkpoints.stage_of(stage.handoff.init_from) if stage.handoff.init_from else main
                if start != loaded[0]:
                    path = ctx.checkpoints.path(f"stage:{start}")
                    loaded = (start, checkpoint.load_params(path, ctx.abstract_params))
                kind = kinds.get(stage.kind)
                refs = _teacher_refs(stage)
                teacher_stages = {d: f"stage:{ctx.checkpoints.stage_of(r)}" for d, r in refs.items()} if refs else None
                t0 = time.time()
                params = kind.run(dataclasses.replace(ctx, start_stage=start), name, stage, loaded[1])
                checkpoint.save_params(_final_path(ctx, name), params)
                _evaluate_stage(ctx, name, params, start, teacher_stages, train_s=time.time() - t0, t0=t0)
                if not stage.handoff.side_branch:
                    main, loaded = name, (name, params)
            ctx.log.finish(ctx.log.wall_s_before + time.time() - t_start)  # a resume adds to the earlier processes'
            return ctx.log.summary
    finally:
        ctx.pool.close()
        ctx.log.close()


def _evaluate_init(ctx, init, wall_s=None) -> None:
    """The starting model's test and validation scores (`summary["init"]`, registry name `stage:init`)."""
    t0 = time.time()
    scores, val, _ = held_out.evaluate_and_keep_items(ctx, "init", init)
    ctx.checkpoints.add_stage("init", _final_path(ctx, "init"), _pass1(val))  # chosen on validation
    ctx.log.set_init(scores, time.time() - t0 if wall_s is None else wall_s, val=val)
    print("[init] held-out: " + ", ".join(f"{d} {e['pass@1']:.3f}" for d, e in scores.items()), flush=True)


def _evaluate_stage(ctx, name, params, start, teacher_stages, *, train_s, t0=None, wall_s=None) -> None:
    """Stage `name`'s evaluation and its summary entry: test and validation scores of its final `params` (or of
    its `start`, for a stage that trains no policy), the registry's validation scores, paired gains over `start`,
    the teachers' scores, the tables and plots. The entry's wall time is `wall_s`, or the time since `t0`."""
    stage = ctx.cfg.stages[name]
    reuse = not kinds.get(stage.kind).trains_policy and start is not None
    scores, val, items = ((_scores_of(ctx, start), _scores_of(ctx, start, "val"), None) if reuse
                          else held_out.evaluate_and_keep_items(ctx, name, params, stage))
    # `best:<domain>` is chosen on validation scores, never on the test split the tables report
    ctx.checkpoints.add_stage(name, _final_path(ctx, name), _pass1(val), stage.handoff.side_branch,
                              started_from=start)
    extra = {"val": val, "train_wall_s": train_s, "side_branch": bool(stage.handoff.side_branch), "started_from": start}
    if reuse:  # what the stage trained is judged by its own held-out metrics (RM pairwise accuracy)
        rows = [r for r in load_metrics(os.path.join(ctx.workdir, "metrics.jsonl")) if r["stage"] == name]
        extra["stage_eval"] = {k: v for k, v in rows[-1].items() if k.startswith("eval/")} if rows else {}
    if items is not None:  # paired against what the stage started from (docs/run_output.md: paired differences)
        before = start or ("init" if ctx.log.summary.get("init") else None)
        extra["paired_vs_start"], avg_k = held_out.split_avg_k(held_out.paired_gains(ctx, before, items))
        if avg_k:  # each item's k-sample mean, paired with the start's on the same items
            extra["paired_vs_start_avg@k"] = avg_k
    if teacher_stages:
        extra["teacher_scores"] = {d: ctx.checkpoints.score(t, d) for d, t in teacher_stages.items()}
    ctx.log.end_stage(name, stage.kind, list(stage.domains), int(stage.steps),
                      time.time() - t0 if wall_s is None else wall_s, scores, teachers=teacher_stages, **extra)
    _report(ctx, name, scores)


def rescore(cfg, workdir: str, config_name: str, variant: str | None = None, allow_changes=()) -> dict:
    """Evaluate a run's finished stages again, without training: each from its final params
    (checkpoints/final/<stage>, and the starting model's if it was scored), with the evaluation as it is now
    (after a change to the evaluation code, or to `eval.*` keys named in `allow_changes`). Rewrites what reports
    them: each stage's test and validation scores, paired gains and teacher scores in summary.json (wall times
    stay as trained), eval_scores/, the registry's validation scores, the tables and plots.

    What the run chose while it trained stands: a MOPD stage keeps the teachers it was distilled from (the
    summary's `teachers`), even if the new validation scores would choose others; a later resume chooses with
    the new scores. `summary["rescored"]` lists when, and the evaluation keys then."""
    return _locked(cfg, workdir, allow_changes, lambda changes: _rescore_locked(cfg, workdir, config_name, variant,
                                                                               changes))


def _rescore_locked(cfg, workdir, config_name, variant, changes) -> dict:
    path = os.path.join(workdir, "summary.json")
    done = files.read_json(path).get("stages") if files.exists(path) else None
    if not done:  # before `setup`, which would build data and a tokenizer
        raise BadInput(f"{workdir}: no finished stage to rescore ({path} lists none)")
    missing = [e["name"] for e in done if not files.exists(os.path.join(workdir, "checkpoints", "final", e["name"]))]
    if missing:
        raise BadInput(f"{workdir}: no final params for finished stage(s) {missing} under checkpoints/final")
    ctx, _ = setup(cfg, workdir, config_name, variant, changes)
    try:
        with jax.sharding.use_abstract_mesh(ctx.mesh.abstract_mesh):  # traced on it (mesh.constrain)
            workdir_lib.save_config(workdir, cfg.to_dict())
            ctx.log.record_config_changes(changes)
            ctx.checkpoints.clear()  # rebuilt, stage by stage, from the new validation scores
            load = lambda name: checkpoint.load_params(_final_path(ctx, name), ctx.abstract_params)  # noqa: E731
            if ctx.log.summary.get("init"):
                _evaluate_init(ctx, load("init"), wall_s=ctx.log.summary["init"]["wall_s"])
            for entry in done:
                name = entry["name"]
                interrupts.check(f"before rescoring stage {name!r}")
                _evaluate_stage(ctx, name, load(name), entry.get("started_from"), entry.get("teachers"),
                                train_s=entry.get("train_wall_s", entry["wall_s"]), wall_s=entry["wall_s"])
            ctx.log.summary.setdefault("rescored", []).append(
                    {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "eval": cfg.eval.to_dict()})
            ctx.log.finish(ctx.log.wall_s_before or sum(e["wall_s"] for e in done))  # as trained, not rescoring's
            return ctx.log.summary
    finally:
        ctx.pool.close()
        ctx.log.close()


def abstract_params(model_cfg, shardings):
    """The shapes and shardings of a run's params (what `checkpoint.load_params` restores into)."""
    return checkpoint.abstract_like(jax.eval_shape(functools.partial(init_params, model_cfg), jax.random.key(0)),
                                    shardings)


def _teacher_refs(stage) -> dict[str, str] | None:
    """domain -> teacher checkpoint ref of a distilling stage; None for kinds without teachers."""
    refs = kinds.get(stage.kind).teacher_refs
    return refs(stage) if refs else None


def _report(ctx, name, scores):
    print(f"[{name}] held-out: " + ", ".join(f"{d} {s['pass@1']:.3f} (n={s['n']})" for d, s in scores.items()),
          flush=True)
    if hosts.is_lead():
        _write_tables_and_plots(ctx)


def _write_tables_and_plots(ctx):
    plot_dir = os.path.join(ctx.workdir, "plots")
    metrics = os.path.join(ctx.workdir, "metrics.jsonl")
    rows = files.read_text(metrics).splitlines() if files.exists(metrics) else []
    keys = [k for k in CURVE_KEYS if any(f'"{k}"' in r for r in rows)]
    keys += sorted({k for r in rows for k in re.findall(r'"(eval/[^"]+/pass@1)"', r)})
    if keys:
        plots.plot_metric_curves(metrics, os.path.join(plot_dir, "curves.png"), keys, smooth=5)
    plots.plot_eval_by_stage(ctx.log.summary, os.path.join(plot_dir, "eval_by_stage.png"))
    cmp = ctx.cfg.get("compare")  # arms from one checkpoint on one plot (mopd_vs_grpo)
    if cmp and all(ctx.log.stage_done(s) for s in cmp.stages):
        start = [r[cmp.key] for r in load_metrics(metrics) if r["stage"] == cmp.start_stage and cmp.key in r]
        plots.plot_stage_comparison(metrics, os.path.join(plot_dir, f"{ctx.cfg.name}.png"), list(cmp.stages),
                                    cmp.key, start=start[-1] if start else None,
                                    title=f"{cmp.key}: arms from {cmp.start_stage}")
    table = plots.eval_table_markdown(ctx.log.summary)
    paired = plots.paired_table_markdown(ctx.log.summary)
    if paired:
        table += ("\n\nPaired gain over the stage's start on the same test items (points, paired bootstrap 95% "
                  "interval; bold: the stage's own domains)\n\n" + paired)
    paired = plots.paired_table_markdown(ctx.log.summary, "paired_vs_start_avg@k")
    if paired:
        table += ("\n\nPaired avg@k gain over the stage's start (each item's mean over its k samples; points, paired "
                  "bootstrap 95% interval)\n\n" + paired)
    files.atomic_write(os.path.join(ctx.workdir, "eval_table.md"), table + "\n")
