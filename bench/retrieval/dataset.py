"""A generated agent memory with planted facts, and questions whose answer lines are known.

Deterministic (seeded). The memory looks like what an agent accumulates: daily logs of several
conversation sessions (``memory/YYYY-MM-DD.md``), topic notes (``memory/notes/*.md``) and a
``MEMORY.md``. Each planted fact sits on one known line among filler lines that reuse the same
vocabulary, so neither word overlap nor topic alone finds it.

Question kinds: ``same`` (asked with the fact's own words), ``paraphrase`` (other words, same
meaning), ``japanese`` (Japanese facts asked in Japanese) and ``unanswerable`` (about things the
memory does not hold: the right answer is an empty list).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

# (fact line, same-words question, paraphrased question)
FACTS_EN: list[tuple[str, str, str]] = [
    (
        "My sister Emma works as a veterinarian in Portland.",
        "Where does my sister Emma work as a veterinarian?",
        "What is Emma's job?",
    ),
    (
        "The wifi password at the lake cabin is maple-river-42.",
        "What is the wifi password at the lake cabin?",
        "How do I get online at the cottage by the water?",
    ),
    (
        "Dr. Patel is my dentist; her clinic is on Fulton Street.",
        "Which street is the clinic of my dentist Dr. Patel on?",
        "Where do I go to get my teeth checked?",
    ),
    (
        "I am allergic to penicillin and must never take it.",
        "Which medicine am I allergic to, penicillin?",
        "Are there any antibiotics I react badly to?",
    ),
    (
        "The quarterly budget review moved to the second Thursday of March.",
        "When is the quarterly budget review?",
        "When do we go over the finances this quarter?",
    ),
    (
        "Our project codename for the mobile rewrite is Bluebird.",
        "What is the project codename for the mobile rewrite?",
        "What do we call the new phone app effort internally?",
    ),
    (
        "My passport expires on 14 August 2027.",
        "When does my passport expire?",
        "Until when is my travel document valid?",
    ),
    (
        "Tom prefers to be contacted on Signal, never by email.",
        "How does Tom prefer to be contacted?",
        "What's the best way to reach Tom?",
    ),
    (
        "The car insurance renewal with Allianz is due every October.",
        "When is the car insurance renewal with Allianz due?",
        "When do I need to extend the policy for my vehicle?",
    ),
    (
        "My daughter Mia's school pickup is at 3:15 pm on weekdays.",
        "What time is Mia's school pickup?",
        "When should I collect my kid from class?",
    ),
    (
        "The spare house key is hidden under the blue flower pot.",
        "Where is the spare house key hidden?",
        "If I'm locked out, where can I find another way in?",
    ),
    (
        "We agreed to cut cloud spending by 15 percent next year.",
        "By how much did we agree to cut cloud spending?",
        "What was decided about reducing our hosting costs?",
    ),
    (
        "My favourite restaurant is Osteria Roma on Elm Avenue.",
        "What is my favourite restaurant?",
        "Where do I like to go out for dinner the most?",
    ),
    (
        "The server backups run nightly at 2 am to the S3 bucket nt-backups.",
        "When do the server backups run?",
        "At what hour is our data copied offsite?",
    ),
    (
        "Grandma's birthday is on 9 June; she loves orchids.",
        "When is Grandma's birthday?",
        "What flowers should I bring my grandmother and when?",
    ),
    (
        "I run the Berlin marathon in September; my goal is under four hours.",
        "What is my goal for the Berlin marathon?",
        "How fast do I hope to finish the long race in Germany?",
    ),
    (
        "The landlord, Mr. Okafor, wants rent paid by the 3rd of each month.",
        "When does the landlord Mr. Okafor want rent paid?",
        "What's the deadline for paying for the apartment each month?",
    ),
    (
        "Jenna from accounting approved the new laptop purchase.",
        "Who approved the new laptop purchase?",
        "Which finance colleague said yes to buying the computer?",
    ),
    ("My blood type is O negative.", "What is my blood type?", "Which group would a transfusion need to match for me?"),
    (
        "The team offsite will be in Lisbon from 12 to 14 May.",
        "Where will the team offsite be?",
        "Which city are we traveling to together as a group in spring?",
    ),
    (
        "I stopped drinking coffee and switched to green tea in January.",
        "When did I switch to green tea from coffee?",
        "What hot beverage do I have these days instead of espresso?",
    ),
    (
        "The API rate limit for the partner integration is 600 requests per minute.",
        "What is the API rate limit for the partner integration?",
        "How many calls can the partner make before being throttled?",
    ),
    (
        "Lucas is learning the violin and has lessons on Saturday mornings.",
        "When does Lucas have violin lessons?",
        "What instrument is the boy practicing, and on which day?",
    ),
    (
        "The gym membership costs 45 euros a month and renews on the 1st.",
        "How much does the gym membership cost?",
        "What do I pay for working out each month?",
    ),
    (
        "My manager, Priya, wants the status report every Friday before noon.",
        "When does my manager Priya want the status report?",
        "When is my weekly update due to my boss?",
    ),
    (
        "The plumber fixed the kitchen sink leak; the invoice was 180 dollars.",
        "How much was the invoice for fixing the kitchen sink leak?",
        "What did the repair of the dripping faucet cost?",
    ),
    (
        "We chose PostgreSQL over MongoDB for the billing service.",
        "Which database did we choose for the billing service?",
        "What storage engine will hold the invoicing data?",
    ),
    (
        "My bike lock combination is 7391.",
        "What is my bike lock combination?",
        "What are the digits to open my cycle lock?",
    ),
    (
        "The flight to Tokyo departs on 2 April at 11:40 from gate B22.",
        "When does the flight to Tokyo depart?",
        "What time does my plane to Japan leave?",
    ),
    (
        "Our cat Mochi needs her thyroid medication twice a day.",
        "How often does Mochi need her thyroid medication?",
        "How many times daily must the pet get its pills?",
    ),
]

# (fact line, question)
FACTS_JA: list[tuple[str, str]] = [
    ("歯医者の予約は火曜日の午後三時です。", "歯医者の予約はいつですか？"),
    ("妹の結婚式は十月十二日に京都で行われます。", "妹の結婚式はどこで行われますか？"),
    ("会議室の暗証番号は四八一五です。", "会議室の暗証番号は何ですか？"),
    ("田中さんは毎週金曜日に在宅勤務をしています。", "田中さんが在宅勤務する曜日は？"),
    ("新しいプロジェクトの締め切りは三月末です。", "プロジェクトの締め切りはいつ？"),
    ("母の好きな花は紫陽花です。", "母の好きな花は何ですか？"),
    ("車検は来年の五月に予定しています。", "車検の予定はいつですか？"),
    ("佐藤部長はメールよりもチャットでの連絡を好みます。", "佐藤部長への連絡方法は？"),
    ("ジムの会費は月額八千円です。", "ジムの会費はいくら？"),
    ("東京駅の近くのラーメン屋が一番好きです。", "一番好きなラーメン屋はどこ？"),
]

UNANSWERABLE: list[str] = [
    "What is the name of my dog?",
    "When is my brother's wedding?",
    "What is my car's license plate number?",
    "Which university did I graduate from?",
    "What is my shoe size?",
    "Who is my accountant?",
    "What is the password for the office printer?",
    "When did I last visit Paris?",
    "What is my mother's maiden name?",
    "Which programming language did we pick for the data pipeline?",
    "How tall is my father?",
    "What is the address of my optician?",
    "What time does the swimming pool open on Sundays?",
    "How much did the new sofa cost?",
    "What is the name of my neighbour's cat?",
    "犬の名前は何ですか？",
    "兄の誕生日はいつですか？",
    "去年の夏休みはどこへ行きましたか？",
]

_SUBJECTS = [
    "the team",
    "my sister",
    "Tom",
    "the landlord",
    "Priya",
    "the doctor",
    "my manager",
    "Jenna",
    "Lucas",
    "the plumber",
    "grandma",
    "the client",
    "our cat",
    "the gym",
    "the bank",
]
_VERBS = [
    "mentioned",
    "asked about",
    "complained about",
    "planned",
    "reviewed",
    "postponed",
    "discussed",
    "forgot",
    "looked up",
    "compared",
    "booked",
    "cancelled",
]
_OBJECTS = [
    "the weekend trip",
    "the new office chairs",
    "a recipe for lentil soup",
    "the weather forecast",
    "the quarterly numbers",
    "a podcast about history",
    "the train schedule",
    "the garden fence",
    "a birthday present",
    "the onboarding checklist",
    "the printer toner",
    "a movie night",
    "the hiking route",
    "the team lunch",
    "an article about sleep",
    "the parking permit",
    "the conference talk",
    "the email backlog",
    "the design mockups",
    "the grocery list",
]
_TAILS = [
    "again",
    "briefly",
    "at length",
    "over coffee",
    "after the standup",
    "before lunch",
    "on the phone",
    "in the chat",
    "late in the evening",
    "with some jokes",
]
_JA_FILLER = [
    "今日は雨が降っていたので家で仕事をしました。",
    "昼ご飯にカレーを食べました。",
    "午後は資料の整理をしました。",
    "週末に映画を見に行く予定です。",
    "電車が少し遅れていました。",
    "新しい本を読み始めました。",
    "同僚とコーヒーを飲みながら話しました。",
    "夕方に散歩をしました。",
]


@dataclass(frozen=True)
class Question:
    kind: str  # same | paraphrase | japanese | unanswerable
    text: str
    path: str | None  # the answer's file and line (None: unanswerable)
    line: int | None


def _filler(rng: random.Random) -> str:
    return f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}."


def build(root: Path, *, days: int = 60, seed: int = 7) -> list[Question]:
    """Write the memory under ``root`` (a workspace) and return the questions."""
    rng = random.Random(seed)
    files: dict[str, list[str]] = {}
    start = date(2026, 9, 1)
    day_names = [f"memory/{(start + timedelta(days=d)).isoformat()}.md" for d in range(days)]
    for name in day_names:
        lines: list[str] = []
        for session in range(rng.randint(2, 3)):
            lines += [f"## Session {session + 1}", ""]
            for _ in range(rng.randint(2, 4)):
                lines += [f"- user: {_filler(rng)}", f"- assistant: Noted. {_filler(rng)}", ""]
        files[name] = lines
    notes = [f"memory/notes/{topic}.md" for topic in ("people", "work", "home", "health", "travel")]
    for name in notes:
        topic = name.rsplit("/", 1)[1][:-3]
        lines = [f"# {topic.capitalize()}", ""]
        for _ in range(rng.randint(4, 8)):
            lines += [_filler(rng), _filler(rng), ""]
        files[name] = lines
    files["MEMORY.md"] = ["# Long-term memory", "", _filler(rng), _filler(rng), ""]
    targets = [*day_names, *notes, "MEMORY.md"]
    questions: list[Question] = []
    placements: list[tuple[str, int, str]] = []
    for fact, same, para in FACTS_EN:
        name = rng.choice(targets)
        placements.append((name, rng.randint(0, len(files[name])), f"- user: {fact}"))
        questions += [Question("same", same, name, -1), Question("paraphrase", para, name, -1)]
    for fact, q in FACTS_JA:
        name = rng.choice(day_names)
        placements.append((name, rng.randint(0, len(files[name])), f"- ユーザー: {fact}"))
        questions.append(Question("japanese", q, name, -1))
    for name in day_names[: days // 3]:  # some days are written in Japanese
        files[name] += ["## 日記", ""] + [f"- {rng.choice(_JA_FILLER)}" for _ in range(3)] + [""]
    # insert each fact as its own paragraph, then resolve its line number
    for name, at, line in placements:
        lines = files[name]
        at = min(at, len(lines))
        while at < len(lines) and lines[at - 1 : at] and lines[at - 1] != "":
            at += 1
        lines[at:at] = [line, ""]
    resolved: list[Question] = []
    fact_lines = {line for _, _, line in placements}
    for q in questions:
        assert q.path is not None
        lines = files[q.path]
        wanted = [i + 1 for i, line in enumerate(lines) if line in fact_lines and _matches(line, q)]
        resolved.append(Question(q.kind, q.text, q.path, wanted[0]))
    resolved += [Question("unanswerable", text, None, None) for text in UNANSWERABLE]
    for name, lines in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return resolved


def _matches(line: str, q: Question) -> bool:
    for fact, same, para in FACTS_EN:
        if q.text in (same, para):
            return line.endswith(fact)
    for fact, question in FACTS_JA:
        if q.text == question:
            return line.endswith(fact)
    return False
