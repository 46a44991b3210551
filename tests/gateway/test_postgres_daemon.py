"""``neotask gateway`` with ``storage.backend: postgres``, a real daemon process on the suite's
PostgreSQL server: messages posted are read back from the database, the history search finds
Japanese text, ``/readyz`` reports the database; a stopped database answers 503
``storage_unavailable`` with ``Retry-After`` and ``stored: false``, and the same daemon serves again
once the database is back (no restart); the doctor finds it clean; a purge leaves no row of the key
and nothing for the search to find."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import asyncpg
import pytest
import yaml

from tests.gateway.daemons import daemon
from tests.support.postgres import DATABASE, PgServer, empty_database

pytestmark = [pytest.mark.realtime]

KEY = "agent:main:main"
SESSION = f"/v1/sessions/{quote(KEY, safe='')}"


def write_config(path: Path, dsn: str) -> Path:
    path.write_text(yaml.safe_dump({"storage": {"backend": "postgres", "postgres": {"dsn": dsn, "pool_size": 2}}}))
    return path


async def _post(http: aiohttp.ClientSession, url: str, content: str) -> tuple[int, dict[str, Any], str | None]:
    async with http.post(f"{url}{SESSION}/messages", json={"content": content, "reply": False}) as resp:
        return resp.status, await resp.json(), resp.headers.get("Retry-After")


async def test_a_daemon_on_postgres_stores_searches_and_survives_a_database_restart(
    postgres_server: PgServer, tmp_path: Path
) -> None:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    config = write_config(tmp_path / "config.yaml", dsn)
    async with daemon(tmp_path / "home", "--config", str(config)) as gw, aiohttp.ClientSession() as http:
        for text in ("明日の会議は十時から", "the budget review"):
            status, body, _ = await _post(http, gw.url, text)
            assert status in (200, 201, 202), body
        async with http.get(f"{gw.url}{SESSION}") as resp:
            session = await resp.json()
        assert session["message_count"] == 2
        run_id = session["run_id"]
        async with http.get(f"{gw.url}/v1/runs/{run_id}/messages") as resp:
            stored = await resp.json()
        assert [m["content"] for m in stored["messages"]] == ["明日の会議は十時から", "the budget review"]
        conn = await asyncpg.connect(dsn)  # in the database, not in a files home
        try:
            assert await conn.fetchval("SELECT count(*) FROM messages WHERE run_id = $1", run_id) == 2
        finally:
            await conn.close()
        assert not (tmp_path / "home" / "contexts" / "running" / run_id).exists()

        for _ in range(100):  # the index lags the acknowledgement by a batch
            async with http.get(f"{gw.url}/v1/history/search", params={"q": "会議"}) as resp:
                hits = (await resp.json())["results"]
            if hits:
                break
            await asyncio.sleep(0.05)
        assert [(h["session_key"], h["seq"]) for h in hits] == [(KEY, 1)]
        assert "<mark>会議</mark>" in hits[0]["snippet"]

        async with http.get(f"{gw.url}/readyz") as resp:
            assert resp.status == 200, await resp.text()

        await asyncio.to_thread(postgres_server.stop, "fast")
        try:
            status, body, retry_after = await _post(http, gw.url, "lost?")
            assert status == 503, body
            assert body["error"]["code"] == "storage_unavailable" and body["error"]["stored"] is False
            assert retry_after is not None and int(retry_after) >= 1
            async with http.get(f"{gw.url}/readyz") as resp:
                ready = await resp.json()
            assert resp.status == 503 and ready["checks"]["store_writable"] is False
            assert "database" in ready["problems"]["store_writable"]
        finally:
            await asyncio.to_thread(postgres_server.start)

        for _ in range(100):  # the pool reconnects by itself
            status, body, _ = await _post(http, gw.url, "back again")
            if status != 503:
                break
            await asyncio.sleep(0.1)
        assert status in (200, 201, 202), body
        async with http.get(f"{gw.url}/v1/runs/{run_id}/messages") as resp:
            contents = [m["content"] for m in (await resp.json())["messages"]]
        assert contents == ["明日の会議は十時から", "the budget review", "back again"]  # "lost?" never stored
        async with http.get(f"{gw.url}/readyz") as resp:
            assert resp.status == 200, await resp.text()

        async with http.post(f"{gw.url}/v1/admin/doctor") as resp:
            assert resp.status == 200 and (await resp.json())["actions"] == [], await resp.text()
        async with http.delete(f"{gw.url}{SESSION}", params={"purge": "true"}) as resp:
            purged = await resp.json()
        assert purged["purged"] is True and purged["tombstone"]["messages"] == 3, purged
        async with http.get(f"{gw.url}/v1/history/search", params={"q": "会議"}) as resp:
            assert (await resp.json())["results"] == []
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval("SELECT count(*) FROM runs") == 0
            assert await conn.fetchval("SELECT count(*) FROM history") == 0
            assert await conn.fetchval("SELECT count(*) FROM purge_tombstones WHERE session_key = $1", KEY) == 1
        finally:
            await conn.close()
    log = gw.stderr()
    assert f"backend postgres {dsn}" in log  # the start-up line names the database
    assert "ERROR" not in log, log  # (asyncpg's own pool warning while the server was down is expected)
