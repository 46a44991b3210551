"""The gateway tests' one ``client``: an aiohttp test client over a gateway app on a tmp home.

A module shapes it by overriding a fixture of the same name, pytest's way: ``gateway_overrides``
(config merged over the defaults), ``gateway_base_url`` (a model: the local OpenAI-compatible
server's URL), ``gateway_app`` (taking the shared one, e.g. to add a route or seed a workspace) or
``client`` itself (taking the shared one, e.g. to post a first message).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from gateway import keys as K
from tests.conftest import FakeClock
from tests.gateway import answer_check
from tests.gateway.helpers import make_app

Client = TestClient[Any, Any]


@pytest.fixture
def gateway_overrides() -> dict[str, Any] | None:
    return None


@pytest.fixture
def gateway_base_url() -> str | None:
    return None


@pytest.fixture
def gateway_app(
    tmp_path: Path, clock: FakeClock, gateway_overrides: dict[str, Any] | None, gateway_base_url: str | None
) -> web.Application:
    return answer_check.install(make_app(tmp_path, clock, gateway_overrides, base_url=gateway_base_url))


@pytest.fixture
async def client(aiohttp_client: Any, gateway_app: web.Application) -> AsyncIterator[Client]:
    """The test client; at teardown, every JSON answer it got must match ``/openapi.json``."""
    result: Client = await aiohttp_client(gateway_app)
    yield result
    mismatches = gateway_app.get(answer_check.MISMATCHES, [])
    assert not mismatches, "answers that /openapi.json does not describe:\n" + "\n".join(dict.fromkeys(mismatches))


async def settled(client: Client) -> None:
    """Wait until what earlier requests queued for the disk (an ``.opening`` marker's removal,
    sessions.json) is written, so a digest of the home taken next is stable."""
    store = client.app[K.STORE]
    await store.writer.call(lambda: None)
    await store.registry.flush()


async def with_active_run(client: Client, path: str) -> Client:
    """``client`` after one stored message on ``path``: an active run that bad bodies could touch,
    settled so that a digest of the home taken next is stable."""
    ok = await client.post(path, json={"content": "first"})
    assert ok.status == 200
    await settled(client)
    return client
