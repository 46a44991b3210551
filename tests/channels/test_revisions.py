"""Edits and deletions are stored only where the message they change was stored. Before, with
``store_unmentioned: false``, an edit or a deletion of a group message that never addressed the
bot was stored all the same (Slack ``message_changed`` / ``message_deleted``, Telegram
``edited_message``), and the next mention sent it to the model; a Slack link unfurl (an edit with
the same text) was stored as an edit. In-process, against the local Slack and Bot API servers and
the local model server."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from channels.protocol import Inbound, Target
from channels.revisions import Ignored, digest, revise
from channels.store import StoredMessage
from tests.channels.harness import wait_until
from tests.conftest import FakeClock
from tests.gateway.helpers import make_app
from tests.support.openai_server import OpenAIServer
from tests.support.slack_server import SlackServer
from tests.support.telegram_server import TelegramServer

BOT, APP = "xoxb-revisions", "xapp-revisions"
TG_TOKEN = "333:revisions-secret"


def message(text: str, revision: Any = None, reply: bool = False, thread: str | None = None) -> Inbound:
    return Inbound("slack", "work", "main", "channel", "C1", "U1", text, "Ev1", Target("C1", thread),
                   thread_id=thread, reply=reply, message_id="1.5", revision=revision)  # fmt: skip


KNOWN = StoredMessage(digest("lunch at noon?"), None, False)
ANSWERED = StoredMessage(digest("<@UBOT> lunch?"), "1.0", True)


@pytest.mark.parametrize(
    ("inbound", "stored", "expected"),
    [
        (message("lunch at one?", "edit"), None, "ignored"),  # never stored: never reaches the model
        (message("", "delete"), None, "ignored"),
        (message("<@UBOT> lunch at one?", "edit", reply=True), None, (None, True, None)),  # a new mention
        (message("lunch at noon?", "edit"), KNOWN, "ignored"),  # the same text: a link unfurled
        (message("lunch at one?", "edit"), KNOWN, ("edit", False, None)),
        (message("<@UBOT> lunch at one?", "edit", reply=True), KNOWN, ("edit", True, None)),  # asks now
        (message("<@UBOT> lunch, then?", "edit", reply=True, thread="1.5"), ANSWERED, ("edit", False, "1.0")),
        (message("", "delete"), ANSWERED, ("delete", False, "1.0")),  # in the session its message is in
        (message("hello", reply=True), None, (None, True, None)),  # not a revision: as it is
    ],
)
def test_an_edit_or_deletion_is_stored_only_where_its_message_was(
    inbound: Inbound, stored: StoredMessage | None, expected: object
) -> None:
    got = revise(inbound, stored)
    if expected == "ignored":
        assert isinstance(got, Ignored)
    else:
        assert isinstance(got, Inbound) and (got.revision, got.reply, got.thread_id) == expected
        assert dataclasses.replace(got, revision=None, reply=True, thread_id=None) == dataclasses.replace(
            inbound, revision=None, reply=True, thread_id=None
        )


def user_texts(model: OpenAIServer) -> list[str]:
    request = model.chat_requests[-1]
    return [str(m["content"]) for m in request.messages if m["role"] == "user"]


async def test_slack_edits_and_deletions_of_unmentioned_messages_never_reach_the_model(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    async with OpenAIServer() as model, SlackServer() as slack:
        app = slack.add_app(BOT, APP)
        account = {"bot_token_env": "REV_BOT", "app_token_env": "REV_APP", "api_base": slack.url, "mode": "socket"}
        overrides = {"channels": {"slack": {"accounts": {"work": account}}}}
        gateway = make_app(tmp_path, clock, overrides, base_url=model.base_url, env={"REV_BOT": BOT, "REV_APP": APP})
        await aiohttp_client(gateway)

        async def send(event_id: str) -> str:
            await wait_until(lambda: not app.envelopes, timeout=30)  # handled (stored or skipped) and acknowledged
            return slack.ts.get(event_id, event_id)

        channel = {"channel": "C1", "channel_type": "channel"}
        # a message that does not mention the app, then its edit and its deletion: none stored
        lunch = await send(slack.message(app, user="U1", text="lunch at noon?", **channel))
        await send(slack.edit(app, ts=lunch, user="U1", text="lunch at one?", previous_text="lunch at noon?",
                              **channel))  # fmt: skip
        await send(slack.deletion(app, deleted_ts=lunch, user="U1", text="lunch at one?", **channel))
        # a mention, answered; its link unfurled (the same text): not stored; then really edited: stored
        asked = "<@UBOT> what is on https://example.com ?"
        mention = await send(slack.message(app, user="U1", text=asked, **channel))
        await slack.wait_for(lambda: len(slack.posted("C1")) == 1)
        assert user_texts(model) == [asked]
        await send(slack.edit(app, ts=mention, user="U1", text=asked, previous_text=asked, **channel))
        fixed = "<@UBOT> what is on https://example.org ?"
        await send(slack.edit(app, ts=mention, user="U1", text=fixed, previous_text=asked, **channel))
        # a message that did not mention the app, edited to mention it: a new mention, answered
        typo = await send(slack.message(app, user="U2", text="@bto status?", **channel))
        await send(slack.edit(app, ts=typo, user="U2", text="<@UBOT> status?", previous_text="@bto status?",
                              **channel))  # fmt: skip
        await slack.wait_for(lambda: len(slack.posted("C1")) == 2)
        await send(slack.message(app, user="U1", text="<@UBOT> and now?", **channel))
        await slack.wait_for(lambda: len(slack.posted("C1")) == 3)

        assert user_texts(model) == [asked, f"[edited message {mention}] {fixed}", "<@UBOT> status?",
                                     "<@UBOT> and now?"]  # fmt: skip
        assert len(model.chat_requests) == 3  # the edit of the answered mention was not answered


async def test_telegram_edits_of_unmentioned_group_messages_never_reach_the_model(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    async with OpenAIServer() as model, TelegramServer() as bots:
        bot = bots.add_bot(TG_TOKEN, "neo_bot")
        account = {"token_env": "REV_TG", "api_base": bots.url, "mode": "polling", "poll_timeout_s": 1}
        overrides = {"channels": {"telegram": {"accounts": {"main": account}}}}
        gateway = make_app(tmp_path, clock, overrides, base_url=model.base_url, env={"REV_TG": TG_TOKEN})
        await aiohttp_client(gateway)

        async def send(update_id: int) -> int:
            await wait_until(lambda: bot.confirmed > update_id, timeout=30)  # handled, its offset committed
            return bots.message_ids[update_id]

        group = {"chat_id": -100500, "chat_type": "supergroup"}
        lunch = await send(bots.message(TG_TOKEN, text="lunch at noon?", **group))
        await send(bots.message(TG_TOKEN, text="lunch at one?", edited=True, message_id=lunch, **group))
        asked = "@neo_bot what is new?"
        mentioned = {"entities": [{"type": "mention", "offset": 0, "length": 8}]}
        alice = {"from_id": 777, "first_name": "Алиса", **mentioned, **group}
        first = await send(bots.message(TG_TOKEN, text=asked, **alice))
        await bots.wait_for(lambda: len(bots.sent(TG_TOKEN)) == 1)
        assert user_texts(model) == [f"Алиса: {asked}"]
        await send(bots.message(TG_TOKEN, text=asked, edited=True, message_id=first, **alice))  # formatting only
        fixed = "@neo_bot what is newer?"
        await send(bots.message(TG_TOKEN, text=fixed, edited=True, message_id=first, **alice))
        await send(bots.message(TG_TOKEN, text="@neo_bot and now?", **mentioned, **group))
        await bots.wait_for(lambda: len(bots.sent(TG_TOKEN)) == 2)

        # the speaker's name, which OpenAI's name cannot hold, is in the text the model reads
        assert user_texts(model) == [f"Алиса: {asked}", f"Алиса: [edited message {first}] {fixed}",
                                     "@neo_bot and now?"]  # fmt: skip
