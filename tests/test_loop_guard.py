"""The suite's guard against a blocked event loop (tests/conftest.py): a slow step fails the test,
unless the time was the test process's own garbage collection."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from tests.conftest import _COLLECTIONS, _TOOK, BLOCKING_LIMIT_S, _SlowCallbacks


def _report(handler: _SlowCallbacks, seconds: float) -> None:
    message = f"Executing <Task pending name='t'> took {seconds:.3f} seconds"
    handler.emit(logging.LogRecord("asyncio", logging.WARNING, __file__, 1, message, None, None))


def test_a_slow_step_is_reported() -> None:
    handler = _SlowCallbacks()
    _report(handler, BLOCKING_LIMIT_S + 0.5)
    assert len(handler.seen) == 1 and "garbage collection, not counted" in handler.seen[0]


def test_garbage_collection_inside_the_step_is_not_counted() -> None:
    handler = _SlowCallbacks()
    now = time.perf_counter()
    _COLLECTIONS.spans.append((now - 0.9, now - 0.1))  # a 0.8 s collection within the last 1.3 s
    _report(handler, BLOCKING_LIMIT_S + 0.3)
    assert handler.seen == []
    _report(handler, BLOCKING_LIMIT_S + 0.9)  # 1.9 s, of which 0.8 s collecting: 1.1 s blocked
    assert len(handler.seen) == 1


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
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = 0.05
    try:
        loop.call_soon(time.sleep, 0.1)
        loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        loop.close()
        logger.removeHandler(handler)
    took = [m for m in handler.messages if m.startswith("Executing")]
    assert took, handler.messages
    parsed = _TOOK.search(took[0])
    assert parsed is not None and 0.1 <= float(parsed.group(1)) < BLOCKING_LIMIT_S
