"""Conversation-shaped memory: multi-session chat logs between pairs of people, with questions
whose evidence turns are known.

Deterministic (seeded). One Markdown file per session (``memory/chats/<pair>/<YYYY-MM-DD>.md``,
a heading with the date, then one turn per paragraph, ``Speaker: text``). Sessions are mostly
chit-chat with pronouns and relative times ("yesterday", "last week"); facts are spread over
sessions, often only in a *reply* to the other person's question ("Yes! With my sister Lena."),
and some are updated later (a new job, a move). Every pair uses the same templates, so many
sessions look alike and every fact has near-miss neighbours (the other speaker's pet, another
pair's trip).

Question kinds (evidence = the turns that answer it):

- ``single``: one fact, asked with the words of the question turn rather than the answer;
- ``multi-hop``: two turns from different sessions (who the sister is, where she moved);
- ``temporal``: an event told with a relative time; the question asks when, or names the date;
- ``paraphrase``: a fact asked with none of its distinctive words;
- ``distractor``: the partner holds the same kind of fact with another value;
- ``unanswerable``: a fact of a kind the person never mentioned (the right answer is nothing).

``build_japanese`` writes the same shape in Japanese (夫の誕生日 asked as 旦那さんのバースデー).
Nothing here comes from a public memory benchmark: names, templates and values are made up.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path

Evidence = tuple[str, int]  # (path relative to the workspace, 1-based line)


@dataclass(frozen=True)
class Question:
    kind: str
    text: str
    evidence: tuple[Evidence, ...]  # empty: unanswerable
    lang: str = "en"


@dataclass
class _Session:
    path: str
    day: date
    title: str
    turns: list[tuple[str, str, str | None]] = field(default_factory=list)  # (speaker, text, tag)


NAMES = [
    "Caroline",
    "Melanie",
    "Jonas",
    "Priya",
    "Tomasz",
    "Ingrid",
    "Rafael",
    "Aiko",
    "Dmitri",
    "Leonie",
    "Samuel",
    "Bettina",
    "Omar",
    "Greta",
    "Felipe",
    "Hana",
    "Victor",
    "Nadia",
    "Kwame",
    "Elsa",
    "Marco",
    "Yusuf",
    "Clara",
    "Henrik",
    "Amara",
    "Lucia",
    "Pavel",
    "Zoe",
    "Arjun",
    "Freya",
    "Emil",
    "Sofia",
    "Bruno",
    "Lena",
    "Tariq",
    "Maren",
    "Ivo",
    "Noor",
    "Gustav",
    "Selin",
]
SIBLINGS = ["Lena", "Ruth", "Paula", "Mira", "Jana", "Tess", "Nina", "Vera", "Ada", "Lotte"]
PETS = [
    ("puppy", "dog", "Biscuit"),
    ("kitten", "cat", "Pepper"),
    ("rabbit", "bunny", "Clover"),
    ("puppy", "dog", "Mochi"),
    ("kitten", "cat", "Juniper"),
    ("parrot", "bird", "Kiwi"),
    ("puppy", "dog", "Otto"),
    ("kitten", "cat", "Saffron"),
]
CLASSES = [
    ("pottery", "a lopsided bowl", "clay workshop"),
    ("watercolour", "a sunset over the harbour", "art lessons"),
    ("guitar", "my first full song", "music lessons"),
    ("woodworking", "a small stool", "carpentry course"),
    ("baking", "a sourdough loaf", "bread course"),
    ("salsa", "a whole routine", "dance lessons"),
]
CITIES = ["Lisbon", "Vancouver", "Osaka", "Tallinn", "Melbourne", "Porto", "Denver", "Bergen", "Valencia", "Quebec"]
JOBS = [
    ("nurse", "St. Agnes hospital"),
    ("barista", "a corner cafe"),
    ("accountant", "a logistics firm"),
    ("teacher", "the primary school"),
    ("UX designer", "a fintech startup"),
    ("electrician", "her uncle's company"),
    ("librarian", "the city library"),
    ("sous-chef", "an Italian restaurant"),
]
ALLERGIES = [("shellfish", "seafood"), ("peanuts", "nuts"), ("kiwi fruit", "certain fruit"), ("gluten", "wheat")]
EVENTS = [
    ("ran a charity race for mental health", "the charity run"),
    ("volunteered at the animal shelter", "the shelter"),
    ("went to a jazz concert downtown", "the concert"),
    ("hiked up Mount Kessel", "the hike"),
    ("gave a talk at the library", "the talk"),
    ("planted tomatoes in the community garden", "the garden"),
]
BOOKS = [
    ("The Salt Road", "a family of sailors"),
    ("Quiet Engines", "a robot who learns to paint"),
    ("Winter Orchard", "two sisters running a farm"),
    ("The Glass Cartographer", "a mapmaker in Venice"),
]
CARS = ["a red hatchback", "a used camper van", "an electric scooter", "a grey station wagon"]

CHITCHAT = [
    "Hey! How have you been?",
    "Haha, that's so you.",
    "Oh wow, that sounds amazing!",
    "I know right?",
    "Ugh, this week has been so long.",
    "Same here, honestly.",
    "That's awesome, I'm so happy for you!",
    "Yesterday was a total blur, I barely remember it.",
    "It rained all day again, typical.",
    "Did you see the game last night?",
    "No way! Tell me more.",
    "I'm exhausted but in a good way.",
    "We should grab coffee sometime soon.",
    "Totally agree with you there.",
    "Thanks, that means a lot.",
    "She said it would be fine, and honestly it was.",
    "He keeps forgetting his keys, it's hilarious.",
    "Last week was a bit of a rollercoaster.",
    "I'll tell you all about it next time!",
    "Talk soon, take care!",
    "Honestly I just needed a quiet weekend.",
    "It was fun but I'm glad it's over.",
    "I love that for you.",
    "Wait, really? That's wild.",
    "Good luck, you've got this!",
    "My neighbour's dog barked all night, I'm wrecked.",
    "I tried a new recipe and it kind of worked.",
    "Work has been busy but fine.",
    "Oh, I almost forgot to ask you about that!",
    "Sounds like a plan.",
    "We watched a documentary about whales, so calming.",
    "It's been ages since we talked properly.",
    "I'm thinking of redecorating the living room.",
    "Music always helps me unwind.",
    "I went for a long walk by the river this morning.",
    "My sister called me yesterday, we chatted for hours.",
    "Concerts are so loud these days, I need earplugs.",
    "I've been meaning to read more books this year.",
    "Pets are so much work, but worth it.",
    "Classes after work wear me out.",
    "My old job was stressful too.",
    "Moving is the worst, all those boxes.",
    "Cars are so expensive to keep running.",
]


def _pron(name: str, rng_gender: dict[str, str]) -> tuple[str, str]:
    g = rng_gender[name]
    return ("she", "her") if g == "f" else ("he", "his")


def _long(d: date) -> str:
    return f"{d.day} {d.strftime('%B %Y')}"


def _conversation(
    rng: random.Random, idx: int, a: str, b: str, start: date, sessions: int, turns: tuple[int, int]
) -> tuple[list[_Session], list[tuple[str, str, tuple[str, ...], str | None]]]:
    """The sessions of one pair, and question specs (kind, text, evidence tags, lang)."""
    pair = f"{a.lower()}-{b.lower()}"
    days: list[date] = []
    d = start
    for _ in range(sessions):
        d += timedelta(days=rng.randint(3, 16))
        days.append(d)
    ss = [_Session(f"memory/chats/{pair}/{x.isoformat()}.md", x, f"{a} and {b}, {_long(x)}") for x in days]
    # each session: chit-chat turns, facts are planted as (question turn, answer turn) exchanges
    plan: dict[int, list[list[tuple[str, str, str | None]]]] = {i: [] for i in range(sessions)}
    questions: list[tuple[str, str, tuple[str, ...], str | None]] = []

    def plant(session: int, exchange: list[tuple[str, str, str | None]]) -> None:
        plan[session].append(exchange)

    facts: dict[str, dict[str, object]] = {a: {}, b: {}}
    for person, other in ((a, b), (b, a)):
        tag = f"{idx}:{person}"
        kinds = rng.sample(["pet", "class", "sister", "job", "event", "allergy", "book", "car"], 6)
        for kind in kinds:
            s1 = rng.randrange(sessions)
            if kind == "pet":
                young, adult, pet_name = rng.choice(PETS)
                facts[person]["pet"] = adult
                plant(
                    s1,
                    [
                        (other, f"Did you end up getting that {young} you were talking about?", None),
                        (
                            person,
                            f"Yes!! We named {'him' if rng.random() < 0.5 else 'her'} {pet_name}, "
                            "already sleeps on my feet every night.",
                            f"{tag}:pet",
                        ),
                    ],
                )
                questions += [
                    ("single", f"What is the name of {person}'s {adult}?", (f"{tag}:pet",), None),
                    ("paraphrase", f"What did {person} call the animal that joined the family?", (f"{tag}:pet",), None),
                ]
            elif kind == "class":
                cls, made, para = rng.choice(CLASSES)
                facts[person]["class"] = cls
                plant(
                    s1,
                    [
                        (other, f"Are you still going to those {cls} classes?", None),
                        (
                            person,
                            f"Every Thursday! Last week I finally finished {made}, pretty proud of it.",
                            f"{tag}:class",
                        ),
                    ],
                )
                questions += [
                    ("single", f"What did {person} make in {cls} class?", (f"{tag}:class",), None),
                    ("paraphrase", f"What has {person} created at the {para}?", (f"{tag}:class",), None),
                ]
            elif kind == "sister":
                sib, city = rng.choice(SIBLINGS), rng.choice(CITIES)
                s2 = rng.choice([i for i in range(sessions) if i != s1] or [s1])
                facts[person]["sister"] = sib
                plant(
                    s1,
                    [
                        (other, "Who did you go to the street festival with?", None),
                        (
                            person,
                            f"My little sister {sib}, she came up for the weekend. We ate way too much.",
                            f"{tag}:sister",
                        ),
                    ],
                )
                plant(
                    s2,
                    [
                        (person, f"Big news, {sib} just moved to {city} for a new job!", f"{tag}:move"),
                        (other, "Whoa, that's far. You'll have to visit.", None),
                    ],
                )
                questions += [
                    ("single", f"Who went to the street festival with {person}?", (f"{tag}:sister",), None),
                    ("multi-hop", f"Which city did {person}'s sister move to?", (f"{tag}:sister", f"{tag}:move"), None),
                ]
            elif kind == "job":
                (j1, w1), (j2, w2) = rng.sample(JOBS, 2)
                s_old, s_new = sorted(rng.sample(range(sessions), 2)) if sessions > 1 else (0, 0)
                facts[person]["job"] = j2
                plant(
                    s_old,
                    [
                        (other, "How's work going these days?", None),
                        (person, f"Still a {j1} at {w1}, long shifts but nice people.", f"{tag}:job-old"),
                    ],
                )
                plant(
                    s_new,
                    [
                        (
                            person,
                            f"I handed in my notice last month. Starting as a {j2} at {w2} on Monday!",
                            f"{tag}:job-new",
                        ),
                        (other, "That's huge, congrats!", None),
                    ],
                )
                questions += [
                    ("single", f"What is {person}'s current job?", (f"{tag}:job-new",), None),
                    ("temporal", f"What did {person} do for work before changing jobs?", (f"{tag}:job-old",), None),
                ]
            elif kind == "event":
                what, short = rng.choice(EVENTS)
                when = ss[s1].day - timedelta(days=1)
                facts[person]["event"] = short
                plant(
                    s1,
                    [
                        (other, "What did you get up to?", None),
                        (person, f"Yesterday I {what}. Exhausting, but so worth it.", f"{tag}:event"),
                    ],
                )
                questions += [
                    ("temporal", f"When did {person} do {short}?", (f"{tag}:event",), None),
                    ("temporal", f"What did {person} do on {_long(when)}?", (f"{tag}:event",), None),
                ]
            elif kind == "allergy":
                food, para = rng.choice(ALLERGIES)
                facts[person]["allergy"] = food
                plant(
                    s1,
                    [
                        (other, "Want to try the new place on Elm Street? Their menu looks great.", None),
                        (
                            person,
                            f"Only if they have options, I'm allergic to {food} and it's serious.",
                            f"{tag}:allergy",
                        ),
                    ],
                )
                questions += [
                    ("single", f"What is {person} allergic to?", (f"{tag}:allergy",), None),
                    ("paraphrase", f"Which {para} must {person} avoid eating?", (f"{tag}:allergy",), None),
                ]
            elif kind == "book":
                title, about = rng.choice(BOOKS)
                facts[person]["book"] = title
                plant(
                    s1,
                    [
                        (other, "Read anything good lately?", None),
                        (person, f"'{title}', it's about {about}. Couldn't put it down.", f"{tag}:book"),
                    ],
                )
                questions += [("single", f"Which book did {person} recommend?", (f"{tag}:book",), None)]
            elif kind == "car":
                car = rng.choice(CARS)
                facts[person]["car"] = car
                plant(
                    s1,
                    [
                        (person, f"We finally bought {car}! Picked it up on Saturday.", f"{tag}:car"),
                        (other, "Road trip time!", None),
                    ],
                )
                questions += [("paraphrase", f"What vehicle did {person} get?", (f"{tag}:car",), None)]
    # distractors: both speakers hold the same kind of fact; the question names one of them
    for kind, template in (
        ("pet", "What is the name of {p}'s {v}?"),
        ("class", "What did {p} make in {v} class?"),
        ("allergy", "What is {p} allergic to?"),
    ):
        if kind in facts[a] and kind in facts[b]:
            for p in (a, b):
                questions.append(("distractor", template.format(p=p, v=facts[p][kind]), (f"{idx}:{p}:{kind}",), None))
    # unanswerable: a kind of fact this person never mentioned (other people may have)
    for p in (a, b):
        missing = [k for k in ("pet", "class", "sister", "job", "allergy", "book", "car") if k not in facts[p]]
        for k in missing[:1]:
            text = {
                "pet": f"What is the name of {p}'s horse?",
                "class": f"What did {p} make in ceramics class?",
                "sister": f"Which city did {p}'s brother move to?",
                "job": f"Where does {p} work as a pilot?",
                "allergy": f"Is {p} allergic to cats?",
                "book": f"Which book did {p} write?",
                "car": f"What colour is {p}'s motorbike?",
            }[k]
            questions.append(("unanswerable", text, (), None))
    for i, s in enumerate(ss):
        n = rng.randint(*turns)
        speakers = [a, b]
        filler = [(speakers[t % 2], rng.choice(CHITCHAT), None) for t in range(n)]
        for ex in plan[i]:
            at = rng.randint(1, len(filler))
            filler[at:at] = ex
        s.turns = filler
    return ss, questions


def _write(root: Path, sessions: list[_Session]) -> dict[str, Evidence]:
    where: dict[str, Evidence] = {}
    for s in sessions:
        lines = [f"# {s.title}", ""]
        for speaker, text, tag in s.turns:
            if tag is not None:
                where[tag] = (s.path, len(lines) + 1)
            lines += [f"{speaker}: {text}", ""]
        path = root / s.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines), encoding="utf-8")
    return where


def build_conversations(root: Path, *, chunks: int = 1000, seed: int = 11, max_questions: int = 400) -> list[Question]:
    """Write about ``chunks`` turns of conversation under ``root`` (a workspace); the questions.

    Each turn is one paragraph and so one chunk. Questions come from the first pairs, at most
    ``max_questions``; the rest of the memory is the haystack (more similar pairs).
    """
    rng = random.Random(seed)
    sessions: list[_Session] = []
    specs: list[tuple[str, str, tuple[str, ...], str | None]] = []
    total, idx = 0, 0
    people = list(NAMES)
    while total < chunks:
        a, b = people[(2 * idx) % len(people)], people[(2 * idx + 1) % len(people)]
        if idx >= len(people) // 2:  # more pairs than names: suffix them apart
            a, b = f"{a} {chr(65 + idx % 26)}.", f"{b} {chr(65 + (idx // 26) % 26)}."
        n_sessions = rng.randint(12, 20)
        ss, qs = _conversation(
            rng, idx, a, b, date(2023, 1, 1) + timedelta(days=rng.randint(0, 300)), n_sessions, (14, 26)
        )
        sessions += ss
        specs += qs
        total += sum(len(s.turns) for s in ss)
        idx += 1
    where = _write(root, sessions)
    out = [Question(kind, text, tuple(where[t] for t in tags)) for kind, text, tags, _ in specs]
    rng.shuffle(out)
    return out[:max_questions]


# --- Japanese -----------------------------------------------------------------------------------

JA_NAMES = [("健太", "美咲"), ("陽子", "大輔"), ("翔", "さくら"), ("直子", "拓也"), ("恵", "亮"), ("由美", "誠")]
JA_CHITCHAT = [
    "久しぶり！元気だった？",
    "昨日は一日中雨だったね。",
    "それはすごい！",
    "本当にそう思う。",
    "今週は忙しかったよ。",
    "また今度ゆっくり話そう。",
    "ありがとう、うれしい！",
    "先週はちょっとバタバタしてた。",
    "週末は家でのんびりしてた。",
    "昨日の夜、ドラマを見たよ。",
    "最近寒くなってきたね。",
    "駅前に新しいカフェができたらしいよ。",
    "仕事は相変わらずかな。",
    "今度ご飯行こうよ。",
    "それ、わかる！",
    "朝から散歩してきた。",
    "妹から電話があって長話しちゃった。",
    "ペットを飼うのは大変だよね。",
    "誕生日っていくつになっても楽しいよね。",
    "引っ越しって本当に疲れるよね。",
    "料理教室に興味があるんだ。",
    "旅行の計画を立てるのが好き。",
]
# (planted exchange builder, question, paraphrased question) per fact kind
JA_FACTS = [
    (
        "birthday",
        "夫の誕生日は{m}月{d}日だから、プレゼントを探しているところ。",
        "{p}さんの夫の誕生日はいつ？",
        "{p}さんの旦那さんのバースデーはいつ？",
    ),
    (
        "pet",
        "うん、{v}って名前にしたの。毎晩足元で寝てるよ。",
        "{p}さんの子犬の名前は？",
        "{p}さんが迎えたワンちゃんは何と呼ばれている？",
    ),
    ("move", "来月、{v}に引っ越すことになったんだ。", "{p}さんはどこに引っ越す？", "{p}さんの新しい住まいはどの街？"),
    (
        "allergy",
        "私、{v}アレルギーだから、そこは無理かも。",
        "{p}さんのアレルギーは何？",
        "{p}さんが食べられないものは？",
    ),
    ("hobby", "毎週土曜に{v}教室に通ってるよ。", "{p}さんは何の教室に通っている？", "{p}さんの週末の習い事は？"),
]
JA_PROMPTS = {
    "birthday": "最近何か悩んでる？",
    "pet": "子犬、結局飼ったの？",
    "move": "何か新しいニュースある？",
    "allergy": "駅前の新しいお店、行ってみない？",
    "hobby": "週末は何してるの？",
}
JA_VALUES = {
    "pet": ["ポチ", "モモ", "コタロウ", "ハナ"],
    "move": ["福岡", "札幌", "金沢", "仙台"],
    "allergy": ["えび", "そば", "卵", "ピーナッツ"],
    "hobby": ["陶芸", "書道", "料理", "ヨガ"],
}
JA_UNANSWERABLE = ["{p}さんの車の色は？", "{p}さんの兄の仕事は何？", "{p}さんが去年読んだ小説は？"]


def build_japanese(root: Path, *, seed: int = 5, filler_sessions: int = 6) -> list[Question]:
    """Japanese chat logs under ``root/memory/chats-ja``; paraphrase and same-word questions."""
    rng = random.Random(seed)
    sessions: list[_Session] = []
    specs: list[tuple[str, str, tuple[str, ...]]] = []
    for idx, (a, b) in enumerate(JA_NAMES):
        start = date(2024, 3, 1) + timedelta(days=idx * 7)
        days = [start + timedelta(days=9 * i) for i in range(filler_sessions)]
        ss = [
            _Session(f"memory/chats-ja/{idx}/{x.isoformat()}.md", x, f"{a}と{b}の会話 {x.year}年{x.month}月{x.day}日")
            for x in days
        ]
        plan: dict[int, list[list[tuple[str, str, str | None]]]] = {i: [] for i in range(len(ss))}
        for person, other in ((a, b), (b, a)):
            for kind, fact, same, para in rng.sample(JA_FACTS, 3):
                v = rng.choice(JA_VALUES.get(kind, [""]))
                text = fact.format(v=v, m=rng.randint(1, 12), d=rng.randint(1, 28))
                tag = f"ja{idx}:{person}:{kind}"
                plan[rng.randrange(len(ss))].append([(other, JA_PROMPTS[kind], None), (person, text, tag)])
                specs += [("single", same.format(p=person), (tag,)), ("paraphrase", para.format(p=person), (tag,))]
            specs.append(("unanswerable", rng.choice(JA_UNANSWERABLE).format(p=person), ()))
        for i, s in enumerate(ss):
            turns = [((a, b)[t % 2], rng.choice(JA_CHITCHAT), None) for t in range(rng.randint(20, 30))]
            for ex in plan[i]:
                at = rng.randint(1, len(turns))
                turns[at:at] = ex
            s.turns = turns
        sessions += ss
    where = _write(root, sessions)
    return [Question(kind, text, tuple(where[t] for t in tags), "ja") for kind, text, tags in specs]
