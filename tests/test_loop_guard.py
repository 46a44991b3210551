"""The suite's guard against a blocked event loop (tests/conftest.py): a slow step fails the test,
unless the time was the test process's own garbage collection or its wait for a CPU."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator

import pytest

from tests.conftest import _COLLECTIONS, _RUNQUEUE, _TOOK, BLOCKING_LIMIT_S, _SlowCallbacks


def _report(handler: _SlowCallbacks, seconds: float) -> None:
    message = f"Executing <Task pending name='t'> took {seconds:.3f} seconds"
    handler.emit(logging.LogRecord("asyncio", logging.WARNING, __file__, 1, message, None, None))


@pytest.fixture
def idle_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """No collection and no wait for a CPU, whatever the process and the machine are doing: the
    arithmetic tests see only their own steps."""
    monkeypatch.setattr(_COLLECTIONS, "spans", [])
    monkeypatch.setattr(_RUNQUEUE, "samples", deque([(time.perf_counter() - 60.0, 5.0)]))
    monkeypatch.setattr(_RUNQUEUE, "read", lambda: 5.0)


@pytest.mark.usefixtures("idle_cpu")
def test_a_slow_step_is_reported() -> None:
    handler = _SlowCallbacks()
    _report(handler, BLOCKING_LIMIT_S + 0.5)
    assert len(handler.seen) == 1
    assert "garbage collection and 0.000 s waiting for a CPU, not counted" in handler.seen[0]


@pytest.mark.usefixtures("idle_cpu")
def test_garbage_collection_inside_the_step_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    handler = _SlowCallbacks()
    now = time.perf_counter()
    monkeypatch.setattr(_COLLECTIONS, "spans", [(now - 0.9, now - 0.1)])  # a 0.8 s collection within the last 1.3 s
    _report(handler, BLOCKING_LIMIT_S + 0.3)
    assert handler.seen == []
    _report(handler, BLOCKING_LIMIT_S + 0.9)  # 1.9 s, of which 0.8 s collecting: 1.1 s blocked
    assert len(handler.seen) == 1


def test_waiting_for_a_cpu_inside_the_step_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.perf_counter()
    monkeypatch.setattr(_COLLECTIONS, "spans", [])
    monkeypatch.setattr(_RUNQUEUE, "samples", deque([(now - 1.2, 10.0)]))
    monkeypatch.setattr(_RUNQUEUE, "read", lambda: 10.8)  # 0.8 s runnable, not running, since then
    handler = _SlowCallbacks()
    _report(handler, BLOCKING_LIMIT_S + 0.5)  # 1.5 s, of which 0.8 s waiting: 0.7 s blocked
    assert handler.seen == []
    _report(handler, BLOCKING_LIMIT_S + 1.0)  # 2.0 s: 1.2 s blocked
    assert len(handler.seen) == 1 and "0.800 s waiting for a CPU" in handler.seen[0]


def test_a_wait_before_the_step_began_is_not_forgiven(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.perf_counter()
    monkeypatch.setattr(_COLLECTIONS, "spans", [])
    monkeypatch.setattr(_RUNQUEUE, "samples", deque([(now - 5.0, 10.0), (now - 1.0, 14.9)]))
    monkeypatch.setattr(_RUNQUEUE, "read", lambda: 15.0)
    handler = _SlowCallbacks()
    _report(handler, BLOCKING_LIMIT_S + 0.5)  # counted from the sample 1.0 s ago: 0.1 s waiting
    assert len(handler.seen) == 1


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
    assert after is not None and after - before > 0.05


def _block_a_debug_loop(handler: logging.Handler, *, limit: float, seconds: float) -> None:
    """One step that sleeps ``seconds`` on a fresh debug loop whose slow-step limit is ``limit``,
    with ``handler`` listening to asyncio's log."""
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = limit
    try:
        loop.call_soon(time.sleep, seconds)
        loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        loop.close()
        logger.removeHandler(handler)


@pytest.mark.allow_blocking
@pytest.mark.usefixtures("busy_cpus")
def test_sleeping_on_the_loop_of_a_busy_machine_is_still_reported() -> None:
    handler = _SlowCallbacks()
    _block_a_debug_loop(handler, limit=BLOCKING_LIMIT_S, seconds=BLOCKING_LIMIT_S + 0.2)
    assert len(handler.seen) == 1, handler.seen


def test_other_asyncio_warnings_are_ignored() -> None:
    handler = _SlowCallbacks()
    handler.emit(logging.LogRecord("asyncio", logging.WARNING, __file__, 1, "Task was destroyed", None, None))
    assert handler.seen == []


class _All(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.allow_blocking
def test_asyncio_reports_a_blocking_step_in_the_form_parsed() -> None:
    handler = _All()
    _block_a_debug_loop(handler, limit=0.05, seconds=0.1)
    took = [m for m in handler.messages if m.startswith("Executing")]
    assert took, handler.messages
    parsed = _TOOK.search(took[0])
    assert parsed is not None and 0.1 <= float(parsed.group(1)) < BLOCKING_LIMIT_S
