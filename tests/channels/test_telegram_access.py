"""Who may talk to a bot (``dm_policy``), a refused token, and ``neotask channels status`` /
``approve`` against a real daemon with four Telegram accounts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.channels.harness import TOKEN, configure, daemon, env, session_lines
from tests.gateway.daemons import child_env, run_cli
from tests.support.openai_server import OpenAIServer
from tests.support.telegram_server import TelegramServer

pytestmark = [pytest.mark.slow, pytest.mark.realtime]
PAIR, OPEN = "333:pair-secret", "444:open-secret"


def account(bots: TelegramServer, token_env: str, policy: str) -> dict[str, Any]:
    return {"token_env": token_env, "api_base": bots.url, "dm_policy": policy, "allow_from": ["555"],
            "poll_timeout_s": 1}  # fmt: skip


async def test_unknown_senders_under_each_policy_and_a_refused_token(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with OpenAIServer() as model, TelegramServer() as bots:
        for token, name in ((TOKEN, "allow_bot"), (PAIR, "pair_bot"), (OPEN, "open_bot")):
            bots.add_bot(token, name)
        accounts = {
            "allow": account(bots, "TG_MAIN", "allowlist"),
            "pair": account(bots, "TG_PAIR", "pairing"),
            "open": account(bots, "TG_OPEN", "open"),
            "broken": account(bots, "TG_BROKEN", "open"),
        }
        config = configure(tmp_path, model, bots, accounts, session={"dm_scope": "per-peer"})
        daemon_env = env(TG_PAIR=PAIR, TG_OPEN=OPEN, TG_BROKEN="999:refused-by-the-server")
        cli = ("--home", str(home), "--config", str(config))
        async with daemon(home, "--config", str(config), env=daemon_env) as gw:
            # allowlist: an unknown sender is not stored and not answered; a listed one is
            bots.message(TOKEN, chat_id=901, from_id=901, text="let me in")
            bots.message(TOKEN, chat_id=555, from_id=555, text="it's me")
            await bots.wait_for(lambda: len(bots.sent(TOKEN)) == 1)
            assert str(bots.sent(TOKEN)[0].params["chat_id"]) == "555"
            assert await session_lines(gw.url, "agent:main:dm:901") == []

            # open: anyone is answered
            bots.message(OPEN, chat_id=903, from_id=903, text="hi open")
            await bots.wait_for(lambda: len(bots.sent(OPEN)) == 1)
            opened = await session_lines(gw.url, "agent:main:dm:903")
            assert [x["content"] for x in opened] == ["hi open", "echo: hi open"]

            # pairing: a one-time code, nothing stored; approved with the CLI, then answered
            bots.message(PAIR, chat_id=902, from_id=902, first_name="Cy", text="hello?")
            await bots.wait_for(lambda: len(bots.sent(PAIR)) == 1)
            notice = bots.sent(PAIR)[0].params["text"]
            code = notice.split("Pairing code: ")[1].split()[0]
            assert f"neotask channels approve {code}" in notice
            again = bots.message(PAIR, chat_id=902, from_id=902, first_name="Cy", text="still me")
            await bots.wait_for(lambda: bots.bots[PAIR].confirmed > again)
            assert len(bots.sent(PAIR)) == 1  # the code is not sent again while it is good
            assert await session_lines(gw.url, "agent:main:dm:902") == []
            bad = await run_cli("channels", "approve", "WXYZ2345", *cli, env=child_env())
            assert bad.returncode != 0 and "pairing_code_not_found" in bad.stderr
            approved = await run_cli("channels", "approve", code.lower(), *cli, env=child_env())
            assert approved.returncode == 0, approved.stderr
            assert "pair now takes messages from 902 (Cy)" in approved.stdout
            told = bots.sent(PAIR)[1].params  # the CLI's approval reached the running connector
            assert told["text"].startswith("You are approved") and str(told["chat_id"]) == "902"
            bots.message(PAIR, chat_id=902, from_id=902, first_name="Cy", text="now?")
            await bots.wait_for(lambda: len(bots.sent(PAIR)) == 3)
            assert bots.sent(PAIR)[2].params["text"] == "echo: now?"

            # the refused token: one clear line at start; the other accounts kept running (above)
            refused = [line for line in gw.stderr().splitlines() if "telegram account broken" in line]
            assert len(refused) == 1, refused
            assert "TG_BROKEN" in refused[0] and "401" in refused[0] and "the others keep running" in refused[0]
            assert "999:refused" not in gw.stderr()  # the token itself is never logged

            status = await run_cli("channels", "status", "--json", *cli, env=child_env())
            by_name = {a["account"]: a for a in json.loads(status.stdout)["accounts"]}
            assert by_name["allow"]["connected"] is True and by_name["allow"]["username"] == "allow_bot"
            assert by_name["allow"]["messages_in"] == 1 and by_name["allow"]["messages_out"] == 1
            assert by_name["allow"]["last_update_at"] is not None
            assert by_name["broken"]["connected"] is False and "401" in by_name["broken"]["last_error"]
            table = await run_cli("channels", "status", *cli, env=child_env())
            assert "not connected" in table.stdout and "@open_bot" in table.stdout
        offline = await run_cli("channels", "status", *cli, env=child_env())
        assert offline.returncode == 0 and "no gateway running" in offline.stdout
