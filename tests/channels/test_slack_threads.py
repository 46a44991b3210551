"""Slack threads: a reply in a direct message's thread was answered at the direct message's top
level; ``reply_in_thread`` answers a channel mention in a thread of its own, whose next messages
continue its conversation. In-process, against the local Slack and model servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.channels.harness import wait_until
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer
from tests.support.slack_server import SlackServer

BOT, APP = "xoxb-threads", "xapp-threads"
OWNER = "U0OWNER"


async def test_direct_threads_and_channel_mentions_are_answered_in_their_thread(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    async with OpenAIServer() as model, SlackServer() as slack:
        app = slack.add_app(BOT, APP)
        account = {"bot_token_env": "TH_BOT", "app_token_env": "TH_APP", "api_base": slack.url, "mode": "socket",
                   "allow_from": [OWNER], "reply_in_thread": True}  # fmt: skip
        overrides = {"channels": {"slack": {"accounts": {"work": account}}}}
        gateway = make_app(tmp_path, clock, overrides, base_url=model.base_url, env={"TH_BOT": BOT, "TH_APP": APP})
        client = await aiohttp_client(gateway)

        # a direct message, then a reply in its thread: answered in that thread, in the same session
        top = slack.ts[slack.message(app, channel="D1", user=OWNER, text="plan the trip")]
        await slack.wait_for(lambda: len(slack.posted("D1")) == 1)
        assert slack.posted("D1")[0].params.get("thread_ts") is None
        slack.message(app, channel="D1", user=OWNER, text="and the budget?", thread_ts=top)
        await slack.wait_for(lambda: len(slack.posted("D1")) == 2)
        assert slack.posted("D1")[1].params.get("thread_ts") == top
        assert [m["content"] for m in model.chat_requests[-1].messages if m["role"] == "user"] == [
            "plan the trip", "and the budget?"]  # fmt: skip

        # reply_in_thread: a mention at the channel's top level is answered in a thread under it ...
        mention = slack.ts[slack.message(app, channel="C1", channel_type="channel", user="U2", text="<@UBOT> status?")]
        await slack.wait_for(lambda: len(slack.posted("C1")) == 1)
        assert slack.posted("C1")[0].params.get("thread_ts") == mention
        # ... and the thread's next mention continues that conversation
        slack.message(app, channel="C1", channel_type="channel", user="U2", text="<@UBOT> and?", thread_ts=mention)
        await slack.wait_for(lambda: len(slack.posted("C1")) == 2)
        assert slack.posted("C1")[1].params.get("thread_ts") == mention
        assert [m["content"] for m in model.chat_requests[-1].messages if m["role"] == "user"] == [
            "<@UBOT> status?", "<@UBOT> and?"]  # fmt: skip
        key = f"agent%3Amain%3Aslack%3Achannel%3AC1%3Athread%3A{mention}"
        assert (await client.get(f"/v1/sessions/{key}")).status == 200
        assert await wait_until(lambda: not app.envelopes)
