"""Auto-recall: the ``<relevant-memories>`` message stays within
``memory.recall.max_tokens`` when a daily log must be cut (Japanese text counts two characters
per token, and escaping lengthens text)."""

from __future__ import annotations

import pytest

from conversations.recall import memory_message
from sessions.tokens import estimate_text


@pytest.mark.parametrize(
    "log",
    [
        "- 今日は請求サービスのリリース計画について話し合った。\n" * 200,
        "- fixed <b>&</b> escaping in the billing service & its tests\n" * 200,
    ],
)
def test_a_cut_daily_log_keeps_the_message_within_max_tokens(log: str) -> None:
    text = memory_message([], [("memory/2026-11-30.md", log)], 300)
    assert text is not None and "memory/2026-11-30.md" in text
    assert estimate_text(text) <= 300
