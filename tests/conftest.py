"""Suite-wide fixtures: a fake clock, and a guard that fails any async test blocking its loop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import re
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# No deadline on a generated case: a test's timing is no assertion of it (a busy machine took one
# parse 408 ms against hypothesis's 200 ms default and failed a test that checks only the results).
settings.register_profile("neotask", deadline=None)
settings.load_profile("neotask")

pytest_plugins = ["tests.support.fixtures", "tests.support.postgres"]


def _lock_log_capture_against_threads() -> None:
    """pytest's log capture walks ``logging``'s table of loggers when each test phase starts, without
    ``logging``'s lock; a thread a test left behind (an embedder still importing its libraries, which
    name their loggers as they load) adds to the table meanwhile, and the next test in that worker
    failed with "dictionary changed size during iteration" (seen once in make test). The walk takes
    the lock that ``logging.getLogger`` takes."""
    import logging

    from _pytest import logging as capture

    enter = capture.catching_logs.__enter__
    lock = logging._lock  # type: ignore[attr-defined]  # the module's RLock (3.11 to 3.13)

    def locked_enter(self: Any) -> Any:
        with lock:
            return enter(self)

    capture.catching_logs.__enter__ = locked_enter  # type: ignore[method-assign]


_lock_log_capture_against_threads()

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
#   blocking still counts in full;
# - the time another thread held the interpreter lock (a thread loading a model or a native
#   library: CPython opens shared libraries with the lock held; CI saw a 1.8 s step that was not
#   the loop's own CPU, nor a wait for a CPU). The loop's code holding the lock itself is on a CPU
#   and counts; a C call that sleeps with the lock held would be forgiven, which nothing here does.
BLOCKING_LIMIT_S = 1.0
_TOOK = re.compile(r" took (\d+(?:\.\d+)?) seconds")


class _Collections:
    """The wall-clock spans of this process's garbage collections (the last few hundred), each with
    the thread that ran it."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float, int]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.spans.append((self._start, time.perf_counter(), threading.get_ident()))
            del self.spans[:-256]

    def within(self, start: float, end: float, thread: int) -> float:
        """The seconds ``thread`` spent collecting between ``start`` and ``end``. A collection in
        another thread is not the step's own: it stopped the step only if the step wanted the
        interpreter lock meanwhile, which the run queue's sampler tells."""
        return sum(max(0.0, min(end, b) - max(start, a)) for a, b, ran in self.spans if ran == thread)


_COLLECTIONS = _Collections()
gc.callbacks.append(_COLLECTIONS)


