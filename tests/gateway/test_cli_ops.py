"""Issue 24's CLI items: listing every session, cron run outcomes, exit codes, and offline
commands that stay light (no torch) and quiet."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from config.clock import system_clock
from gateway.offline import progress
from sessions.records import NewMessage
from tests.gateway.daemons import REPO, child_env, daemon, run_cli
from tests.gateway.helpers import Cli
from tests.sessions.helpers import open_store, start
from tests.support.openai_server import OpenAIServer

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

MANY = 520  # above the API's largest page (500)


@pytest.fixture(autouse=True)
def _no_neotask_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [n for n in os.environ if n.startswith("NEOTASK_")]:
        monkeypatch.delenv(name)
    yield


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], home: Path) -> Cli:
    return Cli(capsys, home)


async def _seed_many(home: Path, count: int) -> set[str]:
    store = await open_store(home, system_clock)  # a real daemon reads this home: the real time
    try:
        for i in range(count):
            run = await start(store, f"agent:main:dm:peer{i}")
            await store.append(run, NewMessage(role="user", content=f"hello {i}"))
    finally:
        await store.close()
    return {f"agent:main:dm:peer{i}" for i in range(count)}


async def test_sessions_list_all_follows_the_cursor_offline_and_online(cli: Cli, home: Path) -> None:
    keys = await _seed_many(home, MANY)
    listing = await cli.json("sessions", "list", "--all")
    assert {s["key"] for s in listing["sessions"]} == keys and len(listing["sessions"]) == MANY
    code, out, _ = await cli("sessions", "list", "--all")
    assert code == 0 and out.rstrip().endswith(f"{MANY} session(s)")

    page = await cli.json("sessions", "list", "--limit", "500")
    assert len(page["sessions"]) == 500 and page["next_cursor"]
    rest = await cli.json("sessions", "list", "--limit", "500", "--cursor", page["next_cursor"])
    assert {s["key"] for s in page["sessions"] + rest["sessions"]} == keys and rest["next_cursor"] is None
    code, out, _ = await cli("sessions", "list", "--limit", "10")
    assert code == 0 and "10 session(s) shown; more: --cursor " in out
    code, _, err = await cli("sessions", "list", "--limit", "501")
    assert code == 2 and "--all" in err

    async with daemon(home) as running:
        online = await cli.json("sessions", "list", "--all")
        assert [s["key"] for s in online["sessions"]] == [s["key"] for s in listing["sessions"]]
        code, out, _ = await cli("sessions", "list", "--all")
        assert code == 0 and out.rstrip().endswith(f"{MANY} session(s)")
        assert await running.stop() == 0


async def test_sighup_reopens_the_log_file_and_the_daemon_keeps_serving(home: Path) -> None:
    log_file = home / "logs" / "gateway.log"
    async with daemon(home) as running, aiohttp.ClientSession() as session:
        rotated = log_file.with_name("gateway.log.1")
        log_file.rename(rotated)  # what logrotate does before it sends SIGHUP
        running.send(signal.SIGHUP)
        async with asyncio.timeout(10):
            while not log_file.exists() or "SIGHUP" not in log_file.read_text():
                await asyncio.sleep(0.05)
        assert running.proc.returncode is None
        async with session.get(f"{running.url}/healthz") as resp:
            assert resp.status == 200
        assert await running.stop() == 0
    assert "SIGTERM: shutting down" in log_file.read_text()
    assert "SIGTERM" not in rotated.read_text() and "listening on" in rotated.read_text()


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ("gateway:\n  prot: 9000\n", "gateway.prot"),  # an unknown key
        ("hooks:\n  gh:\n    key_template: 'hook:gh:${repository.name'\n", "hooks.gh.key_template"),
        ("agents:\n  main:\n    model: {base_url: '127.0.0.1:11434/v1'}\n", "agents.main.model.base_url"),
        (
            "cron:\n  jobs: [{id: digest, schedule: '0 9 * * *', message: hi, deliver_to: 'digest inbox'}]\n",
            "cron.jobs.0.deliver_to",
        ),
        ("hooks:\n  gh: {deliver_to: 'ftp://example.com/x'}\n", "hooks.gh.deliver_to"),
        ("agents:\n  main:\n    model: {base_url: 'http://127.0.0.1:99999/v1'}\n", "agents.main.model.base_url"),
    ],
)
async def test_a_bad_configuration_exits_4_from_the_daemon_and_from_config_check(
    cli: Cli, home: Path, config: str, key: str
) -> None:
    home.mkdir()
    (home / "config.yaml").write_text(config)
    refused = await run_cli("gateway", "--home", str(home), "--port", "0")
    assert refused.returncode == 4, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and refused.stderr.startswith("error: ")
    assert key in refused.stderr
    code, _, err = await cli("config", "check")
    assert code == 4 and err == refused.stderr
    code, _, _ = await cli("sessions", "list")
    assert code == 4


async def test_each_reset_at_start_up_is_logged_with_its_key_and_runs(home: Path) -> None:
    home.mkdir()
    (home / "config.yaml").write_text(
        "session: {reset: {mode: idle, idle_minutes: 5}}\ncompaction: {memory_flush: {enabled: false}}\n"
    )
    store = await open_store(home, lambda: system_clock() - timedelta(minutes=10))  # idle for 10 minutes now
    old: dict[str, str] = {}
    try:
        for i in range(6):
            run = await start(store, f"agent:main:dm:peer{i}")
            await store.append(run, NewMessage(role="user", content=f"hello {i}"))
            old[run.key] = run.run_id
    finally:
        await store.close()
    log_file = home / "logs" / "gateway.log"
    async with daemon(home) as running, aiohttp.ClientSession() as session:
        async with asyncio.timeout(20):
            while log_file.read_text().count("completed; the next message opens its new run") < len(old):
                await asyncio.sleep(0.1)
        url = f"{running.url}/v1/sessions/{quote('agent:main:dm:peer0', safe='')}/messages"
        async with session.post(url, json={"content": "back"}) as resp:
            new_run = (await resp.json())["run_id"]
        assert await running.stop() == 0
    text = log_file.read_text()
    for key, run_id in old.items():
        assert f"INFO conversations.housekeeping: reset {key} (idle): run {run_id} completed" in text
    assert f"agent:main:dm:peer0: new run {new_run} (inherits run {old['agent:main:dm:peer0']})" in text


class Receiver:
    """A ``deliver_to`` endpoint answering ``status`` and counting what it got."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.bodies: list[dict[str, object]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        return web.Response(status=self.status)


