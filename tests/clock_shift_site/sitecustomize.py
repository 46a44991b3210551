"""Loaded by every Python process of a shifted run (tests/clock_shift.py puts this folder first on
PYTHONPATH): ``time.sleep`` that survives libfaketime 0.9.10 with ``FAKETIME_DONT_FAKE_MONOTONIC=1``.

That setting keeps the monotonic clock real, which the shifted runs need: with a faked monotonic
clock every timed wait on a lock (``Event.wait(t)``, ``Thread.join(t)``, ``Queue.get(timeout=t)``)
waits until it is notified, however long, because glibc's ``sem_clockwait`` is given a deadline
years away. But with it, ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``, which ``time.sleep``
uses, fails with EINVAL; the same sleep is then made with ``select``'s relative timeout."""

from __future__ import annotations

import errno
import select
import time

_sleep = time.sleep


def sleep(secs: float) -> None:
    try:
        _sleep(secs)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        deadline = time.monotonic() + secs
        while (left := deadline - time.monotonic()) > 0:
            select.select([], [], [], left)


time.sleep = sleep
