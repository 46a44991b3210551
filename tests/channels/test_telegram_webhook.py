"""The Telegram webhook mode against a real daemon: ``setWebhook`` with the secret at start, each
call checked by its secret token, answered 200 once durable, a redelivery stored once."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.channels.harness import BOT, TOKEN, configure, daemon, env, session_lines
from tests.support.openai_server import OpenAIServer
from tests.support.telegram_server import TelegramServer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]
SECRET = "s3cret-webhook-token"
HEADER = "X-Telegram-Bot-Api-Secret-Token"


async def test_webhook_calls_are_checked_stored_once_and_answered(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        url = "https://bot.example.com/hooks/telegram/main"
        accounts = {"main": {"token_env": "TG_MAIN", "api_base": bots.url, "mode": "webhook", "webhook_url": url,
                             "webhook_secret_env": "TG_SECRET", "allow_from": ["555"]}}  # fmt: skip
        config = configure(tmp_path, model, bots, accounts)
        async with daemon(home, "--config", str(config), env=env(TG_SECRET=SECRET)) as gw:
            await bots.wait_for(lambda: bool(bots.of("setWebhook", TOKEN)))
            registered = bots.of("setWebhook", TOKEN)[0].params
            assert registered["url"] == url and registered["secret_token"] == SECRET
            assert not bots.of("getUpdates", TOKEN)  # no polling in webhook mode
            bots.message(TOKEN, chat_id=555, from_id=555, text="via webhook")
            update = bots.take_update(TOKEN)
            hook = f"{gw.url}/hooks/telegram/main"
            async with aiohttp.ClientSession() as http:
                for headers in ({}, {HEADER: "wrong"}):
                    async with http.post(hook, json=update, headers=headers) as resp:
                        assert resp.status == 401
                        assert (await resp.json())["error"]["code"] == "invalid_signature"
                assert await session_lines(gw.url, "agent:main:main") == []
                async with http.post(hook, data=b"not json") as resp:  # the secret is checked first
                    assert resp.status == 401
                async with http.post(hook, data=b"not json", headers={HEADER: SECRET}) as resp:
                    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_body"
                async with http.post(f"{gw.url}/hooks/telegram/nobody", json=update, headers={HEADER: SECRET}) as resp:
                    assert resp.status == 404
                for _ in range(2):  # Telegram retries a call it did not see answered: stored once
                    async with http.post(hook, json=update, headers={HEADER: SECRET}) as resp:
                        assert resp.status == 200, await resp.text()
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 1)
            assert bots.sent(TOKEN)[0].params["text"] == "echo: via webhook"
            lines = await session_lines(gw.url, "agent:main:main")
            assert [x["content"] for x in lines] == ["via webhook", "echo: via webhook"]
            assert len(model.chat_requests) == 1
