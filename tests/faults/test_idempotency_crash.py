"""Issue 10 item 3: ``client_message_id`` stops duplicates across a crash and a ledger stall.

The message is durable before its idempotency record commits; the record is then only a cache of
what messages.jsonl says (the line carries its ``client_message_id``, the reply its ``reply_to``).
Reproduced for real: tasks.db held by another connection (``BEGIN EXCLUSIVE``) for longer than the
ledger's 5 s busy timeout while a client posts and retries; a real daemon SIGKILLed after the
message is durable and before its record could commit; real SIGKILLs under retrying clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from gateway import keys as K
from sessions.records import NewMessage
from tests.conftest import FakeClock
from tests.faults.tally import kills, under_load
from tests.gateway.daemons import daemon
from tests.gateway.helpers import make_app, tree_digest
from tests.sessions.helpers import open_store, start

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

KEY = "agent:main:main"
PATH = f"/v1/sessions/{quote(KEY, safe='')}/messages"
COMMANDS = f"/v1/sessions/{quote(KEY, safe='')}/commands"


class LedgerLock:
    """tasks.db held by another connection (``BEGIN EXCLUSIVE``) until ``release``."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.locked = threading.Event()
        self.done = threading.Event()
        self.task: asyncio.Future[None] | None = None

    def _hold(self, limit_s: float) -> None:
        conn = sqlite3.connect(self.db, isolation_level=None, timeout=30)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            self.locked.set()
            self.done.wait(limit_s)
            conn.execute("COMMIT")
        finally:
            conn.close()

    async def __aenter__(self) -> LedgerLock:
        self.task = asyncio.ensure_future(asyncio.to_thread(self._hold, 60.0))
        while not self.locked.is_set():
            assert not self.task.done(), self.task.exception()
            await asyncio.sleep(0.01)
        return self

    async def release(self) -> None:
        self.done.set()
        if self.task is not None:
            await self.task

    async def __aexit__(self, *exc: object) -> None:
        await self.release()


