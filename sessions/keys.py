"""Session keys (SPEC section 1): parse, validate, build, and route channel ingress to a key.

A key is a ``:``-separated string such as ``agent:main:telegram:group:-100123:topic:7``. Each
segment matches ``[A-Za-z0-9_.@+\\-/#]+``; a ``:`` inside an id is written ``%3A`` and a ``%`` as
``%25`` so any id made of grammar characters, ``:`` and ``%`` round-trips. Channel ingress ids
(``sender_id``, ``chat_id``, ``thread_id``) may hold any character: each one outside the grammar
is written as the ``%XX`` escapes of its UTF-8 bytes (upper-case hex), so ``田中`` is
``%E7%94%B0%E4%B8%AD`` (whitespace and control characters stay errors); ids decode back exactly,
and an escape of a grammar character (``%41``) is not canonical and rejected. Everything here is pure:
no I/O, no clock. A bad key raises :class:`config.errors.InvalidKey` whose message names the rule
it broke and how to fix it; ``error.extra["rule"]`` carries the same rule as a stable identifier.
"""

from __future__ import annotations

import re
import unicodedata
import urllib.parse
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from config.errors import BadRequest, ConfigError, InvalidKey
from sessions.records import ChatType as ChatType
from sessions.records import IngressChatType as IngressChatType

Family = Literal["agent", "cron", "hook"]
DmScope = Literal["main", "per-peer", "per-channel-peer"]

MAX_KEY_LENGTH = 256
FAMILIES: tuple[Family, ...] = ("agent", "cron", "hook")
RESERVED_WORDS = frozenset({"main", "dm", "group", "channel", "topic", "thread"})
DEFAULT_AGENT = "main"

_GRAMMAR = "[A-Za-z0-9_.@+-/#]"
_SEGMENT_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.@+-/#")
_SEGMENT = re.compile(r"(?:[A-Za-z0-9_.@+\-/#]|%[0-9A-F]{2})+")
_HEX_ESCAPE = re.compile(r"%([0-9A-F]{2})")
_BAD_ESCAPE = (
    "'%' must start the escape %3A (for ':'), %25 (for '%') or %XX (upper case) of a UTF-8 byte of a"
    " character outside the grammar"
)
_WHITESPACE_CONTROLS = frozenset("\t\n\v\f\r")
_SHAPES = (
    "agent:<agentId>:main, agent:<agentId>:dm:<peerId>, agent:<agentId>:<channel>:dm:<peerId>, "
    "agent:<agentId>:<channel>:group:<groupId>[:topic:<threadId>], "
    "agent:<agentId>:<channel>:channel:<channelId>[:thread:<threadId>]"
)
# The word before a thread id, by the kind of a channel's place (a group's topic, a channel's thread).
_THREAD_WORD = {"group": "topic", "channel": "thread"}


@dataclass(frozen=True)
class SessionKey:
    """A parsed, valid session key. Id fields hold decoded text (``%3A`` back to ``:``)."""

    raw: str
    family: Family
    chat_type: ChatType
    agent_id: str | None = None
    channel: str | None = None
    peer_id: str | None = None
    group_id: str | None = None
    channel_id: str | None = None
    thread_id: str | None = None
    job_id: str | None = None
    hook_id: str | None = None
    # The decoded segments after ``hook:``; ``hook_id`` is them joined by ':' (SPEC's <hookId>).
    hook_parts: tuple[str, ...] = ()

    @property
    def task_type(self) -> Family:
        """tasks.db ``task_type`` for chat runs: the family."""
        return self.family

    @property
    def task_identifier(self) -> str:
        """tasks.db ``task_identifier`` for chat runs: the key itself."""
        return self.raw

    def __str__(self) -> str:
        return self.raw


class BindingLike(Protocol):
    """A ``bindings`` entry (``config.settings.Binding`` fits): messages from chat_id go to agent."""

    @property
    def channel(self) -> str: ...
    @property
    def chat_id(self) -> str: ...
    @property
    def agent(self) -> str: ...


@dataclass(frozen=True)
class Ingress:
    """Where a channel message came from (``POST /v1/messages``), before routing."""

    channel: str
    chat_type: IngressChatType
    chat_id: str
    sender_id: str
    thread_id: str | None = None
    agent_id: str | None = None


def _show(raw: str) -> str:
    return repr(raw if len(raw) <= 80 else raw[:60] + "…")


