"""Discord messages to :class:`~channels.protocol.Inbound` messages: pure decisions, no I/O (the
connector reads discord.py's ``Message`` into a :class:`Seen`; this module never imports discord).

- A message with no server (guild) is a direct chat; a server's text channel is a channel
  (``agent:<agent>:discord:channel:<id>``), and a thread (a channel of its own, under a parent
  channel) is the parent's thread (``...:channel:<parent>:thread:<id>``), answered in the thread.
- ``guilds`` (when not empty) lists the servers where the bot answers; a message in any other
  server is skipped.
- In channels with ``require_mention`` the bot answers only when mentioned (``<@id>``, or a reply
  to one of its messages) or given a chat command (``/status``, also after a leading mention); other
  channel messages are stored without an answer when ``store_unmentioned`` is on, else skipped.
- Attachments are described with the text (``[file report.pdf (application/pdf)]``); bots' own
  messages (this one's included) and system messages (joins, pins) are not stored.
- An edit (MESSAGE_UPDATE with an ``edited_timestamp``; one without is a link preview loaded) and a
  deletion (MESSAGE_DELETE) are revisions of the message they change: channels/revisions.py
  decides whether they are stored.
- The message's id (a snowflake, unique across Discord) is its delivery id (an edit's: the id and
  the edit's time; a deletion's: the id and ``delete``), so a message the gateway dispatches again
  (a resumed session replaying its events) is stored once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from channels.protocol import ChatType, Inbound, Revision, Skip, Target, heard
from config.channels import DiscordAccount
from config.chat_commands import parse_command

CHANNEL = "discord"


@dataclass(frozen=True)
class Seen:
    """What the connector read of one message. ``parent_id``: the channel a thread is under (None:
    not a thread); ``mentions``: the user ids the message pings; ``system``: not a user's message
    (a join, a pin, a thread created). ``revision``: an edit (``edited_at``: when) or a deletion
    (its author, text and the rest unknown) of the message ``message_id``."""

    message_id: str
    channel_id: str
    guild_id: str | None
    author_id: str
    author_name: str | None
    author_bot: bool
    text: str
    parent_id: str | None = None
    mentions: tuple[str, ...] = ()
    attachments: tuple[tuple[str, str | None], ...] = ()
    system: bool = False
    revision: Revision | None = None
    edited_at: str | None = None


def _text(seen: Seen) -> str:
    described = "\n".join(f"[file {name or 'unnamed'} ({kind or 'unknown type'})]" for name, kind in seen.attachments)
    return f"{seen.text}\n{described}".strip() if described else seen.text


def _leading_mention(bot_id: str) -> re.Pattern[str]:
    return re.compile(rf"^\s*<@!?{bot_id}>\s*")


def inbound(seen: Seen, account_name: str, account: DiscordAccount, bot_id: str) -> Inbound | Skip:
    """The message for the engine, or why there is none."""
    if seen.system:
        return Skip("a system message")
    if seen.author_bot or seen.author_id == bot_id:
        return Skip("a bot's message")
    if seen.revision == "edit" and seen.edited_at is None:
        return Skip("an update that is not an edit (a link preview loaded, a pin)")
    text = _text(seen)
    if not text and seen.revision is None:
        return Skip("an empty message (without the message content intent, Discord sends no text)")
    if seen.guild_id is None:
        chat_type: ChatType = "direct"
        chat_id, thread = seen.channel_id, None
        reply = seen.revision != "delete"
    else:
        if account.guilds and seen.guild_id not in account.guilds:
            return Skip(f"a message in server {seen.guild_id}, not one of guilds")
        chat_type = "channel"
        chat_id = seen.parent_id or seen.channel_id
        thread = seen.channel_id if seen.parent_id else None
        addressed = _leading_mention(bot_id).sub("", text, count=1)
        command = seen.revision is None and parse_command(addressed) is not None
        if command:
            text = addressed  # "<@bot> /status" is /status
        mentioned = bot_id in seen.mentions or re.search(rf"<@!?{bot_id}>", text) is not None
        reply = seen.revision != "delete" and (command or mentioned or not account.require_mention)
    return heard(
        CHANNEL,
        account_name,
        account,
        chat_type=chat_type,
        chat_id=chat_id,
        sender_id=seen.author_id,
        sender_name=seen.author_name,
        thread_id=thread,
        text=text,
        update_id=_delivery(seen),
        target=Target(chat_id=seen.channel_id, reply_to=seen.message_id if chat_type == "channel" else None),
        reply=reply,
        message_id=seen.message_id,
        revision=seen.revision,
    )


def _delivery(seen: Seen) -> str:
    if seen.revision == "edit":
        return f"{seen.message_id}:edit:{seen.edited_at}"
    if seen.revision == "delete":
        return f"{seen.message_id}:delete"
    return seen.message_id
