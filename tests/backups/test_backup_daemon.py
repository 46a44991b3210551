"""Backups of a live home (issue 29 item 1) with real daemon processes: a backup taken through the
running daemon while 64 writers post holds every message acknowledged before it began, each once;
its archive verifies, restores into an empty home that the doctor finds clean, and a daemon starts
on the restored home. Scheduled backups keep ``backup.keep`` archives."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest

from tests.gateway.daemons import Daemon, _reap, child_env, run_cli, start_daemon

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), pytest.mark.realtime]

WRITERS = 64
KEYS = [f"agent:main:dm:peer{i}" for i in range(8)] + ["cron:nightly", "hook:github:owner/repo:issue:7"]
START_S = 120.0
ENV = child_env(NEOTASK_SESSION__DM_SCOPE="per-peer")


@contextlib.asynccontextmanager
async def daemon(home: Path) -> AsyncIterator[Daemon]:
    """A daemon given time to start on a loaded machine (the import of the model stack alone)."""
    started = await start_daemon(home, env=ENV, wait=False)
    try:
        await started.wait_listening(timeout=START_S)
        yield started
    finally:
        await _reap(started.proc)


def messages_url(base: str, key: str) -> str:
    return f"{base}/v1/sessions/{quote(key, safe='')}/messages"


async def _writers(base: str, stop: asyncio.Event, acked: list[tuple[float, str]]) -> None:
    """``WRITERS`` clients posting round the keys until ``stop``; every 2xx is recorded with the
    monotonic time its answer arrived. Writer 0 also starts new runs (``/new``) as it goes."""

    async def writer(n: int) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            i = 0
            while not stop.is_set():
                key = KEYS[(n + i) % len(KEYS)]
                content = "/new" if n == 0 and i % 7 == 6 else f"w{n}-{i}"
                i += 1
                async with session.post(messages_url(base, key), json={"content": content}) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()
                    if not content.startswith("/"):
                        acked.append((time.monotonic(), content))

    await asyncio.gather(*(writer(n) for n in range(WRITERS)))


def stored_contents(home: Path) -> Counter[str]:
    """Every user message in every run folder of a home (running, paused, completed)."""
    seen: Counter[str] = Counter()
    for path in (home / "contexts").glob("*/*/messages.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if record.get("role") == "user" and not record.get("command"):
                seen[record["content"]] += 1
    return seen


async def test_a_backup_under_64_writers_restores_every_acknowledged_message_once(tmp_path: Path) -> None:
    home, out, restored = tmp_path / "home", tmp_path / "out" / "live.tar.gz", tmp_path / "restored"
    out.parent.mkdir()
    acked: list[tuple[float, str]] = []
    stop = asyncio.Event()
    async with daemon(home) as live:
        load = asyncio.create_task(_writers(live.url, stop, acked))
        while len(acked) < 300 and not load.done():
            await asyncio.sleep(0.05)
        began = time.monotonic()
        result = await run_cli("backup", "--home", str(home), "-o", str(out), "--json", env=ENV, timeout=120)
        took = time.monotonic() - began
        during = sum(1 for at, _ in acked if at > began)
        stop.set()
        await load
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        assert summary["mode"] == "online" and summary["path"] == str(out)
        assert await live.stop() == 0
    before = {content for at, content in acked if at <= began}
    assert len(before) >= 300 and during > 0  # the writers went on while the backup was taken
    print(f"backup under load: {took:.2f} s, {len(before)} acknowledged before, {during} during")

    verified = await run_cli("backup", "verify", str(out), env=ENV)
    assert verified.returncode == 0, verified.stderr
    done = await run_cli("restore", str(out), "--home", str(restored), env=ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    doctor = await run_cli("doctor", "--home", str(restored), "--json", env=ENV, timeout=60)
    assert doctor.returncode == 0, doctor.stderr
    assert json.loads(doctor.stdout)["actions"] == []

    stored = stored_contents(restored)
    assert before <= set(stored), f"{len(before - set(stored))} acknowledged message(s) missing"
    assert [c for c, n in stored.items() if n > 1] == []  # each once
    point = summary["point"]["runs"]
    for run_id, at_point in point.items():  # every run cut at the seq recorded for it, nothing torn
        folder = next((restored / "contexts").glob(f"*/{run_id}"))
        seqs = [json.loads(line)["seq"] for line in (folder / "messages.jsonl").read_text().splitlines()]
        assert seqs == list(range(1, at_point["seq"] + 1))

    offline = await run_cli("backup", "--home", str(home), "--json", env=ENV, timeout=120)  # no daemon now
    assert offline.returncode == 0, offline.stderr
    taken = json.loads(offline.stdout)
    assert taken["mode"] == "offline" and Path(taken["path"]).parent == home / "backups"
    assert taken["counts"]["runs"] >= summary["counts"]["runs"]
    again_restored = tmp_path / "restored-offline"
    done = await run_cli("restore", taken["path"], "--home", str(again_restored), env=ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    assert set(stored_contents(again_restored)) == {content for _, content in acked}  # everything, stopped daemon
    print(f"archive {summary['size']} bytes, {summary['counts']['runs']} runs, {summary['counts']['files']} files")

    async with daemon(restored) as again:  # the restored home opens
        async with aiohttp.ClientSession() as session:
            async with session.post(messages_url(again.url, KEYS[0]), json={"content": "after restore"}) as resp:
                assert resp.status == 200, await resp.text()
            async with session.get(f"{again.url}/v1/admin/backups") as resp:
                assert resp.status == 200
        assert await again.stop() == 0


async def test_scheduled_backups_keep_the_newest(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.yaml").write_text("backup: {schedule: '0 3 * * *', keep: 2}\n")
    async with daemon(home) as live, aiohttp.ClientSession() as session:
        async with session.get(f"{live.url}/v1/scheduler/jobs") as resp:
            jobs = {job["id"]: job for job in (await resp.json())["jobs"]}
        assert jobs["backup"]["trigger"].startswith("cron 0 3 * * *")
        for n in range(3):
            async with session.post(messages_url(live.url, KEYS[0]), json={"content": f"m{n}"}) as resp:
                assert resp.status == 200
            async with session.post(f"{live.url}/v1/scheduler/jobs/backup/run") as resp:
                assert resp.status == 200, await resp.text()
            await asyncio.sleep(1.05)  # backups are named by the second
        async with session.get(f"{live.url}/v1/admin/backups") as resp:
            listed = await resp.json()
        assert await live.stop() == 0
    names = sorted(p.name for p in (home / "backups").glob("neotask-*.tar.gz"))
    assert len(names) == 2 and [b["name"] for b in listed["backups"]] == sorted(names, reverse=True)
    assert not list((home / "backups").glob(".staging-*"))
