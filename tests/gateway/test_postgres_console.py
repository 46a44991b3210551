"""The console on ``storage.backend: postgres`` (issue 28 item 5): every route the pages of
``/ui`` read answers for every run of a database (an archived run, an active one with a tool call
and a plan, a compacted one), exports and backups included; a purge through the API leaves
nothing of the key in the history search, the usage, the runs or the exports. In headless
Chromium, on a daemon whose store is PostgreSQL, the sessions list filters and the session page
shows the transcript, the tool calls and the plans, with no console error."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from config.clock import system_clock
from sessions.copying import FilesEnd, PostgresEnd, copy
from tests.gateway.helpers import make_app
from tests.gateway.test_console import (
    Console,
    browser,  # noqa: F401 (the fixture)
    needs_chromium,
    scenario_list,
    scenario_session,
    seed,
    start,
    wait_ready,
)
from tests.gateway.test_storage_copy import KEYS, _seed
from tests.support.postgres import DATABASE, PgServer, empty_database

pytestmark = [pytest.mark.realtime]

PAGES = ("/ui", "/ui/app.js", "/v1/sessions", "/v1/runs", "/v1/usage", "/v1/admin/backups", "/v1/admin/config",
         "/v1/channels", "/v1/memory/status", "/v1/scheduler/jobs", "/readyz", "/healthz")  # fmt: skip
SESSION_TAILS = ("", "/context", "/export", "/export?format=md")
RUN_TAILS = ("", "/messages", "/summaries", "/tools", "/planning", "/export", "/export?format=md")


async def test_the_console_routes_on_postgres(postgres_server: PgServer, tmp_path: Path, aiohttp_client: Any) -> None:
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    await _seed(tmp_path / "seed")
    await copy(FilesEnd(tmp_path / "seed"), PostgresEnd(dsn))
    app = make_app(tmp_path / "home", system_clock, {"storage": {"backend": "postgres", "postgres": {"dsn": dsn}}})
    client = await aiohttp_client(app)
    runs = (await (await client.get("/v1/runs")).json())["runs"]
    assert len(runs) == 3
    paths = [*PAGES, "/v1/history/search?q=%E4%BC%9A%E8%AD%B0"]
    paths += [f"/v1/sessions/{quote(key, safe='')}{tail}" for key in KEYS for tail in SESSION_TAILS]
    paths += [f"/v1/runs/{run['uuid']}{tail}" for run in runs for tail in RUN_TAILS]
    for path in paths:
        resp = await client.get(path)
        assert resp.status == 200, (path, await resp.text())
        await resp.read()
    resp = await client.post("/v1/admin/doctor", json={"fix": False})
    assert resp.status == 200 and (await resp.json())["actions"] == []

    live = KEYS[1]
    usage = await (await client.get("/v1/usage")).json()
    assert live in str(usage)
    resp = await client.delete(f"/v1/sessions/{quote(live, safe='')}?purge=true")
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["tombstone"]["runs"] == 1
    found = await (await client.get("/v1/history/search?q=hello")).json()
    assert found["results"] and all(hit["session_key"] != live for hit in found["results"])
    assert live not in str(await (await client.get("/v1/usage")).json())
    assert live not in str(await (await client.get("/v1/runs")).json())
    gone = await client.get(f"/v1/sessions/{quote(live, safe='')}/export")
    assert gone.status == 404 and (await gone.json())["error"]["code"] == "session_not_found"


class PgConsole(Console):
    async def shot(self, name: str) -> None:  # beside the files backend's screenshots, not over them
        await super().shot(f"postgres-{name}")


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(180)
@needs_chromium
async def test_the_console_pages_on_a_postgres_daemon(postgres_server: PgServer, tmp_path: Path, browser: Any) -> None:  # noqa: F811
    dsn = await postgres_server.database(DATABASE)
    await empty_database(dsn)
    async with start(tmp_path / "home", {"storage": {"backend": "postgres", "postgres": {"dsn": dsn}}}) as server:
        await wait_ready(server.url)
        await seed(server.url)
        console = PgConsole(await browser.new_page(viewport={"width": 1280, "height": 900}))
        await scenario_list(console, server.url)
        await scenario_session(console)
        assert console.errors == []
        await console.page.close()
