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


def expand_list_overrides(argv: list[str], cfg) -> list[str]:
    """`--config.KEY=a,b` -> `--config.KEY=('a', 'b')` where `cfg`'s value at KEY is a tuple or list and the value is
    a bare comma-separated list (ml_collections parses only a Python literal for a tuple: `a,b` is refused and `a`
    becomes `('a',)`). Items that read as numbers become numbers; a value already in brackets, parentheses or quotes
    is left as it is."""
    flat = flatten(cfg.to_dict())
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if (eq and key.startswith("--config.") and isinstance(flat.get(key[len("--config."):]), (tuple, list))
                and "," in value and value.strip()[:1] not in ("(", "[", "'", '"')):
            arg = f"{key}={tuple(_number_or_text(v.strip()) for v in value.split(',') if v.strip())!r}"
        out.append(arg)
    return out


def _number_or_text(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


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


def smoke(cfg, steps: int = 4, n: int = 8):
    """`cfg` shrunk in place to seconds on a CPU, for notebooks run in CI and a first try of a fork: what such a run
    learns is not the config's result. A model trained from scratch becomes 1 layer of width 32 (a pretrained one
    keeps its architecture, cut to 2 layers); every domain 256 train and 64 test records, `n` evaluation items;
    every stage at most `steps` steps of small batches (SFT 4 rows; RL 2 prompts x 2 rollouts of up to 16 tokens),
    checkpointed and (where it evaluates during training) evaluated at its end; greedy evaluation only; verifiers
    inline. Returns `cfg`."""
    if cfg.get("pretrained") and cfg.pretrained.get("kind"):
        cfg.pretrained.num_layers = 2
    else:
        cfg.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)
    for domain in cfg.data.domains.values():
        domain.update(num_train=256, num_test=64)
        if "num_val" in domain:
            domain.num_val = 64
    cfg.eval.update(n=n, val_n=n, batch_size=n, max_new_tokens=min(cfg.eval.max_new_tokens, 24), avg_k=0)
    for agent in cfg.eval.get("agents", {}).values():
        agent.avg_k = 0
    if cfg.get("eval_init") is not None:
        cfg.eval_init = False
    cfg.reward.num_workers = 0
    for stage in cfg.stages.values():
        stage.steps = min(stage.steps, steps)
        stage.eval_n = min(stage.eval_n, n)
        if "batch_size" in stage:
            stage.batch_size = min(stage.batch_size, 4)
        for key in ("checkpoint_every", "eval_every"):  # once, at the stage's end (a curve of one point)
            if stage.get(key):
                stage[key] = max(stage.steps, 1)
        if "rollout" in stage:
            r = stage.rollout
            r.update(prompts_per_step=min(r.prompts_per_step, 2), group_size=min(r.group_size, 2),
                     max_new_tokens=min(r.max_new_tokens, 16), length_curriculum=((0, 16),))
            stage.objective.micro_batches = 1
        if "prefilter" in stage:
            stage.prefilter.prompts = None
    return cfg
