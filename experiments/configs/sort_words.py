"""A new domain with its verifier, defined in an experiment file (README "A new domain and its verifier"):
`sort_words`, put 3-5 words in alphabetical order. The generator makes records in the record contract
(data/domains.py), the verifier scores the last \\boxed{} after </think>, and the cascade is SFT on an imperfect
teacher (it swaps two words on 30% of the problems) -> GRPO on the verifiable reward, evaluated after every stage
like any domain.

    python experiments/run.py --config=sort_words
    python experiments/run.py --config=sort_words:tiny    # about two minutes (tests/test_extension.py runs it)
"""
import ml_collections
import numpy as np

from _common import grpo_stage, multi_base, variants
from nemocascade import chat
from nemocascade.data import domains
from nemocascade.rewards.limits import bounded_completion
from nemocascade.rewards.math import last_boxed
from nemocascade.stages import common, sft

WORDS = ("ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "ibis", "jay", "kiwi", "lynx", "mole", "newt",
         "owl", "pig", "quail", "rat", "seal", "toad", "vole", "wolf", "yak", "zebu")


def generate(rng: np.random.Generator, n: int, *, split="train", teacher_error_rate=0.3, test_every=10):
    """`n` records of `split`: a problem is its set of words (its key), so one problem never sits in two splits."""
    domains.check_args(split, teacher_error_rate)
    out, i = [], 0
    while len(out) < n:
        words = list(rng.choice(WORDS, size=int(rng.integers(3, 6)), replace=False))
        key = ",".join(sorted(words))
        i += 1
        if split is not None and domains.split_of(key, test_every) != split:
            continue
        answer = " ".join(sorted(words))
        shown = sorted(words)
        if rng.random() < teacher_error_rate:  # the teacher's slip: two neighbours swapped
            j = int(rng.integers(0, len(shown) - 1))
            shown[j], shown[j + 1] = shown[j + 1], shown[j]
        out.append({"domain": "sort_words", "prompt": "Sort alphabetically: " + " ".join(words),
                    "reasoning": "first letters: " + " ".join(w[0] for w in shown),
                    "response": f"\\boxed{{{' '.join(shown)}}}", "answer": answer,
                    "id": f"sort_words/{split}/{i}/{key}"})
    return out


@bounded_completion  # over-long or malformed input scores 0 without running the parser (rewards/limits.py)
def score(completion: str, answer: str) -> float:
    """1.0 iff the last \\boxed{} after </think> holds exactly the sorted words (math's boxed-answer parser)."""
    boxed = last_boxed(chat.strip_think(completion))
    return float(boxed is not None and " ".join(boxed.split()) == answer)


domains.register(domains.Domain("sort_words", generate, score, description="sort 3-5 words"), overwrite=True)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    tags = variants("sort_words", arg, ("tiny",))
    c = multi_base("sort_words", {"sort_words": dict(teacher_error_rate=0.3)})  # model, tokenizer, data, eval
    c.variant = arg
    c.tokenizer.update(vocab_size=384, corpus_size=3000)
    c.eval.update(max_prompt_len=48, max_new_tokens=48)
    c.stages.sft = common.stage_config(
        "sft", sft.DEFAULTS, domains=["sort_words"], steps=400, batch_size=32, seq_len=96, checkpoint_every=100,
        optim=dict(lr=3e-3, schedule="cosine", warmup_steps=50, weight_decay=0.01, min_lr_frac=0.05))
    c.stages.grpo = grpo_stage(["sort_words"], 40, rollout=dict(length_curriculum=((0, 48),)), eval_every=20)
    c.stage_order = ("sft", "grpo")
    if "tiny" in tags:  # about two minutes on two CPU cores
        c.model.update(n_layers=2)
        c.data.domains.sort_words.update(num_train=2000, num_test=256)
        c.eval.update(n=64, val_n=64, batch_size=64)
        c.stages.sft.update(steps=150, checkpoint_every=150)
        c.stages.grpo.update(steps=4, rollout=dict(prompts_per_step=8), checkpoint_every=4, eval_every=4, eval_n=32)
    return c
