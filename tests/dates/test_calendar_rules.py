"""The date rules at every moment of the calendar (tests/clock_shift.py's ``CALENDAR``: minutes
before and after the daily reset hour, the nights DST starts and ends, 29 February, 31 December,
a year past 2038), in-process: the real engine, the real scheduler's triggers and the files store,
all reading one injected clock that the test moves from firing to firing as the schedule plans
them (``SchedulerService.planned``, then ``fire_scheduled`` at each due time).

What each moment is held against is worked out here by brute force, minute by minute through the
zone's wall clock, not by the code under test: a daily boundary is the first minute of a local
date whose wall time is at or past ``at_hour:00`` (so a skipped hour gives the first instant after
the gap, a repeated one its first occurrence); an idle reset is due ``idle_minutes`` of real time
after the last message; a cron job fires at each minute whose wall time matches, once per wall
time when its hours are fixed (cron's rule the night DST ends), and a time a DST jump skips runs
as far after the jump as it was after the skipped hour's start; a run is archived once it is
``retention_days`` times 24 hours old.

The real-process shifted runs (``make test-calendar``) check the same dates through real daemons
at a few of these moments; these run on every ``make test``, at all of them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from config.clock import parse_iso
from conversations.turns import Post
from gateway.services import Parts, Services, open_services
from sessions.keys import parse_key
from sessions.records import NewMessage, RunQuery
from tests.clock_shift import CALENDAR, Moment
from tests.conftest import FakeClock
from tests.gateway.helpers import gateway_config

MINUTE = timedelta(minutes=1)


def start_of(moment: Moment) -> datetime:
    return datetime.fromtimestamp(moment.epoch(), UTC)


def minutes(since: datetime, until: datetime) -> Iterable[datetime]:
    at = since.replace(second=0, microsecond=0)
    while at <= until:
        yield at
        at += MINUTE


def boundaries(zone: ZoneInfo, at_hour: int, since: datetime, until: datetime) -> list[datetime]:
    """Daily boundaries in ``(since, until]``: per local date, its first minute at or past
    ``at_hour:00`` by the wall clock."""
    found: dict[date, datetime] = {}
    for at in minutes(since - timedelta(days=1), until):
        wall = at.astimezone(zone)
        if wall.hour >= at_hour and wall.date() not in found:
            found[wall.date()] = at
    return [b for b in found.values() if since < b <= until]


def cron_firings(zone: ZoneInfo, hour: int | None, minute: int, since: datetime, until: datetime) -> list[datetime]:
    """When ``<minute> <hour or *> * * *`` fires in ``(since, until]``: each minute whose wall time
    matches (a fixed hour once per wall time); a wall time a jump skips, as far after the jump as
    it lay after the last wall time before it."""
    out: list[datetime] = []
    seen: set[tuple[date, int, int]] = set()
    previous = None
    for at in minutes(since - timedelta(hours=3), until):
        wall = at.astimezone(zone).replace(tzinfo=None)
        if previous is not None and wall - previous > MINUTE:  # the clock jumped forward
            skipped = previous + MINUTE
            while skipped < wall:
                if skipped.minute == minute and hour in (None, skipped.hour):
                    out.append(at + (skipped - (previous + MINUTE)))
                skipped += MINUTE
        if wall.minute == minute and hour in (None, wall.hour):
            stamp = (wall.date(), wall.hour, wall.minute)
            if hour is None or stamp not in seen:
                out.append(at)
            seen.add(stamp)
        previous = wall
    return sorted({t for t in out if since < t <= until})  # a skipped time may land on a real one


@dataclass
class Day:
    """A gateway's object graph on one clock, driven through its schedule."""

    services: Services
    clock: FakeClock
    posts: list[tuple[datetime, str, str]] = field(default_factory=list)  # (when, key, text), planned
    fired: list[tuple[datetime, str]] = field(default_factory=list)

    async def post(self, key: str, text: str) -> Any:
        parsed = parse_key(key, agents=self.services.config.settings.agents)
        return await self.services.conversations.post(Post(key=parsed, message=NewMessage(role="user", content=text)))

    async def run_until(self, until: datetime, *, late: timedelta = timedelta(0)) -> None:
        """Every planned firing and post up to ``until`` in time order (a firing before a post
        due at the same instant), the clock set to each one's time; the daily reset fired
        ``late`` after its due time (a busy loop, within the misfire grace)."""
        scheduler = self.services.scheduler
        firings = [
            (when + late if job.startswith("daily_reset") else when, job)
            for when, job in scheduler.planned(self.clock(), until)
        ]
        posts = sorted(p for p in self.posts if self.clock() < p[0] <= until)
        events = sorted([(when, 0, job, "") for when, job in firings] + [(w, 1, k, t) for w, k, t in posts])
        for when, kind, name, text in events:
            self.clock.set(when)
            if kind == 0:
                await scheduler.fire_scheduled(name, when - late if name.startswith("daily_reset") else when)
                self.fired.append((when, name))
            else:
                await self.post(name, text)
        self.clock.set(until)

    async def runs(self, key: str) -> list[dict[str, Any]]:
        rows = await self.services.store.list_runs(RunQuery(session_key=key))
        return sorted((dict(r) for r in rows), key=lambda r: r["created_at"])


