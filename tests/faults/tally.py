"""Faults under retrying clients, counted: ``python -m tests.faults.tally [--quick]`` (root: the
full-disk case mounts a tmpfs).

Each case runs a real daemon (store-only mode) while clients on 127.0.0.1 post messages with a
``client_message_id`` to a few keys, each retrying its message until it gets a 2xx, and the fault
happens meanwhile: SIGKILLs and restarts, a full disk that is then freed, tasks.db held by another
connection (``BEGIN EXCLUSIVE``) past the ledger's busy timeout. Then every messages.jsonl is read
and the table says, per fault: attempts (HTTP calls), acknowledged (ids that got a 2xx), lost
(acknowledged, not stored), duplicated (stored more than once), and whether every line parsed
with seqs continuous per run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import aiohttp

from tests.faults.conftest import fill
from tests.gateway.daemons import Daemon, start_daemon

KEYS = [f"agent:main:dm:peer{i}" for i in range(4)]
START_TIMEOUT_S = 120.0  # a restart on a loaded 2-core machine shared with other work can take a while


async def start(home: Path) -> Daemon:
    d = await start_daemon(home, wait=False)
    try:
        await d.wait_listening(START_TIMEOUT_S)
    except BaseException:
        d.send(signal.SIGKILL)
        await d.wait()
        raise
    return d


@dataclass
class Tally:
    attempts: int = 0
    acknowledged: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)


@dataclass
class Result:
    fault: str
    attempts: int
    acknowledged: int
    lost: int
    duplicated: int
    clean: bool  # every line parses and seqs are 1..n per run

    def row(self) -> str:
        return (f"| {self.fault} | {self.attempts} | {self.acknowledged} | {self.lost} | {self.duplicated} |"
                f" {'yes' if self.clean else 'NO'} |")  # fmt: skip


async def clients(
    current: dict[str, str], stop: asyncio.Event, tally: Tally, *, workers: int, size: int = 0
) -> None:
    """``workers`` clients, each posting ids ``w<n>-<i>`` in turn and retrying one until a 2xx."""

    async def worker(n: int) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http:
            i = 0
            while not stop.is_set():
                cmid = f"w{n}-{i}"
                key = quote(KEYS[(n + i) % len(KEYS)], safe="")
                i += 1
                body = {"content": cmid + " " + "z" * size, "client_message_id": cmid}
                for _ in range(5000):
                    tally.attempts += 1
                    try:
                        async with http.post(f"{current['url']}/v1/sessions/{key}/messages", json=body) as resp:
                            await resp.read()
                            tally.statuses[resp.status] += 1
                            if 200 <= resp.status < 300:
                                tally.acknowledged.append(cmid)
                                break
                    except (TimeoutError, aiohttp.ClientError):
                        tally.statuses[0] += 1
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError(f"{cmid} was never acknowledged")

    await asyncio.gather(*(worker(n) for n in range(workers)))


def stored(home: Path) -> tuple[Counter[str], bool]:
    """How often each client_message_id is stored, and whether every file is clean."""
    counts: Counter[str] = Counter()
    clean = not list(home.rglob("*.torn"))
    for path in sorted((home / "contexts").glob("*/*/messages.jsonl")):
        seqs = []
        for raw in path.read_bytes().splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                clean = False
                continue
            seqs.append(record.get("seq"))
            if "client_message_id" in record:
                counts[record["client_message_id"]] += 1
        clean = clean and seqs == list(range(1, len(seqs) + 1))
    return counts, clean


async def under_load(
    fault: str, home: Path, disturb: Callable[[dict[str, str], Daemon], Awaitable[Daemon]], *, workers: int,
    size: int = 0,
) -> Result:  # fmt: skip
    """Start a daemon, run the clients, let ``disturb`` do the fault (it returns the daemon that
    runs afterwards), stop the clients once their messages are in, stop the daemon, count."""
    tally = Tally()
    current: dict[str, str] = {}
    stop = asyncio.Event()
    d = await start(home)
    current["url"] = d.url
    load = asyncio.ensure_future(clients(current, stop, tally, workers=workers, size=size))
    try:
        d = await disturb(current, d)
        stop.set()
        await load
        if await d.stop() != 0:
            raise AssertionError(f"the daemon did not stop cleanly:\n{d.stderr()[-2000:]}")
    finally:
        stop.set()
        if not load.done():
            load.cancel()
        with contextlib.suppress(BaseException):
            await load
        if d.proc.returncode is None:
            d.send(signal.SIGKILL)
            await d.wait()
    counts, clean = stored(home)
    acknowledged = set(tally.acknowledged)
    lost = sum(1 for c in acknowledged if counts[c] == 0)
    duplicated = sum(1 for n in counts.values() if n > 1)
    return Result(fault, tally.attempts, len(acknowledged), lost, duplicated, clean)


def kills(cycles: int, load_s: float) -> Callable[[dict[str, str], Daemon], Awaitable[Daemon]]:
    async def disturb(current: dict[str, str], d: Daemon) -> Daemon:
        for _ in range(cycles):
            await asyncio.sleep(load_s)
            d.send(signal.SIGKILL)
            await d.wait()
            d = await start(d.home)
            current["url"] = d.url
        await asyncio.sleep(load_s)
        return d

    return disturb


def full_disk(mount: Path, cycles: int, hold_s: float) -> Callable[[dict[str, str], Daemon], Awaitable[Daemon]]:
    async def disturb(current: dict[str, str], d: Daemon) -> Daemon:
        for _ in range(cycles):
            await asyncio.sleep(hold_s)
            filler = await asyncio.to_thread(fill, mount)
            await asyncio.sleep(hold_s)
            await asyncio.to_thread(filler.unlink, missing_ok=True)
        await asyncio.sleep(hold_s)
        return d

    return disturb


def locked_ledger(cycles: int, hold_s: float) -> Callable[[dict[str, str], Daemon], Awaitable[Daemon]]:
    def hold(db: Path, seconds: float) -> None:
        conn = sqlite3.connect(db, isolation_level=None, timeout=30)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            threading.Event().wait(seconds)
            conn.execute("COMMIT")
        finally:
            conn.close()

    async def disturb(current: dict[str, str], d: Daemon) -> Daemon:
        for _ in range(cycles):
            await asyncio.sleep(1.0)
            await asyncio.to_thread(hold, d.home / "contexts" / "tasks.db", hold_s)
        await asyncio.sleep(1.0)
        return d

    return disturb


async def run_all(quick: bool) -> list[Result]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        home = root / "kill"
        home.mkdir()
        cycles = 3 if quick else 10
        results.append(await under_load(f"kill -9 x{cycles}", home, kills(cycles, 1.0 if quick else 2.0), workers=16))

        home = root / "locked"
        home.mkdir()
        cycles = 1 if quick else 3
        results.append(
            await under_load(f"tasks.db locked 7 s x{cycles}", home, locked_ledger(cycles, 7.0), workers=16)
        )

        mount = root / "tmpfs"
        mount.mkdir()
        # 64 MiB, not the tests' 5: under this load tasks.db's WAL alone grows to about 4 MiB
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], check=False)
        if mounted.returncode == 0:
            try:
                home = mount / "home"
                home.mkdir()
                cycles = 2 if quick else 5
                fault = f"full disk x{cycles} (64 MiB tmpfs)"
                results.append(await under_load(fault, home, full_disk(mount, cycles, 1.5), workers=16, size=2000))
            finally:
                subprocess.run(["umount", "-l", str(mount)], check=False)
        else:
            print("full disk: skipped (mounting a tmpfs needs root)", file=sys.stderr)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    results = asyncio.run(run_all(args.quick))
    print("| fault | attempts | acknowledged | lost | duplicated | every line clean, seqs continuous |")
    print("|---|---|---|---|---|---|")
    for result in results:
        print(result.row())
    return 0 if all(r.lost == 0 and r.duplicated == 0 and r.clean for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
