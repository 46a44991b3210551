"""The scheduler: APScheduler 3.x ``AsyncIOScheduler`` driving callbacks it is given.

It knows nothing of sessions or HTTP: the gateway hands it async callables for the daily reset,
the sweep, the cleanup and cron firings, and the settings that say when to call them (SPEC section
7). Every job runs under a guard: a firing that comes while the previous one still runs is skipped
and logged (daily reset jobs for several boundaries share one guard, since they share a callback).

Job ids: ``daily_reset`` (and ``daily_reset:<zone>:<HH>`` for further boundaries), ``sweep``,
``cleanup``, ``backup`` (when ``backup.schedule`` is set), ``cron:<id>`` for each cron job.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobSubmissionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from config.clock import Clock, iso
from config.errors import JobNotFound, JobRunning
from config.settings import CronJob
from scheduler.jobs import LAST_RUNS, Callback, DailyJob, Firing, JobInfo, JobKind
from scheduler.triggers import crontab_trigger, hours_fixed

logger = logging.getLogger(__name__)


# Asked before a scheduled firing runs (``SchedulerService.gate``): the job id and the time the
# firing was scheduled for (None for the interval sweep); false skips it (another process leads,
# or that firing was claimed already). ``run_now`` is not asked.
Gate = Callable[[str, datetime | None], Awaitable[bool]]

CRON_PREFIX = "cron:"


@dataclass
class _Job:
    id: str
    kind: JobKind
    guard: str
    trigger: BaseTrigger | None  # None: an interval job, anchored when the scheduler starts
    text: str
    call: Callback
    misfire_grace_s: float
    interval_s: float | None = None
    # A job at fixed hours runs once at a wall-clock time the night DST ends repeats (cron's rule;
    # APScheduler fires both occurrences); a job every hour runs in both real hours.
    fixed_hours: bool = False
    zone: ZoneInfo | None = None  # the trigger's zone (the service's when None)
    last_run_at: datetime | None = None
    skipped: int = 0
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    firings: deque[Firing] = field(default_factory=lambda: deque(maxlen=LAST_RUNS))


def _daily_job(
    job_id: str, kind: JobKind, hour: int, zone: ZoneInfo, call: Callback, misfire_grace_s: float, guard: str = ""
) -> _Job:
    """A job once a day at ``hour``:00 in ``zone`` (the daily reset, the cleanup); its own guard
    unless ``guard`` names a shared one."""
    trigger = CronTrigger(hour=hour, minute=0, second=0, timezone=zone)
    text = f"daily at {hour:02d}:00 {zone.key}"
    return _Job(job_id, kind, guard or job_id, trigger, text, call, misfire_grace_s, fixed_hours=True, zone=zone)


def _crontab_job(
    job_id: str, kind: JobKind, expression: str, zone: ZoneInfo, call: Callback, misfire_grace_s: float
) -> _Job:
    """A job at the times of a crontab expression in ``zone`` (the backup, each cron job)."""
    trigger = crontab_trigger(expression, zone)
    text = f"cron {expression} {zone.key}"
    return _Job(
        job_id, kind, job_id, trigger, text, call, misfire_grace_s, fixed_hours=hours_fixed(expression), zone=zone
    )


class SchedulerService:
    """Owns one ``AsyncIOScheduler``; ``start`` and ``stop`` belong in a gateway cleanup context.

    Cron-style jobs use ``CronTrigger`` in their zone with ``coalesce`` and a misfire grace of
    ``misfire_grace_s`` (so a loop that was held up, or a machine that slept, runs a missed firing
    once, late); the sweep is an ``IntervalTrigger`` every ``sweep_seconds``. ``timezone`` is the
    reset zone: it places the main daily boundary, the cleanup, and cron jobs that name no zone.
    ``jobs()`` and ``run_now()`` also work before ``start`` (the CLI without a daemon)."""

    def __init__(
        self,
        *,
        timezone: ZoneInfo,
        daily_reset: DailyJob | None,
        sweep_seconds: float,
        sweep: Callback,
        cleanup_at_hour: int,
        cleanup: Callback,
        cron_jobs: Sequence[CronJob],
        run_cron: Callable[[CronJob], Awaitable[object]],
        clock: Clock,
        misfire_grace_s: float = 3600,
        stop_timeout_s: float = 5,
        backup: tuple[str, Callback] | None = None,
    ) -> None:
        if sweep_seconds <= 0:
            raise ValueError(f"sweep_seconds must be positive, not {sweep_seconds}")
        self._zone = timezone
        self._clock = clock
        self._stop_timeout_s = stop_timeout_s
        self._scheduler: AsyncIOScheduler | None = None
        self._running: set[str] = set()
        self._scheduled: set[asyncio.Task[Any]] = set()  # firings of the schedule under way
        self.gate: Gate | None = None
        self.ready = False
        jobs = self._daily_jobs(daily_reset, misfire_grace_s) if daily_reset is not None else []
        every = f"every {sweep_seconds:g}s"  # an interval job: anchored when the scheduler starts
        jobs.append(_Job("sweep", "sweep", "sweep", None, every, sweep, sweep_seconds, interval_s=sweep_seconds))
        jobs.append(_daily_job("cleanup", "cleanup", cleanup_at_hour, timezone, cleanup, misfire_grace_s))
        if backup is not None:  # backup.schedule: a crontab expression in the reset zone
            jobs.append(_crontab_job("backup", "backup", backup[0], timezone, backup[1], misfire_grace_s))
        for job in cron_jobs:
            zone = ZoneInfo(job.timezone) if job.timezone else timezone
            call = _bind(run_cron, job)
            jobs.append(_crontab_job(CRON_PREFIX + job.id, "cron", job.schedule, zone, call, misfire_grace_s))
        self._jobs: dict[str, _Job] = {}
        for spec in jobs:
            if spec.id in self._jobs:
                raise ValueError(f"duplicate scheduler job id {spec.id!r}")
            self._jobs[spec.id] = spec

    def _daily_jobs(self, daily: DailyJob, misfire_grace_s: float) -> list[_Job]:
        """The daily reset at each boundary (the reset zone's first, then the agents' own), one
        guard for all: they share a callback."""
        seen: set[tuple[str, int]] = set()
        jobs: list[_Job] = []
        for zone, hour in [(self._zone, daily.at_hour), *daily.boundaries]:
            if (zone.key, hour) in seen:
                continue
            seen.add((zone.key, hour))
            job_id = "daily_reset" if not jobs else f"daily_reset:{zone.key}:{hour:02d}"
            jobs.append(_daily_job(job_id, "daily_reset", hour, zone, daily.callback, misfire_grace_s, "daily_reset"))
        return jobs

    async def start(self) -> None:
        """Schedule every job on the running loop; ``ready`` becomes true."""
        if self._scheduler is not None:
            raise RuntimeError("the scheduler is already started")
        scheduler = AsyncIOScheduler(event_loop=asyncio.get_running_loop(), timezone=self._zone)
        for job in self._jobs.values():
            self._schedule(scheduler, job)
        scheduler.add_listener(self._on_max_instances, EVENT_JOB_MAX_INSTANCES)
        scheduler.start()
        self._scheduler = scheduler
        self.ready = True
        logger.info("scheduler started with %d jobs", len(self._jobs))

    def _schedule(self, scheduler: AsyncIOScheduler, job: _Job) -> None:
        trigger = job.trigger or IntervalTrigger(seconds=job.interval_s, timezone=self._zone)
        scheduler.add_job(
            self.fire_scheduled,
            trigger=trigger,
            args=(job.id,),
            id=job.id,
            name=job.id,
            misfire_grace_time=max(1, round(job.misfire_grace_s)),
            coalesce=True,
            max_instances=1,
            replace_existing=True,
        )

    def adopt(self, other: SchedulerService) -> list[str]:
        """Take over the jobs of ``other`` (built from reloaded settings, never started): jobs
        gone are removed, new or changed ones (scheduled) again, the rest keep their next run
        time and take the new callback. A firing in progress finishes. The ids that changed."""
        changed = []
        for job_id in [j for j in self._jobs if j not in other._jobs]:
            del self._jobs[job_id]
            if self._scheduler is not None and self._scheduler.get_job(job_id) is not None:
                self._scheduler.remove_job(job_id)
            changed.append(job_id)
        for job_id, job in other._jobs.items():
            mine = self._jobs.get(job_id)
            if mine is not None and mine.text == job.text and mine.misfire_grace_s == job.misfire_grace_s:
                mine.call = job.call
                continue
            if mine is not None:
                job.tasks, job.last_run_at, job.skipped = mine.tasks, mine.last_run_at, mine.skipped
            self._jobs[job_id] = job
            if self._scheduler is not None:
                self._schedule(self._scheduler, job)
            changed.append(job_id)
        self._zone = other._zone
        return changed

    async def stop(self) -> None:
        """Stop firing; give running firings ``stop_timeout_s`` to finish, then cancel them."""
        scheduler, self._scheduler = self._scheduler, None
        self.ready = False
        if scheduler is None:
            return
        scheduler.pause()
        current = asyncio.current_task()
        pending = {task for job in self._jobs.values() for task in job.tasks if task is not current}
        if pending:
            _, late = await asyncio.wait(pending, timeout=self._stop_timeout_s)
            for task in late:
                logger.warning("cancelling a scheduler job still running at shutdown")
                task.cancel()
            if late:
                await asyncio.wait(late)
        scheduler.shutdown(wait=False)
        # AsyncIOScheduler.shutdown only queues the work on the loop; let it run.
        await asyncio.sleep(0)
        logger.info("scheduler stopped")

    def jobs(self) -> list[JobInfo]:
        """Every job with its next run time (aware UTC). Before ``start`` a cron-style job's next
        time is computed from the clock and the sweep's is ``None``. ``running`` is true while a
        firing holds the job's guard (shared by every ``daily_reset`` job)."""
        return [
            JobInfo(
                id=job.id,
                kind=job.kind,
                trigger=job.text,
                next_run_at=self._next_run_at(job),
                running=job.guard in self._running,
                last_run_at=job.last_run_at,
                skipped=job.skipped,
                last_runs=tuple(job.firings),
            )
            for job in self._jobs.values()
        ]

    def _next_run_at(self, job: _Job) -> datetime | None:
        when: datetime | None
        if self._scheduler is not None:
            scheduled = self._scheduler.get_job(job.id)
            when = None if scheduled is None else scheduled.next_run_time
        elif job.trigger is not None:
            when = job.trigger.get_next_fire_time(None, self._clock())
        else:
            when = None
        return None if when is None else when.astimezone(UTC)

    def resolve(self, job_id: str) -> str:
        """The job id ``job_id`` names: an exact id, or a cron job's bare id."""
        for candidate in (job_id, CRON_PREFIX + job_id):
            if candidate in self._jobs:
                return candidate
        known = ", ".join(self._jobs)
        raise JobNotFound(f"no scheduler job {job_id!r}; jobs: {known}")

    async def run_now(self, job_id: str) -> object:
        """Run a job at once, in the caller's task (``neotask cron run ID``); what the job's call
        returns (a cron job's outcome). A cron job may be named by its bare id. Unknown →
        ``NotFound``; already running → ``Conflict``."""
        job = self._jobs[self.resolve(job_id)]
        if job.guard in self._running:
            raise JobRunning(f"job {job.id!r} is already running")
        return await self._fire(job.id)

    async def fire_scheduled(self, job_id: str, due: datetime | None = None) -> object:
        """A firing of the schedule (what APScheduler calls; ``due``: when it was due, else the
        trigger's last time up to now): run when the gate, if any, lets it."""
        job = self._jobs.get(job_id)
        if job is None:
            return None
        at = due or self.scheduled_at(job_id, self._clock())
        if at is not None and self.repeats_wall_time(job_id, at):
            logger.info("job %s not run at %s: it ran at this wall-clock time an hour ago (DST ended)", job_id, iso(at))
            return None
        if self.gate is not None and not await self.gate(job_id, at):
            logger.debug("job %s not run here: the gate said no (another process leads)", job_id)
            return None
        task = asyncio.current_task()
        if task is not None:
            self._scheduled.add(task)
        try:
            return await self._fire(job_id)
        finally:
            if task is not None:
                self._scheduled.discard(task)

    def scheduled_at(self, job_id: str, now: datetime) -> datetime | None:
        """When the firing of ``job_id`` running at ``now`` was due: its trigger's last fire time up
        to ``now`` (within the misfire grace); None for the interval sweep."""
        job = self._jobs[job_id]
        trigger, last, since = job.trigger, None, now - timedelta(seconds=job.misfire_grace_s)
        when = None if trigger is None else trigger.get_next_fire_time(None, since)
        while trigger is not None and when is not None and when <= now:
            last, when = when, trigger.get_next_fire_time(when, _just_after(when))
        return None if last is None else last.astimezone(UTC)

    def repeats_wall_time(self, job_id: str, due: datetime) -> bool:
        """Whether the firing of ``job_id`` due at ``due`` repeats the local wall-clock time of an
        earlier firing of the same job within three hours: the second pass of the hour that
        repeats when DST ends. A job at fixed hours skips it, as cron does; a job every hour and
        the sweep do not."""
        job = self._jobs[job_id]
        if not job.fixed_hours or job.trigger is None:
            return False
        zone = job.zone or self._zone
        wall = due.astimezone(zone).replace(tzinfo=None)
        when = job.trigger.get_next_fire_time(None, due - timedelta(hours=3))
        while when is not None and when < due:
            if when.astimezone(zone).replace(tzinfo=None) == wall:
                return True
            when = job.trigger.get_next_fire_time(when, _just_after(when))
        return False

    def planned(self, since: datetime, until: datetime) -> list[tuple[datetime, str]]:
        """Every firing the schedule makes after ``since`` up to ``until`` (aware), as (due time
        in UTC, job id) in time order: each job's own trigger, the sweep's interval counted from
        ``since``. For a caller that drives the schedule itself (a dry run, tests at any date):
        ``fire_scheduled(job_id, due)`` at each."""
        out: list[tuple[datetime, str]] = []
        for job in self._jobs.values():
            trigger = job.trigger or IntervalTrigger(seconds=job.interval_s, timezone=self._zone, start_date=since)
            when = trigger.get_next_fire_time(None, _just_after(since))
            while when is not None and when <= until:
                out.append((when.astimezone(UTC), job.id))
                when = trigger.get_next_fire_time(when, _just_after(when))
        return sorted(out)

    def catch_up(self, since: datetime) -> list[str]:
        """Fire, through the gate, each cron-style job (not the daily reset: the start-up sweep
        does its work) whose last due time fell at or after ``since``: a new leader runs a firing
        that came due while no process led (the gate's claim refuses one that ran). The ids."""
        now, fired = self._clock(), []
        for job in list(self._jobs.values()):
            due = self.scheduled_at(job.id, now) if job.kind != "daily_reset" else None
            if due is not None and due >= since:
                fired.append(job.id)
                task = asyncio.create_task(self.fire_scheduled(job.id, due), name=f"catch-up {job.id}")
                job.tasks.add(task)  # ``stop`` waits for it as for any firing
                task.add_done_callback(job.tasks.discard)
                task.add_done_callback(_report)
        return fired

    async def cancel_scheduled(self) -> int:
        """Cancel the schedule's firings under way (not a ``run_now``); how many."""
        current = asyncio.current_task()
        tasks = [task for task in self._scheduled if task is not current and not task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        return len(tasks)

    async def _fire(self, job_id: str) -> object:
        job = self._jobs[job_id]
        if job.guard in self._running:
            job.skipped += 1
            logger.warning("job %s skipped: its previous firing is still running", job.id)
            return None
        self._running.add(job.guard)
        started = job.last_run_at = self._clock()
        task = asyncio.current_task()
        if task is not None:
            job.tasks.add(task)
        try:
            result = await job.call()
        except Exception as exc:
            job.firings.append(Firing.of(started, self._clock(), None, exc))
            raise
        else:
            job.firings.append(Firing.of(started, self._clock(), result, None))
            return result
        finally:
            self._running.discard(job.guard)
            if task is not None:
                job.tasks.discard(task)

    def _on_max_instances(self, event: JobSubmissionEvent) -> None:
        job = self._jobs.get(event.job_id)
        if job is not None:
            job.skipped += 1


def _just_after(when: datetime) -> datetime:
    """One microsecond after ``when``, counted in UTC. A trigger gives local times, and adding to
    one is wall-clock arithmetic that drops ``fold``: on the night DST ends, 01:00 EST plus 1 µs
    is 01:00:00.000001 EDT, an hour earlier, and asking for the firing after it gave 01:00 EST
    again, for ever."""
    return when.astimezone(UTC) + timedelta(microseconds=1)


def _report(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.error("%s failed", task.get_name(), exc_info=exc)


def _bind(run_cron: Callable[[CronJob], Awaitable[object]], job: CronJob) -> Callback:
    async def call() -> object:
        return await run_cron(job)

    return call
