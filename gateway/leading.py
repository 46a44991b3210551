"""The leader's work started and stopped as leadership (``sessions.leadership``) comes and goes.

Every process schedules the same jobs; a firing runs only where ``may_fire`` says so: this process
leads, and (postgres) it claimed that firing in the database on the leader lock's own connection,
so a firing runs at most once across a takeover. On gaining the lead: the resets that fell due
meanwhile (``Scheduling.start``), the cron-style firings that came due since this process started
and no process ran (``SchedulerService.catch_up``), and the memory index's writes; on losing it:
the schedule's firings under way are cancelled, the start-up sweep too, and the memory index stops
writing. The files backend
is its own leader from the start (``SoleLeader``): nothing changes there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime

from config.clock import Clock
from conversations.housekeeping import Scheduling
from memory import MemoryService
from scheduler.service import SchedulerService
from sessions.leadership import Leadership

log = logging.getLogger(__name__)


class LeaderWork:
    def __init__(
        self,
        leadership: Leadership,
        scheduler: SchedulerService,
        scheduling: Scheduling,
        memory: MemoryService | None,
        *,
        clock: Clock,
    ) -> None:
        self.leadership = leadership
        self.scheduler = scheduler
        self.scheduling = scheduling
        self.memory = memory
        self.started_at = clock()  # firings due since then and run by no process: run on gaining the lead
        self.leading = False  # the leader's work runs here
        self._watch: asyncio.Task[None] | None = None
        self._stops: set[asyncio.Task[None]] = set()
        self._closing = False

    @property
    def shared(self) -> bool:
        """Several processes may lead (postgres): the leader flag means something."""
        return not self.leadership.sole

    def start(self) -> None:
        if self.leadership.sole:
            self._on_change(True)
            return
        self.scheduler.gate = self.may_fire
        self._watch = asyncio.create_task(self.leadership.watch(self._on_change), name="leadership")

    async def may_fire(self, job_id: str, scheduled_at: datetime | None) -> bool:
        """A scheduled firing runs here: leading, and the firing claimed (the sweep: leading now)."""
        if not self.leading:
            return False
        if scheduled_at is None:
            return await self.leadership.confirm()
        won = await self.leadership.claim(job_id, scheduled_at)
        if not won:
            log.info("job %s (due %s) not run here: it was claimed already or the lead was lost",
                     job_id, scheduled_at.isoformat())  # fmt: skip
        return won

    def _on_change(self, leading: bool) -> None:
        if leading == self.leading:
            return
        self.leading = leading
        if leading:
            if self.shared:
                log.info("leadership gained: this process runs the resets, cleanup, cron jobs and memory indexing")
            self.scheduling.start()
            if self.shared:
                caught = self.scheduler.catch_up(self.started_at)
                if caught:
                    log.info("catching up: firing %s, due while no process led, unless one ran it",
                             ", ".join(caught))  # fmt: skip
            if self.memory is not None:
                self.memory.set_writer(True)
            return
        if self.memory is not None:
            self.memory.set_writer(False)
        if self._closing:
            log.info("leadership given up (shutting down)")
            return
        log.warning("leadership lost: resets, cleanup, cron jobs and memory indexing stop here until it leads again")
        task = asyncio.create_task(self._stop_work(), name="leadership-lost")
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _stop_work(self) -> None:
        cancelled = await self.scheduler.cancel_scheduled()
        await self.scheduling.pause()
        if cancelled:
            log.warning("leadership lost: %d job firing(s) under way cancelled", cancelled)

    async def close(self) -> None:
        """Stop watching and give the lead up (after the scheduler stopped: its last firings ran
        as the leader)."""
        self._closing = True
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        for task in list(self._stops):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.leadership.resign()
        self.leading = False
