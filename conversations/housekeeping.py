"""Resets, cleanup and cron sessions (SPEC section 7), wired to the scheduler.

The rule (is a reset due?) is ``sessions.resets``; this module applies it: at the daily boundary,
on the sweep, and — so a reset missed while the daemon was down still happens — when a message
arrives, before it is appended. A reset runs the memory flush, completes the run with its final
summary, and leaves the entry idle; the next message starts a new run that inherits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo

from config.clock import Clock, parse_iso
from config.errors import NeotaskError
from config.settings import CronJob, Settings
from conversations.commands import Commands, dispatch
from conversations.hooks import SchedulingHooks
from conversations.log_context import EVERY_ONE
from conversations.run_end import RunEnd, end_active_run, end_run
from conversations.turns import Conversations, Post
from sessions.cleanup_plan import CleanupRequest
from sessions.entries import SessionEntry
from sessions.events import ResetEvent, TurnEvent
from sessions.keys import cron_key, parse_key
from sessions.protocol import Maintenance
from sessions.records import NewMessage
from sessions.resets import ResetDecision, ResetFacts, ResetPolicy, effective_policy, next_reset_at, reset_decision

if TYPE_CHECKING:
    from conversations.hooks import Delivery
    from conversations.posts import ReplyBody

log = logging.getLogger(__name__)


class Scheduling:
    def __init__(
        self,
        conversations: Conversations,
        commands: Commands,
        settings: Settings,
        *,
        clock: Clock,
        host_zone: ZoneInfo,
        hooks: SchedulingHooks | None = None,
        storage: Maintenance,
    ) -> None:
        self.conv = conversations
        self.storage = storage  # the store's maintenance (cleanup)
        self.commands = commands
        self.store = conversations.store
        self.hooks = hooks or SchedulingHooks()
        self.settings = settings
        self.clock = clock
        self.host_zone = host_zone
        self._not_before: dict[str, tuple[str, datetime]] = {}  # key -> (run, no reset before this)
        self._slots = asyncio.Semaphore(settings.scheduler.reset_concurrency)
        self._closing = False
        self.startup: asyncio.Task[int] | None = None
        self.started_at = clock()  # a daily boundary before it fell due while the gateway was down

    # -- the rule, applied to an entry ----------------------------------------------------------

    def policy(self, entry: SessionEntry) -> ResetPolicy:
        return effective_policy(
            self.settings.session, chat_type=entry.chat_type, channel=entry.channel, host_zone=self.host_zone
        )

    def facts(self, entry: SessionEntry, *, activity_at: datetime | None = None) -> ResetFacts | None:
        run = self.store.active_run(entry.key)
        if run is None:
            return None
        last_user = entry.last_user_activity_at
        return ResetFacts(
            started_at=parse_iso(run.started_at),
            last_interaction_at=parse_iso(entry.last_interaction_at) if entry.last_interaction_at else None,
            last_user_activity_at=activity_at or (parse_iso(last_user) if last_user else None),
            last_reset_boundary=parse_iso(entry.last_reset_boundary) if entry.last_reset_boundary else None,
            gateway_started_at=self.started_at,
        )

    def decision(self, key: str, *, activity_at: datetime | None = None) -> ResetDecision | None:
        entry = self.store.entry(key)
        facts = self.facts(entry, activity_at=activity_at) if entry else None
        if entry is None or facts is None:
            return None
        return reset_decision(self.policy(entry), facts, self.clock())

    def next_reset(self, key: str) -> datetime | None:
        entry = self.store.entry(key)
        facts = self.facts(entry) if entry else None
        if entry is None or facts is None:
            return None
        return next_reset_at(self.policy(entry), facts, self.clock())

    # -- carrying it out ------------------------------------------------------------------------

    async def check_on_arrival(self, post: Post) -> list[TurnEvent]:
        """Before a message is appended: reset first if one is due. The arriving user message
        counts as activity after the boundary, so it can defer a daily reset whose boundary this
        gateway was running at, never one that fell due while it was down (``sessions.resets``):
        that message waits for the key's reset and goes to the new run."""
        key = post.key.raw
        now = self.clock()
        run = self.store.active_run(key)
        if run is None:
            return []
        cached = self._not_before.get(key)
        if cached is not None and cached[0] == run.run_id and now < cached[1]:
            return []  # activity only ever moves a reset later, so this bound still holds
        activity = now if post.message.role == "user" and post.message.user_activity is not False else None
        decision = self.decision(key, activity_at=activity)
        if decision is None or not decision.due:
            earliest = self.next_reset(key)
            self._not_before[key] = (run.run_id, earliest if earliest is not None else datetime.max.replace(tzinfo=UTC))
            return []
        event = await self.reset(post.key.raw, decision, activity_at=activity)
        return [event] if event else []

    async def reset(
        self, key: str, decision: ResetDecision, *, activity_at: datetime | None = None
    ) -> ResetEvent | None:
        async with self.conv.exclusive(key):
            again = self.decision(key, activity_at=activity_at)  # the state may have moved meanwhile
            run = self.store.active_run(key)
            if run is None or again is None or not again.due:
                return None
            reason = again.reason or "daily"
            how = RunEnd(reason, store_reason=f"reset:{reason}", flush=True, boundary=again.boundary, counted=reason)
            _, event = await end_active_run(self.conv, key, how)
        log.info("reset %s (%s): run %s completed; the next message opens its new run", key, reason, run.run_id,
                 extra=EVERY_ONE)  # fmt: skip
        return event

    async def sweep(self) -> int:
        """Every active key whose reset is due (daily at the boundary, idle, or deferred), at most
        ``scheduler.reset_concurrency`` at a time (across sweeps); the number of keys reset."""

        async def one(key: str) -> bool:
            if self._closing:
                return False
            async with self._slots:
                decision = self.decision(key)
                if self._closing or decision is None or not decision.due:
                    return False
                return await self.reset(key, decision) is not None

        keys = [run.key for run in list(self.store.active_runs())]
        results = await asyncio.gather(*(one(key) for key in keys), return_exceptions=True)
        for key, result in zip(keys, results, strict=True):
            if isinstance(result, asyncio.CancelledError):
                raise result
            if isinstance(result, BaseException):
                log.error("reset of %s failed: %s", key, result, exc_info=result)
        return sum(result is True for result in results)

    def start(self) -> None:
        """The resets that fell due while the daemon was down run in the background, so the port
        is bound first; a message for such a key resets it first (``check_on_arrival``)."""
        self.startup = asyncio.create_task(self.sweep(), name="resets due at start")

    async def pause(self) -> None:
        """Leadership lost: the start-up sweep stops (the next leader runs its own); a later
        ``start`` runs it again."""
        if self.startup is not None and not self.startup.done():
            self.startup.cancel()
            await asyncio.gather(self.startup, return_exceptions=True)

    async def close(self, timeout: float) -> None:
        """Start no more resets; give the running ones ``timeout`` seconds, then cancel them
        (a reset cut short happens again at the next start)."""
        self._closing = True
        if self.startup is not None and not self.startup.done():
            await asyncio.wait({self.startup}, timeout=timeout)
            self.startup.cancel()
            await asyncio.gather(self.startup, return_exceptions=True)

    async def sweep_job(self) -> None:
        await self.sweep()

    async def cleanup_job(self) -> None:
        await self.cleanup()

    async def cleanup(self, *, dry_run: bool = False) -> list[dict[str, Any]]:
        async def complete(key: str) -> None:
            async with self.conv.exclusive(key):
                await end_run(self.conv, key, RunEnd("cleanup"))

        request = CleanupRequest(self.settings.cleanup, self.clock(), dry_run, complete, self.hooks.archive_step)
        report = await self.storage.cleanup(request)
        gone = [a["run_id"] for a in report if a["action"] == "delete_archive" and a["done"]]
        if gone and self.hooks.forget_runs is not None:  # the history index follows deletes
            await self.hooks.forget_runs(gone)
        return report

    async def run_cron(self, job: CronJob) -> CronOutcome:
        """Post the job's message to ``cron:<id>``; an isolated job gets a run per firing. What
        happened comes back (``neotask cron run`` and the run-now route report it): answered (or
        stored, without a model), delivered, or failed and why; a failure is also logged."""
        key = parse_key(cron_key(job.id), agents=self.settings.agents)
        key = replace(key, agent_id=job.agent)
        if job.isolated and self.store.active_run(key.raw) is not None:
            async with self.conv.exclusive(key.raw):
                await end_run(self.conv, key.raw, RunEnd("cron"))
        if job.isolated and not job.inherit:  # this firing starts clean (cron.jobs[].inherit: false)
            await self.store.set_inherit_next(key.raw, False)
        post = Post(key=key, message=NewMessage(role="user", content=job.message, user_activity=False, name="cron"))
        try:
            outcome = await dispatch(self.commands, post)
        except NeotaskError as exc:  # a failing job must not stop the scheduler: it is reported and logged
            log.error("cron job %s failed: %s: %s", job.id, exc.code, exc.message)
            return CronOutcome(job.id, key.raw, "failed", error=f"{exc.code}: {exc.message}")
        except Exception as exc:
            log.exception("cron job %s failed", job.id)
            return CronOutcome(job.id, key.raw, "failed", error=f"{type(exc).__name__}: {exc}")
        if job.isolated:
            async with self.conv.exclusive(key.raw):
                await end_run(self.conv, key.raw, RunEnd("cron"))
        body = outcome.body()
        delivery = None
        if job.deliver_to and self.hooks.deliver is not None:
            delivery = await self.hooks.deliver(job.deliver_to, body)
        status: CronStatus = "answered" if body["reply"] is not None else "stored"
        return CronOutcome(job.id, key.raw, status, body=body, delivery=delivery)


CronStatus = Literal["answered", "stored", "failed"]


@dataclass(frozen=True)
class CronOutcome:
    """One firing of a cron job: ``answered`` (the model replied), ``stored`` (store-only mode:
    the message is kept, nobody answers) or ``failed`` (``error`` says why); ``delivery`` when the
    job has a ``deliver_to``. ``ok``: the turn did not fail and the delivery, if any, arrived."""

    job: str
    session_key: str
    status: CronStatus
    error: str | None = None
    body: ReplyBody | None = None
    delivery: Delivery | None = None

    @property
    def ok(self) -> bool:
        return self.status != "failed" and (self.delivery is None or self.delivery.delivered)

    def as_dict(self) -> dict[str, Any]:
        body: Mapping[str, Any] = self.body or {}
        reply = body.get("reply")
        return {
            "ok": self.ok,
            "status": self.status,
            "error": self.error,
            "session_key": self.session_key,
            "run_id": body.get("run_id"),
            "message_seq": body.get("message_seq"),
            "reply": reply,
            "delivery": self.delivery.as_dict() if self.delivery else None,
        }
