"""Appends and seqs, the context the model sees, tool and plan records, usage, and the counters."""

from __future__ import annotations

import asyncio

import pytest

from config.errors import Conflict
from sessions.compaction import summary_line
from sessions.compactor import Compactor, extractive
from sessions.context_lines import ContextLine
from sessions.protocol import StoreProtocol
from sessions.records import NewMessage, ToolUse
from sessions.rewrites import Compaction, Uncompaction
from tests.sessions.conformance.support import KEY, command, counters_agree, start, user
from tests.sessions.helpers import settings_with
from tests.support.typed_dicts import matching_types


async def test_seqs_are_gapless_and_in_arrival_order(store: StoreProtocol) -> None:
    run = await start(store)
    records = await asyncio.gather(*(store.append(run, user(f"message {i}")) for i in range(100)))
    assert [r["seq"] for r in records] == list(range(1, 101))
    messages = [user(f"queued {i}") for i in range(10)]
    queued = [store.queue_append(run, message) for message in messages]  # the split append
    done = [
        await store.finish_append(run, m, record, durable)
        for m, (record, durable) in zip(messages, queued, strict=True)
    ]
    assert [r["seq"] for r in done] == list(range(101, 111))
    stored = await store.read_messages(run.run_id, after_seq=0, limit=1000)
    assert [m["seq"] for m in stored] == list(range(1, 111))
    assert [m["content"] for m in stored[:3]] == ["message 0", "message 1", "message 2"]
    assert [m["seq"] for m in await store.read_messages(run.run_id, after_seq=105, limit=3)] == [106, 107, 108]
    assert run.message_count == 110
    counters_agree(store)


async def test_a_message_record_carries_what_was_sent(store: StoreProtocol) -> None:
    run = await start(store)
    message = NewMessage(role="user", content="hi", name="alice", sender_id="u1", client_message_id="c-1")
    record = await store.append(run, message)
    assert (record["seq"], record["role"], record["content"], record["name"]) == (1, "user", "hi", "alice")
    assert record["sender_id"] == "u1" and record["client_message_id"] == "c-1"
    assert record["tokens"] > 0 and record["timestamp"]
    reply = await store.append(run, NewMessage(role="assistant", content="hello", reply_to=1))
    assert reply["reply_to"] == 1 and "name" not in reply


async def test_the_context_read_waits_for_queued_appends_and_reads_the_same_once_they_are_durable(
    store: StoreProtocol,
) -> None:
    run = await start(store)
    await store.append(run, user("first"))
    message = user("queued")
    record, durable = store.queue_append(run, message)
    assert run.appends_pending == 1
    while_queued = await store.read_context(run)  # through the writer, after the queued line
    assert [line["content"] for line in while_queued] == ["first", "queued"]
    await store.finish_append(run, message, record, durable)
    assert run.appends_pending == 0
    assert await store.read_context(run) == while_queued  # nothing queued: read without the writer


async def test_commands_are_stored_but_kept_out_of_the_context(store: StoreProtocol) -> None:
    run = await start(store)
    await store.append(run, user("hello"))
    await store.append(run, command("/status"))
    await store.append(run, NewMessage(role="assistant", content="hi there"))
    context = await store.read_context(run)
    assert [line["seq"] for line in context] == [1, 3]
    assert run.context_lines == 2 and run.last_context_seq == 3 and run.message_count == 3
    assert run.context_tokens == sum(int(line["tokens"]) for line in context)
    counters_agree(store)


async def test_a_completing_run_takes_no_append(store: StoreProtocol) -> None:
    run = await start(store)
    await store.complete(KEY)
    with pytest.raises(Conflict):
        store.check_writable(run, user("late"))


async def test_tool_and_plan_records_are_numbered_from_one(store: StoreProtocol) -> None:
    run = await start(store)
    first = await store.record_tool(run, ToolUse(tool_name="search", arguments={"q": "x"}, result="found"))
    second = await store.record_tool(
        run, ToolUse(tool_name="search", arguments={}, error="failed", duration_ms=1.23456)
    )
    assert (first["seq"], second["seq"], second["error"], second["duration_ms"]) == (1, 2, "failed", 1.235)
    plan = await store.record_plan(run, plan_type="todo", plan_content="1. this")
    assert plan["id"] == 1 and (await store.record_plan(run, plan_type="todo", plan_content="2."))["id"] == 2
    assert [r["tool_name"] for r in await store.read_records(run.run_id, "tools")] == ["search", "search"]
    assert [r["id"] for r in await store.read_records(run.run_id, "planning")] == [1, 2]


