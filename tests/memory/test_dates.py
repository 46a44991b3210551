"""Dates in a query, spelled as memory writes them (memory.dates)."""

from __future__ import annotations

import pytest

from memory.dates import spell_dates


@pytest.mark.parametrize(
    ("query", "spelled"),
    [
        ("What did she have in math class on 17.01.2024?", "What did she have in math class on 17 January 2024?"),
        ("standup of 2026-11-30.", "standup of 30 November 2026."),
        ("met on 01/22/2024", "met on 22 January 2024"),  # 22 cannot be a month
        ("met on 22/01/2024", "met on 22 January 2024"),
        ("When was 10/01/2024", "When was 10 January 2024 or 1 October 2024"),  # both readings
        ("on the 17th of January 2024", "on the 17 of January 2024"),
        ("January 17th, 2024", "January 17, 2024"),
        ("on 5th jan", "on 5 jan"),
        # not dates: a two-digit year (a book title), no such day, version numbers, other words
        ("did I read 11/22/63?", "did I read 11/22/63?"),
        ("32.01.2024", "32.01.2024"),
        ("version 1.2.2024x", "version 1.2.2024x"),
        ("v1.10.2024.3", "v1.10.2024.3"),
        ("build 2024-01-23-rc", "build 2024-01-23-rc"),
        ("the 5th time", "the 5th time"),
        ("no dates here", "no dates here"),
    ],
)
def test_spell_dates(query: str, spelled: str) -> None:
    assert spell_dates(query) == spelled
