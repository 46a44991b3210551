"""Which gateway process leads: the one that runs the scheduled work (daily and idle resets,
cleanup, cron jobs, backups) and writes the memory index. Backend-neutral; the backend's one
construction site (``sessions.backends.open_leadership``) picks the implementation.

| backend | leadership |
|---|---|
| ``files`` | ``SoleLeader``: always leads (the home lock already refuses a second process) |
| ``postgres`` | ``sessions.postgres.leader.Leadership``: a session advisory lock on its own connection |

``watch(on_change)`` runs until cancelled and calls ``on_change(True)`` once this process leads and
``on_change(False)`` once it no longer does; ``confirm()`` says whether it leads at this instant (a
round trip for postgres); ``claim(job, scheduled_at)`` marks one scheduled firing of a job as taken
by this leader and is true only the first time any process claims it (so a firing is not run twice
across a takeover, nor by two machines whose clocks differ by a few seconds).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Protocol


class Leadership(Protocol):
    @property
    def leading(self) -> bool: ...

    @property
    def sole(self) -> bool:
        """True when no other process can lead (the files backend): nothing to wait for."""
        ...

    async def watch(self, on_change: Callable[[bool], object]) -> None: ...

    async def confirm(self) -> bool: ...

    async def claim(self, job: str, scheduled_at: datetime) -> bool: ...

    async def resign(self) -> None: ...


class SoleLeader:
    """The files backend's leadership: this process leads from the start to the end."""

    leading = True
    sole = True

    async def watch(self, on_change: Callable[[bool], object]) -> None:
        on_change(True)
        await asyncio.Event().wait()  # until cancelled

    async def confirm(self) -> bool:
        return True

    async def claim(self, job: str, scheduled_at: datetime) -> bool:
        return True

    async def resign(self) -> None:
        return None
