"""What a start pays for: a daemon with no channel account running imports no chat SDK, a home
with no memory files and no index loads neither LanceDB nor torch, store-only loads no openai SDK,
and an offline ``sessions list`` loads none of them either (each costs seconds of CPU: aiogram's
types alone about 5 s). Checked in real processes through their ``sys.modules`` at exit."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import yaml

from tests.gateway.daemons import REPO, Daemon, _reap, child_env

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

CHAT_SDKS = {"aiogram", "slack_sdk", "slack_bolt", "discord"}
NOT_NEEDED = CHAT_SDKS | {"lancedb", "torch", "sentence_transformers", "openai", "asyncpg"}
MODULES = [sys.executable, "-m", "tests.support.modules_at_exit"]


def loaded(out: Path) -> set[str]:
    return set(out.read_text().split())


async def test_a_daemon_without_running_accounts_loads_no_chat_sdk_no_index_and_no_model(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"channels": {
        "telegram": {"accounts": {"off": {"enabled": False}, "unset": {"token_env": "NO_SUCH_TOKEN_VARIABLE"}}},
        "slack": {"accounts": {"work": {"bot_token_env": "NO_SUCH_SLACK_TOKEN"}}},
        "discord": {"accounts": {"bot": {"token_env": "NO_SUCH_DISCORD_TOKEN"}}},
    }}))  # fmt: skip
    home, out = tmp_path / "home", tmp_path / "modules"
    stderr = tmp_path / "daemon.stderr"
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *MODULES, str(out), "gateway", "--home", str(home), "--port", "0", "--config", str(config),
            stdout=asyncio.subprocess.PIPE, stderr=err, env=child_env(), cwd=REPO,
        )  # fmt: skip
    gw = Daemon(home, proc, stderr)
    try:
        await gw.wait_listening()
        assert await gw.stop() == 0, gw.stderr()
    finally:
        await _reap(proc)
    modules = loaded(out)
    assert "gateway" in modules and "aiohttp" in modules  # the file is the daemon's
    assert modules & NOT_NEEDED == set(), "a start loaded what nothing configured needs"
    assert "unset: NO_SUCH_TOKEN_VARIABLE is not set" in gw.stderr()  # the accounts were read, not skipped


async def test_an_offline_sessions_list_loads_no_sdk_index_or_model(tmp_path: Path) -> None:
    out = tmp_path / "modules"
    proc = await asyncio.create_subprocess_exec(
        *MODULES, str(out), "sessions", "list", "--home", str(tmp_path / "home"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=child_env(), cwd=REPO,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()
    modules = loaded(out)
    assert "gateway" in modules
    assert modules & NOT_NEEDED == set()
