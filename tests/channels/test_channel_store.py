"""``<home>/channels.db``: the outbox's states and the pairing codes, on a real SQLite file."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from channels.pairing import CODE_ALPHABET, CODE_LENGTH
from channels.protocol import Inbound, Target
from channels.store import ChannelStore, StoredMessage
from config.errors import PairingCodeNotFound

NOW = "2026-12-01T10:00:00+00:00"


def inbound(update: str) -> Inbound:
    return Inbound("telegram", "main", "main", "direct", "555", "555", "hi", update, Target("555"))


async def test_rows_go_pending_answered_sent_and_survive_a_reopen(tmp_path: Path) -> None:
    store = ChannelStore.for_home(tmp_path)
    await store.expect(inbound("1"), NOW)
    await store.expect(inbound("1"), NOW)  # kept as it is
    await store.expect(inbound("2"), NOW)
    assert await store.answer("telegram:main:1", "the answer", "agent:main:main#2", NOW) is True
    await store.part_sent("telegram:main:1", 1, NOW)
    await store.close()
    assert (tmp_path / "channels.db").stat().st_mode & 0o777 == 0o600
    store = ChannelStore.for_home(tmp_path)
    rows = {r.inbound.update_id: r for r in await store.unsent()}
    assert rows["1"].state == "answered" and rows["1"].reply == "the answer" and rows["1"].parts_sent == 1
    assert rows["1"].inbound == inbound("1")
    assert rows["2"].state == "pending"
    await store.sent("telegram:main:1", NOW)
    assert [r.inbound.update_id for r in await store.unsent()] == ["2"]
    assert await store.finished_since("2026-12-01T00:00:00+00:00") == ["telegram:main:1"]
    await store.prune("2026-12-02T00:00:00+00:00")
    assert await store.row("telegram:main:1") is None and await store.row("telegram:main:2") is not None
    await store.close()


async def test_one_answer_to_several_messages_is_sent_once(tmp_path: Path) -> None:
    store = ChannelStore.for_home(tmp_path)
    for update in ("1", "2"):
        await store.expect(inbound(update), NOW)
    assert await store.answer("telegram:main:1", "both", "agent:main:main#5", NOW) is True
    assert await store.answer("telegram:main:2", "both", "agent:main:main#5", NOW) is False
    second = await store.row("telegram:main:2")
    assert second is not None and second.state == "sent"
    await store.close()


async def test_a_pairing_code_is_stable_per_sender_and_approval_is_case_insensitive(tmp_path: Path) -> None:
    store = ChannelStore.for_home(tmp_path)
    now, hour = datetime(2026, 12, 1, 10, tzinfo=UTC), timedelta(hours=1)
    pairing, fresh = await store.pairing_code("telegram", "main", "902", "Cy", "902", now=now, lifetime=hour)
    code = pairing.code
    assert fresh and len(code) == CODE_LENGTH and set(code) <= set(CODE_ALPHABET)
    assert await store.pairing_code("telegram", "main", "902", "Cy", "902", now=now, lifetime=hour) == (pairing, False)
    other, _ = await store.pairing_code("telegram", "other", "902", "Cy", "902", now=now, lifetime=hour)
    assert other.code != code
    assert await store.approved("telegram", "main") == set()
    with pytest.raises(PairingCodeNotFound):
        await store.approve("WXYZ2345", now)
    approved = await store.approve(f" {code.lower()} ", now)
    assert (approved.account, approved.sender_id, approved.sender_name) == ("main", "902", "Cy")
    assert await store.approved("telegram", "main") == {"902"}
    assert await store.approved("telegram", "other") == set()
    await store.close()


async def test_a_cancelled_write_keeps_the_connection_until_its_thread_is_done(tmp_path: Path) -> None:
    """A background turn cancelled at shutdown while it recorded its answer released the store's
    lock at once, and ``close`` freed the connection under the running statement: the process
    died of a segfault (seen in 4 of 6 runs of an in-process channel test)."""
    import asyncio
    import sqlite3
    import threading
    import time

    store = ChannelStore(tmp_path / "channels.db")
    started, finished = threading.Event(), threading.Event()

    def slow(db: sqlite3.Connection) -> None:
        started.set()
        time.sleep(0.3)  # the statement still runs when the caller is cancelled
        db.execute("SELECT count(*) FROM outbox").fetchall()
        finished.set()

    writing = asyncio.create_task(store._run(slow))
    while not started.is_set():
        await asyncio.sleep(0.01)
    writing.cancel()
    await store.close()  # waits for the lock, which the cancelled caller holds until its thread ends
    assert finished.is_set() and writing.cancelled()


async def test_records_made_at_once_are_written_in_one_transaction(tmp_path: Path) -> None:
    """A connector that took a batch of messages records them with one commit (one fsync), not
    one each; each record is as if written alone, in order (an edit after its message)."""
    store = ChannelStore.for_home(tmp_path)
    await store.record_message("matrix", "main", "!r", "$0", StoredMessage("d0", None, False), NOW)
    commits: list[str] = []
    assert store._db is not None
    store._db.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
    records = [("$1", StoredMessage("first", "$t", True)), ("$1", StoredMessage("edited", None, False)),
               *((f"${i}", StoredMessage(f"d{i}", None, i % 2 == 0)) for i in range(2, 40))]  # fmt: skip
    await asyncio.gather(*(store.record_message("matrix", "main", "!r", m, s, NOW) for m, s in records))
    assert commits == ["COMMIT"]
    assert await store.stored_message("matrix", "main", "!r", "$1") == StoredMessage("edited", "$t", True)
    for i in range(2, 40):
        assert await store.stored_message("matrix", "main", "!r", f"${i}") == StoredMessage(f"d{i}", None, i % 2 == 0)
    await store.record_message("matrix", "main", "!r", "$40", StoredMessage("d40", None, False), NOW)  # a next batch
    assert commits == ["COMMIT", "COMMIT"]
    await store.close()
