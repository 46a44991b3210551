"""Two parts of the session store: its reads by run id (``Reads``: tasks.db rows, run folders,
the JSONL stores, archives) and the small records tasks.db keeps beside the runs (``Records``:
idempotency records, webhook delivery ids, the OpenAI-compatible routes' conversations and
response ids, token usage per day)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from config.clock import iso
from config.errors import RunNotFound, StorageUnavailable
from home import layout
from sessions import usage as usage_days
from sessions.context_lines import ContextLine, read_back
from sessions.deliveries import RecordedId
from sessions.files import archive
from sessions.files.jsonl import iter_records, read_records
from sessions.files.ledger import run_metadata
from sessions.files.run_folder import folder_of
from sessions.files.store_state import StoreState
from sessions.protocol import RecordKind
from sessions.records import (
    NEWEST_RUNS,
    CompatConversation,
    HookDelivery,
    IdempotencyRecord,
    KnownKey,
    ResponseRef,
    RunQuery,
    RunRow,
    RunState,
    TaskKey,
)
from sessions.usage import DailyUsage, UsageQuery

T = TypeVar("T")


class Reads:
    """Rows of tasks.db, and a run's files wherever they are (its folder, or its archive)."""

    def __init__(self, state: StoreState) -> None:
        self.state = state

    async def get_run(self, run_id: str) -> RunRow | None:
        return cast(RunRow | None, await self.state.ledger.get_run(run_id))

    async def list_runs(self, query: RunQuery = NEWEST_RUNS) -> list[RunRow]:
        return cast(list[RunRow], await self.state.ledger.list_runs(query))

    async def usage_rows(self, query: UsageQuery) -> list[DailyUsage]:
        return await self.state.ledger.execute(lambda c: usage_days.rows(c, query))

    async def tokens_spent(self, day: str, agent_id: str, session_key: str) -> tuple[int, int]:
        return await self.state.ledger.execute(lambda c: usage_days.spent(c, day, agent_id, session_key))

    async def known_keys(self) -> list[KnownKey]:
        """Every key some run was on, with its agent and chat type (entries may be gone)."""
        return await self.state.ledger.execute(_known_keys)

    async def previous_runs(self, *, key: str, task_key: TaskKey | None, within_days: float) -> list[RunRow]:
        rows = await self.state.ledger.previous_runs(
            session_key=key,
            task_key=task_key.as_dict() if task_key is not None else None,
            since=self.state.expiry_cutoff(within_days),
        )
        return [cast(RunRow, r) for r in rows if run_metadata(r.get("metadata")).get("inherit") is not False]

    # -- reading stores -------------------------------------------------------------------------

    async def require_run(self, run_id: str) -> RunRow:
        row = await self.get_run(run_id)
        if row is None:
            raise RunNotFound(f"no run {run_id!r}; list runs with GET /v1/runs")
        return row

    async def locate_run(self, run_id: str) -> tuple[RunRow, Path | None]:
        """The ledger row and the folder (None when archived or missing)."""
        row = await self.require_run(run_id)
        active = self.state.runs.get(run_id)
        if active is not None:
            return row, folder_of(active)
        folder = self.state.home.run_dir(run_id, row["status"])
        return row, folder if await asyncio.to_thread(folder.is_dir) else None

    async def read_messages(self, run_id: str, *, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """From the run's folder, or streamed out of its archive."""
        row, folder = await self.locate_run(run_id)
        if folder is None:
            records = [r for r in await self._archived(row, layout.MESSAGES) if int(r.get("seq", 0)) > after_seq]
            return records[:limit]
        path = folder / layout.MESSAGES

        def _read() -> list[dict[str, Any]]:
            out = []
            for record in iter_records(path):
                if int(record.get("seq", 0)) > after_seq:
                    out.append(record)
                    if len(out) >= limit:
                        break
            return out

        return await asyncio.to_thread(_read)

    async def read_records(self, run_id: str, kind: RecordKind) -> list[dict[str, Any]]:
        row, folder = await self.locate_run(run_id)
        name = _RECORD_FILES[kind]
        if folder is None:
            return await self._archived(row, name)
        return await asyncio.to_thread(read_records, folder / name)

    async def read_final_summary(self, run_id: str) -> str | None:
        row, folder = await self.locate_run(run_id)
        if folder is not None:
            path = folder / layout.FINAL_SUMMARY
            return await asyncio.to_thread(_read_text, path)
        if row.get("archived_at"):
            tarball = self.state.home.archive_file(run_id)
            return await asyncio.to_thread(archive.read_member, tarball, run_id, layout.FINAL_SUMMARY)
        return None

    async def _archived(self, row: RunRow, name: str) -> list[dict[str, Any]]:
        if not row.get("archived_at"):
            raise RunNotFound(f"run {row['uuid']} has no readable folder")
        run_id = row["uuid"]
        return await asyncio.to_thread(archive.read_records, self.state.home.archive_file(run_id), run_id, name)

    async def read_context(self, run: RunState) -> list[ContextLine]:
        """current.jsonl as the model will see it, in its order (``sessions.context_order``: a
        turn's reply before the messages that waited for a later turn). With appends of the run queued, it is read
        through the writer, after them; with none (a turn reads after its message is durable), it
        is whole on disk and read on a worker thread, not queued behind other runs' writes and
        syncs (a wait in series on every turn), and not on the loop (a context near the
        compaction threshold is hundreds of kB to parse). Rewrites of the file (compaction,
        uncompact) run under the key's turn lock and are awaited, so none is in flight while a
        turn reads."""
        path = folder_of(run) / layout.CURRENT

        def _read() -> list[ContextLine]:
            return read_back(read_records(path))

        if run.appends_pending == 0:
            return await asyncio.to_thread(_read)
        return await self.state.writer.call(_read)

class Records:
    """The records tasks.db keeps beside the runs (a tasks.db failure here is the typed
    ``StorageUnavailable``)."""

    def __init__(self, state: StoreState) -> None:
        self.state = state
        # the reply records asked for in this pass of the loop, and the future of their commit
        self._reply_batch: tuple[list[tuple[Any, ...]], asyncio.Future[None]] | None = None

    # -- idempotency records --------------------------------------------------------------------

    async def find_idempotency(self, key: str, client_message_id: str, *, since: str) -> IdempotencyRecord | None:
        """The record of ``client_message_id`` on ``key`` made at or after ``since``."""

        sql = (
            "SELECT run_id, message_seq, response FROM idempotency"
            " WHERE session_key = ? AND client_message_id = ? AND created_at >= ?"
        )
        return await self._one(sql, (key, client_message_id, since), IdempotencyRecord)

    async def remember_delivery(self, key: str, client_message_id: str, *, run_id: str | None, seq: int | None) -> None:
        """A new delivery of ``client_message_id`` stored as ``seq`` (no reply yet): it replaces
        an expired record whole, so its window starts now and the old reply is not replayed."""
        update = "created_at = excluded.created_at, response = NULL"
        stamp = await self._save_idempotency(key, client_message_id, run_id, seq, None, update)
        self._note_recorded(key, client_message_id, RecordedId(stamp, run_id, seq), replace=True)

    async def remember_reply(
        self, key: str, client_message_id: str, *, run_id: str | None, seq: int | None, response: str
    ) -> None:
        """The reply body (JSON) to replay to a redelivery of ``client_message_id``. The reply
        records asked for in one pass of the loop are written in one transaction (one commit)."""
        batch = self._reply_batch
        if batch is None:
            loop = asyncio.get_running_loop()
            batch = self._reply_batch = ([], loop.create_future())
            loop.call_soon(self._write_replies)
        batch[0].append((key, client_message_id, iso(self.state.clock()), run_id, seq, response))
        await asyncio.shield(batch[1])

    def _write_replies(self) -> None:
        batch, self._reply_batch = self._reply_batch, None
        if batch is not None:
            task = asyncio.ensure_future(self._commit_replies(*batch))
            _REPLY_WRITES.add(task)
            task.add_done_callback(_REPLY_WRITES.discard)

    async def _commit_replies(self, rows: list[tuple[Any, ...]], done: asyncio.Future[None]) -> None:
        sql = (
            "INSERT INTO idempotency (session_key, client_message_id, created_at, run_id, message_seq, response)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_key, client_message_id) DO UPDATE SET"
            " run_id = excluded.run_id, message_seq = excluded.message_seq,"
            " response = COALESCE(excluded.response, idempotency.response)"
        )
        try:
            await self._records(lambda c: c.executemany(sql, rows))
        except BaseException as exc:
            done.set_exception(exc)
            done.exception()  # retrieved: each caller re-raises it
            if not isinstance(exc, Exception):
                raise
            return
        for key, cmid, stamp, run_id, seq, _ in rows:
            self._note_recorded(key, cmid, RecordedId(stamp, run_id, seq), replace=False)
        done.set_result(None)

    async def _save_idempotency(
        self, key: str, cmid: str, run_id: str | None, seq: int | None, response: str | None, update: str
    ) -> str:
        stamp = iso(self.state.clock())
        row = (key, cmid, stamp, run_id, seq, response)
        sql = (
            "INSERT INTO idempotency (session_key, client_message_id, created_at, run_id, message_seq, response)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_key, client_message_id) DO UPDATE SET"
            " run_id = excluded.run_id, message_seq = excluded.message_seq, " + update
        )
        await self._records(lambda c: c.execute(sql, row))
        return stamp

    async def recorded(self, key: str) -> dict[str, RecordedId]:
        """The client_message_ids tasks.db records for ``key`` (read once per key and process,
        then kept as this process writes them), by id."""
        known = self.state.recorded_ids.get(key)
        if known is not None:
            return known
        sql = "SELECT client_message_id, created_at, run_id, message_seq FROM idempotency WHERE session_key = ?"
        rows = await self._records(lambda c: c.execute(sql, (key,)).fetchall())
        known = self.state.recorded_ids.get(key)  # read meanwhile by another caller: that one is current
        if known is None:
            known = self.state.recorded_ids[key] = {row[0]: RecordedId(row[1], row[2], row[3]) for row in rows}
        return known

    def _note_recorded(self, key: str, cmid: str, found: RecordedId, *, replace: bool) -> None:
        """A record just written for ``cmid`` (``replace``: a new delivery's, its window starts now)."""
        known = self.state.recorded_ids.get(key)
        if known is None:
            return
        before = known.get(cmid)
        known[cmid] = found if replace or before is None else before._replace(run_id=found.run_id, seq=found.seq)

    # -- webhook deliveries ---------------------------------------------------------------------

    async def hook_delivery(self, delivery_id: str) -> HookDelivery | None:
        sql = "SELECT session_key, message_seq FROM hook_deliveries WHERE delivery_id = ?"
        return await self._one(sql, (delivery_id,), HookDelivery)

    async def record_hook_delivery(
        self, delivery_id: str, hook: str, *, session_key: str | None, message_seq: int | None
    ) -> None:
        """Remember a delivery id (the first record of an id wins)."""
        row = (delivery_id, hook, iso(self.state.clock()), session_key, message_seq)
        sql = (
            "INSERT INTO hook_deliveries (delivery_id, hook, created_at, session_key, message_seq)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (delivery_id) DO NOTHING"
        )
        await self._records(lambda c: c.execute(sql, row))

    # -- the OpenAI-compatible routes' records --------------------------------------------------

    async def compat_conversation(self, key: str) -> CompatConversation | None:
        sql = (
            "SELECT epoch, base_count, request_count, request_digest, answered_count, answered_digest, answer"
            " FROM openai_conversations WHERE session_key = ?"
        )
        return await self._one(sql, (key,), CompatConversation)

    async def save_compat_conversation(self, key: str, record: CompatConversation) -> None:
        row = (
            key, record.epoch, record.base_count, record.request_count, record.request_digest,
            record.answered_count, record.answered_digest, record.answer, iso(self.state.clock()),
        )  # fmt: skip
        sql = (
            "INSERT OR REPLACE INTO openai_conversations (session_key, epoch, base_count, request_count,"
            " request_digest, answered_count, answered_digest, answer, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        await self._records(lambda c: c.execute(sql, row))

    async def compat_response(self, response_id: str) -> ResponseRef | None:
        sql = "SELECT response_id, session_key, run_id, seq FROM openai_responses WHERE response_id = ?"
        return await self._one(sql, (response_id,), ResponseRef)

    async def latest_compat_response(self, key: str) -> str | None:
        sql = "SELECT response_id FROM openai_responses WHERE session_key = ? ORDER BY rowid DESC LIMIT 1"
        return await self._one(sql, (key,), str)

    async def save_compat_response(self, ref: ResponseRef) -> None:
        row = (ref.response_id, ref.session_key, ref.run_id, ref.seq, iso(self.state.clock()))
        sql = "INSERT INTO openai_responses (response_id, session_key, run_id, seq, created_at) VALUES (?, ?, ?, ?, ?)"
        await self._records(lambda c: c.execute(sql, row))

    async def _one(self, sql: str, args: tuple[object, ...], make: Callable[..., T]) -> T | None:
        """The one row ``sql`` finds, made into a record (its columns in order), or None."""
        row = await self._records(lambda c: c.execute(sql, args).fetchone())
        return None if row is None else make(*row)

    async def _records(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """A statement on the records beside the runs; a tasks.db failure is the typed
        ``StorageUnavailable`` (callers outside the backend know no SQLite)."""
        try:
            return await self.state.ledger.execute(work)
        except sqlite3.Error as exc:
            refused = StorageUnavailable(f"tasks.db cannot read or write the record ({exc}); try again shortly")
            del refused.extra["stored"]  # a record beside a message already stored: not known here
            raise refused from exc


_REPLY_WRITES: set[asyncio.Task[None]] = set()  # held until done (the loop keeps only weak references)


def _known_keys(conn: sqlite3.Connection) -> list[KnownKey]:
    sql = "SELECT session_key, max(agent_id), max(chat_type) FROM tasks WHERE session_key IS NOT NULL GROUP BY 1"
    return [KnownKey(r[0], r[1], r[2]) for r in conn.execute(sql)]


_RECORD_FILES: dict[RecordKind, str] = {
    "summaries": layout.SUMMARIES, "tools": layout.TOOLS, "planning": layout.PLANNING,
}  # fmt: skip


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
