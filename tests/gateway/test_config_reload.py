"""``POST /v1/admin/config/reload`` in-process (issue 29 item 3): a changed model, a new binding and
agent, a new token, a new cron job come in force at once; keys that need a restart are named and
keep their running value; an invalid file changes nothing and says what is wrong;
``GET /v1/admin/config`` shows what is in force and since when."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from config.loader import load_config
from config.settings import Settings
from gateway import exits
from gateway import keys as K
from gateway.app import create_app
from gateway.cli import main
from gateway.reload import in_force, needs_restart
from home.lock import HomeLock
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


# -- `neotask config reload`: the token it sends ------------------------------------------------------


@contextlib.contextmanager
def daemon_files(home: Path, client: Client, config_path: Path) -> Iterator[None]:
    """What a daemon serving ``client`` leaves on its home for the CLI: the held lock and
    ``gateway.json`` naming its URL and the file it reloads."""
    info = {"pid": os.getpid(), "url": str(client.make_url("")), "config_path": str(config_path)}
    with HomeLock(home / "gateway.lock"):
        (home / "gateway.json").write_text(json.dumps(info))
        yield


@pytest.fixture
def no_neotask_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("NEOTASK_")]:
        monkeypatch.delenv(name)


async def _reload_cli(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["config", "reload", "--home", str(home), "--wait-start", "0", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.usefixtures("no_neotask_env")
async def test_config_reload_sends_the_token_of_the_file_it_reloads(
    client: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broken file with tokens configured: the CLI sent no token and printed "unauthorized"
    instead of what is wrong with the file. Now the token comes from the file even when another
    key is wrong (the gateway names the key), a file that gives none is an error naming why and
    the way on, and a rotation that lists the new token first still authenticates."""
    config = tmp_path / "config.yaml"
    before = await _config(client)
    with daemon_files(tmp_path, client, config):
        config.write_text(BASE + "bogus_key: 1\n")
        code, out, err = await _reload_cli(capsys, tmp_path)
        assert (code, out) == (exits.FAILED, "") and err.startswith("error: config_rejected:"), err
        assert "bogus_key" in err

        config.write_text("gateway: {tokens: [first-token]\nagents: [\n")  # not YAML at all: no token to read
        code, out, err = await _reload_cli(capsys, tmp_path)
        assert (code, out) == (exits.FAILED, ""), err
        assert err.startswith(f"error: unauthorized: the gateway needs a token and {config} gives none"), err
        assert "not valid YAML" in err and "--token" in err and f"kill -HUP {os.getpid()}" in err
        code, _, err = await _reload_cli(capsys, tmp_path, "--token", "first-token")
        assert code == exits.FAILED and err.startswith("error: config_rejected:") and "not valid YAML" in err

        config.write_text(BASE.replace("[first-token]", "[rotated-token]"))  # the gateway knows only first-token
        code, _, err = await _reload_cli(capsys, tmp_path)
        assert code == exits.FAILED and f"refused the gateway.tokens of {config}" in err and "--token" in err, err
        assert await _config(client) == before  # nothing was reloaded by any of these

        config.write_text(BASE.replace("[first-token]", "[rotated-token, first-token]"))
        code, out, err = await _reload_cli(capsys, tmp_path)
        assert code == exits.OK and out.startswith("reloaded: 1 change(s) in force"), err
    resp = await client.get("/v1/sessions", headers={"Authorization": "Bearer rotated-token"})
    assert resp.status == 200


@pytest.mark.usefixtures("no_neotask_env")
async def test_config_reload_reads_the_file_the_gateway_named(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gateway.json`` names the file the gateway reloads (its ``--config``): the CLI takes the
    token there, not from ``<home>/config.yaml``, which a gateway started so does not have."""
    elsewhere = tmp_path.parent / f"{tmp_path.name}-etc.yaml"
    elsewhere.write_text(BASE)
    app = create_app(load_config(env={}, home=tmp_path, config_path=elsewhere), clock=clock, env={})
    client = await aiohttp_client(app)
    with daemon_files(tmp_path, client, elsewhere):
        code, out, err = await _reload_cli(capsys, tmp_path)
    assert code == exits.OK and out.startswith("reloaded: nothing changed"), err