def _fail(raw: str, rule: str, message: str, *, what: str = "session key") -> InvalidKey:
    return InvalidKey(f"invalid {what} {_show(raw)}: {message}", rule=rule)


def _char_problem(ch: str) -> tuple[str, str] | None:
    """The rule a character outside the segment grammar breaks, or None if it is allowed."""
    if ch in _SEGMENT_CHARS:
        return None
    code = f"U+{ord(ch):04X}"
    if ch in _WHITESPACE_CONTROLS or (ch.isspace() and unicodedata.category(ch) != "Cc"):
        return "whitespace", f"whitespace ({code}) is not allowed; remove it or use '_' instead"
    if unicodedata.category(ch) in ("Cc", "Cf"):
        return "control_character", f"control character {code} is not allowed; remove it"
    return "character", (
        f"character {ch!r} ({code}) outside {_GRAMMAR}; use only letters A-Z a-z, digits and _ . @ + - / #"
        " (write ':' inside an id as %3A)"
    )


def escape_segment(text: str) -> str:
    """Write one id as a key segment: ``%`` becomes ``%25`` and ``:`` becomes ``%3A``.

    Any other character outside the grammar is rejected (InvalidKey naming the rule), never escaped.
    """
    if not text:
        raise _fail(text, "empty_segment", "empty segment; an id cannot be empty", what="id")
    for ch in text:
        if ch not in ":%":
            problem = _char_problem(ch)
            if problem is not None:
                raise _fail(text, *problem, what="id")
    return text.replace("%", "%25").replace(":", "%3A")


def encode_id(text: str) -> str:
    """Write a channel ingress id as a key segment: every character outside the grammar becomes the
    ``%XX`` escapes of its UTF-8 bytes (``:`` is ``%3A``, ``%`` is ``%25``, as in escape_segment);
    whitespace and control characters are rejected as in a key. Reversible by :func:`unescape_segment`."""
    if not text:
        raise _fail(text, "empty_segment", "empty segment; an id cannot be empty", what="id")
    out = []
    for ch in text:
        if ch in _SEGMENT_CHARS:
            out.append(ch)
            continue
        problem = _char_problem(ch)
        if problem is not None and problem[0] != "character":  # whitespace, controls: a client's mistake
            raise _fail(text, *problem, what="id")
        out.append("".join(f"%{b:02X}" for b in ch.encode()))
    return "".join(out)


def unescape_segment(segment: str) -> str:
    """The id a valid segment stands for (inverse of :func:`escape_segment` and :func:`encode_id`)."""
    if "%" not in segment:
        return segment
    return urllib.parse.unquote(segment, errors="strict")


def _canonical_escapes(segment: str) -> bool:
    """Every ``%XX`` escapes a byte that is not a grammar character, and together they are UTF-8."""
    for match in _HEX_ESCAPE.finditer(segment):
        byte = int(match.group(1), 16)
        if byte < 0x80 and chr(byte) in _SEGMENT_CHARS:
            return False
    try:
        urllib.parse.unquote_to_bytes(segment).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _check_segment(raw: str, segment: str, position: int) -> None:
    if _SEGMENT.fullmatch(segment):
        if "%" in segment and not _canonical_escapes(segment):
            raise _fail(raw, "bad_escape", _BAD_ESCAPE)
        return
    if not segment:
        raise _fail(
            raw,
            "empty_segment",
            f"empty segment at position {position}; remove the leading, trailing or doubled ':'",
        )
    i = 0
    while i < len(segment):
        if segment[i] == "%":
            if not _HEX_ESCAPE.match(segment, i):
                raise _fail(raw, "bad_escape", _BAD_ESCAPE)
            i += 3
            continue
        problem = _char_problem(segment[i])
        if problem is not None:
            raise _fail(raw, *problem)
        i += 1


def _check_agent(raw: str, agent_id: str, agents: Collection[str] | None) -> None:
    if agents is None or agent_id in agents:
        return
    names = sorted(agents)
    listed = ", ".join(names[:20]) + (", …" if len(names) > 20 else "") if names else "none"
    raise _fail(
        raw,
        "unknown_agent",
        f"agent {agent_id!r} is not configured (configured: {listed}); "
        "use a configured agent or add it under 'agents:' in the config",
    )


