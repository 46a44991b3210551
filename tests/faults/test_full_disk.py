"""Issue 10 item 1: a full disk never loses the next acknowledged message.

The home is a real 5 MiB tmpfs filled with a file. A failed append is cut back (no partial line
for the next one to be glued onto), consumes no seq, is not counted, and answers 507
``insufficient_storage``; ``/readyz`` is unready while the store cannot write and ready again by
itself once space frees; writing then resumes with the next seq.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from urllib.parse import quote

import aiohttp
import pytest

from config.errors import InsufficientStorage
from home import layout
from sessions.files.jsonl import read_records
from sessions.records import NewMessage
from tests.faults.conftest import fill
from tests.gateway.daemons import child_env, daemon
from tests.sessions.helpers import open_store, start

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

BIG = "x" * 40_000  # needs fresh pages of the tmpfs: refused once the disk is full


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


async def test_a_failed_append_is_cut_back_and_consumes_no_seq(tmpfs: Path, clock: object) -> None:
    home = tmpfs / "home"
    store = await open_store(home, clock)  # type: ignore[arg-type]
    try:
        run = await start(store)
        for i in range(5):
            await store.append(run, NewMessage(role="user", content=f"m{i}"))
        messages, current = run.dir / layout.MESSAGES, run.dir / layout.CURRENT
        before = (messages.read_bytes(), current.read_bytes())
        filler = await asyncio.to_thread(fill, tmpfs)

        with pytest.raises(InsufficientStorage) as caught:
            await store.append(run, NewMessage(role="user", content=BIG))
        assert caught.value.status == 507 and caught.value.code == "insufficient_storage"
        assert "not stored" in caught.value.message
        # several appends queued together: the first fails, so none after it may land (no gap)
        results = await asyncio.gather(
            store.append(run, NewMessage(role="user", content=BIG)),
            store.append(run, NewMessage(role="user", content="small one")),
            store.append(run, NewMessage(role="user", content="another")),
            return_exceptions=True,
        )
        assert all(isinstance(r, InsufficientStorage) for r in results), results
        assert (messages.read_bytes(), current.read_bytes()) == before  # nothing half written
        entry = store.entry(run.key)
        assert entry is not None and run.next_seq == 6 and entry.message_count == 5
        assert run.messages_bytes == len(before[0]) and run.context_bytes == len(before[1])
        assert run.context_lines == 5 and run.last_context_seq == 5
        assert await store.writable() is not None

        filler.unlink()
        assert await store.writable() is None
        record = await store.append(run, NewMessage(role="user", content="after the disk was freed"))
        assert record["seq"] == 6
        assert [r["seq"] for r in read_records(messages)] == [1, 2, 3, 4, 5, 6]
        assert [r["seq"] for r in read_records(current)] == [1, 2, 3, 4, 5, 6]
        assert all(json.loads(line) for line in _lines(messages))  # every line parses
        assert entry.message_count == 6 and run.messages_bytes == messages.stat().st_size
    finally:
        await store.close()

    reopened = await open_store(home, clock)  # type: ignore[arg-type]
    try:
        assert not list(home.rglob("*.torn"))
        [again] = list(reopened.active_runs())
        assert again.next_seq == 7 and again.context_lines == 6
    finally:
        await reopened.close()


async def test_a_failed_first_line_of_current_is_undone_with_its_message(tmpfs: Path, clock: object) -> None:
    """A command line is not in current.jsonl; a failed one leaves last_context_seq alone."""
    home = tmpfs / "home"
    store = await open_store(home, clock)  # type: ignore[arg-type]
    try:
        run = await start(store)
        await store.append(run, NewMessage(role="user", content="in context"))
        await store.append(run, NewMessage(role="user", content="/status", command=True))
        filler = await asyncio.to_thread(fill, tmpfs)
        with pytest.raises(InsufficientStorage):
            await store.append(run, NewMessage(role="user", content=BIG))
        assert run.next_seq == 3 and run.last_context_seq == 1
        filler.unlink()
        record = await store.append(run, NewMessage(role="user", content="next"))
        assert record["seq"] == 3 and run.last_context_seq == 3
        assert [r["seq"] for r in read_records(run.dir / layout.CURRENT)] == [1, 3]
    finally:
        await store.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_real_daemon_on_a_full_disk_answers_507_and_resumes(tmpfs: Path) -> None:
    home = tmpfs / "home"
    home.mkdir()
    key = quote("agent:main:main", safe="")
    env = child_env(NEOTASK_STORAGE__MIN_FREE="0")  # no disk budget: the store's own full-disk path
    async with daemon(home, env=env) as d, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        url = f"{d.url}/v1/sessions/{key}/messages"
        for i in range(3):
            async with http.post(url, json={"content": f"before {i}"}) as resp:
                assert resp.status == 200, await resp.text()
                run_id = (await resp.json())["run_id"]
        filler = await asyncio.to_thread(fill, tmpfs)

        async with http.get(f"{d.url}/readyz") as resp:
            body = await resp.json()
            assert resp.status == 503 and body["checks"]["store_writable"] is False, body
            assert "store_writable" in body["problems"]
        async with http.get(f"{d.url}/healthz") as resp:
            assert resp.status == 200  # liveness stays
        for _ in range(2):
            async with http.post(url, json={"content": BIG}) as resp:
                body = await resp.json()
                assert resp.status == 507, body
                assert body["error"]["code"] == "insufficient_storage" and body["error"]["request_id"]

        await asyncio.to_thread(filler.unlink)
        async with http.get(f"{d.url}/readyz") as resp:
            assert resp.status == 200, await resp.text()
        async with http.post(url, json={"content": "after the disk was freed"}) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["message_seq"] == 4
        async with http.get(f"{d.url}/v1/runs/{run_id}/messages") as resp:
            stored = (await resp.json())["messages"]
        assert [m["seq"] for m in stored] == [1, 2, 3, 4]
        assert stored[-1]["content"] == "after the disk was freed"
        async with http.get(f"{d.url}/v1/sessions/{key}") as resp:
            assert (await resp.json())["message_count"] == 4
        assert await d.stop() == 0
    folder = home / "contexts" / "running" / run_id
    assert [r["seq"] for r in read_records(folder / "messages.jsonl")] == [1, 2, 3, 4]
    assert not list(home.rglob("*.torn"))
