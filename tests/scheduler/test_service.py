"""SchedulerService: job listing, manual runs, overlap guard, crontab maths, and the real scheduler."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from config.clock import Clock, system_clock
from config.errors import Conflict, NotFound
from config.settings import CronJob
from scheduler.jobs import Callback, DailyJob, JobInfo
from scheduler.service import SchedulerService
from scheduler.triggers import crontab_trigger, next_cron
from sessions.resets import boundary_on
from tests.conftest import FakeClock

pytestmark = [pytest.mark.timeout(30), pytest.mark.realtime]

NY = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")
SATURDAY_NOON = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)

NIGHTLY = CronJob(id="nightly", schedule="30 2 * * *", message="tidy up")
WEEKDAYS = CronJob(id="standup", schedule="0 9 * * 1-5", timezone="Europe/Berlin", message="plan the day")


class Calls:
    """Callbacks that record their calls; those named in ``hold()`` wait for ``release()``."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.times: list[float] = []
        self.done: list[str] = []
        self.entered = asyncio.Event()
        self._gate = asyncio.Event()
        self._held: set[str] = set()

    def hold(self, *names: str) -> None:
        """Calls of these callbacks wait for ``release()``."""
        self._held.update(names)

    def release(self) -> None:
        self._gate.set()

    def callback(self, name: str) -> Callback:
        async def call() -> None:
            self.log.append(name)
            self.times.append(time.monotonic())
            self.entered.set()
            if name in self._held:
                await self._gate.wait()
            self.done.append(name)

        return call

    async def run_cron(self, job: CronJob) -> None:
        await self.callback(f"cron {job.id}: {job.message}")()


Factory = Callable[..., SchedulerService]


@pytest.fixture
async def make(clock: FakeClock) -> AsyncIterator[Factory]:
    made: list[SchedulerService] = []

    def factory(
        calls: Calls,
        *,
        daily: DailyJob | None = None,
        sweep_seconds: float = 60,
        cron_jobs: Sequence[CronJob] = (NIGHTLY, WEEKDAYS),
        reads: Clock = clock,
        **extra: Any,
    ) -> SchedulerService:
        service = SchedulerService(
            timezone=NY,
            daily_reset=daily,
            sweep_seconds=sweep_seconds,
            sweep=calls.callback("sweep"),
            cleanup_at_hour=3,
            cleanup=calls.callback("cleanup"),
            cron_jobs=cron_jobs,
            run_cron=calls.run_cron,
            clock=reads,
            **extra,
        )
        made.append(service)
        return service

    yield factory
    for service in made:
        await service.stop()


