"""The bookkeeping the three backends share (sessions/bookkeeping.py): the statistics columns, the
counters an append moves, and the key's entry through a run's start, messages, discard and end.
The conformance suite checks the same over every backend; these pin the rules themselves."""

from __future__ import annotations

import asyncio

import pytest

from config.errors import NoActiveRun, SessionNotFound
from sessions.appends import message_record
from sessions.bookkeeping import (
    add_usage_counts,
    count_append,
    counted_rewrite,
    end_entry,
    found_entry,
    idle_entry,
    inherit_next,
    mark_reset_boundary,
    note_message,
    plan_record,
    require_active,
    run_stats,
    start_entry,
)
from sessions.entries import SessionEntry
from sessions.records import ContextRewrite, EntryChange, NewMessage, Role, RunState, TaskKey

KEY = "agent:main:main"


def _run(**counters: int) -> RunState:
    run = RunState(
        run_id="r1", key=KEY, agent_id="main", chat_type="direct", channel=None, status="running",
        started_at="2026-01-01T00:00:00Z", task_key=TaskKey("chat", KEY),
    )  # fmt: skip
    for name, value in counters.items():
        setattr(run, name, value)
    return run


def _entry() -> SessionEntry:
    return SessionEntry(key=KEY, agent_id="main", chat_type="direct", channel=None, created_at="t0", updated_at="t0")


def test_run_stats_are_the_seed_columns_from_the_counters() -> None:
    run = _run(next_seq=8, next_summary_id=3, next_tool_seq=5, context_tokens=120, context_lines=4)
    assert run_stats(run) == {
        "total_messages": 7,
        "total_summaries": 2,
        "total_tool_calls": 4,
        "final_token_count": 120,
        "final_message_count": 4,
    }


@pytest.mark.parametrize(("line_bytes", "in_context"), [(40, True), (None, False)])
def test_count_append_moves_the_context_counters_only_for_a_context_line(
    line_bytes: int | None, in_context: bool
) -> None:
    run = _run(next_seq=3, context_tokens=10, context_lines=2, context_bytes=100, messages_bytes=200)
    record = message_record(3, NewMessage(role="user", content="hello there"), "t1")
    count_append(run, record, 60, line_bytes)
    assert (run.appends_pending, run.messages_bytes) == (1, 260)
    if in_context:
        assert (run.context_bytes, run.context_lines, run.last_context_seq) == (140, 3, 3)
        assert run.context_tokens == 10 + record["tokens"]
    else:
        assert (run.context_bytes, run.context_lines, run.last_context_seq, run.context_tokens) == (100, 2, 0, 10)


@pytest.mark.parametrize(
    ("role", "command", "user_activity", "interaction", "activity"),
    [
        ("user", False, None, True, True),
        ("user", True, None, True, False),  # a chat command is no activity (a daily reset stays due)
        ("assistant", False, None, True, False),
        ("system", False, None, False, False),
        ("user", False, False, True, False),  # a cron or system turn says so
        ("system", False, True, False, True),
    ],
)
def test_note_message_sets_the_entry_times(
    role: Role, command: bool, user_activity: bool | None, interaction: bool, activity: bool
) -> None:
    entry = _entry()
    note_message(entry, NewMessage(role=role, content="x", command=command, user_activity=user_activity), "t2")
    assert entry.updated_at == "t2"
    assert (entry.last_interaction_at == "t2") is interaction
    assert (entry.last_user_activity_at == "t2") is activity


def test_the_entry_through_start_discard_and_end() -> None:
    entry = _entry()
    start_entry(entry, "r1", "t1")
    assert (entry.run_id, entry.status, entry.started_at, entry.updated_at) == ("r1", "running", "t1", "t1")
    entry.context_tokens, entry.message_count = 50, 3
    idle_entry(entry)
    assert (entry.run_id, entry.status, entry.context_tokens, entry.message_count) == (None, "idle", 0, 0)
    assert entry.last_run_id is None  # a discarded run is no previous run
    start_entry(entry, "r2", "t2")
    entry.context_tokens, entry.message_count = 50, 3
    end_entry(entry, "r2", "t3")
    assert (entry.last_run_id, entry.run_id, entry.status, entry.updated_at) == ("r2", None, "idle", "t3")
    assert (entry.context_tokens, entry.message_count) == (0, 0)


class _Lookups:
    def __init__(self, entry: SessionEntry | None, run: RunState | None) -> None:
        self._entry, self._run = entry, run

    def require_entry(self, key: str) -> SessionEntry:
        if self._entry is None:
            raise SessionNotFound(key)
        return self._entry

    def active_run(self, key: str) -> RunState | None:
        return self._run


