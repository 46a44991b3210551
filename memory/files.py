"""An agent's memory files as the tools and the API read and write them: listed, read (a file or
some of its lines) within a scope, and the daily log appended to (blocking file work off the loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from datetime import date
from pathlib import Path

from config.errors import BadRequest, MemoryFileNotFound, UnknownAgent
from config.settings import MemorySettings
from memory import scopes, sources
from memory.records import AppendResult, MemoryFile


class MemoryFiles:
    """The memory files of every agent (``workspaces``: agent id → workspace folder, with
    ``settings.extra_paths``); ``changed`` is told the agents whose files an append changed (the
    index brings them level)."""

    def __init__(
        self, settings: MemorySettings, workspaces: Mapping[str, Path], changed: Callable[[set[str]], None]
    ) -> None:
        self.settings = settings
        self._workspaces = workspaces
        self._changed = changed
        self._append_locks: dict[str, asyncio.Lock] = {}

    def agent(self, agent: str) -> str:
        """``agent``, if it is configured (else ``UnknownAgent``)."""
        if agent not in self._workspaces:
            raise UnknownAgent(f"agent {agent!r} is not configured")
        return agent

    def list_files(self, agent: str) -> list[MemoryFile]:
        """The agent's memory files (path relative to the workspace, size, mtime), by path."""
        return sources.list_files(self._workspaces[self.agent(agent)], self.settings.extra_paths)

    def read_file(self, agent: str, path: str, scope: scopes.Scope = scopes.EVERY) -> str:
        """A memory file's text; BadRequest outside the memory sources, NotFound if missing or
        not in ``scope``."""
        workspace = self._workspaces[self.agent(agent)]
        f = sources.resolve(workspace, path, self.settings.extra_paths)
        if not scopes.contains(scope, f.rel):
            raise MemoryFileNotFound(f"memory file {path!r} is not available here")
        try:
            return sources.read_text_inside(f.abs, sources.allowed_roots(workspace, self.settings.extra_paths))
        except FileNotFoundError as exc:
            raise MemoryFileNotFound(f"memory file {path!r} does not exist") from exc

    async def lines(
        self, agent: str, path: str, start: int | None, end: int | None, include_memory_md: bool, scope: scopes.Scope
    ) -> str:
        """The ``memory_get`` tool: lines ``start``..``end`` (1-based, inclusive) of a file. With
        ``include_memory_md`` false (the caller may not show it) MEMORY.md is NotFound, and so is
        a file outside ``scope``."""
        scopes.check(scope)
        if not include_memory_md and path == sources.MEMORY_MD:
            raise MemoryFileNotFound("MEMORY.md is not available here")
        text = await asyncio.to_thread(self.read_file, agent, path, scope)
        return sources.line_slice(text, start, end)

    async def append_daily(self, agent: str, text: str, *, today: date, scope: scopes.Scope = None) -> AppendResult:
        """The ``memory_append`` tool: add the lines of ``text`` to the daily log of ``today`` (in the
        agent's zone, chosen by the caller) in ``scope`` (``memory/<today>.md`` for the shared
        scope, ``memory/scopes/<scope>/<today>.md`` for a named one), skipping lines already
        there; then index it."""
        workspace = self._workspaces[self.agent(agent)]
        if scope == scopes.EVERY:
            raise BadRequest("a daily log is written in one scope: the shared one (None) or a named one")
        scopes.check(scope)
        if not text.strip():
            raise BadRequest("text must hold at least one non-blank line")
        lock = self._append_locks.setdefault(agent, asyncio.Lock())
        async with lock:
            result = await asyncio.to_thread(sources.append_daily, workspace, text, today, scope)
        if result.appended:
            self._changed({agent})
        return result
