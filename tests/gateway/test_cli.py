"""The ``neotask`` CLI: offline (no daemon: it takes the lock and works on the files) and online
(one real daemon: it calls the HTTP API)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest

from config.clock import system_clock
from home.lock import HomeLock
from sessions.records import NewMessage, RunStart, TaskKey
from tests.conftest import FakeClock
from tests.gateway.daemons import daemon
from tests.gateway.helpers import Cli
from tests.sessions.helpers import open_store, start

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too


@pytest.fixture(autouse=True)
def _no_neotask_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [n for n in os.environ if n.startswith("NEOTASK_")]:
        monkeypatch.delenv(name)
    yield


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], home: Path) -> Cli:
    return Cli(capsys, home)


async def _seed(home: Path, clock: FakeClock) -> dict[str, str]:
    """Seeded at the real time: the in-process CLI that reads the home reads the real
    clock (a fixed fake date would put the runs past their daily reset a day later)."""
    clock.set(system_clock())
    store = await open_store(home, clock)
    try:
        main_run = await start(store, "agent:main:main")
        for text in ("first", "second"):
            await store.append(main_run, NewMessage(role="user", content=text))
        clock.advance(minutes=1)
        cron_run = await store.start_run(
            RunStart(
                "cron:nightly",
                agent_id="main",
                chat_type="cron",
                channel=None,
                task_key=TaskKey("cron", "cron:nightly"),
            )
        )
        await store.append(cron_run, NewMessage(role="user", content="tick"))
    finally:
        await store.close()
    return {"agent:main:main": main_run.run_id, "cron:nightly": cron_run.run_id}


# -- offline -------------------------------------------------------------------------------------


async def test_offline_sessions_list_and_show(cli: Cli, home: Path, clock: FakeClock) -> None:
    runs = await _seed(home, clock)
    listing = await cli.json("sessions", "list")
    assert [s["key"] for s in listing["sessions"]] == ["cron:nightly", "agent:main:main"]
    assert listing["sessions"][1]["run_id"] == runs["agent:main:main"]

    code, out, _ = await cli("sessions", "list")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["KEY", "STATUS", "RUN"]
    assert runs["agent:main:main"] in out and runs["cron:nightly"] in out  # full ids, never cut

    only_cron = await cli.json("sessions", "list", "--type", "cron")
    assert [s["key"] for s in only_cron["sessions"]] == ["cron:nightly"]
    newest = await cli.json("sessions", "list", "--limit", "1")
    assert [s["key"] for s in newest["sessions"]] == ["cron:nightly"]

    shown = await cli.json("sessions", "show", "agent:main:main")
    assert shown["run_id"] == runs["agent:main:main"] and shown["message_count"] == 2 and shown["status"] == "running"
    code, out, _ = await cli("sessions", "show", "agent:main:main")
    assert code == 0 and runs["agent:main:main"] in out

    code, _, err = await cli("sessions", "show", "agent:main:dm:nobody")
    assert code == 1 and err.startswith("error: session_not_found: ")
    code, _, err = await cli("sessions", "show", "agent:ghost:main")
    assert code == 1 and err.startswith("error: invalid_key: ")


async def test_offline_reset_and_delete(cli: Cli, home: Path, clock: FakeClock) -> None:
    runs = await _seed(home, clock)
    reset = await cli.json("sessions", "reset", "agent:main:main")
    assert reset["completed_run_id"] == runs["agent:main:main"]
    assert (home / "contexts" / "completed" / runs["agent:main:main"]).is_dir()
    sessions = json.loads((home / "contexts" / "sessions.json").read_text())["sessions"]
    assert sessions["agent:main:main"]["run_id"] is None and sessions["agent:main:main"]["status"] == "idle"

    code, out, _ = await cli("sessions", "reset", "agent:main:main")
    assert code == 0 and "no active run" in out

    deleted = await cli.json("sessions", "delete", "cron:nightly")
    assert deleted == {"session_key": "cron:nightly", "deleted": True, "completed_run_id": runs["cron:nightly"]}
    listing = await cli.json("sessions", "list")
    assert [s["key"] for s in listing["sessions"]] == ["agent:main:main"]
    code, _, err = await cli("sessions", "delete", "cron:nightly")
    assert code == 1 and "session_not_found" in err


async def test_offline_compact_goes_through_the_chat_command(cli: Cli, home: Path, clock: FakeClock) -> None:
    runs = await _seed(home, clock)
    code, out, _ = await cli("sessions", "compact", "agent:main:main")
    assert code == 0 and out.startswith("Nothing to compact yet")  # what /compact answers for 2 messages

    store = await open_store(home, clock)
    try:
        run = store.active_run("agent:main:main")
        assert run is not None
        for i in range(20):
            await store.append(
                run,
                NewMessage(
                    role="user" if i % 2 else "assistant",
                    content=f"decision {i}: " + "we talked at length about the plan. " * 12,
                ),
            )
    finally:
        await store.close()
    body = await cli.json("sessions", "compact", "agent:main:main", "focus", "on", "decisions")
    assert body["session_key"] == "agent:main:main" and body["run_id"] == runs["agent:main:main"]
    summaries = home / "contexts" / "running" / runs["agent:main:main"] / "summaries.jsonl"
    assert summaries.exists() and len(summaries.read_text().splitlines()) == 1, body["reply"]


async def test_offline_commands_wait_for_nobody_but_refuse_a_held_lock(cli: Cli, home: Path, clock: FakeClock) -> None:
    await _seed(home, clock)
    with HomeLock(home / "gateway.lock"):  # a daemon starting, or another CLI: waited for, here not at all
        code, _, err = await cli("sessions", "list", "--wait-start", "0")
    assert code == 1 and err.startswith("error: gateway_running: gateway already running (pid ")


async def test_config_check_names_the_bad_key(cli: Cli, home: Path) -> None:
    home.mkdir()
    code, out, _ = await cli("config", "check")
    assert code == 0 and out.startswith("OK")
    (home / "config.yaml").write_text("gateway:\n  prot: 9000\n")
    code, _, err = await cli("config", "check")
    assert code == 4 and "gateway.prot" in err and "unknown key" in err
    code, out, _ = await cli("config", "check", "--json")
    assert code == 4 and "gateway.prot" in json.loads(out)["error"]
    bad = home / "elsewhere.yaml"
    bad.write_text("storage:\n  fsync: sometimes\n")
    code, _, err = await cli("config", "check", "--config", str(bad))
    assert code == 4 and "storage.fsync" in err


async def test_config_show_redacts_tokens(cli: Cli, home: Path) -> None:
    home.mkdir()
    (home / "config.yaml").write_text("gateway:\n  tokens: [s3cret-one, s3cret-two]\n  port: 9001\n")
    code, out, _ = await cli("config", "show")
    assert code == 0 and "s3cret" not in out and "***" in out
    assert "port: 9001" in out and "fsync: batch" in out  # merged over the defaults
    shown = await cli.json("config", "show")
    assert shown["gateway"]["tokens"] == ["***", "***"] and shown["gateway"]["port"] == 9001


async def test_doctor_finds_an_orphan_folder_and_fixes_it(cli: Cli, home: Path, clock: FakeClock) -> None:
    await _seed(home, clock)
    # a home written without the daemon has no history index yet; doctor --fix builds it
    assert [a["check"] for a in (await cli.json("doctor"))["actions"]] == ["history_index_missing"]
    orphan = home / "contexts" / "completed" / str(uuid.uuid4())
    orphan.mkdir(parents=True)
    (orphan / "metadata.json").write_text(json.dumps({"session_key": "hook:lost", "created_at": "2026-11-01"}))

    code, out, _ = await cli("doctor")
    assert code == 0 and "orphan_folder" in out and orphan.name in out and "insert its tasks.db row" in out
    fixed = await cli.json("doctor", "--fix")
    assert [(a["check"], a["fixed"]) for a in fixed["actions"]] == [
        ("orphan_folder", True),
        ("history_index_missing", True),
    ]
    assert (await cli.json("doctor"))["actions"] == []


# -- online --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_online_status_list_doctor_and_stop(cli: Cli, home: Path) -> None:
    home.mkdir()
    # no daily boundary between the online and the offline listing (CI's 2041 run starts at 03:58
    # and crossed 04:00 here: the run ended, as it should); the boundary is tests/dates' subject
    (home / "config.yaml").write_text("gateway:\n  tokens: [t0ken]\nsession:\n  reset: {mode: none}\n")
    async with daemon(home) as running:
        headers = {"Authorization": "Bearer t0ken"}
        url = f"{running.url}/v1/sessions/{quote('hook:github:owner/repo:issue:7', safe='')}/messages"
        async with aiohttp.ClientSession(headers=headers) as session, session.post(url, json={"content": "hi"}) as r:
            assert r.status == 200
            run_id = (await r.json())["run_id"]

        status = await cli.json("gateway", "status")
        assert status["running"] is True and status["pid"] == running.pid and status["healthy"] is True
        code, out, _ = await cli("gateway", "status")
        assert code == 0 and str(running.pid) in out and running.url in out

        code, out, _ = await cli("sessions", "list")  # the token comes from the config
        assert code == 0 and "hook:github:owner/repo:issue:7" in out and run_id in out
        shown = await cli.json("sessions", "show", "hook:github:owner/repo:issue:7")
        assert shown["run_id"] == run_id and shown["threshold"] > 0
        code, _, err = await cli("sessions", "list", "--token", "wrong")
        assert code == 1 and err.startswith("error: unauthorized: ")
        code, _, err = await cli("sessions", "show", "cron:none")
        assert code == 1 and err.startswith("error: session_not_found: ")
        assert (await cli.json("doctor"))["actions"] == []

        code, out, _ = await cli("gateway", "stop")
        assert code == 0 and f"gateway stopped (pid {running.pid})" in out
        assert await running.wait() == 0
    assert not (home / "gateway.json").exists()
    code, out, _ = await cli("gateway", "status")
    assert code == 3 and "not running" in out
    listing = await cli.json("sessions", "list")  # offline again, same answer
    assert [s["run_id"] for s in listing["sessions"]] == [run_id]
