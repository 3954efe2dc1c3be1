"""Procedural instruction-following prompts (domain ``"if"``) with a rule-following *imperfect teacher*.

A prompt is a short topic request from a closed vocabulary plus 1..``max_constraints`` verifiable
constraints stated in words; the answer is the JSON list of constraint dicts that
``nemocascade.rewards.instruct`` checks::

    prompt:    "Write about cats. Use at most 14 words. Do not use any commas."
    reasoning: "Topic: cats. Check: at most 14 words; no commas."
    response:  "Cats sleep a lot mostly in the sun. Cats are soft and warm."
    answer:    '[{"type": "word_count", "max": 14}, {"type": "no_commas"}]'

The writer is deterministic given the drawn plan: it picks 1-3 content sentences of the topic (or one
per bullet / section), adds a sentence per content constraint (keywords, placeholders), then applies
the layout (title, opener, closer, bullets, sections, JSON, P.S.), the case and the quotes. Length
bounds are drawn *around* the written text, so the teacher always satisfies them. Every teacher text is
checked with the reward's own checkers before it is emitted.

**Imperfect teacher.** With probability ``teacher_error_rate`` the teacher slips on exactly one
constraint, always in the same way (:data:`SLIP`: e.g. normal case instead of lowercase, a dropped title,
one bullet too many, the forbidden word). Which constraint it slips on is systematic too: the first one in
:data:`SLIP_ORDER` (surface format before content before length) whose slip breaks that constraint alone;
its plan then leaves that constraint out, so reasoning and response agree. A problem on which no single
slip works is redrawn. Above a rate of 0.5 the slip is the mode, so greedy imitation fails, while the
rule-following text is still sampled often enough for the verifiable reward to reinforce it (as in
``data/math.py``).

Held-out split: by the canonical problem (topic + the *set* of constraints), not the wording.
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np

from nemocascade.data.domains import Domain, check_args, register, split_of
from nemocascade.rewards import instruct as instruct_reward
from nemocascade.rewards.instruct import check_all, count_words, split_sentences

DOMAIN = "if"
TOPICS: dict[str, tuple[str, ...]] = {  # five sentences each, two with commas (so "no commas" bites)
    "cats": ("Cats are soft and warm.", "Cats sleep a lot, mostly in the sun.", "Cats like to play with string.",
             "A cat can jump very high.", "Cats eat fish, meat and eggs."),
    "dogs": ("Dogs are loyal friends.", "Dogs like to run, jump and play.", "A dog can learn many tricks.",
             "Dogs bark at strangers.", "Dogs need food, water and long walks."),
    "rivers": ("Rivers flow down to the sea.", "A river can be wide, deep and fast.", "Fish live in rivers.",
               "Rivers give water to farms.", "Rivers bend, turn and move slowly."),
    "trees": ("Trees grow tall and strong.", "Trees give shade, fruit and wood.", "Birds build nests in trees.",
              "Old trees have thick roots.", "In autumn, leaves fall from trees."),
    "birds": ("Birds can fly very high.", "Birds sing songs, loud and sweet.", "Birds build nests in spring.",
              "Some birds fly south in winter.", "Birds eat seeds, worms and fruit."),
    "rain": ("Rain falls from dark clouds.", "Rain helps plants, trees and grass grow.", "Rain makes the streets wet.",
             "After rain, the air smells fresh.", "Children like to jump in rain."),
    "the sea": ("The sea is deep and blue.", "Waves move across the sea.", "Fish, whales and crabs live in the sea.",
                "The sea tastes of salt.", "Ships sail on the sea, day and night."),
    "the moon": ("The moon shines at night.", "The moon moves around the earth.", "The moon has gray, dusty rocks.",
                 "People walked on the moon.", "Each month, the moon changes shape."),
    "bread": ("Bread is made from flour.", "Bakers bake bread early, before dawn.",
              "Fresh bread smells warm and sweet.", "Bread needs flour, water and salt.",
              "Many people eat bread every day."),
    "gardens": ("Gardens are full of flowers.", "A garden needs sun, water and care.", "Bees visit gardens in summer.",
                "People grow food in gardens.", "In spring, gardens turn green."),
    "winter": ("Winter is the coldest season.", "Snow falls in winter.", "In winter, days are short and dark.",
               "People wear coats, hats and gloves.", "Lakes freeze in winter."),
    "music": ("Music makes people happy.", "Music can be loud, soft or slow.", "Many people play music together.",
              "Songs tell stories.", "Drums, pianos and guitars make music."),
}
REQUESTS = ("Write about {t}.", "Describe {t}.", "Tell me about {t}.")
# Keywords occur in no topic sentence or template, not even as a substring (the checks are substring
# checks), so a keyword constraint always bites.
KEYWORDS = ("joy", "gold", "magic", "peace", "dream", "smile", "silver", "candy")
START_PHRASES = ("Sure", "Here you go", "Okay", "Let me see")
END_PHRASES = ("That is all.", "The end.", "Thank you.", "Have a nice day.")
PLACEHOLDER_SENTENCES = ("", "Ask [name].", "Ask [name] at [place].", "Ask [name] at [place] on [date].")
_TEMPLATES = START_PHRASES + END_PHRASES + PLACEHOLDER_SENTENCES + (
    "It makes me think of and", "I say and", "P.S. I like")
_TEMPLATE_WORDS = {w.lower() for w in re.findall(r"[A-Za-z]+", " ".join(_TEMPLATES))}


def _forbiddable(topic: str) -> list[tuple[str, str]]:
    """(word, its only sentence) pairs a "do not use" constraint may name: a content word of >= 4 letters
    in exactly one of the topic's sentences, not a template word and not (a prefix of) a topic word."""
    topic_words = topic.split()
    found: dict[str, list[str]] = {}
    for s in TOPICS[topic]:
        for w in {w.lower() for w in re.findall(r"[A-Za-z]+", s)}:
            found.setdefault(w, []).append(s)
    return sorted((w, ss[0]) for w, ss in found.items()
                  if len(ss) == 1 and len(w) >= 4 and w not in _TEMPLATE_WORDS
                  and not any(t.startswith(w) for t in topic_words))


