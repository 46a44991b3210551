"""Strangers never share the owner's session (issue 40 item 1). With ``dm_policy: open`` (or
``pairing``, once approved) and the default ``session.dm_scope: main``, every sender's direct
message went to ``agent:main:main``: a stranger's prompt held the owner's messages, and the memory
scope of that key is the owner's (``MEMORY.md``). Now a sender who is not in ``allow_from`` gets a
session of their own (``per-channel-peer``) and with it a memory scope of their own, and
``config check`` names what still shares a session or a memory between people."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from channels.access import direct_scope
from config.channels import SlackAccount, TelegramAccount
from conversations.memory_scope import scope_of_raw
from gateway.validation import check_config
from tests.channels.harness import wait_until
from tests.conftest import FakeClock
from tests.gateway.helpers import gateway_config, make_app
from tests.support.openai_server import Fail, OpenAIServer
from tests.support.slack_server import SlackServer

OWNER, STRANGER, SECOND = "U0OWNER", "U0STRANGER", "U0SECOND"
BOT, APP = "xoxb-privacy", "xapp-privacy"


@pytest.mark.parametrize(
    ("policy", "sender", "dm_scope", "routed"),
    [
        ("open", STRANGER, "main", "per-channel-peer"),
        ("pairing", STRANGER, "main", "per-channel-peer"),  # approved or not: not the owner
        ("open", OWNER, "main", "main"),
        ("pairing", OWNER, "main", "main"),
        ("allowlist", OWNER, "main", "main"),  # only the owner's ids are admitted at all
        ("open", STRANGER, "per-peer", "per-peer"),  # the operator's own choice already separates them
        ("open", OWNER, "per-channel-peer", "per-channel-peer"),
    ],
)
def test_a_direct_message_is_routed_to_the_owner_s_session_only_from_the_owner(
    policy: str, sender: str, dm_scope: Any, routed: str
) -> None:
    account = TelegramAccount(dm_policy=policy, allow_from=[OWNER])  # type: ignore[arg-type]
    assert direct_scope(sender, account, dm_scope) == routed
    assert direct_scope(OWNER, None, "main") == "per-channel-peer"  # an account a reload removed: nobody's owner


async def test_a_stranger_on_an_open_account_sees_neither_the_owner_s_messages_nor_memory(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    async with OpenAIServer() as model, SlackServer() as slack:
        app = slack.add_app(BOT, APP)
        account = {"bot_token_env": "PRIV_BOT", "app_token_env": "PRIV_APP", "api_base": slack.url,
                   "mode": "socket", "dm_policy": "open", "allow_from": [OWNER]}  # fmt: skip
        overrides = {"channels": {"slack": {"accounts": {"work": account}}}}
        gateway = make_app(tmp_path, clock, overrides, base_url=model.base_url, env={"PRIV_BOT": BOT, "PRIV_APP": APP})
        client = await aiohttp_client(gateway)

        slack.message(app, channel="D1", user=OWNER, text="note for me: the door PIN is 4711")
        await slack.wait_for(lambda: len(slack.posted("D1")) == 1)
        slack.message(app, channel="D2", user=STRANGER, text="what is the door PIN?")
        await slack.wait_for(lambda: len(slack.posted("D2")) == 1)

        async def contents(key: str) -> list[str]:
            resp = await client.get(f"/v1/sessions/{key.replace(':', '%3A')}")
            if resp.status == 404:
                return []
            run_id = (await resp.json())["run_id"]
            body = await (await client.get(f"/v1/runs/{run_id}/messages")).json()
            return [m["content"] for m in body["messages"]]

        mine = await wait_until(lambda: contents("agent:main:main"), timeout=30)
        assert mine == ["note for me: the door PIN is 4711", "echo: note for me: the door PIN is 4711"]
        theirs = await contents("agent:main:slack:dm:U0STRANGER")
        assert theirs == ["what is the door PIN?", "echo: what is the door PIN?"]
        asked = [r for r in model.chat_requests if r.last_user_text == "what is the door PIN?"]
        assert asked and "4711" not in json.dumps(asked[0].messages)  # the owner's turn is not in the prompt
        agents = ["main"]
        assert scope_of_raw("agent:main:main", "per-peer", agents) is None  # the owner: MEMORY.md
        stranger_scope = scope_of_raw("agent:main:slack:dm:U0STRANGER", "per-peer", agents)
        assert stranger_scope is not None and "U0STRANGER" in stranger_scope  # a scope of their own


def test_config_check_names_what_still_shares_a_session_or_a_memory(tmp_path: Path) -> None:
    accounts = {"team": {"dm_policy": "allowlist", "allow_from": [OWNER, SECOND]},
                "public": {"dm_policy": "pairing", "allow_from": [OWNER]}}  # fmt: skip
    shared = gateway_config(tmp_path, {"channels": {"slack": {"accounts": accounts}}, "memory": {"scope": "shared"}})
    env = {"SLACK_BOT_TOKEN": "x", "SLACK_APP_TOKEN": "y"}
    warnings = check_config(shared, env)
    assert any(
        w.startswith("channels.slack.accounts.team: allow_from lists 2 ids and session.dm_scope is main")
        for w in warnings
    ), warnings
    assert any(
        w.startswith("channels.slack.accounts.public: dm_policy pairing with memory.scope shared") for w in warnings
    ), warnings
    separate = gateway_config(
        tmp_path, {"channels": {"slack": {"accounts": accounts}}, "session": {"dm_scope": "per-channel-peer"}}
    )
    assert check_config(separate, env) == []
    assert SlackAccount(dm_policy="open").allow_from == ()  # nobody is the owner: everyone gets their own


async def test_a_model_failure_gives_the_chat_user_a_short_apology_and_the_log_the_details(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 40 item 4: a model failure reached the chat user with the internal model URL and the
    operator's advice ("(no answer: model server http://... answered 500 ...)")."""
    async with OpenAIServer() as model, SlackServer() as slack:
        model.add_rule(lambda r: Fail(500, message="upstream exploded at 10.0.0.7"))
        app = slack.add_app(BOT, APP)
        account = {"bot_token_env": "PRIV_BOT", "app_token_env": "PRIV_APP", "api_base": slack.url,
                   "mode": "socket", "dm_policy": "allowlist", "allow_from": [OWNER]}  # fmt: skip
        overrides = {"channels": {"slack": {"accounts": {"work": account}}}}
        gateway = make_app(tmp_path, clock, overrides, base_url=model.base_url, env={"PRIV_BOT": BOT, "PRIV_APP": APP})
        await aiohttp_client(gateway)
        with caplog.at_level(logging.WARNING, logger="channels.intake"):
            slack.message(app, channel="D1", user=OWNER, text="hello?")
            await slack.wait_for(lambda: len(slack.posted("D1")) == 1)
        said = str(slack.posted("D1")[0].params["text"])
        assert said.startswith("Sorry, I could not answer this message") and "try again" in said, said
        for internal in (model.base_url, "127.0.0.1", "10.0.0.7", "agents.", "model"):
            assert internal not in said, said
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert "the turn on agent:main:main failed" in logged and model.base_url.split("/v1")[0] in logged, logged
