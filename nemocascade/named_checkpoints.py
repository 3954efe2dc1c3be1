"""Named checkpoints of a run (the teacher registry) and the manifest that pins what a run means.

MOPD's teachers come from the run itself (METHOD.md "MOPD"): the strongest validation checkpoint per
domain, any stage's final params, or a *side branch* (a stage trained from a named checkpoint without
advancing the main line, e.g. Cascade 2's RLHF teacher trained from SFT). Names:

    stage:<name>     the final params of stage <name> (main line or side branch)
    best:<domain>    the stage whose validation score on <domain> is the highest so far (ties keep the
                     earlier stage: Cascade 2's math teacher is the SFT checkpoint, not a later equal one)
    best:<d1>+<d2>   the stage whose mean validation score over those domains is the highest so far (ties keep
                     the earlier): one teacher for several domains, as Cascade 2's multi-domain teacher (the
                     best checkpoint after IF-RL and multi-domain RL serves IF, MCQ, tool calling and JSON)

Stages are evaluated on every domain when they end (``held_out.evaluate_all``); their *validation* scores
decide ``best:*`` (the test split only reports, so no winner's curse in a distilled stage's test row). The
registry lives in ``workdir/checkpoints/registry.json`` (rewritten atomically), so a resumed run resolves
every name exactly as the interrupted one did.

The manifest (``workdir/checkpoints/manifest.json``) records domain -> reward function and, per
distillation stage, domain -> teacher name, as the run was configured when it first started. Resuming the
same workdir with a different mapping would silently mix two experiments in one set of checkpoints, so
:func:`check_manifest` refuses, naming the key that changed.
"""
from __future__ import annotations

import json
import os

from nemocascade import files, hosts
from nemocascade.files import atomic_write

STAGE, BEST = "stage:", "best:"


class NamedCheckpoints:
    """`workdir/checkpoints/registry.json`: {"stages": {name: {...}}, "best": {domain: {...}}}."""

    def __init__(self, checkpoint_dir: str):
        self.dir = checkpoint_dir
        self.file = os.path.join(checkpoint_dir, "registry.json")
        self.data = {"stages": {}, "best": {}}
        if files.exists(self.file):
            self.data = files.read_json(self.file)

    def clear(self) -> None:
        """Forget every stage (in memory; the file is rewritten by the next `add_stage`): a rescore rebuilds the
        registry from new validation scores."""
        self.data = {"stages": {}, "best": {}}

    def drop(self, names) -> None:
        """Forget stages `names` (a redo discards them) and choose every `best:` again from the rest, in the order
        they were added (ties keep the earlier, as when they were added); rewrites the file."""
        kept = [(n, e) for n, e in self.data["stages"].items() if n not in set(names)]
        self.clear()
        for n, e in kept:
            self._add(n, self._resolve(e["path"]), e["scores"], e.get("side_branch", False), e.get("started_from"))
        self._write()

    def add_stage(self, name: str, params_path: str, scores: dict[str, float], side_branch: bool = False,
                  started_from: str | None = None) -> None:
        """Record stage `name`'s final params and held-out scores; update `best:<domain>`."""
        self._add(name, params_path, scores, side_branch, started_from)
        self._write()

    def _add(self, name, params_path, scores, side_branch, started_from) -> None:
        self.data["stages"][name] = {"path": _relative(params_path, self.dir), "scores": dict(scores),
                                     "side_branch": bool(side_branch), "started_from": started_from}
        for domain, score in scores.items():
            best = self.data["best"].get(domain)
            if best is None or score > best["score"]:
                self.data["best"][domain] = {"stage": name, "score": float(score)}

    def _write(self) -> None:
        if not hosts.is_lead():  # every process holds the same registry; process 0 writes it
            return
        atomic_write(self.file, json.dumps(self.data, indent=2) + "\n")

    def names(self) -> list[str]:
        return [STAGE + s for s in self.data["stages"]] + [BEST + d for d in self.data["best"]]

    def stage_of(self, ref: str) -> str:
        """The stage a name refers to now (`best:math` -> e.g. `math_rl`). KeyError lists the known names."""
        if ref.startswith(STAGE) and ref[len(STAGE):] in self.data["stages"]:
            return ref[len(STAGE):]
        if ref.startswith(BEST) and ref[len(BEST):] in self.data["best"]:
            return self.data["best"][ref[len(BEST):]]["stage"]
        if ref.startswith(BEST) and "+" in ref:
            domains = ref[len(BEST):].split("+")
            best, best_mean = None, None
            for name, entry in self.data["stages"].items():  # insertion order: ties keep the earlier stage
                if all(d in entry["scores"] for d in domains):
                    mean = sum(entry["scores"][d] for d in domains) / len(domains)
                    if best is None or mean > best_mean:
                        best, best_mean = name, mean
            if best is not None:
                return best
        hint = "" if ref.startswith((STAGE, BEST)) else f" (names start with {STAGE!r} or {BEST!r})"
        raise KeyError(f"no checkpoint named {ref!r}{hint}; known so far: {self.names() or 'none'}")

    def path(self, ref: str) -> str:
        return self._resolve(self.data["stages"][self.stage_of(ref)]["path"])

    def _resolve(self, recorded: str) -> str:
        """A recorded params path: relative to the checkpoint directory (so the workdir can move, or be resumed
        from another working directory)."""
        return recorded if not files.is_local(recorded) or os.path.isabs(recorded) else os.path.join(self.dir, recorded)

    def score(self, ref: str, domain: str) -> float | None:
        return self.data["stages"][self.stage_of(ref)]["scores"].get(domain)