@asynccontextmanager
async def day(home: Path, moment: Moment, start: datetime, overrides: dict[str, Any]) -> AsyncIterator[Day]:
    clock = FakeClock(start)
    base: dict[str, Any] = {"compaction": {"memory_flush": {"enabled": False}}, "scheduler": {"sweep_seconds": 60}}
    config = gateway_config(home, {**base, **overrides})
    parts = Parts(memory=False, timers=False)  # no APScheduler: the test fires the schedule itself
    async with open_services(config, env={"TZ": moment.zone}, clock=clock, parts=parts) as services:
        yield Day(services, clock)


MOMENTS = [pytest.param(m, id=f"{m.at} {m.zone}") for m in CALENDAR]


def hours_around(moment: Moment) -> list[int]:
    """The reset hours that put a boundary (or a skipped or repeated hour) near ``moment``: its
    own hour, the next, and the hour five minutes on (across a DST change, not the next)."""
    start, zone = start_of(moment), ZoneInfo(moment.zone)
    wall = start.astimezone(zone)
    return sorted({wall.hour, (wall.hour + 1) % 24, (start + 5 * MINUTE).astimezone(zone).hour})


DAILY_CASES = [
    pytest.param(m, hour, id=f"{m.at} {m.zone} at_hour={hour}") for m in CALENDAR for hour in hours_around(m)
]


@pytest.mark.parametrize(("moment", "at_hour"), DAILY_CASES)
async def test_daily_resets_fall_on_the_boundary_once_and_activity_defers_them_at_most_twice_the_delay(
    tmp_path: Path, moment: Moment, at_hour: int
) -> None:
    zone, m = ZoneInfo(moment.zone), start_of(moment)
    # the sweep every minute at :30 seconds, the daily job two minutes late: a message can land
    # after the boundary before any reset ran, which is what defers one
    since, until = m - timedelta(minutes=90, seconds=-30), m + timedelta(minutes=150)
    expected = boundaries(zone, at_hour, since, until)
    defer = 30
    reset = {"mode": "daily", "at_hour": at_hour, "defer_if_active_minutes": defer}
    async with day(
        tmp_path, moment, since, {"session": {"reset": reset}, "cleanup": {"at_hour": (at_hour + 12) % 24}}
    ) as d:
        quiet, chatty = "agent:main:dm:quiet", "agent:main:dm:chatty"
        first = await d.post(quiet, "a note before the boundary")
        await d.post(chatty, "hello")
        d.posts = [(since + timedelta(minutes=n), chatty, f"still here {n}") for n in range(10, 240, 10)]
        predicted = d.services.scheduling.next_reset(quiet)
        if not expected:
            await d.run_until(until)
            assert len(await d.runs(quiet)) == 1 and d.services.store.active_run(quiet) is not None
            assert predicted is not None and predicted > until
            return
        boundary = expected[0]
        assert predicted == boundary, "the reset the session's status promised is the one that happens"
        just_past = boundary + timedelta(seconds=10)
        d.posts += [(just_past, chatty, "just past the boundary"), (boundary + 5 * MINUTE, quiet, "after it")]
        await d.run_until(until, late=2 * MINUTE)

        runs = await d.runs(quiet)
        assert [r["uuid"] for r in runs][:1] == [first.run_id]
        assert len(runs) == 2, "one reset at the boundary, none when a repeated hour fires the job again"
        first_after = min(when for when, _ in d.fired if when >= boundary)
        assert first_after < boundary + MINUTE
        assert parse_iso(runs[0]["completed_at"]) == first_after  # the first sweep or daily firing past it
        entry = d.services.store.entry(quiet)
        assert entry is not None and entry.last_reset_boundary is not None
        assert parse_iso(entry.last_reset_boundary) == boundary
        assert d.services.store.active_run(quiet) is not None  # the run opened after the boundary lives on

        chatty_runs = await d.runs(chatty)
        ended = parse_iso(chatty_runs[0]["completed_at"])
        limit = boundary + timedelta(minutes=2 * defer)
        # a message after the boundary defers its reset; more keep it deferred, never past twice the delay
        assert limit <= ended <= limit + MINUTE, ended
        messages = await d.services.store.read_messages(chatty_runs[0]["uuid"], after_seq=0, limit=100)
        assert "just past the boundary" in [r["content"] for r in messages]  # kept in the deferred run
        assert len(chatty_runs) == 2


