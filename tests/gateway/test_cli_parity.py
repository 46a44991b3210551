"""The CLI gives the same outcome online (a real daemon on the home: it calls the API) and offline
(the daemon stopped: it opens the same object graph under the home lock), on the same home: a
reset writes the final summary the next run inherits, a compaction runs the memory flush, a cron
job delivers to ``deliver_to`` and offers the memory tools, ``sessions list`` shows the same token
figures, the doctor finds the same things and exits non-zero on errors, ``config show`` says whose
configuration it shows, ``config check`` refuses what the daemon refuses."""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import yaml
from aiohttp import web

from conversations.turns import FLUSH_PROMPT
from tests.gateway.daemons import child_env, daemon, start_daemon
from tests.gateway.helpers import Cli
from tests.support.openai_server import OpenAIServer, RecordedRequest, reply, tool_call

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), pytest.mark.realtime]


@pytest.fixture(autouse=True)
def _no_neotask_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [n for n in os.environ if n.startswith("NEOTASK_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("NEOTASK_MEMORY__WATCH__POLL_SECONDS", "3600")
    yield


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], home: Path) -> Cli:
    return Cli(capsys, home)


@pytest.fixture
async def model() -> AsyncIterator[OpenAIServer]:
    async with OpenAIServer() as server:
        yield server


