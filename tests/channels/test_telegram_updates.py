"""Telegram updates (parsed by aiogram's own types) to the messages the engine stores: a table.

aiogram is imported by the first test that parses, not when the suite is collected: its types
cost seconds of CPU, which every pytest-xdist worker paid at collection for this one module."""

from __future__ import annotations

import functools
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from channels.protocol import Inbound
from config.channels import TelegramAccount

if TYPE_CHECKING:
    from aiogram.types import Update

    from channels.telegram_updates import Skip


@functools.cache
def tg() -> ModuleType:
    import channels.telegram_updates

    return channels.telegram_updates


ANN = {"id": 555, "is_bot": False, "first_name": "Ann", "last_name": "Lee"}
DM = {"id": 555, "type": "private", "first_name": "Ann"}
GROUP = {"id": -100123, "type": "supergroup", "title": "Team"}
FORUM = {"id": -100777, "type": "supergroup", "title": "Forum", "is_forum": True}


def update(chat: dict[str, Any], edited: bool = False, **message: Any) -> Update:
    body = {"message_id": 9, "date": 1_700_000_000, "chat": chat, "from": ANN, **message}
    from aiogram.types import Update

    return Update.model_validate({"update_id": 1001, "edited_message" if edited else "message": body})


def mention(text: str, name: str = "@neo_bot") -> dict[str, Any]:
    start = text.index(name)
    return {"text": text, "entities": [{"type": "mention", "offset": start, "length": len(name)}]}


def take(u: Update, **account: Any) -> Inbound | Skip:
    return tg().inbound(u, "main", TelegramAccount(**account), tg().BotIdentity(42, "neo_bot"))


def test_a_direct_message_keeps_its_text_sender_and_update_id() -> None:
    got = take(update(DM, text="hello"))
    assert isinstance(got, Inbound)
    assert (got.chat_type, got.chat_id, got.sender_id, got.sender_name, got.text) == (
        "direct",
        "555",
        "555",
        "Ann Lee",
        "hello",
    )
    assert got.client_message_id == "telegram:main:1001" and got.reply and got.target.reply_to is None


def test_a_bot_that_is_not_the_account_s_first_carries_its_id_in_the_key() -> None:
    bot = tg().BotIdentity(42, "neo_bot", keyed=True)
    later = tg().inbound(update(DM, text="hello"), "main", TelegramAccount(), bot)
    assert isinstance(later, Inbound) and later.client_message_id == "telegram:main:42:1001"


@pytest.mark.parametrize(
    ("message", "account", "expected"),
    [
        (mention("hi @neo_bot there"), {}, True),
        (mention("hi @NEO_BOT", "@NEO_BOT"), {}, True),
        (mention("hi @other_bot", "@other_bot"), {}, "skip"),
        ({"text": "hi all"}, {}, "skip"),
        ({"text": "hi all"}, {"store_unmentioned": True}, False),
        ({"text": "hi all"}, {"require_mention": False}, True),
        ({"text": "/status@neo_bot"}, {}, True),
        ({"text": "/status"}, {}, True),
        ({"text": "/status@other_bot"}, {}, "skip"),
        ({"text": "/status@other_bot"}, {"store_unmentioned": True}, False),
        ({"text": "about that", "reply_to_message": {"message_id": 1, "date": 1, "chat": GROUP,
          "from": {"id": 42, "is_bot": True, "first_name": "Neo"}, "text": "x"}}, {}, True),
        ({"text": "hey", "entities": [{"type": "text_mention", "offset": 0, "length": 3,
          "user": {"id": 42, "is_bot": True, "first_name": "Neo"}}]}, {}, True),
    ],
)  # fmt: skip
def test_in_groups_the_bot_answers_only_when_addressed(
    message: dict[str, Any], account: dict[str, Any], expected: object
) -> None:
    got = take(update(GROUP, **message), **account)
    if expected == "skip":
        assert isinstance(got, tg().Skip)
    else:
        assert isinstance(got, Inbound) and got.reply is expected and got.chat_type == "group"
        assert got.target.reply_to == "9"


