"""``sessions.history_index.Backlog``: a post waits while the history index is ``limit`` messages
behind, wakes when its writer brings the backlog below the limit, and goes on after ``wait_s``
when the writer has stopped (an index that stopped writing never stops ingest)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from sessions.files.history import HistoryIndex
from sessions.history_index import Backlog


async def test_below_the_limit_a_post_does_not_wait() -> None:
    backlog = Backlog(3)
    backlog.added(2)
    assert await backlog.room() is False
    assert backlog.waits == 0


async def test_waiting_posts_wake_when_the_writer_brings_the_backlog_below_the_limit() -> None:
    backlog = Backlog(3, wait_s=30)
    backlog.added(5)
    waiting = [asyncio.create_task(backlog.room()) for _ in range(4)]
    await asyncio.sleep(0.01)
    assert not any(task.done() for task in waiting)
    backlog.written(2)  # 3 behind: still at the limit
    await asyncio.sleep(0.01)
    assert not any(task.done() for task in waiting)
    backlog.written(1)
    assert await asyncio.gather(*waiting) == [True] * 4
    assert (backlog.rows, backlog.waits, backlog.late) == (2, 4, 0)


async def test_a_writer_that_stopped_holds_a_post_for_wait_s_at_most() -> None:
    backlog = Backlog(1, wait_s=0.05)
    backlog.added(10)
    began = time.perf_counter()
    assert await backlog.room() is True
    assert 0.04 <= time.perf_counter() - began < 5
    assert backlog.late == 1
    began = time.perf_counter()
    assert await backlog.room() is False  # nothing written since: the next posts do not wait
    assert time.perf_counter() - began < 0.04
    backlog.written(1)  # it writes again, still behind: posts wait again
    assert await backlog.room() is True and backlog.late == 2


async def test_limit_zero_never_waits() -> None:
    backlog = Backlog(0)
    backlog.added(1_000_000)
    assert await backlog.room() is False


async def test_posts_do_not_wait_while_the_files_index_rebuilds(tmp_path: Path) -> None:
    index = HistoryIndex(tmp_path / "history.db", max_backlog=5)
    await index.open()
    release = threading.Event()
    try:
        rebuilding = index.call(lambda conn: release.wait(30))  # the index thread busy, as in a rebuild
        for seq in range(1, 21):
            index.feed("run-1", "agent:main:main", "main", {"seq": seq, "role": "user", "content": f"lamp {seq}"})
        await asyncio.sleep(0.1)
        assert index.backlog.rows == 20 and index.backlog.paused
        assert await asyncio.wait_for(index.backlog.room(), 1) is False  # behind, but not for ingest's sake
        release.set()
        await rebuilding
        await index.flush()
        assert index.backlog.rows == 0 and not index.backlog.paused
        index.backlog.added(5)  # behind for ingest's sake again: a post waits (for 0.05 s, nothing writing)
        index.backlog.wait_s = 0.05
        assert await index.backlog.room() is True and index.backlog.late == 1
    finally:
        release.set()
        await index.close()
