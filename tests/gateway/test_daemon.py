"""Real daemon processes: start-up order, SIGTERM, restart, the second-daemon refusal, and crash
recovery after SIGKILL under load (SPEC section 2)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from tests.gateway.daemons import Daemon, child_env, daemon, run_cli, start_daemon

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90), pytest.mark.realtime]

KEYS = [f"agent:main:dm:peer{i}" for i in range(6)] + ["cron:nightly", "hook:github:owner/repo:issue:7"]


def messages_url(base: str, key: str) -> str:
    return f"{base}/v1/sessions/{quote(key, safe='')}/messages"


async def _load(base: str, *, workers: int, stop: asyncio.Event, tag: str, acked: list[str] | None = None) -> list[str]:
    """``workers`` clients posting store-only messages round the keys until ``stop``; returns the
    contents acknowledged with a 2xx (appended to ``acked`` as they come, for a caller that waits
    on the count)."""
    acked = [] if acked is None else acked

    async def worker(n: int) -> None:
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            i = 0
            while not stop.is_set():
                content = f"{tag}-{n}-{i}"
                key = KEYS[(n + i) % len(KEYS)]
                i += 1
                try:
                    async with session.post(messages_url(base, key), json={"content": content}) as resp:
                        if 200 <= resp.status < 300:
                            await resp.read()
                            acked.append(content)
                        else:
                            return
                except (TimeoutError, aiohttp.ClientError):
                    return

    await asyncio.gather(*(worker(n) for n in range(workers)))
    return acked


def _stored(home: Path) -> dict[str, list[dict[str, Any]]]:
    """messages.jsonl of every run folder, by run id."""
    out = {}
    for path in sorted((home / "contexts").glob("*/*/messages.jsonl")):
        out[path.parent.name] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def _assert_exactly_once(home: Path, acked: list[str]) -> None:
    runs = _stored(home)
    for run_id, records in runs.items():
        assert [r["seq"] for r in records] == list(range(1, len(records) + 1)), f"seq gap in {run_id}"
    counts = Counter(r["content"] for records in runs.values() for r in records)
    assert all(n == 1 for n in counts.values()), [c for c, n in counts.items() if n > 1][:5]
    missing = [c for c in acked if counts[c] != 1]
    assert not missing, f"{len(missing)} acknowledged message(s) lost, e.g. {missing[:5]}"


async def test_start_answers_then_sigterm_drains_and_restart_keeps_sessions(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with daemon(home) as first:
        assert first.banner.startswith("neotask gateway listening on http://127.0.0.1:")
        assert f"(home {home.resolve()}, store-only)" in first.banner
        info = json.loads((home / "gateway.json").read_text())
        assert info["pid"] == first.pid and info["url"] == first.url
        assert {"started_at", "home", "version"} <= set(info)
        assert info["config_path"] is None  # no file: `config reload` then reads what <home>/config.yaml says
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{first.url}/healthz") as resp:
                assert resp.status == 200
            async with session.post(messages_url(first.url, "agent:main:main"), json={"content": "remember me"}) as r:
                body = await r.json()
                assert r.status == 200 and body["message_seq"] == 1
        maps = Path(f"/proc/{first.pid}/maps")
        if maps.exists():
            assert "torch" not in maps.read_text(), "torch was loaded by the daemon's start"

        stop = asyncio.Event()
        load = asyncio.create_task(_load(first.url, workers=8, stop=stop, tag="drain"))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        status = await first.stop(signal.SIGTERM)
        stop.set()
        acked = await load
        assert status == 0, first.stderr()
        assert time.monotonic() - started < 10
        assert not (home / "gateway.json").exists()
        assert "SIGTERM: shutting down" in (home / "logs" / "gateway.log").read_text()
    sessions = json.loads((home / "contexts" / "sessions.json").read_text())["sessions"]
    run_id = sessions["agent:main:main"]["run_id"]
    assert run_id and sessions["agent:main:main"]["message_count"] == 1
    _assert_exactly_once(home, [*acked, "remember me"])

    async with daemon(home) as second, aiohttp.ClientSession() as session:
        async with session.get(f"{second.url}/v1/sessions/{quote('agent:main:main', safe='')}") as resp:
            entry = await resp.json()
            assert resp.status == 200 and entry["run_id"] == run_id and entry["message_count"] == 1
        assert await second.stop() == 0


async def test_a_second_daemon_on_the_same_home_exits_73_naming_the_first(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with daemon(home) as first:
        second = await run_cli("gateway", "--home", str(home), "--port", "0")
        assert second.returncode == 73
        assert f"gateway already running (pid {first.pid}, url {first.url})" in second.stderr
        assert second.stdout == ""

        port = first.url.rsplit(":", 1)[1]  # another home, the same port: a clear error, no gateway.json
        other = await run_cli("gateway", "--home", str(tmp_path / "other"), "--port", port, env=child_env())
        assert other.returncode == 1 and "cannot listen" in other.stderr
        assert not (tmp_path / "other" / "gateway.json").exists()

        async with aiohttp.ClientSession() as session, session.get(f"{first.url}/healthz") as resp:
            assert resp.status == 200  # the first one is unharmed
        assert await first.stop() == 0


async def test_a_public_address_without_a_token_is_refused(tmp_path: Path) -> None:
    result = await run_cli("gateway", "--home", str(tmp_path / "home"), "--host", "0.0.0.0", "--port", "0")
    assert result.returncode == 4
    assert "without a token" in result.stderr and "gateway.tokens" in result.stderr
    assert not (tmp_path / "home" / "gateway.json").exists()


async def test_sigkill_under_load_loses_no_acknowledged_message(tmp_path: Path) -> None:
    home = tmp_path / "home"
    victim: Daemon = await start_daemon(home)
    try:
        stop = asyncio.Event()
        acked_so_far: list[str] = []
        load = asyncio.create_task(_load(victim.url, workers=32, stop=stop, tag="crash", acked=acked_so_far))
        # kill once the load is going (a count, not a clock: a busy CI machine may take longer)
        deadline = time.monotonic() + 45
        while len(acked_so_far) < 150 and time.monotonic() < deadline and not load.done():
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # and well in flight
        victim.send(signal.SIGKILL)  # mid-flight: some requests are half written
        status = await victim.stop(signal.SIGKILL)
        stop.set()
        acked = await load
    finally:
        await victim.stop(signal.SIGKILL)
    assert status == -signal.SIGKILL
    assert len(acked) > 100, "the load did not get going"
    assert (home / "gateway.json").exists()  # left behind by the crash

    async with daemon(home) as again:
        info = json.loads((home / "gateway.json").read_text())
        assert info["pid"] == again.pid  # the stale file was replaced
        _assert_exactly_once(home, acked)
        async with (
            aiohttp.ClientSession() as session,
            session.post(messages_url(again.url, KEYS[0]), json={"content": "after"}) as resp,
        ):
            body = await resp.json()
            assert resp.status == 200
        records = _stored(home)[body["run_id"]]
        assert records[-1]["content"] == "after" and records[-1]["seq"] == len(records)
        assert await again.stop() == 0
