"""The Discord connector end to end: a real daemon process, discord.py against the local Discord
(tests/support/discord_server.py) and the local OpenAI-compatible model server; the daemon killed
with SIGKILL between the answer and its send, and the reply sent once by the next start; the
message sent while it was down fetched (the gateway does not keep it) and answered once."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.channels.harness import connected, daemon, stored, wait_until
from tests.gateway.daemons import child_env, run_cli
from tests.support.discord_server import DiscordServer
from tests.support.openai_server import OpenAIServer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]
TOKEN = "MTE.daemon.secret"
OWNER, DM = "300000000000000001", "400000000000000001"


def configure(tmp_path: Path, model: OpenAIServer, discord: DiscordServer) -> Path:
    account = {"token_env": "DISCORD_TOKEN", "api_base": discord.url, "agent": "main", "dm_policy": "allowlist",
               "allow_from": [OWNER], "require_mention": True, "guilds": []}  # fmt: skip
    data = {"agents": {"main": {"model": {"base_url": model.base_url, "name": "m", "max_retries": 0}}},
            "session": {"dm_scope": "per-channel-peer"},
            "channels": {"discord": {"accounts": {"main": account}}}}  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


async def test_a_dm_answered_once_across_a_kill_between_the_answer_and_the_send(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as model, DiscordServer() as discord:
        discord.add_bot(TOKEN)
        config = configure(tmp_path, model, discord)
        env = child_env(DISCORD_TOKEN=TOKEN)
        async with daemon(home, "--config", str(config), env={**env, "_NEOTASK_CRASH_AT": "channels.answered"}) as gw:
            await wait_until(lambda: connected(gw.url, "main"), timeout=60)
            asked = await discord.message(TOKEN, channel=DM, author=OWNER, text="answer me")
            assert await gw.wait(timeout=60) == -9
        assert discord.sent(DM) == [] and len(model.chat_requests) == 1
        meanwhile = await discord.message(TOKEN, channel=DM, author=OWNER, text="sent while it was down")
        async with daemon(home, "--config", str(config), env=env) as gw:
            await discord.wait_for(lambda: len(discord.sent(DM)) == 2, timeout=60)
            assert {c.body["content"] for c in discord.sent(DM)} == {"echo: answer me", "echo: sent while it was down"}
            await wait_until(lambda: connected(gw.url, "main"), timeout=60)
            shown = await run_cli("channels", "status", "--home", str(home), "--config", str(config), env=env)
            row = next(line for line in shown.stdout.splitlines() if line.startswith("discord"))
            assert row.split()[:5] == ["discord", "main", "main", "connected", "@neo"], shown.stdout
        assert len(model.chat_requests) == 2  # the first answer was kept, not asked again
        assert len(discord.sent(DM)) == 2
        lines = stored(home, f"agent:main:discord:dm:{OWNER}")
        assert [(x["role"], x["content"]) for x in lines] == [
            ("user", "answer me"), ("assistant", "echo: answer me"),
            ("user", "sent while it was down"), ("assistant", "echo: sent while it was down")]  # fmt: skip
        ids = [x["client_message_id"] for x in lines if x["role"] == "user"]
        assert ids == [f"discord:main:{asked}", f"discord:main:{meanwhile}"]
