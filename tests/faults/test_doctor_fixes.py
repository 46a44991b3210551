"""Issue 10 item 6: the doctor offers a fix for every finding it reports. Each damaged home is built
for real (files on disk); ``neotask doctor --fix`` (``check_home``) repairs it, a second run finds
nothing (convergence), and the home opens afterwards as the daemon opens it."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from sessions.files.doctor import Finding, check_home, check_store
from tests.conftest import FakeClock
from tests.faults.state_support import BOB, MAIN, ledger_rows, messages_path, rewrite_line, seed_home, with_seq
from tests.sessions.helpers import open_store

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

NOW = "2026-11-30T12:00:00+00:00"


async def doctor(home: Path, *, fix: bool) -> list[Finding]:
    return await asyncio.to_thread(check_home, home, fix=fix, now=NOW)


async def complete_bob(home: Path, runs: dict[str, str]) -> Path:
    store = await open_store(home, FakeClock())
    try:
        await store.complete(BOB)
    finally:
        await store.close()
    return messages_path(home, runs[BOB], "completed")


async def seq_gap_running(home: Path, runs: dict[str, str]) -> None:
    path = messages_path(home, runs[MAIN])
    rewrite_line(path, 2, with_seq(path.read_text().splitlines()[2], 7))


async def seq_gap_completed(home: Path, runs: dict[str, str]) -> None:
    path = await complete_bob(home, runs)
    rewrite_line(path, 1, with_seq(path.read_text().splitlines()[1], 5))


async def lost_messages_running(home: Path, runs: dict[str, str]) -> None:
    messages_path(home, runs[MAIN]).unlink()


async def lost_messages_torn(home: Path, runs: dict[str, str]) -> None:
    path = messages_path(home, runs[MAIN])
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0])
    path.with_name("messages.jsonl.torn").write_text("".join(lines[1:]))


async def lost_messages_completed(home: Path, runs: dict[str, str]) -> None:
    path = await complete_bob(home, runs)
    path.write_text(path.read_text().splitlines(keepends=True)[0])


async def unreadable_store_running(home: Path, runs: dict[str, str]) -> None:
    path = messages_path(home, runs[MAIN]).with_name("tools.jsonl")
    path.unlink(missing_ok=True)
    path.mkdir()  # a directory where the file belongs: line 0 stands for the whole file


async def unreadable_store_completed(home: Path, runs: dict[str, str]) -> None:
    path = (await complete_bob(home, runs)).with_name("summaries.jsonl")
    path.unlink(missing_ok=True)
    path.mkdir()


async def unreadable_sessions_json(home: Path, runs: dict[str, str]) -> None:
    (home / "contexts" / "sessions.json").write_text('{"format_version": 1, "sessions": {"agent:ma')


async def duplicate_folder(home: Path, runs: dict[str, str]) -> None:
    running = messages_path(home, runs[MAIN]).parent
    shutil.copytree(running, home / "contexts" / "completed" / runs[MAIN])


Damage = Callable[[Path, dict[str, str]], Awaitable[None]]
CASES: list[tuple[Damage, str]] = [
    (seq_gap_running, "seq_gap"),
    (seq_gap_completed, "seq_gap"),
    (lost_messages_running, "lost_messages"),
    (lost_messages_torn, "lost_messages"),
    (lost_messages_completed, "lost_messages"),
    (unreadable_store_running, "bad_line"),
    (unreadable_store_completed, "bad_line"),
    (unreadable_sessions_json, "unreadable_sessions_json"),
    (duplicate_folder, "duplicate_folder"),
]


@pytest.mark.parametrize(("damage", "check"), CASES, ids=[c[0].__name__ for c in CASES])
async def test_every_finding_has_a_fix_that_converges(tmp_path: Path, damage: Damage, check: str) -> None:
    runs = await seed_home(tmp_path)
    await damage(tmp_path, runs)

    found = await doctor(tmp_path, fix=False)
    assert check in {f.check for f in found}
    assert [f.check for f in found if f.fix is None] == []  # every finding offers a fix
    assert all(f.as_dict()["fixable"] for f in found)  # and `--fix` carries it out

    fixed = await doctor(tmp_path, fix=True)
    assert [(f.check, f.detail) for f in fixed if not f.fixed] == []
    assert await doctor(tmp_path, fix=False) == []  # converged

    store = await open_store(tmp_path, FakeClock())  # the daemon starts afterwards
    try:
        keys = {run.key for run in store.active_runs()}
    finally:
        await store.close()
    assert await doctor(tmp_path, fix=False) == []
    rows = ledger_rows(tmp_path)
    for key, run_id in runs.items():  # a run is either still its key's run, or failed with the reason
        row = rows[run_id]
        assert key in keys or row["status"] in ("failed", "completed")
        if row["status"] == "failed":
            assert str(row["error_message"]).startswith("damaged")


async def test_a_failed_run_keeps_its_files_and_its_key_goes_on(tmp_path: Path) -> None:
    runs = await seed_home(tmp_path)
    await seq_gap_running(tmp_path, runs)
    before = messages_path(tmp_path, runs[MAIN]).read_bytes()

    await doctor(tmp_path, fix=True)
    assert messages_path(tmp_path, runs[MAIN], "completed").read_bytes() == before  # nothing deleted
    row = ledger_rows(tmp_path)[runs[MAIN]]
    assert row["status"] == "failed" and "seq 7 follows 2" in row["error_message"]
    store = await open_store(tmp_path, FakeClock())
    try:
        assert store.active_run(MAIN) is None and store.active_run(BOB) is not None
    finally:
        await store.close()


async def test_an_unreadable_sessions_json_is_set_aside_and_rebuilt(tmp_path: Path) -> None:
    runs = await seed_home(tmp_path)
    await unreadable_sessions_json(tmp_path, runs)
    path = tmp_path / "contexts" / "sessions.json"
    damaged = path.read_bytes()

    await doctor(tmp_path, fix=True)
    assert path.with_name("sessions.json.damaged").read_bytes() == damaged
    entries = json.loads(path.read_text())["sessions"]
    assert {entries[key]["run_id"] for key in (MAIN, BOB)} == {runs[MAIN], runs[BOB]}


async def test_online_a_stray_folder_of_a_held_run_is_moved_aside(tmp_path: Path) -> None:
    runs = await seed_home(tmp_path)
    await duplicate_folder(tmp_path, runs)
    store = await open_store(tmp_path, FakeClock())
    try:
        found = [f for f in await check_store(store.state, fix=True, min_age_s=0) if f.check == "duplicate_folder"]
        assert [(f.status, f.fixed) for f in found] == [("completed", True)]
        assert not (tmp_path / "contexts" / "completed" / runs[MAIN]).exists()
        assert messages_path(tmp_path, runs[MAIN]).exists()  # the held folder stays
        assert len(list((tmp_path / "contexts" / "quarantine").iterdir())) == 1
        assert await check_store(store.state, fix=False, min_age_s=0) == []
        assert store.active_run(MAIN) is not None
    finally:
        await store.close()