FORBIDDABLE = {t: _forbiddable(t) for t in TOPICS}

# Pairs the writer cannot satisfy together, or whose joint meaning would be muddled (sentence counts of a
# JSON string or a bullet list). A drawn constraint set never contains both of a pair.
_CONFLICTS = {frozenset(p) for p in [
    ("lowercase", "uppercase"), ("lowercase", "sections"), ("end_with", "postscript"),
    ("bullet_list", "sections"), ("bullet_list", "quotation"), ("sections", "quotation"),
    ("sentence_count", "json_format"), ("sentence_count", "bullet_list"), ("sentence_count", "sections"),
    *[("json_format", f) for f in ("start_with", "end_with", "bullet_list", "sections", "quotation", "title",
                                   "postscript")],
]}
SLIP_ORDER = ("lowercase", "uppercase", "no_commas", "quotation", "title", "postscript", "json_format",
              "start_with", "end_with", "bullet_list", "sections", "placeholders", "include_keywords",
              "exclude_words", "keyword_frequency", "word_count", "sentence_count")
FAMILIES = tuple(sorted(SLIP_ORDER))  # the families this generator can write


@dataclasses.dataclass(frozen=True)
class Layout:
    """Everything the writer decides; :func:`render` turns it into the response text."""

    content: tuple[str, ...]          # content sentences, in order, with their commas
    spare: tuple[str, ...]            # unused topic sentences (for a slip that writes one too many)
    forbidden: str | None = None      # the sentence left out for "do not use the word X"
    extra: tuple[tuple[str, str], ...] = ()  # (family, sentence) written after the content
    title: str | None = None
    opener: str | None = None
    closer: str | None = None
    ps: str | None = None
    body: str = "plain"               # plain | bullets | sections | json
    case: str | None = None           # lower | upper | None
    commas: bool = True
    quoted: bool = False