async def test_usage_adds_up_on_the_run_the_entry_and_the_row(store: StoreProtocol) -> None:
    run = await start(store)
    await store.add_usage(run, {"input_tokens": 10, "output_tokens": 3})
    await store.add_usage(run, {"input_tokens": 5, "cache_read_tokens": 2})
    assert run.usage == {"input_tokens": 15, "output_tokens": 3, "cache_read_tokens": 2, "cache_write_tokens": 0}
    entry = store.require_entry(KEY)
    assert (entry.input_tokens, entry.output_tokens, entry.cache_read_tokens) == (15, 3, 2)
    row = await store.get_run(run.run_id)
    assert row is not None and (row["input_tokens"], row["output_tokens"]) == (15, 3)


async def test_calibration_replaces_the_estimate(store: StoreProtocol) -> None:
    run = await start(store)
    await store.append(run, user("hello " * 20))
    store.calibrate_context(run, prompt_tokens=500, overhead_tokens=120, appended_since=7)
    assert run.context_tokens == 387
    counters_agree(store)


async def test_a_compaction_commits_through_the_store(store: StoreProtocol) -> None:
    run = await start(store)
    for i in range(12):
        await store.append(run, user(f"message {i} " + "word " * 40))
    before = run.context_tokens
    compactor = Compactor(store, extractive, settings_with().compaction)
    result = await compactor.compact(run, trigger="manual", threshold=2000, keep_recent=2, min_to_compress=1)
    assert result is not None and result.compaction == 1 and result.end_seq == 10
    assert run.compaction_count == 1 and run.next_summary_id == 2 and run.context_tokens < before
    context = await store.read_context(run)
    assert run.context_lines == len(context) == 3 and [line.get("seq") for line in context[1:]] == [11, 12]
    assert run.context_tokens == sum(int(line.get("tokens", 0)) for line in context)
    assert (await store.get_run(run.run_id) or {}).get("compaction_count") == 1
    counters_agree(store)
    assert await compactor.uncompact(run) == 1
    assert run.compaction_count == 0 and run.context_lines == len(await store.read_context(run)) == 12
    counters_agree(store)
    assert (await store.append(run, user("after")))["seq"] == 13


async def test_a_commit_that_changes_nothing_changes_no_counter(store: StoreProtocol) -> None:
    run = await start(store)
    await store.append(run, user("hello"))
    before = run.counters
    longer = summary_line(1, "word " * 500, covers_from=1, end_seq=1)  # longer than what it replaces
    assert await store.rewrite_context(run, Compaction(1, 1, longer, 1)) is None
    assert await store.rewrite_context(run, Uncompaction(1, 1, "2026-11-30T00:00:00Z")) is None  # none to undo
    assert run.counters == before
    assert [line["seq"] for line in await store.read_context(run)] == [1]
    assert await store.read_records(run.run_id, "summaries") == []
    counters_agree(store)


async def test_a_healthy_store_is_writable(store: StoreProtocol) -> None:
    assert await store.writable() is None
    assert store.recently_writable(60.0)


async def test_the_context_lines_are_typed_lines(store: StoreProtocol) -> None:
    """Every line ``read_context`` gives is one ``ContextLine`` (a message, a tool call, a tool
    result, the summary that opens a compacted context), with no key its type does not declare."""
    run = await start(store)
    await store.append(run, NewMessage(role="user", content="weather?", name="alice", sender_id="u1"))
    call = {"id": "call-1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    await store.append(run, NewMessage(role="assistant", content="", tool_calls=(call,), after=1))
    result = NewMessage(role="tool", content="sunny", tool_name="weather", tool_call_id="call-1", after=1)
    await store.append(run, result)
    await store.append(run, command("/status"))
    for i in range(8):
        await store.append(run, user(f"message {i} " + "word " * 40))
    compactor = Compactor(store, extractive, settings_with().compaction)
    assert await compactor.compact(run, trigger="manual", threshold=2000, keep_recent=6, min_to_compress=1)
    for line in await store.read_context(run):
        assert len(matching_types(line, ContextLine)) == 1, line
    assert await compactor.uncompact(run) == 1
    lines = await store.read_context(run)
    assert [line.get("role") for line in lines[:3]] == ["user", "assistant", "tool"]
    for line in lines:
        assert matching_types(line, ContextLine) == ["ContextMessage"], line