async def eventually(condition: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def by_id(infos: list[JobInfo]) -> dict[str, JobInfo]:
    return {info.id: info for info in infos}


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


async def test_jobs_before_start_come_from_the_clock(make: Factory, clock: FakeClock) -> None:
    clock.set(SATURDAY_NOON)
    calls = Calls()
    daily = DailyJob(
        at_hour=4,
        callback=calls.callback("daily"),
        boundaries=[(NY, 4), (BERLIN, 6), (ZoneInfo("Europe/Berlin"), 6)],
    )
    service = make(calls, daily=daily)
    rows = [(i.id, i.kind, i.trigger, i.next_run_at, i.running, i.last_run_at) for i in service.jobs()]
    assert rows == [
        ("daily_reset", "daily_reset", "daily at 04:00 America/New_York", utc("2026-11-29T09:00"), False, None),
        (
            "daily_reset:Europe/Berlin:06",
            "daily_reset",
            "daily at 06:00 Europe/Berlin",
            utc("2026-11-29T05:00"),
            False,
            None,
        ),
        ("sweep", "sweep", "every 60s", None, False, None),
        ("cleanup", "cleanup", "daily at 03:00 America/New_York", utc("2026-11-29T08:00"), False, None),
        ("cron:nightly", "cron", "cron 30 2 * * * America/New_York", utc("2026-11-29T07:30"), False, None),
        ("cron:standup", "cron", "cron 0 9 * * 1-5 Europe/Berlin", utc("2026-11-30T08:00"), False, None),
    ]
    assert not service.ready
    assert service.jobs()[0].as_json() == {
        "id": "daily_reset",
        "kind": "daily_reset",
        "trigger": "daily at 04:00 America/New_York",
        "next_run_at": "2026-11-29T09:00:00+00:00",
        "running": False,
        "last_run_at": None,
        "skipped": 0,
        "last_runs": [],
    }


@pytest.mark.parametrize(
    ("day", "hour"),
    [
        (date(2026, 3, 8), 2),  # spring forward: 02:00 does not exist
        (date(2026, 3, 8), 4),
        (date(2026, 11, 1), 1),  # fall back: 01:00 happens twice, the first counts
        (date(2026, 11, 1), 2),
        (date(2026, 11, 1), 4),
        (date(2026, 11, 30), 4),
    ],
)
async def test_daily_job_fires_at_the_reset_boundary(make: Factory, clock: FakeClock, day: date, hour: int) -> None:
    boundary = boundary_on(day, hour, NY)
    clock.set(boundary - timedelta(minutes=1))
    calls = Calls()
    service = make(calls, daily=DailyJob(at_hour=hour, callback=calls.callback("daily")), cron_jobs=())
    assert by_id(service.jobs())["daily_reset"].next_run_at == boundary


@pytest.mark.parametrize(
    ("schedule", "zone", "after", "expected"),
    [
        ("0 9 * * 1-5", BERLIN, SATURDAY_NOON, "2026-11-30T08:00"),  # Monday 09:00 CET
        ("0 9 * * mon-fri", BERLIN, SATURDAY_NOON, "2026-11-30T08:00"),
        ("0 9 * * 0", BERLIN, SATURDAY_NOON, "2026-11-29T08:00"),  # 0 is Sunday, as in crontab
        ("0 9 * * 7", BERLIN, SATURDAY_NOON, "2026-11-29T08:00"),  # so is 7
        ("0 9 * * 5-7", BERLIN, SATURDAY_NOON, "2026-11-29T08:00"),
        ("0 12 * * */2", BERLIN, SATURDAY_NOON, "2026-11-29T11:00"),  # sun, tue, thu, sat
        ("0 0 1 * mon", BERLIN, SATURDAY_NOON, "2026-11-29T23:00"),  # day OR weekday: Monday first
        ("0 0 1 * 1", BERLIN, utc("2026-11-30T12:00"), "2026-11-30T23:00"),  # ... then the 1st
        ("0 0 */10 * *", BERLIN, SATURDAY_NOON, "2026-11-30T23:00"),  # weekday *: day only
        ("*/15 * * * *", BERLIN, utc("2026-11-28T12:07"), "2026-11-28T12:15"),
        ("0 12 * * *", BERLIN, SATURDAY_NOON, "2026-11-29T11:00"),  # today's 12:00 CET has passed
        ("0 12 * * *", ZoneInfo("UTC"), SATURDAY_NOON, "2026-11-28T12:00"),  # ... at counts
        ("30 2 * * *", NY, utc("2026-03-08T00:00"), "2026-03-08T07:30"),  # in the gap: 03:30 EDT
        ("30 1 * * *", NY, utc("2026-11-01T05:45"), "2026-11-01T06:30"),  # repeated 01:30 fires again
        ("0 4 29 2 *", NY, SATURDAY_NOON, "2028-02-29T09:00"),
    ],
)
def test_next_cron(schedule: str, zone: ZoneInfo, after: datetime, expected: str) -> None:
    assert next_cron(schedule, zone, after) == utc(expected)


@pytest.mark.parametrize("schedule", ["0 9 * *", "0 9 * * 8", "0 9 * * fri-mon", "0 9 * * 1/0", "0 9 * * funday"])
def test_crontab_trigger_rejects_bad_expressions(schedule: str) -> None:
    with pytest.raises(ValueError):
        crontab_trigger(schedule, NY)


async def test_run_now_calls_the_job_and_records_when(make: Factory, clock: FakeClock) -> None:
    calls = Calls()
    service = make(calls, daily=DailyJob(4, calls.callback("daily"), boundaries=[(BERLIN, 6)]))
    await service.run_now("sweep")
    await service.run_now("cleanup")
    clock.advance(minutes=5)
    await service.run_now("daily_reset:Europe/Berlin:06")
    await service.run_now("nightly")  # a cron job by its bare id
    await service.run_now("cron:standup")
    assert calls.log == ["sweep", "cleanup", "daily", "cron nightly: tidy up", "cron standup: plan the day"]
    infos = by_id(service.jobs())
    assert infos["sweep"].last_run_at == clock.now - timedelta(minutes=5)
    assert infos["cron:nightly"].last_run_at == clock.now
    assert infos["daily_reset"].last_run_at is None


@dataclass(frozen=True)
class Result:
    ok: bool
    status: str
    error: str | None = None


async def test_each_firing_keeps_its_outcome_newest_first_the_last_ten(make: Factory, clock: FakeClock) -> None:
    results: list[object] = [Result(True, "answered"), Result(False, "failed", "provider_error: down")]

    async def sweep() -> object:
        clock.advance(seconds=2)
        outcome = results.pop(0) if results else None
        if outcome is None:
            raise RuntimeError("the sweep broke")
        return outcome

    service = SchedulerService(
        timezone=NY, daily_reset=None, sweep_seconds=60, sweep=sweep, cleanup_at_hour=3,
        cleanup=Calls().callback("cleanup"), cron_jobs=(), run_cron=Calls().run_cron, clock=clock,
    )  # fmt: skip
    started = clock.now
    await service.run_now("sweep")
    await service.run_now("sweep")
    with pytest.raises(RuntimeError):
        await service.run_now("sweep")
    runs = by_id(service.jobs())["sweep"].as_json()["last_runs"]
    assert [(r["ok"], r["status"], r["error"]) for r in runs] == [
        (False, "failed", "RuntimeError: the sweep broke"),
        (False, "failed", "provider_error: down"),
        (True, "answered", None),
    ]
    assert runs[-1]["started_at"] == started.isoformat() and runs[-1]["finished_at"] > runs[-1]["started_at"]
    for _ in range(12):
        results.append(Result(True, "answered"))
        await service.run_now("sweep")
    assert len(service.jobs()[0].last_runs) == 10
    assert by_id(service.jobs())["cleanup"].last_runs == ()


async def test_run_now_unknown_job_is_not_found(make: Factory) -> None:
    service = make(Calls())
    with pytest.raises(NotFound) as caught:
        await service.run_now("daily_reset")  # no daily job configured
    assert caught.value.status == 404
    assert caught.value.code == "job_not_found"
    assert "cron:nightly" in caught.value.message


async def test_run_now_while_the_job_runs_is_a_conflict(make: Factory) -> None:
    calls = Calls()
    service = make(calls, daily=DailyJob(4, calls.callback("daily"), boundaries=[(BERLIN, 6)]))
    calls.hold("daily")
    first = asyncio.create_task(service.run_now("daily_reset"))
    await calls.entered.wait()
    assert by_id(service.jobs())["daily_reset"].running
    with pytest.raises(Conflict):
        await service.run_now("daily_reset")
    with pytest.raises(Conflict):  # the daily jobs share one callback, hence one guard
        await service.run_now("daily_reset:Europe/Berlin:06")
    await service.run_now("cleanup")  # other jobs are independent
    calls.release()
    await first
    assert calls.log == ["daily", "cleanup"]
    assert not by_id(service.jobs())["daily_reset"].running


async def test_scheduled_firing_is_skipped_and_logged_while_the_previous_runs(
    make: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    calls = Calls()
    service = make(calls, sweep_seconds=0.05, cron_jobs=())
    calls.hold("sweep")
    await service.start()
    manual = asyncio.create_task(service.run_now("sweep"))
    await calls.entered.wait()
    with caplog.at_level(logging.WARNING, logger="scheduler.service"):
        await eventually(lambda: by_id(service.jobs())["sweep"].skipped >= 2)
    assert calls.log.count("sweep") == 1
    assert "job sweep skipped: its previous firing is still running" in caplog.messages
    calls.release()
    await manual
    await eventually(lambda: calls.log.count("sweep") >= 2)  # free again: the next firing runs


async def test_a_slow_scheduled_firing_blocks_its_successors(make: Factory) -> None:
    calls = Calls()
    service = make(calls, sweep_seconds=0.05, cron_jobs=())
    calls.hold("sweep")
    await service.start()
    await calls.entered.wait()
    await eventually(lambda: by_id(service.jobs())["sweep"].skipped >= 2)
    assert calls.log == ["sweep"]
    assert by_id(service.jobs())["sweep"].running
    calls.release()


async def test_stop_lets_a_running_firing_finish(make: Factory) -> None:
    calls = Calls()
    service = make(calls, sweep_seconds=0.05, cron_jobs=())
    calls.hold("sweep")
    await service.start()
    await calls.entered.wait()
    asyncio.get_running_loop().call_later(0.1, calls.release)
    await service.stop()
    assert calls.done == ["sweep"]
    assert not service.ready


async def test_stop_cancels_a_firing_past_the_timeout(make: Factory) -> None:
    calls = Calls()
    service = make(calls, sweep_seconds=0.05, cron_jobs=(), stop_timeout_s=0.1)
    calls.hold("sweep")
    await service.start()
    await calls.entered.wait()
    await service.stop()
    assert calls.log == ["sweep"] and calls.done == []
    assert not by_id(service.jobs())["sweep"].running


async def test_lifecycle_flags(make: Factory) -> None:
    service = make(Calls())
    await service.stop()  # never started: nothing to do
    await service.start()
    assert service.ready
    with pytest.raises(RuntimeError):
        await service.start()
    await service.stop()
    assert not service.ready


def test_bad_settings_fail_at_construction(clock: FakeClock) -> None:
    calls = Calls()
    with pytest.raises(ValueError, match="sweep_seconds"):
        SchedulerService(
            timezone=NY,
            daily_reset=None,
            sweep_seconds=0,
            sweep=calls.callback("sweep"),
            cleanup_at_hour=3,
            cleanup=calls.callback("cleanup"),
            cron_jobs=(),
            run_cron=calls.run_cron,
            clock=clock,
        )


@pytest.mark.slow
async def test_real_scheduler_fires_a_trigger_a_second_away(make: Factory) -> None:
    calls = Calls()
    # The real APScheduler fires on the real clock: the service reads that clock too, not the fixed one.
    service = make(calls, sweep_seconds=1, daily=DailyJob(4, calls.callback("daily")), reads=system_clock)
    started = time.monotonic()
    await service.start()
    infos = by_id(service.jobs())
    wall = datetime.now(UTC)
    sweep_next = infos["sweep"].next_run_at
    assert sweep_next is not None and timedelta(0) < sweep_next - wall <= timedelta(seconds=1.5)
    daily_next = infos["daily_reset"].next_run_at
    assert daily_next is not None and daily_next.tzinfo is UTC and daily_next > wall
    await eventually(lambda: bool(calls.times), timeout=5)
    assert calls.log == ["sweep"]
    assert 0.5 <= calls.times[0] - started <= 3
    later = by_id(service.jobs())["sweep"].next_run_at
    assert later is not None and later > sweep_next
    await service.stop()
    assert not service.ready


# The night DST ends in New York: 01:00-01:59 comes twice (EDT, then EST).
FALL_BACK = datetime(2027, 11, 7, 6, 0, tzinfo=UTC)  # 01:00 EST, the second 01:00
AT_ONE = CronJob(id="at-one", schedule="30 1 * * *", message="once a night")
HOURLY = CronJob(id="hourly", schedule="0 * * * *", message="every hour")


async def test_the_due_time_of_a_firing_in_the_repeated_hour_is_found(make: Factory, clock: FakeClock) -> None:
    """Adding a microsecond to a local 01:00 EST is wall-clock arithmetic (EDT again): the search
    for the due time went round for ever, on the loop, whenever a gate asked for it."""
    service = make(Calls(), cron_jobs=(AT_ONE,))
    clock.set(FALL_BACK + timedelta(minutes=45))
    due = await asyncio.wait_for(asyncio.to_thread(service.scheduled_at, "cron:at-one", clock()), 5)
    assert due == FALL_BACK + timedelta(minutes=30)
    planned = [when for when, job in service.planned(FALL_BACK - timedelta(hours=2), FALL_BACK + timedelta(hours=3))
               if job == "cron:at-one"]  # fmt: skip
    assert planned == [FALL_BACK - timedelta(minutes=30), FALL_BACK + timedelta(minutes=30)]  # APScheduler's two


async def test_a_job_at_fixed_hours_runs_once_when_its_wall_time_repeats(make: Factory, clock: FakeClock) -> None:
    calls = Calls()
    service = make(calls, cron_jobs=(AT_ONE, HOURLY))
    for when, job in service.planned(FALL_BACK - timedelta(hours=2), FALL_BACK + timedelta(hours=2)):
        clock.set(when)
        await service.fire_scheduled(job, when)
    assert calls.log.count("cron at-one: once a night") == 1  # 01:30 EDT; not 01:30 EST
    assert calls.log.count("cron hourly: every hour") == 4  # 00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST
    assert service.repeats_wall_time("cron:at-one", FALL_BACK + timedelta(minutes=30))
    assert not service.repeats_wall_time("cron:hourly", FALL_BACK)
    assert not service.repeats_wall_time("cron:at-one", FALL_BACK - timedelta(minutes=30))
