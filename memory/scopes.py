"""Memory scopes: which of an agent's memory files a caller sees and writes.

An agent's memory is its workspace's ``MEMORY.md`` and ``memory/**/*.md``. A *scope* narrows it:

- ``None``, the shared scope: every memory file outside ``memory/scopes/`` (``MEMORY.md``, the daily
  logs ``memory/YYYY-MM-DD.md``, notes);
- a scope name (``[A-Za-z0-9-]``, at most 100 characters): only the files under
  ``memory/scopes/<name>/``; its daily logs are ``memory/scopes/<name>/YYYY-MM-DD.md``;
- ``EVERY`` (``"*"``): every memory file (the API and the CLI, which serve the agent's owner).

Memory does not know what a scope stands for: the caller (the gateway) names it.
"""

from __future__ import annotations

import re
from datetime import date

from config.errors import BadRequest

SCOPES_DIR = "memory/scopes"
EVERY = "*"
Scope = str | None
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,99}$")


def check(scope: Scope) -> None:
    """BadRequest for a scope that is not ``None``, ``EVERY`` or a valid name."""
    if scope is None or scope == EVERY:
        return
    if not _NAME.match(scope):
        raise BadRequest(f"memory scope {scope!r} must be 1-100 characters of A-Z, a-z, 0-9 and '-', starting with one")


def folder(scope: str) -> str:
    """The folder, relative to the workspace, that holds a named scope's files."""
    return f"{SCOPES_DIR}/{scope}"


def contains(scope: Scope, path: str) -> bool:
    """Whether the memory file ``path`` (relative to the workspace) belongs to ``scope``."""
    if scope == EVERY:
        return True
    scoped = path.startswith(SCOPES_DIR + "/")
    if scope is None:
        return not scoped
    return path.startswith(folder(scope) + "/")


def base(scope: Scope) -> str:
    """Where a scope's own files go: ``memory`` for the shared scope (and ``EVERY``)."""
    return "memory" if scope is None or scope == EVERY else folder(scope)


def daily_path(today: date, scope: Scope = None) -> str:
    """The daily log of ``today`` in ``scope``."""
    return f"{base(scope)}/{today.isoformat()}.md"


def where(scope: Scope) -> str | None:
    """The LanceDB filter of a scope's chunks (names hold no LIKE wildcards); None: no filter."""
    if scope == EVERY:
        return None
    if scope is None:
        return f"path NOT LIKE '{SCOPES_DIR}/%'"
    return f"path LIKE '{folder(scope)}/%'"
