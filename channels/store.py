"""``<home>/channels.db``: the durable outbox of replies and the pairing codes (SQLite, WAL,
synchronous=FULL; one connection used from one thread at a time behind an asyncio lock, so the
event loop never waits on the disk).

Outbox rows, one per platform message that asks for an answer, keyed by its client_message_id:
``pending`` (stored, no answer yet) → ``answered`` (the answer's text is here) → ``sent`` (every
part accepted; ``parts_sent`` counts them as they go) or ``failed`` (refused for good). A row is
written before the message is stored, so whatever a crash interrupts is found again at start.

``stored_messages``: the platform messages stored in a session, by chat and platform id, so an
edit or a deletion is stored only where its message was (channels/revisions.py). Records made
while one is being written are written together, in one transaction (one fsync for a batch of
messages a connector took at once, not one each).

What connectors keep about their platform: the updates they could not read (the raw JSON and why,
the last ``UNREADABLE_KEPT`` per account), each account's first bot (Telegram keys the updates
of any later bot by its id), and named values a connector keeps (``connector_state``: Matrix's
sync token and what it knows of each room).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from channels import pairing
from channels.pairing import Pairing
from channels.protocol import Inbound
from config.clock import iso

T = TypeVar("T")
_ROW = "inbound, state, reply, parts_sent, attempts, last_error"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    client_message_id TEXT PRIMARY KEY,
    channel TEXT NOT NULL,
    account TEXT NOT NULL,
    inbound TEXT NOT NULL,
    state TEXT NOT NULL,
    reply TEXT,
    reply_ref TEXT,
    parts_sent INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_state ON outbox(state);
CREATE TABLE IF NOT EXISTS stored_messages (
    channel TEXT NOT NULL,
    account TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    digest TEXT NOT NULL,
    thread_id TEXT,
    replied INTEGER NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (channel, account, chat_id, message_id)
);
CREATE INDEX IF NOT EXISTS stored_messages_age ON stored_messages(updated_at);
"""
_CONNECTOR_SCHEMA = """
CREATE TABLE IF NOT EXISTS unreadable_updates (
    channel TEXT NOT NULL,
    account TEXT NOT NULL,
    update_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (channel, account, update_id)
);
CREATE TABLE IF NOT EXISTS connector_state (
    channel TEXT NOT NULL,
    account TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (channel, account, name)
);
CREATE TABLE IF NOT EXISTS first_bots (
    channel TEXT NOT NULL,
    account TEXT NOT NULL,
    bot_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (channel, account)
);
"""
UNREADABLE_KEPT = 1000


@dataclass(frozen=True)
class OutboxRow:
    inbound: Inbound
    state: str
    reply: str | None
    parts_sent: int
    attempts: int
    last_error: str | None


@dataclass(frozen=True)
class StoredMessage:
    """A platform message stored in a session: its text's digest, the thread (session) it was
    stored in, and whether it (or an edit of it) asked for an answer."""

    digest: str
    thread_id: str | None
    replied: bool


