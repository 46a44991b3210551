"""``neotask history search``, ``sessions export``, ``sessions purge`` and the history part of
``doctor`` without a daemon (the CLI takes the lock and works on the files)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from config.clock import system_clock
from sessions.records import NewMessage
from tests.conftest import FakeClock
from tests.gateway.test_cli import Cli, cli, home  # noqa: F401  (fixtures)
from tests.sessions.helpers import open_store, start

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

KEY = "agent:main:main"


async def _seed(home: Path, clock: FakeClock) -> str:  # noqa: F811
    """Seeded at the real time: the in-process CLI that reads the home reads the real
    clock (a fixed fake date would put the runs past their daily reset a day later)."""
    clock.set(system_clock())
    store = await open_store(home, clock)
    try:
        run = await start(store, KEY)
        await store.append(run, NewMessage(role="user", content="the quarterly budget is approved"))
        await store.append(run, NewMessage(role="user", content="来週の会議は火曜日です"))
        await store.append(run, NewMessage(role="user", content="/status", command=True))
        await store.complete(KEY)
        other = await start(store, "agent:main:dm:bob")
        await store.append(other, NewMessage(role="user", content="bob talks about the budget too"))
    finally:
        await store.close()
    return run.run_id


async def test_offline_history_search_builds_the_missing_index(cli: Cli, home: Path, clock: FakeClock) -> None:  # noqa: F811
    run_id = await _seed(home, clock)
    body = await cli.json("history", "search", "budget", "--key", KEY)
    assert [(r["run_id"], r["seq"]) for r in body["results"]] == [(run_id, 1)]
    assert "<mark>budget</mark>" in body["results"][0]["snippet"]
    code, out, _ = await cli("history", "search", "会議")
    assert code == 0 and "[会議]" in out and run_id in out
    assert (home / "contexts" / "history.db").exists()
    code, out, _ = await cli("history", "search", "status")
    assert code == 0 and "no matches" in out
    code, _, err = await cli("history", "search", "?!")
    assert code == 1 and "invalid_field" in err
    code, _, err = await cli("history", "search", "budget", "--since", "0001-01-01T00:00:00+01:00")
    assert code == 1 and "'since' must be an ISO 8601 time" in err, err


async def test_offline_export_purge_and_doctor(cli: Cli, home: Path, clock: FakeClock, tmp_path: Path) -> None:  # noqa: F811
    await _seed(home, clock)
    code, _, _ = await cli("doctor", "--fix")
    assert code == 0
    assert (await cli.json("doctor"))["actions"] == []
    target = tmp_path / "out.md"
    code, _, err = await cli("sessions", "export", KEY, "--format", "md", "-o", str(target))
    assert code == 0 and "exported" in err
    text = target.read_text(encoding="utf-8")
    assert text.startswith(f"# Session {KEY}") and "来週の会議は火曜日です" in text and "/status" in text
    jsonl = tmp_path / "out.jsonl"
    assert (await cli("sessions", "export", KEY, "-o", str(jsonl)))[0] == 0
    types = [json.loads(line)["type"] for line in jsonl.read_text(encoding="utf-8").splitlines()]
    assert types[0] == "run" and types.count("message") == 3
    purged = await cli.json("sessions", "purge", KEY)
    assert purged["tombstone"]["runs"] == 1 and purged["tombstone"]["messages"] == 3
    for path in home.rglob("*"):
        assert not (path.is_file() and b"quarterly" in path.read_bytes()), path
    assert (await cli.json("history", "search", "budget"))["results"][0]["session_key"] == "agent:main:dm:bob"
    code, _, err = await cli("sessions", "export", KEY)
    assert code == 1 and "session_not_found" in err
    # a failed export leaves -o's file as it was (it was truncated, then deleted)
    precious = tmp_path / "precious.md"
    precious.write_text("keep me")
    code, _, err = await cli("sessions", "export", KEY, "-o", str(precious))
    assert code == 1 and "session_not_found" in err and precious.read_text() == "keep me"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link.md"  # as /dev/stdout is: the rename would replace the link itself
    link.symlink_to(precious)
    bad_targets = ((tmp_path / "none" / "x.md", "No such file"), (tmp_path, "folder"), (fifo, "not a regular"),
                   (link, "symbolic link"))  # fmt: skip
    for bad, says in bad_targets:
        code, _, err = await cli("sessions", "export", "agent:main:dm:bob", "-o", str(bad))
        assert code == 1 and err.startswith(f"error: cannot write {bad}") and says in err, err
        assert "Traceback" not in err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink() and precious.read_text() == "keep me"
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert (await cli.json("doctor"))["actions"] == []


async def test_an_export_cut_off_by_the_gateway_is_reported_not_a_traceback(tmp_path: Path) -> None:
    """A chunked answer that stops in the middle raises http.client.IncompleteRead, no OSError:
    it went through the CLI as a traceback."""
    import asyncio as aio

    from gateway.cli_history import _stream_online
    from gateway.client import GatewayClient, Unreachable

    async def cut(reader: aio.StreamReader, writer: aio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        writer.close()

    server = await aio.start_server(cut, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        client = GatewayClient(f"http://127.0.0.1:{port}", timeout_s=5)
        out = (tmp_path / "x").open("wb")
        with out, pytest.raises(Unreachable, match="stopped in the middle"):
            await aio.to_thread(_stream_online, client, "/v1/sessions/k/export", "jsonl", out)
    finally:
        server.close()


def test_a_failed_write_of_the_export_file_is_a_write_error() -> None:
    from gateway.cli_history import _FileOut, _WriteFailed

    with open("/dev/full", "wb", buffering=0) as full, pytest.raises(_WriteFailed, match="No space"):
        _FileOut(full).write(b"x" * 10)
