"""Crontab expressions as APScheduler 3 triggers: weekday numbers as crontab means them (0 and 7
are Sunday), and day of month or day of week firing as cron does when both are restricted."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.combining import OrTrigger
from apscheduler.triggers.cron import CronTrigger

from config.crontab import WEEKDAYS, check_schedule


def _weekday(token: str) -> int:
    """A crontab weekday as 0 (Sunday) to 7 (Sunday again)."""
    text = token.strip().lower()
    if text.isdigit() and 0 <= int(text) <= 7:
        return int(text)
    if text in WEEKDAYS:
        return WEEKDAYS.index(text)
    raise ValueError(f"bad day of week {token!r}: use 0-7 (0 and 7 are Sunday) or sun-sat")


def _weekday_field(field_text: str) -> str:
    """A crontab day-of-week field as APScheduler weekday names.

    APScheduler 3 numbers weekdays from Monday = 0, crontab from Sunday = 0 (7 too); names mean
    the same in both, so numbers are expanded to names."""
    if field_text == "*":
        return "*"
    days: set[int] = set()
    for part in field_text.split(","):
        body, slash, step_text = part.partition("/")
        step = int(step_text) if slash else 1
        if step < 1:
            raise ValueError(f"bad step in day of week {part!r}")
        if body == "*":
            first, last = 0, 6
        elif "-" in body:
            low, high = body.split("-", 1)
            first, last = _weekday(low), _weekday(high)
        else:
            first = _weekday(body)
            last = 6 if slash else first
        if last < first:
            raise ValueError(f"bad day-of-week range {part!r}")
        days.update(day % 7 for day in range(first, last + 1, step))
    return ",".join(WEEKDAYS[day] for day in sorted(days))


def crontab_trigger(schedule: str, zone: ZoneInfo) -> BaseTrigger:
    """A standard five-field crontab expression as an APScheduler 3 trigger in ``zone``.

    Unlike ``CronTrigger.from_crontab``, weekday numbers mean what they mean in crontab (0 and 7
    are Sunday), and when both day of month and day of week are restricted (neither starts with
    ``*``) the job fires on either, as cron does."""
    check_schedule(schedule)  # the grammar the configuration was checked with
    fields = schedule.split()
    minute, hour, day, month, weekday_text = fields
    weekday = _weekday_field(weekday_text)
    if not day.startswith("*") and not weekday_text.startswith("*"):
        return OrTrigger(
            [
                CronTrigger(minute=minute, hour=hour, day=day, month=month, timezone=zone),
                CronTrigger(minute=minute, hour=hour, month=month, day_of_week=weekday, timezone=zone),
            ]
        )
    return CronTrigger(minute=minute, hour=hour, day=day, month=month, day_of_week=weekday, timezone=zone)


def next_cron(schedule: str, zone: ZoneInfo, after: datetime) -> datetime | None:
    """The first firing of a crontab ``schedule`` in ``zone`` at or after ``after``, aware UTC."""
    when: datetime | None = crontab_trigger(schedule, zone).get_next_fire_time(None, after)
    return None if when is None else when.astimezone(UTC)


def hours_fixed(schedule: str) -> bool:
    """Whether a crontab ``schedule`` runs at fixed hours (its hour field is not ``*``): such a
    job runs once when DST ends and a wall-clock hour repeats (``SchedulerService``)."""
    return schedule.split()[1] != "*"
