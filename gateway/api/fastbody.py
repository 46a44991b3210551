"""The ingest routes' common bodies read without pydantic (validation was a fifth of a
message's parsing cost).

``plain_message`` and ``plain_ingress`` accept a decoded body only when every key is a field of
the route's model and every value already has its field's exact type and is within its limits,
so the model would accept it unchanged; they return the field values (defaults filled in), or
None for anything else. A None sends the body through the pydantic model as before, so every
refused body gets the model's error, word for word, and nothing new is ever accepted.
``tests/gateway/test_fast_bodies.py`` checks both against the models.
"""

from __future__ import annotations

from typing import Any, get_args

from sessions.records import Role

MAX_NAME = 200  # name, tool_name, tool_call_id, sender_name (MessageBody / IngressBody)
MAX_CLIENT_MESSAGE_ID = 200
MAX_CHANNEL = 64
MAX_CHANNEL_ID = 200
_ROLES = frozenset(get_args(Role))
_CHAT_TYPES = frozenset(("direct", "group", "channel"))

MESSAGE_DEFAULTS: dict[str, Any] = {
    "role": "user",
    "name": None,
    "tool_name": None,
    "tool_call_id": None,
    "reply": True,
    "stream": False,
    "client_message_id": None,
}
INGRESS_DEFAULTS: dict[str, Any] = {
    "sender_name": None,
    "thread_id": None,
    "agent_id": None,
    "reply": True,
    "stream": False,
    "client_message_id": None,
}


def _optional_text(value: object, limit: int) -> bool:
    return value is None or (type(value) is str and len(value) <= limit)


def _client_message_id(value: object) -> bool:
    return value is None or (type(value) is str and 0 < len(value) <= MAX_CLIENT_MESSAGE_ID)


def _channel_id(value: object) -> str | None:
    """A ``ChannelId`` the model takes as it is: text of 1 to 200 characters, or an integer
    (not a bool) whose decimal text is that long; None otherwise."""
    if type(value) is int:
        value = str(value)
    if type(value) is str and 0 < len(value) <= MAX_CHANNEL_ID:
        return value
    return None


def plain_message(data: dict[str, Any]) -> dict[str, Any] | None:
    """``MessageBody``'s fields of a common body, or None (let the model decide)."""
    content = data.get("content")
    if type(content) is not str:
        return None
    if len(data) == 1:  # {"content": ...}: the usual message
        return {**MESSAGE_DEFAULTS, "content": content}
    fields = {**MESSAGE_DEFAULTS, **data}
    if len(fields) != len(MESSAGE_DEFAULTS) + 1:  # a key the model does not know
        return None
    role, reply, stream = fields["role"], fields["reply"], fields["stream"]
    if type(role) is not str or role not in _ROLES or type(reply) is not bool or type(stream) is not bool:
        return None
    for name in ("name", "tool_name", "tool_call_id"):
        if not _optional_text(fields[name], MAX_NAME):
            return None
    if not _client_message_id(fields["client_message_id"]):
        return None
    return fields


def plain_ingress(data: dict[str, Any]) -> dict[str, Any] | None:
    """``IngressBody``'s fields of a common body (integer ids as their decimal text), or None."""
    fields = {**INGRESS_DEFAULTS, **data}
    if len(fields) != len(INGRESS_DEFAULTS) + 5:  # a required field missing, or a key the model does not know
        return None
    channel, chat_type, text = fields.get("channel"), fields.get("chat_type"), fields.get("text")
    if type(channel) is not str or not 0 < len(channel) <= MAX_CHANNEL or type(text) is not str:
        return None
    if type(chat_type) is not str or chat_type not in _CHAT_TYPES:
        return None
    chat_id, sender_id = _channel_id(fields.get("chat_id")), _channel_id(fields.get("sender_id"))
    if chat_id is None or sender_id is None:
        return None
    thread_id = fields["thread_id"]
    if thread_id is not None:
        thread_id = _channel_id(thread_id)
        if thread_id is None:
            return None
    agent_id, reply, stream = fields["agent_id"], fields["reply"], fields["stream"]
    if agent_id is not None and (type(agent_id) is not str or not agent_id):  # "" is refused by the model
        return None
    if type(reply) is not bool or type(stream) is not bool:
        return None
    if not _optional_text(fields["sender_name"], MAX_NAME) or not _client_message_id(fields["client_message_id"]):
        return None
    fields["chat_id"], fields["sender_id"], fields["thread_id"] = chat_id, sender_id, thread_id
    return fields
