"""Cleanup plan (SPEC section 7): a table of runs and archives against settings and now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from config.settings import CleanupSettings
from sessions.cleanup_plan import (
    ArchiveFacts,
    CleanupAction,
    RunFacts,
    describe,
    is_pinned,
    plan_cleanup,
    records_cutoffs,
    retention_days,
    run_facts,
)
from sessions.entries import SessionEntry

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
DEFAULT = CleanupSettings()
SHORT_CRON = CleanupSettings(retention_days=30, retention_by_type={"cron": 1, "hook": 0})


def ago(days: float) -> datetime:
    return NOW - timedelta(days=days)


def run(
    status: str = "completed",
    *,
    chat_type: str = "direct",
    completed: float | None = None,
    interacted: float | None = None,
    pinned: bool = False,
    archived: float | None = None,
    key: str = "agent:main:main",
) -> RunFacts:
    return RunFacts(
        run_id=f"run-{status}-{chat_type}",
        session_key=key,
        chat_type=chat_type,
        status=status,
        completed_at=None if completed is None else ago(completed),
        last_interaction_at=None if interacted is None else ago(interacted),
        pinned=pinned,
        archived_at=None if archived is None else ago(archived),
    )


@pytest.mark.parametrize(
    ("facts", "settings", "kinds"),
    [
        pytest.param(run(completed=31, interacted=32), DEFAULT, ["archive"], id="completed past retention"),
        pytest.param(run(completed=30), DEFAULT, ["archive"], id="exactly at retention"),
        pytest.param(run(completed=29.9), DEFAULT, [], id="completed within retention"),
        pytest.param(run("failed", completed=40), DEFAULT, ["archive"], id="failed counts as completed"),
        pytest.param(run(completed=None), DEFAULT, [], id="no completed_at: left alone"),
        pytest.param(run("running", interacted=31), DEFAULT, ["complete", "archive"], id="stale active run"),
        pytest.param(run("paused", interacted=45), DEFAULT, ["complete", "archive"], id="stale paused run"),
        pytest.param(run("running", interacted=5), DEFAULT, [], id="active run in use"),
        pytest.param(run("running", interacted=None), DEFAULT, [], id="active run without interaction"),
        pytest.param(run(completed=400, pinned=True), DEFAULT, [], id="pinned completed run"),
        pytest.param(run("running", interacted=400, pinned=True), DEFAULT, [], id="pinned active run"),
        pytest.param(run(completed=400, archived=300), DEFAULT, [], id="already archived"),
        pytest.param(run(chat_type="cron", completed=1.5), SHORT_CRON, ["archive"], id="per-type override"),
        pytest.param(run(chat_type="cron", completed=0.5), SHORT_CRON, [], id="per-type override, young"),
        pytest.param(run(chat_type="group", completed=1.5), SHORT_CRON, [], id="other types keep the default"),
        pytest.param(run(chat_type="hook", completed=0), SHORT_CRON, ["archive"], id="0 days: next cleanup"),
        pytest.param(
            run("running", chat_type="hook", interacted=0),
            SHORT_CRON,
            ["complete", "archive"],
            id="0 days: active runs too",
        ),
        pytest.param(run(completed=0), CleanupSettings(retention_days=0), ["archive"], id="global 0 days"),
    ],
)
def test_run_rules(facts: RunFacts, settings: CleanupSettings, kinds: list[str]) -> None:
    plan = plan_cleanup([facts], [], settings, NOW)
    assert [action.kind for action in plan] == kinds
    assert all(action.run_id == facts.run_id and action.session_key == facts.session_key for action in plan)


@pytest.mark.parametrize(
    ("archive", "keep_days", "deleted"),
    [
        pytest.param(ArchiveFacts("a1", ago(1000)), None, False, id="null keeps forever"),
        pytest.param(ArchiveFacts("a1", ago(91)), 90, True, id="older than retention"),
        pytest.param(ArchiveFacts("a1", ago(89)), 90, False, id="younger than retention"),
        pytest.param(ArchiveFacts("a1", ago(0)), 0, True, id="0 days: next cleanup"),
        pytest.param(ArchiveFacts("a1", ago(1000), "k", pinned=True), 1, False, id="pinned key"),
    ],
)
def test_archive_rules(archive: ArchiveFacts, keep_days: float | None, deleted: bool) -> None:
    settings = CleanupSettings(archive_retention_days=keep_days)
    plan = plan_cleanup([], [archive], settings, NOW)
    assert plan == ([CleanupAction("delete_archive", "a1", archive.session_key, plan[0].reason)] if deleted else [])


def test_plan_order_and_reasons() -> None:
    runs = [
        RunFacts("r-active", "agent:main:main", "direct", "running", last_interaction_at=ago(31)),
        RunFacts("r-done", "cron:nightly", "cron", "completed", completed_at=ago(2)),
        RunFacts("r-young", "agent:main:dm:bob", "direct", "completed", completed_at=ago(2)),
        RunFacts("r-pinned", "agent:main:dm:ann", "direct", "completed", completed_at=ago(99), pinned=True),
    ]
    archives = [ArchiveFacts("r-old", ago(10), "hook:x"), ArchiveFacts("r-new", ago(1), "hook:y")]
    settings = CleanupSettings(retention_by_type={"cron": 1}, archive_retention_days=7)
    plan = plan_cleanup(runs, archives, settings, NOW)
    assert [(a.kind, a.run_id) for a in plan] == [
        ("complete", "r-active"),
        ("archive", "r-active"),
        ("archive", "r-done"),
        ("delete_archive", "r-old"),
    ]
    assert plan[0].reason == (
        "running, last interaction 2026-10-30T03:00:00+00:00, retention 30 days (direct retention)"
    )
    assert plan[2].reason == "completed at 2026-11-28T03:00:00+00:00, retention 1 day (cron retention)"
    assert plan[3].reason == "archived at 2026-11-20T03:00:00+00:00, archive retention 7 days"


def test_nothing_to_do_is_an_empty_plan() -> None:
    assert plan_cleanup([run(completed=1)], [ArchiveFacts("a", ago(5))], DEFAULT, NOW) == []


def test_retention_days_lookup() -> None:
    assert retention_days(SHORT_CRON, "cron") == 1
    assert retention_days(SHORT_CRON, "hook") == 0
    assert retention_days(SHORT_CRON, "direct") == 30


def _entry(run_id: str | None, *, pinned: bool = False) -> SessionEntry:
    entry = SessionEntry(key="agent:main:main", agent_id="main", chat_type="direct", channel=None,
                         created_at="2026-11-01T00:00:00Z", updated_at="2026-11-01T00:00:00Z")  # fmt: skip
    entry.run_id, entry.pinned, entry.last_interaction_at = run_id, pinned, "2026-11-29T00:00:00Z"
    return entry


ROW = {"session_key": "agent:main:main", "chat_type": None, "status": "running", "completed_at": None,
       "updated_at": "2026-11-20T00:00:00Z", "created_at": "2026-11-10T00:00:00Z", "pinned": 0}  # fmt: skip


@pytest.mark.parametrize(
    ("row", "entry", "last", "pinned"),
    [
        pytest.param(ROW, None, "2026-11-20T00:00:00Z", False, id="no entry: the row's updated_at"),
        pytest.param(ROW, _entry("r"), "2026-11-29T00:00:00Z", False, id="the entry's active run: its interaction"),
        pytest.param(ROW, _entry("other"), "2026-11-20T00:00:00Z", False, id="the entry names another run"),
        pytest.param({**ROW, "updated_at": None}, None, "2026-11-10T00:00:00Z", False, id="no updated_at"),
        pytest.param({**ROW, "pinned": 1}, None, "2026-11-20T00:00:00Z", True, id="the row pinned"),
        pytest.param(ROW, _entry(None, pinned=True), "2026-11-20T00:00:00Z", True, id="the key pinned since"),
    ],
)
def test_run_facts_of_a_ledger_row(row: dict[str, object], entry: SessionEntry | None, last: str, pinned: bool) -> None:
    facts = run_facts("r", row, entry)
    assert facts == RunFacts("r", "agent:main:main", "direct", "running", None, datetime.fromisoformat(last), pinned)
    assert is_pinned(row, entry) is pinned


def test_describe_and_the_delivery_records_cutoffs() -> None:
    action = CleanupAction("archive", "r", "agent:main:main", "old")
    assert describe(action) == {"action": "archive", "run_id": "r", "session_key": "agent:main:main", "reason": "old"}
    assert records_cutoffs(NOW) == ("2026-11-29T03:00:00+00:00", "2026-11-23T03:00:00+00:00")  # 1 and 7 days
