"""Doctor: the pure checks as a table, then the fixes over real homes (files and an open store)."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sessions.files.doctor import RunFolder, Snapshot, check_home, check_store, diagnose
from sessions.files.store import SessionStore
from sessions.records import NewMessage
from tests.conftest import FakeClock
from tests.gateway.helpers import tree_digest
from tests.sessions.helpers import open_store, start

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

A, B, C = "aaaaaaaa-0000-0000-0000-000000000001", "bbbbbbbb-0000-0000-0000-000000000002", "cccc-3"
META = {"session_key": "agent:main:main", "agent_id": "main", "chat_type": "direct", "created_at": "2026-11-30"}


def folder(run_id: str, state: str, meta: dict[str, Any] | None = META, *, young: bool = False) -> RunFolder:
    return RunFolder(run_id, state, meta, young)


CASES: list[tuple[str, Snapshot, list[tuple[str, str | None]]]] = [
    ("consistent", Snapshot((folder(A, "running"),), {A: {"status": "running"}}, {"agent:main:main": A}), []),
    (
        "orphan folder",
        Snapshot((folder(A, "completed"),), {}, {}),
        [("orphan_folder", "insert_row")],
    ),
    (
        "young orphan folder is left alone",
        Snapshot((folder(A, "completed", young=True),), {}, {}),
        [],
    ),
    (
        "active row without a folder",
        Snapshot((), {A: {"status": "paused"}}, {}),
        [("missing_folder", "settle_row")],
    ),
    (
        "completed row with neither folder nor archive",
        Snapshot((), {A: {"status": "completed"}}, {}),
        [("missing_folder", "settle_row")],
    ),
    ("archived row", Snapshot((), {A: {"status": "completed"}}, {}, archives=frozenset({A})), []),
    (
        "folder in the wrong state folder",
        Snapshot((folder(A, "completed"),), {A: {"status": "running"}}, {}),
        [("wrong_state_folder", "set_row_status")],
    ),
    ("failed lives in completed/", Snapshot((folder(A, "completed"),), {A: {"status": "failed"}}, {}), []),
    (
        "entry points at a completed run",
        Snapshot((folder(A, "completed"),), {A: {"status": "completed"}}, {"agent:main:main": A}),
        [("stale_entry", "idle_entry")],
    ),
    (
        "active run without an entry",
        Snapshot((folder(A, "running"),), {A: {"status": "running"}}, {}),
        [("missing_entry", "point_entry")],
    ),
    (
        "unreadable metadata",
        Snapshot((folder(A, "running", None),), {A: {"status": "running"}}, {}),
        [("unreadable_metadata", "set_aside")],
    ),
    (
        "unreadable metadata, restored from the row",
        Snapshot((folder(A, "running", None),), {A: {"status": "running", "metadata": "{}"}}, {}),
        [("unreadable_metadata", "restore_metadata")],
    ),
    (
        "no metadata and no message: a run whose start was interrupted",
        Snapshot((RunFolder(A, "running", None, empty=True),), {}, {}),
        [("unreadable_metadata", "remove_folder")],
    ),
    (
        "one run in two folders",
        Snapshot((folder(A, "running"), folder(A, "completed")), {A: {"status": "running"}}, {"agent:main:main": A}),
        [("duplicate_folder", "set_aside")],
    ),
    (
        "in the daemon: an active folder the store does not hold",
        Snapshot((folder(B, "running"),), {B: {"status": "running"}}, {}, live=frozenset()),
        [("unrecovered_folder", None)],
    ),
    (
        "in the daemon: an entry pointing at a run the store does not hold",
        Snapshot((folder(A, "running", young=True),), {}, {"agent:main:main": A}, live=frozenset()),
        [("stale_entry", "idle_entry")],
    ),
    (
        "stray temp file",
        Snapshot((), {}, {}, tmp_files=("contexts/.sessions.json.tmp",)),
        [("stray_tmp", "remove_tmp")],
    ),
]


@pytest.mark.parametrize(("name", "snapshot", "expected"), CASES, ids=[c[0] for c in CASES])
def test_diagnose(name: str, snapshot: Snapshot, expected: list[tuple[str, str | None]]) -> None:
    findings = diagnose(snapshot)
    assert [(f.check, f.kind) for f in findings] == expected
    for finding in findings:
        assert finding.detail and finding.severity in ("error", "warning", "info")
        assert finding.fix  # every finding offers a fix; no kind when only a restart carries it out


async def _home_with_runs(home: Path, clock: FakeClock) -> tuple[str, str]:
    """One key with an active run, one whose run completed; returns (active, completed) run ids."""
    store = await open_store(home, clock)
    try:
        active = await start(store, "agent:main:main")
        await store.append(active, NewMessage(role="user", content="hello"))
        done = await start(store, "cron:nightly")
        await store.append(done, NewMessage(role="user", content="tick"))
        await store.complete("cron:nightly")
    finally:
        await store.close()
    return active.run_id, done.run_id


def _plant_orphan(home: Path, state: str = "completed") -> str:
    run_id = str(uuid.uuid4())
    path = home / "contexts" / state / run_id
    path.mkdir(parents=True)
    (path / "metadata.json").write_text(json.dumps({**META, "uuid": run_id, "session_key": "hook:x"}))
    (path / "messages.jsonl").write_text("")
    return run_id


def _rows(home: Path) -> dict[str, str]:
    conn = sqlite3.connect(home / "contexts" / "tasks.db")
    try:
        return dict(conn.execute("SELECT uuid, status FROM tasks").fetchall())
    finally:
        conn.close()


def _sessions(home: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((home / "contexts" / "sessions.json").read_text())["sessions"]
    return data


def _tamper(home: Path, active: str, done: str) -> dict[str, str]:
    orphan = _plant_orphan(home)
    lost = str(uuid.uuid4())
    conn = sqlite3.connect(home / "contexts" / "tasks.db")
    with conn:
        conn.execute(
            "INSERT INTO tasks (uuid, status, task_type, created_at, session_key) VALUES (?, 'running', 'agent', ?, ?)",
            (lost, "2026-11-30T00:00:00+00:00", "agent:main:lost"),
        )
        conn.execute("UPDATE tasks SET status = 'running' WHERE uuid = ?", (done,))
    conn.close()
    path = home / "contexts" / "sessions.json"
    data = json.loads(path.read_text())
    data["sessions"]["cron:nightly"]["run_id"] = done  # points at a completed run
    del data["sessions"]["agent:main:main"]  # the active run loses its entry
    path.write_text(json.dumps(data))
    (home / "contexts" / ".sessions.json.tmp").write_text("{")
    return {"orphan": orphan, "lost": lost}


async def test_check_home_reports_without_changing_anything_then_fixes(tmp_path: Path, clock: FakeClock) -> None:
    active, done = await _home_with_runs(tmp_path, clock)
    planted = _tamper(tmp_path, active, done)
    before = tree_digest(tmp_path)

    findings = await asyncio.to_thread(check_home, tmp_path, fix=False, now="2026-11-30T12:00:00+00:00")
    by_check = {f.check: f for f in findings}
    assert set(by_check) == {
        "orphan_folder", "missing_folder", "wrong_state_folder", "stale_entry", "missing_entry", "stray_tmp"
    }  # fmt: skip
    assert by_check["orphan_folder"].run_id == planted["orphan"]
    assert by_check["missing_folder"].run_id == planted["lost"]
    assert by_check["wrong_state_folder"].run_id == done
    assert by_check["stale_entry"].key == "cron:nightly"
    assert by_check["missing_entry"].run_id == active
    assert not any(f.fixed for f in findings)
    assert tree_digest(tmp_path) == before

    fixed = await asyncio.to_thread(check_home, tmp_path, fix=True, now="2026-11-30T12:00:00+00:00")
    assert all(f.fixed for f in fixed), [f.as_dict() for f in fixed if not f.fixed]
    rows = _rows(tmp_path)
    assert rows[planted["orphan"]] == "completed" and rows[planted["lost"]] == "failed" and rows[done] == "completed"
    sessions = _sessions(tmp_path)
    assert sessions["cron:nightly"]["run_id"] is None and sessions["cron:nightly"]["status"] == "idle"
    assert sessions["agent:main:main"]["run_id"] == active
    assert not (tmp_path / "contexts" / ".sessions.json.tmp").exists()
    assert await asyncio.to_thread(check_home, tmp_path, fix=False, now="2026-11-30T12:00:00+00:00") == []

    store = await open_store(tmp_path, clock)  # and the engine is happy with the result
    try:
        run = store.active_run("agent:main:main")
        assert run is not None and run.run_id == active and run.next_seq == 2
    finally:
        await store.close()


async def _aged(path: Path, seconds: float = 3600) -> None:
    """``path`` as if last changed ``seconds`` before the file system stamped it (its clock, not
    this process's: they differ on a network file system or under libfaketime)."""
    past = (await asyncio.to_thread(os.stat, path)).st_mtime - seconds
    await asyncio.to_thread(os.utime, path, (past, past))


async def test_check_store_fixes_through_the_store(tmp_path: Path, clock: FakeClock) -> None:
    active, _ = await _home_with_runs(tmp_path, clock)
    store: SessionStore = await open_store(tmp_path, clock)
    try:
        old = await asyncio.to_thread(_plant_orphan, tmp_path)
        await _aged(tmp_path / "contexts" / "completed" / old)
        young = await asyncio.to_thread(_plant_orphan, tmp_path, "running")  # a run being created
        entry = store.entry("cron:nightly")
        assert entry is not None
        entry.run_id = str(uuid.uuid4())

        findings = await check_store(store.state, fix=False)
        assert {(f.check, f.run_id) for f in findings} == {("orphan_folder", old), ("stale_entry", entry.run_id)}
        assert young not in {f.run_id for f in findings}

        fixed = await check_store(store.state, fix=True)
        assert all(f.fixed for f in fixed)
        assert entry.run_id is None and entry.status == "idle"
        assert (await store.ledger.get_run(old) or {}).get("status") == "completed"
        run = store.active_run("agent:main:main")
        assert run is not None and run.run_id == active  # the held run is untouched
        assert await check_store(store.state, fix=False) == []
    finally:
        await store.close()


def test_file_ages_are_measured_on_the_file_systems_clock(tmp_path: Path) -> None:
    from sessions.files.doctor_files import file_clock

    stamped = tmp_path / "stamped"
    stamped.touch()
    assert abs(file_clock(tmp_path) - stamped.stat().st_mtime) < 1
    assert list(tmp_path.iterdir()) == [stamped]  # the probe leaves nothing
    assert abs(file_clock(tmp_path / "missing") - time.time()) < 1  # nothing writable: this clock
