"""Run pytest with the system clock shifted to another date (libfaketime), in a given time zone.

    python -m tests.clock_shift --at "2028-02-29 23:57" --zone Europe/Berlin -- -m realtime
    python -m tests.clock_shift --calendar -- -m "realtime and not browser"
    python -m tests.clock_shift --ci -- -m "realtime and not browser" tests/...   (CI_MOMENTS, at once)

Every process of the run (pytest, its xdist workers, the daemons and CLI processes the tests start)
reads one shifted wall clock: ``faketime -f +Ns`` moves it by the same offset in all of them, and it
keeps running (``--at`` is where it starts). ``TZ`` is set to ``--zone``, so "local time" (the
default reset hour, cron) is that zone's. The absolute start format (``@date``) is not used: each new
process would start again at that instant, so a daemon started a minute into the test would see an
earlier time than the test that seeded its home.

What stays real, as on a machine whose calendar says that date: the monotonic clock
(``FAKETIME_DONT_FAKE_MONOTONIC=1``; faked, it makes every timed wait on a lock wait until notified)
and the kernel's file timestamps. With libfaketime 0.9.10 that setting makes ``time.sleep`` fail
with EINVAL, so ``clock_shift_site/sitecustomize.py`` (first on ``PYTHONPATH``) gives every Python
process of the run a ``time.sleep`` that sleeps on ``select`` when that happens.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

SITE = Path(__file__).resolve().parent / "clock_shift_site"


@dataclass(frozen=True)
class Moment:
    """A local time in a zone at which the suite is run, and why that one."""

    at: str  # "YYYY-MM-DD HH:MM", local time in ``zone``
    zone: str
    why: str

    def epoch(self) -> float:
        local = datetime.strptime(self.at, "%Y-%m-%d %H:%M").replace(tzinfo=ZoneInfo(self.zone))
        return local.timestamp()


# The dates CI runs the date-sensitive tests at (.ci/run). Each starts a few minutes before the
# instant it is about, so the run crosses it; the zones have DST where it matters and are not UTC,
# so "local" differs from UTC.
CALENDAR = (
    Moment("2027-01-14 03:56", "Asia/Tokyo", "minutes before the 04:00 daily reset (UTC+9)"),
    Moment("2027-06-09 04:01", "America/Los_Angeles", "just after the 04:00 daily reset (UTC-7)"),
    Moment("2027-03-28 01:56", "Europe/Berlin", "the night DST starts: 02:00 becomes 03:00"),
    Moment("2027-11-07 01:56", "America/New_York", "the night DST ends: 01:00-02:00 EDT, then again EST"),
    Moment("2028-02-29 23:56", "Australia/Sydney", "29 February, into 1 March"),
    Moment("2027-12-31 23:59", "Europe/London", "31 December 23:59, into a new year"),
    Moment("2041-07-15 03:58", "America/Sao_Paulo", "years ahead (past 2038), before 04:00"),
)


# The moments CI runs the real processes at (``--ci``, at once): the nights DST starts and ends and a
# year past 2038, what only a real process at that date can show (APScheduler's own timers, file
# times, SQLite and tar timestamps). tests/dates/ runs the date rules at every moment of CALENDAR
# in-process on every ``make test``.
CI_MOMENTS = (CALENDAR[2], CALENDAR[3], CALENDAR[6])


def faketime() -> str:
    path = shutil.which("faketime")
    if path is None:
        sys.exit("faketime is not installed: `make faketime` (Debian's faketime package) installs it")
    return path


def real_time() -> float:
    """The real clock's time, also inside a shifted run: a shift started there replaces the run's own
    (libfaketime reads one ``FAKETIME``), so it is counted from the real time, not the shifted one."""
    outer = re.fullmatch(r"([+-]\d+)s", os.environ.get("FAKETIME", ""))
    return time.time() - (int(outer.group(1)) if outer else 0)


def shifted(command: list[str], moment: Moment) -> tuple[list[str], dict[str, str]]:
    """``command`` under a clock shifted so that it starts at ``moment``."""
    offset = round(moment.epoch() - real_time())
    path = os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TZ": moment.zone, "FAKETIME_DONT_FAKE_MONOTONIC": "1", "PYTHONPATH": path}
    return [faketime(), "-f", f"{offset:+d}s", *command], env


def check_shift(moment: Moment) -> None:
    """The shift reaches a Python child and its zone is the one asked for (fails loudly, not silently
    running the suite at today's date)."""
    probe = "import time, datetime; print(time.time()); print(datetime.datetime.now().astimezone().tzname())"
    command, env = shifted([sys.executable, "-c", probe], moment)
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout.split()
    seen = float(out[0])
    if abs(seen - moment.epoch()) > 120:
        sys.exit(f"the clock shift did not take: a child saw {seen}, wanted about {moment.epoch()}")


def run(moment: Moment, pytest_args: list[str]) -> int:
    check_shift(moment)
    print(f"== pytest at {moment.at} {moment.zone} ({moment.why})", flush=True)
    command, env = shifted([sys.executable, "-m", "pytest", *pytest_args], moment)
    return subprocess.run(command, env=env, check=False).returncode


def run_at_once(moments: Sequence[Moment], pytest_args: list[str], logs: Path) -> list[Moment]:
    """One pytest per moment, all at once, each writing to its own log under ``logs`` (printed
    whole when it ends); the moments whose run failed."""
    logs.mkdir(parents=True, exist_ok=True)
    running = []
    for n, moment in enumerate(moments):
        check_shift(moment)
        own_tmp = f"--basetemp={(logs / f'calendar-{n}-tmp').resolve()}"  # runs at once share no tmp folder
        command, env = shifted([sys.executable, "-m", "pytest", *pytest_args, own_tmp], moment)
        log = logs / f"calendar-{n}.log"
        handle = log.open("wb")
        running.append(
            (moment, log, handle, subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT))
        )
    failed = []
    for moment, log, handle, proc in running:
        status = proc.wait()
        handle.close()
        print(f"== pytest at {moment.at} {moment.zone} ({moment.why}): exit {status}", flush=True)
        print(log.read_text(errors="replace"), flush=True)
        if status != 0:
            failed.append(moment)
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--at", help='local start time, "YYYY-MM-DD HH:MM"')
    which.add_argument("--calendar", action="store_true", help="every moment of CALENDAR, one run each")
    which.add_argument("--ci", action="store_true", help="the moments of CI_MOMENTS, their runs at once")
    parser.add_argument("--zone", default="UTC", help="IANA time zone of --at (and TZ of the run)")
    parser.add_argument("--logs", type=Path, default=Path("test-artifacts"), help="--ci: where each run's log goes")
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --)")
    args = parser.parse_args(argv)
    if args.ci:
        failed = run_at_once(CI_MOMENTS, args.pytest_args, args.logs)
    else:
        moments = CALENDAR if args.calendar else (Moment(args.at, args.zone, "asked for"),)
        failed = [m for m in moments if run(m, args.pytest_args) != 0]
    for m in failed:
        print(f"FAILED at {m.at} {m.zone} ({m.why})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
