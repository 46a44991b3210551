"""Telegram updates to :class:`~channels.protocol.Inbound` messages: pure decisions, no I/O.

- Chats: ``private`` is a direct chat; ``group`` and ``supergroup`` are groups, and a forum topic's
  ``message_thread_id`` becomes the thread (``:topic:`` in the key); channel posts are not taken.
- In groups with ``require_mention`` the bot answers only when mentioned (``@username`` or a text
  mention), replied to, or given a command; other group messages are stored without an answer
  when ``store_unmentioned`` is on, and skipped otherwise.
- ``/status@ThisBot`` is ``/status``; a command addressed to another bot is not a command for us.
- Photos, files, voice, stickers and the rest become a line saying what arrived, with the caption.
- An edited message is an edit of the message it changes (``revision``), its ``reply`` saying
  whether the new text addresses the bot; channels/revisions.py decides whether it is stored.
- An update aiogram does not read (a shape of an older or newer Bot API) is an :class:`Unreadable`:
  kept and confirmed, never allowed to hold up the updates after it.
- Update ids are per bot: the update's part of a ``client_message_id`` is its id for the account's
  first bot and ``<bot id>:<update id>`` for any later one (a new token of another bot under the
  same account name, whose ids may repeat the first bot's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from aiogram import Bot
from aiogram.types import Message, MessageEntity, Update
from pydantic import ValidationError

from channels.protocol import ChatType, Inbound, Skip, Target, heard
from config.channels import TelegramAccount

CHANNEL = "telegram"
_COMMAND = re.compile(r"^/([A-Za-z0-9_]+)(?:@([A-Za-z0-9_]+))?(?=\s|$)")
_SERVICE_FIELDS = (
    "new_chat_members", "left_chat_member", "new_chat_title", "new_chat_photo", "delete_chat_photo",
    "group_chat_created", "supergroup_chat_created", "pinned_message", "migrate_to_chat_id",
    "migrate_from_chat_id", "forum_topic_created", "forum_topic_edited", "forum_topic_closed",
    "forum_topic_reopened", "message_auto_delete_timer_changed",
)  # fmt: skip


@dataclass(frozen=True)
class BotIdentity:
    """The bot an account runs as; ``keyed``: its update ids carry its id (not the account's first bot)."""

    id: int
    username: str
    keyed: bool = False


@dataclass(frozen=True)
class Unreadable:
    """An update aiogram refuses (a field it requires is missing, a value of another type): its id,
    why (the first thing aiogram found wrong) and the update as it came."""

    update_id: int
    reason: str
    raw: dict[str, Any]


def delivery_id(update_id: int, bot: BotIdentity) -> str:
    """The update's part of its ``client_message_id``."""
    return f"{bot.id}:{update_id}" if bot.keyed else str(update_id)


def read_update(raw: object, bot: Bot) -> Update | Unreadable | None:
    """One update as aiogram reads it; Unreadable when aiogram refuses it; None when it is no update
    at all (no integer ``update_id``, so nothing to confirm it by)."""
    update_id = raw.get("update_id") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(update_id, int) or isinstance(update_id, bool):
        return None
    try:
        return Update.model_validate(raw, context={"bot": bot})
    except ValidationError as exc:
        return Unreadable(update_id, why(exc), raw)


def read_batch(answer: object, bot: Bot) -> tuple[list[Update], list[Unreadable]] | None:
    """A ``getUpdates`` answer aiogram refused as a whole, read update by update; None when it is
    not a successful answer holding a list of updates."""
    result = answer.get("result") if isinstance(answer, dict) and answer.get("ok") is True else None
    if not isinstance(result, list):
        return None
    updates: list[Update] = []
    unreadable: list[Unreadable] = []
    for raw in result:
        read = read_update(raw, bot)
        if read is None:
            return None
        if isinstance(read, Unreadable):
            unreadable.append(read)
        else:
            updates.append(read)
    return updates, unreadable


def why(exc: ValidationError) -> str:
    """What pydantic found wrong, in one line: the first error's place and message."""
    errors = exc.errors()
    if not errors:
        return str(exc)
    where = ".".join(str(part) for part in errors[0]["loc"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {errors[0]['msg']}{more}"


def _entity_text(text: str, entity: MessageEntity) -> str:
    raw = text.encode("utf-16-le")
    return raw[entity.offset * 2 : (entity.offset + entity.length) * 2].decode("utf-16-le", errors="replace")


def _size(n: int | None) -> str:
    if n is None:
        return "size unknown"
    for unit in ("bytes", "KB", "MB"):
        if n < 1024 or unit == "MB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return f"{n} bytes"  # pragma: no cover


# the media a label names by their kind and length (a message holds one kind of media at most)
_TIMED = (("voice", "voice message"), ("video", "video"), ("video_note", "video message"))


def _timed(message: Message) -> str | None:
    for field, noun in _TIMED:
        media = getattr(message, field)
        if media is not None:
            return f"[{noun}, {media.duration} s]"
    return None


def describe(message: Message) -> str | None:
    """The message as text: its text, or what arrived (with the caption); None for service messages."""
    if message.text is not None:
        return message.text
    label: str | None = None
    if message.photo:
        best = message.photo[-1]
        label = f"[photo {best.width}x{best.height}]"
    elif message.document is not None:
        d = message.document
        label = f"[file {d.file_name or 'unnamed'} ({d.mime_type or 'unknown type'}, {_size(d.file_size)})]"
    elif (timed := _timed(message)) is not None:
        label = timed
    elif message.audio is not None:
        a = message.audio
        title = " - ".join(x for x in (a.performer, a.title) if x) or a.file_name or "untitled"
        label = f"[audio {title}, {a.duration} s]"
    elif message.animation is not None:
        label = "[animation]"
    elif message.sticker is not None:
        label = f"[sticker {message.sticker.emoji or ''}]".replace(" ]", "]")
    elif message.location is not None:
        label = f"[location {message.location.latitude}, {message.location.longitude}]"
    elif message.contact is not None:
        c = message.contact
        label = f"[contact {' '.join(x for x in (c.first_name, c.last_name) if x)} {c.phone_number}]"
    elif message.poll is not None:
        label = f"[poll {message.poll.question}]"
    elif any(getattr(message, name, None) for name in _SERVICE_FIELDS):
        return None
    else:
        label = "[a Telegram message of a kind the gateway does not read]"
    return label + (f"\n{message.caption}" if message.caption else "")


def command_for(text: str, bot: BotIdentity) -> tuple[str, bool] | None:
    """``(text without @ThisBot, addressed to us)`` when the text starts with a command."""
    match = _COMMAND.match(text)
    if match is None:
        return None
    addressee = match.group(2)
    if addressee is None:
        return text, True
    if addressee.casefold() != bot.username.casefold():
        return text, False
    return f"/{match.group(1)}{text[match.end() :]}", True


def mentions(message: Message, bot: BotIdentity) -> bool:
    """The bot is mentioned by @username or a text mention, or the message replies to the bot."""
    text = message.text or message.caption or ""
    for entity in (message.entities or []) + (message.caption_entities or []):
        if entity.type == "mention" and _entity_text(text, entity).casefold() == f"@{bot.username}".casefold():
            return True
        if entity.type == "text_mention" and entity.user is not None and entity.user.id == bot.id:
            return True
    replied = message.reply_to_message
    return replied is not None and replied.from_user is not None and replied.from_user.id == bot.id


def sender_name(message: Message) -> str | None:
    user = message.from_user
    if user is None:
        return message.sender_chat.title if message.sender_chat is not None else None
    full = " ".join(x for x in (user.first_name, user.last_name) if x)
    return full or user.username


def inbound(update: Update, account_name: str, account: TelegramAccount, bot: BotIdentity) -> Inbound | Skip:
    """The message an update carries for the session engine, or why there is none."""
    edited = update.message is None and update.edited_message is not None
    message = update.message or update.edited_message
    if message is None:
        return Skip("not a message update")
    chat = message.chat
    if chat.type == "private":
        chat_type: ChatType = "direct"
    elif chat.type in ("group", "supergroup"):
        chat_type = "group"
    else:
        return Skip(f"a {chat.type} post (channels are not read)")
    if message.from_user is not None and message.from_user.id == bot.id:
        return Skip("the bot's own message")
    text = describe(message)
    if text is None:
        return Skip("a service message")
    sender = message.from_user.id if message.from_user is not None else (message.sender_chat or chat).id
    thread = str(message.message_thread_id) if message.is_topic_message and message.message_thread_id else None
    reply = True
    command = command_for(text, bot)
    if command is not None:
        text, ours = command
        reply = ours
    elif chat_type == "group" and account.require_mention:
        reply = mentions(message, bot)
    return heard(
        CHANNEL,
        account_name,
        account,
        chat_type=chat_type,
        chat_id=str(chat.id),
        sender_id=str(sender),
        sender_name=sender_name(message),
        thread_id=thread,
        text=text,
        update_id=delivery_id(update.update_id, bot),
        target=Target(
            chat_id=str(chat.id),
            thread_id=str(message.message_thread_id) if thread else None,
            reply_to=str(message.message_id) if chat_type == "group" else None,
        ),
        reply=reply,
        message_id=str(message.message_id),
        revision="edit" if edited else None,
    )
