"""What the scheduler's jobs are and what it tells of them: the daily reset's definition, one
firing of a job (kept in memory, the last ``LAST_RUNS`` per job), and a job as the API and the CLI
show it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo

from config.clock import iso

JobKind = Literal["daily_reset", "sweep", "cleanup", "cron", "backup"]
Callback = Callable[[], Awaitable[object]]  # what a job's firing returns is what ``run_now`` answers


@dataclass(frozen=True)
class DailyJob:
    """The daily reset: ``callback`` at ``at_hour:00`` in the service's zone, and at each further
    ``(zone, at_hour)`` in ``boundaries`` (from per-type and per-channel overrides; duplicates are
    dropped)."""

    at_hour: int
    callback: Callback
    boundaries: Sequence[tuple[ZoneInfo, int]] = ()


LAST_RUNS = 10


@dataclass(frozen=True)
class Firing:
    """One firing of a job, kept in memory (the last ``LAST_RUNS`` per job since the start):
    ``ok`` false when the call raised or its result says so (a cron job's ``CronOutcome``);
    ``error`` why the call failed; ``delivery`` how the result's delivery went when it has one (a
    cron job's ``deliver_to``: url, delivered, attempts, error), as ``run_now`` answers it."""

    started_at: datetime
    finished_at: datetime
    ok: bool
    status: str | None = None
    error: str | None = None
    delivery: Mapping[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "ok": self.ok,
            "status": self.status,
            "error": self.error,
            "delivery": None if self.delivery is None else dict(self.delivery),
        }

    @classmethod
    def of(cls, started_at: datetime, finished_at: datetime, result: object, error: BaseException | None) -> Firing:
        if error is not None:
            return cls(started_at, finished_at, False, "failed", f"{type(error).__name__}: {error}")
        ok = getattr(result, "ok", True)
        status, why = getattr(result, "status", None), getattr(result, "error", None)
        report = getattr(getattr(result, "delivery", None), "as_dict", None)
        delivery = report() if callable(report) else None
        return cls(
            started_at,
            finished_at,
            ok if isinstance(ok, bool) else True,
            status if isinstance(status, str) else None,
            why if isinstance(why, str) else None,
            delivery if isinstance(delivery, Mapping) else None,
        )


@dataclass(frozen=True)
class JobInfo:
    """One scheduled job as ``GET /v1/scheduler/jobs`` and ``neotask cron list`` show it."""

    id: str
    kind: JobKind
    trigger: str
    next_run_at: datetime | None
    running: bool = False
    last_run_at: datetime | None = None
    skipped: int = 0
    last_runs: tuple[Firing, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "trigger": self.trigger,
            "next_run_at": None if self.next_run_at is None else iso(self.next_run_at),
            "running": self.running,
            "last_run_at": None if self.last_run_at is None else iso(self.last_run_at),
            "skipped": self.skipped,
            "last_runs": [firing.as_json() for firing in reversed(self.last_runs)],
        }