async def _receiver(aiohttp_server: Callable[..., Awaitable[TestServer]], status: int) -> tuple[Receiver, str]:
    receiver = Receiver(status)
    app = web.Application()
    app.router.add_post("/inbox", receiver.handle)
    server = await aiohttp_server(app)
    return receiver, str(server.make_url("/inbox"))


def _cron_config(home: Path, base_url: str, deliver_to: str) -> None:
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(
        f"agents:\n  main:\n    model: {{base_url: '{base_url}', max_retries: 0, timeout_s: 5}}\n"
        "compaction: {memory_flush: {enabled: false}}\n"
        "cron:\n  jobs:\n"
        f"    - {{id: digest, schedule: '0 9 * * *', message: digest please, deliver_to: '{deliver_to}'}}\n"
    )


async def _cron_run_both_ways(cli: Cli, home: Path) -> list[tuple[int, str, str, dict[str, Any]]]:
    """``cron run digest`` offline, then through a daemon: (status, text out, text err, JSON)."""
    results = []
    code, out, err = await cli("cron", "run", "digest")
    body = await cli.json("cron", "run", "digest", code=code)
    results.append((code, out, err, body))
    async with daemon(home) as running:
        code, out, err = await cli("cron", "run", "digest")
        body = await cli.json("cron", "run", "digest", code=code)
        results.append((code, out, err, body))
        assert await running.stop() == 0
    return results


