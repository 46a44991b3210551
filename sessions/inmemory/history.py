"""The in-memory backend's ``HistorySource``: a history index over the ``MemoryData`` (its rows
kept there, so a reopen finds them), searched with the words every backend indexes
(``sessions.history_words``: stemmed, accents folded; CJK runs as bigrams) and the files index's
filters. Every query term must match; a CJK run of two or more characters as a phrase."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sessions.findings import finding
from sessions.history_index import (
    MAX_BACKLOG,
    MAX_BATCH,
    Backlog,
    HistoryHit,
    HistoryIndexProtocol,
    HistoryQuery,
    HistoryStats,
    own_index,
    row_values,
)
from sessions.history_text import CJK_RUN, index_text, query_terms, snippet
from sessions.history_words import words
from sessions.inmemory.data import MemoryData
from sessions.records import StoredRecord

Row = tuple[Any, ...]  # sessions.history_index.row_values: run, seq, key, agent, role, timestamp, tool, text


def _phrases(q: str) -> list[list[str]]:
    """Each term of the query as the tokens it must match in a row, in order."""
    latin, runs = query_terms(q)
    texts = list(latin) + [index_text(run) for run in runs]
    return [tokens.split() for tokens in words().of(texts) if tokens]


def _hits(tokens: list[str], phrase: list[str]) -> int:
    if len(phrase) == 1 and len(phrase[0]) == 1 and CJK_RUN.fullmatch(phrase[0]):  # any token it starts
        return sum(1 for token in tokens if token.startswith(phrase[0]))
    width = len(phrase)
    return sum(1 for i in range(len(tokens) - width + 1) if tokens[i : i + width] == phrase)


class MemoryHistoryIndex:
    """``HistoryIndexProtocol`` on the data's rows; a fed message is indexed at once."""

    def __init__(self, data: MemoryData, *, max_batch: int = MAX_BATCH) -> None:
        self.data = data
        self.max_batch = max_batch
        self.stats = HistoryStats()
        self.backlog = Backlog(0)  # a fed message is indexed at once: nothing is ever behind
        self._tokens: dict[tuple[str, int], list[str]] = {}

    @property
    def rows(self) -> dict[tuple[str, int], Row]:
        if self.data.history is None:
            self.data.history = {}
        return self.data.history

    async def open(self) -> bool:
        missing = self.data.history is None
        if missing:
            self.data.history = {}
        return missing

    async def close(self) -> None:
        return None

    def feed(self, run_id: str, key: str, agent_id: str | None, record: Mapping[str, Any]) -> None:
        self.add([row_values(run_id, key, agent_id, record)])

    def add(self, rows: Iterable[Row | None]) -> int:
        added = 0
        for row in rows:
            if row is not None and row[0] in self.data.runs and (row[0], row[1]) not in self.rows:
                self.rows[(row[0], row[1])] = row
                added += 1
        self.stats.indexed += added
        return added

    async def flush(self) -> None:
        return None

    def _delete(self, gone: list[tuple[str, int]]) -> int:
        for place in gone:
            self.rows.pop(place, None)
            self._tokens.pop(place, None)
        self.stats.deleted += len(gone)
        return len(gone)

    async def delete_runs(self, run_ids: Iterable[str]) -> int:
        ids = set(run_ids)
        return self._delete([place for place in self.rows if place[0] in ids])

    async def delete_key(self, key: str) -> int:
        return self._delete([place for place, row in self.rows.items() if row[2] == key])

    def _words_of(self, place: tuple[str, int], row: Row) -> list[str]:
        if place not in self._tokens:
            self._tokens[place] = words().of([index_text(str(row[7]))])[0].split()
        return self._tokens[place]

    def _passes(self, row: Row, query: HistoryQuery) -> bool:
        if query.keys is not None and row[2] not in query.keys:
            return False
        for value, wanted in ((row[3], query.agent), (row[2], query.key), (row[4], query.role)):
            if wanted is not None and value != wanted:
                return False
        stamp = str(row[5] or "")
        return (query.since is None or stamp >= query.since) and (query.until is None or stamp < query.until)

    async def search(self, query: HistoryQuery) -> list[HistoryHit]:
        """Best first (the share of the row's words the terms match), then newest."""
        phrases = _phrases(query.q)
        if not phrases:
            return []
        scored = []
        for order, (place, row) in enumerate(self.rows.items()):
            if not self._passes(row, query):
                continue
            tokens = self._words_of(place, row)
            hits = [_hits(tokens, phrase) for phrase in phrases]
            if all(hits):
                scored.append((sum(hits) / max(len(tokens), 1), order, row))
        scored.sort(key=lambda item: (-item[0], -item[1]))
        page = scored[query.offset : query.offset + query.limit]
        return [
            HistoryHit(
                session_key=row[2], run_id=row[0], seq=int(row[1]), role=row[4], timestamp=row[5],
                snippet=snippet(str(row[7]), query.q), score=round(score, 4), agent_id=row[3], tool=bool(row[6]),
            )
            for score, _, row in page
        ]

    async def count(self) -> int:
        return len(self.rows)

    async def seqs(self, run_id: str) -> set[int]:
        return {seq for rid, seq in self.rows if rid == run_id}

    async def run_ids(self) -> set[str]:
        return {rid for rid, _ in self.rows}


class MemoryHistory:
    """A part of ``MemoryStore``: its ``HistorySource``, over its ``MemoryData``."""

    def __init__(self, data: MemoryData) -> None:
        self.data = data

    def open_history(self, *, max_batch: int | None = None, max_backlog: int = MAX_BACKLOG) -> MemoryHistoryIndex:
        return MemoryHistoryIndex(self.data, max_batch=max_batch or MAX_BATCH)  # indexes as fed: never behind

    def _unindexed(self, index: MemoryHistoryIndex) -> list[Row]:
        """The rows of every stored message the index lacks."""
        lacking = []
        for run_id, stored in self.data.runs.items():
            key = stored.row.get("session_key")
            if not key:
                continue
            for record in stored.messages:
                row = row_values(run_id, str(key), stored.row.get("agent_id"), record)
                if row is not None and (run_id, row[1]) not in index.rows:
                    lacking.append(row)
        return lacking

    async def rebuild_history(self, index: HistoryIndexProtocol) -> int:
        own = own_index(index, MemoryHistoryIndex)
        await own.delete_runs(list(await own.run_ids()))
        own.stats.rebuilt_runs += 1
        return own.add(self._unindexed(own))

    async def catch_up_history(self, index: HistoryIndexProtocol) -> None:
        own = own_index(index, MemoryHistoryIndex)
        own.add(self._unindexed(own))

    async def check_history(self, index: HistoryIndexProtocol, *, fix: bool) -> list[StoredRecord]:
        """Rows of no stored message (stale), stored messages the index lacks (holes)."""
        own = own_index(index, MemoryHistoryIndex)
        stored = {(run_id, int(r.get("seq") or 0)) for run_id, s in self.data.runs.items() for r in s.messages}
        stale = [place for place in own.rows if place not in stored]
        lacking = self._unindexed(own)
        findings = []
        if stale:
            if fix:
                own._delete(stale)
            detail = f"{len(stale)} index row(s) have no stored message"
            findings.append(finding("history_stale", "warning", detail, "delete their index rows", fixed=fix))
        if lacking:
            if fix:
                own.add(lacking)
            runs = len({row[0] for row in lacking})
            detail = f"{len(lacking)} message(s) of {runs} run(s) are missing from the history index"
            findings.append(finding("history_holes", "warning", detail, "index them", fixed=fix))
        return findings
