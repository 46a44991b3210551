"""Issue 10 item 5: corruption in the middle of a file is no longer silent. The doctor reads every
line of every run's stores (reporting file and line), checks that seqs are continuous, start-up
logs what it cut and fails the run it came from, a lost messages.jsonl never restarts seqs under
a current.jsonl that holds later ones, and files written by a newer neotask are refused."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from pathlib import Path

import pytest

from home.damage import EXIT_STATE, DamagedState
from sessions.files.doctor import Finding, check_home
from sessions.files.jsonl import read_records
from sessions.files.ledger import MIGRATIONS
from sessions.records import NewMessage
from tests.conftest import FakeClock
from tests.faults.state_support import (
    BOB,
    COUNTS,
    MAIN,
    failed_start,
    ledger_rows,
    messages_path,
    one_clear_line,
    rewrite_line,
    seed_home,
    with_seq,
)
from tests.gateway.helpers import tree_digest
from tests.sessions.helpers import open_store, start

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

NOW = "2026-11-30T12:00:00+00:00"
GARBAGE = '{"seq": 2, "role": "user", "content": "cut in the mid\x00dle'


async def doctor_findings(home: Path, *, fix: bool = False) -> list[Finding]:
    return await asyncio.to_thread(check_home, home, fix=fix, now=NOW)


def checks(findings: list[Finding]) -> list[str]:
    return sorted(f.check for f in findings)


async def test_a_garbage_line_in_the_middle_is_reported_with_file_and_line_then_cut(tmp_path: Path) -> None:
    runs = await seed_home(tmp_path)
    path = messages_path(tmp_path, runs[MAIN])
    rewrite_line(path, 1, GARBAGE)
    before = tree_digest(tmp_path)

    findings = await doctor_findings(tmp_path)
    assert checks(findings) == ["bad_line", "seq_gap"]
    bad = next(f for f in findings if f.check == "bad_line")
    assert bad.severity == "error" and bad.run_id == runs[MAIN]
    assert bad.path == f"contexts/running/{runs[MAIN]}/messages.jsonl" and bad.lines == (2,)
    assert "messages.jsonl line 2 (not JSON)" in bad.detail and bad.fix is not None
    gap = next(f for f in findings if f.check == "seq_gap")
    assert "line 3 (seq 3 follows 1)" in gap.detail
    assert tree_digest(tmp_path) == before  # reporting changes nothing

    fixed = await doctor_findings(tmp_path, fix=True)
    assert [(f.check, f.fixed) for f in fixed] == [("bad_line", True), ("seq_gap", True)]
    done = messages_path(tmp_path, runs[MAIN], "completed")  # the gap failed the run: nothing deleted
    assert done.with_name("messages.jsonl.torn").read_text() == GARBAGE + "\n"
    assert [json.loads(line)["seq"] for line in done.read_text().splitlines()] == [1, 3]
    assert "seq 3 follows 1" in ledger_rows(tmp_path)[runs[MAIN]]["error_message"]
    assert await doctor_findings(tmp_path) == []


@pytest.mark.parametrize(
    ("index", "seq", "expected"),
    [
        (2, 5, "line 3 (seq 5 follows 2)"),  # a gap
        (2, 2, "line 3 (seq 2 follows 2)"),  # a repeat
        (0, 7, "line 1 (seq 7 follows the start)"),
    ],
)
async def test_seqs_must_be_continuous(tmp_path: Path, index: int, seq: int, expected: str) -> None:
    runs = await seed_home(tmp_path)
    path = messages_path(tmp_path, runs[MAIN])
    rewrite_line(path, index, with_seq(path.read_text().splitlines()[index], seq))
    findings = [f for f in await doctor_findings(tmp_path) if f.check == "seq_gap"]
    assert len(findings) == 1 and expected in findings[0].detail
    assert findings[0].path == f"contexts/running/{runs[MAIN]}/messages.jsonl"


@pytest.mark.parametrize("name", ["current.jsonl", "summaries.jsonl", "tools.jsonl"])
async def test_every_store_file_is_read_line_by_line(tmp_path: Path, name: str) -> None:
    runs = await seed_home(tmp_path)
    path = messages_path(tmp_path, runs[BOB]).with_name(name)
    lines = path.read_text().splitlines() if path.exists() else []
    path.write_text("".join(f"{line}\n" for line in [*lines, "[1, 2, 3]", "{}"]))
    findings = [f for f in await doctor_findings(tmp_path) if f.check == "bad_line"]
    assert len(findings) == 1
    assert f"{name} line {len(lines) + 1} (not a JSON object)" in findings[0].detail


async def test_start_up_logs_what_it_cut_and_fails_only_that_run(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    runs = await seed_home(tmp_path, clock)
    path = messages_path(tmp_path, runs[MAIN])
    rewrite_line(path, 1, GARBAGE)

    with caplog.at_level(logging.WARNING):
        store = await open_store(tmp_path, clock)
    try:
        assert store.active_run(MAIN) is None
        assert store.active_run(BOB) is not None and store.active_run(BOB).run_id == runs[BOB]  # type: ignore[union-attr]
    finally:
        await store.close()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"{runs[MAIN]}: messages.jsonl line 2 (not JSON) cut into messages.jsonl.torn" in logged
    assert "marked failed" in logged
    row = ledger_rows(tmp_path)[runs[MAIN]]
    assert row["status"] == "failed" and "messages.jsonl line 2 (not JSON)" in row["error_message"]
    done = messages_path(tmp_path, runs[MAIN], "completed")
    assert done.with_name("messages.jsonl.torn").read_text() == GARBAGE + "\n"
    assert [json.loads(line)["seq"] for line in done.read_text().splitlines()] == [1, 3]


async def test_a_deleted_messages_jsonl_does_not_restart_seqs(tmp_path: Path, clock: FakeClock) -> None:
    runs = await seed_home(tmp_path, clock)
    path = messages_path(tmp_path, runs[MAIN])
    current = path.with_name("current.jsonl").read_bytes()
    path.unlink()

    findings = [f for f in await doctor_findings(tmp_path) if f.check == "lost_messages"]
    assert len(findings) == 1 and findings[0].severity == "error"
    assert "messages.jsonl is missing or empty but current.jsonl holds seqs up to 3" in findings[0].detail

    store = await open_store(tmp_path, clock)
    try:
        recovered = {r.run_id: r for r in store.recovered}[runs[MAIN]]
        assert recovered.next_seq == COUNTS[MAIN] + 1  # not 1: seq 1-3 are still in current.jsonl
        assert recovered.damage is not None and "messages.jsonl is missing" in recovered.damage
        assert store.active_run(MAIN) is None  # failed: the key goes on in a new run
        run = await start(store, MAIN)
        record = await store.append(run, NewMessage(role="user", content="after the loss"))
        assert run.run_id != runs[MAIN] and record["seq"] == 1
    finally:
        await store.close()
    old = messages_path(tmp_path, runs[MAIN], "completed")
    assert not old.exists() and old.with_name("current.jsonl").read_bytes() == current  # never mixed
    assert "messages.jsonl is missing" in ledger_rows(tmp_path)[runs[MAIN]]["error_message"]


async def test_a_newer_sessions_json_is_refused_not_rewritten(tmp_path: Path, clock: FakeClock) -> None:
    await seed_home(tmp_path, clock)
    path = tmp_path / "contexts" / "sessions.json"
    data = json.loads(path.read_text())
    data["format_version"] = 99
    path.write_text(json.dumps(data))
    before = path.read_bytes()

    with pytest.raises(DamagedState) as refused:
        await open_store(tmp_path, clock)
    assert refused.value.path == str(path) and "format_version 99 is newer" in refused.value.message
    findings = await doctor_findings(tmp_path, fix=True)
    unsupported = [f for f in findings if f.check == "unreadable_sessions_json"]
    assert len(unsupported) == 1 and "format_version 99" in unsupported[0].detail and not unsupported[0].fixed
    assert path.read_bytes() == before


async def test_a_newer_tasks_db_is_refused_not_rebuilt(tmp_path: Path, clock: FakeClock) -> None:
    await seed_home(tmp_path, clock)
    db = tmp_path / "contexts" / "tasks.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 42")
    conn.close()
    before = db.read_bytes()

    with pytest.raises(DamagedState) as refused:
        await open_store(tmp_path, clock)
    known = f"schema version 42 is newer than this neotask knows ({len(MIGRATIONS)})"
    assert refused.value.path == str(db) and known in str(refused.value)
    findings = await doctor_findings(tmp_path, fix=True)
    todo = "upgrade neotask, or restore a tasks.db written by this version"  # a person's fix: never rebuilt
    assert [(f.check, f.fix, f.fixed) for f in findings] == [("unreadable_ledger", todo, False)]
    assert findings[0].as_dict()["fixable"] is False
    assert db.read_bytes() == before and not db.with_name("tasks.db.damaged").exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("file", ["sessions.json", "tasks.db"])
async def test_a_real_daemon_refuses_newer_formats(tmp_path: Path, file: str) -> None:
    home = tmp_path / "home"
    await seed_home(home)
    path = home / "contexts" / file
    if file == "sessions.json":
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "format_version": 99}))
    else:
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA user_version = 42")
        conn.close()
    before = path.read_bytes()
    code, stderr = await failed_start(home)
    assert code == EXIT_STATE
    one_clear_line(stderr, file, "newer", "upgrade neotask")
    assert path.read_bytes() == before


async def test_reads_and_start_up_log_the_lines_they_skip(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    runs = await seed_home(tmp_path, clock)
    messages = messages_path(tmp_path, runs[BOB])
    rewrite_line(messages.with_name("current.jsonl"), 0, "not json at all")
    with caplog.at_level(logging.WARNING):
        store = await open_store(tmp_path, clock)
        await store.close()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"{runs[BOB]}/current.jsonl line 1 is not a JSON object: skipped" in logged
    assert store.recovered and ledger_rows(tmp_path)[runs[BOB]]["status"] == "running"  # derived: it goes on

    caplog.clear()
    rewrite_line(messages, 0, "[]")
    with caplog.at_level(logging.WARNING):
        records = await asyncio.to_thread(read_records, messages)
    assert [r["seq"] for r in records] == [2]
    assert f"{messages} line 1 is not a JSON object: skipped" in caplog.text
