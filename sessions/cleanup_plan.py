"""What a cleanup would do: a pure plan from run and archive facts, settings and ``now``.

SPEC section 7. Completed (or failed) runs whose ``completed_at`` is ``retention_days`` old (per
chat type through ``retention_by_type``; 0 = at the next cleanup) are archived. Active runs whose
``last_interaction_at`` is that old are completed first, then archived in the same plan. Archives
``archive_retention_days`` old are deleted (null = kept forever). The runs of a pinned key are
never touched. The caller carries the plan out in order (and runs ``VACUUM`` only when it did
something); a dry run just shows it. The backends that archive in place (in memory, PostgreSQL: an
archived run's row carries ``archived_at``) gather their facts and carry the plan out through
``facts_in_place`` and ``carry_out``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from config.clock import iso, parse_iso
from config.settings import CleanupSettings
from sessions.entries import SessionEntry
from sessions.records import ACTIVE_STATUSES, FINISHED_STATUSES

IDEMPOTENCY_DAYS = 1  # SPEC section 8: a repeat within a day answers the first answer
DELIVERY_ID_DAYS = 7  # webhook senders retry a delivery for hours, not weeks

CleanupKind = Literal["complete", "archive", "delete_archive"]


@dataclass(frozen=True)
class RunFacts:
    """One run as tasks.db and sessions.json know it."""

    run_id: str
    session_key: str
    chat_type: str
    status: str
    completed_at: datetime | None = None
    last_interaction_at: datetime | None = None
    pinned: bool = False
    archived_at: datetime | None = None


@dataclass(frozen=True)
class ArchiveFacts:
    """One ``archive/{uuid}.tar.gz``; ``pinned`` when its key has been pinned since."""

    run_id: str
    archived_at: datetime
    session_key: str | None = None
    pinned: bool = False


@dataclass(frozen=True)
class CleanupRequest:
    """One cleanup as a store is asked for it: by ``settings`` at ``now``, only planned with
    ``dry_run``; a stale active run is completed through ``complete`` (given its key); ``step`` is
    called at each step of archiving a run (a test hook)."""

    settings: CleanupSettings
    now: datetime
    dry_run: bool
    complete: Callable[[str], Awaitable[None]]
    step: Callable[[str], None] | None = None


@dataclass(frozen=True)
class CleanupAction:
    kind: CleanupKind
    run_id: str
    session_key: str | None
    reason: str


def is_pinned(row: Mapping[str, Any], entry: SessionEntry | None) -> bool:
    """A run's ledger row pinned, or its key pinned since."""
    return bool(row.get("pinned")) or bool(entry and entry.pinned)


def run_facts(run_id: str, row: Mapping[str, Any], entry: SessionEntry | None) -> RunFacts:
    """A run's facts from its ledger row (tasks.db's ``tasks``, PostgreSQL's ``runs``: the same
    columns) and its key's entry (which knows the active run's last interaction)."""
    last = entry.last_interaction_at if entry and entry.run_id == run_id else None
    return RunFacts(
        run_id=run_id, session_key=row.get("session_key") or "", chat_type=row.get("chat_type") or "direct",
        status=row["status"], completed_at=_when(row.get("completed_at")),
        last_interaction_at=_when(last or row.get("updated_at") or row.get("created_at")),
        pinned=is_pinned(row, entry),
    )  # fmt: skip


def facts_in_place(
    rows: Iterable[tuple[str, Mapping[str, Any]]], entry_of: Callable[[str], SessionEntry | None]
) -> tuple[list[RunFacts], list[ArchiveFacts]]:
    """The facts of runs and archives from ``(run_id, ledger row)`` pairs of a backend that archives
    in place (an archived run's row carries ``archived_at``), with their keys' entries."""
    runs, archived = [], []
    for run_id, row in rows:
        key = str(row.get("session_key") or "")
        entry = entry_of(key)
        if row.get("archived_at"):
            archived.append(ArchiveFacts(run_id, parse_iso(str(row["archived_at"])), key, is_pinned(row, entry)))
        else:
            runs.append(run_facts(run_id, row, entry))
    return runs, archived


