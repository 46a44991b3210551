"""A live reload (``POST /v1/admin/config/reload``) and issue 29 item 5: the daily budgets and
``GET /v1/usage``'s ``limits`` follow the reloaded file at once, and an agent whose model or
fallbacks changed gets a new chain of models (``conversations.fallbacks.ModelChain``), not a bare client
without its fallbacks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from config.loader import load_config
from conversations.fallbacks import ModelChain
from gateway import keys as K
from gateway.app import create_app
from tests.conftest import FakeClock
from tests.gateway.conftest import Client
from tests.sessions.helpers import start

BASE = """
gateway: {tokens: [the-token]}
agents:
  main:
    model: {base_url: "http://127.0.0.1:9/v1", name: model-a}
"""
LIMITED = """
gateway: {tokens: [the-token]}
agents:
  main:
    model:
      base_url: "http://127.0.0.1:9/v1"
      name: model-a
      fallbacks: [{name: model-b}]
    limits: {tokens_per_day: 100}
"""
AUTH = {"Authorization": "Bearer the-token"}


@pytest.fixture
def gateway_app(tmp_path: Path, clock: FakeClock) -> web.Application:
    (tmp_path / "config.yaml").write_text(BASE)
    return create_app(load_config(env={}, home=tmp_path), clock=clock, env={})


async def _limits(client: Client) -> dict[str, Any]:
    resp = await client.get("/v1/usage", headers=AUTH)
    assert resp.status == 200, await resp.text()
    body: dict[str, Any] = (await resp.json())["limits"]
    return body


async def test_budgets_usage_limits_and_fallbacks_follow_a_reload(client: Client, tmp_path: Path) -> None:
    services = client.app[K.SERVICES]
    run = await start(services.store, "agent:main:main")
    await services.store.add_usage(run, {"input_tokens": 120, "output_tokens": 30})
    assert (await _limits(client))["main"]["tokens_per_day"] is None
    assert len(services.providers["main"].links) == 1

    (tmp_path / "config.yaml").write_text(LIMITED)
    resp = await client.post("/v1/admin/config/reload", headers=AUTH)
    assert resp.status == 200, await resp.text()
    assert "agents.main.limits.tokens_per_day" in (await resp.json())["changed"]

    assert (await _limits(client))["main"] == {"tokens_per_day": 100, "tokens_per_key_per_day": None}
    chain = services.providers["main"]
    assert isinstance(chain, ModelChain)
    assert [link.provider.settings.name for link in chain.links] == ["model-a", "model-b"]
    resp = await client.post("/v1/sessions/agent%3Amain%3Amain/messages", json={"content": "hi"}, headers=AUTH)
    assert resp.status == 429, await resp.text()
    error = (await resp.json())["error"]
    assert error["code"] == "token_budget_exhausted" and error["stored"] is False  # a client knows to send again
