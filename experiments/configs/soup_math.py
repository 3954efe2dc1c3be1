"""A stage kind defined in an experiment, not in the library: a weight-averaged "soup" of earlier checkpoints.

    SFT -> GRPO (main line) -> SFT continued from the SFT checkpoint (side branch) -> soup of grpo and the branch

`soup` averages the params of the checkpoints it names (`sources`, `weights`), the model-soup recipe
(Wortsman et al. 2022). The record below is all it takes: defaults, a check run before anything trains, and a
run function; `kinds.register` makes the driver see it, and it is evaluated on every domain like any stage.

    python experiments/run.py --config=soup_math
    python experiments/run.py --config=soup_math:tiny       # a few minutes (tests)
"""
import jax
import ml_collections

from nemocascade import checkpoint
from nemocascade.stages import common, kinds, sft

from cascade_math import get_config as cascade_math  # noqa: I001  the main job's config, then a soup on top

SOUP_DEFAULTS = dict(sources=(), weights=())  # checkpoint refs ("stage:<earlier>") and their weights (sum 1)


def check_soup(stage, earlier: dict) -> list[str]:
    bad = [] if len(stage.sources) >= 2 else [f"sources={list(stage.sources)}: a soup needs two checkpoints or more"]
    bad += [f"sources: {ref!r} is not 'stage:<an earlier stage>' (earlier: {list(earlier)})"
            for ref in stage.sources if not (ref.startswith("stage:") and ref[len("stage:"):] in earlier)]
    if len(stage.weights) != len(stage.sources) or abs(sum(stage.weights) - 1) > 1e-6 or min(stage.weights) < 0:
        bad.append(f"weights={list(stage.weights)}: one weight >= 0 per source, summing to 1")
    return bad


def run_soup(ctx, name, stage, params):
    """sum_i w_i * params_i over the named checkpoints (the stage's start `params` is not used)."""
    del params
    souped = None
    for ref, w in zip(stage.sources, stage.weights):
        p = checkpoint.load_params(ctx.registry.path(ref), ctx.abstract_params)
        souped = jax.tree.map(lambda x: w * x, p) if souped is None else jax.tree.map(lambda a, x: a + w * x, souped, p)
    print(f"[{name}] soup of " + ", ".join(f"{w:g} x {r}" for r, w in zip(stage.sources, stage.weights)), flush=True)
    return souped


kinds.register(common.StageKind("soup", SOUP_DEFAULTS, run_soup, check_soup))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = cascade_math(arg)
    c.name = "soup_math"
    c.stages.branch = common.stage_config(  # more SFT from the SFT checkpoint, at a lower LR, off the main line
        "sft", sft.DEFAULTS, domains=["math"], steps=c.stages.sft.steps // 4, batch_size=32,
        seq_len=c.stages.sft.seq_len, init_from="stage:sft", side_branch=True, checkpoint_every=100,
        optim=dict(lr=1e-3, schedule="cosine", warmup_steps=10, min_lr_frac=0.05))
    c.stages.soup = kinds.stage_config("soup", steps=0, sources=("stage:grpo", "stage:branch"), weights=(0.5, 0.5))
    c.stage_order = ("sft", "grpo", "branch", "soup")
    return c