def stored_lines(home: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted((home / "contexts").glob("*/*/messages.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def with_id(home: Path, cmid: str) -> list[dict[str, Any]]:
    return [r for r in stored_lines(home) if r.get("client_message_id") == cmid]


def answered(home: Path, cmid: str) -> bool:
    """The delivery's line is in messages.jsonl and, for a chat command, so is its answer (both go
    in one group commit: the kill is meant to land after them and before the record commits)."""
    lines = stored_lines(home)
    asked = [r for r in lines if r.get("client_message_id") == cmid]
    if not asked or not asked[0].get("command"):
        return bool(asked)
    return any(r.get("reply_to") == asked[0]["seq"] for r in lines)


def idempotency_rows(home: Path, cmid: str) -> int:
    conn = sqlite3.connect(home / "contexts" / "tasks.db")
    try:
        return int(conn.execute("SELECT count(*) FROM idempotency WHERE client_message_id = ?", (cmid,)).fetchone()[0])
    finally:
        conn.close()


async def test_an_idempotency_key_header_is_capped_like_the_body_field(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    before = tree_digest(tmp_path)
    for path, body in ((PATH, {"content": "hi"}), (COMMANDS, {"command": "/help"})):
        resp = await client.post(path, json=body, headers={"Idempotency-Key": "k" * 8000})
        error = (await resp.json())["error"]
        assert resp.status == 400 and error["code"] == "invalid_field" and error["field"] == "Idempotency-Key"
    assert tree_digest(tmp_path) == before
    ok = await client.post(PATH, json={"content": "hi"}, headers={"Idempotency-Key": "k" * 200})
    assert ok.status == 200


async def test_a_command_and_its_answer_reach_the_writer_together(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One hand-over, so one group commit: a crash cannot come between them but for the two writes."""
    client = await aiohttp_client(make_app(tmp_path, clock))
    assert (await client.post(PATH, json={"content": "hello"})).status == 200
    writer = client.app[K.STORE].writer
    handed: list[list[Any]] = []
    hand_over = writer._hand_over

    def spy() -> None:
        handed.append(list(writer._outbox))
        hand_over()

    monkeypatch.setattr(writer, "_hand_over", spy)
    body = await (await client.post(PATH, json={"content": "/status", "client_message_id": "s-1"})).json()
    assert body["reply"]["content"].startswith("Session:")
    lines = [[json.loads(op.data) for op in ops if getattr(op, "data", b"").startswith(b"{")] for ops in handed]
    seqs = [body["message_seq"], body["reply"]["seq"]]
    together = [batch for batch in lines if [r.get("seq") for r in batch] == seqs]
    assert len(together) == 1, lines
    assert together[0][0]["client_message_id"] == "s-1" and together[0][1]["reply_to"] == body["message_seq"]


async def test_a_command_with_a_client_message_id_runs_once(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    await client.post(PATH, json={"content": "hello"})
    first = await (await client.post(PATH, json={"content": "/new", "client_message_id": "c-new"})).json()
    again = await (await client.post(PATH, json={"content": "/new", "client_message_id": "c-new"})).json()
    assert again == first
    status = await (await client.post(COMMANDS, json={"command": "/reset"}, headers={"Idempotency-Key": "c-r"})).json()
    repeat = await (await client.post(COMMANDS, json={"command": "/reset"}, headers={"Idempotency-Key": "c-r"})).json()
    assert repeat == status
    runs = await (await client.get("/v1/runs")).json()
    assert [r["status"] for r in runs["runs"]] == ["completed"]  # /new ended one run, nothing ended twice


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_locked_tasks_db_neither_fails_a_stored_message_nor_stores_its_retry_again(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    client = await aiohttp_client(make_app(tmp_path, clock))
    assert (await client.post(PATH, json={"content": "first"})).status == 200
    answers = []
    async with LedgerLock(tmp_path / "contexts" / "tasks.db"):
        started = time.monotonic()
        for content in ("during the stall", "/status"):
            cmid = f"stall-{content}"
            resp = await client.post(PATH, json={"content": content, "client_message_id": cmid})
            body = await resp.json()
            assert resp.status == 200, body  # stored: never an error that invites a resend
            answers.append(body)
            retry = await client.post(PATH, json={"content": content, "client_message_id": cmid})
            assert retry.status == 200
            assert (await retry.json())["message_seq"] == body["message_seq"]
        assert time.monotonic() - started > 5  # the lock outlived the ledger's busy timeout
    for content, body in zip(("during the stall", "/status"), answers, strict=True):
        cmid = f"stall-{content}"
        after = await (await client.post(PATH, json={"content": content, "client_message_id": cmid})).json()
        assert after["message_seq"] == body["message_seq"] and after["reply"] == body["reply"]
        assert len(with_id(tmp_path, cmid)) == 1
    answer_lines = [r for r in stored_lines(tmp_path) if r.get("reply_to") == answers[1]["message_seq"]]
    assert len(answer_lines) == 1  # the command ran once


async def _post_when(http: aiohttp.ClientSession, base: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(f"{base}{PATH}", json=body) as resp:
        data: dict[str, Any] = await resp.json()
        assert resp.status == 200, data
        return data


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_sigkill_after_the_message_is_durable_and_before_its_record_commits(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        async with daemon(home) as first:
            await _post_when(http, first.url, {"content": "opens the run"})
            async with LedgerLock(home / "contexts" / "tasks.db"):
                for cmid, content in (("kill-1", "a message"), ("kill-2", "/status")):
                    pending = asyncio.ensure_future(
                        http.post(f"{first.url}{PATH}", json={"content": content, "client_message_id": cmid})
                    )
                    for _ in range(500):  # until the line is durable (the record cannot commit: locked)
                        if answered(home, cmid) or pending.done():
                            break
                        await asyncio.sleep(0.01)
                    assert answered(home, cmid), "the message (and a command's answer) was not stored"
                    if cmid == "kill-2":
                        first.send(signal.SIGKILL)
                        with contextlib.suppress(aiohttp.ClientError):
                            await pending
                    else:  # let the first one answer (200 after the busy timeout), then kill on the second
                        assert (await pending).status == 200
            await first.wait()
        assert idempotency_rows(home, "kill-1") == 0 and idempotency_rows(home, "kill-2") == 0
        stored = {cmid: with_id(home, cmid)[0]["seq"] for cmid in ("kill-1", "kill-2")}
        async with daemon(home) as second:
            for cmid, content in (("kill-1", "a message"), ("kill-2", "/status")):
                body = await _post_when(http, second.url, {"content": content, "client_message_id": cmid})
                assert body["message_seq"] == stored[cmid]
                assert len(with_id(home, cmid)) == 1
            assert body["reply"] is not None and body["reply"]["content"].startswith("Session:")
            assert await second.stop() == 0
        # a store-only answer is recorded nowhere but in the message itself (its run's end writes
        # the row): the repeat was answered from the transcript, as it will be again
        assert idempotency_rows(home, "kill-1") == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.allow_blocking  # 8 clients in this process: on a loaded machine a step of theirs can exceed 1 s
async def test_sigkills_under_retrying_clients_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    result = await under_load("kill -9 x3", home, kills(3, 1.0), workers=8)
    print(result.row())
    assert result.acknowledged >= 20  # restarts are slow on a loaded machine; the count is what matters
    assert (result.lost, result.duplicated, result.clean) == (0, 0, True)


async def test_a_run_that_ends_keeps_the_records_its_transcript_holds(
    aiohttp_client: Any, tmp_path: Path, clock: FakeClock
) -> None:
    """A message stored with its client_message_id whose record never committed (the state a
    crash leaves) and whose run then ends (/new) is still recognised when delivered again."""
    store = await open_store(tmp_path, clock)
    try:
        run = await start(store, KEY)
        await store.append(run, NewMessage(role="user", content="kept once", client_message_id="before-crash"))
    finally:
        await store.close()
    assert idempotency_rows(tmp_path, "before-crash") == 0
    client = await aiohttp_client(make_app(tmp_path, clock))
    ended = await (await client.post(PATH, json={"content": "/new"})).json()
    assert ended["events"][0]["previous_run_id"] == run.run_id
    assert idempotency_rows(tmp_path, "before-crash") == 1
    again = await (await client.post(PATH, json={"content": "kept once", "client_message_id": "before-crash"})).json()
    assert again["run_id"] == run.run_id and again["message_seq"] == 1
    assert len(with_id(tmp_path, "before-crash")) == 1