def _relative(p: str, base: str) -> str:
    """`p` relative to directory `base` when it lies under it, else `p` unchanged."""
    if files.is_local(p) != files.is_local(base):
        return p
    if files.is_local(p):
        p, base = os.path.abspath(p), os.path.abspath(base)
    return os.path.relpath(p, base) if p.startswith(base.rstrip("/") + "/") else p


def manifest(cfg, rewards_of, teachers_of) -> dict:
    """What the run's checkpoints mean: domain -> reward (qualified function name) for the run's domains and
    for every stage's own reward overrides, and domain -> teacher name per distillation stage.

    `rewards_of(stage) -> {domain: fn}` and `teachers_of(stage) -> {domain: name} | None` come from the
    driver, so this module stays free of stage kinds."""
    def qualname(fn):
        return f"{fn.__module__}.{fn.__qualname__}"

    out = {"rewards": {}, "teachers": {}}
    for name, stage in cfg.stages.items():
        for domain, fn in rewards_of(stage).items():
            out["rewards"][f"{name}/{domain}"] = qualname(fn)
        t = teachers_of(stage)
        if t:
            out["teachers"][name] = dict(t)
    return out


def drop_from_manifest(checkpoint_dir: str, stages) -> None:
    """Forget what stages `stages` meant (a redo discards them; the next start records them as configured then)."""
    path = os.path.join(checkpoint_dir, "manifest.json")
    if not files.exists(path):
        return
    saved = files.read_json(path)
    gone = set(stages)
    saved["rewards"] = {k: v for k, v in saved.get("rewards", {}).items() if k.split("/")[0] not in gone}
    saved["teachers"] = {k: v for k, v in saved.get("teachers", {}).items() if k not in gone}
    atomic_write(path, json.dumps(saved, indent=2, sort_keys=True) + "\n")


def check_manifest(checkpoint_dir: str, current: dict) -> None:
    """Write the manifest on the first start; on a resume, fail if a mapping it already holds changed (new
    stages, e.g. arms added to a finished run, are added to it)."""
    path = os.path.join(checkpoint_dir, "manifest.json")
    if not files.exists(path):
        if hosts.is_lead():
            atomic_write(path, json.dumps(current, indent=2, sort_keys=True) + "\n")
        return
    saved = files.read_json(path)
    for section in ("rewards", "teachers"):
        old, new = saved.get(section, {}), current.get(section, {})
        for key in sorted(set(old) & set(new)):  # stages added to a run (or dropped from its end) are fine
            if old[key] != new[key]:
                raise ValueError(
                    f"{path}: this workdir was started with {section}[{key!r}] = {old.get(key)!r}, the config now "
                    f"says {new.get(key)!r}. Resuming would mix two experiments in one set of checkpoints: use a "
                    f"new --workdir, or restore the original mapping.")
    merged = {section: {**saved.get(section, {}), **current.get(section, {})} for section in ("rewards", "teachers")}
    if merged != saved and hosts.is_lead():  # a run extended by new stages records their mappings too
        atomic_write(path, json.dumps(merged, indent=2, sort_keys=True) + "\n")