@pytest.mark.parametrize("moment", MOMENTS)
async def test_an_idle_reset_comes_after_real_minutes_whatever_the_wall_clock_does(
    tmp_path: Path, moment: Moment
) -> None:
    m = start_of(moment)
    since = m - timedelta(minutes=40)
    overrides = {
        "session": {"reset": {"mode": "none"}, "reset_by_type": {"group": {"mode": "idle", "idle_minutes": 75}}}
    }
    async with day(tmp_path, moment, since, overrides) as d:
        group = "agent:main:telegram:group:g1"
        d.posts = [(since + 20 * MINUTE, group, "the last word")]
        await d.post(group, "first")
        await d.post("agent:main:dm:direct", "never reset: its type has mode none")
        await d.run_until(m + timedelta(minutes=150))
        runs = await d.runs(group)
        assert len(runs) == 1
        due = since + 20 * MINUTE + timedelta(minutes=75)
        assert due <= parse_iso(runs[0]["completed_at"]) <= due + MINUTE  # the next sweep
        assert d.services.store.active_run("agent:main:dm:direct") is not None


@pytest.mark.parametrize("moment", MOMENTS)
async def test_cron_jobs_fire_at_their_wall_times_once_each(tmp_path: Path, moment: Moment) -> None:
    zone, m = ZoneInfo(moment.zone), start_of(moment)
    since, until = m - timedelta(minutes=70), m + timedelta(minutes=150)
    around = (m + 10 * MINUTE).astimezone(zone)  # a fixed time just after the moment's instant
    jobs = [
        {"id": "hourly", "schedule": "0 * * * *", "message": "tick", "isolated": True},
        {"id": "daily", "schedule": f"{around.minute} {around.hour} * * *", "message": "digest", "isolated": True},
        {"id": "dst", "schedule": "30 2 * * *", "message": "the 02:30 job", "isolated": True},
    ]
    async with day(tmp_path, moment, since, {"cron": {"jobs": jobs}}) as d:
        await d.run_until(until)
        for job_id, hour, minute in (("hourly", None, 0), ("daily", around.hour, around.minute), ("dst", 2, 30)):
            expected = cron_firings(zone, hour, minute, since, until)
            runs = await d.runs(f"cron:{job_id}")
            stored = [parse_iso(r["created_at"]) for r in runs]
            assert stored == expected, (job_id, [t.astimezone(zone).isoformat() for t in stored])
            for run in runs:
                messages = await d.services.store.read_messages(run["uuid"], after_seq=0, limit=10)
                assert [r["content"] for r in messages] == [j["message"] for j in jobs if j["id"] == job_id]
        assert any(job == "cron:daily" for _, job in d.fired)


@pytest.mark.parametrize("moment", MOMENTS)
async def test_cleanup_archives_a_run_once_it_is_the_retention_old_at_the_cleanup_hour(
    tmp_path: Path, moment: Moment
) -> None:
    zone, m = ZoneInfo(moment.zone), start_of(moment)
    cleanup_at = (m + 30 * MINUTE).astimezone(zone).hour
    since, until = m - timedelta(days=1, minutes=90), m + timedelta(minutes=150)
    firing = boundaries(zone, cleanup_at, m - timedelta(minutes=60), until)[0]  # the cleanup near the moment
    overrides = {"session": {"reset": {"mode": "none"}}, "cleanup": {"at_hour": cleanup_at, "retention_days": 1}}
    async with day(tmp_path, moment, since, overrides) as d:
        ends = {"older": firing - timedelta(days=1, minutes=2), "younger": firing - timedelta(days=1) + 2 * MINUTE}
        ran: dict[str, str] = {}
        for name, ended in sorted(ends.items(), key=lambda kv: kv[1]):
            await d.run_until(ended - MINUTE)
            ran[name] = (await d.post(f"agent:main:dm:{name}", f"the {name} run")).run_id
            d.clock.set(ended)
            await d.services.store.complete(f"agent:main:dm:{name}")
        await d.run_until(until)
        archive = tmp_path / "contexts" / "archive"
        assert (archive / f"{ran['older']}.tar.gz").exists(), "a day old at the cleanup: archived then"
        assert not (archive / f"{ran['younger']}.tar.gz").exists()
        row = await d.services.store.get_run(ran["older"])
        assert row is not None and row["archived_at"] is not None
        assert firing <= parse_iso(row["archived_at"]) < firing + MINUTE
