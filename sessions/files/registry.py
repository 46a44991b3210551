"""sessions.json: one small entry per key, kept in memory and written atomically — at once on
lifecycle changes, otherwise coalesced to at most one rewrite per ``sessions_flush_ms``. A new run
is coalesced too: its folder and tasks.db row are durable before it is used, and recovery
rebuilds its entry from them, so creating a session costs the same at 10,000 keys as at 10."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from home.atomic import write_atomic
from home.damage import DamagedState
from sessions.entries import SessionEntry as SessionEntry  # re-exported: the registry's record

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


def check_format(path: Path, version: Any) -> None:
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise DamagedState(
            path,
            f"format_version {version} is newer than this neotask knows ({FORMAT_VERSION})",
            "upgrade neotask, or move the file aside to have it rebuilt from tasks.db and the run folders",
        )


class SessionRegistry:
    def __init__(self, path: Path, *, flush_ms: int) -> None:
        self.path = path
        self.flush_ms = flush_ms
        self.entries: dict[str, SessionEntry] = {}
        self.rewrites = 0
        self._encoded: dict[str, str] = {}
        self._dirty: set[str] = set()
        self._unencoded: set[str] = set()
        self._removed = False
        self._flush_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    # -- loading --------------------------------------------------------------------------------

    def load(self) -> str | None:
        """Read sessions.json; None when it loaded, else why not (the caller rebuilds).
        ``DamagedState`` when a newer neotask wrote it: rebuilding would throw its entries away."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            check_format(self.path, data.get("format_version"))
            sessions = data["sessions"]
            entries = {key: SessionEntry.from_dict(value, key=key) for key, value in sessions.items()}
        except FileNotFoundError:
            return "missing"
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return f"unreadable ({exc})"
        self.entries = entries
        self._encoded = {}
        self._unencoded = set(entries)  # encoded at the first flush, not a reason to flush
        self._dirty = set()
        return None

    # -- changes --------------------------------------------------------------------------------

    def put(self, entry: SessionEntry) -> None:
        self.entries[entry.key] = entry
        self.touch(entry.key)

    def remove(self, key: str) -> None:
        self.entries.pop(key, None)
        self._encoded.pop(key, None)
        self._dirty.discard(key)
        self._removed = True

    def touch(self, key: str) -> None:
        """Mark an entry changed; the file follows within ``flush_ms``."""
        self._dirty.add(key)
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(self.flush_ms / 1000)
        await self.flush()

    @property
    def pending(self) -> bool:
        return bool(self._dirty) or self._removed

    async def flush(self, *, force: bool = False) -> None:
        """Write now if anything changed (lifecycle changes call this directly)."""
        async with self._lock:
            if not (self.pending or force):
                return
            snapshot = self._snapshot()
            await asyncio.to_thread(self._write, snapshot)

    def flush_sync(self) -> None:
        """Blocking flush, for tools that work on the files without a running loop."""
        self._write(self._snapshot())

    def _snapshot(self) -> dict[str, str]:
        """Re-encode only the changed entries; the rest reuse their cached text."""
        for key in self._dirty | self._unencoded:
            entry = self.entries.get(key)
            if entry is not None:
                self._encoded[key] = entry.encode()
        self._dirty.clear()
        self._unencoded.clear()
        self._removed = False
        return dict(self._encoded)

    def _write(self, encoded: dict[str, str]) -> None:
        parts = [f"{json.dumps(key, ensure_ascii=False)}:{text}" for key, text in sorted(encoded.items())]
        document = f'{{"format_version":{FORMAT_VERSION},"sessions":{{\n' + ",\n".join(parts) + "\n}}\n"
        write_atomic(self.path, document.encode("utf-8"))
        self.rewrites += 1

    async def close(self) -> None:
        if self._flush_task is not None and not self._flush_task.done():
            self._flush_task.cancel()
        await self.flush()
