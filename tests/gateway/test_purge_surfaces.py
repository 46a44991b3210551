"""Issue 24 item 1: a purge erases a key whatever surface made it. For keys made through the native
API, channel ingress, a webhook, ``/v1/chat/completions`` and ``/v1/responses``: after the purge no
file under the home holds the user's text, no table of tasks.db or history.db (tombstones
excepted) holds a row of the key, and the OpenAI routes remember nothing of it (a resent chat
completion asks the model again in a new run; a purged response id cannot be continued)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient

from channels.webhooks import sign
from gateway import keys as K
from tests.conftest import FakeClock
from tests.gateway.helpers import Cli, make_app
from tests.support.openai_server import OpenAIServer

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

Client = TestClient[Any, Any]
TOKEN = "zqxpurgeword42"
SECRET = "purge-hook-secret"
CONFIG = {
    "gateway": {"openai_compat": {"enabled": True}},
    "hooks": {"ping": {"secret_env": "PING_SECRET", "key_template": "hook:ping:${id}", "message_template": "${text}"}},
}
SURFACES = ("native", "ingress", "webhook", "chat_completions", "responses")


async def replayed_events(client: Client) -> bytes:
    """What ``GET /v1/events`` replays to a client reconnecting with ``Last-Event-ID: 0``."""
    resp = await client.get("/v1/events", headers={"Last-Event-ID": "0"})
    data = b""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0.5):
            async for chunk in resp.content.iter_any():
                data += chunk
    resp.close()
    return data


def files_with(home: Path, needle: bytes) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file() and needle in p.read_bytes())


def rows_of_key(db: Path, key: str) -> dict[str, int]:
    """Rows naming ``key`` in any text column of any table of ``db`` (tombstones excepted)."""
    conn = sqlite3.connect(db)
    try:
        found = {}
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            if table == "tombstones" or table.startswith("fts"):
                continue
            columns = [c[1] for c in conn.execute(f'PRAGMA table_info("{table}")')]
            where = " OR ".join(f'CAST("{c}" AS TEXT) LIKE ?' for c in columns)
            count = conn.execute(f'SELECT count(*) FROM "{table}" WHERE {where}', [f"%{key}%"] * len(columns))
            if n := count.fetchone()[0]:
                found[table] = n
        return found
    finally:
        conn.close()


async def made_by(surface: str, client: Client, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """Two exchanges on a key made through ``surface``; the key and what to resend afterwards."""
    text = f"my secret is {TOKEN}"
    if surface == "native":
        key = "agent:main:dm:purgee"
        path = f"/v1/sessions/{quote(key, safe='')}/messages"
        for i in range(2):
            resp = await client.post(path, json={"content": f"{text} {i}", "client_message_id": f"n{i}"})
            assert resp.status == 200, await resp.text()
        return key, {}
    if surface == "ingress":
        for i in range(2):
            body = {"channel": "telegram", "chat_type": "direct", "chat_id": "c1", "sender_id": "u1",
                    "text": f"{text} {i}", "client_message_id": f"t{i}"}  # fmt: skip
            resp = await client.post("/v1/messages", json=body)
            assert resp.status == 200, await resp.text()
        return str((await resp.json())["session_key"]), {}
    if surface == "webhook":
        for i in range(2):
            raw = json.dumps({"id": "p1", "text": f"{text} {i}"}).encode()
            headers = {"Content-Type": "application/json", "X-Hub-Signature-256": sign(SECRET.encode(), raw),
                       "X-GitHub-Delivery": f"delivery-{i}"}  # fmt: skip
            resp = await client.post("/hooks/ping", data=raw, headers=headers)
            assert resp.status == 202, await resp.text()
            await client.app[K.WEBHOOKS].idle()
        return "hook:ping:p1", {}
    if surface == "chat_completions":
        history = [{"role": "user", "content": f"{text} 0"}]
        first = await client.post("/v1/chat/completions", json={"model": "main", "user": "purgee", "messages": history})
        assert first.status == 200, await first.text()
        history += [{"role": "assistant", "content": f"echo: {text} 0"}, {"role": "user", "content": f"{text} 1"}]
        call = {"model": "main", "user": "purgee", "messages": history}
        second = await client.post("/v1/chat/completions", json=call)
        assert second.status == 200
        return "agent:main:openai:dm:purgee", {"call": call, "run_id": second.headers["X-Neotask-Run-Id"]}
    assert surface == "responses"
    first = await client.post("/v1/responses", json={"model": "main", "user": "purgee", "input": f"{text} 0"})
    assert first.status == 200, await first.text()
    previous = (await first.json())["id"]
    second = await client.post(
        "/v1/responses", json={"model": "main", "input": f"{text} 1", "previous_response_id": previous}
    )
    assert second.status == 200, await second.text()
    return "agent:main:openai:dm:purgee", {"response_id": (await second.json())["id"]}


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_purge_leaves_nothing_of_a_key_whatever_made_it(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, openai_server: OpenAIServer, surface: str
) -> None:
    app = make_app(tmp_path, clock, CONFIG, base_url=openai_server.base_url, env={"PING_SECRET": SECRET})
    client = await aiohttp_client(app)
    kept = await client.post("/v1/sessions/agent%3Amain%3Adm%3Akeeper/messages", json={"content": "this one stays"})
    assert kept.status == 200
    key, resend = await made_by(surface, client, tmp_path)
    assert files_with(tmp_path, TOKEN.encode()), "the text was stored"
    assert TOKEN.encode() in await replayed_events(client)
    resp = await client.delete(f"/v1/sessions/{quote(key, safe='')}", params={"purge": "true"})
    assert resp.status == 200, await resp.text()
    await client.app[K.HISTORY].flush()
    assert files_with(tmp_path, TOKEN.encode()) == []
    for db in ("tasks.db", "history.db"):
        assert rows_of_key(tmp_path / "contexts" / db, key) == {}, db
    assert files_with(tmp_path, b"this one stays")
    events = await replayed_events(client)
    assert TOKEN.encode() not in events and b"this one stays" in events
    if "call" in resend:  # the purged answer is not replayed: the model is asked again, in a new run
        asked = len(openai_server.chat_requests)
        again = await client.post("/v1/chat/completions", json=resend["call"])
        assert again.status == 200
        assert len(openai_server.chat_requests) == asked + 1
        assert again.headers["X-Neotask-Run-Id"] != resend["run_id"]
    if "response_id" in resend:
        body = {"model": "main", "input": "go on", "previous_response_id": resend["response_id"]}
        gone = await client.post("/v1/responses", json=body)
        assert gone.status == 404 and (await gone.json())["error"]["code"] == "response_not_found"


async def test_the_offline_cli_purges_an_openai_key(
    aiohttp_client: Any,
    tmp_path: Path,
    clock: FakeClock,
    openai_server: OpenAIServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    app = make_app(tmp_path, clock, CONFIG, base_url=openai_server.base_url, env={"PING_SECRET": SECRET})
    client = await aiohttp_client(app)
    key, _ = await made_by("chat_completions", client, tmp_path)
    await made_by("responses", client, tmp_path)
    await client.close()
    code, _, err = await Cli(capsys, tmp_path)("sessions", "purge", key)
    assert code == 0, err
    assert files_with(tmp_path, TOKEN.encode()) == []
    assert rows_of_key(tmp_path / "contexts" / "tasks.db", key) == {}
