"""Transcripts as a memory source (``memory.sources: [memory, sessions]``): when a run completes,
its final summary is written to ``<workspace>/memory/sessions/<uuid>.md`` (in its key's memory
scope: ``memory/scopes/<scope>/sessions/<uuid>.md``), which the memory index picks up like any
note. Only the summary is embedded, never every message. ``memory_search``
cites those hits as ``run:<uuid>``; sessions whose chat type does not see MEMORY.md
(``memory.recall.chat_types``) do not see them either, so group and channel sessions never read
a direct conversation's summary. ``memory/`` knows nothing of sessions: this module joins them."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from pathlib import Path

from config.errors import RunNotFound
from home.atomic import write_atomic
from memory import scopes
from memory.scopes import Scope
from sessions.events import StoreEvent
from sessions.protocol import ConversationStore

log = logging.getLogger(__name__)
SESSIONS_DIR = "memory/sessions"
_CITATION = re.compile(r"^memory/(?:scopes/[A-Za-z0-9-]+/)?sessions/([0-9a-f-]{36})\.md(?:#.*)?$")
_TRANSCRIPT = re.compile(r"^memory/(?:scopes/[A-Za-z0-9-]+/)?sessions/")


def run_citation(citation: str) -> str:
    """``memory/sessions/<uuid>.md#L1-L9`` (or in a scope) → ``run:<uuid>``; any other citation unchanged."""
    match = _CITATION.match(citation)
    return f"run:{match.group(1)}" if match else citation


def is_transcript(path: str) -> bool:
    return _TRANSCRIPT.match(path) is not None


def transcript_path(scope: Scope, run_id: str) -> str:
    """Where the final summary of a run of ``scope`` is kept, relative to the workspace."""
    return f"{scopes.base(scope)}/sessions/{run_id}.md"


def summary_note(run_id: str, key: str, chat_type: str, ended_at: str, summary: str) -> str:
    return f"# Run {run_id}\n\nSession `{key}` ({chat_type}), ended {ended_at}.\n\n{summary.strip()}\n"


class TranscriptSource:
    """``on_event`` is a store listener (``StoreHooks.listeners``, connected in gateway/services.py)."""

    def __init__(
        self, store: ConversationStore, workspaces: dict[str, Path], scope_of: Callable[[str], Scope] | None = None
    ) -> None:
        self.store = store
        self.workspaces = workspaces
        self.scope_of = scope_of or (lambda _key: None)
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    def path(self, agent_id: str | None, run_id: str, key: str | None = None) -> Path | None:
        """The note of a run of ``key`` (in the key's memory scope; the shared one without a key)."""
        workspace = self.workspaces.get(agent_id or "main")
        scope = self.scope_of(key) if key is not None else None
        if workspace is None:
            return None
        return workspace / transcript_path(None if scope == scopes.EVERY else scope, run_id)

    def on_event(self, event: StoreEvent) -> None:
        if self.closed:
            return
        if event.get("type") != "lifecycle" or event.get("action") not in ("completed", "failed"):
            return
        if event.get("reason") == "purge":
            return
        task = asyncio.create_task(self.write(str(event["run_id"]), str(event["key"]), str(event.get("at") or "")))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def write(self, run_id: str, key: str, ended_at: str) -> None:
        row = await self.store.get_run(run_id)
        if row is None:
            return
        target = self.path(row.get("agent_id"), run_id, key)
        if target is None:
            return
        try:
            summary = await self.store.read_final_summary(run_id)
        except RunNotFound:  # purged meanwhile: nothing to note
            return
        except OSError as exc:
            log.error("could not read the final summary of run %s for memory: %s", run_id, exc)
            return
        if summary is None or not summary.strip():
            return

        def _write() -> bool:
            target.parent.mkdir(parents=True, exist_ok=True)
            note = summary_note(run_id, key, str(row.get("chat_type") or "direct"), ended_at, summary)
            write_atomic(target, note.encode("utf-8"))
            return True

        try:
            if await asyncio.to_thread(_write):
                log.info("final summary of run %s added to the memory sources", run_id)
        except OSError as exc:
            log.error("could not write the final summary of run %s to memory: %s", run_id, exc)

    async def forget(self, agent_id: str | None, run_ids: list[str]) -> None:
        """Remove the notes of purged runs, in whichever memory scope they were written (the
        memory index follows the deleted files)."""
        workspace = self.workspaces.get(agent_id or "main")

        def _remove() -> None:
            if workspace is None:
                return
            for run_id in run_ids:
                (workspace / transcript_path(None, run_id)).unlink(missing_ok=True)
                for note in (workspace / scopes.SCOPES_DIR).glob(f"*/sessions/{run_id}.md"):
                    note.unlink(missing_ok=True)

        await asyncio.to_thread(_remove)

    async def close(self) -> None:
        self.closed = True
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