class ChannelStore:
    """The outbox and the pairing table of one home."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()
        self._records: list[tuple[str, str, str, str, str, str | None, int, str]] = []  # stored_messages to write
        self._records_written: asyncio.Future[None] | None = None  # the write the records above will be in

    @classmethod
    def for_home(cls, home: Path) -> ChannelStore:
        return cls(home / "channels.db")

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a postgres home may hold nothing else yet
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        os.close(fd)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=5000")
        db.executescript(_SCHEMA + _CONNECTOR_SCHEMA + pairing.SCHEMA)
        pairing.migrate(db)
        return db

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        async with self._lock:
            return await self._locked(work)

    async def _locked(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._db is None:
            self._db = await _to_thread_whole(self._open)
        return await _to_thread_whole(work, self._db)

    async def close(self) -> None:
        async with self._lock:
            if self._db is not None:
                db, self._db = self._db, None
                await asyncio.to_thread(db.close)

    # -- outbox ---------------------------------------------------------------------------------

    async def expect(self, inbound: Inbound, now: str) -> None:
        """A row for a message that asks for an answer (kept as it is if one exists)."""
        payload = json.dumps(inbound.as_json())

        def work(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT OR IGNORE INTO outbox (client_message_id, channel, account, inbound, state, created_at,"
                " updated_at) VALUES (?, ?, ?, ?, 'pending', ?, ?)",
                (inbound.client_message_id, inbound.channel, inbound.account, payload, now, now),
            )

        await self._run(work)

    async def answer(self, client_message_id: str, reply: str, reply_ref: str | None, now: str) -> bool:
        """Record the answer; False (and the row marked sent) when another row already carries the
        same answer (``reply_ref``, the answer's key, run and seq: one turn answered several messages)."""

        def work(db: sqlite3.Connection) -> bool:
            if reply_ref is not None:
                twin = db.execute(
                    "SELECT 1 FROM outbox WHERE reply_ref = ? AND client_message_id != ?",
                    (reply_ref, client_message_id),
                ).fetchone()
                if twin is not None:
                    db.execute(
                        "UPDATE outbox SET state = 'sent', reply = ?, reply_ref = ?,"
                        " last_error = 'answered with an earlier message', updated_at = ? WHERE client_message_id = ?",
                        (reply, reply_ref, now, client_message_id),
                    )
                    return False
            db.execute(
                "UPDATE outbox SET state = 'answered', reply = ?, reply_ref = ?, updated_at = ?"
                " WHERE client_message_id = ?",
                (reply, reply_ref, now, client_message_id),
            )
            return True

        return await self._run(work)

    async def part_sent(self, client_message_id: str, parts_sent: int, now: str) -> None:
        await self._update(client_message_id, "parts_sent = ?", (parts_sent,), now)

    async def sent(self, client_message_id: str, now: str) -> None:
        await self._update(client_message_id, "state = 'sent', last_error = NULL", (), now)

    async def failed(self, client_message_id: str, error: str, now: str) -> None:
        await self._update(client_message_id, "state = 'failed', last_error = ?", (error,), now)

    async def attempt_failed(self, client_message_id: str, error: str, now: str) -> None:
        await self._update(client_message_id, "attempts = attempts + 1, last_error = ?", (error,), now)

    async def _update(self, client_message_id: str, assignments: str, values: tuple[Any, ...], now: str) -> None:
        def work(db: sqlite3.Connection) -> None:
            db.execute(
                f"UPDATE outbox SET {assignments}, updated_at = ? WHERE client_message_id = ?",
                (*values, now, client_message_id),
            )

        await self._run(work)

    async def finished_since(self, since: str) -> list[str]:
        """The client_message_ids of rows answered, sent or failed since ``since``."""

        def work(db: sqlite3.Connection) -> list[str]:
            rows = db.execute(
                "SELECT client_message_id FROM outbox WHERE state != 'pending' AND updated_at >= ? ORDER BY updated_at",
                (since,),
            ).fetchall()
            return [str(r[0]) for r in rows]

        return await self._run(work)

    async def prune(self, before: str) -> None:
        """Forget sent and failed rows last touched before ``before``."""

        def work(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM outbox WHERE state IN ('sent', 'failed') AND updated_at < ?", (before,))

        await self._run(work)

    async def row(self, client_message_id: str) -> OutboxRow | None:
        def work(db: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return db.execute(
                f"SELECT {_ROW} FROM outbox WHERE client_message_id = ?",
                (client_message_id,),
            ).fetchall()

        rows = await self._run(work)
        return _row(rows[0]) if rows else None

    async def unsent(self) -> list[OutboxRow]:
        """Rows a restart must finish (pending or answered), oldest first."""

        def work(db: sqlite3.Connection) -> list[tuple[Any, ...]]:
            return db.execute(
                f"SELECT {_ROW} FROM outbox WHERE state IN ('pending', 'answered') ORDER BY created_at, rowid"
            ).fetchall()

        return [_row(r) for r in await self._run(work)]

    # -- stored messages ------------------------------------------------------------------------

    async def stored_message(self, channel: str, account: str, chat_id: str, message_id: str) -> StoredMessage | None:
        def work(db: sqlite3.Connection) -> tuple[Any, ...] | None:
            found: tuple[Any, ...] | None = db.execute(
                "SELECT digest, thread_id, replied FROM stored_messages"
                " WHERE channel = ? AND account = ? AND chat_id = ? AND message_id = ?",
                (channel, account, chat_id, message_id),
            ).fetchone()
            return found

        found = await self._run(work)
        return StoredMessage(str(found[0]), found[1], bool(found[2])) if found is not None else None

    async def record_message(
        self, channel: str, account: str, chat_id: str, message_id: str, stored: StoredMessage, now: str
    ) -> None:
        """Remember a stored message, or its edit: the new digest; the thread it was first stored in
        is kept, and ``replied`` once true stays true."""
        self._records.append((channel, account, chat_id, message_id, stored.digest, stored.thread_id,
                              int(stored.replied), now))  # fmt: skip
        if self._records_written is None:
            self._records_written = asyncio.ensure_future(self._write_records())
            self._records_written.add_done_callback(lambda done: done.cancelled() or done.exception())  # seen
        await asyncio.shield(self._records_written)

    async def _write_records(self) -> None:
        """The records made until the store's lock is free, in one transaction (records made
        meanwhile go in the next)."""
        async with self._lock:
            rows, self._records, self._records_written = self._records, [], None

            def work(db: sqlite3.Connection) -> None:
                db.execute("BEGIN IMMEDIATE")
                try:
                    db.executemany(
                        "INSERT INTO stored_messages (channel, account, chat_id, message_id, digest, thread_id,"
                        " replied, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (channel, account,"
                        " chat_id, message_id) DO UPDATE SET digest = excluded.digest,"
                        " replied = MAX(replied, excluded.replied), updated_at = excluded.updated_at",
                        rows,
                    )
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")

            await self._locked(work)

    async def forget_message(self, channel: str, account: str, chat_id: str, message_id: str) -> None:
        def work(db: sqlite3.Connection) -> None:
            db.execute(
                "DELETE FROM stored_messages WHERE channel = ? AND account = ? AND chat_id = ? AND message_id = ?",
                (channel, account, chat_id, message_id),
            )

        await self._run(work)

    async def recent_chats(
        self, channel: str, account: str, since: str, limit: int
    ) -> list[tuple[str, str | None, str]]:
        """The chats (and threads) of an account where a message was stored since ``since``, the
        latest first, with the highest message id stored in each: ``(chat_id, thread_id,
        message_id)``. Message ids compare as numbers (Discord's snowflakes)."""

        def work(db: sqlite3.Connection) -> list[tuple[str, str | None, str]]:
            rows = db.execute(
                "SELECT chat_id, thread_id, MAX(CAST(message_id AS INTEGER)), MAX(updated_at) AS last"
                " FROM stored_messages WHERE channel = ? AND account = ? AND updated_at >= ?"
                " GROUP BY chat_id, thread_id ORDER BY last DESC LIMIT ?",
                (channel, account, since, limit),
            ).fetchall()
            return [(str(r[0]), r[1], str(r[2])) for r in rows]

        return await self._run(work)

    async def forget_messages_before(self, before: str) -> None:
        def work(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM stored_messages WHERE updated_at < ?", (before,))

        await self._run(work)

    # -- pairing (channels/pairing.py) ---------------------------------------------------------

    async def pairing_code(
        self, channel: str, account: str, sender_id: str, sender_name: str | None, chat_id: str, *, now: datetime,
        lifetime: timedelta,
    ) -> tuple[Pairing, bool]:  # fmt: skip
        """The sender's pending code, and whether it is new (to be sent): see ``pairing.give``."""
        expires_at = iso(now + lifetime)

        def work(db: sqlite3.Connection) -> tuple[Pairing, bool]:
            return pairing.give(db, channel, account, sender_id, sender_name, chat_id, now=now, expires_at=expires_at)

        return await self._run(work)

    async def approve(self, code: str, now: datetime) -> Pairing:
        """Approve a pending code (case-insensitive); raises PairingCodeNotFound, PairingCodeExpired
        or BadRequest (not a code)."""
        pairing.normalized(code)
        return await self._run(lambda db: pairing.approve(db, code, now))

    async def revoke(self, code: str) -> Pairing:
        """Forget a sender's pairing, approved or pending; raises PairingCodeNotFound or BadRequest."""
        pairing.normalized(code)
        return await self._run(lambda db: pairing.revoke(db, code))

    async def approved(self, channel: str, account: str) -> set[str]:
        return await self._run(lambda db: pairing.approved(db, channel, account))

    async def pairings(self) -> list[Pairing]:
        return await self._run(pairing.listed)

    async def unwelcomed(self, channel: str, account: str) -> list[Pairing]:
        return await self._run(lambda db: pairing.unwelcomed(db, channel, account))

    async def welcomed(self, code: str, now: datetime) -> None:
        await self._run(lambda db: pairing.welcomed(db, code, now))

    # -- what connectors keep ------------------------------------------------------------------

    async def unreadable(self, channel: str, account: str, update_id: str, reason: str, body: str, now: str) -> bool:
        """Keep an update the connector could not read; False when it was kept before (a redelivery)."""

        def work(db: sqlite3.Connection) -> bool:
            added = db.execute(
                "INSERT OR IGNORE INTO unreadable_updates (channel, account, update_id, reason, body, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (channel, account, update_id, reason, body, now),
            ).rowcount
            if added:
                db.execute(
                    "DELETE FROM unreadable_updates WHERE channel = ? AND account = ? AND rowid NOT IN"
                    " (SELECT rowid FROM unreadable_updates WHERE channel = ? AND account = ? ORDER BY rowid DESC"
                    " LIMIT ?)",
                    (channel, account, channel, account, UNREADABLE_KEPT),
                )
            return added == 1

        return await self._run(work)

    async def first_bot(self, channel: str, account: str, bot_id: str, now: str) -> str:
        """The id of the first bot the account ran with (``bot_id`` when this is its first run)."""

        def work(db: sqlite3.Connection) -> str:
            db.execute(
                "INSERT OR IGNORE INTO first_bots (channel, account, bot_id, created_at) VALUES (?, ?, ?, ?)",
                (channel, account, bot_id, now),
            )
            found = db.execute(
                "SELECT bot_id FROM first_bots WHERE channel = ? AND account = ?", (channel, account)
            ).fetchone()
            return str(found[0])

        return await self._run(work)

    async def state(self, channel: str, account: str, name: str) -> str | None:
        """A value a connector keeps about its platform (Matrix's sync token, a room's kind), or None."""

        def work(db: sqlite3.Connection) -> str | None:
            found = db.execute(
                "SELECT value FROM connector_state WHERE channel = ? AND account = ? AND name = ?",
                (channel, account, name),
            ).fetchone()
            return str(found[0]) if found is not None else None

        return await self._run(work)

    async def keep_state(self, channel: str, account: str, name: str, value: str, now: str) -> None:
        """Keep (or replace) a connector's value; durable when this returns (synchronous=FULL)."""

        def work(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO connector_state (channel, account, name, value, updated_at) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (channel, account, name) DO UPDATE SET value = excluded.value,"
                " updated_at = excluded.updated_at",
                (channel, account, name, value, now),
            )

        await self._run(work)


def _row(raw: tuple[Any, ...]) -> OutboxRow:
    inbound, state, reply, parts_sent, attempts, last_error = raw
    return OutboxRow(Inbound.from_json(json.loads(inbound)), state, reply, parts_sent, attempts, last_error)


async def _to_thread_whole(fn: Callable[..., T], *args: Any) -> T:
    """``fn`` on a thread; a cancelled caller still waits for the thread to finish before it goes
    on (and releases the store's lock): the thread holds the connection, and a ``close`` made
    meanwhile would free it under a running statement (a segfault at shutdown, with a background
    turn cancelled while it recorded its answer)."""
    running = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await asyncio.wait([running])
        raise
