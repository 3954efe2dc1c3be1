"""ChatML chat template with Nemotron-Cascade 2's thinking modes (METHOD.md "Chat template and modes").

A single-turn conversation is rendered as

    <|im_start|>system\\n{system}<|im_end|>\\n          (only when a system prompt is given)
    <|im_start|>user\\n{user}<|im_end|>\\n
    <|im_start|>assistant\\n
    <think>\\n                                         (thinking mode)   | <think></think>\\n  (non-thinking)
    {reasoning}\\n</think>\\n{answer}<|im_end|>         (thinking mode)   | {answer}<|im_end|>  (non-thinking)

`render_prompt` returns everything up to and including the `<think>` line (generation starts right after
it); `render_completion` returns what the assistant writes after that. The model stops at `<|im_end|>`
(`Tokenizer.eos_id`).

Answers, code and patches are always extracted from the text after the think block, and RM scoring sees
only that text (METHOD.md "Rewards per domain"): `strip_think` does this.
"""

IM_START, IM_END, THINK_OPEN, THINK_CLOSE = "<|im_start|>", "<|im_end|>", "<think>", "</think>"
SPECIAL_TOKENS = (IM_START, IM_END, THINK_OPEN, THINK_CLOSE)


def render_prompt(user: str, thinking: bool = True, system: str | None = None) -> str:
    """The prompt up to the point where the assistant starts generating.

    Thinking mode opens the think block (`<think>\\n`); non-thinking mode emits an empty, already closed
    block (`<think></think>\\n`) so the model goes straight to its answer (C2 chat template).
    """
    head = f"{IM_START}system\n{system}{IM_END}\n" if system is not None else ""
    think = f"{THINK_OPEN}\n" if thinking else f"{THINK_OPEN}{THINK_CLOSE}\n"
    return f"{head}{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n{think}"


def jinja_template(thinking: bool = True) -> str:
    """`render_prompt` as a Hugging Face chat template (Jinja), for an exported tokenizer: transformers'
    `apply_chat_template(messages, add_generation_prompt=True)` then renders a [system,] user conversation
    exactly as the run was prompted in training. Earlier turns are plain ChatML turns."""
    nl = "\\n"  # Jinja reads the escape as a newline
    turns = ("{%- for m in messages -%}"
             f"{{{{- '{IM_START}' + m['role'] + '{nl}' + m['content'] + '{IM_END}{nl}' -}}}}"
             "{%- endfor -%}")
    think = f"{THINK_OPEN}{nl}" if thinking else f"{THINK_OPEN}{THINK_CLOSE}{nl}"
    return turns + f"{{%- if add_generation_prompt -%}}{{{{- '{IM_START}assistant{nl}{think}' -}}}}{{%- endif -%}}"


def render_completion(reasoning: str, answer: str, thinking: bool = True) -> str:
    """The assistant's target text after `render_prompt(..., thinking)` (SFT targets, teacher forcing).

    thinking:     f"{reasoning}\\n</think>\\n{answer}<|im_end|>"
    non-thinking: f"{answer}<|im_end|>"   (`reasoning` is ignored: the prompt already closed the block)
    """
    if thinking:
        return f"{reasoning}\n{THINK_CLOSE}\n{answer}{IM_END}"
    return f"{answer}{IM_END}"


def _clean_final(text: str) -> str:
    """Strip surrounding whitespace and one trailing `<|im_end|>` (the turn terminator)."""
    text = text.strip()
    if text.endswith(IM_END):
        text = text[: -len(IM_END)].strip()
    return text


def split_think(text: str, in_think: bool = False) -> tuple[str, str]:
    """Split a model output into (reasoning, final response), both whitespace-stripped.

    Rules:
      * has `</think>`: final = text after the LAST `</think>` (a model that closes twice has only
        finished thinking at the last close); reasoning = text before it, after the first `<think>` if any.
      * has `<think>` but no `</think>`: thinking never finished, so there is no final response:
        (text after the first `<think>`, "").
      * has neither: ("", text), or (text, "") when `in_think` is True.

    `in_think=True` says the text is a completion generated after a thinking-mode prompt, whose `<think>`
    is in the prompt and so absent from `text`; an unclosed think block then yields no final response
    instead of grading the reasoning as if it were the answer.
    The final response also loses one trailing `<|im_end|>`.
    """
    close = text.rfind(THINK_CLOSE)
    if close >= 0:
        reasoning, final = text[:close], text[close + len(THINK_CLOSE):]
        open_ = reasoning.find(THINK_OPEN)
        if open_ >= 0:
            reasoning = reasoning[open_ + len(THINK_OPEN):]
        return reasoning.strip(), _clean_final(final)
    open_ = text.find(THINK_OPEN)
    if open_ >= 0:
        return _clean_final(text[open_ + len(THINK_OPEN):]), ""
    if in_think:
        return _clean_final(text), ""
    return "", _clean_final(text)


def strip_think(text: str, in_think: bool = False) -> str:
    """The final response: what answer extraction, code execution and reward models look at.

    `split_think`'s final response: the text after the LAST `</think>` (stripped, minus one trailing
    `<|im_end|>`); "" when thinking was opened and never closed (unfinished thinking has no answer to grade);
    else the whole text. Pass `in_think=True` for completions of a `render_prompt(..., thinking=True)` prompt,
    whose `<think>` lives in the prompt.
    """
    return split_think(text, in_think=in_think)[1]


def decode_responses(tokenizer, tokens, mask, thinking: bool) -> list[str]:
    """Response texts; in thinking mode the `<think>` that ended the prompt is put back in front, so
    a verifier sees the whole assistant turn (an unfinished think block scores 0)."""
    prefix = (THINK_OPEN + "\n") if thinking else ""
    return [prefix + tokenizer.decode(t[m > 0].tolist()) for t, m in zip(tokens, mask)]
