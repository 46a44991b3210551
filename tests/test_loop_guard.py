"""The suite's guard against a blocked event loop (tests/conftest.py): a slow step fails the test,
unless the time was the test process's own garbage collection, its wait for a CPU or its wait for
the interpreter lock another thread held."""

from __future__ import annotations

import asyncio
import ctypes
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import _COLLECTIONS, _RUNQUEUE, _TOOK, BLOCKING_LIMIT_S, _SlowCallbacks, guarded


def _report(handler: _SlowCallbacks, seconds: float) -> None:
    handler.report("<Task pending name='t'>", seconds)


@pytest.fixture
def idle_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """No collection and no wait for a CPU, whatever the process and the machine are doing: the
    arithmetic tests see only their own steps."""
    monkeypatch.setattr(_COLLECTIONS, "spans", [])
    monkeypatch.setattr(_RUNQUEUE, "samples", deque([(time.perf_counter(), 1.0, 5.0, 0.0)]))
    monkeypatch.setattr(_RUNQUEUE, "read", lambda: (1.0, 5.0))
    monkeypatch.setattr(_RUNQUEUE, "sampler_waited", lambda: 0.0)


@pytest.mark.usefixtures("idle_cpu")
def test_a_slow_step_is_reported() -> None:
    handler = _SlowCallbacks()
    _report(handler, BLOCKING_LIMIT_S + 0.5)
    assert len(handler.seen) == 1
    expected = "garbage collection, 0.000 s waiting for a CPU and 0.000 s waiting for the interpreter lock"
    assert expected in handler.seen[0]


@pytest.mark.usefixtures("idle_cpu")
def test_garbage_collection_inside_the_step_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    handler = _SlowCallbacks()
    now = time.perf_counter()
    # a 0.8 s collection by this thread within the last 1.3 s
    monkeypatch.setattr(_COLLECTIONS, "spans", [(now - 0.9, now - 0.1, threading.get_ident())])
    _report(handler, BLOCKING_LIMIT_S + 0.3)
    assert handler.seen == []
    _report(handler, BLOCKING_LIMIT_S + 0.9)  # 1.9 s, of which 0.8 s collecting: 1.1 s blocked
    assert len(handler.seen) == 1


@pytest.mark.usefixtures("idle_cpu")
def test_a_collection_in_another_thread_is_not_the_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.perf_counter()
    monkeypatch.setattr(_COLLECTIONS, "spans", [(now - 0.9, now - 0.1, threading.get_ident() + 1)])
    handler = _SlowCallbacks()
    _report(handler, BLOCKING_LIMIT_S + 0.3)
    assert len(handler.seen) == 1 and "0.000 s of it garbage collection" in handler.seen[0]


def test_waiting_for_a_cpu_inside_the_step_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.perf_counter()
    monkeypatch.setattr(_COLLECTIONS, "spans", [])
    monkeypatch.setattr(_RUNQUEUE, "samples", deque([(now - 1.2, 0.0, 10.0, 0.0)]))
    monkeypatch.setattr(_RUNQUEUE, "read", lambda: (0.4, 10.8))  # since then 0.4 s running, 0.8 s runnable
    monkeypatch.setattr(_RUNQUEUE, "sampler_waited", lambda: 0.0)
    handler = _SlowCallbacks()
    _report(handler, BLOCKING_LIMIT_S + 0.5)  # 1.5 s, of which 0.8 s waiting: 0.7 s blocked
    assert handler.seen == []
    _report(handler, BLOCKING_LIMIT_S + 1.0)  # 2.0 s: 1.2 s blocked
    assert len(handler.seen) == 1 and "0.800 s waiting for a CPU" in handler.seen[0]


