"""The schedule's firings behind a gate (the leader's ``may_fire``): asked with the time each firing
was due, skipped when it says no, never asked by ``run_now``; ``cancel_scheduled`` stops the
schedule's firings under way (leadership lost), not a manual run; ``catch_up`` fires what came due
since a time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from scheduler.jobs import DailyJob
from scheduler.service import SchedulerService
from tests.conftest import FakeClock
from tests.scheduler.test_service import NIGHTLY, NY, Calls

pytestmark = [pytest.mark.timeout(30), pytest.mark.realtime]


def service(calls: Calls, clock: FakeClock) -> SchedulerService:
    return SchedulerService(
        timezone=NY, daily_reset=DailyJob(3, calls.callback("daily")), sweep_seconds=60,
        sweep=calls.callback("sweep"), cleanup_at_hour=3, cleanup=calls.callback("cleanup"), cron_jobs=(NIGHTLY,),
        run_cron=calls.run_cron, clock=clock,
    )  # fmt: skip


def at_ny(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2026, 11, 30, hour, minute, second, tzinfo=NY).astimezone(UTC)


async def test_scheduled_at_is_the_due_time_of_the_firing_running_now(clock: FakeClock) -> None:
    scheduler = service(Calls(), clock)
    assert scheduler.scheduled_at("cron:nightly", at_ny(2, 30, 0)) == at_ny(2, 30)
    assert scheduler.scheduled_at("cron:nightly", at_ny(2, 31, 40)) == at_ny(2, 30)  # late, the same firing
    assert scheduler.scheduled_at("cron:nightly", at_ny(3, 29, 59)) == at_ny(2, 30)  # within the grace
    assert scheduler.scheduled_at("cron:nightly", at_ny(2, 29)) is None  # the last one is past the grace
    assert scheduler.scheduled_at("sweep", at_ny(2, 30)) is None  # an interval job has no due times


async def test_the_gate_decides_each_firing_of_the_schedule_but_not_a_manual_run(clock: FakeClock) -> None:
    calls = Calls()
    scheduler = service(calls, clock)
    asked: list[tuple[str, datetime | None]] = []
    answer = False

    async def gate(job_id: str, due: datetime | None) -> bool:
        asked.append((job_id, due))
        return answer

    scheduler.gate = gate
    clock.set(at_ny(2, 30, 5))
    assert await scheduler.fire_scheduled("cron:nightly") is None
    await scheduler.fire_scheduled("sweep")
    assert calls.log == [] and asked == [("cron:nightly", at_ny(2, 30)), ("sweep", None)]
    assert scheduler.jobs()[-1].last_runs == ()  # a firing not run here is no firing of this process
    await scheduler.run_now("nightly")  # a manual run is not the schedule's: not asked
    assert calls.log == ["cron nightly: tidy up"] and len(asked) == 2
    answer = True
    await scheduler.fire_scheduled("cron:nightly")
    assert calls.log == ["cron nightly: tidy up"] * 2 and len(asked) == 3


async def test_cancel_scheduled_stops_the_schedules_firings_not_a_manual_run(clock: FakeClock) -> None:
    calls = Calls()
    calls.hold("sweep", "cleanup")
    scheduler = service(calls, clock)
    scheduled = asyncio.create_task(scheduler.fire_scheduled("sweep"))
    manual = asyncio.create_task(scheduler.run_now("cleanup"))
    while len(calls.log) < 2:
        await asyncio.sleep(0.01)
    assert await scheduler.cancel_scheduled() == 1
    assert scheduled.cancelled() and not manual.done()
    calls.release()
    await manual
    assert calls.done == ["cleanup"]


async def test_catch_up_fires_what_came_due_since_through_the_gate(clock: FakeClock) -> None:
    calls = Calls()
    scheduler = service(calls, clock)
    asked: list[tuple[str, datetime | None]] = []

    async def gate(job_id: str, due: datetime | None) -> bool:
        asked.append((job_id, due))
        return True

    scheduler.gate = gate
    clock.set(at_ny(3, 50))  # the daily reset and cleanup came due at 03:00, nightly at 02:30
    assert scheduler.catch_up(since=at_ny(3, 10)) == []  # all before ``since``
    # nightly: before since; the daily reset: the start-up sweep's work
    assert scheduler.catch_up(since=at_ny(2, 45)) == ["cleanup"]
    while not calls.done:
        await asyncio.sleep(0.01)
    assert calls.log == ["cleanup"] and asked == [("cleanup", at_ny(3, 0))]