async def test_cron_run_reports_an_unreachable_model_and_exits_1(
    cli: Cli, home: Path, unused_tcp_port: int, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> None:
    receiver, inbox = await _receiver(aiohttp_server, 204)
    _cron_config(home, f"http://127.0.0.1:{unused_tcp_port}/v1", inbox)
    for code, out, err, body in await _cron_run_both_ways(cli, home):
        assert code == 1, (out, err)
        assert body["ok"] is False and body["status"] == "failed" and body["ran"] is True
        assert body["error"].startswith("model_") or "connect" in body["error"].lower(), body["error"]
        assert "failed: " in out and err.splitlines()[-1].startswith("error: cron job cron:digest failed: ")
    assert receiver.bodies == []


async def test_cron_run_reports_a_refused_delivery_and_exits_1(
    cli: Cli, home: Path, openai_server: OpenAIServer, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> None:
    receiver, inbox = await _receiver(aiohttp_server, 400)
    _cron_config(home, openai_server.base_url, inbox)
    for code, out, err, body in await _cron_run_both_ways(cli, home):
        assert code == 1, (out, err)
        assert body["ok"] is False and body["status"] == "answered"
        assert body["reply"]["content"] == "echo: digest please"
        assert body["delivery"] == {"url": inbox, "delivered": False, "attempts": 1, "error": "HTTP 400 Bad Request"}
        assert f"not delivered to {inbox} after 1 attempt(s): HTTP 400 Bad Request" in out
    assert len(receiver.bodies) == 4


async def test_cron_run_reports_the_answer_and_the_delivery_and_exits_0(
    cli: Cli, home: Path, openai_server: OpenAIServer, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> None:
    receiver, inbox = await _receiver(aiohttp_server, 204)
    _cron_config(home, openai_server.base_url, inbox)
    for code, out, _, body in await _cron_run_both_ways(cli, home):
        assert code == 0 and body["ok"] is True and body["status"] == "answered"
        assert body["delivery"]["delivered"] is True and body["run_id"]
        assert "answered in run " in out and f"delivered to {inbox}" in out
    assert [b["reply"]["content"] for b in receiver.bodies] == ["echo: digest please"] * 4  # type: ignore[index]


PROBE = """
import sys, time
from gateway.cli import main
started = time.monotonic()
code = main(sys.argv[1:])
print(f"\\nPROBE exit={code} torch={'torch' in sys.modules} seconds={time.monotonic() - started:.1f}")
"""


@pytest.mark.parametrize(
    "command",
    [("sessions", "reset", "agent:main:main"), ("sessions", "compact", "agent:main:main"), ("cron", "run", "digest")],
)
async def test_offline_commands_never_import_torch_and_print_no_library_noise(
    home: Path, openai_server: OpenAIServer, command: tuple[str, ...]
) -> None:
    home.mkdir()
    (home / "config.yaml").write_text(
        f"agents:\n  main:\n    model: {{base_url: '{openai_server.base_url}', max_retries: 0}}\n"
        "cron:\n  jobs:\n    - {id: digest, schedule: '0 9 * * *', message: digest please}\n"
    )
    workspace = home / "workspaces" / "main"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("# Facts\n\nThe user's favourite colour is teal.\n")
    store = await open_store(home, system_clock)
    try:
        run = await start(store, "agent:main:main")
        for i in range(12):
            await store.append(run, NewMessage(role="user" if i % 2 else "assistant", content=f"line {i} " * 40))
    finally:
        await store.close()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PROBE, *command, "--home", str(home),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=child_env(), cwd=REPO,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    text, errors = out.decode(), err.decode()
    assert "PROBE exit=0 torch=False" in text, (text, errors)
    assert "Loading weights" not in errors and "transformers" not in errors, errors


async def test_gateway_stop_during_the_model_load_is_quick_and_clean(home: Path, tmp_path: Path) -> None:
    """The stop does not wait for the model load (it cannot be interrupted and takes 7-10 s of CPU
    here): the loader's own thread logs when it finishes, which a shutdown that waited would show;
    nothing is timed, so a busy machine cannot fail it."""
    workspace = home / "workspaces" / "main"
    workspace.mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("# Facts\n\nThe user's favourite colour is teal.\n")
    config = tmp_path / "config.yaml"
    config.write_text("logging: {format: json}\n")  # one message per line, read as written
    log_file = home / "logs" / "gateway.log"

    def messages() -> list[str]:
        return [json.loads(line)["message"] for line in log_file.read_text().splitlines()]

    async with daemon(home, "--config", str(config)) as running:  # its memory worker opens the index, loads the model
        for _ in range(600):
            if "memory-model-load e5: started" in messages():  # the default's slowest model
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail(f"the model load did not start: {messages()}")
        stopped = await run_cli("gateway", "stop", "--home", str(home))
        status = await running.wait()
    assert stopped.returncode == 0 and f"gateway stopped (pid {running.pid})" in stopped.stdout, stopped.stderr
    assert status == 0, running.stderr()
    assert "did not finish" not in running.stderr()
    seen = messages()
    assert "SIGTERM: shutting down" in seen and "stopped" in seen, seen
    finished = "memory-model-load e5: finished"  # the process ended first: not waited for
    assert not any(m.startswith(finished) for m in seen) and finished not in running.stderr(), seen


def test_progress_is_shown_only_for_work_over_a_second() -> None:
    quick, slow = io.StringIO(), io.StringIO()
    with progress("/reset on agent:main:main", out=quick, after_s=0.2):
        pass
    with progress("/reset on agent:main:main", out=slow, after_s=0.2):
        time.sleep(0.4)
    assert quick.getvalue() == ""
    lines = slow.getvalue().splitlines()
    assert lines[0] == "/reset on agent:main:main..." and lines[1].startswith("/reset on agent:main:main: done in 0.")