def test_a_wait_before_the_step_began_is_not_forgiven(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.perf_counter()
    monkeypatch.setattr(_COLLECTIONS, "spans", [])
    monkeypatch.setattr(_RUNQUEUE, "samples", deque([(now - 5.0, 0.0, 10.0, 0.0), (now - 1.0, 0.0, 14.9, 0.0)]))
    monkeypatch.setattr(_RUNQUEUE, "read", lambda: (0.0, 15.0))
    monkeypatch.setattr(_RUNQUEUE, "sampler_waited", lambda: 0.0)
    handler = _SlowCallbacks()
    _report(handler, BLOCKING_LIMIT_S + 0.5)  # counted from the sample 1.0 s ago: 0.1 s waiting
    assert len(handler.seen) == 1


def test_waiting_for_the_lock_another_thread_held_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.perf_counter()
    monkeypatch.setattr(_COLLECTIONS, "spans", [])
    # the sampler last woke 1.6 s ago; since then the loop's thread ran 0.05 s and never waited for a CPU
    monkeypatch.setattr(_RUNQUEUE, "samples", deque([(now - 1.6, 1.0, 2.0, 0.0)]))
    monkeypatch.setattr(_RUNQUEUE, "read", lambda: (1.05, 2.0))
    monkeypatch.setattr(_RUNQUEUE, "sampler_waited", lambda: 0.0)
    handler = _SlowCallbacks()
    _report(handler, BLOCKING_LIMIT_S + 0.5)
    assert handler.seen == []


def test_a_sampler_late_for_want_of_a_cpu_forgives_no_lock_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler woke 1.6 s late, but it spent that time waiting for a CPU (a busy machine),
    not for the interpreter lock: the loop's thread asleep off a CPU is counted in full."""
    now = time.perf_counter()
    monkeypatch.setattr(_COLLECTIONS, "spans", [])
    monkeypatch.setattr(_RUNQUEUE, "samples", deque([(now - 1.6, 1.0, 2.0, 3.0)]))
    monkeypatch.setattr(_RUNQUEUE, "read", lambda: (1.05, 2.0))
    monkeypatch.setattr(_RUNQUEUE, "sampler_waited", lambda: 4.55)  # 1.55 s of it in the run queue
    handler = _SlowCallbacks()
    _report(handler, BLOCKING_LIMIT_S + 0.5)
    assert len(handler.seen) == 1 and "0.000 s waiting for the interpreter lock" in handler.seen[0]


def test_a_sampler_on_time_forgives_no_lock_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's thread asleep off a CPU while the sampler wakes every 20 ms: the thread released
    the lock and blocked on its own (a ``time.sleep``, a disk): counted in full."""
    now = time.perf_counter()
    monkeypatch.setattr(_COLLECTIONS, "spans", [])
    steps = deque((now - 1.6 + i * _RUNQUEUE.INTERVAL_S, 1.0, 2.0, 0.0) for i in range(80))
    monkeypatch.setattr(_RUNQUEUE, "samples", steps)
    monkeypatch.setattr(_RUNQUEUE, "read", lambda: (1.0, 2.0))
    monkeypatch.setattr(_RUNQUEUE, "sampler_waited", lambda: 0.0)
    handler = _SlowCallbacks()
    _report(handler, BLOCKING_LIMIT_S + 0.5)
    assert len(handler.seen) == 1 and "0.000 s waiting for the interpreter lock" in handler.seen[0]


@pytest.mark.allow_blocking
def test_a_step_stopped_by_a_thread_holding_the_lock_is_not_reported() -> None:
    """A real thread holds the interpreter lock for 1.5 s in C code (a foreign call through
    ``PyDLL`` keeps it, as CPython's ``dlopen`` of a large library does) while the loop's step
    wants it back: the step takes that long, and none of it is the loop's."""
    if _RUNQUEUE.read() is None:
        pytest.skip("no /proc/<pid>/task/<tid>/schedstat on this kernel")
    libc = ctypes.PyDLL(None)
    holder = threading.Thread(target=libc.usleep, args=(1_500_000,), daemon=True)
    took: list[float] = []

    def step() -> None:
        began = time.perf_counter()
        holder.start()
        time.sleep(0.05)  # the holder takes the lock and keeps it; this thread waits to get it back
        took.append(time.perf_counter() - began)

    try:
        handler = _step_on_a_guarded_loop(step, limit=BLOCKING_LIMIT_S)
    finally:
        holder.join()
    assert took and took[0] >= BLOCKING_LIMIT_S + 0.3, took  # the step did wait
    assert handler.seen == []


@pytest.fixture
def busy_cpus() -> Iterator[None]:
    """Twice as many spinning processes as there are CPUs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        time.sleep(0.2)
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.mark.usefixtures("busy_cpus")
def test_the_wait_for_a_cpu_is_the_kernels() -> None:
    before = _RUNQUEUE.read()
    if before is None:
        pytest.skip("no /proc/<pid>/task/<tid>/schedstat on this kernel")
    deadline = time.perf_counter() + 0.5
    while time.perf_counter() < deadline:
        pass
    after = _RUNQUEUE.read()
    assert after is not None and after[1] - before[1] > 0.05


def _step_on_a_guarded_loop(step: Callable[[], None], *, limit: float) -> _SlowCallbacks:
    """One ``step`` on a fresh loop timed by the suite's guard (steps of ``limit`` seconds or
    more are judged); the guard's handler."""
    loop = asyncio.new_event_loop()
    try:
        with guarded(loop, limit) as handler:
            loop.call_soon(step)
            loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        loop.close()
    return handler


def _quiet_interpreter(*, span: float = 0.5, timeout: float = 60.0) -> None:
    """Wait (at most ``timeout``) for a ``span`` in which no other thread of this process held the
    interpreter lock. The guard forgives such time, and it cannot tell a sleep from a wait for the
    lock: a model load an earlier test left running in this worker once brought a 1.2 s sleep under
    the limit. Past the timeout the step runs anyway (and its test may say so)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        time.sleep(span)
        if _RUNQUEUE.within(start, time.perf_counter())[1] < 0.05:
            return


def _block_a_guarded_loop(*, limit: float, seconds: float) -> _SlowCallbacks:
    """One step that sleeps ``seconds`` (see :func:`_step_on_a_guarded_loop`), once the process's
    other threads leave the interpreter lock alone."""
    _quiet_interpreter()
    return _step_on_a_guarded_loop(lambda: time.sleep(seconds), limit=limit)


@pytest.mark.allow_blocking
@pytest.mark.usefixtures("busy_cpus")
def test_sleeping_on_the_loop_of_a_busy_machine_is_still_reported() -> None:
    handler = _block_a_guarded_loop(limit=BLOCKING_LIMIT_S, seconds=BLOCKING_LIMIT_S + 0.2)
    assert len(handler.seen) == 1, handler.seen


@pytest.mark.allow_blocking
def test_the_guard_times_the_step_that_blocked_and_names_it() -> None:
    handler = _block_a_guarded_loop(limit=BLOCKING_LIMIT_S, seconds=BLOCKING_LIMIT_S + 0.2)
    assert len(handler.seen) == 1, handler.seen
    parsed = _TOOK.search(handler.seen[0])
    assert parsed is not None and float(parsed.group(1)) >= BLOCKING_LIMIT_S + 0.2
    assert "<lambda>" in handler.seen[0]  # the callback, as the Handle describes it


@pytest.mark.allow_blocking
def test_a_short_step_is_not_reported() -> None:
    assert _block_a_guarded_loop(limit=BLOCKING_LIMIT_S, seconds=0.2).seen == []


@pytest.mark.allow_blocking
def test_a_guarded_loop_refuses_a_call_from_another_thread() -> None:
    """What asyncio's debug mode checked besides slow steps, which the guard keeps."""
    loop = asyncio.new_event_loop()
    errors: list[BaseException] = []

    def from_a_thread() -> None:
        try:
            loop.call_soon(lambda: None)
        except RuntimeError as exc:
            errors.append(exc)

    async def main() -> None:
        thread = threading.Thread(target=from_a_thread)
        thread.start()
        await asyncio.to_thread(thread.join)

    try:
        with guarded(loop):
            loop.run_until_complete(main())
    finally:
        loop.close()
    assert errors and "thread" in str(errors[0])
