"""Procedural chat preferences (domain ``"pref"``): short requests with a chosen and a rejected answer.

The data behind RLHF with a Bradley-Terry reward model (METHOD.md "Rewards per domain": RLHF). A request
asks for one or two facts, tips or reasons about a topic from a closed list; the chosen answer gives
exactly that in short on-topic sentences, the rejected one is worse in one of four ways:

    prompt:    "Give one tip for sleep."
    reasoning: "Topic: sleep. Give one tip, short and on topic."
    response:  "Keep your room dark for better sleep."                         (chosen; the SFT target)
    answer:    {"chosen": "Keep your room dark for better sleep.",
                "rejected": "That is a very good question. Keep your room dark for better sleep. ...",
                "kind": "verbose", "topic": "sleep", "keywords": ["sleep"], "min_words": 3, "max_words": 10}

    verbose     the chosen answer padded with filler sentences until it is over ``max_words``
    repetitive  the chosen answer with its first sentence said once more
    off_topic   an answer of the same shape about another topic
    unhelpful   "I don't know." and the like

``answer`` also carries what the proxy judge needs (``nemocascade.rewards.pref``: topic keywords, word
bounds); the RM stage trains on (``chosen``, ``rejected``). Every pair is checked before it is emitted:
the chosen answer scores 1 with the proxy judge and the rejected one less.

**Imperfect teacher.** With probability ``teacher_error_rate`` the teacher's own response (the SFT
target) is the *verbose* version of the chosen answer, and its plan says so; the pair in ``answer`` is
unchanged. SFT then imitates some padding, which RLHF can remove.

Held-out split: by the request (topic, aspect, count), not its wording, so a prompt never crosses splits.
An off-topic answer in a train pair is always another *train* request's answer, so no held-out answer
text occurs in training in any role; held-out off-topic pairs (rejected = an answer the RM saw preferred
for its own request) then measure whether the RM reads the prompt.
With 16 topics x 3 aspects x 2 counts there are 96 requests, about 10 of them held out at ``test_every=10``.
``compound=True`` asks two-part requests instead (two topics, an aspect each: 2,160 requests), enough for n >= 500
distinct held-out requests at ``test_every=4``.
"""

from __future__ import annotations

import json

import numpy as np

from nemocascade.data.domains import Domain, check_args, register, split_of
from nemocascade.rewards import pref as pref_reward
from nemocascade.rewards import pref as judge

