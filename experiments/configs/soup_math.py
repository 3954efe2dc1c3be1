"""A stage kind and an objective term defined in an experiment, not in the library.

    SFT -> GRPO + length term (main line) -> SFT continued from the SFT checkpoint (side branch)
        -> soup of grpo and the branch

`soup` averages the params of the checkpoints it names (`sources`, `weights`), the model-soup recipe
(Wortsman et al. 2022). The record below is all it takes: defaults, a check run before anything trains, and a
run function; `kinds.register` makes the driver see it, and it is evaluated on every domain like any stage.

`length` is a term of the GRPO stage's objective: log pi of the response tokens past LENGTH_BUDGET, so a
positive weight makes long answers less likely (a variant of cascade_math, which has no such term).
`objectives.register` is all it takes; the term is reduced, micro-batched and logged like the built-ins
(`term/length`, `weight/length`, and its diagnostic `over_budget`, the share of tokens past the budget).

    python experiments/run.py --config=soup_math
    python experiments/run.py --config=soup_math:tiny       # a few minutes (tests)
"""
import jax
import jax.numpy as jnp
import ml_collections

from nemocascade import checkpoint, objectives
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
        p = checkpoint.load_params(ctx.checkpoints.path(ref), ctx.abstract_params)
        souped = jax.tree.map(lambda x: w * x, p) if souped is None else jax.tree.map(lambda a, x: a + w * x, souped, p)
    print(f"[{name}] soup of " + ", ".join(f"{w:g} x {r}" for r, w in zip(stage.sources, stage.weights)), flush=True)
    return souped


kinds.register(common.StageKind("soup", SOUP_DEFAULTS, run_soup, check_soup))

LENGTH_BUDGET = 64  # response tokens; cascade_math's answers need far fewer


@objectives.register("length")
def length_penalty(x):
    """Per token: log pi(y_t) where y_t lies past LENGTH_BUDGET response tokens, else 0."""
    over = (jnp.cumsum(x["mask"], -1) > LENGTH_BUDGET) & (x["mask"] > 0)
    return jnp.where(over, x["logp"], 0.0), {"over_budget": over.astype(jnp.float32)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = cascade_math(arg)
    c.name = "soup_math"
    c.stages.grpo.objective.terms = dict(c.stages.grpo.objective.terms.to_dict(), length=0.05)
    c.stages.branch = common.stage_config(  # more SFT from the SFT checkpoint, at a lower LR, off the main line
        "sft", sft.DEFAULTS, domains=["math"], steps=c.stages.sft.steps // 4, batch_size=32,
        seq_len=c.stages.sft.seq_len, handoff=dict(init_from="stage:sft", side_branch=True), checkpoint_every=100,
        optim=dict(lr=1e-3, schedule="cosine", warmup_steps=10, min_lr_frac=0.05))
    c.stages.soup = kinds.stage_config("soup", steps=0, sources=("stage:grpo", "stage:branch"), weights=(0.5, 0.5))
    c.stage_order = ("sft", "grpo", "branch", "soup")
    return c
