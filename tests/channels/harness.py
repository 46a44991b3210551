"""What the Telegram daemon tests share: a home configured with the local model server and the
local Bot API server, the daemon's environment with the tokens, and readers of what was stored."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.gateway.daemons import Daemon, _reap, child_env, start_daemon
from tests.support.openai_server import OpenAIServer
from tests.support.telegram_server import Call, TelegramServer

TOKEN = "111:main-secret"
OTHER_TOKEN = "222:other-secret"
BOT = "neo_bot"


def configure(
    tmp_path: Path,
    model: OpenAIServer | None,
    bots: TelegramServer,
    accounts: dict[str, dict[str, Any]] | None = None,
    **more: Any,
) -> Path:
    default = {"main": {"token_env": "TG_MAIN", "api_base": bots.url, "agent": "main", "mode": "polling",
                        "dm_policy": "allowlist", "allow_from": ["555"], "require_mention": True,
                        "poll_timeout_s": 1}}  # fmt: skip
    data: dict[str, Any] = {"channels": {"telegram": {"accounts": accounts or default}}, **more}
    if model is not None:
        data.setdefault("agents", {"main": {}})["main"]["model"] = {
            "base_url": model.base_url,
            "name": "m",
            "max_retries": 0,
            "timeout_s": 60,
        }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@contextlib.asynccontextmanager
async def daemon(home: Path, *args: str, env: dict[str, str]) -> AsyncIterator[Daemon]:
    """A started daemon (given longer to start than tests/gateway's: the machine is shared),
    killed and reaped on the way out if the test left it running."""
    started = await start_daemon(home, *args, env=env, wait=False)
    try:
        await started.wait_listening(timeout=120)
        yield started
    finally:
        await _reap(started.proc)


def env(**extra: str) -> dict[str, str]:
    return child_env(TG_MAIN=TOKEN, **extra)


def stored(home: Path, key: str) -> list[dict[str, Any]]:
    """Every messages.jsonl line of the key's runs, read from the run folders (sessions.json may
    not be written yet when a daemon was killed)."""
    lines: list[dict[str, Any]] = []
    for state in ("running", "paused", "completed"):
        for run_dir in sorted((home / "contexts" / state).glob("*")):
            metadata = json.loads((run_dir / "metadata.json").read_text())
            if metadata.get("session_key") == key:
                lines += [json.loads(x) for x in (run_dir / "messages.jsonl").read_text().splitlines()]
    return lines


async def session_lines(url: str, key: str) -> list[dict[str, Any]]:
    """The messages of the key's current run, through the API."""
    segment = key.replace(":", "%3A")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/v1/sessions/{segment}") as resp:
            if resp.status == 404:
                return []
            entry = await resp.json()
        async with http.get(f"{url}/v1/runs/{entry['run_id']}/messages") as resp:
            body = await resp.json()
    lines: list[dict[str, Any]] = body["messages"]
    return lines


async def connected(url: str, account: str) -> bool:
    """Whether the daemon's chat account has connected (``GET /v1/channels``): until then a call
    for it gets 503 ``channel_not_ready``, and a daemon answers HTTP before its accounts connect."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/v1/channels") as resp:
        accounts = (await resp.json())["accounts"]
    return any(a["account"] == account and a["connected"] for a in accounts)


async def connected_in(client: Any, account: str, timeout: float = 60.0) -> None:
    """Wait until the in-process app's chat account has connected (``GET /v1/channels``)."""

    async def check() -> bool:
        accounts = (await (await client.get("/v1/channels")).json())["accounts"]
        return any(a["account"] == account and a["connected"] for a in accounts)

    await wait_until(check, timeout)


async def wait_until(check: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    async with asyncio.timeout(timeout):
        while True:
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            await asyncio.sleep(0.05)


def texts(calls: list[Call]) -> list[str]:
    return [str(c.params["text"]) for c in calls]


def _states(home: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(home / "channels.db")) as db:
        return [str(r[0]) for r in db.execute("SELECT state FROM outbox")]


async def outbox_settled(home: Path, timeout: float = 30.0) -> None:
    """Wait until every outbox row is sent (a kill before its record would send it again)."""
    async with asyncio.timeout(timeout):
        while any(state != "sent" for state in await asyncio.to_thread(_states, home)):
            await asyncio.sleep(0.05)