DOMAIN = "pref"
KINDS = ("verbose", "repetitive", "off_topic", "unhelpful")
MIN_WORDS, WORDS_PER_SENTENCE = 3, 10  # max_words = WORDS_PER_SENTENCE * count (sentences have <= 9 words)
COUNTS = {1: "one", 2: "two"}
# aspect -> (request wordings for count 1 and 2, plan noun singular/plural)
ASPECTS = {
    "fact": ((("Tell me one thing about {t}.", "Say one thing about {t}."),
              ("Tell me two things about {t}.", "Say two things about {t}.")), ("fact", "facts")),
    "tip": ((("Give one tip for {t}.", "Share one tip for {t}."),
             ("Give two tips for {t}.", "Share two tips for {t}.")), ("tip", "tips")),
    "reason": ((("Give one reason to enjoy {t}.", "Why enjoy {t}? One reason."),
                ("Give two reasons to enjoy {t}.", "Why enjoy {t}? Two reasons.")), ("reason", "reasons")),
}
# topic -> (keyword, {aspect: three sentences}); every sentence holds its topic's keyword and no other's.
TOPICS = {
    "sleep": ("sleep", {
        "fact": ("Sleep helps the body rest and heal.", "Most adults need eight hours of sleep.",
                 "Dreams come during deep sleep."),
        "tip": ("Sleep at the same time each night.", "Keep your room dark for better sleep.",
                "Avoid screens for an hour before sleep."),
        "reason": ("Good sleep makes you feel fresh.", "Sleep helps you learn and remember.",
                   "After good sleep, the day feels easy.")}),
    "running": ("running", {
        "fact": ("Running is a simple way to stay fit.", "Running makes the heart and legs strong.",
                 "Many towns hold running races each year."),
        "tip": ("Start running slowly and build up.", "Wear good shoes when running.",
                "Drink water before and after running."),
        "reason": ("Running clears the mind.", "Running outside lets you see new places.",
                   "Running needs no special place or tools.")}),
    "cooking": ("cook", {
        "fact": ("Cooking turns raw food into meals.", "People cook with heat from fire or stoves.",
                 "Cooking is a skill anyone can learn."),
        "tip": ("Read the whole recipe before you cook.", "Taste the food while you cook.",
                "Keep your knives sharp when cooking."),
        "reason": ("Cooking at home saves money.", "Cooking for friends is a gift.",
                   "Cooking your own food is healthy.")}),
    "reading": ("reading", {
        "fact": ("Reading opens the door to new worlds.", "Reading every day builds a large vocabulary.",
                 "Libraries lend books for free reading."),
        "tip": ("Set aside quiet time for reading.", "Start reading with short, fun books.",
                "Try reading for ten minutes before bed."),
        "reason": ("Reading teaches you new ideas.", "Reading is a calm way to relax.",
                   "Reading stories helps you understand people.")}),
    "gardens": ("garden", {
        "fact": ("A garden can grow flowers, fruit and herbs.", "Gardens need sun, water and good soil.",
                 "Bees and birds visit gardens."),
        "tip": ("Water your garden early in the morning.", "Pull weeds from the garden each week.",
                "Plant garden seeds after the last frost."),
        "reason": ("A garden gives you fresh food.", "Time in the garden lowers stress.",
                   "A garden makes a home more beautiful.")}),
    "swimming": ("swim", {
        "fact": ("Swimming works every muscle in the body.", "People swim in pools, lakes and the sea.",
                 "Swimming is a sport in the Olympics."),
        "tip": ("Learn to swim with a trained coach.", "Never swim alone in deep water.",
                "Warm up before you swim."),
        "reason": ("Swimming is gentle on the joints.", "Swimming keeps you cool in summer.",
                   "Swimming is fun for the whole family.")}),
    "music": ("music", {
        "fact": ("Music is made of rhythm and melody.", "People make music with voices and instruments.",
                 "Every culture has its own music."),
        "tip": ("Practice music a little every day.", "Listen to new music each week.",
                "Learn music with a song you love."),
        "reason": ("Music lifts your mood.", "Music helps people dance and celebrate.",
                   "Playing music trains the brain.")}),
    "travel": ("travel", {
        "fact": ("Travel means going to new places.", "People travel by car, train, plane or boat.",
                 "Travel can be near or far from home."),
        "tip": ("Pack light when you travel.", "Learn a few words before you travel.",
                "Keep copies of your travel papers."),
        "reason": ("Travel shows you new cultures.", "Travel makes great memories.",
                   "Travel helps you meet new people.")}),
    "studying": ("study", {
        "fact": ("Study means learning with focus.", "Students study at school and at home.",
                 "Good study takes time and care."),
        "tip": ("Study in short blocks with breaks.", "Find a quiet place to study.",
                "Test yourself after you study."),
        "reason": ("Study helps you pass exams.", "Study opens doors to good jobs.",
                   "Study grows your skills.")}),
    "coffee": ("coffee", {
        "fact": ("Coffee is made from roasted beans.", "Coffee has caffeine, which keeps you awake.",
                 "Many people drink coffee in the morning."),
        "tip": ("Use fresh beans for better coffee.", "Do not drink coffee late in the day.",
                "Store coffee in a dry, closed jar."),
        "reason": ("Coffee helps you feel awake.", "Coffee has a rich, warm taste.",
                   "Coffee with friends is a nice break.")}),
    "bread": ("bread", {
        "fact": ("Bread is made from flour, water and yeast.", "Bread is baked in a hot oven.",
                 "People have made bread for thousands of years."),
        "tip": ("Let bread dough rise in a warm place.", "Store bread in a cool, dry spot.",
                "Knead the bread dough for ten minutes."),
        "reason": ("Fresh bread smells wonderful.", "Bread goes well with soup or cheese.",
                   "Baking bread at home is relaxing.")}),
    "dogs": ("dog", {
        "fact": ("Dogs are loyal and friendly animals.", "A dog can learn many tricks.",
                 "Dogs have a strong sense of smell."),
        "tip": ("Walk your dog every day.", "Reward your dog when it obeys.",
                "Take your dog to the vet each year."),
        "reason": ("A dog is a loyal friend.", "Dogs make you go outside more.",
                   "Dogs help people feel less lonely.")}),
    "chess": ("chess", {
        "fact": ("Chess is a game for two players.", "Chess is played on a board of 64 squares.",
                 "Each chess player starts with sixteen pieces."),
        "tip": ("Control the center of the chess board.", "Think before each chess move.",
                "Learn from famous chess games."),
        "reason": ("Chess trains careful thinking.", "Chess can be played anywhere.",
                   "Chess teaches you patience.")}),
    "painting": ("paint", {
        "fact": ("Painting uses color on paper or canvas.", "Artists paint with brushes, knives or fingers.",
                 "Some paint is made with oil or water."),
        "tip": ("Start painting with just three colors.", "Clean your paint brushes after use.",
                "Paint simple shapes first."),
        "reason": ("Painting lets you express feelings.", "Painting is calm and relaxing.",
                   "A painting can last for centuries.")}),
    "camping": ("camp", {
        "fact": ("Camping means staying outdoors in a tent.", "People camp in forests, hills and parks.",
                 "A camp fire keeps everyone warm."),
        "tip": ("Check the weather before you camp.", "Pack a map when camping.",
                "Leave your camp site clean."),
        "reason": ("Camping brings you close to nature.", "Camping is a cheap holiday.",
                   "Camping lets you see the stars.")}),
    "winter": ("winter", {
        "fact": ("Winter is the coldest season.", "Snow often falls in winter.",
                 "Winter days are short and dark."),
        "tip": ("Dress in layers in winter.", "Drink warm drinks in winter.", "Keep winter boots dry."),
        "reason": ("Winter brings snow for sledding.", "Winter is great for skiing.",
                   "Winter evenings are cozy at home.")}),
}
FILLER = ("That is a very good question.", "I am happy to help with this.", "There is much more to say here.",
          "I hope this answer is useful.", "Let me know if you want more.", "Thank you for asking me.")
