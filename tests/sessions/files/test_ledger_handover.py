"""The ledger thread gets the calls of one event-loop pass together (sessions/files/ledger.py): each still
runs in its own transaction, in call order, and answers its own caller."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sessions.files.ledger import Ledger, _Job


@pytest.fixture
async def ledger(tmp_path: Path) -> Ledger:
    ledger = Ledger(tmp_path / "tasks.db")
    await ledger.open()
    await ledger.execute(lambda c: c.execute("CREATE TABLE t (n INTEGER)"))
    return ledger


async def test_calls_of_one_pass_run_in_order_each_in_its_own_transaction(ledger: Ledger) -> None:
    threads: list[int] = []

    def insert(n: int) -> Callable[[sqlite3.Connection], int]:
        def fn(c: sqlite3.Connection) -> int:
            threads.append(threading.get_ident())
            c.execute("INSERT INTO t (n) VALUES (?)", (n,))
            if n == 2:
                raise ValueError("two")
            return n

        return fn

    submit, handed = ledger._executor.submit, []

    def counted(*args: Any, **kwargs: Any) -> Any:
        handed.append(args)
        return submit(*args, **kwargs)

    ledger._executor.submit = counted  # type: ignore[method-assign]  # the real executor, counted
    results: list[object] = list(
        await asyncio.gather(*(ledger.execute(insert(n)) for n in range(5)), return_exceptions=True)
    )
    assert len(handed) == 1  # five calls of one pass: one hand-over to the ledger thread
    assert results[:2] == [0, 1] and isinstance(results[2], ValueError) and results[3:] == [3, 4]
    rows = await ledger.execute(lambda c: [r[0] for r in c.execute("SELECT n FROM t ORDER BY rowid")])
    assert rows == [0, 1, 3, 4]  # the failed call rolled back alone
    assert len(set(threads)) == 1 and threads[0] != threading.get_ident()
    await ledger.close()


async def test_a_call_cancelled_before_its_turn_is_not_run_and_close_runs_what_is_queued(
    ledger: Ledger, tmp_path: Path
) -> None:
    cancelled = asyncio.ensure_future(ledger.execute(lambda c: c.execute("INSERT INTO t (n) VALUES (1)")))
    await asyncio.sleep(0)  # queued in this pass
    cancelled.cancel()
    kept = asyncio.ensure_future(ledger.execute(lambda c: c.execute("INSERT INTO t (n) VALUES (2)")))
    await asyncio.sleep(0)
    await ledger.close()  # hands over what is queued before closing
    await kept
    assert cancelled.cancelled()
    conn = sqlite3.connect(tmp_path / "tasks.db")
    assert [r[0] for r in conn.execute("SELECT n FROM t")] == [2]
    conn.close()


def test_calls_left_by_a_loop_that_ended_do_not_block_the_next_loop(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "tasks.db")
    ledger.open_sync()
    ended = asyncio.new_event_loop()  # a loop that ended with a call queued but not handed over
    ledger._outbox_loop = ended
    ledger._outbox.append(_Job(lambda c: c.execute("CREATE TABLE a (n INTEGER)"), ended.create_future()))
    ended.close()

    async def later() -> int:
        return await ledger.execute(lambda c: int(c.execute("SELECT count(*) FROM a").fetchone()[0]))

    assert asyncio.run(asyncio.wait_for(later(), 5)) == 0  # the left call ran first, then this one
    ledger.close_sync()