def test_a_command_addressed_to_this_bot_loses_the_address() -> None:
    got = take(update(GROUP, text="/compact@neo_bot focus on dates"))
    assert isinstance(got, Inbound) and got.text == "/compact focus on dates"


def test_a_forum_topic_is_the_thread_and_the_reply_goes_to_it() -> None:
    got = take(update(FORUM, message_thread_id=7, is_topic_message=True, **mention("@neo_bot ?")))
    assert isinstance(got, Inbound) and got.thread_id == "7" and got.target.thread_id == "7"
    plain_reply = take(update(GROUP, message_thread_id=5, **mention("@neo_bot ?")))  # a reply thread, not a topic
    assert isinstance(plain_reply, Inbound) and plain_reply.thread_id is None


@pytest.mark.parametrize(
    ("message", "text"),
    [
        ({"photo": [{"file_id": "a", "file_unique_id": "a", "width": 90, "height": 60},
                    {"file_id": "b", "file_unique_id": "b", "width": 800, "height": 600}],
          "caption": "look at this"}, "[photo 800x600]\nlook at this"),
        ({"document": {"file_id": "d", "file_unique_id": "d", "file_name": "r.pdf", "mime_type": "application/pdf",
                       "file_size": 2048}}, "[file r.pdf (application/pdf, 2.0 KB)]"),
        ({"voice": {"file_id": "v", "file_unique_id": "v", "duration": 3}}, "[voice message, 3 s]"),
        ({"video": {"file_id": "w", "file_unique_id": "w", "width": 4, "height": 3, "duration": 7}}, "[video, 7 s]"),
        ({"video_note": {"file_id": "n", "file_unique_id": "n", "length": 240, "duration": 9}},
         "[video message, 9 s]"),
        ({"audio": {"file_id": "u", "file_unique_id": "u", "duration": 5, "performer": "A", "title": "B"}},
         "[audio A - B, 5 s]"),
        ({"sticker": {"file_id": "s", "file_unique_id": "s", "type": "regular", "width": 1, "height": 1,
                      "is_animated": False, "is_video": False, "emoji": "😀"}}, "[sticker 😀]"),
        ({"location": {"latitude": 1.5, "longitude": 2.5}}, "[location 1.5, 2.5]"),
        ({"dice": {"emoji": "🎲", "value": 3}}, "[a Telegram message of a kind the gateway does not read]"),
    ],
)  # fmt: skip
def test_media_is_stored_as_a_line_saying_what_arrived(message: dict[str, Any], text: str) -> None:
    got = take(update(DM, **message))
    assert isinstance(got, Inbound) and got.text == text and got.reply


def test_an_edit_is_an_edit_of_its_message_saying_whether_it_addresses_the_bot() -> None:
    got = take(update(GROUP, edited=True, text="fixed typo", edit_date=1_700_000_100))
    assert isinstance(got, Inbound) and (got.revision, got.message_id, got.reply) == ("edit", "9", False)
    assert got.content == "[edited message 9] fixed typo"
    now_mentions = take(update(GROUP, edited=True, edit_date=1_700_000_100, **mention("@neo_bot fixed")))
    assert isinstance(now_mentions, Inbound) and now_mentions.revision == "edit" and now_mentions.reply is True


def test_service_messages_channel_posts_and_the_bots_own_messages_are_not_taken() -> None:
    assert isinstance(take(update(GROUP, new_chat_members=[ANN])), tg().Skip)
    assert isinstance(take(update({"id": -1009, "type": "channel", "title": "News"}, text="x")), tg().Skip)
    own = update(GROUP, text="x")
    own_message = own.message.model_copy(update={"from_user": own.message.from_user.model_copy(update={"id": 42})})  # type: ignore[union-attr]
    assert isinstance(take(own.model_copy(update={"message": own_message})), tg().Skip)
