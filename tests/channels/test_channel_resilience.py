"""A channel never dies quietly: the real connectors (aiogram, slack_sdk) in the app, in-process,
against the local Bot API and Slack servers.

Before, one update aiogram could not read (a poll as an older Bot API sends it) failed the whole
``getUpdates`` answer and ended the polling task without a log line, ``connected: true`` in the
status; so did an HTML 502 page from a proxy; an HTML 502 answer to ``sendMessage`` left the
reply unsent until the next restart; and a 5xx at Slack's ``auth.test`` stopped the account for
good as a "refused token"."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.keys import CHANNELS
from tests.channels.harness import BOT, TOKEN, wait_until
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer
from tests.support.slack_server import SlackServer
from tests.support.telegram_server import Failure, TelegramServer, bad_gateway, newer_shape, older_poll

pytestmark = pytest.mark.realtime
SECRET = "s3cret-webhook-token"


def telegram(bots: TelegramServer, **more: Any) -> dict[str, Any]:
    account = {"token_env": "TG_MAIN", "api_base": bots.url, "allow_from": ["555", "556", "557"],
               "poll_timeout_s": 1, **more}  # fmt: skip
    return {"channels": {"telegram": {"accounts": {"main": account}}}, "session": {"dm_scope": "per-peer"}}


async def status(client: TestClient[Any, Any], account: str = "main") -> dict[str, Any]:
    accounts = (await (await client.get("/v1/channels")).json())["accounts"]
    found: dict[str, Any] = next(a for a in accounts if a["account"] == account)
    return found


def unreadable_rows(home: Path) -> list[tuple[str, str, str]]:
    with contextlib.closing(sqlite3.connect(home / "channels.db")) as db:
        rows = db.execute("SELECT update_id, reason, body FROM unreadable_updates").fetchall()
    return [(str(a), str(b), str(c)) for a, b, c in rows]


async def test_an_update_aiogram_cannot_read_is_logged_recorded_and_confirmed_and_the_rest_flow(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        bots.message(TOKEN, chat_id=555, from_id=555, text="before the poll")
        poll = bots.update(TOKEN, older_poll(556, from_id=556))
        after = bots.message(TOKEN, chat_id=557, from_id=557, text="after the poll")
        with caplog.at_level(logging.WARNING, logger="channels.telegram"):
            client = await aiohttp_client(
                make_app(tmp_path, clock, telegram(bots), base_url=model.base_url, env={"TG_MAIN": TOKEN})
            )
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 2, timeout=20)
            await wait_until(lambda: bots.bots[TOKEN].confirmed > after)
        assert sorted(str(c.params["text"]) for c in bots.sent(TOKEN)) == ["echo: after the poll",
                                                                           "echo: before the poll"]  # fmt: skip
        [(update_id, reason, body)] = unreadable_rows(tmp_path)
        assert update_id == str(poll) and "persistent_id" in reason and '"Lunch?"' in body
        logged = [r.getMessage() for r in caplog.records if f"update {poll}" in r.getMessage()]
        assert len(logged) == 1 and "could not be read" in logged[0] and "persistent_id" in logged[0], logged
        shown = await status(client)
        assert shown["connected"] and shown["updates_unreadable"] == 1 and shown["restarts"] == 0


async def test_an_html_502_page_is_retried_like_a_5xx_for_updates_and_for_replies(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        bots.fail("getUpdates", bad_gateway(), bad_gateway())
        bots.fail("sendMessage", bad_gateway())
        bots.message(TOKEN, chat_id=555, from_id=555, text="through the proxy")
        with caplog.at_level(logging.WARNING):
            client = await aiohttp_client(
                make_app(tmp_path, clock, telegram(bots), base_url=model.base_url, env={"TG_MAIN": TOKEN})
            )
            shown = await wait_until(lambda: _failing(client), timeout=20)
            assert not shown["connected"] and "not JSON" in shown["last_error"], shown
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 1, timeout=20)
        assert bots.sent(TOKEN)[0].params["text"] == "echo: through the proxy"
        assert len(bots.of("sendMessage", TOKEN)) == 2  # the 502 page, then the reply, in the same process
        logged = [r.getMessage() for r in caplog.records]
        assert any("getUpdates" not in m and "not JSON" in m and "part 1 not sent" in m for m in logged), logged
        assert any("telegram account main" in m and "not JSON" in m and "trying again" in m for m in logged), logged
        assert all("<html>" not in m for m in logged)  # the page is summed up, not dumped
        shown = await status(client)
        assert shown["connected"] and shown["last_error"] is None and shown["restarts"] == 0


async def test_a_reply_telegram_took_but_answered_in_a_shape_aiogram_does_not_read_is_not_sent_again(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        bots.fail("sendMessage", newer_shape())
        bots.message(TOKEN, chat_id=555, from_id=555, text="once is enough")
        client = await aiohttp_client(
            make_app(tmp_path, clock, telegram(bots), base_url=model.base_url, env={"TG_MAIN": TOKEN})
        )
        await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 1, timeout=20)
        await client.app[CHANNELS].idle()
        assert len(bots.of("sendMessage", TOKEN)) == 1 and (await status(client))["messages_out"] == 1
        with contextlib.closing(sqlite3.connect(tmp_path / "channels.db")) as db:
            assert db.execute("SELECT state, attempts FROM outbox").fetchall() == [("sent", 0)]


async def _failing(client: TestClient[Any, Any], account: str = "main") -> dict[str, Any] | None:
    shown = await status(client, account)
    return shown if shown["last_error"] else None


async def test_a_poll_loop_that_ends_for_a_reason_it_does_not_know_is_logged_and_restarted(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        unknown = Failure(400, "Bad Request: a failure the poll loop was not written for")
        bots.fail("getUpdates", unknown, unknown)
        with caplog.at_level(logging.ERROR, logger="channels"):
            client = await aiohttp_client(
                make_app(tmp_path, clock, telegram(bots), base_url=model.base_url, env={"TG_MAIN": TOKEN})
            )
            shown = await wait_until(lambda: _failing(client), timeout=20)
            assert not shown["connected"] and shown["restarts"] >= 1, shown
            assert "a failure the poll loop was not written for" in shown["last_error"], shown
            assert "restarting in" in shown["last_error"], shown
            bots.message(TOKEN, chat_id=555, from_id=555, text="still there?")
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 1, timeout=20)
        lines = [r for r in caplog.records if "telegram account main" in r.getMessage()]
        assert ["restarting in 1 s" in r.getMessage() for r in lines] == [True, False], lines
        assert "restarting in 2 s" in lines[1].getMessage()  # a backoff
        assert all("stopped" in r.getMessage() and r.exc_info is not None for r in lines)  # with the traceback
        assert len(bots.of("getMe", TOKEN)) == 3  # each time connected again from the start
        shown = await status(client)
        assert shown["connected"] and shown["last_error"] is None and shown["restarts"] == 2


async def test_a_webhook_update_aiogram_cannot_read_is_recorded_and_answered_200(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    async with OpenAIServer() as model, TelegramServer() as bots:
        bots.add_bot(TOKEN, BOT)
        overrides = telegram(bots, mode="webhook", webhook_url="https://bot.example.com/hooks/telegram/main",
                             webhook_secret_env="TG_SECRET")  # fmt: skip
        env = {"TG_MAIN": TOKEN, "TG_SECRET": SECRET}
        client = await aiohttp_client(make_app(tmp_path, clock, overrides, base_url=model.base_url, env=env))
        await wait_until(lambda: _connected(client), timeout=20)
        poll = bots.update(TOKEN, older_poll(556, from_id=556))
        update = bots.take_update(TOKEN)
        headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
        for _ in range(2):  # Telegram would retry a call not answered 2xx, and hold the updates after it
            resp = await client.post("/hooks/telegram/main", json=update, headers=headers)
            assert resp.status == 200, await resp.text()
        [(update_id, reason, _)] = unreadable_rows(tmp_path)
        assert update_id == str(poll) and "persistent_id" in reason
        assert (await status(client))["updates_unreadable"] == 1  # recorded once
        resp = await client.post("/hooks/telegram/main", json={"no": "update_id"}, headers=headers)
        assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_field"  # not an update at all


async def _connected(client: TestClient[Any, Any]) -> bool:
    return bool((await status(client))["connected"])


async def test_a_5xx_or_an_html_page_at_slack_auth_test_is_retried_not_taken_for_a_refused_token(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with OpenAIServer() as model, SlackServer() as slack:
        app = slack.add_app("xoxb-flaky", "xapp-flaky")
        slack.fail("auth.test", 502, "Bad Gateway", html=True)
        slack.fail("auth.test", 503, "service_unavailable")
        account = {"bot_token_env": "FLAKY_BOT", "app_token_env": "FLAKY_APP", "api_base": slack.url,
                   "mode": "socket", "allow_from": ["U0OWNER"]}  # fmt: skip
        overrides = {"channels": {"slack": {"accounts": {"work": account}}}}
        env = {"FLAKY_BOT": "xoxb-flaky", "FLAKY_APP": "xapp-flaky"}
        with caplog.at_level(logging.WARNING, logger="channels.slack"):
            client = await aiohttp_client(make_app(tmp_path, clock, overrides, base_url=model.base_url, env=env))
            shown = await wait_until(lambda: _failing(client, "work"), timeout=20)
            assert not shown["connected"] and "refused" not in shown["last_error"], shown
            slack.message(app, channel="D1", user="U0OWNER", text="are you up?")
            await slack.wait_for(lambda: len(slack.posted("D1")) == 1, timeout=20)
        assert [c.method for c in slack.calls].count("auth.test") == 3
        logged = [r.getMessage() for r in caplog.records]
        assert not any("refused" in m for m in logged), logged
        assert any("502" in m and "trying again" in m for m in logged), logged
        shown = await status(client, "work")
        assert shown["connected"] and shown["last_error"] is None
