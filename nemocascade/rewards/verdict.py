"""Judging prompts and verdicts (rewards/judge.py): the texts a judge reads, its verdict read strictly, and the
reward of the `judge_pref` domain (1 only for the right verdict in the strict form). No jax here: verifier workers
import it."""
from __future__ import annotations

import re

from nemocascade import chat

PAIR_OPTIONS = ("A", "B")
REFERENCE_OPTIONS = ("Yes", "No")
LEAD = "Verdict:"  # a judge's answer is the line "Verdict: X"


def clean(text: str) -> str:
    """Policy text made safe to quote in a judging prompt: chat control tokens removed."""
    for tok in chat.SPECIAL_TOKENS:
        text = text.replace(tok, "")
    return text.strip()


def pair_instruction(prompt: str, a: str, b: str) -> str:
    return (f"Two assistants answered the same request. Which response answers it better: helpful, correct, on "
            f"topic and concise?\n\n[Request]\n{clean(prompt)}\n\n[Response A]\n{clean(a)}\n\n[Response B]\n"
            f"{clean(b)}\n\nReply with A or B.")


def reference_instruction(question: str, reference: str, response: str) -> str:
    return (f"Check a response against the reference answer.\n\n[Question]\n{clean(question)}\n\n[Reference answer]\n"
            f"{clean(reference)}\n\n[Response]\n{clean(response)}\n\nDoes the response give the reference answer? "
            "Reply with Yes or No.")


_VERDICT_LINE = re.compile(r"Verdict:[ \t]*(\S+?)[ \t]*\.?[ \t]*")


def parse_verdict(text: str, options: tuple[str, str]) -> int | None:
    """Index of the option a sampled reply chose, or None (unparsable). Strict: after the think block and the end
    token, the last non-empty line is exactly ``Verdict: X`` (a final period allowed) with X one of `options`, and
    ``Verdict:`` appears nowhere else, so a reply that hedges ("Verdict: A ... Verdict: B") has no verdict."""
    reasoning, final = chat.split_think(text)
    body = (final if chat.THINK_CLOSE in text else reasoning or final).replace(chat.IM_END, "")
    if body.count(LEAD) != 1:
        return None
    lines = [line.strip() for line in body.strip().splitlines() if line.strip()]
    m = _VERDICT_LINE.fullmatch(lines[-1]) if lines else None
    if m is None or m.group(1) not in options:
        return None
    return options.index(m.group(1))


def score(completion: str, answer: str) -> float:
    """1.0 iff the reply's strict verdict (`parse_verdict`) is `answer` ("A" / "B" for a pair, "Yes" / "No" for an
    answer check); else 0.0."""
    options = next((o for o in (PAIR_OPTIONS, REFERENCE_OPTIONS) if answer in o), None)
    if options is None:
        raise ValueError(f"verdict answer {answer!r}: must be one of {PAIR_OPTIONS + REFERENCE_OPTIONS}")
    return float(parse_verdict(completion, options) == options.index(answer))


def judging_record(domain: str, prompt: str, right: str, key: str, mislabel: bool) -> dict:
    """One SFT record of a judge's domain (data/judge_pref.py, judge_longctx.py): the judging prompt, the verdict as
    the whole response (no reasoning: what the log-probability mode reads) and the right verdict as the answer;
    `mislabel` (a noisy labeller) gives the response the other option."""
    options = next(o for o in (PAIR_OPTIONS, REFERENCE_OPTIONS) if right in o)
    said = options[1 - options.index(right)] if mislabel else right
    return {"domain": domain, "prompt": prompt, "reasoning": "", "response": f"{LEAD} {said}", "answer": right,
            "id": key}
