"""When a session is reset: pure functions of (policy, entry facts, now).

SPEC section 7. The daily boundary is the instant of ``at_hour:00`` local time in the policy's
zone; a wall time that does not exist (spring-forward gap) is taken as the first instant after the
gap, a repeated one (fall-back) as its first occurrence. A daily reset is due when the run started
before the most recent boundary, deferred only by user activity after that boundary (until that
activity + ``defer_if_active_minutes``, never past boundary + 2 * ``defer_if_active_minutes``), and
only when the gateway applying the rule was running at the boundary: a reset that fell due while
the gateway was down was due before any activity it sees could arrive, so none defers it (the
first message after a restart must not keep the key in yesterday's run). An
idle reset is due once ``last_interaction_at`` (or ``started_at``) is ``idle_minutes`` old. A key is
reset at most once per boundary: the caller records ``ResetDecision.boundary`` and passes it back as
``ResetFacts.last_reset_boundary``.

Every datetime in and out is timezone-aware; results are in UTC.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal, TypeVar
from zoneinfo import ZoneInfo

from config.settings import ResetMode, ResetOverride, SessionSettings

ResetReason = Literal["daily", "idle"]
K = TypeVar("K")
T = TypeVar("T")


@dataclass(frozen=True)
class ResetPolicy:
    """The reset settings that apply to one session, overrides already merged."""

    mode: ResetMode
    at_hour: int
    timezone: ZoneInfo
    idle_minutes: float
    defer_if_active_minutes: float

    @property
    def daily(self) -> bool:
        return self.mode in ("daily", "both")

    @property
    def idle(self) -> bool:
        return self.mode in ("idle", "both")


@dataclass(frozen=True)
class ResetFacts:
    """What the reset rule needs to know about a key's active run.

    ``last_user_activity_at`` counts user messages only: system, cron and memory-flush turns are
    not user activity. ``last_reset_boundary`` is the boundary a daily reset was last done for.
    ``gateway_started_at`` is when the gateway applying the rule started: activity defers only the
    reset of a boundary it was running at (None: running all along).
    """

    started_at: datetime
    last_interaction_at: datetime | None = None
    last_user_activity_at: datetime | None = None
    last_reset_boundary: datetime | None = None
    gateway_started_at: datetime | None = None


@dataclass(frozen=True)
class ResetDecision:
    """``due`` with its ``reason``; ``boundary`` is the daily boundary concerned (set for a due or
    deferred daily reset); ``deferred_until`` is when a deferred daily reset falls due."""

    due: bool
    reason: ResetReason | None = None
    boundary: datetime | None = None
    deferred_until: datetime | None = None


NOT_DUE = ResetDecision(due=False)


def _lookup(overrides: Mapping[K, ResetOverride], key: object) -> ResetOverride | None:
    return next((value for name, value in overrides.items() if name == key), None)


def _merged(name: str, value: T, layers: Iterable[ResetOverride | None]) -> T:
    for layer in layers:
        candidate = getattr(layer, name, None)
        if candidate is not None:
            value = candidate
    return value


def effective_policy(
    session: SessionSettings, *, chat_type: str, channel: str | None, host_zone: ZoneInfo
) -> ResetPolicy:
    """``session.reset``, then ``reset_by_type[chat_type]``, then ``reset_by_channel[channel]``
    (the channel wins); only the fields an override sets replace. A null timezone is the host's."""
    base = session.reset
    layers = (_lookup(session.reset_by_type, chat_type), _lookup(session.reset_by_channel, channel))
    zone_name = _merged("timezone", base.timezone, layers)
    return ResetPolicy(
        mode=_merged("mode", base.mode, layers),
        at_hour=_merged("at_hour", base.at_hour, layers),
        timezone=host_zone if zone_name is None else ZoneInfo(zone_name),
        idle_minutes=_merged("idle_minutes", base.idle_minutes, layers),
        defer_if_active_minutes=_merged("defer_if_active_minutes", base.defer_if_active_minutes, layers),
    )


def daily_boundaries(session: SessionSettings, *, host_zone: ZoneInfo) -> tuple[tuple[ZoneInfo, int], ...]:
    """Every distinct ``(zone, at_hour)`` a daily reset can fall on under these settings, for
    scheduling one daily job per boundary (base first, duplicates dropped)."""
    types: list[str | None] = [None, *session.reset_by_type]
    channels: list[str | None] = [None, *session.reset_by_channel]
    found: dict[tuple[str, int], tuple[ZoneInfo, int]] = {}
    for chat_type in types:
        for channel in channels:
            policy = effective_policy(session, chat_type=chat_type or "", channel=channel, host_zone=host_zone)
            if policy.daily:
                found.setdefault((policy.timezone.key, policy.at_hour), (policy.timezone, policy.at_hour))
    return tuple(found.values())


