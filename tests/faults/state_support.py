"""Shared helpers of the damaged-state, silent-corruption and permission tests: a seeded home
(real files through the real store), real daemons and CLI runs against it, and real tmpfs mounts
(full, read-only) when running as root.

A home that a real process opens is seeded at the real time (a fixed fake date would be past its
daily reset a day later), and the daemons started here say which reset policy the tests mean: none,
so a run seeded at 03:59 is still the same run when the daemon starts at 04:00."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from config.clock import Clock, system_clock
from sessions.records import NewMessage
from tests.gateway.daemons import CliResult, Daemon, child_env, run_cli, start_daemon
from tests.sessions.helpers import open_store, start

MAIN, BOB = "agent:main:main", "agent:main:dm:bob"
COUNTS = {MAIN: 3, BOB: 2}  # messages per key in a seeded home


async def seed_home(home: Path, clock: Clock = system_clock) -> dict[str, str]:
    """A closed home with one running run per key of ``COUNTS``; key -> run id. Seeded at the real
    time unless a test that opens it only in-process, with the same clock, passes its own."""
    store = await open_store(home, clock)
    runs = {}
    try:
        for key, count in COUNTS.items():
            run = await start(store, key)
            for n in range(1, count + 1):
                await store.append(run, NewMessage(role="user", content=f"{key} message {n}"))
            runs[key] = run.run_id
    finally:
        await store.close()
    return runs


def messages_path(home: Path, run_id: str, state: str = "running") -> Path:
    return home / "contexts" / state / run_id / "messages.jsonl"


def rewrite_line(path: Path, index: int, text: str) -> str:
    """Replace line ``index`` (0-based) of a JSONL file; the old line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    old, lines[index] = lines[index], text
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return old


def with_seq(line: str, seq: Any) -> str:
    record = json.loads(line)
    record["seq"] = seq
    return json.dumps(record)


def ledger_rows(home: Path) -> dict[str, dict[str, Any]]:
    conn = sqlite3.connect(home / "contexts" / "tasks.db")
    try:
        conn.row_factory = sqlite3.Row
        return {r["uuid"]: dict(r) for r in conn.execute("SELECT * FROM tasks")}
    finally:
        conn.close()


# -- real processes ---------------------------------------------------------------------------------


def daemon_env() -> dict[str, str]:
    """The daemons of these tests keep the runs they find: no reset policy (they test damage, and
    a seeded run must not be reset because the test crossed the daily boundary)."""
    return child_env(NEOTASK_SESSION__RESET__MODE="none")


async def failed_start(home: Path) -> tuple[int, str]:
    """Start a daemon that is expected to refuse: its exit status and stderr."""
    daemon = await start_daemon(home, env=daemon_env(), wait=False)
    code = await daemon.wait(timeout=60)
    return code, daemon.stderr()


@contextlib.asynccontextmanager
async def running(home: Path) -> AsyncIterator[tuple[Daemon, aiohttp.ClientSession]]:
    """A daemon that must start, and an HTTP session to it; stopped with SIGTERM (exit 0)."""
    daemon = await start_daemon(home, env=daemon_env())
    try:
        async with aiohttp.ClientSession() as http:
            yield daemon, http
        assert await daemon.stop() == 0
    finally:
        if daemon.proc.returncode is None:
            daemon.proc.kill()
            await daemon.wait()


async def get_json(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url) as resp:
        body: dict[str, Any] = await resp.json()
        assert resp.status == 200, body
        return body


async def doctor(home: Path, *args: str) -> CliResult:
    return await run_cli("doctor", "--home", str(home), *args, env=child_env())


def one_clear_line(stderr: str, *names: str) -> str:
    """The stderr has no traceback and exactly one error line, which names every one of ``names``."""
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, stderr
    for name in names:
        assert name in errors[0], errors[0]
    return errors[0]


# -- real file systems (mount and fill run on a thread: the tests' event loop must not block) ----------


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


@contextlib.asynccontextmanager
async def tmpfs(where: Path, size: str = "5m") -> AsyncIterator[Path]:
    """A real tmpfs mounted at ``where`` (root only: the test is skipped otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir(parents=True, exist_ok=True)
    try:
        await asyncio.to_thread(_sh, "mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where))
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        yield where
    finally:
        await asyncio.to_thread(subprocess.run, ["umount", "-l", str(where)], check=False, capture_output=True)


async def remount(where: Path, mode: str) -> None:
    """``mode`` is ``ro`` or ``rw``."""
    await asyncio.to_thread(_sh, "mount", "-o", f"remount,{mode}", str(where))


def _fill(filler: Path) -> None:
    with open(filler, "wb", buffering=0) as out:
        for size in (1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * size)


async def fill(where: Path) -> Path:
    """Fill the file system of ``where`` to the last byte; the filler file (delete it to free)."""
    filler = where / "filler"
    await asyncio.to_thread(_fill, filler)
    return filler