def _check_channel(raw: str, channel: str) -> None:
    if channel in RESERVED_WORDS:
        raise _fail(
            raw,
            "reserved_word",
            f"{channel!r} is reserved and cannot be a channel name "
            f"(reserved: {', '.join(sorted(RESERVED_WORDS))}); rename the channel",
        )


def _bad_shape(raw: str, family: str, expected: str) -> InvalidKey:
    return _fail(raw, "shape", f"not a valid {family} key; expected {expected}")


def _parse(raw: str, agents: Collection[str] | None) -> SessionKey:
    if len(raw) > MAX_KEY_LENGTH:
        raise _fail(
            raw,
            "too_long",
            f"longer than {MAX_KEY_LENGTH} characters ({len(raw)}); use shorter ids",
        )
    if not raw:
        raise _fail(raw, "empty_segment", "empty segment (the key is empty); keys look like agent:main:main")
    segments = raw.split(":")
    for position, segment in enumerate(segments):
        _check_segment(raw, segment, position)
    family, rest = segments[0], segments[1:]
    if family == "cron":
        if len(rest) != 1:
            raise _bad_shape(raw, "cron", "cron:<jobId> (write ':' inside the job id as %3A)")
        return SessionKey(raw=raw, family="cron", chat_type="cron", job_id=unescape_segment(rest[0]))
    if family == "hook":
        if not rest:
            raise _bad_shape(raw, "hook", "hook:<hookId>")
        parts = tuple(unescape_segment(s) for s in rest)
        return SessionKey(raw=raw, family="hook", chat_type="hook", hook_id=":".join(parts), hook_parts=parts)
    if family != "agent":
        hint = f"; keys are case-sensitive, did you mean {family.lower()!r}?" if family.lower() in FAMILIES else ""
        raise _fail(raw, "unknown_family", f"unknown family {family!r} (expected agent, cron or hook){hint}")
    if len(rest) < 2:
        raise _bad_shape(raw, "agent", _SHAPES)
    agent_id, tail = unescape_segment(rest[0]), rest[1:]
    key: SessionKey | None = None
    n = len(tail)
    if n == 1 and tail[0] == "main":
        key = SessionKey(raw=raw, family="agent", chat_type="direct", agent_id=agent_id)
    elif n == 2 and tail[0] == "dm":
        key = SessionKey(
            raw=raw, family="agent", chat_type="direct", agent_id=agent_id, peer_id=unescape_segment(tail[1])
        )
    elif n >= 3 and tail[1] in ("dm", "group", "channel"):
        _check_channel(raw, tail[0])
        channel, kind, ident = unescape_segment(tail[0]), tail[1], unescape_segment(tail[2])
        if kind == "dm" and n == 3:
            key = SessionKey(
                raw=raw, family="agent", chat_type="direct", agent_id=agent_id, channel=channel, peer_id=ident
            )
        elif kind in _THREAD_WORD and (n == 3 or (n == 5 and tail[3] == _THREAD_WORD[kind])):
            thread = unescape_segment(tail[4]) if n == 5 else None
            group_id, channel_id = (ident, None) if kind == "group" else (None, ident)
            key = SessionKey(
                raw=raw,
                family="agent",
                chat_type="group" if kind == "group" else "channel",
                agent_id=agent_id,
                channel=channel,
                group_id=group_id,
                channel_id=channel_id,
                thread_id=thread,
            )
    if key is None:
        if n == 5 and tail[1] in _THREAD_WORD and tail[3] in _THREAD_WORD.values():
            right = _THREAD_WORD[tail[1]]
            raise _bad_shape(raw, "agent", f"a {tail[1]}'s thread written :{right}:<threadId>, not :{tail[3]}:")
        raise _bad_shape(raw, "agent", _SHAPES)
    _check_agent(raw, agent_id, agents)
    return key


def parse_key(raw: str, *, agents: Collection[str]) -> SessionKey:
    """Parse and validate ``raw``; the agent of an ``agent:`` key must be one of ``agents``."""
    return _parse(raw, agents)


def _build(segments: Sequence[str], agents: Collection[str] | None) -> SessionKey:
    return _parse(":".join(escape_segment(s) for s in segments), agents)


def _dm_segments(agent_id: str, peer_id: str, channel: str | None) -> list[str]:
    if channel is None:
        return ["agent", agent_id, "dm", peer_id]
    return ["agent", agent_id, channel, "dm", peer_id]