def test_require_active_names_what_is_missing() -> None:
    run = _run()
    assert require_active(_Lookups(_entry(), run), KEY) is run
    with pytest.raises(NoActiveRun, match="has no active run"):
        require_active(_Lookups(_entry(), None), KEY)
    with pytest.raises(SessionNotFound):
        require_active(_Lookups(None, None), KEY)


def test_relabel_sets_or_clears_the_label_and_merges_settings_dropping_nones() -> None:
    entry = _entry()
    entry.label, entry.settings = "old", {"model": "a", "queue_mode": "steer"}
    entry.relabel(EntryChange(settings={"queue_mode": None, "verbose": True}))
    assert (entry.label, entry.settings) == ("old", {"model": "a", "verbose": True})
    entry.relabel(EntryChange(label="new"))
    assert entry.label == "new"
    entry.relabel(EntryChange(clear_label=True))
    assert entry.label is None and entry.settings == {"model": "a", "verbose": True}


def test_usage_adds_to_the_run_and_the_entry_every_key_counted() -> None:
    run, entry = _run(), _entry()
    clean = add_usage_counts(run, entry, {"input_tokens": 10, "output_tokens": 3, "other": 9})
    assert clean == {"input_tokens": 10, "output_tokens": 3, "cache_read_tokens": 0, "cache_write_tokens": 0}
    add_usage_counts(run, None, {"input_tokens": 5})
    assert run.usage["input_tokens"] == 15 and entry.input_tokens == 10 and entry.output_tokens == 3


def test_plan_records_take_the_next_id() -> None:
    run = _run()
    first = plan_record(run, "todo", "a", "t1")
    second = plan_record(run, "todo", "b", "t2")
    assert first == {"id": 1, "plan_type": "todo", "plan_content": "a", "created_at": "t1"}
    assert second["id"] == 2 and run.next_plan_id == 3


def test_found_entry_and_inherit_next() -> None:
    entry = _entry()
    assert found_entry(entry, KEY) is entry
    with pytest.raises(SessionNotFound):
        found_entry(None, KEY)
    assert inherit_next(entry, not entry.inherit_next) is True
    assert inherit_next(entry, entry.inherit_next) is False  # says so already
    assert inherit_next(None, True) is False


REWRITE = ContextRewrite(tokens_after=20, line_delta=-8, context_bytes=200, compaction_count=1, summary_id=1)


def _rewritten(run: RunState) -> tuple[int, ...]:
    return run.context_tokens, run.context_bytes, run.context_lines, run.compaction_count, run.next_summary_id


async def test_a_rewrite_is_counted_with_what_was_appended_meanwhile_on_top() -> None:
    run, counted = _run(context_tokens=100, context_bytes=1000, context_lines=10), []
    future: asyncio.Future[ContextRewrite | None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(counted_rewrite(run, future, lambda: counted.append(run.compaction_count)))
    await asyncio.sleep(0)
    run.context_tokens, run.context_bytes, run.context_lines = 105, 1050, 11  # an append queued meanwhile
    future.set_result(REWRITE)
    assert await waiting is REWRITE
    assert _rewritten(run) == (25, 250, 3, 1, 2) and counted == [1]
    unchanged: asyncio.Future[ContextRewrite | None] = asyncio.get_running_loop().create_future()
    unchanged.set_result(None)
    assert await counted_rewrite(run, unchanged, lambda: counted.append(0)) is None
    assert _rewritten(run) == (25, 250, 3, 1, 2) and counted == [1]


@pytest.mark.parametrize("fails", [False, True])
async def test_a_rewrite_whose_caller_was_cancelled_is_counted_once_done(fails: bool) -> None:
    run, counted = _run(context_tokens=100, context_bytes=1000, context_lines=10), []
    future: asyncio.Future[ContextRewrite | None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(counted_rewrite(run, future, lambda: counted.append(run.compaction_count)))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not future.cancelled() and counted == []  # the rewrite goes on
    if fails:
        future.set_exception(OSError("disk"))
    else:
        future.set_result(REWRITE)
    await asyncio.sleep(0)
    if fails:
        future.exception()  # retrieved: nothing was counted
        assert _rewritten(run) == (100, 1000, 10, 0, 1) and counted == []
    else:
        assert _rewritten(run) == (20, 200, 2, 1, 2) and counted == [1]


def test_mark_reset_boundary_sets_it_on_an_entry_only() -> None:
    entry = _entry()
    assert mark_reset_boundary(entry, "2026-01-02T04:00:00Z") is True
    assert entry.last_reset_boundary == "2026-01-02T04:00:00Z"
    assert mark_reset_boundary(None, "2026-01-02T04:00:00Z") is False  # no entry: nothing to save
