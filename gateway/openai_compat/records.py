"""tasks.db rows of the OpenAI-compatible routes (migration 4): the conversation each key's client
holds, and response ids. Both go through the ledger's one connection, off the event loop."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from config.clock import Clock, iso
from gateway.openai_compat.history import Record
from sessions.ledger import Ledger


@dataclass(frozen=True)
class ResponseRef:
    response_id: str
    session_key: str
    run_id: str | None
    seq: int | None


class CompatRecords:
    def __init__(self, ledger: Ledger, clock: Clock) -> None:
        self.ledger = ledger
        self.clock = clock
        self._known: dict[str, Record] = {}  # write-through: this process is the table's only writer

    async def conversation(self, key: str) -> Record | None:
        if key in self._known:
            return self._known[key]
        record = await self._load(key)
        if record is not None:
            self._known[key] = record
        return record

    async def _load(self, key: str) -> Record | None:
        def _get(conn: sqlite3.Connection) -> Record | None:
            row = conn.execute(
                "SELECT epoch, base_count, request_count, request_digest, answered_count, answered_digest, answer"
                " FROM openai_conversations WHERE session_key = ?",
                (key,),
            ).fetchone()
            return Record(*row) if row else None

        return await self.ledger.execute(_get)

    async def save_conversation(self, key: str, record: Record) -> None:
        now = iso(self.clock())

        def _save(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO openai_conversations (session_key, epoch, base_count, request_count,"
                " request_digest, answered_count, answered_digest, answer, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key,
                    record.epoch,
                    record.base_count,
                    record.request_count,
                    record.request_digest,
                    record.answered_count,
                    record.answered_digest,
                    record.answer,
                    now,
                ),
            )

        await self.ledger.execute(_save)
        self._known[key] = record

    async def response(self, response_id: str) -> ResponseRef | None:
        def _get(conn: sqlite3.Connection) -> ResponseRef | None:
            row = conn.execute(
                "SELECT response_id, session_key, run_id, seq FROM openai_responses WHERE response_id = ?",
                (response_id,),
            ).fetchone()
            return ResponseRef(*row) if row else None

        return await self.ledger.execute(_get)

    async def latest_response(self, key: str) -> str | None:
        def _get(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT response_id FROM openai_responses WHERE session_key = ? ORDER BY rowid DESC LIMIT 1", (key,)
            ).fetchone()
            return str(row[0]) if row else None

        return await self.ledger.execute(_get)

    async def save_response(self, ref: ResponseRef) -> None:
        now = iso(self.clock())

        def _save(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO openai_responses (response_id, session_key, run_id, seq, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (ref.response_id, ref.session_key, ref.run_id, ref.seq, now),
            )

        await self.ledger.execute(_save)
