"""Procedural long-context QA (C2 "long-context RL"): retrieval or 2-hop questions over many short facts.

The input is ``num_facts`` shuffled lines of two kinds, then one question:

    The code of box 17 is 482.          (every box has a code: 3 digits, all distinct)
    Box 17 holds the key of box 5.      (about half the lines: links between distinct boxes)
    ...
    hops=1: "What is the code of box 5?"
            reasoning "The code of box 5 is 301."
    hops=2: "Box 17 holds the key of a box. What is the code of that box?"
            reasoning "Box 17 holds the key of box 5. The code of box 5 is 301."
    response: "The answer is \\boxed{301}."       answer: "301"   (scored by rewards/math.py)

Both kinds of line appear for either ``hops``, so the links are distractors of 1-hop questions and the
other codes distractors of both. C2 judged long-context answers with an LLM; a number read from the
context is verified exactly by the math boxed-answer rule instead.

**Imperfect teacher.** With probability ``teacher_error_rate`` the teacher reads the wrong line:
for ``hops=1`` it copies the code from the code line just before the right one in the context (just
after, if the right one is the first), and for ``hops=2`` it stops one hop short and answers the code
of the box named in the question. Its trace states the wrong fact, so trace and answer agree.

**Length.** The prompt grows linearly in ``num_facts``: a line is ~14-15 tokens under the project's
SentencePiece tokenizer (``nemocascade.tokenizer``, digits split one per token:
"The| code| of| box| |1|7| is| |4|8|2|.|\n"), so a long-context stage needs ``max_prompt_len`` (and SFT
``seq_len``) of ~15 * num_facts + 30, far above the other domains' 64-128. Reasoning plus response stay
under 45 tokens.

Held-out split: by the facts the answer depends on (``h1:5=301`` or ``h2:17>5=301``), so no
(question, answer) chain is seen in training and asked at test, whatever the distractors.
"""

from __future__ import annotations

import numpy as np

from nemocascade.data.math import response_text
from nemocascade.data.domains import Domain, check_args, register, split_of
from nemocascade.rewards import math as math_reward

DOMAIN = "longctx"
MAX_FACTS = 1600  # codes are distinct 3-digit numbers: at most 900 boxes, each with one code line


def code_line(box: int, code: int) -> str:
    return f"The code of box {box} is {code}."


def link_line(src: int, dst: int) -> str:
    return f"Box {src} holds the key of box {dst}."


def _context(rng, num_facts: int) -> tuple[list[tuple[str, int, int]], dict[int, int]]:
    """Shuffled lines as ``(kind, a, b)`` (``("code", box, code)`` / ``("link", src, dst)``), and the
    codes. ``ceil(num_facts/2)`` boxes with codes, the rest links with distinct sources and targets."""
    n_boxes = (num_facts + 1) // 2
    boxes = [int(b) + 1 for b in rng.choice(max(99, 2 * n_boxes), n_boxes, replace=False)]
    codes = {b: int(c) + 100 for b, c in zip(boxes, rng.choice(900, n_boxes, replace=False))}
    # Links follow one random cycle through the boxes: sources distinct, targets distinct, and no box
    # holds its own key (a 2-hop answer always differs from the 1-hop one).
    cycle = [boxes[i] for i in rng.permutation(n_boxes)]
    links = [("link", cycle[i], cycle[(i + 1) % n_boxes]) for i in range(num_facts - n_boxes)]
    lines = [("code", b, codes[b]) for b in boxes] + links
    return [lines[i] for i in rng.permutation(len(lines))], codes


def generate(rng: np.random.Generator, n: int, *, split: str | None = "train",
             teacher_error_rate: float = 0.0, num_facts: int = 16, hops: int = 1,
             test_every: int = 10) -> list[dict]:
    """``n`` long-context records (domains.py record contract), deterministic given ``rng`` and the options.

    Args:
        split: keep only problems with ``split_of(key, test_every) == split`` (``None``: all).
        teacher_error_rate: probability that the teacher reads the wrong line (module docstring).
        num_facts: lines of context (4 to :data:`MAX_FACTS`); sets the prompt length.
        hops: 1 (retrieve one code) or 2 (follow one link, then retrieve).
    """
    check_args(split, teacher_error_rate)
    if not 4 <= num_facts <= MAX_FACTS:
        raise ValueError(f"num_facts must be in [4, {MAX_FACTS}], got {num_facts}")
    if hops not in (1, 2):
        raise ValueError(f"hops must be 1 or 2, got {hops}")
    records, attempts = [], 0
    while len(records) < n:
        attempts += 1
        if attempts > 100 * n * test_every + 1000:
            raise ValueError(f"found only {len(records)} of {n} longctx problems for split {split!r}")
        lines, codes = _context(rng, num_facts)
        if hops == 1:
            code_lines = [(a, b) for kind, a, b in lines if kind == "code"]
            i = int(rng.integers(len(code_lines)))
            box, answer = code_lines[i]
            wrong = code_lines[i - 1 if i > 0 else 1][1]  # the neighbouring code line
            key = f"h1:{box}={answer}"
            question = f"What is the code of box {box}?"
            right_trace, wrong_trace = code_line(box, answer), code_line(box, wrong)
        else:
            link_lines = [(a, b) for kind, a, b in lines if kind == "link"]
            src, box = link_lines[int(rng.integers(len(link_lines)))]
            answer, wrong = codes[box], codes[src]  # the slip: the code of the box in the question
            key = f"h2:{src}>{box}={answer}"
            question = f"Box {src} holds the key of a box. What is the code of that box?"
            right_trace = f"{link_line(src, box)} {code_line(box, answer)}"
            wrong_trace = f"Box {src} holds a key. {code_line(src, wrong)}"
        if split is not None and split_of(key, test_every) != split:
            continue
        slipped = bool(rng.random() < teacher_error_rate)  # always drawn: same problems at every rate
        text = [code_line(a, b) if kind == "code" else link_line(a, b) for kind, a, b in lines]
        records.append({
            "domain": DOMAIN,
            "prompt": "\n".join(text + [question]),
            "reasoning": wrong_trace if slipped else right_trace,
            "response": response_text(wrong if slipped else answer),
            "answer": str(answer),
            "id": f"{DOMAIN}/{split or 'all'}/{len(records)}/{key}",
        })
    return records


register(Domain(
    name=DOMAIN, generate=generate, verifier=math_reward.score, version="1",
    description="long-context retrieval / 2-hop QA over many box facts (teacher reads the wrong line)"))
