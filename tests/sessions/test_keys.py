"""Session keys (SPEC section 1): tables for every family, properties for the grammar, ingress routing."""

from __future__ import annotations

import string
from collections.abc import Callable

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from config.errors import BadRequest, InvalidKey
from config.settings import Binding
from sessions.keys import (
    FAMILIES,
    MAX_KEY_LENGTH,
    RESERVED_WORDS,
    Ingress,
    SessionKey,
    channel_key,
    cron_key,
    dm_key,
    escape_segment,
    group_key,
    hook_key,
    main_key,
    parse_key,
    route,
    unescape_segment,
)

AGENTS = frozenset({"main", "ops"})
GRAMMAR = string.ascii_letters + string.digits + "_.@+-/#"
RULE_TEXT = {
    "empty_segment": "empty segment",
    "whitespace": "whitespace",
    "control_character": "control character",
    "character": "outside [A-Za-z0-9_.@+-/#]",
    "too_long": "longer than 256 characters",
    "reserved_word": "is reserved and cannot be a channel name",
    "unknown_family": "unknown family",
    "unknown_agent": "is not configured (configured: main, ops)",
    "bad_escape": "'%' must start the escape %3A",
    "shape": "not a valid",
}


def rejected(raw: str, rule: str, agents: frozenset[str] = AGENTS) -> InvalidKey:
    with pytest.raises(InvalidKey) as info:
        parse_key(raw, agents=agents)
    error = info.value
    assert error.extra["rule"] == rule, error.message
    assert RULE_TEXT[rule] in error.message
    assert error.status == 400
    assert error.code == "invalid_key"
    return error


# --- tables -------------------------------------------------------------------------------------

VALID = [
    ("agent:main:main", SessionKey("agent:main:main", "agent", "direct", agent_id="main")),
    ("agent:ops:dm:u42", SessionKey("agent:ops:dm:u42", "agent", "direct", agent_id="ops", peer_id="u42")),
    (
        "agent:main:telegram:dm:+4930123",
        SessionKey(
            "agent:main:telegram:dm:+4930123",
            "agent",
            "direct",
            agent_id="main",
            channel="telegram",
            peer_id="+4930123",
        ),
    ),
    (
        "agent:main:telegram:group:-100123",
        SessionKey(
            "agent:main:telegram:group:-100123",
            "agent",
            "group",
            agent_id="main",
            channel="telegram",
            group_id="-100123",
        ),
    ),
    (
        "agent:main:telegram:group:-100123:topic:7",
        SessionKey(
            "agent:main:telegram:group:-100123:topic:7",
            "agent",
            "group",
            agent_id="main",
            channel="telegram",
            group_id="-100123",
            thread_id="7",
        ),
    ),
    (
        "agent:ops:slack:channel:C0#general",
        SessionKey(
            "agent:ops:slack:channel:C0#general",
            "agent",
            "channel",
            agent_id="ops",
            channel="slack",
            channel_id="C0#general",
        ),
    ),
    (
        "agent:ops:slack:channel:C01:thread:1700000000.0001",
        SessionKey(
            "agent:ops:slack:channel:C01:thread:1700000000.0001",
            "agent",
            "channel",
            agent_id="ops",
            channel="slack",
            channel_id="C01",
            thread_id="1700000000.0001",
        ),
    ),
    (
        "agent:main:matrix:channel:room%3Aexample.org",
        SessionKey(
            "agent:main:matrix:channel:room%3Aexample.org",
            "agent",
            "channel",
            agent_id="main",
            channel="matrix",
            channel_id="room:example.org",
        ),
    ),
    ("cron:daily-digest", SessionKey("cron:daily-digest", "cron", "cron", job_id="daily-digest")),
    ("cron:a%3Ab%25c", SessionKey("cron:a%3Ab%25c", "cron", "cron", job_id="a:b%c")),
    (
        "hook:7f0c2b7e-8a51-4c38-9a53-0a4f7d8f5c11",
        SessionKey(
            "hook:7f0c2b7e-8a51-4c38-9a53-0a4f7d8f5c11",
            "hook",
            "hook",
            hook_id="7f0c2b7e-8a51-4c38-9a53-0a4f7d8f5c11",
            hook_parts=("7f0c2b7e-8a51-4c38-9a53-0a4f7d8f5c11",),
        ),
    ),
    (
        "hook:github:owner/repo:issue:123",
        SessionKey(
            "hook:github:owner/repo:issue:123",
            "hook",
            "hook",
            hook_id="github:owner/repo:issue:123",
            hook_parts=("github", "owner/repo", "issue", "123"),
        ),
    ),
    # reserved words are only forbidden as channel names; as ids they are ordinary text
    ("agent:main:dm:main", SessionKey("agent:main:dm:main", "agent", "direct", agent_id="main", peer_id="main")),
    (
        "agent:main:Group:group:topic",
        SessionKey(
            "agent:main:Group:group:topic", "agent", "group", agent_id="main", channel="Group", group_id="topic"
        ),
    ),
]


