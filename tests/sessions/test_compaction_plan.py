"""Pure compaction decisions, the extractive summarizer and inheritance text, as tables."""

from __future__ import annotations

from typing import Any

import pytest

from config.settings import CompactionSettings, ModelSettings
from sessions.compaction import compaction_due, plan_compaction, restore_lines, rolled_forward, summary_line
from sessions.inheritance import build_message, truncate
from sessions.summarize import extractive_summary
from sessions.thresholds import compaction_threshold
from sessions.tokens import estimate_text


def msgs(*roles: str) -> list[dict[str, Any]]:
    out = []
    for i, role in enumerate(roles, start=1):
        line: dict[str, Any] = {"seq": i, "role": role, "content": f"m{i}", "tokens": 10}
        if role == "call":
            line = {**line, "role": "assistant", "tool_calls": [{"id": f"c{i}", "function": {"name": "t"}}]}
        out.append(line)
    return out


@pytest.mark.parametrize(
    ("window", "max_output", "ratio", "fixed", "expected"),
    [
        (128000, 4096, 0.8, None, 102400),
        (8192, 4096, 0.8, None, 4096),  # window - max_output is smaller
        (8192, 1024, 0.5, None, 4096),
        (128000, 4096, 0.8, 8000, 8000),  # the seed's token_threshold replaces it
    ],
)
def test_threshold(window: int, max_output: int, ratio: float, fixed: int | None, expected: int) -> None:
    compaction = CompactionSettings(threshold_ratio=ratio, token_threshold=fixed)
    model = ModelSettings(context_window=window, max_output_tokens=max_output)
    assert compaction_threshold(compaction, model) == expected


@pytest.mark.parametrize(
    ("context", "overhead", "threshold", "due"),
    [(99, 0, 100, False), (100, 0, 100, True), (90, 10, 100, True), (0, 0, 1, False)],
)
def test_due_at_or_above_the_threshold(context: int, overhead: int, threshold: int, due: bool) -> None:
    assert compaction_due(context, overhead, threshold) is due


@pytest.mark.parametrize(
    ("roles", "keep", "minimum", "cut"),
    [
        (["user", "assistant"] * 10, 10, 5, 10),  # 20 messages: summarize 10, keep 10
        (["user", "assistant"] * 7, 10, 5, None),  # only 4 before the recent 10: skip
        (["user", "assistant"] * 8, 10, 5, 6),
        (["user"] * 9 + ["call", "tool", "tool"] + ["assistant"] * 9, 10, 5, 9),  # never split a tool group
        (["user"] * 6 + ["call", "tool"] + ["user"] * 9, 10, 5, 6),
        (["user"] * 3, 0, 1, 3),
        (["call", "tool", "tool", "tool"], 2, 1, None),  # the cut backs up to 0: nothing to summarize
    ],
)
def test_where_to_cut(roles: list[str], keep: int, minimum: int, cut: int | None) -> None:
    lines = msgs(*roles)
    plan = plan_compaction(lines, keep_recent=keep, min_to_compress=minimum)
    if cut is None:
        assert plan is None
        return
    assert plan is not None
    assert len(plan.summarize) == cut and list(plan.keep) == lines[cut:]
    assert not plan.keep or plan.keep[0]["role"] != "tool"
    assert (plan.start_seq, plan.end_seq) == (1, cut)


def test_a_previous_summary_is_folded_not_nested() -> None:
    head = summary_line(1, "earlier facts", covers_from=1, end_seq=20)
    lines = [head, *[{**m, "seq": m["seq"] + 20} for m in msgs(*(["user", "assistant"] * 10))]]
    plan = plan_compaction(lines, keep_recent=10, min_to_compress=5)
    assert plan is not None and plan.previous_summary == head
    assert (plan.start_seq, plan.end_seq, plan.covers_from) == (21, 30, 1)
    assert all(m.get("kind") != "summary" for m in plan.summarize)
    assert plan.tokens_before == head["tokens"] + 200


def test_restore_and_roll_forward() -> None:
    saved = msgs("user", "assistant", "user")
    current = [summary_line(1, "s", covers_from=1, end_seq=2), saved[2], *msgs("x", "x", "x", "x")[3:]]
    assert [x["seq"] for x in restore_lines(saved, current)] == [1, 2, 3, 4]
    record = {"id": 2, "type": "compaction", "summary": "new", "start_seq": 3, "end_seq": 3, "covers_from": 1}
    rolled = rolled_forward(record, current, None)
    assert rolled is not None and rolled[0]["summary_id"] == 2 and [x["seq"] for x in rolled[1:]] == [4]
    assert rolled_forward(record, rolled, None) is None  # already applied


def test_extractive_summary_keeps_details_and_questions() -> None:
    lines = [
        {"seq": 1, "role": "user", "content": "Deploy build 4.2.1 of api/server.py to host web-03. Is JIRA-118 fixed?"},
        {"seq": 2, "role": "assistant", "content": "I will check https://ci.example.com/runs/991 first."},
        {"seq": 3, "role": "user", "content": "今日の会議は何時ですか？ 15時に始めます。"},
    ]
    text = extractive_summary(lines, previous="Earlier we agreed on the plan.", instructions="decisions")
    for detail in ("4.2.1", "api/server.py", "JIRA-118", "https://ci.example.com/runs/991", "Earlier we agreed"):
        assert detail in text
    assert "Is JIRA-118 fixed?" in text and "今日の会議は何時ですか？" in text
    assert "decisions" in text
    assert extractive_summary(lines) == extractive_summary(lines)  # deterministic


