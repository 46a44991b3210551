"""Issue 24 item 15: hundreds of connections that send a complete request head and then trickle
the body (no credentials needed: ``/hooks/<name>`` reads the body before it checks a signature)
must not lock other clients out. A real daemon, real sockets (the attacker in its own process:
``tests/faults/slow_body_attack.py``), a probe client on another loopback address and one on the
same."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.app import front_middleware
from gateway.connections import ConnectionGuard, GuardedSite
from gateway.http import BODY_TIMEOUT, read_body
from tests.faults.ops_support import write_config
from tests.gateway.daemons import REPO, child_env, daemon

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

ATTACKERS = 400
ATTACK_S = 16.0
SECRET_ENV = "SLOW_HOOK_SECRET"
GATEWAY = {"max_connections": 256, "tokens": ["a-token"], "body_timeout_s": 60}
HOOKS = {"gh": {"secret_env": SECRET_ENV, "key_template": "hook:gh:slow"}}


@dataclass
class Tally:
    served: int = 0
    total: int = 0
    statuses: dict[str, int] = field(default_factory=dict)

    def add(self, outcome: str) -> None:
        self.total += 1
        self.served += outcome == "200"
        self.statuses[outcome] = self.statuses.get(outcome, 0) + 1


async def _probe(url: str, local: str, seconds: float, tally: Tally) -> None:
    """``GET /healthz`` on a new connection every 0.25 s (3 s timeout) for ``seconds``."""
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(local_addr=(local, 0), force_close=True)
    timeout = aiohttp.ClientTimeout(total=3)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                async with http.get(f"{url}/healthz") as resp:
                    await resp.read()
                    tally.add(str(resp.status))
            except (aiohttp.ClientError, TimeoutError) as exc:
                tally.add(type(exc).__name__)
            await asyncio.sleep(max(0.0, 0.25 - (time.monotonic() - started)))


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_trickling_bodies_lock_no_one_out(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {"gateway": GATEWAY, "hooks": HOOKS})
    env = {**child_env(), SECRET_ENV: "a webhook secret"}
    async with daemon(tmp_path / "home", "--config", str(config), env=env) as gw:
        port = gw.url.rsplit(":", 1)[1]
        attack = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.faults.slow_body_attack", port, str(ATTACKERS), str(ATTACK_S),
            stdout=asyncio.subprocess.PIPE, env=child_env(), cwd=REPO,
        )  # fmt: skip
        try:
            await asyncio.sleep(4.0)  # the attack is in place
            other, same = Tally(), Tally()
            await asyncio.gather(
                _probe(gw.url, "127.0.0.2", ATTACK_S - 6, other), _probe(gw.url, "127.0.0.1", ATTACK_S - 6, same)
            )
            out, _ = await asyncio.wait_for(attack.communicate(), 60)
        finally:
            if attack.returncode is None:
                attack.kill()
                await attack.wait()
        seen = json.loads(out.decode().strip().splitlines()[-1])
        print(f"\nattack {seen}; probes from 127.0.0.2 served {other.served}/{other.total} {other.statuses};"
              f" from 127.0.0.1 served {same.served}/{same.total} {same.statuses}")  # fmt: skip
        assert seen["peak"] >= GATEWAY["max_connections"] // 4  # the attack did hold connections
        assert other.total >= 10 and same.total >= 10
        assert other.served == other.total, other.statuses
        assert same.served == same.total, same.statuses
        assert await gw.stop() == 0


async def test_at_the_cap_a_body_read_makes_room_when_nothing_is_idle() -> None:
    """Many peers (here: a per-peer limit too high to bite) filling the cap with bodies that never
    end: a newcomer closes the oldest body read of the peer holding the most, instead of being
    refused 503."""
    guard = ConnectionGuard(max_connections=3, header_timeout_s=30, max_body_reads_per_peer=100)

    async def upload(request: web.Request) -> web.Response:
        return web.json_response({"bytes": len(await read_body(request, 1 << 20))})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application(middlewares=[front_middleware(guard, None, None)])
    app[BODY_TIMEOUT] = 60.0
    app.router.add_post("/upload", upload)
    app.router.add_get("/healthz", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = GuardedSite(runner, "127.0.0.1", 0, guard)
    await site.start()
    head = b"POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\nx"
    try:
        slow = [await asyncio.open_connection("127.0.0.1", site.port) for _ in range(3)]
        for _, writer in slow:
            writer.write(head)
            await writer.drain()
        while guard.stats()["body_reads"] < 3:
            await asyncio.sleep(0.01)
        assert guard.stats()["idle"] == 0
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.get(f"http://127.0.0.1:{site.port}/healthz") as resp:
                    assert resp.status == 200
        assert guard.refused == 0 and guard.body_evicted >= 1
        assert await asyncio.wait_for(slow[0][0].read(), 10) == b""  # the oldest body read was closed
        slow[2][1].write(b"y" * 999)  # a body that does arrive is served
        answer = await asyncio.wait_for(slow[2][0].read(200), 10)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        for _, writer in slow:
            writer.close()
    finally:
        await runner.cleanup()