@pytest.mark.parametrize(("raw", "expected"), VALID, ids=[raw for raw, _ in VALID])
def test_valid_keys_parse(raw: str, expected: SessionKey) -> None:
    key = parse_key(raw, agents=AGENTS)
    assert key == expected
    assert str(key) == raw
    assert key.task_type == key.family
    assert key.task_identifier == raw


INVALID = [
    ("", "empty_segment"),
    (":agent:main:main", "empty_segment"),
    ("agent::main", "empty_segment"),
    ("agent:main:main:", "empty_segment"),
    ("cron:", "empty_segment"),
    ("hook:github::issue:1", "empty_segment"),
    ("agent:main:dm:alice smith", "whitespace"),
    ("agent:main:main ", "whitespace"),
    ("cron:job\tone", "whitespace"),
    ("hook:x\n", "whitespace"),
    ("agent:main:dm:a\u00a0b", "whitespace"),
    ("agent:main:dm:a\x00", "control_character"),
    ("cron:job\x7f", "control_character"),
    ("hook:a\u200bb", "control_character"),
    ("agent:main:dm:é", "character"),
    ("agent:main:dm:a?b", "character"),
    ("cron:a*", "character"),
    ("hook:a,b", "character"),
    ("agent:main:dm:a%3ab", "bad_escape"),
    ("agent:main:dm:100%", "bad_escape"),
    ("agent:main:dm:%2F", "bad_escape"),
    ("hook:" + "a" * (MAX_KEY_LENGTH - 4), "too_long"),
    ("agent:main:main:dm:u1", "reserved_word"),
    ("agent:main:dm:dm:u1", "reserved_word"),
    ("agent:main:group:group:g1", "reserved_word"),
    ("agent:main:channel:channel:c1:thread:t", "reserved_word"),
    ("agent:main:topic:group:g1", "reserved_word"),
    ("agent:main:thread:channel:c1", "reserved_word"),
    ("session:main:main", "unknown_family"),
    ("Agent:main:main", "unknown_family"),
    ("CRON:daily", "unknown_family"),
    ("agent:nobody:main", "unknown_agent"),
    ("agent:Main:main", "unknown_agent"),
    ("agent:nobody:tg:group:1", "unknown_agent"),
    ("agent", "shape"),
    ("agent:main", "shape"),
    ("agent:main:dm", "shape"),
    ("agent:main:dm:a:b", "shape"),
    ("agent:main:tg:group", "shape"),
    ("agent:main:tg:group:1:topic", "shape"),
    ("agent:main:tg:group:1:thread:2", "shape"),
    ("agent:main:tg:channel:1:topic:2", "shape"),
    ("agent:main:tg:dm:u1:topic:2", "shape"),
    ("agent:main:tg:room:1", "shape"),
    ("cron", "shape"),
    ("cron:a:b", "shape"),
    ("hook", "shape"),
]


@pytest.mark.parametrize(("raw", "rule"), INVALID, ids=[f"{rule}:{raw[:40]!r}" for raw, rule in INVALID])
def test_invalid_keys_name_the_rule(raw: str, rule: str) -> None:
    rejected(raw, rule)


def test_length_limit_is_inclusive() -> None:
    at_limit = "hook:" + "a" * (MAX_KEY_LENGTH - 5)
    assert len(at_limit) == MAX_KEY_LENGTH
    assert parse_key(at_limit, agents=AGENTS).hook_id == "a" * (MAX_KEY_LENGTH - 5)
    rejected(at_limit + "a", "too_long")