async def carry_out(
    actions: Iterable[CleanupAction],
    request: CleanupRequest,
    *,
    active: Callable[[str], object | None],
    archive: Callable[[str], Awaitable[None]],
    delete: Callable[[str], Awaitable[None]],
) -> list[dict[str, Any]]:
    """Carry ``actions`` out in order, on a backend that archives in place: complete (through the
    request's ``complete``) a key whose run is still ``active``, ``archive`` a run (then the
    request's ``step("recorded")``), ``delete`` an expired archive; the report of the actions done."""
    report: list[dict[str, Any]] = []
    for action in actions:
        if action.kind == "complete":
            if action.session_key and active(action.session_key) is not None:
                await request.complete(action.session_key)
        elif action.kind == "archive":
            await archive(action.run_id)
            if request.step is not None:
                request.step("recorded")
        else:
            await delete(action.run_id)
        report.append({**describe(action), "done": True})
    return report


def describe(action: CleanupAction) -> dict[str, Any]:
    """An action as a cleanup's report shows it (``done`` and ``error`` are added)."""
    return {"action": action.kind, "run_id": action.run_id, "session_key": action.session_key,
            "reason": action.reason}  # fmt: skip


def records_cutoffs(now: datetime) -> tuple[str, str]:
    """The creation times before which idempotency records, and webhook delivery records, are
    forgotten (nothing can match them any more)."""
    return iso(now - timedelta(days=IDEMPOTENCY_DAYS)), iso(now - timedelta(days=DELIVERY_ID_DAYS))


def _when(text: str | None) -> datetime | None:
    return parse_iso(text) if text else None


def retention_days(settings: CleanupSettings, chat_type: str) -> float:
    """``retention_by_type[chat_type]`` when set, else ``retention_days``."""
    return next(
        (days for name, days in settings.retention_by_type.items() if name == chat_type),
        settings.retention_days,
    )


def _older_than(moment: datetime, days: float, now: datetime) -> bool:
    return now - moment >= timedelta(days=days)


def _days(days: float) -> str:
    return f"{days:g} day" + ("" if days == 1 else "s")


def _run_actions(run: RunFacts, settings: CleanupSettings, now: datetime) -> list[CleanupAction]:
    if run.pinned or run.archived_at is not None:
        return []
    days = retention_days(settings, run.chat_type)
    window = f"{_days(days)} ({run.chat_type} retention)"
    if run.status in FINISHED_STATUSES:
        if run.completed_at is None or not _older_than(run.completed_at, days, now):
            return []
        reason = f"{run.status} at {iso(run.completed_at)}, retention {window}"
        return [CleanupAction("archive", run.run_id, run.session_key, reason)]
    if run.status in ACTIVE_STATUSES:
        last = run.last_interaction_at
        if last is None or not _older_than(last, days, now):
            return []
        reason = f"{run.status}, last interaction {iso(last)}, retention {window}"
        return [
            CleanupAction("complete", run.run_id, run.session_key, reason),
            CleanupAction("archive", run.run_id, run.session_key, reason),
        ]
    return []


def _archive_action(archive: ArchiveFacts, settings: CleanupSettings, now: datetime) -> CleanupAction | None:
    keep = settings.archive_retention_days
    if keep is None or archive.pinned or not _older_than(archive.archived_at, keep, now):
        return None
    reason = f"archived at {iso(archive.archived_at)}, archive retention {_days(keep)}"
    return CleanupAction("delete_archive", archive.run_id, archive.session_key, reason)


def plan_cleanup(
    runs: Iterable[RunFacts],
    archives: Iterable[ArchiveFacts],
    settings: CleanupSettings,
    now: datetime,
) -> list[CleanupAction]:
    """The actions of one cleanup, in the order to carry them out: each stale run's ``complete``
    (if active) right before its ``archive``, in input order; then the ``delete_archive`` actions.
    Archives made by this plan are not deleted by it, even with ``archive_retention_days`` 0."""
    actions = [action for run in runs for action in _run_actions(run, settings, now)]
    for archive in archives:
        action = _archive_action(archive, settings, now)
        if action is not None:
            actions.append(action)
    return actions
