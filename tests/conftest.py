"""Suite-wide fixtures: a fake clock, and a guard that fails any async test blocking its loop."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

pytest_plugins = ["tests.support.fixtures"]

# A callback that holds the loop longer than this fails the test. fsync, SQLite, LanceDB and model
# work belong on their threads; done on the loop they take seconds here. The bound leaves room for
# what a busy 2-core machine does to a short callback (scheduling), so only real blocking fails. The
# test process's own garbage collection is not counted: once torch, LanceDB, the openai types and a
# thousand tests' leftovers are in the process, a full pass walks millions of objects (over 1 s
# seen in CI), and it would fail whichever test it happened to land in. The daemon itself freezes
# its start-up heap (gateway/heap.py).
BLOCKING_LIMIT_S = 1.0
_TOOK = re.compile(r" took (\d+(?:\.\d+)?) seconds")


class _Collections:
    """The wall-clock spans of this process's garbage collections (the last few hundred)."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.spans.append((self._start, time.perf_counter()))
            del self.spans[:-256]

    def within(self, start: float, end: float) -> float:
        return sum(max(0.0, min(end, b) - max(start, a)) for a, b in self.spans)


_COLLECTIONS = _Collections()
gc.callbacks.append(_COLLECTIONS)


class FakeClock:
    """An aware-UTC clock the test moves by hand."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kwargs: float) -> datetime:
        self.now += timedelta(**kwargs)
        return self.now

    def set(self, when: datetime) -> None:
        self.now = when


def pytest_sessionstart(session: pytest.Session) -> None:
    """The umask the ``neotask`` CLI sets (owner-only files), so in-process homes match real ones
    whichever test first runs the CLI in-process."""
    os.umask(0o077)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


class _SlowCallbacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        took = _TOOK.search(message) if message.startswith("Executing") else None
        if took is None:
            return
        end = time.perf_counter()  # asyncio logs right after the slow step returns
        seconds = float(took.group(1))
        collecting = _COLLECTIONS.within(end - seconds, end)
        if seconds - collecting >= BLOCKING_LIMIT_S:
            self.seen.append(f"{message} ({collecting:.3f} s of it garbage collection, not counted)")


@pytest.fixture(autouse=True)
async def _loop_must_not_block(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    if request.node.get_closest_marker("allow_blocking"):
        yield
        return
    loop = asyncio.get_running_loop()
    handler = _SlowCallbacks()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    previous = loop.get_debug(), loop.slow_callback_duration
    loop.set_debug(True)
    loop.slow_callback_duration = BLOCKING_LIMIT_S
    try:
        yield
    finally:
        loop.set_debug(previous[0])
        loop.slow_callback_duration = previous[1]
        logger.removeHandler(handler)
    if handler.seen:
        pytest.fail("the event loop was blocked:\n" + "\n".join(handler.seen[:5]))
