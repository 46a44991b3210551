"""Once per key per window: whether a notice is due (a paused session tells each sender once in a
while, not on every message). In memory: a restart may tell once more."""

from __future__ import annotations

from collections.abc import Hashable
from datetime import datetime, timedelta

from config.clock import Clock

KEPT = 10_000  # keys remembered before those outside the window are forgotten


class Throttle:
    def __init__(self, window: timedelta, clock: Clock) -> None:
        self.window = window
        self.clock = clock
        self._last: dict[Hashable, datetime] = {}

    def due(self, key: Hashable) -> bool:
        """True (and counted as given now) when nothing was given for ``key`` within the window."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.window:
            return False
        if len(self._last) >= KEPT:
            self._last = {k: t for k, t in self._last.items() if now - t < self.window}
        self._last[key] = now
        return True