UNHELPFUL = ("I don't know.", "I am not sure.", "Sorry, I cannot help with that.")


def verbose(chosen: list[str], max_words: int, rng: np.random.Generator) -> str:
    """Filler before and after the chosen sentences, one more filler at a time until over ``max_words``."""
    order = [FILLER[i] for i in rng.permutation(len(FILLER))]
    head, tail = order[:1], order[1:2]
    for extra in order[2:]:
        if len(judge.words(" ".join(head + chosen + tail))) > max_words:
            break
        tail.append(extra)
    return " ".join(head + chosen + tail)


def rejected_answer(kind: str, topic: str, aspect: str, chosen: list[str], max_words: int,
                    rng: np.random.Generator, others: list[str]) -> str:
    """The rejected answer of ``kind``; an off-topic one answers the same request about one of ``others``."""
    if kind == "verbose":
        return verbose(chosen, max_words, rng)
    if kind == "repetitive":
        return " ".join(chosen + chosen[:1])
    if kind == "off_topic":
        other = others[int(rng.integers(len(others)))]
        pool = TOPICS[other][1][aspect]
        return " ".join(pool[i] for i in rng.choice(len(pool), len(chosen), replace=False))
    if kind == "unhelpful":
        return UNHELPFUL[int(rng.integers(len(UNHELPFUL)))]
    raise ValueError(f"unknown rejected kind {kind!r}; kinds: {KINDS}")


