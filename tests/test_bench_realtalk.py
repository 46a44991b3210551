"""The REALTALK reader of bench.memory_eval, on a chat file the test writes in REALTALK's format."""

from __future__ import annotations

import json
from pathlib import Path

from bench.retrieval.realtalk import unanswerable, write_all
from memory.chunking import chunk_markdown


def test_chat_becomes_one_file_per_session_and_questions_point_at_their_turns(tmp_path: Path) -> None:
    def turn(dia: str, who: str, text: str) -> dict[str, object]:
        return {"clean_text": text, "speaker": who, "date_time": "29.12.2023, 22:42:04", "dia_id": dia}

    chat = {
        "name": {"speaker_1": "Ann", "speaker_2": "bo"},
        "session_1": [
            turn("D1:1", "Ann", "Hi!"),
            turn("D1:2", "bo", "I adopted a\ncat named Miso."),
            turn("D1:4", "Ann", "Cute!"),
        ],
        "session_1_date_time": "29.12.2023, 22:42:04",
        "session_2": [turn("D2:1", "Ann", "How is Miso?"), turn("D2:2", "bo", "Sleeping on my keyboard.")],
        "session_2_date_time": "01.01.2024, 18:13:08",
        "qa": [
            {"question": "What is Bo's cat called?", "evidence": ["D1:2", "D1:3"], "category": 1},
            {"question": "When did Bo adopt a cat?", "evidence": ["1:2."], "category": 2},
            {"question": "Where was the photo taken?", "evidence": ["D1:3"], "category": 3},  # no such turn
        ],
    }
    data = tmp_path / "data"
    data.mkdir()
    (data / "Chat_1_Ann_Bo.json").write_text(json.dumps(chat), "utf-8")
    [(c, ws)] = write_all(data, tmp_path / "ws")
    assert c.agent == "chat-1" and ws == tmp_path / "ws" / "chat-1" and c.people == ("Ann", "Bo")
    text = (ws / "memory/chat/session-01.md").read_text("utf-8")
    assert text.splitlines()[:5] == ["# Ann and Bo, 29 December 2023", "", "[D1:1] Ann: Hi!", "",
                                     "[D1:2] Bo: I adopted a cat named Miso."]  # fmt: skip
    assert (ws / "memory/chat/session-02.md").read_text("utf-8").startswith("# Ann and Bo, 1 January 2024")
    assert [(q.kind, q.evidence) for q in c.questions] == [
        ("multi-hop", (("memory/chat/session-01.md", 5),)),
        ("temporal", (("memory/chat/session-01.md", 5),)),
    ]
    # each turn is a chunk of its own, found by the line the question names
    chunks = chunk_markdown("memory/chat/session-01.md", text)
    assert any(ch.start_line <= 5 <= ch.end_line and "Miso" in ch.text for ch in chunks)
    # questions about a topic no turn mentions, about one of the two people
    asked = unanswerable(c.turns, c.people)
    assert asked and all(not q.evidence and ("Ann" in q.text or "Bo" in q.text) for q in asked)
    assert not any("cat" in q.text.lower().split() for q in asked)


def test_abstention_sweep_counts_refusals_on_the_kept_pools() -> None:
    """The REALTALK run keeps the unanswerable questions' pools; the sweep counts, per min_score,
    the unanswerable questions that get nothing and the answerable ones refused with them."""
    from bench.memory_eval import _realtalk_abstention
    from bench.realtalk_eval import Asked, RealtalkRun
    from bench.retrieval.conversations import Question
    from memory.candidates import Candidate
    from memory.fusion import FusionParams

    def pool(cosine: float, line: int = 3) -> list[Candidate]:
        return [Candidate(f"c{line}", "memory/chat/session-01.md", line, line, "", "text", cosine, 0.0, 1, None)]

    def asked(cosine: float, line: int) -> Asked:
        q = Question("multi-hop", "q?", (("memory/chat/session-01.md", line),))
        return Asked("chat-1", q, [], pool(cosine, line), [], [])

    run = RealtalkRun(
        [asked(0.9, 3), asked(0.45, 5)], 2, 0.0, 0, [1.0],
        unanswerable_pools=[("chat-1", pool(0.3)), ("chat-1", pool(0.48)), ("chat-1", [])],
        unanswerable_questions=["What is Ann's blood type?", "What is Bo's shoe size?", "Ann's boat?"],
    )  # fmt: skip
    params = FusionParams(1.0, 0.0, 0.4, 0.5, method="score")
    swept = _realtalk_abstention(run, params)
    assert swept[0]["min_score"] == 0.4 and swept[0]["min_topic_cosine"] == 0.0  # the shipped thresholds first
    rows = {r["min_score"]: r for r in swept if r["min_topic_cosine"] == 0.0}
    assert rows[0.4]["unanswerable_refused"] == 2 / 3 and rows[0.4]["answerable_refused"] == 0.0
    assert rows[0.4]["r@10_on"] == rows[0.4]["r@10_off"] == 100.0
    assert rows[0.0]["unanswerable_refused"] == 1 / 3
    assert set(rows) >= {0.4, 0.0, 0.07, 0.1, 0.15}
    # the off-topic rule swept at the shipped min_score: the unanswerable questions' topic words
    # ("shoe", "size") are in no turn ("text"), so with the score bar above their best (0.48) the
    # one min_score keeps is refused too; the answerable ones ("q?") have no topic word and keep
    topic = {(r["min_topic_cosine"], r["min_topic_score"]): r for r in swept if r["min_topic_cosine"] > 0}
    assert topic[(0.5, 1.0)]["unanswerable_refused"] == 1.0 and topic[(0.5, 1.0)]["answerable_refused"] == 0.0
    assert topic[(0.5, 0.2)]["unanswerable_refused"] == 2 / 3  # its best, 0.48, is a strong enough match