def test_messages_say_how_to_fix() -> None:
    assert "did you mean 'agent'" in rejected("Agent:main:main", "unknown_family").message
    assert "expected agent, cron or hook" in rejected("foo:x", "unknown_family").message
    assert "add it under 'agents:'" in rejected("agent:x:main", "unknown_agent").message
    assert "'group' is reserved" in rejected("agent:main:group:group:1", "reserved_word").message
    assert ":topic:<threadId>" in rejected("agent:main:tg:group:1:thread:2", "shape").message
    assert "%3A" in rejected("agent:main:dm:a?b", "character").message
    assert "character '?'" in rejected("agent:main:dm:a?b", "character").message
    long_error = rejected("hook:" + "x" * 5000, "too_long")
    assert len(long_error.message) < 300


def test_unknown_agent_lists_none_when_nothing_is_configured() -> None:
    with pytest.raises(InvalidKey, match=r"agent 'main' is not configured \(configured: none\)"):
        parse_key("agent:main:main", agents=())


BUILDERS: list[tuple[Callable[[], str], str]] = [
    (lambda: main_key("main"), "agent:main:main"),
    (lambda: dm_key("main", "u1"), "agent:main:dm:u1"),
    (lambda: dm_key("ops", "u1", "telegram"), "agent:ops:telegram:dm:u1"),
    (lambda: group_key("main", "telegram", "-100123"), "agent:main:telegram:group:-100123"),
    (lambda: group_key("main", "telegram", "-100123", "7"), "agent:main:telegram:group:-100123:topic:7"),
    (lambda: channel_key("main", "slack", "C01"), "agent:main:slack:channel:C01"),
    (lambda: channel_key("main", "slack", "C01", "1.2"), "agent:main:slack:channel:C01:thread:1.2"),
    (lambda: channel_key("main", "matrix", "r:x.org"), "agent:main:matrix:channel:r%3Ax.org"),
    (lambda: dm_key("main", "50%:off"), "agent:main:dm:50%25%3Aoff"),
    (lambda: cron_key("daily"), "cron:daily"),
    (lambda: hook_key("7f0c2b7e"), "hook:7f0c2b7e"),
    (lambda: hook_key("github", "owner/repo", "issue", "123"), "hook:github:owner/repo:issue:123"),
    (lambda: hook_key("a:b"), "hook:a%3Ab"),
]


@pytest.mark.parametrize(("build", "expected"), BUILDERS, ids=[expected for _, expected in BUILDERS])
def test_builders(build: Callable[[], str], expected: str) -> None:
    assert build() == expected
    assert parse_key(expected, agents=AGENTS).raw == expected


BAD_BUILDS: list[tuple[Callable[[], str], str]] = [
    (lambda: main_key("nobody", agents=AGENTS), "unknown_agent"),
    (lambda: dm_key("main", ""), "empty_segment"),
    (lambda: dm_key("main", "a b"), "whitespace"),
    (lambda: dm_key("main", "u1", "dm"), "reserved_word"),
    (lambda: group_key("main", "group", "g"), "reserved_word"),
    (lambda: group_key("main", "tg", "g", ""), "empty_segment"),
    (lambda: channel_key("main", "thread", "c"), "reserved_word"),
    (lambda: channel_key("main", "slack", "c\x01"), "control_character"),
    (lambda: cron_key("job?"), "character"),
    (lambda: hook_key("x" * MAX_KEY_LENGTH), "too_long"),
]


@pytest.mark.parametrize(("build", "rule"), BAD_BUILDS, ids=[rule for _, rule in BAD_BUILDS])
def test_builders_reject(build: Callable[[], str], rule: str) -> None:
    with pytest.raises(InvalidKey) as info:
        build()
    assert info.value.extra["rule"] == rule
    assert RULE_TEXT[rule] in info.value.message


def test_escape_segment() -> None:
    assert escape_segment("a:b") == "a%3Ab"
    assert escape_segment("100%") == "100%25"
    assert escape_segment("%3A") == "%253A"
    assert unescape_segment("%253A") == "%3A"
    with pytest.raises(InvalidKey, match="whitespace"):
        escape_segment("a b")
    with pytest.raises(InvalidKey, match="empty segment"):
        escape_segment("")


