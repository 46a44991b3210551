"""``POST /v1/admin/config/reload`` in-process (issue 29 item 3): a changed model, a new binding and
agent, a new token, a new cron job come in force at once; keys that need a restart are named and
keep their running value; an invalid file changes nothing and says what is wrong;
``GET /v1/admin/config`` shows what is in force and since when."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from config.loader import load_config
from config.settings import Settings
from gateway import keys as K
from gateway.app import create_app
from gateway.reload import in_force, needs_restart
from tests.conftest import FakeClock
from tests.gateway.conftest import Client

BASE = """
gateway: {tokens: [first-token]}
agents:
  main:
    model: {base_url: "http://127.0.0.1:9/v1", name: model-a}
"""
CHANGED = """
gateway: {tokens: [first-token, second-token], port: 9999}
agents:
  main:
    model: {base_url: "http://127.0.0.1:9/v1", name: model-b}
  helper: {}
bindings: [{channel: telegram, chat_id: "-100", agent: helper}]
session: {reset: {mode: idle, idle_minutes: 30}}
cron: {jobs: [{id: nightly, schedule: "0 1 * * *", message: "report"}]}
memory: {search: {top_k: 3}}
"""
AUTH = {"Authorization": "Bearer first-token"}


@pytest.fixture
def gateway_app(tmp_path: Path, clock: FakeClock) -> web.Application:
    (tmp_path / "config.yaml").write_text(BASE)
    return create_app(load_config(env={}, home=tmp_path), clock=clock, env={})


async def _config(client: Client) -> dict[str, Any]:
    resp = await client.get("/v1/admin/config", headers=AUTH)
    assert resp.status == 200
    body: dict[str, Any] = await resp.json()
    return body


async def test_a_reload_puts_the_new_file_in_force(client: Client, tmp_path: Path, clock: FakeClock) -> None:
    before = await _config(client)
    assert before["reloads"] == 0 and before["settings"]["agents"]["main"]["model"]["name"] == "model-a"
    (tmp_path / "config.yaml").write_text(CHANGED)
    clock.advance(minutes=5)
    resp = await client.post("/v1/admin/config/reload", headers=AUTH)
    assert resp.status == 200, await resp.text()
    answer = await resp.json()
    assert answer["reloaded"] is True and answer["restart_required"] == ["gateway.port"]
    assert "agents.main.model.name" in answer["changed"] and "bindings" in answer["changed"]
    after = await _config(client)
    assert after["since"] > before["since"] and after["reloads"] == 1
    settings = after["settings"]
    assert settings["agents"]["main"]["model"]["name"] == "model-b" and "helper" in settings["agents"]
    assert settings["gateway"]["tokens"] == ["***", "***"] or all(
        t != "second-token" for t in settings["gateway"]["tokens"]
    )
    assert client.app[K.CONFIG].settings.gateway.port == 8787  # needs a restart: the running value stays
    services = client.app[K.SERVICES]
    assert services.providers["main"].settings.name == "model-b"
    assert services.conversations.settings is client.app[K.CONFIG].settings  # the engine sees the new file
    assert services.scheduling.settings is client.app[K.CONFIG].settings
    assert services.memory is None or services.memory.settings.search.top_k == 3
    assert "helper" in services.conversations.compactors
    jobs = await (await client.get("/v1/scheduler/jobs", headers=AUTH)).json()
    assert "cron:nightly" in {job["id"] for job in jobs["jobs"]}
    resp = await client.get("/v1/sessions", headers={"Authorization": "Bearer second-token"})
    assert resp.status == 200  # the new token works at once
    resp = await client.post(
        "/v1/messages",
        headers=AUTH,
        json={"channel": "telegram", "chat_type": "group", "chat_id": "-100", "sender_id": "u1", "text": "hi",
              "reply": False},
    )  # fmt: skip
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["session_key"].startswith("agent:helper:")  # the new binding routes


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("agents: {main: {model: {nmae: x}}}\n", "nmae"),
        ("session: {dm_scope: everyone}\n", "dm_scope"),
        ("gateway: [unclosed\n", "config.yaml"),
        ("cron: {jobs: [{id: x, schedule: 'every day', message: m}]}\n", "schedule"),
    ],
)
async def test_an_invalid_file_changes_nothing(client: Client, tmp_path: Path, text: str, named: str) -> None:
    before = await _config(client)
    (tmp_path / "config.yaml").write_text(text)
    resp = await client.post("/v1/admin/config/reload", headers=AUTH)
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["code"] == "config_rejected" and named in error["message"] and "nothing changed" in error["message"]
    assert await _config(client) == before


async def test_an_unchanged_file_changes_nothing(client: Client) -> None:
    before = await _config(client)
    resp = await client.post("/v1/admin/config/reload", headers=AUTH)
    assert resp.status == 200
    assert (await resp.json())["changed"] == []
    assert (await _config(client))["since"] == before["since"]


def test_which_keys_need_a_restart() -> None:
    assert needs_restart("gateway.port") and needs_restart("storage.fsync") and needs_restart("memory.embedding.model")
    assert not needs_restart("gateway.tokens") and not needs_restart("agents.main.model.name")
    assert not needs_restart("memory.search.top_k") and not needs_restart("cron.jobs")
    old = Settings.model_validate({"gateway": {"tokens": ["a"]}})
    new = Settings.model_validate({"gateway": {"port": 1234}})
    settings, live, restart = in_force(old, new)
    assert sorted(restart) == ["gateway.port", "gateway.tokens"] and live == []
    assert settings.gateway.tokens == ("a",) and settings.gateway.port == 8787  # emptying tokens: at a restart


async def test_a_reload_restarts_the_channels_with_new_accounts(client: Client, tmp_path: Path) -> None:
    resp = await client.get("/v1/channels", headers=AUTH)
    assert resp.status == 200 and "ops" not in await resp.text()
    (tmp_path / "config.yaml").write_text(
        BASE + "channels: {telegram: {accounts: {ops: {token_env: OPS_BOT_TOKEN}}}}\n"
    )
    resp = await client.post("/v1/admin/config/reload", headers=AUTH)
    assert resp.status == 200, await resp.text()
    assert any(path.startswith("channels.telegram.accounts") for path in (await resp.json())["changed"])
    resp = await client.get("/v1/channels", headers=AUTH)
    text = await resp.text()
    assert resp.status == 200 and "ops" in text and "OPS_BOT_TOKEN is not set" in text  # the new account, judged
