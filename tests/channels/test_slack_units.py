"""Slack: Markdown to mrkdwn, and Events API events to the messages the engine stores (tables)."""

from __future__ import annotations

from typing import Any

import pytest

from channels.protocol import Inbound
from channels.slack_events import Skip, inbound, slash_inbound
from channels.slack_format import split, to_mrkdwn
from config.channels import SlackAccount


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("a & <b> > c", "a &amp; &lt;b&gt; &gt; c"),
        ("**bold** *it* _it_ ~~gone~~", "*bold* _it_ _it_ ~gone~"),
        ("[site](https://e.com/?a=1&b=2)", "<https://e.com/?a=1&b=2|site>"),
        ("`a*b* <x>`", "`a*b* &lt;x&gt;`"),
        ("# Title\n- item", "*Title*\n• item"),
        ("```\nif a<b:\n  **x**\n```", "```\nif a&lt;b:\n  **x**\n```"),
        ("```\nunclosed", "```\nunclosed\n```"),
    ],
)
def test_markdown_becomes_mrkdwn(markdown: str, expected: str) -> None:
    assert to_mrkdwn(markdown) == expected


def test_a_long_answer_is_split_between_paragraphs_under_the_limit() -> None:
    text = "\n\n".join(f"Part {i}. " + "word " * 150 for i in range(12))
    parts = split(text)
    assert len(parts) > 1 and all(len(p) <= 4000 for p in parts) and "\n\n".join(parts) == text


CH = "channel"


def payload(**event: Any) -> dict[str, Any]:
    return {"event_id": "Ev1", "event": {"type": "message", "user": "U1", "ts": "1.000100", **event}}


@pytest.mark.parametrize(
    ("event", "account", "expected"),
    [
        ({"channel": "D1", "channel_type": "im", "text": "hi"}, {}, ("direct", None, True)),
        ({"channel": "C1", "channel_type": CH, "text": "hi"}, {}, "skip"),
        ({"channel": "C1", "channel_type": CH, "text": "hi"}, {"store_unmentioned": 1}, ("channel", None, False)),
        ({"channel": "C1", "channel_type": CH, "text": "<@UBOT> hi"}, {}, ("channel", None, True)),
        ({"channel": "C1", "channel_type": CH, "text": "<@UBOT> hi", "thread_ts": "0.5"}, {}, ("channel", "0.5", True)),
        ({"channel": "C1", "channel_type": CH, "text": "<@UBOT>", "thread_ts": "1.000100"}, {}, (CH, None, True)),
        ({"channel": "G1", "channel_type": "group", "text": "hi"}, {"require_mention": False}, ("channel", None, True)),
        ({"channel": "D1", "channel_type": "im", "text": "x", "bot_id": "B1"}, {}, "skip"),
        ({"channel": "D1", "channel_type": "im", "text": "x", "user": "UBOT"}, {}, "skip"),
        ({"channel": "C1", "channel_type": CH, "subtype": "channel_join", "text": "joined"}, {}, "skip"),
    ],
)  # fmt: skip
def test_events_become_messages(event: dict[str, Any], account: dict[str, Any], expected: object) -> None:
    got = inbound(payload(**event), "work", SlackAccount(**account), "UBOT")
    if expected == "skip":
        assert isinstance(got, Skip)
        return
    assert isinstance(got, Inbound)
    assert (got.chat_type, got.thread_id, got.reply) == expected
    assert got.client_message_id == "slack:work:Ev1" and got.target.thread_id == got.thread_id


