"""Which gateway process leads (runs the daily and idle resets, cleanup, cron, memory indexing):
the one holding a session-level advisory lock on its own connection. A leader that dies loses its
connection, the server releases the lock, and the next process to try takes it over.

Not wired into the daemon yet (it serves the files backend only); ``Leadership`` is the building
block: ``try_lead`` once, or ``watch`` to keep trying every ``interval_s`` and be told on change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import asyncpg

from sessions.postgres.faults import LOST

log = logging.getLogger(__name__)

LEADER_LOCK = 0x6E656F74_6C656164  # "neotlead"; the migrations' lock is another number
_SIGNED = LEADER_LOCK - (1 << 64) if LEADER_LOCK >= 1 << 63 else LEADER_LOCK


class Leadership:
    def __init__(self, dsn: str, *, password: str | None = None, lock: int = _SIGNED) -> None:
        self.dsn, self.password, self.lock = dsn, password, lock
        self._conn: asyncpg.Connection | None = None
        self.leading = False

    async def try_lead(self) -> bool:
        """Whether this process leads now (taking the lock when it is free); a lost connection
        means not leading (its lock went with it) and is retried on the next call."""
        try:
            if self._conn is None or self._conn.is_closed():
                self.leading = False
                self._conn = await asyncpg.connect(self.dsn, password=self.password, timeout=5)
            if not self.leading:
                self.leading = bool(await self._conn.fetchval("SELECT pg_try_advisory_lock($1)", self.lock, timeout=5))
            else:  # still ours while the connection lives: check it does
                await self._conn.fetchval("SELECT 1", timeout=5)
        except LOST as exc:
            log.warning("leadership check failed (%s): not leading until the database answers", exc)
            await self._drop()
        return self.leading

    async def watch(self, interval_s: float, on_change: Callable[[bool], object]) -> None:
        """Try every ``interval_s`` until cancelled; ``on_change(leading)`` when it flips."""
        was = False
        try:
            while True:
                now = await self.try_lead()
                if now != was:
                    was = now
                    on_change(now)
                await asyncio.sleep(interval_s)
        finally:
            if was:
                on_change(False)

    async def resign(self) -> None:
        """Give the lead up (a clean shutdown: another process takes over at its next try)."""
        await self._drop()

    async def _drop(self) -> None:
        self.leading = False
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close(timeout=5)
