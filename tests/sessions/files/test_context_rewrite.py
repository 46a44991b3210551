"""The run-folder backend's context rewrite (``sessions.files.context_rewrite``) on the writer thread."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from sessions.compactor import Compactor, extractive
from sessions.files import context_rewrite
from tests.conftest import FakeClock
from tests.sessions.conformance.support import counters_agree, user
from tests.sessions.helpers import open_store, settings_with, start


async def test_a_compaction_cancelled_during_its_commit_is_still_counted(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller cancelled (``/stop``, a shutdown) while the writer thread commits its compaction:
    the commit goes on, and the run's counters follow it, so the next compaction takes the next
    summary id instead of reusing this one's (and its archive's name)."""
    store = await open_store(tmp_path, clock)
    run = await start(store)
    for i in range(12):
        await store.append(run, user(f"message {i} " + "word " * 40))
    held, release = threading.Event(), threading.Event()
    real_write = context_rewrite.write_records_atomic

    def slow_write(*args: object, **kwargs: object) -> None:
        held.set()
        assert release.wait(30)
        real_write(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(context_rewrite, "write_records_atomic", slow_write)
    compactor = Compactor(store, extractive, settings_with().compaction)
    compaction = compactor.compact(run, trigger="manual", threshold=2000, keep_recent=2, min_to_compress=1)
    task = asyncio.create_task(compaction)
    while not held.is_set():
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    monkeypatch.setattr(context_rewrite, "write_records_atomic", real_write)
    await store.append(run, user("after the cancelled compaction"))  # behind the commit on the writer
    await asyncio.sleep(0.05)  # the late count's ledger update
    assert run.compaction_count == 1 and run.next_summary_id == 2
    context = await store.read_context(run)
    assert context[0].get("kind") == "summary" and run.context_lines == len(context)
    assert run.context_tokens == sum(int(line.get("tokens", 0)) for line in context)
    assert (await store.get_run(run.run_id) or {}).get("compaction_count") == 1
    counters_agree(store)
    for i in range(12):
        await store.append(run, user(f"more {i} " + "word " * 40))
    second = await compactor.compact(run, trigger="manual", threshold=2000, keep_recent=2, min_to_compress=1)
    assert second is not None and (second.summary_id, second.compaction) == (2, 2)
    await store.close()
