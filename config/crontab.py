"""The grammar of a standard five-field crontab expression (``cron.jobs[].schedule``), checked
without any scheduler: ``config/`` imports nothing of the project. ``scheduler.service``
builds its APScheduler triggers only from expressions that pass this check, so what the config
accepts is what the daemon schedules.

Each field is ``*`` or a comma list of items ``value``, ``low-high``, optionally ``/step``
(``*/step`` too). Minutes 0-59, hours 0-23, days 1-31, months 1-12 or jan-dec, weekdays 0-7
(0 and 7 are Sunday) or sun-sat.
"""

from __future__ import annotations

WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_FIELDS: tuple[tuple[str, int, int, tuple[str, ...], int], ...] = (
    # name, low, high, names, the number of the first name
    ("minute", 0, 59, (), 0),
    ("hour", 0, 23, (), 0),
    ("day of month", 1, 31, (), 0),
    ("month", 1, 12, MONTHS, 1),
    ("day of week", 0, 7, WEEKDAYS, 0),
)


def check_schedule(schedule: str) -> None:
    """ValueError naming the field and the problem when ``schedule`` is not a standard crontab."""
    fields = schedule.split()
    if len(fields) != 5:
        raise ValueError(f"cron schedule {schedule!r} must have 5 fields, not {len(fields)}")
    for text, spec in zip(fields, _FIELDS, strict=True):
        _check_field(text, *spec)


def _check_field(text: str, name: str, low: int, high: int, names: tuple[str, ...], first: int) -> None:
    for part in text.split(","):
        body, slash, step = part.partition("/")
        if slash and (not step.isdigit() or int(step) < 1):
            raise ValueError(f"bad step in {name} {part!r}: a whole number from 1")
        if body == "*":
            continue
        start, dash, end = body.partition("-")
        lo = _value(start, name, low, high, names, first)
        if dash:
            hi = _value(end, name, low, high, names, first)
            if hi < lo:
                raise ValueError(f"bad {name} range {part!r}: the first value is larger than the last")


def _value(token: str, name: str, low: int, high: int, names: tuple[str, ...], first: int) -> int:
    text = token.strip().lower()
    if text.isdigit() and low <= int(text) <= high:
        return int(text)
    if text in names:
        return names.index(text) + first
    allowed = f"{low}-{high}" + (f" or {names[0]}-{names[-1]}" if names else "")
    raise ValueError(f"bad {name} {token!r}: use {allowed}")
