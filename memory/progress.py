"""How far an indexing pass is: chunks embedded of those it must embed, the rate, the time left.

The service keeps one :class:`PassProgress` for the pass in flight, whoever started it (the
start-up pass, a rebuild after a change of embedder, the watcher, ``neotask memory index``), so
``MemoryService.status()`` (``GET /v1/memory/status``) can say how far a rebuild is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class PassProgress:
    """One pass's counts; ``update(done, total)`` is the indexer's progress callback.

    The rate is chunks embedded since the pass started over the seconds since then (``clock``,
    monotonic); the time left is the chunks left at that rate (None until one chunk is done)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started = clock()
        self.done = 0
        self.total = 0

    def update(self, done: int, total: int) -> None:
        self.done, self.total = done, total

    def as_dict(self) -> dict[str, Any]:
        elapsed = max(self._clock() - self._started, 1e-9)
        rate = self.done / elapsed if self.done else None
        left = max(self.total - self.done, 0)
        return {
            "done": self.done,
            "total": self.total,
            "chunks_per_second": round(rate, 2) if rate else None,
            "seconds_left": round(left / rate, 3) if rate else None,
        }
