"""Issue 10 item 11 (without /readyz, done elsewhere): ``--host [::1]`` binds, ``tokens: [""]`` is
refused, and the CLI waits for a daemon that is starting instead of failing."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import aiohttp
import pytest

from config.errors import ConfigError
from config.loader import build_settings, deep_merge, load_defaults
from gateway.hosts import bind_address, is_loopback
from gateway.places import url_for
from home.lock import is_locked
from tests.faults.ops_support import write_config
from tests.gateway.daemons import child_env, daemon, run_cli, start_daemon

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too


@pytest.mark.parametrize("tokens", [[""], ["  "], ["good", ""]])
def test_an_empty_token_is_refused(tokens: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"gateway\.tokens"):
        build_settings(deep_merge(load_defaults(), {"gateway": {"tokens": tokens}}))


async def test_config_check_and_the_daemon_refuse_an_empty_token(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config.yaml", {"gateway": {"tokens": [""], "host": "0.0.0.0"}})
    checked = await run_cli("config", "check", "--home", str(tmp_path / "home"), "--config", str(config))
    assert checked.returncode != 0 and "gateway.tokens" in checked.stdout + checked.stderr
    env = child_env(NEOTASK_GATEWAY__TOKENS='[""]')
    started = await run_cli("gateway", "--home", str(tmp_path / "home"), "--host", "0.0.0.0", "--port", "0", env=env)
    assert started.returncode != 0 and "empty token" in started.stderr, started
    assert not (tmp_path / "home" / "gateway.json").exists()


def test_bracketed_ipv6_addresses() -> None:
    assert bind_address("[::1]") == "::1" and bind_address("127.0.0.1") == "127.0.0.1"
    assert is_loopback("[::1]") and url_for(bind_address("[::1]"), 8787) == "http://[::1]:8787"


@pytest.mark.slow
async def test_host_bracketed_ipv6_loopback_binds(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with daemon(home, "--host", "[::1]") as gw, aiohttp.ClientSession() as http:
        assert gw.url.startswith("http://[::1]:"), gw.banner
        info = json.loads((home / "gateway.json").read_text())
        assert info["url"] == gw.url
        async with http.get(f"{gw.url}/healthz") as resp:
            assert resp.status == 200
        async with http.post(f"{gw.url}/v1/sessions/agent%3Amain%3Amain/messages", json={"content": "hi"}) as resp:
            assert resp.status == 200, await resp.text()
        status = await run_cli("gateway", "status", "--home", str(home), "--json")
        assert status.returncode == 0 and json.loads(status.stdout)["healthy"] is True
        assert await gw.stop() == 0


@pytest.mark.slow
async def test_the_cli_waits_for_a_daemon_that_is_starting(tmp_path: Path) -> None:
    home = tmp_path / "home"
    gw = await start_daemon(home, wait=False)
    try:
        # Catch the daemon between taking the lock and listening, and hold it there.
        for _ in range(3000):
            if is_locked(home / "gateway.lock"):
                break
            await asyncio.sleep(0.005)
        gw.send(signal.SIGSTOP)
        assert not (home / "gateway.json").exists(), "the daemon was listening already: start-up too quick to test"
        cli = asyncio.create_task(run_cli("sessions", "list", "--json", "--home", str(home), timeout=60))
        # the CLI is waiting now, not failing (it takes about 1 s to start; 4 s leaves room for a
        # loaded machine, where 1.5 s once ended before the CLI looked and it found the daemon up)
        await asyncio.sleep(4)
        assert not cli.done()
        gw.send(signal.SIGCONT)
        await gw.wait_listening()
        result = await cli
        assert result.returncode == 0, result
        assert "waiting up to 30 s for the gateway to start" in result.stderr
        assert json.loads(result.stdout)["sessions"] == []
        assert await gw.stop() == 0
    finally:
        gw.send(signal.SIGCONT)
        gw.send(signal.SIGKILL)
        await asyncio.wait_for(gw.proc.wait(), 15)