# --- properties ---------------------------------------------------------------------------------

plain = st.text(st.sampled_from(GRAMMAR), min_size=1, max_size=12)
ids = st.text(st.sampled_from(GRAMMAR + ":%"), min_size=1, max_size=12)
channels = ids.filter(lambda c: c not in RESERVED_WORDS)


@st.composite
def built_keys(draw: st.DrawFn) -> tuple[str, SessionKey]:
    """A key made by a builder from generated ids, with the SessionKey its parse must give."""
    agent, peer, channel, ident = draw(ids), draw(ids), draw(channels), draw(ids)
    thread = draw(st.none() | ids)
    kind = draw(st.sampled_from(["main", "dm", "channel-dm", "group", "channel", "cron", "hook"]))
    if kind == "main":
        return main_key(agent), SessionKey("", "agent", "direct", agent_id=agent)
    if kind == "dm":
        return dm_key(agent, peer), SessionKey("", "agent", "direct", agent_id=agent, peer_id=peer)
    if kind == "channel-dm":
        expected = SessionKey("", "agent", "direct", agent_id=agent, channel=channel, peer_id=peer)
        return dm_key(agent, peer, channel), expected
    if kind == "group":
        expected = SessionKey("", "agent", "group", agent_id=agent, channel=channel, group_id=ident, thread_id=thread)
        return group_key(agent, channel, ident, thread), expected
    if kind == "channel":
        expected = SessionKey(
            "", "agent", "channel", agent_id=agent, channel=channel, channel_id=ident, thread_id=thread
        )
        return channel_key(agent, channel, ident, thread), expected
    if kind == "cron":
        return cron_key(ident), SessionKey("", "cron", "cron", job_id=ident)
    parts = tuple(draw(st.lists(ids, min_size=1, max_size=5)))
    return hook_key(*parts), SessionKey("", "hook", "hook", hook_id=":".join(parts), hook_parts=parts)


def agents_for(key: SessionKey) -> frozenset[str]:
    return AGENTS | ({key.agent_id} if key.agent_id else set())


def rebuild(key: SessionKey) -> str:
    if key.family == "cron":
        assert key.job_id is not None
        return cron_key(key.job_id)
    if key.family == "hook":
        return hook_key(*key.hook_parts)
    assert key.agent_id is not None
    if key.chat_type == "direct":
        if key.peer_id is None:
            return main_key(key.agent_id)
        return dm_key(key.agent_id, key.peer_id, key.channel)
    assert key.channel is not None
    if key.chat_type == "group":
        assert key.group_id is not None
        return group_key(key.agent_id, key.channel, key.group_id, key.thread_id)
    assert key.channel_id is not None
    return channel_key(key.agent_id, key.channel, key.channel_id, key.thread_id)


@given(built_keys())
def test_build_parse_round_trip(built: tuple[str, SessionKey]) -> None:
    raw, expected = built
    key = parse_key(raw, agents=agents_for(expected))
    assert key == SessionKey(**{**expected.__dict__, "raw": raw})
    assert rebuild(key) == raw
    assert len(raw) <= MAX_KEY_LENGTH


@given(ids)
def test_escape_round_trip(text: str) -> None:
    escaped = escape_segment(text)
    assert ":" not in escaped
    assert unescape_segment(escaped) == text
    assert parse_key(f"cron:{escaped}", agents=()).job_id == text


def insert_points(raw: str) -> list[int]:
    """Positions where inserting a character breaks no %XX escape."""
    return [i for i in range(len(raw) + 1) if "%" not in raw[max(i - 2, 0) : i]]


@st.composite
def key_with(draw: st.DrawFn, chars: st.SearchStrategy[str]) -> tuple[str, str]:
    raw, _ = draw(built_keys())
    ch = draw(chars)
    at = draw(st.sampled_from(insert_points(raw)))
    spoiled = raw[:at] + ch + raw[at:]
    assume(len(spoiled) <= MAX_KEY_LENGTH)
    return spoiled, ch


WHITESPACE = st.sampled_from("\t\n\v\f\r") | st.characters(categories=["Zs", "Zl", "Zp"])
CONTROL = st.characters(categories=["Cc", "Cf"], exclude_characters="\t\n\v\f\r")
OUTSIDE = st.characters(
    exclude_categories=["Cc", "Cf", "Cs", "Zs", "Zl", "Zp"], exclude_characters=GRAMMAR + ":%"
).filter(lambda c: not c.isspace())