class _RunQueue:
    """Where one thread's time went (``/proc/self/task/<tid>/schedstat``: seconds on a CPU, seconds
    runnable but waiting for one), sampled every 20 ms by a daemon thread so that a step that just
    ended can be told apart. The sampler is itself a Python thread: when it wakes late while the
    loop's thread was neither on a CPU nor waiting for one, neither thread could get the
    interpreter lock, so a third thread held it (CPython loads a native library or runs some C code
    with it held), unless the sampler was itself waiting for a CPU or collecting garbage (CI saw a
    1.2 s sleep on the loop of a busy machine forgiven down to less than 1 s). Where schedstat is
    missing it counts nothing."""

    INTERVAL_S = 0.02
    LATE_S = 0.03  # a wake-up this much past its interval is late (timer slack and scheduling)

    def __init__(self, native_id: int) -> None:
        self.path = f"/proc/self/task/{native_id}/schedstat"
        # (at, on CPU, waited, the sampler's own seconds waiting for a CPU)
        self.samples: deque[tuple[float, float, float, float]] = deque(maxlen=1024)
        self._sampler: threading.Thread | None = None
        self._sampler_path = ""

    def read(self) -> tuple[float, float] | None:
        return self._schedstat(self.path)

    def sampler_waited(self) -> float:
        """The sampler thread's own seconds runnable but waiting for a CPU (0 before it starts)."""
        read = self._schedstat(self._sampler_path) if self._sampler_path else None
        return read[1] if read else 0.0

    @staticmethod
    def _schedstat(path: str) -> tuple[float, float] | None:
        try:
            with open(path, "rb") as stat:
                fields = stat.read().split()
            return int(fields[0]) / 1e9, int(fields[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return None

    def start(self) -> None:
        if self._sampler is None and self.read() is not None:
            self._sampler = threading.Thread(target=self._sample, name="runqueue-sampler", daemon=True)
            self._sampler.start()

    def _sample(self) -> None:
        self._sampler_path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
        while (read := self.read()) is not None:
            self.samples.append((time.perf_counter(), *read, self.sampler_waited()))
            time.sleep(self.INTERVAL_S)

    def within(self, start: float, end: float) -> tuple[float, float]:
        """Inside the step from ``start`` to now (``end``): the seconds the thread waited for a CPU
        (from the first sample at or after ``start``: never the wait before the step began), and
        the seconds another thread held the interpreter lock (the sampler's late wake-ups less its
        own wait for a CPU, at most the thread's time off a CPU and out of the run queue since the
        last sample before ``start``)."""
        now = self.read()
        if now is None:
            return 0.0, 0.0
        samples = [*list(self.samples), (end, *now, self.sampler_waited())]
        waiting = next((now[1] - waited for at, _, waited, _ in samples if start <= at <= end), 0.0)
        before = [s for s in samples if s[0] <= start]
        base = before[-1] if before else samples[0]
        idle = (end - base[0]) - (now[0] - base[1]) - (now[1] - base[2])
        late = 0.0
        sampler = self._sampler.ident if self._sampler else None
        for (a, _, _, queued_a), (b, _, _, queued_b) in itertools.pairwise(samples):
            past_due = max(0.0, min(b, end) - max(a + self.INTERVAL_S + self.LATE_S, start))
            own = queued_b - queued_a + (_COLLECTIONS.within(a, b, sampler) if sampler else 0.0)
            late += max(0.0, past_due - own)
        return max(0.0, waiting), max(0.0, min(late, idle))


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


# The longest files first: pytest-xdist (--dist loadfile) hands out files in collection order, and
# these (real daemons, model loads, Synapse, benches; 40-150 s each under make test) collected in
# their place, or last as the root's files are, left workers idle while one finished them: the
# longest first leaves the short ones to even out the end. The rest keep their order.
SLOW_FILES_FIRST = (
    "tests/channels/test_telegram_crashes.py",
    "tests/test_bench_smoke.py",
    "tests/gateway/test_leader_daemons.py",
    "tests/channels/test_matrix_synapse.py",
    "tests/gateway/test_console.py",
    "tests/channels/test_telegram_daemon.py",
    "tests/gateway/test_api_fuzz.py",
    "tests/faults/test_openai_crash.py",
    "tests/channels/test_telegram_access.py",
    "tests/faults/test_history_catch_up.py",
    "tests/memory/test_benchmarks.py",
    "tests/channels/test_slack_daemon.py",
    "tests/faults/test_idempotency_crash.py",
    "tests/backups/test_backup_daemon.py",
    "tests/gateway/test_memory_progress.py",
    "tests/channels/test_refused_store.py",
    "tests/channels/test_telegram_bots.py",
    "tests/gateway/test_postgres_workers.py",
    "tests/gateway/test_optional_bodies.py",
    "tests/faults/test_connections_and_logs.py",
)
# The files that load the packaged embedding models (the session fixtures of tests/memory/conftest.py,
# torch's first import) are one unit of work for pytest-xdist, handed out first: one worker loads the
# models once for all of them, where each worker that got one of them loaded them again. Each file
# keeps its order and its module fixtures.
MODEL_FILES = (
    "tests/memory/test_rebuild.py",
    "tests/memory/test_e5.py",
    "tests/memory/test_e5_engine.py",
    "tests/memory/test_routed.py",
    "tests/memory/test_embedder_contract.py",
    "tests/memory/test_embedders.py",
)


def _rank(path: str) -> tuple[int, int]:
    if path in MODEL_FILES:
        return 0, MODEL_FILES.index(path)
    return 1 + (SLOW_FILES_FIRST.index(path) if path in SLOW_FILES_FIRST else len(SLOW_FILES_FIRST)), 0


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    items.sort(key=lambda item: _rank(Path(str(item.path)).relative_to(root).as_posix()))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent under -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadfile, with MODEL_FILES one unit."""
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    if config.getoption("dist") != "loadfile":
        return None

    class Scheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return MODEL_FILES[0] if path in MODEL_FILES else path

    return Scheduling(config, log)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


class _SlowCallbacks:
    """The steps of a guarded loop that held it at least ``BLOCKING_LIMIT_S``, less the time that
    was not the loop's own (its collections, its waits for a CPU, another thread's hold on the
    interpreter lock)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def report(self, step: str, seconds: float, end: float | None = None) -> None:
        """A step (described as ``step``) took ``seconds`` and ended at ``end`` (now by default)."""
        end = time.perf_counter() if end is None else end
        collecting = _COLLECTIONS.within(end - seconds, end, threading.get_ident())
        # The wait for a CPU during a collection is in both figures: forgiven twice at most.
        waiting, held = _RUNQUEUE.within(end - seconds, end)
        if seconds - collecting - waiting - held >= BLOCKING_LIMIT_S:
            self.seen.append(
                f"Executing {step} took {seconds:.3f} seconds ({collecting:.3f} s of it garbage collection,"
                f" {waiting:.3f} s waiting for a CPU and {held:.3f} s waiting for the interpreter lock another"
                " thread held, not counted)"
            )


# Every callback of an event loop runs through ``Handle._run`` (a task's step, a timer, a future's
# done-callback): timing it there finds a blocked loop without asyncio's debug mode, which records
# a traceback for every handle and future it creates and made the in-process tests a third slower.
_GUARDED: dict[asyncio.AbstractEventLoop, tuple[_SlowCallbacks, float]] = {}
_HANDLE_RUN = asyncio.events.Handle._run


def _timed_run(self: asyncio.Handle) -> None:
    guard = _GUARDED.get(self._loop) if _GUARDED else None  # type: ignore[attr-defined]
    if guard is None:
        _HANDLE_RUN(self)
        return
    start = time.perf_counter()
    try:
        _HANDLE_RUN(self)
    finally:
        end = time.perf_counter()
        if end - start >= guard[1]:
            owner = getattr(self._callback, "__self__", None)  # type: ignore[attr-defined]
            guard[0].report(repr(owner) if isinstance(owner, asyncio.Future) else repr(self), end - start, end)


asyncio.events.Handle._run = _timed_run  # type: ignore[method-assign]


@contextlib.contextmanager
def guarded(loop: asyncio.AbstractEventLoop, limit: float = BLOCKING_LIMIT_S) -> Iterator[_SlowCallbacks]:
    """Time every step of ``loop``; the slow ones land in the handler's ``seen``. The loop's
    calls also check that they come from its own thread (what debug mode checked besides)."""
    handler = _SlowCallbacks()
    _GUARDED[loop] = (handler, limit)
    checks = {name: getattr(loop, name) for name in ("call_soon", "call_later", "call_at")}

    def checked(call: Any) -> Any:
        def call_checked(*args: Any, **kwargs: Any) -> Any:
            loop._check_thread()  # type: ignore[attr-defined]
            return call(*args, **kwargs)

        return call_checked

    for name, call in checks.items():
        setattr(loop, name, checked(call))
    try:
        yield handler
    finally:
        for name in checks:
            with contextlib.suppress(AttributeError):
                delattr(loop, name)
        _GUARDED.pop(loop, None)


@pytest.fixture(autouse=True)
async def _loop_must_not_block(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    if request.node.get_closest_marker("allow_blocking"):
        yield
        return
    with guarded(asyncio.get_running_loop()) as handler:
        yield
    if handler.seen:
        pytest.fail("the event loop was blocked:\n" + "\n".join(handler.seen[:5]))
