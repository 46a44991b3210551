"""The session engine on real files: appends, durability, lifecycle, recovery, sessions.json."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from pathlib import Path

import pytest

from config.errors import Conflict, NotFound, SessionPaused, StorageUnavailable
from home import layout
from sessions.files.jsonl import read_records
from sessions.files.ledger import MIGRATIONS
from sessions.records import EntryChange, NewMessage, RunFinish, ToolUse
from sessions.store_hooks import StoreHooks
from tests.conftest import FakeClock
from tests.sessions.helpers import open_store, start


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


async def test_concurrent_appends_keep_order_and_gapless_seqs(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    run = await start(store)
    records = await asyncio.gather(
        *(store.append(run, NewMessage(role="user", content=f"message {i}")) for i in range(200))
    )
    await store.close()
    assert [r["seq"] for r in records] == list(range(1, 201))
    stored = lines(tmp_path / "contexts/running" / run.run_id / layout.MESSAGES)
    assert [m["seq"] for m in stored] == list(range(1, 201))
    assert [m["content"] for m in stored] == [f"message {i}" for i in range(200)]
    current = lines(tmp_path / "contexts/running" / run.run_id / layout.CURRENT)
    assert [c["seq"] for c in current] == list(range(1, 201))


@pytest.mark.parametrize("policy", ["batch", "always", "never"])
async def test_every_fsync_policy_stores_everything(tmp_path: Path, clock: FakeClock, policy: str) -> None:
    store = await open_store(tmp_path, clock, {"storage": {"fsync": policy}})
    run = await start(store)
    await asyncio.gather(*(store.append(run, NewMessage(role="user", content=str(i))) for i in range(50)))
    stats = store.writer.stats
    await store.close()
    assert len(lines(run.dir / layout.MESSAGES)) == 50
    if policy == "never":
        assert stats.syncs == 0
    elif policy == "always":
        assert stats.syncs >= 50
    else:  # group commit: one sync covers many appends
        assert 1 <= stats.syncs < 50


async def test_record_fields_follow_the_seed(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    run = await start(store)
    await store.append(run, NewMessage(role="user", content="こんにちは世界", name="alice", sender_id="u1"))
    call = {"id": "call_1", "type": "function", "function": {"name": "update_plan", "arguments": '{"plan":"x"}'}}
    await store.append(run, NewMessage(role="assistant", content="", tool_calls=(call,)))
    await store.append(run, NewMessage(role="tool", content="ok", tool_name="update_plan", tool_call_id="call_1"))
    await store.close()
    first, second, third = lines(run.dir / layout.MESSAGES)
    assert set(first) >= {"seq", "role", "content", "timestamp", "tokens", "tool_name"}
    assert first["tokens"] == len("こんにちは世界") // 2
    assert first["name"] == "alice" and first["sender_id"] == "u1"
    assert second["tool_calls"] == [call] and second["tokens"] > 0
    assert third["tool_call_id"] == "call_1" and third["tool_name"] == "update_plan"
    current = lines(run.dir / layout.CURRENT)
    assert [c["seq"] for c in current] == [1, 2, 3]
    assert "timestamp" not in current[0] and "sender_id" not in current[0]


async def test_commands_are_stored_but_never_in_the_context(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    run = await start(store)
    await store.append(run, NewMessage(role="user", content="hello"))
    await store.append(run, NewMessage(role="user", content="/status", command=True))
    await store.append(run, NewMessage(role="assistant", content="Run: ...", command=True))
    tokens_before = run.context_tokens
    await store.append(run, NewMessage(role="user", content="again"))
    context = await store.read_context(run)
    await store.close()
    assert [m["seq"] for m in lines(run.dir / layout.MESSAGES)] == [1, 2, 3, 4]
    assert [c["seq"] for c in context] == [1, 4]
    assert run.context_tokens == tokens_before + 1


async def test_context_token_count_is_incremental(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    run = await start(store)
    for text in ["a" * 40, "b" * 400, "日本語のテキスト"]:
        await store.append(run, NewMessage(role="user", content=text))
    assert run.context_tokens == 10 + 100 + 4
    entry = store.entry(run.key)
    assert entry is not None and entry.context_tokens == 114 and entry.message_count == 3
    await store.close()


async def test_lifecycle_moves_folders_and_records_statistics(tmp_path: Path, clock: FakeClock) -> None:
    stopped, completed = [], []

    async def on_stop(run: object) -> None:
        stopped.append(run)

    async def on_complete(run: object) -> None:
        completed.append(run)

    hooks = StoreHooks(stop_hooks={"record": on_stop}, completion_hooks={"record": on_complete})
    store = await open_store(tmp_path, clock, hooks=hooks)
    run = await start(store)
    await store.append(run, NewMessage(role="user", content="hi"))
    await store.record_tool(
        run, ToolUse(tool_name="update_plan", arguments={"plan": "a"}, result="ok", duration_ms=1.5)
    )
    await store.record_plan(run, plan_type="initial", plan_content="do it")

    await store.pause(run.key)
    assert (tmp_path / "contexts/paused" / run.run_id / layout.MESSAGES).exists()
    assert not (tmp_path / "contexts/running" / run.run_id).exists()
    assert stopped == [run]
    with pytest.raises(SessionPaused):
        await store.append(run, NewMessage(role="user", content="while paused"))
    await store.append(run, NewMessage(role="user", content="/status", command=True))  # commands still work

    await store.resume(run.key)
    await store.append(run, NewMessage(role="assistant", content="back"))
    await store.complete(run.key)
    assert completed == [run]
    folder = tmp_path / "contexts/completed" / run.run_id
    assert [m["seq"] for m in lines(folder / layout.MESSAGES)] == [1, 2, 3]
    assert lines(folder / layout.TOOLS)[0]["arguments"] == {"plan": "a"}
    assert lines(folder / layout.PLANNING)[0]["plan_content"] == "do it"
    entry = store.entry(run.key)
    assert entry is not None and entry.run_id is None and entry.status == "idle"
    assert entry.last_run_id == run.run_id
    await store.close()

    db = sqlite3.connect(tmp_path / "contexts/tasks.db")
    row = db.execute(
        "SELECT status, total_messages, total_tool_calls, final_message_count, completed_at, session_key"
        " FROM tasks WHERE uuid = ?",
        (run.run_id,),
    ).fetchone()
    assert row[:4] == ("completed", 3, 1, 2) and row[4] is not None and row[5] == run.key


async def test_fail_records_the_error(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    run = await start(store)
    await store.complete(run.key, RunFinish(error="provider exploded"))
    row = await store.ledger.get_run(run.run_id)
    await store.close()
    assert row is not None and row["status"] == "failed" and row["error_message"] == "provider exploded"
    assert (tmp_path / "contexts/completed" / run.run_id).is_dir()


async def test_one_active_run_per_key_and_errors_are_typed(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    await start(store)
    with pytest.raises(Conflict):
        await start(store)
    with pytest.raises(NotFound):
        await store.pause("agent:main:dm:nobody")
    await store.close()


async def test_runs_come_back_with_their_counters(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    run = await start(store)
    paused = await start(store, "agent:main:dm:bob")
    for i in range(7):
        await store.append(run, NewMessage(role="user", content="x" * 8 * (i + 1)))
    await store.record_tool(run, ToolUse(tool_name="t", arguments={}))
    await store.add_usage(run, {"input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 2})
    await store.pause(paused.key)
    await store.close()

    clock.advance(minutes=5)
    again = await open_store(tmp_path, clock)
    back = again.active_run(run.key)
    assert back is not None and back.run_id == run.run_id
    assert back.next_seq == 8 and back.context_tokens == run.context_tokens and back.next_tool_seq == 2
    assert back.usage["input_tokens"] == 10 and back.usage["cache_read_tokens"] == 2
    back_paused = again.active_run(paused.key)
    assert back_paused is not None and back_paused.status == "paused"
    record = await again.append(back, NewMessage(role="user", content="after restart"))
    assert record["seq"] == 8
    entry = again.entry(run.key)
    assert entry is not None and entry.input_tokens == 10 and entry.message_count == 8
    await again.close()


async def test_torn_tail_is_cut_logged_and_kept_aside(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = await open_store(tmp_path, clock)
    run = await start(store)
    for i in range(3):
        await store.append(run, NewMessage(role="user", content=f"m{i}"))
    await store.close()
    messages = run.dir / layout.MESSAGES
    with messages.open("ab") as handle:
        handle.write(b'{"seq": 4, "role": "user", "cont')
    with caplog.at_level(logging.WARNING):
        again = await open_store(tmp_path, clock)
    assert any("torn tail" in r.getMessage() for r in caplog.records)
    assert [m["seq"] for m in lines(messages)] == [1, 2, 3]
    assert (run.dir / "messages.jsonl.torn").read_bytes().startswith(b'{"seq": 4')
    back = again.active_run(run.key)
    assert back is not None
    assert (await again.append(back, NewMessage(role="user", content="next")))["seq"] == 4
    await again.close()


async def test_current_is_brought_level_with_messages_at_open(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    run = await start(store)
    for i in range(5):
        await store.append(run, NewMessage(role="user", content=f"message number {i}"))
    await store.close()
    current = run.dir / layout.CURRENT
    kept = current.read_text(encoding="utf-8").splitlines()[:2]
    current.write_text("\n".join(kept) + "\n", encoding="utf-8")
    again = await open_store(tmp_path, clock)
    assert [c["seq"] for c in read_records(current)] == [1, 2, 3, 4, 5]
    back = again.active_run(run.key)
    assert back is not None and back.context_tokens == run.context_tokens
    await again.close()


@pytest.mark.parametrize("damage", ["delete", "truncate", "garbage"])
async def test_sessions_json_is_rebuilt_with_the_same_keys(
    tmp_path: Path, clock: FakeClock, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = await open_store(tmp_path, clock)
    keys = ["agent:main:main", "agent:main:dm:bob", "cron:nightly", "hook:github:o/r:issue:1"]
    for key in keys:
        run = await start(store, key)
        await store.append(run, NewMessage(role="user", content="hello"))
    await store.add_usage(run, {"input_tokens": 3})
    await store.complete("agent:main:dm:bob")
    await store.close()
    path = tmp_path / "contexts/sessions.json"
    before = json.loads(path.read_text(encoding="utf-8"))["sessions"]
    if damage == "delete":
        path.unlink()
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:40])
    else:
        path.write_text("not json at all", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        again = await open_store(tmp_path, clock)
    assert any("rebuild" in r.getMessage() for r in caplog.records)
    assert sorted(e.key for e in again.entries()) == sorted(keys)
    rebuilt = json.loads(path.read_text(encoding="utf-8"))["sessions"]
    for key in keys:
        assert rebuilt[key]["run_id"] == before[key]["run_id"]
        assert rebuilt[key]["status"] == before[key]["status"]
    assert rebuilt["hook:github:o/r:issue:1"]["input_tokens"] == 3
    assert rebuilt["agent:main:dm:bob"]["last_run_id"] == before["agent:main:dm:bob"]["last_run_id"]
    await again.close()


async def test_sessions_json_is_not_rewritten_per_message(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock, {"storage": {"sessions_flush_ms": 200}})
    run = await start(store)
    rewrites_after_start = store.registry.rewrites
    for i in range(1000):
        await store.append(run, NewMessage(role="user", content=f"m{i}"))
    await store.close()
    appends_rewrites = store.registry.rewrites - rewrites_after_start
    assert appends_rewrites < 50, appends_rewrites
    entry = json.loads((tmp_path / "contexts/sessions.json").read_text(encoding="utf-8"))["sessions"]
    assert entry[run.key]["message_count"] == 1000


async def test_entries_stay_small(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    run = await start(store)
    await store.update_entry(run.key, EntryChange(pinned=True, label="a label", settings={"model": "gpt-4o"}))
    await store.close()
    entry = json.loads((tmp_path / "contexts/sessions.json").read_text(encoding="utf-8"))["sessions"][run.key]
    assert len(json.dumps(entry)) < 2048
    assert entry["pinned"] is True and entry["settings"] == {"model": "gpt-4o"}


async def test_tasks_db_schema_migrations_and_wal(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    await store.close()
    db = sqlite3.connect(tmp_path / "contexts/tasks.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    columns = {row[1] for row in db.execute("PRAGMA table_info(tasks)")}
    seed = {"uuid", "status", "task_type", "task_identifier", "repository", "user", "created_at", "updated_at",
            "completed_at", "metadata", "total_messages", "total_summaries", "total_tool_calls",
            "final_token_count", "final_message_count", "error_message"}  # fmt: skip
    added = {"session_key", "agent_id", "channel", "chat_type", "parent_uuid", "input_tokens", "output_tokens",
             "cache_read_tokens", "cache_write_tokens", "compaction_count", "pinned", "archived_at"}  # fmt: skip
    assert seed | added <= columns
    indexes = {row[1] for row in db.execute("PRAGMA index_list(tasks)")}
    assert {"idx_tasks_status", "idx_tasks_task_type", "idx_tasks_repository", "idx_tasks_user",
            "idx_tasks_completed_at", "idx_tasks_session_key"} <= indexes  # fmt: skip


async def test_a_run_folder_without_a_ledger_row_is_adopted(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    run = await start(store)
    await store.append(run, NewMessage(role="user", content="hello"))
    await store.close()
    db = sqlite3.connect(tmp_path / "contexts/tasks.db")
    with db:
        db.execute("DELETE FROM tasks WHERE uuid = ?", (run.run_id,))
    db.close()
    again = await open_store(tmp_path, clock)
    row = await again.ledger.get_run(run.run_id)
    assert row is not None and row["session_key"] == run.key and row["status"] == "running"
    await again.close()


async def test_open_trusts_the_checkpoint_only_when_current_is_unchanged(tmp_path: Path, clock: FakeClock) -> None:
    store = await open_store(tmp_path, clock)
    run = await start(store)
    for i in range(5):
        await store.append(run, NewMessage(role="user", content=f"message {i} " * 5))
    expected = (run.context_tokens, run.context_lines, run.last_context_seq)
    await store.close()
    assert run.context_bytes == (run.dir / layout.CURRENT).stat().st_size

    again = await open_store(tmp_path, clock)
    assert [r.checkpoint_used for r in again.recovered] == [True]
    back = again.active_run(run.key)
    assert back is not None and (back.context_tokens, back.context_lines, back.last_context_seq) == expected
    await again.close()

    with (run.dir / layout.CURRENT).open("ab") as handle:  # changed behind our back: read it whole
        handle.write(b'{"seq":5,"role":"user","content":"duplicate","tokens":7}\n')
    third = await open_store(tmp_path, clock)
    assert [r.checkpoint_used for r in third.recovered] == [False]
    back = third.active_run(run.key)
    assert back is not None and back.context_tokens == expected[0] + 7 and back.context_lines == 6
    await third.close()


async def test_a_failing_tasks_db_is_a_typed_storage_error_for_the_records(tmp_path: Path, clock: FakeClock) -> None:
    """Callers outside the backend (``conversations.idempotency``) know no SQLite: a tasks.db that fails
    under the records beside the runs raises ``StorageUnavailable``."""
    store = await open_store(tmp_path, clock)
    try:
        conn = sqlite3.connect(tmp_path / "contexts" / "tasks.db")
        for table in ("idempotency", "hook_deliveries", "openai_conversations"):
            conn.execute(f"DROP TABLE {table}")
        conn.close()
        with pytest.raises(StorageUnavailable):
            await store.find_idempotency("agent:main:main", "c-1", since="")
        with pytest.raises(StorageUnavailable):
            await store.remember_delivery("agent:main:main", "c-1", run_id=None, seq=None)
        with pytest.raises(StorageUnavailable):
            await store.record_hook_delivery("d-1", "github", session_key=None, message_seq=None)
        with pytest.raises(StorageUnavailable):
            await store.compat_conversation("agent:main:main")
    finally:
        await store.close()
