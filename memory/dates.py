"""Dates in a query spelled the way memory writes them, so both search sides can match them.

Memory spells a day out: a dated daily log's context is "30 November 2026 (Monday)"
(``memory.chunking.file_date``) and a chat log's heading is usually "Ann and Bo, 23 January
2024". A question often writes the day in digits ("What did she have in math class on
17.01.2024?") or as an ordinal ("on the 17th of January"), which shares no word with the
heading beyond the year (and the number "17", which every "17" in the memory holds). So before
the search a date in digits is replaced by the spelled form (which still holds the day and the
year as numbers), and an ordinal next to a month name loses its suffix.

Only unambiguous forms are read: ``YYYY-MM-DD``, ``DD.MM.YYYY`` and ``DD-MM-YYYY`` (day first, as
every locale that writes dots does), and ``A/B/YYYY`` when one of A and B is above 12 (otherwise
both readings are added). A two-digit year is never read ("11/22/63" is a title more often than a
date).
"""

from __future__ import annotations

import re
from datetime import date

_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip
_ISO = re.compile(r"(?<![\w.-])(\d{4})-(\d{1,2})-(\d{1,2})(?![\w-]|\.\w)")
_DAY_FIRST = re.compile(r"(?<![\w.-])(\d{1,2})([.-])(\d{1,2})\2(\d{4})(?![\w-]|\.\w)")
_SLASH = re.compile(r"(?<![\w/])(\d{1,2})/(\d{1,2})/(\d{4})(?![\w/])")
_MONTH = "|".join(m for m in _MONTHS) + "|" + "|".join(m[:3] for m in _MONTHS)
_ORDINAL_BEFORE = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)\b(?=(?:\s+of)?\s+(?:{_MONTH})\b)", re.IGNORECASE)
_ORDINAL_AFTER = re.compile(rf"\b((?:{_MONTH})\.?\s+)(\d{{1,2}})(?:st|nd|rd|th)\b", re.IGNORECASE)


def _spelled(year: int, month: int, day: int) -> str | None:
    try:
        d = date(year, month, day)
    except ValueError:
        return None
    return f"{d.day} {_MONTHS[d.month - 1]} {d.year}"


def spell_dates(query: str) -> str:
    """``query`` with its dates in digits written as "17 January 2024" and "17th January" as
    "17 January"; unchanged when it holds none."""
    if not any(ch.isdigit() for ch in query):
        return query

    def iso(m: re.Match[str]) -> str:
        s = _spelled(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        return s or m.group(0)

    def day_first(m: re.Match[str]) -> str:
        s = _spelled(int(m.group(4)), int(m.group(3)), int(m.group(1)))
        return s or m.group(0)

    def slash(m: re.Match[str]) -> str:
        a, b, year = int(m.group(1)), int(m.group(2)), int(m.group(3))
        readings = [_spelled(year, b, a), _spelled(year, a, b)] if a != b else [_spelled(year, a, b)]
        found = list(dict.fromkeys(r for r in readings if r))
        return " or ".join(found) if found else m.group(0)

    out = _ISO.sub(iso, query)
    out = _DAY_FIRST.sub(day_first, out)
    out = _SLASH.sub(slash, out)
    out = _ORDINAL_BEFORE.sub(r"\1", out)
    return _ORDINAL_AFTER.sub(r"\1\2", out)