def generate(rng: np.random.Generator, n: int, *, split: str | None = "train", teacher_error_rate: float = 0.0,
             kinds: dict[str, float] | None = None, test_every: int = 10, compound: bool = False) -> list[dict]:
    """``n`` preference records (domains.py record contract and module docstring), deterministic given ``rng``.

    Args:
        split: keep only requests with ``split_of(key, test_every) == split`` (``None``: all).
        teacher_error_rate: probability that the response (SFT target) is the verbose answer.
        kinds: rejected kind -> weight (default: the four kinds equally).
        compound: two-part requests instead (`compound_request`): 2,160 distinct requests, not 96.
    """
    check_args(split, teacher_error_rate)
    kinds = dict(kinds or {k: 1.0 for k in KINDS})
    bad = sorted(set(kinds) - set(KINDS))
    if bad or not kinds or min(kinds.values()) < 0 or sum(kinds.values()) <= 0:
        raise ValueError(f"kinds={kinds}: keys must be among {KINDS}, weights >= 0 with a positive sum")
    kind_names, kind_p = list(kinds), np.asarray(list(kinds.values()), float) / sum(kinds.values())
    topics, aspects = sorted(TOPICS), sorted(ASPECTS)
    records, attempts = [], 0
    while len(records) < n:
        attempts += 1
        if attempts > 100 * n * test_every + 1000:
            raise ValueError(f"found only {len(records)} of {n} preference requests for split {split!r}")
        if compound:
            record = compound_request(rng, kind_names, kind_p, split, test_every, teacher_error_rate)
            if record is not None:
                records.append(record | {"id": f"{DOMAIN}/{split or 'all'}/{len(records)}/{record['id']}"})
            continue
        topic, aspect = topics[int(rng.integers(len(topics)))], aspects[int(rng.integers(len(aspects)))]
        count = int(rng.integers(1, 3))
        key = f"{topic}:{aspect}:{count}"
        if split is not None and split_of(key, test_every) != split:
            continue
        keyword, table = TOPICS[topic]
        wordings, (noun, nouns) = ASPECTS[aspect]
        prompt = wordings[count - 1][int(rng.integers(2))].format(t=topic)
        pool = table[aspect]
        chosen_sents = [pool[i] for i in rng.choice(len(pool), count, replace=False)]
        chosen = " ".join(chosen_sents)
        max_words = WORDS_PER_SENTENCE * count
        kind = kind_names[int(rng.choice(len(kind_names), p=kind_p))]
        # Train pairs answer off topic only with other *train* requests' answers: a held-out request's
        # answer is never seen in training, not even as a negative (which would teach "this text is bad").
        others = [t for t in topics if t != topic
                  and (split != "train" or split_of(f"{t}:{aspect}:{count}", test_every) == "train")]
        rejected = rejected_answer(kind, topic, aspect, chosen_sents, max_words, rng, others)
        slipped = bool(rng.random() < teacher_error_rate)
        padded = verbose(chosen_sents, max_words, rng)  # always drawn: the same problems at every rate
        answer = {"chosen": chosen, "rejected": rejected, "kind": kind, "topic": topic, "keywords": [keyword],
                  "min_words": MIN_WORDS, "max_words": max_words}
        if judge.judge(chosen, answer) != 1.0 or judge.judge(rejected, answer) >= 1.0:
            raise AssertionError(f"proxy judge disagrees with the pair for {key} ({kind}): {chosen!r} / {rejected!r}")
        style = "with some friendly extra words" if slipped else "short and on topic"
        records.append({
            "domain": DOMAIN,
            "prompt": prompt,
            "reasoning": f"Topic: {topic}. Give {COUNTS[count]} {noun if count == 1 else nouns}, {style}.",
            "response": padded if slipped else chosen,
            "answer": json.dumps(answer),
            "id": f"{DOMAIN}/{split or 'all'}/{len(records)}/{key}",
        })
    return records


OFF_TOPIC_PARTS = ("second", "first", "one_part", "one_topic")


