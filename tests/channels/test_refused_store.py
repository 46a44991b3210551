"""A chat message the store refused for now (the disk under ``storage.min_free``: 507) is left for
the platform's redelivery, neither dropped as refused for good nor remembered as handled: the
redelivery, once space is back, is stored and answered. (Before, a 507 was dropped like a paused
session's refusal, and any refusal was remembered, so a redelivery was a "duplicate": lost.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.channels.harness import BOT, TOKEN, configure, daemon, env, session_lines
from tests.faults.conftest import tmpfs  # noqa: F401  (the fixture)
from tests.faults.test_disk_budget import free_bytes, take_space
from tests.support.openai_server import OpenAIServer
from tests.support.telegram_server import TelegramServer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]
SECRET = "s3cret-webhook-token"
HEADER = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
MIN_FREE = 2 << 20


async def test_a_message_refused_for_lack_of_space_is_stored_when_redelivered(tmpfs: Path) -> None:  # noqa: F811
    home = tmpfs / "home"
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        accounts = {"main": {"token_env": "TG_MAIN", "api_base": bots.url, "mode": "webhook",
                             "webhook_url": "https://bot.example.com/hooks/telegram/main",
                             "webhook_secret_env": "TG_SECRET", "allow_from": ["555"]}}  # fmt: skip
        config = configure(tmpfs, model, bots, accounts, storage={"min_free": "2MiB"})
        async with daemon(home, "--config", str(config), env=env(TG_SECRET=SECRET)) as gw:
            await bots.wait_for(lambda: bool(bots.of("setWebhook", TOKEN)))
            hook = f"{gw.url}/hooks/telegram/main"
            bots.message(TOKEN, chat_id=555, from_id=555, text="first")
            first = bots.take_update(TOKEN)
            bots.message(TOKEN, chat_id=555, from_id=555, text="while the disk is low")
            refused = bots.take_update(TOKEN)
            async with aiohttp.ClientSession() as http:
                async with http.post(hook, json=first, headers=HEADER) as resp:
                    assert resp.status == 200, await resp.text()
                ballast = await asyncio.to_thread(take_space, tmpfs, MIN_FREE // 2)
                assert free_bytes(tmpfs) > 64 << 10  # the budget refuses, not the disk
                await asyncio.sleep(0.3)  # free space is read at most every storage.free_check_ms
                async with http.post(hook, json=refused, headers=HEADER) as resp:
                    assert resp.status == 503, await resp.text()  # not 2xx: Telegram delivers it again
                    assert (await resp.json())["error"]["code"] == "channel_not_ready"
                await asyncio.to_thread(ballast.unlink)
                async with http.get(f"{gw.url}/readyz") as resp:
                    assert resp.status == 200, await resp.text()
                async with http.post(hook, json=refused, headers=HEADER) as resp:  # the redelivery
                    assert resp.status == 200, await resp.text()
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 2)
            lines = await session_lines(gw.url, "agent:main:main")
            assert [x["content"] for x in lines] == [
                "first", "echo: first", "while the disk is low", "echo: while the disk is low"
            ]  # fmt: skip