def render(lay: Layout) -> str:
    """The response text of a layout (deterministic)."""
    content = [s if lay.commas else s.replace(",", "") for s in lay.content]
    extras = [s for _, s in lay.extra if s]
    if lay.body == "bullets":
        body = [f"* {s}" for s in content] + ([" ".join(extras)] if extras else [])
    elif lay.body == "sections":
        body = [line for i, s in enumerate(content, 1) for line in (f"SECTION {i}", s)]
        body[-1] = " ".join([body[-1], *extras])
    elif lay.body == "json":
        body = [json.dumps({"text": " ".join(content + extras)})]
    else:
        body = [" ".join(content + extras)]
    lines = ([f"{lay.opener}."] if lay.opener else []) + ([f"<<{lay.title}>>"] if lay.title else []) + body
    lines += ([lay.closer] if lay.closer else []) + ([lay.ps] if lay.ps else [])
    text = "\n".join(lines)
    text = {"lower": text.lower(), "upper": text.upper()}.get(lay.case, text)
    return f'"{text}"' if lay.quoted else text


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _frequency_sentence(keyword: str, count: int) -> str:
    return f"I say {' and '.join([keyword] * count)}." if count > 0 else ""


def _bounds(c: dict, unit: str) -> str:
    lo, hi = c.get("min"), c.get("max")
    if lo is None:
        return f"at most {_plural(hi, unit)}"
    if hi is None:
        return f"at least {_plural(lo, unit)}"
    return f"exactly {_plural(lo, unit)}" if lo == hi else f"{lo} to {hi} {unit}s"


def _and(words: list[str]) -> str:
    return " and ".join(words)


# --- per family: the instruction in words, the plan's tag, the faithful layout, the teacher's slip ------
DESCRIBE = {
    "word_count": lambda c: f"Use {_bounds(c, 'word')}.",
    "sentence_count": lambda c: f"Write {_bounds(c, 'sentence')}.",
    "lowercase": lambda c: "Use only lowercase letters.",
    "uppercase": lambda c: "Use only capital letters.",
    "include_keywords": lambda c: f"Include the word{'s' * (len(c['keywords']) > 1)} {_and(c['keywords'])}.",
    "exclude_words": lambda c: f"Do not use the word {c['words'][0]}.",
    "keyword_frequency": lambda c: f"Use the word {c['keyword']} {c['relation']} {_plural(c['n'], 'time')}.",
    "start_with": lambda c: f'Start with "{c["phrase"]}".',
    "end_with": lambda c: f'End with "{c["phrase"]}"',
    "bullet_list": lambda c: f"Use exactly {c['n']} bullet points starting with *.",
    "sections": lambda c: f"Use {c['n']} sections, each starting with SECTION X.",
    "json_format": lambda c: "Answer in JSON format.",
    "no_commas": lambda c: "Do not use any commas.",
    "quotation": lambda c: "Wrap your answer in double quotes.",
    "placeholders": lambda c: f"Include at least {_plural(c['n'], 'placeholder')} like [name].",
    "title": lambda c: "Add a title in double angular brackets, like <<title>>.",
    "postscript": lambda c: "Add a postscript starting with P.S.",
}
TAG = {
    "word_count": lambda c: _bounds(c, "word"),
    "sentence_count": lambda c: _bounds(c, "sentence"),
    "lowercase": lambda c: "lowercase only",
    "uppercase": lambda c: "capitals only",
    "include_keywords": lambda c: f"include {_and(c['keywords'])}",
    "exclude_words": lambda c: f"avoid {c['words'][0]}",
    "keyword_frequency": lambda c: f"{c['keyword']} {c['relation']} {_plural(c['n'], 'time')}",
    "start_with": lambda c: f'start with "{c["phrase"]}"',
    "end_with": lambda c: f'end with "{c["phrase"]}"',
    "bullet_list": lambda c: _plural(c["n"], "bullet"),
    "sections": lambda c: _plural(c["n"], "section"),
    "json_format": lambda c: "JSON",
    "no_commas": lambda c: "no commas",
    "quotation": lambda c: "in quotes",
    "placeholders": lambda c: _plural(c["n"], "placeholder"),
    "title": lambda c: "a title",
    "postscript": lambda c: "a P.S.",
}


