"""Issue 10 item 4: a damaged or unusable home stops a real daemon and the real ``neotask doctor``
with one clear line naming the file and what to do (exit 78), never a traceback; ``doctor --fix``
repairs what it can (tasks.db rebuilt from the run folders, an empty gateway.lock directory
removed) and the next start works. Damage confined to some runs does not stop the daemon: those
runs are failed with the reason and the bad line is cut into ``<file>.torn``."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from home.damage import EXIT_STATE, FIX_LEDGER, ledger_error
from sessions.files.doctor import check_home
from tests.conftest import FakeClock
from tests.faults.state_support import (
    BOB,
    COUNTS,
    MAIN,
    doctor,
    failed_start,
    fill,
    get_json,
    ledger_rows,
    messages_path,
    one_clear_line,
    remount,
    rewrite_line,
    running,
    seed_home,
    tmpfs,
    with_seq,
)
from tests.sessions.helpers import open_store

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

daemons = pytest.mark.slow  # real daemon and CLI processes


def truncate_db(home: Path) -> None:
    db = home / "contexts" / "tasks.db"
    with db.open("r+b") as handle:
        handle.truncate(db.stat().st_size // 3)


def garbage_db(home: Path) -> None:
    (home / "contexts" / "tasks.db").write_bytes(b"this is not a database\n" * 500)


def foreign_db(home: Path) -> None:
    db = home / "contexts" / "tasks.db"
    db.unlink()
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("CREATE TABLE tasks (id INTEGER PRIMARY KEY, title TEXT)")
        conn.execute("INSERT INTO tasks (title) VALUES ('someone else''s todo list')")
    conn.close()


def damaged_page(home: Path) -> None:
    """Page 2 (the tasks table's root) overwritten: the header and the schema still read fine."""
    db = home / "contexts" / "tasks.db"
    with db.open("r+b") as handle:
        handle.seek(4096)
        handle.write(b"\xff" * 4096)


DAMAGED_LEDGERS: dict[str, Callable[[Path], None]] = {
    "truncated": truncate_db,
    "damaged page": damaged_page,
    "not sqlite": garbage_db,
    "wrong schema": foreign_db,
}


async def assert_runs_are_back(home: Path, runs: dict[str, str]) -> None:
    """A start that works: every seeded run is listed with its messages, and a new message lands."""
    async with running(home) as (gw, http):
        for key, run_id in runs.items():
            run = await get_json(http, f"{gw.url}/v1/runs/{run_id}")
            assert run["status"] == "running" and run["session_key"] == key
            messages = await get_json(http, f"{gw.url}/v1/runs/{run_id}/messages")
            assert [m["seq"] for m in messages["messages"]] == list(range(1, COUNTS[key] + 1))
        async with http.post(f"{gw.url}/v1/sessions/{MAIN}/messages", json={"content": "after"}) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["message_seq"] == COUNTS[MAIN] + 1


@daemons
@pytest.mark.timeout(240)
@pytest.mark.parametrize("damage", list(DAMAGED_LEDGERS))
async def test_damaged_tasks_db_stops_with_one_line_and_doctor_fix_rebuilds_it(tmp_path: Path, damage: str) -> None:
    home = tmp_path / "home"
    runs = await seed_home(home)
    DAMAGED_LEDGERS[damage](home)

    code, stderr = await failed_start(home)
    assert code == EXIT_STATE
    one_clear_line(stderr, "tasks.db", "neotask doctor --fix")

    checked = await doctor(home)
    assert checked.returncode == EXIT_STATE and "unreadable_ledger" in checked.stdout
    one_clear_line(checked.stderr, "tasks.db", "doctor --fix")

    fixed = await doctor(home, "--fix")
    assert fixed.returncode == 0, fixed.stderr
    assert "Traceback" not in fixed.stderr
    assert (home / "contexts" / "tasks.db.damaged").exists()  # set aside, not deleted
    assert set(ledger_rows(home)) == set(runs.values())
    assert (await doctor(home)).stdout.strip() == "no problems found"
    await assert_runs_are_back(home, runs)


@pytest.mark.parametrize(
    ("error", "fixable", "words"),
    [
        (sqlite3.DatabaseError("file is not a database"), True, "not a readable SQLite database"),
        (sqlite3.DatabaseError("database disk image is malformed"), True, "not a readable SQLite database"),
        (sqlite3.OperationalError("no such table: tasks"), True, "not a neotask ledger"),
        (sqlite3.OperationalError("database is locked"), False, "locked by another process"),
        (sqlite3.OperationalError("unable to open database file"), False, "cannot open tasks.db"),
    ],
)
def test_what_a_sqlite_error_means(tmp_path: Path, error: sqlite3.Error, fixable: bool, words: str) -> None:
    """Only damage is rebuilt: a locked or unreachable tasks.db is a healthy file to leave alone."""
    explained = ledger_error(tmp_path / "tasks.db", error)
    assert words in explained.message and str(tmp_path / "tasks.db") in explained.message
    assert (explained.todo == FIX_LEDGER) is fixable


@daemons
@pytest.mark.timeout(240)
async def test_gateway_lock_that_is_a_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    runs = await seed_home(home)
    (home / "gateway.lock").unlink(missing_ok=True)
    (home / "gateway.lock").mkdir()

    code, stderr = await failed_start(home)
    assert code == EXIT_STATE
    one_clear_line(stderr, "gateway.lock", "is a directory", "rmdir")
    checked = await doctor(home)
    assert checked.returncode == EXIT_STATE
    one_clear_line(checked.stderr, "gateway.lock")

    fixed = await doctor(home, "--fix")
    assert fixed.returncode == 0 and "lock_is_directory" in fixed.stdout, fixed.stderr
    assert (home / "gateway.lock").is_file()
    await assert_runs_are_back(home, runs)


@daemons
@pytest.mark.timeout(240)
async def test_full_disk_stops_with_one_line_and_starts_once_space_frees(tmp_path: Path) -> None:
    async with tmpfs(tmp_path / "home") as home:  # the daemon's stderr goes next to it, not on it
        runs = await seed_home(home)
        filler = await fill(home)

        code, stderr = await failed_start(home)
        assert code == EXIT_STATE
        one_clear_line(stderr, str(home), "no space left", "free some space")
        checked = await doctor(home)
        assert checked.returncode == EXIT_STATE
        one_clear_line(checked.stderr, "no space left")

        filler.unlink()
        await assert_runs_are_back(home, runs)


@daemons
@pytest.mark.timeout(240)
async def test_read_only_home_stops_with_one_line(tmp_path: Path) -> None:
    async with tmpfs(tmp_path / "home") as home:  # the daemon's stderr goes next to it, not on it
        runs = await seed_home(home)
        await remount(home, "ro")
        try:
            code, stderr = await failed_start(home)
            assert code == EXIT_STATE
            one_clear_line(stderr, str(home), "read-only")
            checked = await doctor(home)
            assert checked.returncode == EXIT_STATE
            one_clear_line(checked.stderr, "read-only")
        finally:
            await remount(home, "rw")
        await assert_runs_are_back(home, runs)


@daemons
@pytest.mark.timeout(240)
@pytest.mark.parametrize("where", ["last line", "middle line"])
async def test_a_seq_that_is_not_an_integer_fails_only_its_run(tmp_path: Path, where: str) -> None:
    home = tmp_path / "home"
    runs = await seed_home(home)
    path = messages_path(home, runs[MAIN])
    index = COUNTS[MAIN] - 1 if where == "last line" else 1
    bad = with_seq(path.read_text().splitlines()[index], "two")
    rewrite_line(path, index, bad)

    checked = await doctor(home)
    assert checked.returncode == EXIT_STATE
    one_clear_line(checked.stderr, "messages.jsonl", f"line {index + 1}", "seq is not a positive integer")

    async with running(home) as (gw, http):
        failed = await get_json(http, f"{gw.url}/v1/runs/{runs[MAIN]}")
        assert failed["status"] == "failed"
        assert "messages.jsonl" in failed["error_message"] and f"line {index + 1}" in failed["error_message"]
        other = await get_json(http, f"{gw.url}/v1/runs/{runs[BOB]}")
        assert other["status"] == "running"  # the damage is confined to one run
        async with http.post(f"{gw.url}/v1/sessions/{MAIN}/messages", json={"content": "next"}) as resp:
            assert resp.status == 200
            posted = await resp.json()
        assert posted["run_id"] != runs[MAIN] and posted["message_seq"] >= 1
    stderr = gw.stderr()
    assert "Traceback" not in stderr
    assert f"{runs[MAIN]}" in stderr and "messages.jsonl" in stderr
    torn = messages_path(home, runs[MAIN], "completed").with_name("messages.jsonl.torn")
    assert torn.read_text().splitlines() == [bad]
    assert (await doctor(home)).returncode == 0


async def test_a_run_whose_files_cannot_be_read_is_failed_and_the_rest_opens(tmp_path: Path, clock: FakeClock) -> None:
    """Damage confined to one run (here a directory where its messages.jsonl belongs: unreadable
    even to root) fails that run with the reason; the doctor names the file and offers to fail the
    run (as start-up does), not a cut."""
    runs = await seed_home(tmp_path, clock)
    path = messages_path(tmp_path, runs[MAIN])
    path.unlink()
    path.mkdir()
    findings = await asyncio.to_thread(check_home, tmp_path, fix=False, now="2026-11-30T12:00:00+00:00")
    bad = [f for f in findings if f.check == "bad_line"]
    assert (
        len(bad) == 1 and bad[0].kind == "fail_run" and "messages.jsonl cannot be read: Is a directory" in bad[0].detail
    )

    store = await open_store(tmp_path, clock)
    try:
        assert store.active_run(MAIN) is None
        assert [run.run_id for run in store.active_runs()] == [runs[BOB]]
    finally:
        await store.close()
    row = ledger_rows(tmp_path)[runs[MAIN]]
    assert row["status"] == "failed"
    assert "messages.jsonl cannot be read or repaired (Is a directory)" in row["error_message"]