def test_extractive_summary_fits_its_budget() -> None:
    lines = [{"seq": i, "role": "user", "content": "word " * 200} for i in range(1, 200)]
    assert estimate_text(extractive_summary(lines, max_tokens=300)) <= 300


def test_inheritance_text_is_cut_with_a_visible_marker() -> None:
    long = "fact. " * 10000
    message = build_message(run_id="r1", status="completed", ended_at="2026-11-30T04:00:00+00:00",
                            final_summary=long, plans=[{"plan_type": "initial", "plan_content": "p"}],
                            max_tokens=500)  # fmt: skip
    assert estimate_text(message) <= 520 and "truncated" in message and message.startswith("Summary of the previous")
    assert truncate("short", 100) == "short"


def _reference_summary(lines: list[dict[str, Any]], previous: str | None, max_tokens: int) -> str:
    """The summary built the plain way: a line per message, then the oldest dropped until it fits."""
    from sessions.summarize import (
        LINE_CHARS,
        MAX_ITEMS,
        MIN_LINE_CHARS,
        _first_sentences,
        _speaker,
        assemble,
        details,
        open_questions,
    )

    parts = ["Earlier: " + _first_sentences(previous, LINE_CHARS * 4)] if previous else []
    found: list[str] = []
    asked: list[str] = []
    total_chars = sum(len(str(x.get("content") or "")) for x in lines)
    per_line = max(MIN_LINE_CHARS, min(LINE_CHARS, total_chars // (3 * max(1, len(lines)))))
    for line in lines:
        content = str(line.get("content") or "")
        if line.get("tool_calls"):
            content = f"{content} [called {', '.join(c['function']['name'] for c in line['tool_calls'])}]".strip()
        if not content:
            continue
        parts.append(f"- {_speaker(line)}: {_first_sentences(content, per_line)}")
        found.extend(details(content))
        if line.get("role") == "user":
            asked.extend(open_questions(content))
    if found:
        parts.append("Details: " + "; ".join(list(dict.fromkeys(reversed(found)))[:MAX_ITEMS][::-1]))
    if asked:
        parts.append("Questions raised: " + " | ".join(list(dict.fromkeys(reversed(asked)))[:MAX_ITEMS][::-1]))
    costs = [estimate_text(p) + 1 for p in parts]
    total, dropped, keep = sum(costs), 0, [True] * len(parts)
    for i, part in enumerate(parts):
        if total <= max_tokens:
            break
        if part.startswith("- "):
            keep[i], total, dropped = False, total - costs[i], dropped + 1
    return assemble([p for p, k in zip(parts, keep, strict=True) if k], dropped, max_tokens)


def test_extractive_summary_reads_newest_first_and_gives_the_plain_result() -> None:
    """The summary stops reading once its budget and its detail lists are full (thousands of
    messages are summarized at once); the text is what the plain algorithm gives."""
    import random

    rng = random.Random(14)
    words = [
        "deploy", "api/server.py", "4.2.1", "failed", "on", "web-03", "again?", "check", "JIRA-118",
        "https://ci.example.com/r/9", "ok.", "今日は？", "15時", "#12", "~/x/y", "2026-11-30",
        "0f0e0d0c-0000-1111-2222-333344445555", "abcdefab-abcd-abcd-abcd-abcdefabcdef", "a", "b", "c", "d", "e",
    ]  # fmt: skip
    for _ in range(1500):
        lines: list[dict[str, Any]] = []
        for seq in range(1, rng.randint(0, 80) + 1):
            tokens = [rng.choice(words) if rng.random() < 0.8 else f"#{rng.randint(1, 300)}?" for _ in range(40)]
            role = rng.choice(["user", "assistant", "tool", "system"])
            line: dict[str, Any] = {"seq": seq, "role": role, "content": " ".join(tokens[: rng.randint(0, 40)])}
            if rng.random() < 0.1:
                line["tool_calls"] = [{"id": "c", "function": {"name": "lookup"}}]
            if rng.random() < 0.1:
                line["name"] = "ana"
            lines.append(line)
        previous = " ".join(rng.choice(words) for _ in range(rng.randint(0, 400))) if rng.random() < 0.3 else None
        budget = rng.choice([5, 40, 120, 400, 1500])
        assert extractive_summary(lines, previous=previous, max_tokens=budget) == _reference_summary(
            lines, previous, budget
        )


def test_details_and_questions_pre_checks_find_what_the_plain_search_finds() -> None:
    """``details`` and ``open_questions`` skip texts without a digit, "/" or "-" (without a
    question mark); the reference summary above calls them too, so they are compared here with
    the plain search on texts of other digits, dashes, slashes and question marks."""
    import random

    from sessions.summarize import _DETAIL, _SENTENCE, details, open_questions

    def plain_details(text: str) -> list[str]:
        return list(dict.fromkeys(m.group(0) for m in _DETAIL.finditer(text)))

    def plain_questions(text: str) -> list[str]:
        flat = " ".join(text.split())
        return [s.strip() for s in _SENTENCE.split(flat) if s.strip().endswith(("?", "\uff1f"))]

    rng = random.Random(3)
    alphabet = "ab./-~#:,? \uff1f\u3002!\n\tAZ09\u0663\u0967\uff10\u2044\u2215\u2010\u2011\uff0f\uff0d\u65e5\u30fc"
    fixed = ["abcdefab-abcd-abcd-abcd-abcdefabcdef", "see a/b.c", "~/x/y", "https://x.y/z", "\u0663\u0664", "why\uff1f"]
    assert all(details(t) or open_questions(t) for t in fixed)  # the kinds a pre-check could miss
    texts = fixed + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))) for _ in range(20000)]
    for text in texts:
        assert details(text) == plain_details(text), text
        assert open_questions(text) == plain_questions(text), text
