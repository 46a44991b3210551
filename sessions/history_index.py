"""The full-text history index as the rest of the program sees it, whatever the backend keeps it in
(``sessions.files.history.HistoryIndex``: SQLite FTS5 beside the run folders;
``sessions.postgres.history.PgHistoryIndex``: a table): the query, a hit, the counters, and the
calls the daemon, the history routes and the session tools make (``HistoryIndexProtocol``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from config.clock import iso, parse_iso
from config.errors import BadRequest
from sessions.history_text import indexable, message_text

MAX_BATCH = 2000  # messages the index writes in one batch, whatever the backend
MAX_BACKLOG = 5000  # messages fed and not yet written beyond which a post waits (history.max_backlog)
MAX_WAIT_S = 2.0  # a post waits this long at most (an index that stopped writing does not stop ingest)


@dataclass(frozen=True)
class HistoryQuery:
    q: str
    agent: str | None = None
    key: str | None = None
    role: str | None = None
    since: str | None = None
    until: str | None = None
    limit: int = 20
    offset: int = 0
    keys: frozenset[str] | None = None  # only these keys (agent tools' visibility)


def time_bound(name: str, raw: str | None) -> str | None:
    """``since`` / ``until`` as the stored timestamps are written (UTC ISO 8601), or BadRequest."""
    if not raw:
        return None
    try:
        return iso(parse_iso(raw))
    except (ValueError, OverflowError):  # OverflowError: 0001-01-01T00:00+01:00 is before year 1 in UTC
        raise BadRequest(
            f"'{name}' must be an ISO 8601 time from year 1 to 9999 in UTC, e.g. 2026-11-30T09:00:00+00:00",
            field=name,
        ) from None


@dataclass(frozen=True)
class HistoryHit:
    session_key: str
    run_id: str
    seq: int
    role: str
    timestamp: str | None
    snippet: str
    score: float
    agent_id: str | None
    tool: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "session_key": self.session_key,
            "run_id": self.run_id,
            "seq": self.seq,
            "role": self.role,
            "timestamp": self.timestamp,
            "snippet": self.snippet,
            "score": self.score,
            "agent_id": self.agent_id,
            "tool_result": self.tool,
            "link": f"/ui#/run/{self.run_id}?seq={self.seq}",
        }


@dataclass
class HistoryStats:
    indexed: int = 0
    batches: int = 0
    deleted: int = 0
    rebuilt_runs: int = 0
    refused: int = 0  # messages the index's database would not take (logged; not searchable)


@dataclass(eq=False)
class Backlog:
    """The messages fed to a history index and not yet written (``rows``). A post waits (``room``)
    while ``limit`` or more are behind, until the index's writer brings them below it, for
    ``wait_s`` at most: under a load the writer cannot keep up with (one process's loop and the
    index's tokenizer sharing one interpreter lock), ingest slows to the index's pace instead of the
    index falling ever further behind, a search missing ever more acknowledged messages (measured:
    68 % of 206,350 after 40 s of 5,146 msg/s on PostgreSQL, beyond what the index keeps in memory).
    ``limit`` 0: never wait. ``added`` and ``written`` run on the event loop. A wait that ends at
    ``wait_s`` with nothing written meanwhile costs that one post: the next do not wait until the
    writer writes again. While ``paused`` the
    writer is busy with other work (a rebuild from the run files: minutes on a large home), which
    ingest slowing down would not hasten: posts do not wait then."""

    limit: int = MAX_BACKLOG
    wait_s: float = MAX_WAIT_S
    rows: int = 0
    waits: int = 0  # posts that waited (/metrics)
    late: int = 0  # waits that ended at ``wait_s`` with the rows still behind
    paused: bool = False
    _room: asyncio.Event | None = field(default=None, init=False, repr=False)
    _stalled: bool = field(default=False, init=False, repr=False)  # a wait ended at wait_s; nothing written since

    def added(self, count: int = 1) -> None:
        self.rows += count

    def written(self, count: int) -> None:
        self.rows = max(0, self.rows - count)
        self._stalled = False
        if self._room is not None and self.rows < self.limit:
            self._room.set()
            self._room = None

    async def room(self) -> bool:
        """Wait while ``limit`` or more rows are behind (``wait_s`` at most); whether it waited."""
        if self.paused or self._stalled or self.limit <= 0 or self.rows < self.limit:
            return False
        self.waits += 1
        if self._room is None:
            self._room = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._room.wait(), self.wait_s)
            return True
        self.late += 1
        self._stalled = True  # the writer wrote nothing in wait_s: no post waits again until it does
        return True


class HistoryIndexProtocol(Protocol):
    """A history index a backend opens (``HistorySource.open_history``) and is handed back by the
    daemon to rebuild, catch up and check it."""

    stats: HistoryStats
    backlog: Backlog

    async def open(self) -> bool:
        """Start it; True when it was missing (then ``HistorySource.rebuild_history`` fills it)."""
        ...

    async def close(self) -> None: ...
    def feed(self, run_id: str, key: str, agent_id: str | None, record: Mapping[str, Any]) -> None:
        """Index a durable message (batched: ``flush`` waits for it)."""
        ...

    async def flush(self) -> None: ...
    async def delete_runs(self, run_ids: Iterable[str]) -> int: ...
    async def delete_key(self, key: str) -> int: ...
    async def search(self, query: HistoryQuery) -> list[HistoryHit]: ...
    async def count(self) -> int: ...
    async def seqs(self, run_id: str) -> set[int]: ...
    async def run_ids(self) -> set[str]: ...


IndexT = TypeVar("IndexT")


def own_index(index: HistoryIndexProtocol, kind: type[IndexT]) -> IndexT:
    """The index a backend opened, handed back to it: another backend's index is a programming
    error (the daemon hands each store the index that store opened)."""
    if not isinstance(index, kind):
        raise TypeError(f"{type(index).__name__} is not this backend's history index ({kind.__name__})")
    return index


def row_values(run_id: str, key: str, agent_id: str | None, record: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The ``messages`` row of a messages.jsonl record, or None when it is not indexed."""
    if not indexable(record):
        return None
    return (
        run_id,
        int(record.get("seq") or 0),
        key,
        agent_id,
        str(record.get("role") or ""),
        record.get("timestamp"),
        1 if record.get("role") == "tool" else 0,
        message_text(record),
    )