class Receiver:
    """A ``deliver_to`` endpoint recording the bodies POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        return web.json_response({"ok": True})


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/deliver", rec.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    rec.url = f"http://127.0.0.1:{port}/deliver"
    try:
        yield rec
    finally:
        await runner.cleanup()


def write_config(home: Path, server: OpenAIServer, **extra: Any) -> None:
    config: dict[str, Any] = {
        "agents": {"main": {"model": {"base_url": server.base_url, "name": "test-model", "max_retries": 0}}},
        "memory": {"embedding": {"provider": "openai", "model": "test-embed", "base_url": server.base_url}},
        "compaction": {"keep_recent": 2, "min_to_compress": 1},
    }
    config.update(extra)
    (home / "config.yaml").write_text(yaml.safe_dump(config))


async def post(url: str, key: str, content: str) -> dict[str, Any]:
    target = f"{url}/v1/sessions/{quote(key, safe='')}/messages"
    async with aiohttp.ClientSession() as session, session.post(target, json={"content": content}) as r:
        assert r.status == 200, await r.text()
        body: dict[str, Any] = await r.json()
        return body


def entry(home: Path, key: str) -> dict[str, Any]:
    sessions = json.loads((home / "contexts" / "sessions.json").read_text())
    found: dict[str, Any] = (sessions.get("sessions") or sessions)[key]
    return found


def final_summary(home: Path, run_id: str) -> str:
    return (home / "contexts" / "completed" / run_id / "final_summary.txt").read_text()


def env_for(server: OpenAIServer) -> dict[str, str]:
    return child_env(OPENAI_API_KEY="test")


# -- 1. sessions reset: the final summary the next run inherits -------------------------------------


async def test_reset_writes_the_final_summary_online_and_offline(cli: Cli, home: Path, model: OpenAIServer) -> None:
    write_config(home, model)
    async with daemon(home, env=env_for(model)) as running:
        online = (await post(running.url, "agent:main:dm:online", "the sky is teal"))["run_id"]
        offline = (await post(running.url, "agent:main:dm:offline", "the sea is amber"))["run_id"]
        body = await cli.json("sessions", "reset", "agent:main:dm:online")
        assert body["completed_run_id"] == online
        assert await running.stop() == 0
    body = await cli.json("sessions", "reset", "agent:main:dm:offline")
    assert body["completed_run_id"] == offline
    for key, run_id in (("agent:main:dm:online", online), ("agent:main:dm:offline", offline)):
        text = final_summary(home, run_id)
        assert "(summarizer: llm:test-model)" in text, text
        assert entry(home, key)["inherit_next"] is True
    # the next run of each key opens with the previous run's summary
    async with daemon(home, env=env_for(model)) as running:
        for key, run_id in (("agent:main:dm:online", online), ("agent:main:dm:offline", offline)):
            answer = await post(running.url, key, "and now?")
            assert any(e["type"] == "inheritance" and e["from_run_id"] == run_id for e in answer["events"]), answer


# -- 2. sessions compact: the memory flush ------------------------------------------------------------


def flush_rule(request: RecordedRequest) -> Any:
    if not request.tool_names and request.last_user_text.startswith("Messages:"):  # the summarizer
        return reply("A short summary.")
    if request.last_user_text != FLUSH_PROMPT:
        return None
    said = " ".join(str(m.get("content") or "") for m in request.messages if m.get("role") == "user")
    marker = "online-fact" if "online" in said else "offline-fact"
    return tool_call("memory_append", {"text": f"remember the {marker}"})


async def test_compact_runs_the_memory_flush_online_and_offline(cli: Cli, home: Path, model: OpenAIServer) -> None:
    write_config(home, model)
    model.add_rule(flush_rule)
    async with daemon(home, env=env_for(model)) as running:
        for key in ("agent:main:dm:online", "agent:main:dm:offline"):
            for n in range(3):
                await post(running.url, key, f"note {n} of {key.split(':')[-1]}: " + "a long line of detail " * 20)
        body = await cli.json("sessions", "compact", "agent:main:dm:online")
        assert any(e["type"] == "compaction" for e in body["events"]), body
        assert await running.stop() == 0
    body = await cli.json("sessions", "compact", "agent:main:dm:offline")
    assert any(e["type"] == "compaction" for e in body["events"]), body
    for peer in ("online", "offline"):  # each peer's flush goes to that peer's memory scope
        logs = list((home / "workspaces" / "main" / "memory" / "scopes").glob(f"dm-{peer}-*/*.md"))
        assert f"remember the {peer}-fact" in "".join(p.read_text() for p in logs)
    flushes = [r for r in model.chat_requests if r.last_user_text == FLUSH_PROMPT]
    assert len(flushes) == 2 and all("memory_append" in r.tool_names for r in flushes)


# -- 3. cron run: delivery and the memory tools -------------------------------------------------------


async def test_cron_run_delivers_and_offers_memory_tools_online_and_offline(
    cli: Cli, home: Path, model: OpenAIServer, receiver: Receiver
) -> None:
    job = {"id": "nightly", "schedule": "0 3 * * *", "message": "tick", "deliver_to": receiver.url}
    write_config(home, model, cron={"jobs": [job]})
    async with daemon(home, env=env_for(model)) as running:
        assert (await cli.json("cron", "run", "nightly"))["ran"] is True
        assert await running.stop() == 0
    online_tools = model.chat_requests[-1].tool_names
    assert (await cli.json("cron", "run", "nightly"))["ran"] is True
    offline_tools = model.chat_requests[-1].tool_names
    assert "memory_search" in online_tools and "memory_append" in online_tools
    assert sorted(offline_tools) == sorted(online_tools)
    assert len(receiver.bodies) == 2
    for body in receiver.bodies:
        assert body["session_key"] == "cron:nightly" and body["reply"]["content"] == "echo: tick"


# -- 4. sessions list: the same token figures --------------------------------------------------------


async def test_sessions_list_shows_the_same_tokens_online_and_offline(
    cli: Cli, home: Path, model: OpenAIServer
) -> None:
    write_config(home, model)
    async with daemon(home, env=env_for(model)) as running:
        await post(running.url, "agent:main:main", "hello there")
        online = (await cli.json("sessions", "list"))["sessions"]
        shown_online = await cli.json("sessions", "show", "agent:main:main")
        assert await running.stop() == 0
    offline = (await cli.json("sessions", "list"))["sessions"]
    shown_offline = await cli.json("sessions", "show", "agent:main:main")
    assert [s["tokens"] for s in offline] == [s["tokens"] for s in online]
    assert shown_offline["tokens"] == shown_online["tokens"]
    assert online[0]["tokens"]["context"] > 100  # the system prompt and the tool schemas count


# -- 5. doctor: the same findings, and a non-zero exit on errors --------------------------------------


def drop_row(home: Path, run_id: str) -> None:
    with sqlite3.connect(home / "contexts" / "tasks.db") as conn:
        conn.execute("DELETE FROM tasks WHERE uuid = ?", (run_id,))


async def test_doctor_finds_the_same_online_and_offline(cli: Cli, home: Path) -> None:
    (home / "config.yaml").write_text("{}\n")
    async with daemon(home) as running:
        run_id = (await post(running.url, "agent:main:main", "hi"))["run_id"]
        await cli.json("sessions", "reset", "agent:main:main")
        drop_row(home, run_id)  # a completed run folder without its tasks.db row
        online = await cli.json("doctor")
        damaged = home / "contexts" / "completed" / str(uuid.uuid4())
        damaged.mkdir()
        (damaged / "metadata.json").write_text("{not json")
        (damaged / "messages.jsonl").write_text('{"seq": 1}\n')
        online_errors = await cli.json("doctor", code=78)
        assert await running.stop() == 0
    offline = await cli.json("doctor", code=78)

    def seen(body: dict[str, Any]) -> set[tuple[str, str | None]]:
        return {(a["check"], a.get("run_id")) for a in body["actions"]}

    assert ("orphan_folder", run_id) in seen(online)
    assert seen(online_errors) == seen(offline)
    assert ("unreadable_metadata", damaged.name) in seen(offline)
    code, _, err = await cli("doctor")
    assert code == 78 and "error:" in err


# -- 6. config show: whose configuration ---------------------------------------------------------------


async def test_config_show_shows_the_running_daemons_config(cli: Cli, home: Path) -> None:
    (home / "config.yaml").write_text("gateway:\n  port: 9001\n  tokens: [s3cret]\n")
    async with daemon(home) as running:
        online = await cli.json("config", "show")
        code, out, _ = await cli("config", "show")
        assert await running.stop() == 0
    port = int(running.url.rsplit(":", 1)[1])
    assert online["source"]["kind"] == "gateway" and online["gateway"]["port"] == port != 9001
    assert online["gateway"]["tokens"] == ["***"]
    assert code == 0 and out.startswith("# the running gateway's effective configuration") and f"port: {port}" in out
    offline = await cli.json("config", "show")
    assert offline["source"]["kind"] == "files" and offline["gateway"]["port"] == 9001
    code, out, _ = await cli("config", "show")
    assert out.startswith("# the configuration from the files (no gateway running)")


# -- 7. config check: what the daemon refuses ----------------------------------------------------------


async def test_config_check_refuses_what_the_daemon_refuses(cli: Cli, home: Path) -> None:
    (home / "config.yaml").write_text("{}\n")
    bad = "hooks:\n  gh:\n    key_template: 'hook:gh:${repository.name'\n"
    async with daemon(home) as running:
        (home / "config.yaml").write_text(bad)
        code, _, online_err = await cli("config", "check")
        assert await running.stop() == 0
    assert code == 4 and "hooks.gh.key_template" in online_err
    code, _, offline_err = await cli("config", "check")
    assert code == 4 and offline_err == online_err
    refused = await start_daemon(home, wait=False)
    assert await refused.wait(30) == 4
    assert "hooks.gh.key_template" in refused.stderr()