def _with_extra(lay: Layout, family: str, sentence: str) -> Layout:
    extra = tuple((f, sentence if f == family else s) for f, s in lay.extra)
    if family not in dict(lay.extra):
        extra += ((family, sentence),)
    return dataclasses.replace(lay, extra=extra)


def _one_more(lay: Layout) -> Layout | None:
    return dataclasses.replace(lay, content=lay.content + lay.spare[:1]) if lay.spare else None


def _one_only(lay: Layout) -> Layout | None:
    return dataclasses.replace(lay, content=lay.content[:1]) if len(lay.content) > 1 else None


APPLY = {  # (layout, constraint, topic) -> the layout that follows the constraint
    "lowercase": lambda lay, c, t: dataclasses.replace(lay, case="lower"),
    "uppercase": lambda lay, c, t: dataclasses.replace(lay, case="upper"),
    "include_keywords": lambda lay, c, t: _with_extra(lay, "include_keywords",
                                                       f"It makes me think of {_and(c['keywords'])}."),
    "keyword_frequency": lambda lay, c, t: _with_extra(lay, "keyword_frequency",
                                                        _frequency_sentence(c["keyword"], c["n"])),
    "start_with": lambda lay, c, t: dataclasses.replace(lay, opener=c["phrase"]),
    "end_with": lambda lay, c, t: dataclasses.replace(lay, closer=c["phrase"]),
    "bullet_list": lambda lay, c, t: dataclasses.replace(lay, body="bullets"),
    "sections": lambda lay, c, t: dataclasses.replace(lay, body="sections"),
    "json_format": lambda lay, c, t: dataclasses.replace(lay, body="json"),
    "no_commas": lambda lay, c, t: dataclasses.replace(lay, commas=False),
    "quotation": lambda lay, c, t: dataclasses.replace(lay, quoted=True),
    "placeholders": lambda lay, c, t: _with_extra(lay, "placeholders", PLACEHOLDER_SENTENCES[c["n"]]),
    "title": lambda lay, c, t: dataclasses.replace(lay, title=t.title()),
    "postscript": lambda lay, c, t: dataclasses.replace(lay, ps=f"P.S. I like {t}."),
    # word/sentence counts and forbidden words are met by the choice of content, not by the layout
}
SLIP = {  # (layout, constraint) -> the teacher's systematic slip on that constraint, None if it has none
    "lowercase": lambda lay, c: dataclasses.replace(lay, case=None),
    "uppercase": lambda lay, c: dataclasses.replace(lay, case=None),
    "no_commas": lambda lay, c: dataclasses.replace(lay, commas=True),
    "quotation": lambda lay, c: dataclasses.replace(lay, quoted=False),
    "title": lambda lay, c: dataclasses.replace(lay, title=None),
    "postscript": lambda lay, c: dataclasses.replace(lay, ps=None),
    "json_format": lambda lay, c: dataclasses.replace(lay, body="plain"),
    "start_with": lambda lay, c: dataclasses.replace(lay, opener=None),
    "end_with": lambda lay, c: dataclasses.replace(lay, closer=None),
    "bullet_list": lambda lay, c: _one_more(lay),
    "sections": lambda lay, c: _one_more(lay),
    "placeholders": lambda lay, c: _with_extra(lay, "placeholders", PLACEHOLDER_SENTENCES[c["n"] - 1]),
    "include_keywords": lambda lay, c: _with_extra(lay, "include_keywords", ""),
    "exclude_words": lambda lay, c: dataclasses.replace(lay, content=lay.content[:-1] + (lay.forbidden,)),
    "keyword_frequency": lambda lay, c: _with_extra(
        lay, "keyword_frequency", _frequency_sentence(c["keyword"], c["n"] - 1 if c["relation"] == "at least"
                                                      else c["n"] + 1)),
    "word_count": lambda lay, c: _one_more(lay) if "max" in c else _one_only(lay),
    "sentence_count": lambda lay, c: _one_more(lay) if "max" in c else _one_only(lay),
}


