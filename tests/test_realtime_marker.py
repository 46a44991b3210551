"""Every test module that reads the real clock carries the ``realtime`` marker, so CI runs it again at
the shifted dates of tests/clock_shift.py (make test-calendar); the shift itself reaches child
processes and sets the zone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import clock_shift

TESTS = Path(__file__).resolve().parent

# What makes a test read the real clock: a real daemon or CLI process, a child process, the real
# APScheduler, the system clock, file timestamps.
REAL_CLOCK = re.compile(
    r"start_daemon|run_cli\(|\bdaemon\(|\brunning\(|create_subprocess_exec|subprocess\.(?:run|Popen)"
    r"|SchedulerService\(|system_clock|os\.utime|st_mtime|ops_support|tally\.|Cli\b|seed_home|failed_start"
)
MARKED = re.compile(r"pytestmark\s*=.*\brealtime\b|pytest\.mark\.realtime\b")

# Modules that start processes or read the clock but whose outcome cannot depend on the date, and why.
EXEMPT = {
    "test_loop_guard.py": "measures CPU run-queue time of spinning processes; no dates",
    "test_architecture.py": "reads the package code's imports; its clock rule names system_clock in a sample module",
    "test_openai_server.py": "the model server test double alone; no dates",
    "test_realtime_marker.py": "this file",
    "test_wheel.py": "builds and installs the wheel; the gateway it runs is the code the realtime tests shift",
}


def test_every_module_that_reads_the_real_clock_is_marked() -> None:
    unmarked = [
        str(path.relative_to(TESTS))
        for path in sorted(TESTS.rglob("test_*.py"))
        if path.name not in EXEMPT
        and REAL_CLOCK.search(text := path.read_text(encoding="utf-8"))
        and not MARKED.search(text)
    ]
    assert unmarked == [], "add `pytestmark = pytest.mark.realtime` (or explain an exemption in EXEMPT)"


@pytest.mark.parametrize("moment", clock_shift.CALENDAR, ids=lambda m: f"{m.at} {m.zone}")
def test_calendar_moments_are_real_local_times(moment: clock_shift.Moment) -> None:
    """A moment that does not exist in its zone (the skipped hour of a DST start) would silently move."""
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    epoch = moment.epoch()
    back = datetime.fromtimestamp(epoch, UTC).astimezone(ZoneInfo(moment.zone)).strftime("%Y-%m-%d %H:%M")
    assert back == moment.at


@pytest.mark.skipif(clock_shift.shutil.which("faketime") is None, reason="faketime is not installed (make faketime)")
def test_the_shift_reaches_a_child_process_with_its_zone() -> None:
    moment = clock_shift.Moment("2028-02-29 23:59", "Australia/Sydney", "test")
    probe = (
        "import time, datetime; "
        "print(time.time(), datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z'))"
    )
    command, env = clock_shift.shifted([sys.executable, "-c", probe], moment)
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True, timeout=30).stdout.split()
    assert abs(float(out[0]) - moment.epoch()) < 60
    assert out[1] in {"2028-02-29", "2028-03-01"} and out[-1] == "AEDT"


@pytest.mark.skipif(clock_shift.shutil.which("faketime") is None, reason="faketime is not installed (make faketime)")
def test_under_the_shift_timed_waits_and_sleeps_take_their_time() -> None:
    """A faked monotonic clock makes ``Event.wait(t)`` wait forever; a real one breaks ``time.sleep``
    without the run's sitecustomize."""
    moment = clock_shift.Moment("2041-07-15 03:58", "America/Sao_Paulo", "test")
    probe = (
        "import threading, time\n"
        "t = time.monotonic(); threading.Event().wait(0.2); time.sleep(0.2)\n"
        "print(time.monotonic() - t)\n"
    )
    command, env = clock_shift.shifted([sys.executable, "-c", probe], moment)
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True, timeout=30).stdout
    assert 0.4 <= float(out) < 5
