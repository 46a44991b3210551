"""Which gateway process leads (runs the daily and idle resets, cleanup, cron, backups, and writes
the memory index): the one holding a session-level advisory lock on its own connection. A leader
that dies loses its connection, the server releases the lock, and the next process to try takes it
over. ``sessions.leadership`` names the seam; ``sessions.backends.open_leadership`` builds this.

Never two leaders at work at once: a leader checks its connection every ``interval_s`` (a check
that takes longer than ``interval_s`` fails), so one whose connection died knows it within
twice ``interval_s`` and stops. Each check also writes when it was made (``leader_seen``); a
process that takes the lock while a leader checked in less than ``grace_s`` ago (more than twice
``interval_s``) waits that grace and checks again before it reports leading, since that leader may
not know yet; a lock nobody held lately (a first start, a leader that resigned at shutdown or died
long ago) is led at once. A scheduled firing is claimed on the lock's own connection
(``claim``): a row in ``scheduler_claims``, written only while that connection, and so the lock,
lives; the first claim of a (job, scheduled time) wins, a second one is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from datetime import datetime

import asyncpg

from sessions.postgres.faults import LOST

log = logging.getLogger(__name__)

LEADER_LOCK = 0x6E656F74_6C656164  # "neotlead"; the migrations' lock is another number
_SIGNED = LEADER_LOCK - (1 << 64) if LEADER_LOCK >= 1 << 63 else LEADER_LOCK
CLAIMS_KEPT = "30 days"  # claims older than this are deleted as new ones are written

SEEN_MIGRATION = """
CREATE TABLE leader_seen (id int PRIMARY KEY CHECK (id = 1), seen_at timestamptz, holder text);
"""
_SEEN = (
    "INSERT INTO leader_seen (id, seen_at, holder) VALUES (1, now(), $1)"
    " ON CONFLICT (id) DO UPDATE SET seen_at = now(), holder = excluded.holder"
)
_SEEN_LATELY = "SELECT COALESCE(bool_or(seen_at > now() - make_interval(secs => $1)), false) FROM leader_seen"
_RESIGNED = "UPDATE leader_seen SET seen_at = NULL WHERE holder = $1"

MIGRATION = """
CREATE TABLE scheduler_claims (
    job text NOT NULL,
    scheduled_at timestamptz NOT NULL,
    claimed_by text NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job, scheduled_at)
);
CREATE INDEX scheduler_claims_by_time ON scheduler_claims (scheduled_at);
"""

_CLAIM = f"""
WITH expired AS (DELETE FROM scheduler_claims WHERE scheduled_at < $2::timestamptz - interval '{CLAIMS_KEPT}')
INSERT INTO scheduler_claims (job, scheduled_at, claimed_by) VALUES ($1, $2, $3)
ON CONFLICT DO NOTHING RETURNING true
"""


def identity() -> str:
    """How a claim names this process: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Leadership:
    def __init__(
        self,
        dsn: str,
        *,
        password: str | None = None,
        lock: int = _SIGNED,
        interval_s: float = 2.0,
        grace_s: float | None = None,
    ) -> None:
        self.dsn, self.password, self.lock = dsn, password, lock
        self.interval_s = interval_s
        self.grace_s = 2 * interval_s + 0.5 if grace_s is None else grace_s
        self.who = identity()
        self._conn: asyncpg.Connection | None = None
        self._using = asyncio.Lock()  # one statement at a time on the connection
        self.leading = False  # the lock is held (``watch`` reports it, after the grace when one is due)
        self.seen_lately = False  # when the lock was taken, a leader had checked in within the grace
        self.sole = False

    async def try_lead(self) -> bool:
        """Whether this process holds the lock now (taking it when it is free); a lost connection
        means not leading (its lock went with it) and is retried on the next call."""
        async with self._using:
            if self._conn is not None and self._conn.is_closed():  # the lock went with it
                if self.leading:
                    log.warning("leadership connection lost: not leading until the lock is taken again")
                await self._drop()
                return False
            try:
                if self._conn is None:
                    self.leading = False
                    self._conn = await asyncpg.connect(
                        self.dsn, password=self.password, timeout=max(self.interval_s, 1)
                    )
                if not self.leading:
                    taken = await self._conn.fetchval(
                        "SELECT pg_try_advisory_lock($1)", self.lock, timeout=max(self.interval_s, 1)
                    )
                    if taken:
                        self.seen_lately = bool(
                            await self._conn.fetchval(_SEEN_LATELY, self.grace_s, timeout=max(self.interval_s, 1))
                        )
                    self.leading = bool(taken)
                if self.leading:  # still ours while the connection lives: check it does, promptly, and say when
                    await self._conn.execute(_SEEN, self.who, timeout=self.interval_s)
            except LOST as exc:
                if self.leading:
                    log.warning("leadership check failed (%s): not leading until the database answers", exc)
                await self._drop()
        return self.leading

    async def confirm(self) -> bool:
        """Whether the lock is held at this instant (a round trip on its connection)."""
        return self.leading and await self.try_lead()

    async def claim(self, job: str, scheduled_at: datetime) -> bool:
        """Take the firing of ``job`` scheduled at ``scheduled_at``: true for the first claim while
        leading, false when another claim has it or the lock is not (or no longer) held."""
        if not self.leading:
            return False
        async with self._using:
            conn = self._conn
            if conn is None or conn.is_closed():
                await self._drop()
                return False
            try:
                won = await conn.fetchval(_CLAIM, job, scheduled_at, self.who, timeout=max(self.interval_s, 1))
            except LOST as exc:
                log.warning("claiming %s failed (%s): not leading until the database answers", job, exc)
                await self._drop()
                return False
        return bool(won)

    async def watch(self, on_change: Callable[[bool], object]) -> None:
        """Try every ``interval_s`` until cancelled; ``on_change(leading)`` when it flips (a lock
        just taken is reported after ``grace_s`` if it is still held then)."""
        was = False
        try:
            while True:
                now = await self._try()
                if now and not was and self.seen_lately:
                    await asyncio.sleep(self.grace_s)  # a leader that lost its connection stops first
                    now = await self._try()
                if now != was:
                    was = now
                    on_change(now)
                await asyncio.sleep(self.interval_s)
        finally:
            if was:
                on_change(False)

    async def _try(self) -> bool:
        """``try_lead`` for ``watch``, which must outlive a surprise (it is logged: not leading)."""
        try:
            return await self.try_lead()
        except Exception:
            log.exception("leadership check failed: not leading until the next try")
            await self.resign()
            return False

    async def resign(self) -> None:
        """Give the lead up (a clean shutdown: another process takes over at its next try, at once)."""
        async with self._using:
            if self.leading and self._conn is not None and not self._conn.is_closed():
                with contextlib.suppress(Exception):  # nobody leads from here: no grace for the next one
                    await self._conn.execute(_RESIGNED, self.who, timeout=max(self.interval_s, 1))
            await self._drop()

    async def _drop(self) -> None:
        self.leading = False
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)
