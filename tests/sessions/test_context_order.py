"""The order of the context a model sees (issue 24, item 2), as tables: a turn's lines carry
``after`` and stand right after what the turn saw; the messages that waited come after them; the
compaction cut always summarizes a seq range."""

from __future__ import annotations

from typing import Any

import pytest

from sessions.compaction import plan_compaction
from sessions.context_order import anchor, in_model_order


def line(seq: int | None, after: int | None = None, role: str = "user", **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"seq": seq, "role": role, "content": f"m{seq}", "tokens": 10, **extra}
    if after is not None:
        out["after"] = after
    return out


SUMMARY = {"seq": None, "role": "system", "kind": "summary", "end_seq": 3, "content": "s", "tokens": 5}

ORDER_ROWS = [
    # (id, lines as stored (seq order), expected seqs in model order)
    ("no after: seq order", [line(1), line(2, role="assistant"), line(3)], [1, 2, 3]),
    (
        "collect: q1, q2 and q3 waited, a1 answers q1, a2 answers both",
        [line(1), line(2), line(3), line(4, 1, "assistant"), line(5, 3, "assistant")],
        [1, 4, 2, 3, 5],
    ),
    (
        "followup: each reply right after its own message",
        [line(1), line(2), line(3), line(4, 1, "assistant"), line(5, 2, "assistant"), line(6, 3, "assistant")],
        [1, 4, 2, 5, 3, 6],
    ),
    (
        "a tool round while a message waits: call, results and reply stay together before it",
        [
            line(1),
            line(2),
            line(3, 1, "assistant", tool_calls=[{}]),
            line(4, 1, "tool"),
            line(5),
            line(6, 1, "assistant"),
        ],
        [1, 3, 4, 6, 2, 5],
    ),
    (
        "steer: the message the second call saw follows the tool round, the reply follows it",
        [line(1), line(2), line(3, 1, "assistant", tool_calls=[{}]), line(4, 1, "tool"), line(5, 2, "assistant")],
        [1, 3, 4, 2, 5],
    ),
    (
        "the summary opens the context; a kept reply whose question was summarized comes first",
        [SUMMARY, line(4, 1, "assistant"), line(2 + 3), line(6, 5, "assistant")],
        [None, 4, 5, 6],
    ),
    (
        "a client's tool result (posted, no after) stands with its call, before a message that waited",
        [
            line(3),
            line(4),
            line(5, 3, "assistant", tool_calls=[{"id": "c1", "type": "function"}]),
            line(6, role="tool", tool_call_id="c1"),
            line(7, role="tool", tool_call_id="unknown"),
        ],
        [3, 5, 6, 4, 7],
    ),
    (
        "file order does not matter (a rewritten current.jsonl)",
        [line(5, 3, "assistant"), line(3), line(4, 1, "assistant"), line(1), line(2)],
        [1, 4, 2, 3, 5],
    ),
]


@pytest.mark.parametrize(("lines", "expected"), [r[1:] for r in ORDER_ROWS], ids=[r[0] for r in ORDER_ROWS])
def test_model_order(lines: list[dict[str, Any]], expected: list[int | None]) -> None:
    assert [x["seq"] for x in in_model_order(lines)] == expected


ANCHOR_ROWS = [
    ("the last line is a message", [line(1), line(4, 1), line(2)], 2),
    ("the last line is a turn's: its place", [line(1), line(3, 1, "assistant"), line(4, 1, "tool")], 1),
    (
        "the last line is a client's tool result: its call's place",
        [line(3), line(5, 3, "assistant", tool_calls=[{"id": "c1"}]), line(6, role="tool", tool_call_id="c1")],
        3,
    ),
    ("only the summary", [SUMMARY], 3),
    ("nothing", [], 0),
]


@pytest.mark.parametrize(("seen", "expected"), [r[1:] for r in ANCHOR_ROWS], ids=[r[0] for r in ANCHOR_ROWS])
def test_anchor_is_the_place_of_the_last_line_seen(seen: list[dict[str, Any]], expected: int) -> None:
    assert anchor(seen) == expected


CUT_ROWS = [
    # (id, stored lines, keep_recent, min_to_compress, summarized seqs or None)
    (
        "seq order: the usual cut",
        [line(i, role="user" if i % 2 else "assistant") for i in range(1, 9)],
        4,
        1,
        [1, 2, 3, 4],
    ),
    (
        "the cut would leave waiting messages 2, 3 below the summarized 4: it backs up to 1",
        [line(1), line(2), line(3), line(4, 1, "assistant"), line(5, 3, "assistant")],
        3,
        1,
        [1],
    ),
    (
        "a cut after the waiting messages is a seq range",
        [line(1), line(2), line(3), line(4, 1, "assistant"), line(5, 3, "assistant"), line(6), line(7, 6, "assistant")],
        2,
        1,
        [1, 4, 2, 3, 5],
    ),
    (
        "backing up below min_to_compress: no compaction",
        [line(1), line(2), line(3), line(4, 1, "assistant"), line(5, 3, "assistant")],
        3,
        2,
        None,
    ),
]


@pytest.mark.parametrize(
    ("lines", "keep", "minimum", "summarized"), [r[1:] for r in CUT_ROWS], ids=[r[0] for r in CUT_ROWS]
)
def test_the_compaction_cut_summarizes_a_seq_range(
    lines: list[dict[str, Any]], keep: int, minimum: int, summarized: list[int] | None
) -> None:
    plan = plan_compaction(in_model_order(lines), keep_recent=keep, min_to_compress=minimum)
    if summarized is None:
        assert plan is None
        return
    assert plan is not None
    assert [x["seq"] for x in plan.summarize] == summarized
    assert plan.end_seq < min(x["seq"] for x in plan.keep)
    assert (plan.start_seq, plan.end_seq) == (min(summarized), max(summarized))