def compound_off_topic(rng, part1, part2, topics) -> str:
    """An off-topic answer to a two-part request, one of ``OFF_TOPIC_PARTS`` at random: the second part or the
    first answered about a third topic, one part left out, or both sentences about the first topic. A policy
    under RLHF makes all four mistakes, and a judge shown only one lets the others through, so a judge learning
    from these pairs must see them all. ``part`` = (topic, aspect, chosen sentence)."""
    (t1, a1, s1), (t2, a2, s2) = part1, part2
    how = OFF_TOPIC_PARTS[int(rng.integers(len(OFF_TOPIC_PARTS)))]
    if how in ("second", "first"):
        other = [t for t in topics if t not in (t1, t2)][int(rng.integers(len(topics) - 2))]
        if how == "second":
            return f"{s1} {TOPICS[other][1][a2][int(rng.integers(3))]}"
        return f"{TOPICS[other][1][a1][int(rng.integers(3))]} {s2}"
    if how == "one_part":
        return (s1, s2)[int(rng.integers(2))]
    same = [s for s in TOPICS[t1][1][a2] if s != s1]
    return f"{s1} {same[int(rng.integers(len(same)))]}"


def compound_request(rng, kind_names, kind_p, split, test_every: int, teacher_error_rate: float) -> dict | None:
    """One two-part request ("Give one tip for sleep. Tell me one thing about coffee."), or None when its key
    falls in another split. Two distinct topics, an aspect each, one sentence each: 16 x 15 x 3 x 3 = 2,160
    requests, split by the pair (its ``id`` here is the key; `generate` prefixes the rest). The chosen answer is
    one sentence per part; the proxy judge asks for both topics' keywords (``require_all``). Rejected kinds as
    single requests, but an off-topic one misses one part (`compound_off_topic`; the held-out split is
    compositional, every single sentence also occurs in training)."""
    topics, aspects = sorted(TOPICS), sorted(ASPECTS)
    i, j = rng.choice(len(topics), 2, replace=False)
    (t1, t2), (a1, a2) = (topics[i], topics[j]), (aspects[int(rng.integers(3))], aspects[int(rng.integers(3))])
    key = f"{t1}:{a1}+{t2}:{a2}"
    if split is not None and split_of(key, test_every) != split:
        return None
    w1, w2 = int(rng.integers(2)), int(rng.integers(2))
    prompt = f"{ASPECTS[a1][0][0][w1].format(t=t1)} {ASPECTS[a2][0][0][w2].format(t=t2)}"
    s1 = TOPICS[t1][1][a1][int(rng.integers(3))]
    s2 = TOPICS[t2][1][a2][int(rng.integers(3))]
    chosen_sents, max_words = [s1, s2], 2 * WORDS_PER_SENTENCE
    kind = kind_names[int(rng.choice(len(kind_names), p=kind_p))]
    if kind == "off_topic":
        rejected = compound_off_topic(rng, (t1, a1, s1), (t2, a2, s2), topics)
    else:
        rejected = rejected_answer(kind, t1, a1, chosen_sents, max_words, rng, [])
    slipped = bool(rng.random() < teacher_error_rate)
    padded = verbose(chosen_sents, max_words, rng)
    chosen = " ".join(chosen_sents)
    answer = {"chosen": chosen, "rejected": rejected, "kind": kind, "topic": f"{t1}+{t2}",
              "keywords": [TOPICS[t1][0], TOPICS[t2][0]], "require_all": True, "min_words": MIN_WORDS,
              "max_words": max_words}
    if judge.judge(chosen, answer) != 1.0 or judge.judge(rejected, answer) >= 1.0:
        raise AssertionError(f"proxy judge disagrees with the pair for {key} ({kind}): {chosen!r} / {rejected!r}")
    style = "with some friendly extra words" if slipped else "short and on topic"
    return {"domain": DOMAIN, "prompt": prompt,
            "reasoning": f"Topics: {t1}, {t2}. Give one {ASPECTS[a1][1][0]} and one {ASPECTS[a2][1][0]}, {style}.",
            "response": padded if slipped else chosen, "answer": json.dumps(answer), "id": key}


register(Domain(
    name=DOMAIN, generate=generate, verifier=pref_reward.score, version="2",
    description="chat preferences: chosen vs verbose / repetitive / off-topic / unhelpful answers (RLHF)"))
