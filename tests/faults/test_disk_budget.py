"""Issue 29 item 2: a disk budget. A real daemon on a real 5 MiB tmpfs home with
``storage.min_free: 2MiB``; a file takes the free space below the line (the disk is not full):
new messages answer 507 ``insufficient_storage`` naming ``storage.min_free``, nothing is written,
``/readyz`` is unready with the reason, the metric and one log line say so once; the file goes and
messages are accepted again, with one line saying so."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest

from config.settings import StorageSettings
from conversations.metrics import Metrics
from gateway.disk_budget import GIB, DiskBudget, min_free_bytes
from tests.gateway.daemons import child_env, daemon

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

MIN_FREE = 2 << 20


def free_bytes(path: Path) -> int:
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def take_space(where: Path, leave: int) -> Path:
    """A file that leaves ``leave`` bytes free on the file system of ``where`` (blocking)."""
    path = where / "ballast"
    with path.open("wb") as out:
        out.write(b"\0" * max(free_bytes(where) - leave, 0))
        out.flush()
        os.fsync(out.fileno())
    return path


def test_the_default_line_is_the_smaller_of_one_gib_and_five_percent() -> None:
    assert min_free_bytes(None, 100 * GIB) == GIB
    assert min_free_bytes(None, 5 << 20) == (5 << 20) // 20
    assert min_free_bytes("5%", 200 * GIB) == 10 * GIB
    assert min_free_bytes("2MiB", 200 * GIB) == 2 << 20
    assert min_free_bytes(0, 200 * GIB) == 0
    with pytest.raises(ValueError, match="5%"):
        StorageSettings(min_free="lots")


def test_a_check_reads_free_space_at_most_every_free_check_ms(tmp_path: Path) -> None:
    budget = DiskBudget(tmp_path, StorageSettings(min_free="100%", free_check_ms=60_000), Metrics())
    assert budget.check() is not None  # 100 %: always below; below the line every check reads again
    ok = DiskBudget(tmp_path, StorageSettings(min_free=0, free_check_ms=60_000), Metrics())
    assert ok.check() is None
    ok.setting = "100%"
    assert ok.check() is None  # within free_check_ms: the last read stands
    assert ok.check(fresh=True) is not None


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_real_daemon_below_min_free_refuses_messages_then_accepts_them(tmpfs: Path) -> None:
    home = tmpfs / "home"
    home.mkdir()
    key = quote("agent:main:main", safe="")
    env = child_env(NEOTASK_STORAGE__MIN_FREE="2MiB")
    async with daemon(home, env=env) as d, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        url = f"{d.url}/v1/sessions/{key}/messages"
        async with http.post(url, json={"content": "before"}) as resp:
            assert resp.status == 200, await resp.text()
            run_id = (await resp.json())["run_id"]
        messages = home / "contexts" / "running" / run_id / "messages.jsonl"
        before = messages.read_bytes()
        ballast = await asyncio.to_thread(take_space, tmpfs, MIN_FREE // 2)
        assert free_bytes(tmpfs) > 64 << 10  # not full: the budget refuses, not the disk
        await asyncio.sleep(0.3)  # free space is read at most every storage.free_check_ms (250) while above

        for i in range(3):
            async with http.post(url, json={"content": f"refused {i}"}) as resp:
                body = await resp.json()
                assert resp.status == 507, body
                assert body["error"]["code"] == "insufficient_storage" and body["error"]["request_id"]
                assert body["error"]["stored"] is False
                assert "storage.min_free" in body["error"]["message"] and "not stored" in body["error"]["message"]
        assert messages.read_bytes() == before  # nothing written
        async with http.get(f"{d.url}/v1/sessions/{key}") as resp:
            assert (await resp.json())["message_count"] == 1
        async with http.get(f"{d.url}/readyz") as resp:
            body = await resp.json()
            assert resp.status == 503 and body["checks"]["disk_budget"] is False, body
            assert "storage.min_free" in body["problems"]["disk_budget"]
        async with http.get(f"{d.url}/metrics") as resp:
            text = await resp.text()
            assert "neotask_disk_low 1.0" in text and "neotask_disk_low_crossings_total 1.0" in text
        low_lines = [line for line in d.stderr().splitlines() if "disk space low" in line]
        assert len(low_lines) == 1, d.stderr()  # once, not once per request
        for _ in range(100):  # the cleanup job ran early, once
            if "early cleanup for low disk space" in d.stderr():
                break
            await asyncio.sleep(0.05)
        assert d.stderr().count("early cleanup for low disk space") == 1, d.stderr()

        await asyncio.to_thread(ballast.unlink)
        async with http.get(f"{d.url}/readyz") as resp:
            assert resp.status == 200, await resp.text()
        async with http.post(url, json={"content": "after space was freed"}) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["message_seq"] == 2
        async with http.post(url, json={"content": "and another"}) as resp:
            assert resp.status == 200, await resp.text()
        async with http.get(f"{d.url}/metrics") as resp:
            assert "neotask_disk_low 0.0" in await resp.text()
        assert await d.stop() == 0
    stderr = d.stderr()
    assert len([line for line in stderr.splitlines() if "disk space low" in line]) == 1, stderr
    assert len([line for line in stderr.splitlines() if "disk space is back" in line]) == 1, stderr
