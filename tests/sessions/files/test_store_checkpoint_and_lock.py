"""The session store on real files: the sessions.json checkpoint of a new run, and the per-key lock
across a delete."""

from __future__ import annotations

import shutil
from pathlib import Path

from sessions.records import NewMessage
from tests.conftest import FakeClock
from tests.sessions.helpers import open_store, start


async def test_a_new_runs_checkpoint_does_not_carry_the_previous_runs_counters(
    tmp_path: Path, clock: FakeClock
) -> None:
    # Only lifecycle changes write sessions.json at once; the appends after them reach it later.
    store = await open_store(tmp_path, clock, {"storage": {"sessions_flush_ms": 60000}})
    first = await start(store)
    await store.append(first, NewMessage(role="user", content="hello"))
    await store.complete(first.key)
    second = await start(store)  # sessions.json is written now, with the new run id
    saved = tmp_path / "saved-sessions.json"
    shutil.copy(tmp_path / "contexts/sessions.json", saved)
    await store.append(second, NewMessage(role="user", content="hello"))  # the same bytes as the first
    await store.close()
    shutil.copy(saved, tmp_path / "contexts/sessions.json")  # a crash before the coalesced rewrite
    again = await open_store(tmp_path, clock)
    back = again.active_run(second.key)
    assert back is not None and back.run_id == second.run_id
    assert back.next_seq == 2
    assert (await again.append(back, NewMessage(role="user", content="next")))["seq"] == 2
    await again.close()


async def test_the_key_lock_stays_the_same_across_a_delete(tmp_path: Path, clock: FakeClock) -> None:
    """Waiters hold the lock they queued on; a new lock for the key would let a newcomer in
    alongside them."""
    store = await open_store(tmp_path, clock)
    run = await start(store)
    lock = store.lock_for(run.key)
    async with lock:
        await store.delete(run.key)
        assert store.lock_for(run.key) is lock
    await store.close()
