"""Issue 24 item 14: a batch the history index fails to write is not lost. Messages stored while
history.db is locked by another connection, or while the disk is full, become searchable once it
takes writes again, without a restart; after kill -9 under load a restart indexes every
acknowledged message."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from sessions.files.history import history_path
from tests.conftest import FakeClock
from tests.faults.conftest import fill
from tests.gateway.daemons import child_env, daemon
from tests.gateway.helpers import make_app

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

KEY = quote("agent:main:main", safe="")
LOCK_S = 7.0  # past the index's busy timeout (5 s)
ROOM = 24 * 1024  # left free on the full disk: room for small appends, not for history.db's pages


async def _post(http: Any, base: str, text: str) -> dict[str, Any]:
    async with http.post(f"{base}/v1/sessions/{KEY}/messages", json={"content": text}) as resp:
        body: dict[str, Any] = await resp.json()
        body["status"] = resp.status
        return body


async def _found(http: Any, base: str, word: str) -> bool:
    async with http.get(f"{base}/v1/history/search", params={"q": word}) as resp:
        if resp.status != 200:
            return False
        return bool((await resp.json())["results"])


async def _all_found(http: Any, base: str, words: list[str], within_s: float) -> list[str]:
    """The words still not searchable after ``within_s`` seconds of polling."""
    deadline = time.monotonic() + within_s
    missing = list(words)
    while missing and time.monotonic() < deadline:
        missing = [w for w in missing if not await _found(http, base, w)]
        if missing:
            await asyncio.sleep(0.5)
    return missing


def _lock(path: Path) -> sqlite3.Connection:
    """A second connection holding history.db's write lock (``BEGIN EXCLUSIVE``; in WAL mode
    readers go on, every other writer waits for its busy timeout and fails)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN EXCLUSIVE")
    return conn


def _unlock(conn: sqlite3.Connection) -> None:
    conn.execute("ROLLBACK")
    conn.close()


