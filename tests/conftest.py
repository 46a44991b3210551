"""Suite-wide fixtures: a fake clock, and a guard that fails any async test blocking its loop."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

pytest_plugins = ["tests.support.fixtures", "tests.support.postgres"]

# A callback that holds the loop longer than this fails the test. fsync, SQLite, LanceDB and model
# work belong on their threads; done on the loop they take seconds here. Two kinds of time inside a
# slow step are not counted, because they are not the code under test blocking its loop:
# - the test process's own garbage collection: once torch, LanceDB, the openai types and a thousand
#   tests' leftovers are in the process, a full pass walks millions of objects (over 1 s seen in CI)
#   and would fail whichever test it landed in (the daemon itself freezes its start-up heap,
#   gateway/heap.py);
# - the time the loop's thread was runnable but waiting for a CPU (Linux schedstat): on a 2-core
#   machine with daemons, load generators and other work beside the suite, a 0.3 s step was seen to
#   take 1.1 s of wall clock. Sleeping, waiting on a disk or a lock is not runnable time, so real
#   blocking still counts in full.
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


class _RunQueue:
    """How long one thread has been runnable but not running (seconds, from
    ``/proc/self/task/<tid>/schedstat``), sampled every 20 ms by a daemon thread so that the wait
    inside a step that just ended can be told. Where schedstat is missing it counts nothing."""

    INTERVAL_S = 0.02

    def __init__(self, native_id: int) -> None:
        self.path = f"/proc/self/task/{native_id}/schedstat"
        self.samples: deque[tuple[float, float]] = deque(maxlen=1024)
        self._sampler: threading.Thread | None = None

    def read(self) -> float | None:
        try:
            with open(self.path, "rb") as stat:
                return int(stat.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return None

    def start(self) -> None:
        if self._sampler is None and self.read() is not None:
            self._sampler = threading.Thread(target=self._sample, name="runqueue-sampler", daemon=True)
            self._sampler.start()

    def _sample(self) -> None:
        while (waited := self.read()) is not None:
            self.samples.append((time.perf_counter(), waited))
            time.sleep(self.INTERVAL_S)

    def within(self, start: float, end: float) -> float:
        """The wait between ``start`` and now (``end``), from the first sample at or after ``start``:
        never the wait before the step began."""
        now = self.read()
        if now is None:
            return 0.0
        for at, waited in list(self.samples):
            if start <= at <= end:
                return max(0.0, now - waited)
        return 0.0


_RUNQUEUE = _RunQueue(threading.get_native_id())


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
    whichever test first runs the CLI in-process; the run-queue sampler of the loop guard."""
    os.umask(0o077)
    _RUNQUEUE.start()


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
        # The wait for a CPU during a collection is in both figures: forgiven twice at most.
        waiting = _RUNQUEUE.within(end - seconds, end)
        if seconds - collecting - waiting >= BLOCKING_LIMIT_S:
            self.seen.append(
                f"{message} ({collecting:.3f} s of it garbage collection and {waiting:.3f} s waiting"
                " for a CPU, not counted)"
            )


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
