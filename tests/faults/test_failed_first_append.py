"""Issue 10 item 6: a new key whose first message cannot be stored leaves nothing behind.

Real faults: a full 5 MiB tmpfs home, the same tmpfs remounted read-only, tasks.db locked by
another connection for longer than the ledger's busy timeout. The POST answers 507 or 503 and no
run folder, tasks.db row or sessions.json entry is left; what a crash leaves half created is
removed by start-up recovery; the doctor offers a fix for what it reports.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from gateway import keys as K
from home import layout
from sessions.files.doctor import check_home
from sessions.files.leftovers import OPENING
from sessions.records import NewMessage, RunStart
from tests.conftest import FakeClock
from tests.faults.conftest import fill
from tests.faults.test_idempotency_crash import LedgerLock
from tests.gateway.helpers import make_app
from tests.sessions.helpers import open_store, start

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

BIG = "y" * 40_000


def url(key: str) -> str:
    return f"/v1/sessions/{quote(key, safe='')}/messages"


def run_folders(home: Path) -> list[str]:
    return sorted(p.name for state in ("running", "paused", "completed") for p in (home / "contexts" / state).glob("*"))


def rows_of(home: Path, key: str) -> int:
    conn = sqlite3.connect(home / "contexts" / "tasks.db")
    try:
        return int(conn.execute("SELECT count(*) FROM tasks WHERE session_key = ?", (key,)).fetchone()[0])
    finally:
        conn.close()


async def _nothing_left(client: Any, home: Path, key: str) -> None:
    assert (await client.get(f"/v1/sessions/{quote(key, safe='')}")).status == 404
    assert await asyncio.to_thread(rows_of, home, key) == 0


async def test_a_full_disk_at_a_new_keys_first_message_leaves_nothing(
    tmpfs: Path, aiohttp_client: Any, clock: FakeClock
) -> None:
    home = tmpfs / "home"
    # no disk budget (storage.min_free: 0): the store's own full-disk path is what is tested here
    client = await aiohttp_client(make_app(home, clock, {"storage": {"min_free": 0}}))
    assert (await client.post(url("agent:main:dm:old"), json={"content": "an existing run"})).status == 200
    before = run_folders(home)
    filler = await asyncio.to_thread(fill, tmpfs)
    for key in ("agent:main:dm:new1", "agent:main:dm:new2"):
        resp = await client.post(url(key), json={"content": BIG})
        body = await resp.json()
        assert resp.status == 507 and body["error"]["code"] == "insufficient_storage", body
        await _nothing_left(client, home, key)
    assert run_folders(home) == before
    await asyncio.to_thread(filler.unlink)
    resp = await client.post(url("agent:main:dm:new1"), json={"content": "now it fits"})
    body = await resp.json()
    assert resp.status == 200 and body["message_seq"] == 1, body
    assert await asyncio.to_thread(rows_of, home, "agent:main:dm:new1") == 1
    await client.app[K.STORE].writer.call(lambda: None)  # the marker is removed on the writer thread, in order
    assert not (home / "contexts" / "running" / body["run_id"] / OPENING).exists()
    await client.app[K.STORE].registry.flush()  # sessions.json is coalesced: the doctor reads the file
    assert [(f.check, f.detail) for f in await asyncio.to_thread(check_home, home, fix=False, now="x")] == []


async def test_a_read_only_store_refuses_a_new_key_with_503_and_resumes_when_writable(
    tmpfs: Path, aiohttp_client: Any, clock: FakeClock
) -> None:
    """contexts/ bind-mounted read-only over itself (files already open stay writable, so this is
    about creating a run: EROFS)."""
    home = tmpfs / "home"
    client = await aiohttp_client(make_app(home, clock))
    assert (await client.post(url("agent:main:dm:old"), json={"content": "one"})).status == 200
    before = run_folders(home)
    contexts = str(home / "contexts")
    subprocess.run(["mount", "--bind", contexts, contexts], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", contexts], check=True)
        resp = await client.post(url("agent:main:dm:brand-new"), json={"content": "refused"})
        body = await resp.json()
        assert resp.status == 503 and body["error"]["code"] == "storage_unavailable", body
        ready = await client.get("/readyz")
        assert ready.status == 503 and (await ready.json())["checks"]["store_writable"] is False
    finally:
        subprocess.run(["umount", contexts], check=True)
    await _nothing_left(client, home, "agent:main:dm:brand-new")
    assert run_folders(home) == before
    resp = await client.post(url("agent:main:dm:brand-new"), json={"content": "now writable"})
    assert resp.status == 200 and (await resp.json())["message_seq"] == 1
    assert (await (await client.get("/readyz")).json())["checks"]["store_writable"] is True


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_locked_tasks_db_at_a_new_keys_first_message_leaves_nothing(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    assert (await client.post(url("agent:main:dm:old"), json={"content": "creates tasks.db"})).status == 200
    before = run_folders(tmp_path)
    async with LedgerLock(tmp_path / "contexts" / "tasks.db"):
        resp = await client.post(url("agent:main:dm:new"), json={"content": "while tasks.db is locked"})
        body = await resp.json()
        assert resp.status == 503 and body["error"]["code"] == "storage_unavailable", body
        assert "not stored" in body["error"]["message"]
    await _nothing_left(client, tmp_path, "agent:main:dm:new")
    assert run_folders(tmp_path) == before
    resp = await client.post(url("agent:main:dm:new"), json={"content": "after the lock"})
    assert resp.status == 200 and (await resp.json())["message_seq"] == 1


async def test_start_up_removes_what_an_interrupted_start_left(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    try:
        kept = await start(store, "agent:main:dm:kept")
        await store.append(kept, NewMessage(role="user", content="acknowledged"))
        empty_but_legit = await start(store, "agent:main:dm:engine")  # started without the marker
        interrupted = await store.start_run(
            RunStart("agent:main:dm:crashed", agent_id="main", chat_type="direct", channel=None,
                     task_key=kept.task_key, opening=True),
        )  # fmt: skip
        no_metadata = tmp_path / "contexts" / "running" / "0f0f0f0f-0000-4000-8000-000000000000"
        no_metadata.mkdir()
        (no_metadata / layout.MESSAGES).touch()
    finally:
        await store.close()  # as if the process died before the first append of "crashed"
    assert (interrupted.dir / OPENING).exists()
    reopened = await open_store(tmp_path, clock)
    try:
        assert not interrupted.dir.exists() and not no_metadata.exists()
        active = {run.run_id for run in reopened.active_runs()}
        assert active == {kept.run_id, empty_but_legit.run_id}
        assert await reopened.ledger.get_run(interrupted.run_id) is None
        entry = reopened.entry("agent:main:dm:crashed")
        assert entry is None or entry.run_id is None
    finally:
        await reopened.close()


async def test_the_doctor_offers_and_applies_a_fix_for_every_leftover_it_reports(
    tmp_path: Path, clock: FakeClock
) -> None:
    store = await open_store(tmp_path, clock)
    try:
        runs = []
        for name in ("restored", "set-aside", "duplicated", "gone"):
            run = await start(store, f"agent:main:dm:{name}")
            await store.append(run, NewMessage(role="user", content=f"message of {name}"))
            runs.append(run)
        for key in ("agent:main:dm:duplicated", "agent:main:dm:gone"):
            await store.complete(key)
        restored, set_aside, duplicated, gone = runs
    finally:
        await store.close()
    contexts = tmp_path / "contexts"
    (restored.dir / layout.METADATA).write_text("{not json")
    (set_aside.dir / layout.METADATA).unlink()
    conn = sqlite3.connect(contexts / "tasks.db")
    with conn:
        conn.execute("DELETE FROM tasks WHERE uuid = ?", (set_aside.run_id,))
    conn.close()
    empty = contexts / "running" / "0f0f0f0f-0000-4000-8000-000000000001"
    empty.mkdir()
    done = contexts / "completed" / duplicated.run_id
    subprocess.run(["cp", "-a", str(done), str(contexts / "running" / duplicated.run_id)], check=True)
    subprocess.run(["rm", "-rf", str(contexts / "completed" / gone.run_id)], check=True)

    findings = await asyncio.to_thread(check_home, tmp_path, fix=True, now="2026-11-30T12:00:00+00:00")
    assert {(f.check, f.kind) for f in findings} >= {
        ("duplicate_folder", "set_aside"),
        ("missing_folder", "settle_row"),
        ("unreadable_metadata", "remove_folder"),
        ("unreadable_metadata", "restore_metadata"),
        ("unreadable_metadata", "set_aside"),
    }, [f.as_dict() for f in findings]
    assert all(f.fix is not None and f.fixed for f in findings), [f.as_dict() for f in findings if not f.fixed]
    assert not empty.exists() and (done / layout.MESSAGES).exists()
    assert not (contexts / "running" / duplicated.run_id).exists()
    assert len(list((contexts / "quarantine").iterdir())) == 2
    assert json.loads((restored.dir / layout.METADATA).read_text())["session_key"] == "agent:main:dm:restored"
    # what a set-aside folder leaves (its entry) is found and fixed by the next pass; then nothing
    follow = await asyncio.to_thread(check_home, tmp_path, fix=True, now="2026-11-30T12:00:01+00:00")
    assert all(f.fix is not None and f.fixed for f in follow), [f.as_dict() for f in follow]
    again = await asyncio.to_thread(check_home, tmp_path, fix=False, now="2026-11-30T12:00:02+00:00")
    assert again == [], [f.as_dict() for f in again]