def _utc(dt: datetime) -> datetime:
    if dt.tzinfo is None:
        raise ValueError(f"naive datetime {dt.isoformat()}: every time must be timezone-aware")
    return dt.astimezone(UTC)


def _first_instant_with_offset_after(lo: datetime, hi: datetime, tz: ZoneInfo) -> datetime:
    """The transition instant in ``(lo, hi]``: ``lo`` has the offset before it, ``hi`` the one after."""
    after = hi.astimezone(tz).utcoffset()
    low, high = int(lo.timestamp()), int(hi.timestamp())
    while high - low > 1:
        mid = (low + high) // 2
        if datetime.fromtimestamp(mid, tz).utcoffset() == after:
            high = mid
        else:
            low = mid
    return datetime.fromtimestamp(high, UTC)


def boundary_on(day: date, at_hour: int, tz: ZoneInfo) -> datetime:
    """The instant of ``at_hour:00`` on ``day`` in ``tz``, as aware UTC.

    A wall time in a spring-forward gap becomes the first instant after the gap; a wall time
    repeated at fall-back is its first occurrence."""
    wall = datetime(day.year, day.month, day.day, at_hour)
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return first
    # In a gap, fold=1 reads the wall time with the offset after the transition (an instant before
    # it) and fold=0 with the offset before (an instant after it); the transition lies between.
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    lo, hi = min(first, second), max(first, second)
    return _first_instant_with_offset_after(lo, hi, tz)


def most_recent_boundary(now: datetime, at_hour: int, tz: ZoneInfo) -> datetime:
    """The latest boundary at or before ``now``."""
    now = _utc(now)
    today = now.astimezone(tz).date()
    for day in (today, today - timedelta(days=1), today - timedelta(days=2)):
        boundary = boundary_on(day, at_hour, tz)
        if boundary <= now:
            return boundary
    raise AssertionError("unreachable: a boundary falls on every local day")


def next_boundary(now: datetime, at_hour: int, tz: ZoneInfo) -> datetime:
    """The first boundary strictly after ``now``."""
    now = _utc(now)
    today = now.astimezone(tz).date()
    for day in (today, today + timedelta(days=1), today + timedelta(days=2)):
        boundary = boundary_on(day, at_hour, tz)
        if boundary > now:
            return boundary
    raise AssertionError("unreachable: a boundary falls on every local day")


def _daily(policy: ResetPolicy, facts: ResetFacts, now: datetime) -> ResetDecision:
    boundary = most_recent_boundary(now, policy.at_hour, policy.timezone)
    if _utc(facts.started_at) >= boundary:
        return NOT_DUE
    if facts.last_reset_boundary is not None and _utc(facts.last_reset_boundary) >= boundary:
        return NOT_DUE
    active = facts.last_user_activity_at
    watched = facts.gateway_started_at is None or _utc(facts.gateway_started_at) <= boundary
    if watched and active is not None and _utc(active) > boundary:
        defer = timedelta(minutes=policy.defer_if_active_minutes)
        until = min(_utc(active) + defer, boundary + 2 * defer)
        if now < until:
            return ResetDecision(due=False, reason=None, boundary=boundary, deferred_until=until)
    return ResetDecision(due=True, reason="daily", boundary=boundary)


def _idle_due_at(policy: ResetPolicy, facts: ResetFacts) -> datetime:
    last = facts.last_interaction_at or facts.started_at
    return _utc(last) + timedelta(minutes=policy.idle_minutes)


def reset_decision(policy: ResetPolicy, facts: ResetFacts, now: datetime) -> ResetDecision:
    """Whether the key's active run is due for a reset at ``now``.

    With mode ``both`` either rule makes it due; a due daily reset is reported in preference to an
    idle one so the caller records its boundary. A reset is due from the instant it falls due
    (``>=``), so ``reset_decision(p, f, next_reset_at(p, f, now)).due`` holds."""
    now = _utc(now)
    if policy.mode == "none":
        return NOT_DUE
    daily = _daily(policy, facts, now) if policy.daily else NOT_DUE
    if daily.due:
        return daily
    if policy.idle and now >= _idle_due_at(policy, facts):
        return ResetDecision(due=True, reason="idle")
    return daily


def next_reset_at(policy: ResetPolicy, facts: ResetFacts, now: datetime) -> datetime | None:
    """When the run will be reset if nothing else happens: ``now`` if a reset is already due,
    else the earliest of the next daily boundary (or deferral end) and the idle deadline;
    ``None`` for mode ``none``."""
    now = _utc(now)
    if policy.mode == "none":
        return None
    candidates: list[datetime] = []
    if policy.daily:
        daily = _daily(policy, facts, now)
        if daily.due:
            return now
        candidates.append(daily.deferred_until or next_boundary(now, policy.at_hour, policy.timezone))
    if policy.idle:
        candidates.append(max(now, _idle_due_at(policy, facts)))
    return min(candidates)
