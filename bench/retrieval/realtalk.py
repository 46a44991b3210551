"""REALTALK (github.com/danny911kr/REALTALK): ten real 21-day chats between two people, as memory.

The repository has no license file, so its data is never copied into this one: the bench reads
the ``data/Chat_*.json`` files from a directory given on its command line. (Its ``data/locomo/``
folder is the project's held-out judge and is never read: only ``Chat_*.json`` are opened.)

Each chat becomes one agent's workspace: one Markdown file per session
(``memory/chat/session-NN.md``) under a dated heading (``# Ann and Bo, 29 December 2023``), one
turn per paragraph, ``[D3:1] Speaker: text``. Each question's evidence is the turns its ``evidence``
ids name; ids the data does not hold (turns removed with their images, typos such as ``D20:38.``
or ``23:29`` are normalised first) are dropped, and a question left without evidence is skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from bench.retrieval.conversations import Question

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "inference"}
_SESSION = re.compile(r"session_(\d+)")
_ID = re.compile(r"D?(\d+):(\d+)")


@dataclass(frozen=True)
class Chat:
    agent: str  # chat-1 ... chat-10
    questions: list[Question]
    turns: list[tuple[str, int, str]]  # (path, line, "Speaker: text") of every turn, in order
    people: tuple[str, str] = ("", "")


def chat_files(data: Path) -> list[Path]:
    files = sorted(data.glob("Chat_*.json"), key=lambda p: int(p.name.split("_")[1]))
    if not files:
        raise SystemExit(f"no Chat_*.json under {data}: pass the REALTALK repository's data/ folder")
    return files


def _when(stamp: str) -> datetime:
    return datetime.strptime(stamp.strip(), "%d.%m.%Y, %H:%M:%S")


def _evidence_ids(raw: list[str]) -> list[str]:
    out = []
    for item in raw:
        for part in re.split(r"[\s,;]+", item):
            m = _ID.fullmatch(part.strip().rstrip("."))
            if m:
                out.append(f"D{int(m.group(1))}:{int(m.group(2))}")
    return out


def write_chat(source: Path, workspace: Path, agent: str) -> Chat:
    """Write one chat as the workspace's memory; its questions with their evidence lines."""
    data = json.loads(source.read_text("utf-8"))
    names = data["name"]
    a, b = (str(names[k]).strip().title() for k in ("speaker_1", "speaker_2"))
    where: dict[str, tuple[str, int]] = {}
    turns: list[tuple[str, int, str]] = []
    numbers = sorted(int(m.group(1)) for k in data if (m := _SESSION.fullmatch(k)))
    for n in numbers:
        session = data[f"session_{n}"]
        if not session:
            continue
        day = _when(data[f"session_{n}_date_time"])
        path = f"memory/chat/session-{n:02d}.md"
        lines = [f"# {a} and {b}, {day.day} {day:%B %Y}", ""]
        for turn in session:
            text = " ".join(str(turn.get("clean_text") or "").split())
            if not text:
                continue
            speaker = str(turn["speaker"]).strip().title()
            where[turn["dia_id"]] = (path, len(lines) + 1)
            turns.append((path, len(lines) + 1, f"{speaker}: {text}"))
            lines += [f"[{turn['dia_id']}] {speaker}: {text}", ""]
        target = workspace / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("\n".join(lines), encoding="utf-8")
    questions = []
    for q in data["qa"]:
        evidence = tuple(dict.fromkeys(where[i] for i in _evidence_ids(q.get("evidence") or []) if i in where))
        if evidence:
            questions.append(Question(CATEGORIES.get(int(q["category"]), str(q["category"])), q["question"], evidence))
    return Chat(agent, questions, turns, (a, b))


def write_all(data: Path, root: Path) -> list[tuple[Chat, Path]]:
    """Every chat under ``root/chat-N`` (its workspace)."""
    out = []
    for f in chat_files(data):
        agent = f"chat-{int(f.name.split('_')[1])}"
        out.append((write_chat(f, root / agent, agent), root / agent))
    return out


# Questions no chat can answer: each names one of the two people and a topic; a question is kept
# for a chat only when none of its topic words (Snowball stems) occurs in any turn of that chat,
# so the memory holds nothing about it (checked per chat, not assumed).
UNANSWERABLE = (
    ("What is the name of {p}'s horse?", ("horse", "pony")),
    ("Which opera did {p} sing in?", ("opera",)),
    ("What is {p}'s blood type?", ("blood",)),
    ("Which submarine did {p} serve on?", ("submarine",)),
    ("What did {p} name the sailboat?", ("sailboat", "boat")),
    ("How many patents does {p} hold?", ("patent",)),
    ("Which chess tournament did {p} win?", ("chess", "tournament")),
    ("What is {p}'s favourite volcano?", ("volcano",)),
    ("When did {p} get a pilot's licence?", ("pilot", "licence", "license")),
    ("What kind of parrot does {p} keep?", ("parrot",)),
    ("Which glacier did {p} climb?", ("glacier",)),
    ("What is {p}'s shoe size?", ("shoe", "size")),
)


def unanswerable(chat_turns: list[tuple[str, int, str]], people: tuple[str, str]) -> list[Question]:
    import snowballstemmer

    stem = snowballstemmer.stemmer("english").stemWord
    words = {stem(w) for _, _, t in chat_turns for w in re.findall(r"[a-z]+", t.lower())}
    out = []
    for i, (template, topic) in enumerate(UNANSWERABLE):
        if any(stem(t) in words for t in topic):
            continue
        out.append(Question("unanswerable", template.format(p=people[i % 2]), ()))
    return out