@given(built_keys(), st.data())
def test_empty_segment_rejected(built: tuple[str, SessionKey], data: st.DataObject) -> None:
    segments = built[0].split(":")
    at = data.draw(st.integers(0, len(segments)))
    rejected(":".join([*segments[:at], "", *segments[at:]]), "empty_segment", agents_for(built[1]))


@given(key_with(WHITESPACE))
def test_whitespace_rejected(spoiled: tuple[str, str]) -> None:
    rejected(spoiled[0], "whitespace", frozenset())


@given(key_with(CONTROL))
def test_control_character_rejected(spoiled: tuple[str, str]) -> None:
    error = rejected(spoiled[0], "control_character", frozenset())
    assert f"U+{ord(spoiled[1]):04X}" in error.message


@given(key_with(OUTSIDE))
def test_character_outside_grammar_rejected(spoiled: tuple[str, str]) -> None:
    error = rejected(spoiled[0], "character", frozenset())
    assert f"character {spoiled[1]!r}" in error.message


@given(st.sampled_from(["agent:main:dm:", "cron:", "hook:", "hook:github:"]), st.data())
def test_over_256_characters_rejected(prefix: str, data: st.DataObject) -> None:
    tail = data.draw(st.text(st.sampled_from(GRAMMAR + ":"), min_size=MAX_KEY_LENGTH - len(prefix) + 1))
    rejected(prefix + tail, "too_long")


@given(
    st.sampled_from(sorted(RESERVED_WORDS)),
    st.sampled_from(["dm:u", "group:g", "group:g:topic:t", "channel:c", "channel:c:thread:t"]),
    plain,
)
def test_reserved_word_as_channel_rejected(word: str, shape: str, ident: str) -> None:
    error = rejected(f"agent:main:{word}:{shape}{ident}", "reserved_word")
    assert f"'{word}' is reserved and cannot be a channel name" in error.message


@given(plain.filter(lambda f: f not in FAMILIES), built_keys())
def test_unknown_family_rejected(family: str, built: tuple[str, SessionKey]) -> None:
    rest = built[0].split(":", 1)[1]
    assume(len(family) + 1 + len(rest) <= MAX_KEY_LENGTH)
    error = rejected(f"{family}:{rest}", "unknown_family", agents_for(built[1]))
    assert f"unknown family {family!r} (expected agent, cron or hook)" in error.message


@given(built_keys())
def test_unknown_agent_rejected(built: tuple[str, SessionKey]) -> None:
    raw, key = built
    assume(key.agent_id is not None and key.agent_id not in AGENTS)
    error = rejected(raw, "unknown_agent")
    assert f"agent {key.agent_id!r} is not configured" in error.message


# --- ingress routing ----------------------------------------------------------------------------

BINDINGS = (
    Binding(channel="telegram", chat_id="-100123", agent="ops"),
    Binding(channel="slack", chat_id="C01", agent="ops"),
)


def ingress(chat_type: str, **fields: str | None) -> Ingress:
    base: dict[str, str | None] = {
        "channel": "telegram",
        "chat_id": "-100999",
        "sender_id": "u1",
        "thread_id": None,
        "agent_id": None,
    }
    base.update(fields)
    return Ingress(chat_type=chat_type, **base)  # type: ignore[arg-type]