@pytest.mark.parametrize(
    ("event", "account", "expected"),
    [
        ({"channel": "D1", "channel_type": "im", "text": "and?", "thread_ts": "0.5"}, {}, (None, "0.5")),
        ({"channel": "D1", "channel_type": "im", "text": "hi"}, {}, (None, None)),
        ({"channel": "C1", "channel_type": CH, "text": "<@UBOT> hi"}, {"reply_in_thread": True},
         ("1.000100", "1.000100")),  # a thread of its own, its session
        ({"channel": "C1", "channel_type": CH, "text": "<@UBOT> hi", "thread_ts": "0.5"}, {"reply_in_thread": True},
         ("0.5", "0.5")),
        ({"channel": "C1", "channel_type": CH, "text": "hi"}, {"reply_in_thread": True, "store_unmentioned": True},
         (None, None)),  # not answered: stays in the channel's session
        ({"channel": "D1", "channel_type": "im", "text": "hi"}, {"reply_in_thread": True}, (None, None)),
    ],
)  # fmt: skip
def test_where_an_answer_goes_in_threads(event: dict[str, Any], account: dict[str, Any], expected: object) -> None:
    got = inbound(payload(**event), "work", SlackAccount(**account), "UBOT")
    assert isinstance(got, Inbound) and (got.thread_id, got.target.thread_id) == expected


def test_files_are_described_and_an_edit_is_an_edit_of_its_message() -> None:
    files = [{"name": "r.pdf", "mimetype": "application/pdf"}]
    got = inbound(payload(channel="D1", channel_type="im", subtype="file_share", text="see", files=files), "w",
                  SlackAccount(), "UBOT")  # fmt: skip
    assert isinstance(got, Inbound) and got.text == "see\n[file r.pdf (application/pdf)]"
    edit = payload(channel="D1", channel_type="im", subtype="message_changed",
                   message={"user": "U1", "text": "fixed", "ts": "1.0"})  # fmt: skip
    got = inbound(edit, "w", SlackAccount(), "UBOT")
    assert isinstance(got, Inbound) and got.content == "[edited message 1.0] fixed" and got.revision == "edit"
    assert (got.message_id, got.text) == ("1.0", "fixed")


def test_a_deletion_of_a_users_message_is_a_deletion_of_it_without_an_answer() -> None:
    deleted = payload(channel="C1", channel_type="channel", subtype="message_deleted", hidden=True,
                      deleted_ts="1700000000.000007", previous_message={"user": "U1", "text": "oops", "ts":
                      "1700000000.000007", "thread_ts": "1699999999.000100"})  # fmt: skip
    got = inbound(deleted, "w", SlackAccount(), "UBOT")
    assert isinstance(got, Inbound) and got.content == "[deleted message 1700000000.000007]" and got.reply is False
    assert (got.revision, got.message_id) == ("delete", "1700000000.000007")
    assert (got.sender_id, got.chat_type, got.thread_id) == ("U1", "channel", "1699999999.000100")
    by_bot = payload(channel="D1", channel_type="im", subtype="message_deleted", deleted_ts="2.0",
                     previous_message={"user": "UBOT", "text": "my answer", "ts": "2.0"})  # fmt: skip
    assert isinstance(inbound(by_bot, "w", SlackAccount(), "UBOT"), Skip)


@pytest.mark.parametrize(
    ("channel", "chat_type"), [("D024BE91L", "direct"), ("C2147483705", "channel"), ("G1", "channel")]
)
def test_a_slash_command_is_its_command_as_text_in_the_conversation_it_was_typed_in(
    channel: str, chat_type: str
) -> None:
    command = {"command": "/status", "text": "", "user_id": "U1", "user_name": "ann", "channel_id": channel,
               "trigger_id": "13345224609.738474920.8088930838d88f008e0", "response_url": "https://hooks"}  # fmt: skip
    got = slash_inbound(command, "work", SlackAccount())
    assert isinstance(got, Inbound)
    assert (got.text, got.chat_type, got.chat_id, got.sender_id) == ("/status", chat_type, channel, "U1")
    assert got.client_message_id == "slack:work:cmd:13345224609.738474920.8088930838d88f008e0"
    again = slash_inbound({**command, "command": "/new", "text": " now "}, "w", SlackAccount())
    assert isinstance(again, Inbound) and again.text == "/new now" and again.reply
    assert isinstance(slash_inbound({**command, "user_id": None}, "w", SlackAccount()), Skip)
