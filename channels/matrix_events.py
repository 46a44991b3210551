"""Matrix room events to :class:`~channels.protocol.Inbound` messages, and invites to a decision:
pure, on the events' JSON as the client-server API gives it.

- A room the bot was invited to as direct (the invite's ``is_direct``, what clients set when one
  starts a chat with a person) is a direct chat: the sender's session
  (``agent:<agent>:matrix:dm:<user>`` under ``dm_scope: per-channel-peer``). Any other room is a
  group, chat type ``channel`` (``agent:<agent>:matrix:channel:<room>``), and a message in a
  thread (``m.relates_to`` ``rel_type: m.thread``) belongs to the thread's session
  (``:thread:<root event>``); the answer goes to the same thread.
- In groups with ``require_mention`` the bot answers when mentioned: its id in ``m.mentions``
  (what clients send for a pill), or its id or display name in the text; a command
  (``/status``) is always for the bot. Other group messages are stored without an answer when
  ``store_unmentioned`` is on, else skipped.
- ``m.text`` and ``m.emote`` are read, files (``m.file``, ``m.image``...) described; the bot's own
  messages and notices (``m.notice``: bots talking) are skipped. An edit (``m.replace``, its
  ``m.new_content``) and a redaction are revisions of the message they change
  (channels/revisions.py decides whether they are stored). An ``m.room.encrypted`` event cannot
  be read without end-to-end keys: :class:`Encrypted`.
- The event id is the delivery id (``matrix:<account>:<event id>`` as client_message_id): an event
  a restart syncs again is stored once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from channels.protocol import ChatType, Inbound, Revision, Skip, Target, heard
from config.channels import MatrixAccount

CHANNEL = "matrix"
DIRECT, GROUP = "direct", "group"
_FILES = ("m.file", "m.image", "m.audio", "m.video")


@dataclass(frozen=True)
class Encrypted:
    """An end-to-end encrypted event: not readable here."""

    room_id: str
    event_id: str


@dataclass(frozen=True)
class Bot:
    user_id: str
    display_name: str | None = None


def invite_of(room_id: str, events: list[dict[str, Any]], bot_user: str) -> tuple[str, bool] | None:
    """``(inviter, is_direct)`` of the bot's invite into a room, from the room's ``invite_state``."""
    for event in events:
        content = event.get("content") or {}
        if (event.get("type") == "m.room.member" and event.get("state_key") == bot_user
                and content.get("membership") == "invite"):  # fmt: skip
            return str(event.get("sender") or ""), bool(content.get("is_direct"))
    return None


def mentions(content: dict[str, Any], bot: Bot) -> bool:
    """The bot's id in ``m.mentions``, or its id or display name in the text (case-insensitive)."""
    listed = (content.get("m.mentions") or {}).get("user_ids") or []
    if bot.user_id in listed:
        return True
    text = f"{content.get('body') or ''}\n{content.get('formatted_body') or ''}".casefold()
    if bot.user_id.casefold() in text:
        return True
    name = (bot.display_name or "").strip()
    return bool(name) and re.search(rf"(?<!\w){re.escape(name.casefold())}(?!\w)", text) is not None


def _text(content: dict[str, Any]) -> str:
    msgtype = content.get("msgtype")
    body = str(content.get("body") or "")
    if msgtype in _FILES:
        info = content.get("info") or {}
        return f"[file {body or 'unnamed'} ({info.get('mimetype') or 'unknown type'})]"
    if msgtype == "m.emote":
        return f"* {body}"
    return body


def inbound(event: dict[str, Any], room_id: str, kind: str, account_name: str, account: MatrixAccount,
            bot: Bot) -> Inbound | Skip | Encrypted:  # fmt: skip
    """The message a timeline event carries for the engine, or why there is none."""
    kind_of_event = event.get("type")
    event_id = str(event.get("event_id") or "")
    if kind_of_event == "m.room.encrypted":
        return Encrypted(room_id, event_id)
    if kind_of_event not in ("m.room.message", "m.room.redaction"):
        return Skip(f"a {kind_of_event} event")
    sender = str(event.get("sender") or "")
    if sender == bot.user_id or not sender:
        return Skip("the bot's own message")
    content = event.get("content") or {}
    relation = content.get("m.relates_to") or {}
    revision: Revision | None = None
    message_id = event_id
    if kind_of_event == "m.room.redaction":
        revision, message_id = "delete", str(event.get("redacts") or content.get("redacts") or "")
        content = {"msgtype": "m.text", "body": ""}
    elif relation.get("rel_type") == "m.replace":
        revision, message_id = "edit", str(relation.get("event_id") or "")
        content = content.get("m.new_content") or {}
        relation = {}
    if content.get("msgtype") not in ("m.text", "m.emote", *_FILES):
        return Skip(f"a {content.get('msgtype')} message")
    text = _text(content).strip()
    if (not text and revision != "delete") or not event_id or not message_id:
        return Skip("an empty message")
    chat_type: ChatType = "direct" if kind == DIRECT else "channel"
    thread = str(relation["event_id"]) if relation.get("rel_type") == "m.thread" and relation.get("event_id") else None
    reply = revision != "delete"
    if reply and chat_type == "channel" and account.require_mention and not text.startswith("/"):
        reply = mentions(content, bot)
    return heard(
        CHANNEL,
        account_name,
        account,
        chat_type=chat_type,
        chat_id=room_id,
        sender_id=sender,
        sender_name=sender[1:].split(":", 1)[0] or sender,  # the localpart: "alice" of @alice:example.org
        text=text,
        update_id=event_id,
        target=Target(chat_id=room_id, thread_id=thread, reply_to=event_id),
        thread_id=thread if chat_type == "channel" else None,
        reply=reply,
        message_id=message_id,
        revision=revision,
    )
