"""Which memory scope a session key gets (``memory.scope``; ``memory.scopes`` says what a scope
is). ``memory/`` knows nothing of sessions: the gateway decides here.

- ``per-peer`` (default): the agent owner's sessions — ``agent:<id>:main`` and cron jobs — use the
  agent's shared files (``MEMORY.md``, ``memory/YYYY-MM-DD.md``, notes); every other session has a
  scope of its own, so what one person's conversation flushed or recalled never reaches
  another's: a direct conversation with a peer (``agent:<id>:dm:<peer>``,
  ``agent:<id>:<channel>:dm:<peer>``, the OpenAI front door's per-user keys) is the peer's
  scope, a group or channel (any topic or thread of it) the chat's, and webhook sessions the
  scope of their hook (``hook:<name>:...``).
- ``shared``: every session of the agent sees every memory file and writes the shared daily log
  (the behaviour before scopes; the owner opts in to it).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection

from memory.scopes import EVERY, Scope
from sessions.keys import SessionKey, parse_key

_UNSAFE = re.compile(r"[^A-Za-z0-9]+")


def scope_of(key: SessionKey, mode: str) -> Scope:
    """The memory scope of ``key`` under ``memory.scope`` ``mode``."""
    if mode == "shared":
        return EVERY
    if key.family == "cron":
        return None
    if key.family == "hook":
        return scope_name(("hook", key.hook_parts[0] if key.hook_parts else ""))
    if key.peer_id is not None:
        return scope_name((*((key.channel,) if key.channel else ()), "dm", key.peer_id))
    if key.group_id is not None:
        return scope_name((key.channel or "", "group", key.group_id))
    if key.channel_id is not None:
        return scope_name((key.channel or "", "channel", key.channel_id))
    return None  # agent:<id>:main


def scope_of_raw(raw: str, mode: str, agents: Collection[str]) -> Scope:
    return scope_of(parse_key(raw, agents=agents), mode)


def scope_name(parts: tuple[str, ...]) -> str:
    """A folder name for a scope: readable (ids reduced to letters, digits and '-') and unique (a
    digest of the exact ids: ``bob`` and ``Bob``, or ``a.b`` and ``a-b``, never share one). Ids
    never become paths as they are (SPEC section 1)."""
    readable = _UNSAFE.sub("-", "-".join(parts)).strip("-")[:60].strip("-") or "scope"
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:12]
    return f"{readable}-{digest}"
