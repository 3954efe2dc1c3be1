"""The registry of stage kinds: name -> `common.StageKind` (defaults, checks, run). The driver looks kinds up
here and names none itself.

A new kind is one module with a `KIND = common.StageKind(...)` record, registered from wherever it lives (an
experiment's config file included) with `register(KIND)`; no library file changes.
"""
from __future__ import annotations

from nemocascade.stages import agent, common, grpo, mopd, rm, sft

KINDS: dict[str, common.StageKind] = {m.KIND.name: m.KIND for m in (sft, grpo, mopd, rm, agent)}


def register(kind: common.StageKind) -> common.StageKind:
    """Add `kind`. The same kind from the same module again (a config file loaded twice) replaces it; another
    module's kind under a taken name is a ValueError, so an experiment cannot shadow a kind by accident."""
    old = KINDS.get(kind.name)
    if old is not None and (old.run.__module__, old.run.__qualname__) != (kind.run.__module__, kind.run.__qualname__):
        raise ValueError(f"stage kind {kind.name!r} is already registered by {old.run.__module__}")
    KINDS[kind.name] = kind
    return kind


def stage_config(kind: str, **overrides):
    """A stage of a registered kind: the common keys, the kind's record defaults, then `overrides`."""
    return common.stage_config(kind, get(kind).defaults, **overrides)


def get(name: str) -> common.StageKind:
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown stage kind {name!r}; known kinds: {sorted(KINDS)}") from None