@pytest.mark.timeout(120)
async def test_messages_stored_while_history_db_is_locked_become_searchable(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    first = await client.post(f"/v1/sessions/{KEY}/messages", json={"content": "before the lock"})
    assert first.status == 200
    assert await _all_found(client, "", ["before"], 10) == []
    holder = await asyncio.to_thread(_lock, history_path(tmp_path / "contexts"))
    words = [f"lockedword{n}" for n in range(5)]
    try:
        started = time.monotonic()
        for word in words:
            resp = await client.post(f"/v1/sessions/{KEY}/messages", json={"content": f"note {word}"})
            assert resp.status == 200, await resp.text()
            await asyncio.sleep(0.3)
        await asyncio.sleep(max(0.0, LOCK_S - (time.monotonic() - started)))  # the batch has failed by now
    finally:
        await asyncio.to_thread(_unlock, holder)
    assert await _all_found(client, "", words, 30) == []
    after = await client.post(f"/v1/sessions/{KEY}/messages", json={"content": "after unlockedword"})
    assert after.status == 200
    assert await _all_found(client, "", ["unlockedword"], 10) == []


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_messages_stored_while_the_disk_is_full_become_searchable(tmpfs: Path) -> None:
    home = tmpfs / "home"
    home.mkdir()
    env = child_env(NEOTASK_STORAGE__MIN_FREE="0")  # no disk budget: messages stored while the disk fills
    async with daemon(home, env=env) as gw, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        for n in range(3):
            assert (await _post(http, gw.url, f"before the disk filled {n}"))["status"] == 200
        assert await _all_found(http, gw.url, ["filled"], 10) == []
        filler = await asyncio.to_thread(fill, tmpfs)
        await asyncio.to_thread(os.truncate, filler, filler.stat().st_size - ROOM)
        stored = []
        # a few: each batch that fails doubles the index's wait before its next try (up to 30 s), and
        # a dozen made it wait the whole 30 s after the disk was freed
        for n in range(3):
            answer = await _post(http, gw.url, f"fullword{n}")
            if answer["status"] == 200:
                stored.append(f"fullword{n}")
            else:
                assert answer["status"] == 507, answer
            await asyncio.sleep(0.2)
        assert stored, "no message was stored while the disk was full: nothing to check"
        await asyncio.sleep(1.5)  # the index has tried (and failed) to write them
        await asyncio.to_thread(filler.unlink)
        log = "".join(p.read_text(errors="replace") for p in (home / "logs").iterdir())
        assert "history index: a batch of" in log  # the index did fail to write them
        assert await _all_found(http, gw.url, stored, 45) == []
        print(f"\n{len(stored)} message(s) stored while the disk was full, all searchable once it freed")
        assert await gw.stop() == 0


POSTERS = 8
LOAD_S = 4.0


async def _poster(http: Any, base: str, i: int, acked: dict[tuple[str, int], str]) -> None:
    """Posts to its own key until the daemon dies; every 200 is an acknowledged (key, seq)."""
    key = f"agent:main:dm:loader{i}"
    for n in range(100_000):
        try:
            async with http.post(f"{base}/v1/sessions/{quote(key, safe='')}/messages",
                                 json={"content": f"load b{i}g{n // 100} kw{i}x{n}"}) as resp:  # fmt: skip
                if resp.status != 200:
                    return
                body = await resp.json()
        except (aiohttp.ClientError, TimeoutError):
            return
        acked[(key, body["message_seq"])] = f"b{i}g{n // 100}"


async def _indexed(http: Any, base: str, buckets: set[str]) -> set[tuple[str, int]]:
    """(key, seq) of every indexed message of the buckets (each word matches at most 100)."""
    found = set()
    for word in sorted(buckets):
        async with http.get(f"{base}/v1/history/search", params={"q": word, "limit": "100"}) as resp:
            assert resp.status == 200, await resp.text()
            found |= {(hit["session_key"], hit["seq"]) for hit in (await resp.json())["results"]}
    return found


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_every_acknowledged_message_is_searchable_after_kill_9_under_load(tmp_path: Path) -> None:
    home = tmp_path / "home"
    acked: dict[tuple[str, int], str] = {}
    async with daemon(home) as gw, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        posters = [asyncio.create_task(_poster(http, gw.url, i, acked)) for i in range(POSTERS)]
        await asyncio.sleep(LOAD_S)
        gw.send(signal.SIGKILL)  # with posts and index batches in flight
        await asyncio.gather(*posters)
        await gw.wait()
    assert len(acked) > 100, len(acked)
    async with daemon(home) as gw, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        deadline = time.monotonic() + 60
        missing = set(acked)
        while missing and time.monotonic() < deadline:
            missing -= await _indexed(http, gw.url, {acked[m] for m in missing})  # found once stays found
            if missing:
                await asyncio.sleep(1.0)
        print(f"\n{len(acked)} acknowledged before kill -9; {len(missing)} not searchable after the restart")
        assert missing == set()
        assert await gw.stop() == 0


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_run_that_ended_while_its_batch_was_unwritten_is_indexed_after_kill_9(tmp_path: Path) -> None:
    """The start-up catch-up covers ended runs too: messages acknowledged while history.db was
    locked, the run completed, then kill -9 before the index could retry."""
    home = tmp_path / "home"
    words = [f"endedword{n}" for n in range(5)]
    async with daemon(home) as gw, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        assert (await _post(http, gw.url, "opening line"))["status"] == 200
        holder = await asyncio.to_thread(_lock, history_path(home / "contexts"))
        try:
            for word in words:
                assert (await _post(http, gw.url, f"note {word}"))["status"] == 200
            async with http.post(f"{gw.url}/v1/sessions/{KEY}/complete", json={}) as resp:
                assert resp.status == 200, await resp.text()
            gw.send(signal.SIGKILL)
            await gw.wait()
        finally:
            await asyncio.to_thread(_unlock, holder)
    async with daemon(home) as gw, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        assert await _all_found(http, gw.url, words, 30) == []
        assert await gw.stop() == 0


def _punch(path: Path, word: str) -> int:
    """Delete the index rows of messages containing ``word`` from another connection (a hole)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout=5000")
    rows = conn.execute("SELECT id, content FROM messages WHERE content LIKE ?", (f"%{word}%",)).fetchall()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany("INSERT INTO fts (fts, rowid, body) VALUES ('delete', ?, ?)", rows)
    conn.execute("DELETE FROM messages WHERE content LIKE ?", (f"%{word}%",))
    conn.execute("COMMIT")
    conn.close()
    return len(rows)


async def test_the_doctor_api_reports_a_hole_and_fixes_it(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    for word in ("alpha", "holeword", "gamma"):
        resp = await client.post(f"/v1/sessions/{KEY}/messages", json={"content": f"the {word} note"})
        assert resp.status == 200
    assert await _all_found(client, "", ["alpha", "holeword", "gamma"], 10) == []
    assert await asyncio.to_thread(_punch, history_path(tmp_path / "contexts"), "holeword") == 1
    assert not await _found(client, "", "holeword")
    resp = await client.post("/v1/admin/doctor", json={"fix": False})
    holes = [a for a in (await resp.json())["actions"] if a["check"] == "history_index_holes"]
    assert len(holes) == 1 and "1 message(s) of 1 run(s)" in holes[0]["detail"] and not holes[0]["fixed"]
    assert not await _found(client, "", "holeword")  # no fix, no change
    resp = await client.post("/v1/admin/doctor", json={"fix": True})
    assert [a["fixed"] for a in (await resp.json())["actions"] if a["check"] == "history_index_holes"] == [True]
    assert await _found(client, "", "holeword")
    resp = await client.post("/v1/admin/doctor", json={"fix": False})
    assert not [a for a in (await resp.json())["actions"] if a["check"].startswith("history")]