# --- drawing a problem ---------------------------------------------------------------------------------
def _draw_families(rng: np.random.Generator, families: tuple[str, ...], m: int) -> list[str]:
    """Up to ``m`` distinct, pairwise compatible families, in the order they will be stated."""
    chosen: list[str] = []
    for _ in range(m):
        options = [f for f in families if f not in chosen and all(frozenset((f, g)) not in _CONFLICTS
                                                                   for g in chosen)]
        if not options:
            break
        chosen.append(options[int(rng.integers(len(options)))])
    return chosen


def _draw_constraint(rng: np.random.Generator, family: str, topic: str, keywords: list[str]) -> dict:
    """The constraint dict, except the bounds of word/sentence counts (set from the written text).

    ``keywords`` holds the keywords already taken by this problem; a new one is appended to it.
    """
    c: dict = {"type": family}
    if family in ("include_keywords", "keyword_frequency"):
        free = [k for k in KEYWORDS if k not in keywords]
        picked = [free[i] for i in rng.permutation(len(free))[:int(rng.integers(1, 3))]]
        keywords.extend(picked)
        if family == "include_keywords":
            c["keywords"] = picked
        else:
            c.update(keyword=picked[0], n=int(rng.integers(1, 4)),
                     relation=("exactly", "at least", "at most")[int(rng.integers(3))])
    elif family == "exclude_words":
        c["words"] = [FORBIDDABLE[topic][int(rng.integers(len(FORBIDDABLE[topic])))][0]]
    elif family in ("start_with", "end_with"):
        phrases = START_PHRASES if family == "start_with" else END_PHRASES
        c["phrase"] = phrases[int(rng.integers(len(phrases)))]
    elif family in ("bullet_list", "sections", "placeholders"):
        c["n"] = int(rng.integers(1 if family == "placeholders" else 2, 4))
    elif family == "postscript":
        c["marker"] = "P.S."
    elif family in ("word_count", "sentence_count"):
        c["_relation"] = int(rng.integers(3))  # at most | at least | both (exactly, for sentences)
    return c


def _set_bounds(rng: np.random.Generator, c: dict, text: str) -> None:
    """Bounds of a word/sentence count drawn around the written text's own count, so it holds."""
    relation = c.pop("_relation")
    if c["type"] == "word_count":
        count, slack = count_words(text), 4
    else:
        count, slack = len(split_sentences(text)), 2
    hi, lo = count + int(rng.integers(slack)), max(1, count - int(rng.integers(slack)))
    if c["type"] == "sentence_count" and relation == 2:
        hi = lo = count
    if relation != 1:
        c["max"] = hi
    if relation != 0:
        c["min"] = lo


@dataclasses.dataclass(frozen=True)
class Problem:
    topic: str
    request: str
    constraints: tuple[dict, ...]
    layout: Layout

    @property
    def key(self) -> str:
        """Canonical identity for the split: the topic and the *set* of constraints."""
        return json.dumps([self.topic, sorted(json.dumps(c, sort_keys=True) for c in self.constraints)])

    @property
    def prompt(self) -> str:
        return " ".join([self.request] + [DESCRIBE[c["type"]](c) for c in self.constraints])


def draw_problem(rng: np.random.Generator, families: tuple[str, ...], max_constraints: int) -> Problem:
    """A random problem and the layout the rule-following teacher writes for it."""
    topic = list(TOPICS)[int(rng.integers(len(TOPICS)))]
    request = REQUESTS[int(rng.integers(len(REQUESTS)))].format(t=topic)
    chosen = _draw_families(rng, families, int(rng.integers(1, max_constraints + 1)))
    keywords: list[str] = []
    constraints = [_draw_constraint(rng, f, topic, keywords) for f in chosen]
    by_family = {c["type"]: c for c in constraints}

    forbidden = None
    pool = list(TOPICS[topic])
    if "exclude_words" in by_family:
        forbidden = dict(FORBIDDABLE[topic])[by_family["exclude_words"]["words"][0]]
        pool.remove(forbidden)
    pool = [pool[i] for i in rng.permutation(len(pool))]
    listed = by_family.get("bullet_list") or by_family.get("sections")
    k = listed["n"] if listed else int(rng.integers(1, 4))
    content, spare = pool[:k], pool[k:]
    if "no_commas" in by_family and not any("," in s for s in content):
        with_comma = next((i for i, s in enumerate(spare) if "," in s), None)
        if with_comma is not None:  # so that the commas the teacher removes (or keeps) exist
            content[0], spare[with_comma] = spare[with_comma], content[0]
    layout = Layout(content=tuple(content), spare=tuple(spare), forbidden=forbidden)
    for c in constraints:
        if c["type"] in APPLY:
            layout = APPLY[c["type"]](layout, c, topic)
    text = render(layout)
    for c in constraints:
        if "_relation" in c:
            _set_bounds(rng, c, text)
    return Problem(topic, request, tuple(constraints), layout)


