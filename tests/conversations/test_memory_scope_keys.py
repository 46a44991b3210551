"""Which memory scope a session key gets (issue 24, item 3), as a table."""

from __future__ import annotations

import re

import pytest

from conversations.memory_scope import scope_name, scope_of_raw
from memory import scopes

AGENTS = ("main", "ops")
ROWS = [
    # (key, per-peer scope: None = the agent's shared files, else scope_name of these parts)
    ("agent:main:main", None),
    ("agent:ops:main", None),
    ("cron:digest", None),
    ("agent:main:dm:bob", ("dm", "bob")),
    ("agent:main:telegram:dm:42", ("telegram", "dm", "42")),
    ("agent:main:openai:dm:alice", ("openai", "dm", "alice")),
    ("agent:main:dm:%E7%94%B0%E4%B8%AD", ("dm", "田中")),
    ("agent:main:slack:group:G1", ("slack", "group", "G1")),
    ("agent:main:slack:group:G1:topic:7", ("slack", "group", "G1")),  # a topic is its chat's
    ("agent:main:slack:channel:C1:thread:9", ("slack", "channel", "C1")),
    ("hook:github:acme/app:issue:7", ("hook", "github")),
    ("hook:openai:0b7c2a4e-1111-4222-8333-444455556666", ("hook", "openai")),
]


@pytest.mark.parametrize(("key", "parts"), ROWS)
def test_scope_of_a_key(key: str, parts: tuple[str, ...] | None) -> None:
    scope = scope_of_raw(key, "per-peer", AGENTS)
    assert scope == (None if parts is None else scope_name(parts))
    if scope is not None:
        scopes.check(scope)  # a valid folder name, whatever the ids
    assert scope_of_raw(key, "shared", AGENTS) == scopes.EVERY


NAMES = [("dm", "bob"), ("dm", "Bob"), ("dm", "a.b"), ("dm", "a-b"), ("dm", "../.."), ("dm", "x" * 250), ("dm", "")]


@pytest.mark.parametrize("parts", NAMES)
def test_scope_names_are_safe_and_distinct(parts: tuple[str, ...]) -> None:
    name = scope_name(parts)
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]{0,99}", name)
    assert sum(scope_name(p) == name for p in NAMES) == 1
