"""Slack Events API events to :class:`~channels.protocol.Inbound` messages: pure decisions.

- ``message`` events only (an ``app_mention`` repeats a channel message the bot also gets as a
  ``message``): ``channel_type`` ``im`` is a direct chat; ``channel``, ``group`` and ``mpim`` are
  channels (chat type ``channel``), and a reply in a thread keeps its ``thread_ts`` as the thread
  (``:thread:`` in the key); the answer goes to the same thread. A reply in a direct chat's
  thread is answered in that thread (the direct chat is still one session). With
  ``reply_in_thread``, a mention at a channel's top level starts a thread: it is stored in the
  thread's session and answered there, so the thread's next messages continue its conversation.
- In channels with ``require_mention`` the bot answers only when ``<@BOTID>`` is in the text;
  other messages are stored without an answer when ``store_unmentioned`` is on, else skipped.
- Files are described with the text (``[file report.pdf (application/pdf)]``); an edit
  (``message_changed``) and a deletion (``message_deleted``) of a user's message are revisions of
  the message they change (channels/revisions.py decides whether they are stored); an edit that
  leaves the text as it was (a link unfurled, a reply counted in its thread) is skipped; bots'
  messages and other subtypes (joins, topic changes) are not stored.
- A slash command (``/status`` registered in the app) becomes the same command as text, answered
  in the conversation it was typed in; its ``trigger_id`` is its delivery id.
"""

from __future__ import annotations

from typing import Any

from channels.protocol import ChatType, Inbound, Revision, Skip, Target, heard
from config.channels import SlackAccount

CHANNEL = "slack"


def _text(event: dict[str, Any]) -> str:
    """The message's text with its files described."""
    text = str(event.get("text") or "")
    files = event.get("files") or []
    described = "\n".join(f"[file {f.get('name') or 'unnamed'} ({f.get('mimetype') or 'unknown type'})]" for f in files)
    return f"{text}\n{described}".strip() if described else text


def inbound(payload: dict[str, Any], account_name: str, account: SlackAccount, bot_user: str) -> Inbound | Skip:
    """The message an ``event_callback`` payload carries for the engine, or why there is none."""
    event = payload.get("event") or {}
    if event.get("type") != "message":
        return Skip(f"a {event.get('type')} event")
    subtype = event.get("subtype")
    revision: Revision | None = None
    before: dict[str, Any] = event.get("previous_message") or {}
    if subtype == "message_changed":
        revision = "edit"
        event = {**event, **(event.get("message") or {}), "channel": event.get("channel"),
                 "channel_type": event.get("channel_type")}  # fmt: skip
    elif subtype == "message_deleted":
        revision = "delete"
        event = {**before, "channel": event.get("channel"), "channel_type": event.get("channel_type"),
                 "ts": event.get("deleted_ts") or before.get("ts")}  # fmt: skip
    elif subtype not in (None, "file_share", "thread_broadcast"):
        return Skip(f"a {subtype} message")
    if event.get("bot_id") or not event.get("user") or event.get("user") == bot_user:
        return Skip("a bot's message")
    chat_type: ChatType = "direct" if event.get("channel_type") == "im" else "channel"
    text = _text(event)
    if revision == "edit" and before and _text(before) == text:
        return Skip("an edit that leaves the text as it was (a link unfurled, a reply counted in its thread)")
    if not text and revision is None:
        return Skip("an empty message")
    reply = revision != "delete"
    if reply and chat_type == "channel" and account.require_mention:
        reply = f"<@{bot_user}>" in text
    ts = str(event.get("ts"))
    in_thread = str(event["thread_ts"]) if event.get("thread_ts") and event.get("thread_ts") != ts else None
    thread = None
    if chat_type == "channel":
        thread = in_thread or (ts if reply and account.reply_in_thread else None)
    return heard(
        CHANNEL,
        account_name,
        account,
        chat_type=chat_type,
        chat_id=str(event.get("channel")),
        sender_id=str(event["user"]),
        sender_name=None,
        thread_id=thread,
        text=text,
        update_id=str(payload.get("event_id") or event.get("client_msg_id") or ts),
        target=Target(chat_id=str(event.get("channel")), thread_id=thread if chat_type == "channel" else in_thread),
        reply=reply,
        message_id=ts,
        revision=revision,
    )


def slash_inbound(payload: dict[str, Any], account_name: str, account: SlackAccount) -> Inbound | Skip:
    """A ``slash_commands`` payload as the command's text, for the conversation it was typed in."""
    command = str(payload.get("command") or "")
    user = payload.get("user_id")
    channel = payload.get("channel_id")
    if not command.startswith("/") or not user or not channel:
        return Skip("a slash command without command, user or channel")
    chat_type: ChatType = "direct" if str(channel).startswith("D") else "channel"
    text = f"{command} {str(payload.get('text') or '').strip()}".strip()
    return heard(
        CHANNEL,
        account_name,
        account,
        chat_type=chat_type,
        chat_id=str(channel),
        sender_id=str(user),
        sender_name=payload.get("user_name"),
        text=text,
        update_id=f"cmd:{payload.get('trigger_id') or payload.get('response_url') or text}",
        target=Target(chat_id=str(channel)),
    )
