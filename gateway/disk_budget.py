"""A disk budget: ``storage.min_free`` free space is kept on the disk of the
home. Below it new messages are refused with 507 ``insufficient_storage`` before the disk is
actually full, ``/readyz`` is unready and says why, and the cleanup job (archiving, deleting old
archives) runs early. Crossing the line is logged and counted once each way, not per request.

Free space is read with ``statvfs`` (no disk access: the file system's counters) at most every
``storage.free_check_ms`` while there is room; while below the line every check reads it again,
so a freed disk accepts the very next message."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from config.errors import InsufficientStorage
from config.settings import StorageSettings
from config.sizes import Threshold, parse_threshold
from conversations.metrics import Metrics

if TYPE_CHECKING:
    from conversations.hooks import Event
    from conversations.turns import Post

log = logging.getLogger(__name__)
GIB = 1 << 30
DEFAULT_PERCENT = 5.0


def min_free_bytes(setting: str | int | None, total: int) -> int:
    """The line in bytes on a file system of ``total`` bytes (None: the smaller of 1 GiB and 5 %)."""
    if setting is None:
        return min(GIB, Threshold(percent=DEFAULT_PERCENT).of(total))
    return parse_threshold(setting).of(total)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class DiskBudget:
    def __init__(
        self,
        path: Path,
        settings: StorageSettings,
        metrics: Metrics,
        *,
        on_low: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.path = path
        self.setting = settings.min_free
        self.every_s = settings.free_check_ms / 1000
        self.metrics = metrics
        self.on_low = on_low
        self.low: str | None = None  # why new messages are refused, while they are
        self._checked_at = float("-inf")
        self._tasks: set[asyncio.Task[object]] = set()

    def check(self, *, fresh: bool = False) -> str | None:
        """None while free space is above the line, else why not. Reads it again when the last
        read is older than ``free_check_ms``, when below the line, or when ``fresh``."""
        now = time.monotonic()
        if self.low is None and not fresh and now - self._checked_at < self.every_s:
            return None
        self._checked_at = now
        try:
            info = os.statvfs(self.path)
        except OSError as exc:  # the store's own probe reports an unusable disk
            log.debug("statvfs %s: %s", self.path, exc)
            return self.low
        total, free = info.f_blocks * info.f_frsize, info.f_bavail * info.f_frsize
        line = min_free_bytes(self.setting, total)
        low = (
            f"{_mib(free)} free on the disk of the home, below storage.min_free ({_mib(line)}): new messages are"
            " refused; free some space (cleanup and archiving run now) or lower storage.min_free"
            if line > 0 and free < line
            else None
        )
        if (low is None) != (self.low is None):
            self._crossed(low, free, line)
        self.low = low
        return low

    def _crossed(self, low: str | None, free: int, line: int) -> None:
        self.metrics.disk_low.set(0 if low is None else 1)
        if low is None:
            log.warning("disk space is back: %s free, above storage.min_free (%s); new messages accepted again",
                        _mib(free), _mib(line))  # fmt: skip
            return
        self.metrics.disk_low_crossings.inc()
        log.warning("disk space low: %s", low)
        if self.on_low is not None:
            task: asyncio.Task[object] = asyncio.ensure_future(self._run_on_low())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run_on_low(self) -> object:
        assert self.on_low is not None
        try:
            return await self.on_low()
        except Exception:
            log.exception("the early cleanup for low disk space failed")
            return None

    async def before_post(self, post: Post) -> list[Event]:
        """``ConversationHooks.before_post``: refuses a new message while below the line."""
        low = self.check()
        if low is not None:
            raise InsufficientStorage(f"the message was not stored: {low}")
        return []

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
