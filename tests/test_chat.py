"""Chat template: exact rendered strings (hand-written), think-block stripping rules, and how the rendered
template tokenizes (specials are single ids at the expected positions, exact round-trip)."""

import random

import pytest

from tokenizers import Tokenizer, models

from nemocascade.chat import (IM_END, IM_START, THINK_CLOSE, THINK_OPEN, jinja_template, render_completion,
                              render_prompt, split_think, strip_think)
from nemocascade.hf_tokenizer import HFTokenizer
from nemocascade.tokenizer import train_tokenizer


def test_render_prompt_thinking_exact():
    assert render_prompt("What is 2+3?") == (
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n<think>\n")


def test_render_prompt_non_thinking_exact():
    assert render_prompt("What is 2+3?", thinking=False) == (
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n<think></think>\n")


def test_render_prompt_with_system_exact():
    assert render_prompt("Hi", thinking=True, system="Be brief.") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    # An empty system prompt is still a system turn; only None omits it.
    assert render_prompt("Hi", system="").startswith("<|im_start|>system\n<|im_end|>\n<|im_start|>user")


def test_render_completion_exact():
    assert render_completion("2+3=5", "\\boxed{5}") == "2+3=5\n</think>\n\\boxed{5}<|im_end|>"
    assert render_completion("ignored", "\\boxed{5}", thinking=False) == "\\boxed{5}<|im_end|>"


def test_constants():
    assert (IM_START, IM_END, THINK_OPEN, THINK_CLOSE) == ("<|im_start|>", "<|im_end|>", "<think>",
                                                          "</think>")


def test_full_conversation_strips_to_answer():
    for thinking in (True, False):
        text = render_prompt("q", thinking) + render_completion("r", " \\boxed{7} ", thinking)
        assert strip_think(text) == "\\boxed{7}"


STRIP_CASES = [
    # (name, text, strip_think, split_think reasoning)
    ("finished", "<think>\nlet me add\n</think>\nThe answer is 5.<|im_end|>", "The answer is 5.",
     "let me add"),
    ("finished_no_open", "let me add\n</think>\n5", "5", "let me add"),
    ("unfinished", "<think>\nstill going and going", "", "still going and going"),
    ("unfinished_with_im_end", "<think>\ncut off<|im_end|>", "", "cut off"),
    ("none", "  plain answer 5\n", "plain answer 5", ""),
    ("none_im_end", "plain answer<|im_end|>", "plain answer", ""),
    ("multiple_closes", "<think>a</think>b</think> c <|im_end|>", "c", "a</think>b"),
    ("trailing_im_end_whitespace", "</think>\n  x = 1\n<|im_end|>\n", "x = 1", ""),
    ("only_one_im_end_removed", "</think>x<|im_end|><|im_end|>", "x<|im_end|>", ""),
    ("empty_think_nonthinking", "<think></think>\nanswer<|im_end|>", "answer", ""),
    ("empty", "", "", ""),
    ("im_end_inside_answer_kept", "</think>a<|im_end|>b", "a<|im_end|>b", ""),
]


@pytest.mark.parametrize("name,text,final,reasoning", STRIP_CASES, ids=[c[0] for c in STRIP_CASES])
def test_strip_and_split_think(name, text, final, reasoning):
    assert strip_think(text) == final
    assert split_think(text) == (reasoning, final)


def test_in_think_treats_unclosed_completion_as_unfinished():
    # A thinking-mode completion: its <think> is in the prompt, so the text holds neither tag.
    assert strip_think("I keep thinking 5", in_think=True) == ""
    assert split_think("I keep thinking 5<|im_end|>", in_think=True) == ("I keep thinking 5", "")
    assert strip_think("I keep thinking 5", in_think=False) == "I keep thinking 5"
    # Once closed, in_think changes nothing.
    assert split_think("r\n</think>\n5<|im_end|>", in_think=True) == ("r", "5")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    rng = random.Random(0)
    words = "what is the sum of and answer let me think step so we get boxed".split()
    texts = [render_prompt(" ".join(rng.choices(words, k=8)) + f" {rng.randint(0, 999)}?", rng.random() < .5)
             + render_completion(" ".join(rng.choices(words, k=12)), f"\\boxed{{{rng.randint(0, 99)}}}")
             for _ in range(500)]
    return train_tokenizer(texts, str(tmp_path_factory.mktemp("tok") / "chat"), vocab_size=320)


@pytest.mark.parametrize("thinking", [True, False])
def test_template_tokenizes_with_single_id_specials(tok, thinking):
    ids_of = {s: tok.token_id(s) for s in (IM_START, IM_END, THINK_OPEN, THINK_CLOSE, "\n")}
    prompt = render_prompt("What is 12+7?", thinking, system="Be brief.")
    ids = tok.encode(prompt)
    assert tok.decode(ids) == prompt
    # Three turns open, two close (the assistant turn is still open).
    assert ids.count(ids_of[IM_START]) == 3 and ids.count(ids_of[IM_END]) == 2
    assert ids[0] == ids_of[IM_START]
    tail = [ids_of[THINK_OPEN], ids_of["\n"]] if thinking else [ids_of[THINK_OPEN], ids_of[THINK_CLOSE],
                                                                ids_of["\n"]]
    assert ids[-len(tail):] == tail
    # Prompt and completion tokenize independently: the specials stop merges across the boundary.
    completion = render_completion("12+7 = 19", "\\boxed{19}", thinking)
    assert tok.encode(prompt + completion) == ids + tok.encode(completion)
    assert tok.encode(completion)[-1] == tok.eos_id
    assert tok.decode(tok.encode(prompt + completion)) == prompt + completion


@pytest.mark.parametrize("thinking", [True, False])
def test_jinja_template_renders_render_prompt(thinking):
    """The exported tokenizer's chat template (experiments/export.py), rendered as transformers renders one."""
    tok = HFTokenizer(Tokenizer(models.BPE(vocab={IM_END: 0}, merges=[])), eos_token=IM_END,
                      chat_template=jinja_template(thinking))
    for system in (None, "Be brief.\nReally."):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": "a\nb"}]
        assert tok.apply_chat_template(messages) == render_prompt("a\nb", thinking=thinking, system=system)
        assert tok.apply_chat_template(messages, add_generation_prompt=False) == render_prompt(
            "a\nb", thinking=thinking, system=system).rsplit(IM_START, 1)[0]
