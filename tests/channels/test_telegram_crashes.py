"""Nothing lost, nothing twice: a real daemon killed with SIGKILL (``_NEOTASK_CRASH_AT``) between
storing an update and committing its offset, and between the model's answer and the send."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.channels.harness import BOT, TOKEN, configure, daemon, env, stored, wait_until
from tests.support.openai_server import OpenAIServer
from tests.support.telegram_server import TelegramServer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]


async def test_killed_between_storing_an_update_and_committing_its_offset_it_is_stored_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        config = configure(tmp_path, model, bots)
        async with daemon(home, "--config", str(config), env=env(_NEOTASK_CRASH_AT="channels.stored")) as gw:
            update = bots.message(TOKEN, chat_id=555, from_id=555, text="keep me once")
            assert await gw.wait(timeout=60) == -9
        assert bots.bots[TOKEN].confirmed <= update  # the offset never went past it
        mine = [x for x in stored(home, "agent:main:main") if x.get("client_message_id") == f"telegram:main:{update}"]
        assert len(mine) == 1  # durable before the kill
        async with daemon(home, "--config", str(config), env=env()):
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 1, timeout=60)
            await wait_until(lambda: bots.bots[TOKEN].confirmed > update)
            assert bots.sent(TOKEN)[0].params["text"] == "echo: keep me once"
        lines = stored(home, "agent:main:main")
        assert [(x["role"], x["content"]) for x in lines] == [
            ("user", "keep me once"), ("assistant", "echo: keep me once")
        ]  # fmt: skip
        assert len(bots.sent(TOKEN)) == 1


async def test_killed_between_the_answer_and_the_send_the_answer_is_sent_after_restart(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        config = configure(tmp_path, model, bots)
        async with daemon(home, "--config", str(config), env=env(_NEOTASK_CRASH_AT="channels.answered")) as gw:
            bots.message(TOKEN, chat_id=555, from_id=555, text="answer me")
            assert await gw.wait(timeout=60) == -9
        assert bots.sent(TOKEN) == [] and len(model.chat_requests) == 1
        async with daemon(home, "--config", str(config), env=env()):
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 1, timeout=60)
            assert bots.sent(TOKEN)[0].params["text"] == "echo: answer me"
        assert len(model.chat_requests) == 1  # the answer was kept, not asked again
        assert len(bots.sent(TOKEN)) == 1
        lines = stored(home, "agent:main:main")
        assert [(x["role"], x["content"]) for x in lines] == [("user", "answer me"), ("assistant", "echo: answer me")]
