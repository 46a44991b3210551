"""Update ids are per bot: an account that moves to another bot (a new token of another bot under
the same account name) gets update ids that may repeat the first bot's. Before, its messages were
keyed ``telegram:<account>:<update_id>`` like the first bot's and dropped as duplicates; now any
bot but the account's first carries its id in the key. The first bot keeps the key earlier
versions wrote, so a home upgraded with an update stored but not confirmed stores it once when
Telegram delivers it again. The app in-process, the local Bot API server, the local model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.keys import CHANNELS
from tests.channels.harness import BOT, OTHER_TOKEN, TOKEN, wait_until
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer
from tests.support.telegram_server import TelegramServer

pytestmark = pytest.mark.realtime


def telegram(bots: TelegramServer) -> dict[str, Any]:
    account = {"token_env": "TG_MAIN", "api_base": bots.url, "allow_from": ["555"], "poll_timeout_s": 1}
    return {"channels": {"telegram": {"accounts": {"main": account}}}}


async def stored(client: Any, key: str = "agent:main:main") -> list[dict[str, Any]]:
    resp = await client.get(f"/v1/sessions/{key.replace(':', '%3A')}")
    run_id = (await resp.json())["run_id"]
    messages: list[dict[str, Any]] = (await (await client.get(f"/v1/runs/{run_id}/messages")).json())["messages"]
    return messages


async def test_a_new_bot_whose_update_ids_start_again_is_not_taken_for_a_duplicate(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    async with OpenAIServer() as model:
        async with TelegramServer() as bots:
            bots.add_bot(TOKEN, BOT)
            first = bots.message(TOKEN, chat_id=555, from_id=555, text="to the first bot")
            app = make_app(tmp_path, clock, telegram(bots), base_url=model.base_url, env={"TG_MAIN": TOKEN})
            client = await aiohttp_client(app)
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 1, timeout=20)
            await wait_until(lambda: bots.bots[TOKEN].confirmed > first)
            await client.close()
        async with TelegramServer() as other:  # another bot: its update ids know nothing of the first's
            other.add_bot(OTHER_TOKEN, "other_bot")
            second = other.message(OTHER_TOKEN, chat_id=555, from_id=555, text="to the new bot")
            assert second == first
            app = make_app(tmp_path, clock, telegram(other), base_url=model.base_url, env={"TG_MAIN": OTHER_TOKEN})
            client = await aiohttp_client(app)
            await other.wait_for(lambda: len(other.sent(OTHER_TOKEN)) == 1, timeout=20)
            assert other.sent(OTHER_TOKEN)[0].params["text"] == "echo: to the new bot"
            lines = await wait_until(lambda: _answered_twice(client))
    users = [(x["content"], x["client_message_id"]) for x in lines if x["role"] == "user"]
    assert users == [("to the first bot", f"telegram:main:{first}"), ("to the new bot", f"telegram:main:222:{second}")]


async def _answered_twice(client: Any) -> list[dict[str, Any]] | None:
    lines = await stored(client)
    return lines if len(lines) == 4 else None


async def test_after_an_upgrade_the_first_bot_s_redelivered_update_is_stored_once(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    """An earlier version stored an update under ``telegram:main:<update_id>`` and was killed
    before committing its offset: the same bot delivers it again to the upgraded gateway, which
    must recognise it (a key with the bot's id in it would store it twice)."""
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        update = bots.message(TOKEN, chat_id=555, from_id=555, text="only once")
        earlier = await aiohttp_client(make_app(tmp_path, clock, base_url=model.base_url))  # no account: it only stores
        seeded = {"content": "only once", "name": "Ann", "client_message_id": f"telegram:main:{update}"}
        resp = await earlier.post("/v1/sessions/agent%3Amain%3Amain/messages", json=seeded)
        assert resp.status == 200, await resp.text()
        await wait_until(lambda: len(model.chat_requests) == 1)
        await earlier.close()
        client = await aiohttp_client(make_app(tmp_path, clock, telegram(bots), base_url=model.base_url,
                                               env={"TG_MAIN": TOKEN}))  # fmt: skip
        await wait_until(lambda: bots.bots[TOKEN].confirmed > update, timeout=20)
        await client.app[CHANNELS].idle()
        lines = await stored(client)
        assert [(x["role"], x["content"]) for x in lines] == [("user", "only once"), ("assistant", "echo: only once")]
        assert len(model.chat_requests) == 1