ROUTES = [
    # dm_scope decides direct keys; chat_id and thread_id do not matter for them
    ("main", ingress("direct"), "agent:main:main"),
    ("main", ingress("direct", sender_id="u2", thread_id="5"), "agent:main:main"),
    ("per-peer", ingress("direct"), "agent:main:dm:u1"),
    ("per-peer", ingress("direct", channel="slack"), "agent:main:dm:u1"),
    ("per-channel-peer", ingress("direct"), "agent:main:telegram:dm:u1"),
    ("per-channel-peer", ingress("direct", channel="slack"), "agent:main:slack:dm:u1"),
    ("per-channel-peer", ingress("direct", sender_id="@a:m.org"), "agent:main:telegram:dm:@a%3Am.org"),
    # groups and channels: chat_id is the id, thread_id becomes :topic: / :thread:
    ("main", ingress("group"), "agent:main:telegram:group:-100999"),
    ("main", ingress("group", thread_id="42"), "agent:main:telegram:group:-100999:topic:42"),
    ("main", ingress("channel", channel="slack", chat_id="C9"), "agent:main:slack:channel:C9"),
    (
        "per-peer",
        ingress("channel", channel="slack", chat_id="C9", thread_id="17.5"),
        "agent:main:slack:channel:C9:thread:17.5",
    ),
    # bindings: channel and chat id pick the agent, and win over an explicit agent_id
    ("main", ingress("group", chat_id="-100123"), "agent:ops:telegram:group:-100123"),
    ("main", ingress("group", chat_id="-100123", agent_id="main"), "agent:ops:telegram:group:-100123"),
    ("main", ingress("direct", chat_id="-100123"), "agent:ops:main"),
    ("per-peer", ingress("channel", channel="slack", chat_id="C01"), "agent:ops:slack:channel:C01"),
    ("main", ingress("group", channel="slack", chat_id="-100123"), "agent:main:slack:group:-100123"),
    ("main", ingress("group", chat_id="C01"), "agent:main:telegram:group:C01"),
    # no binding: the explicit agent, else main
    ("main", ingress("direct", agent_id="ops"), "agent:ops:main"),
    ("per-peer", ingress("group", agent_id="ops", thread_id="1"), "agent:ops:telegram:group:-100999:topic:1"),
]


@pytest.mark.parametrize(("dm_scope", "message", "expected"), ROUTES, ids=[e for _, _, e in ROUTES])
def test_route(dm_scope: str, message: Ingress, expected: str) -> None:
    key = route(message, dm_scope=dm_scope, bindings=BINDINGS, agents=AGENTS)  # type: ignore[arg-type]
    assert key.raw == expected
    assert key == parse_key(expected, agents=AGENTS)
    assert key.chat_type == message.chat_type


BAD_ROUTES = [
    (ingress("direct", agent_id="nobody"), AGENTS, "unknown_agent"),
    (ingress("group"), frozenset({"ops"}), "unknown_agent"),
    (ingress("group", channel="group"), AGENTS, "reserved_word"),
    (ingress("group", chat_id="a b"), AGENTS, "whitespace"),
    (ingress("channel", thread_id=""), AGENTS, "empty_segment"),
    (ingress("group", chat_id="x" * MAX_KEY_LENGTH), AGENTS, "too_long"),
]


@pytest.mark.parametrize(("message", "agents", "rule"), BAD_ROUTES, ids=[r for _, _, r in BAD_ROUTES])
def test_route_rejects(message: Ingress, agents: frozenset[str], rule: str) -> None:
    with pytest.raises(InvalidKey) as info:
        route(message, dm_scope="per-peer", bindings=BINDINGS, agents=agents)
    assert info.value.extra["rule"] == rule


def test_route_rejects_unknown_chat_type() -> None:
    with pytest.raises(BadRequest, match="chat_type 'dm'"):
        route(ingress("dm"), dm_scope="main", bindings=(), agents=AGENTS)


@given(
    st.sampled_from(["main", "per-peer", "per-channel-peer"]),
    st.sampled_from(["direct", "group", "channel"]),
    channels,
    ids,
    ids,
    st.none() | ids,
)
def test_route_always_gives_a_key_that_parses_back(
    dm_scope: str, chat_type: str, channel: str, chat_id: str, sender_id: str, thread_id: str | None
) -> None:
    message = ingress(chat_type, channel=channel, chat_id=chat_id, sender_id=sender_id, thread_id=thread_id)
    key = route(message, dm_scope=dm_scope, bindings=(), agents=AGENTS)  # type: ignore[arg-type]
    assert parse_key(key.raw, agents=AGENTS) == key
    assert key.agent_id == "main"
    if chat_type == "group":
        assert (key.group_id, key.thread_id) == (chat_id, thread_id)
    elif chat_type == "channel":
        assert (key.channel_id, key.thread_id) == (chat_id, thread_id)
    elif dm_scope != "main":
        assert key.peer_id == sender_id
        assert key.channel == (channel if dm_scope == "per-channel-peer" else None)