def teacher_slip(problem: Problem) -> tuple[str, Layout] | None:
    """(family, layout) of the teacher's slip: the first family in :data:`SLIP_ORDER` whose slip breaks
    that constraint and no other; None when there is none."""
    constraints = list(problem.constraints)
    for family in SLIP_ORDER:
        index = next((i for i, c in enumerate(constraints) if c["type"] == family), None)
        if index is None:
            continue
        slipped = SLIP[family](problem.layout, constraints[index])
        if slipped is None:
            continue
        verdicts = check_all(render(slipped), constraints)
        if not verdicts[index] and sum(verdicts) == len(verdicts) - 1:
            return family, slipped
    return None


def plan_text(topic: str, constraints: list[dict]) -> str:
    """The teacher's reasoning: the topic and the constraints it will check."""
    tags = "; ".join(TAG[c["type"]](c) for c in constraints) or "nothing"
    return f"Topic: {topic}. Check: {tags}."


def generate(rng: np.random.Generator, n: int, *, split: str | None = "train", teacher_error_rate: float = 0.0,
             families: list[str] | tuple[str, ...] | None = None, max_constraints: int = 2,
             test_every: int = 10) -> list[dict]:
    """``n`` instruction-following records (domains.py record contract), deterministic given ``rng`` and the options.

    Args:
        split: keep only problems with ``split_of(problem.key, test_every) == split`` (``None``: all).
        teacher_error_rate: probability that the teacher slips on exactly one constraint (module
            docstring); 0.0 = every response satisfies all its constraints.
        families: the constraint families to draw from (default: all of :data:`FAMILIES`).
        max_constraints: each prompt has 1..max_constraints constraints (fewer if the families left are
            incompatible with those drawn).
    """
    families = FAMILIES if families is None else tuple(sorted(set(families)))
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown or not families:
        raise ValueError(f"families must be a non-empty subset of {list(FAMILIES)}; unknown: {unknown}")
    if not 1 <= max_constraints <= 3:
        raise ValueError(f"max_constraints must be in [1, 3], got {max_constraints}")
    check_args(split, teacher_error_rate)

    records, attempts = [], 0
    max_attempts = 100 * n * test_every + 1000
    while len(records) < n:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(f"found only {len(records)} of {n} 'if' problems for split {split!r} in "
                             f"{max_attempts} draws (families {list(families)})")
        problem = draw_problem(rng, families, max_constraints)
        if split is not None and split_of(problem.key, test_every) != split:
            continue
        constraints = list(problem.constraints)
        response = render(problem.layout)
        if not all(check_all(response, constraints)):  # the writer is wrong, not the data: fail loudly
            raise AssertionError(f"teacher text breaks its constraints: {response!r} {constraints}")
        planned = constraints
        if rng.random() < teacher_error_rate:
            slip = teacher_slip(problem)
            if slip is None:
                continue  # no single-constraint slip exists for this problem: draw another
            family, layout = slip
            response = render(layout)
            planned = [c for c in constraints if c["type"] != family]
        records.append({
            "domain": DOMAIN,
            "prompt": problem.prompt,
            "reasoning": plan_text(problem.topic, planned),
            "response": response,
            "answer": json.dumps(constraints),
            "id": f"{DOMAIN}/{split or 'all'}/{len(records)}/{problem.key}",
        })
    return records


register(Domain(
    name=DOMAIN, generate=generate, verifier=instruct_reward.score, version="2",  # 2: id carries the problem key
    description="procedural instruction following (IFEval-style constraints) with a slipping teacher"))