def _group_segments(agent_id: str, channel: str, group_id: str, topic: str | None) -> list[str]:
    tail = [] if topic is None else ["topic", topic]
    return ["agent", agent_id, channel, "group", group_id, *tail]


def _channel_segments(agent_id: str, channel: str, channel_id: str, thread: str | None) -> list[str]:
    tail = [] if thread is None else ["thread", thread]
    return ["agent", agent_id, channel, "channel", channel_id, *tail]


def main_key(agent_id: str, *, agents: Collection[str] | None = None) -> str:
    """``agent:<agentId>:main``. Ids are escaped; with ``agents`` the agent must be configured."""
    return _build(["agent", agent_id, "main"], agents).raw


def dm_key(agent_id: str, peer_id: str, channel: str | None = None, *, agents: Collection[str] | None = None) -> str:
    """``agent:<agentId>:dm:<peerId>``, or ``agent:<agentId>:<channel>:dm:<peerId>`` with a channel."""
    return _build(_dm_segments(agent_id, peer_id, channel), agents).raw


def group_key(
    agent_id: str,
    channel: str,
    group_id: str,
    topic: str | None = None,
    *,
    agents: Collection[str] | None = None,
) -> str:
    """``agent:<agentId>:<channel>:group:<groupId>``, plus ``:topic:<threadId>`` when given."""
    return _build(_group_segments(agent_id, channel, group_id, topic), agents).raw


def channel_key(
    agent_id: str,
    channel: str,
    channel_id: str,
    thread: str | None = None,
    *,
    agents: Collection[str] | None = None,
) -> str:
    """``agent:<agentId>:<channel>:channel:<channelId>``, plus ``:thread:<threadId>`` when given."""
    return _build(_channel_segments(agent_id, channel, channel_id, thread), agents).raw


def cron_key(job_id: str) -> str:
    """``cron:<jobId>``."""
    return _build(["cron", job_id], None).raw


def hook_key(hook_id: str, *more: str) -> str:
    """``hook:<hookId>``; several parts make a multi-segment key (``hook:github:owner/repo:issue:1``).

    Each part is one id and is escaped, so ``hook_key(*parse_key(k, agents=...).hook_parts) == k``.
    """
    return _build(["hook", hook_id, *more], None).raw


def _bound_agent(ingress: Ingress, bindings: Sequence[BindingLike]) -> str | None:
    for binding in bindings:
        if binding.channel == ingress.channel and binding.chat_id == ingress.chat_id:
            return binding.agent
    return None


def route(
    ingress: Ingress,
    *,
    dm_scope: DmScope,
    bindings: Sequence[BindingLike],
    agents: Collection[str],
) -> SessionKey:
    """The key a channel message belongs to (SPEC section 1, channel ingress).

    The agent is the first binding matching (channel, chat_id), else ``ingress.agent_id`` when
    given (it must be configured: an unknown one is rejected, not replaced), else ``main``. Direct
    messages follow ``dm_scope`` and ignore ``thread_id`` and ``chat_id``; a group's thread becomes
    ``:topic:``, a channel's ``:thread:``.
    """
    agent_id = _bound_agent(ingress, bindings) or ingress.agent_id or DEFAULT_AGENT
    agent, channel = escape_segment(agent_id), escape_segment(ingress.channel)
    thread = encode_id(ingress.thread_id) if ingress.thread_id is not None else None
    segments: list[str]  # escaped already: ids through encode_id, names through escape_segment
    if ingress.chat_type == "direct":
        if dm_scope == "main":
            segments = ["agent", agent, "main"]
        elif dm_scope == "per-peer":
            segments = _dm_segments(agent, encode_id(ingress.sender_id), None)
        elif dm_scope == "per-channel-peer":
            segments = _dm_segments(agent, encode_id(ingress.sender_id), channel)
        else:
            raise ConfigError(f"session.dm_scope {dm_scope!r} is not one of main, per-peer, per-channel-peer")
    elif ingress.chat_type == "group":
        segments = _group_segments(agent, channel, encode_id(ingress.chat_id), thread)
    elif ingress.chat_type == "channel":
        segments = _channel_segments(agent, channel, encode_id(ingress.chat_id), thread)
    else:
        raise BadRequest(f"chat_type {ingress.chat_type!r} is not one of direct, group, channel")
    return _parse(":".join(segments), agents)
