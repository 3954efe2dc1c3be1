"""Find and load experiment configs: `NAME[:VARIANT]` (a file in experiments/configs/) or `PATH[:VARIANT]`.

Configs follow big_vision: `get_config(arg)` returns an `ml_collections.ConfigDict`; the text after the
colon is `arg`. Used by `experiments/run.py`, tests and notebooks alike. The pieces several configs share
(`math_base`, `multi_base`, `grpo_stage`, ...) live beside them in `experiments/configs/_common.py`: experiments
own them, and this library imports nothing from `experiments/`.
"""
from __future__ import annotations

import importlib.util
import os
import sys

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "configs")


def known_configs() -> list[str]:
    return sorted(f[:-3] for f in os.listdir(CONFIG_DIR) if f.endswith(".py") and not f.startswith("_"))


def resolve(spec: str) -> tuple[str, str | None]:
    """`NAME[:VARIANT]` or `PATH[:VARIANT]` -> (path to the config file, variant or None)."""
    name, _, variant = spec.partition(":")
    path = name if (name.endswith(".py") or os.sep in name) else os.path.join(CONFIG_DIR, name + ".py")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no config {name!r} (looked for {path}); known: {known_configs()}")
    return path, (variant or None)


def stage_order(cfg) -> list[str]:
    """Stage names in run order. ConfigDict iterates its keys sorted, so the order is explicit data:
    `config.stage_order` (a tuple, or a comma-separated string from the command line)."""
    return parse_stage_order(cfg.stage_order)


def parse_stage_order(order) -> list[str]:
    """A tuple of names, a comma-separated string, or both (`--config.stage_order=a,b` may arrive as ("a,b",))."""
    parts = [order] if isinstance(order, str) else list(order)
    return [s.strip() for p in parts for s in str(p).split(",") if s.strip()]


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}. An empty dict stays a leaf, so adding its first key is a change."""
    out = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out |= flatten(value, path + ".")
        else:
            out[path] = value
    return out


def add_import_dir(path: str) -> None:
    """Let the config file at `path` import its folder's shared pieces (`from _common import ...`), as it could
    when run as a script."""
    here = os.path.dirname(os.path.abspath(path))
    if here not in sys.path:
        sys.path.append(here)


def load(spec: str, **overrides):
    """The ConfigDict of `spec`, with dotted-key `overrides` applied (`{"stages.sft.steps": 5}`)."""
    path, variant = resolve(spec)
    module_spec = importlib.util.spec_from_file_location(f"nemocascade_config_{os.path.basename(path)[:-3]}", path)
    module = importlib.util.module_from_spec(module_spec)
    add_import_dir(path)
    module_spec.loader.exec_module(module)
    cfg = module.get_config(variant)
    for key, value in overrides.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        if leaf not in node:
            raise KeyError(f"config has no key {key!r}")
        node[leaf] = value
    return cfg
