"""GET /v1/memory/files and /v1/memory/files/{path} walk and read the workspace off the event loop
(SPEC section 2: blocking file work never runs on the loop thread). A slow disk is simulated by
slowing the service's file methods; the suite's loop guard fails the test if a handler waits on them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway.keys import MEMORY
from tests.gateway.conftest import Client

SLOW_S = 1.3  # longer than tests/conftest.py BLOCKING_LIMIT_S


@pytest.fixture
def gateway_app(gateway_app: web.Application, tmp_path: Path) -> web.Application:
    workspace = tmp_path / "workspaces/main"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("# Facts\n\nThe sky is blue.\n", encoding="utf-8")
    return gateway_app


@pytest.fixture
async def client(client: Client) -> Client:
    # the first index pass loads the embedding model; closing during that load blocks. Up to 120 s:
    # under a loaded make test the load took over the 30 s this waited before (an error at teardown)
    deadline = time.monotonic() + 120
    while (await client.get("/readyz")).status != 200:
        assert time.monotonic() < deadline, "the memory index was not ready within 120 s"
        await asyncio.sleep(0.05)
    return client


def slowed(function: Any) -> Any:
    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SLOW_S)
        return function(*args, **kwargs)

    return slow


async def test_listing_memory_files_does_not_block_the_loop(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    service = client.app[MEMORY]
    monkeypatch.setattr(service, "list_files", slowed(service.list_files))
    resp = await client.get("/v1/memory/files")
    assert resp.status == 200, await resp.text()
    assert [f["path"] for f in (await resp.json())["files"]] == ["MEMORY.md"]


async def test_reading_a_memory_file_does_not_block_the_loop(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    service = client.app[MEMORY]
    monkeypatch.setattr(service, "read_file", slowed(service.read_file))
    resp = await client.get("/v1/memory/files/MEMORY.md")
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["text"].startswith("# Facts")
    missing = await client.get("/v1/memory/files/memory/2026-01-01.md")
    assert missing.status == 404 and (await missing.json())["error"]["code"] == "memory_file_not_found"
