"""Reset rules (SPEC section 7): tables over boundaries, DST changes, deferral, idle and overrides."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from config.settings import ResetMode, ResetOverride, ResetSettings, SessionSettings
from sessions.resets import (
    ResetDecision,
    ResetFacts,
    ResetPolicy,
    boundary_on,
    daily_boundaries,
    effective_policy,
    most_recent_boundary,
    next_boundary,
    next_reset_at,
    reset_decision,
)

NY = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")
TOKYO = ZoneInfo("Asia/Tokyo")


def z(text: str) -> datetime:
    """A UTC instant from ``MM-DDTHH:MM[:SS]`` in 2026 (or a full ISO string)."""
    if not text.startswith("20"):
        text = "2026-" + text
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def policy(
    mode: ResetMode = "daily",
    at_hour: int = 4,
    tz: ZoneInfo = NY,
    idle_minutes: float = 240,
    defer: float = 30,
) -> ResetPolicy:
    return ResetPolicy(
        mode=mode, at_hour=at_hour, timezone=tz, idle_minutes=idle_minutes, defer_if_active_minutes=defer
    )


# America/New_York: EST is UTC-5, EDT UTC-4. 2026-03-08 02:00 EST jumps to 03:00 EDT (07:00Z);
# 2026-11-01 02:00 EDT falls back to 01:00 EST (06:00Z), so 01:00-01:59 happens twice.
@pytest.mark.parametrize(
    ("day", "hour", "tz", "expected", "why"),
    [
        (date(2026, 3, 7), 4, NY, "03-07T09:00", "EST"),
        (date(2026, 3, 8), 2, NY, "03-08T07:00", "gap: first instant after it (03:00 EDT)"),
        (date(2026, 3, 8), 3, NY, "03-08T07:00", "03:00 EDT, the gap's end"),
        (date(2026, 3, 8), 4, NY, "03-08T08:00", "EDT from the spring change"),
        (date(2026, 10, 31), 4, NY, "10-31T08:00", "EDT"),
        (date(2026, 11, 1), 1, NY, "11-01T05:00", "repeated: first occurrence (01:00 EDT)"),
        (date(2026, 11, 1), 2, NY, "11-01T07:00", "02:00 EST, after the repeated hour"),
        (date(2026, 11, 1), 4, NY, "11-01T09:00", "EST from the fall change"),
        (date(2026, 3, 8), 4, ZoneInfo("UTC"), "03-08T04:00", "UTC has no changes"),
        (date(2026, 10, 4), 2, ZoneInfo("Australia/Lord_Howe"), "10-03T15:30", "half-hour gap 02:00-02:30"),
        (date(2026, 3, 29), 2, ZoneInfo("Antarctica/Troll"), "03-29T01:00", "inside a two-hour gap"),
        (date(2026, 3, 29), 4, BERLIN, "03-29T02:00", "CEST"),
    ],
)
def test_boundary_on(day: date, hour: int, tz: ZoneInfo, expected: str, why: str) -> None:
    result = boundary_on(day, hour, tz)
    assert result == z(expected), why
    assert result.tzinfo is UTC


@pytest.mark.parametrize(
    ("now", "hour", "recent", "upcoming"),
    [
        ("11-30T08:59", 4, "11-29T09:00", "11-30T09:00"),  # 03:59 EST
        ("11-30T09:00", 4, "11-30T09:00", "12-01T09:00"),  # exactly at the boundary
        ("11-30T09:01", 4, "11-30T09:00", "12-01T09:00"),
        ("03-08T06:59", 2, "03-07T07:00", "03-08T07:00"),  # 01:59 EST, just before the gap
        ("03-08T07:00", 2, "03-08T07:00", "03-09T06:00"),
        ("03-08T07:30", 4, "03-07T09:00", "03-08T08:00"),  # 03:30 EDT: the day is 23 hours long
        ("11-01T05:30", 1, "11-01T05:00", "11-02T06:00"),  # first 01:30
        ("11-01T06:30", 1, "11-01T05:00", "11-02T06:00"),  # second 01:30: still the first boundary
        ("11-01T08:59", 4, "10-31T08:00", "11-01T09:00"),  # 03:59 EST: the day is 25 hours long
        ("11-01T03:00", 4, "10-31T08:00", "11-01T09:00"),  # 23:00 EDT the evening before
    ],
)
def test_most_recent_and_next_boundary(now: str, hour: int, recent: str, upcoming: str) -> None:
    assert most_recent_boundary(z(now), hour, NY) == z(recent)
    assert next_boundary(z(now), hour, NY) == z(upcoming)


def test_boundaries_accept_any_aware_zone_and_reject_naive() -> None:
    local = datetime(2026, 11, 30, 4, 0, tzinfo=NY)
    assert most_recent_boundary(local, 4, NY) == z("11-30T09:00")
    with pytest.raises(ValueError, match="timezone-aware"):
        most_recent_boundary(datetime(2026, 11, 30, 4, 0), 4, NY)


EVENING = z("11-29T20:00")  # 15:00 EST, the run's start in the plain-day rows

DAILY_ROWS = [
    # (id, policy, facts, now, expected)
    (
        "03:59 message, before the boundary: not yet",
        policy(),
        ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T08:59")),
        "11-30T08:59:30",
        ResetDecision(due=False),
    ),
    (
        "03:59 message does not defer the 04:00 reset",
        policy(),
        ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T08:59")),
        "11-30T09:00",
        ResetDecision(due=True, reason="daily", boundary=z("11-30T09:00")),
    ),
    (
        "04:01 message defers by defer_if_active_minutes",
        policy(),
        ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T09:01")),
        "11-30T09:02",
        ResetDecision(due=False, boundary=z("11-30T09:00"), deferred_until=z("11-30T09:31")),
    ),
    (
        "deferral over",
        policy(),
        ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T09:01")),
        "11-30T09:31",
        ResetDecision(due=True, reason="daily", boundary=z("11-30T09:00")),
    ),
    (
        "cap: never past boundary + 2 x defer",
        policy(),
        ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T09:50")),
        "11-30T09:55",
        ResetDecision(due=False, boundary=z("11-30T09:00"), deferred_until=z("11-30T10:00")),
    ),
    (
        "cap reached",
        policy(),
        ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T09:59")),
        "11-30T10:00",
        ResetDecision(due=True, reason="daily", boundary=z("11-30T09:00")),
    ),
    (
        "defer 0: activity after the boundary changes nothing",
        policy(defer=0),
        ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T09:01")),
        "11-30T09:02",
        ResetDecision(due=True, reason="daily", boundary=z("11-30T09:00")),
    ),
    (
        "fractional defer",
        policy(defer=0.5),
        ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T09:00:20")),
        "11-30T09:00:40",
        ResetDecision(due=False, boundary=z("11-30T09:00"), deferred_until=z("11-30T09:00:50")),
    ),
    (
        "fractional defer, capped at boundary + 60 s",
        policy(defer=0.5),
        ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T09:00:45")),
        "11-30T09:00:59",
        ResetDecision(due=False, boundary=z("11-30T09:00"), deferred_until=z("11-30T09:01")),
    ),
    # Issue 24, item 4: a boundary that passed while the gateway was down. The reset was due before
    # any activity the gateway sees could arrive: that activity (the first message after the
    # restart, counted before the check) must not defer it.
    (
        "down over the boundary: the first message after the restart does not defer",
        policy(),
        ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T09:05"), gateway_started_at=z("11-30T09:04")),
        "11-30T09:05",
        ResetDecision(due=True, reason="daily", boundary=z("11-30T09:00")),
    ),
    (
        "down over the boundary, hours later: due",
        policy(defer=600),
        ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T13:00"), gateway_started_at=z("11-30T12:59")),
        "11-30T13:00",
        ResetDecision(due=True, reason="daily", boundary=z("11-30T09:00")),
    ),
    (
        "running at the boundary: activity after it defers as before",
        policy(),
        ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T09:01"), gateway_started_at=z("11-30T08:00")),
        "11-30T09:02",
        ResetDecision(due=False, boundary=z("11-30T09:00"), deferred_until=z("11-30T09:31")),
    ),
    (
        "started at the boundary instant: running at it",
        policy(),
        ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T09:01"), gateway_started_at=z("11-30T09:00")),
        "11-30T09:02",
        ResetDecision(due=False, boundary=z("11-30T09:00"), deferred_until=z("11-30T09:31")),
    ),
    (
        "down over an earlier boundary only: today's deferral holds",
        policy(),
        ResetFacts(
            started_at=z("11-30T09:30"), last_user_activity_at=z("12-01T09:01"), gateway_started_at=z("11-30T09:10")
        ),
        "12-01T09:02",
        ResetDecision(due=False, boundary=z("12-01T09:00"), deferred_until=z("12-01T09:31")),
    ),
    (
        "down over the boundary, message before it: due",
        policy(),
        ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T08:59"), gateway_started_at=z("11-30T09:30")),
        "11-30T09:31",
        ResetDecision(due=True, reason="daily", boundary=z("11-30T09:00")),
    ),
    (
        "started at the boundary: not before it",
        policy(),
        ResetFacts(started_at=z("11-30T09:00")),
        "11-30T12:00",
        ResetDecision(due=False),
    ),
    (
        "already reset for this boundary",
        policy(),
        ResetFacts(started_at=EVENING, last_reset_boundary=z("11-30T09:00")),
        "11-30T12:00",
        ResetDecision(due=False),
    ),
    (
        "reset for the previous boundary only",
        policy(),
        ResetFacts(started_at=z("11-28T20:00"), last_reset_boundary=z("11-29T09:00")),
        "11-30T12:00",
        ResetDecision(due=True, reason="daily", boundary=z("11-30T09:00")),
    ),
    (
        "a missed boundary is still due days later (daemon was down)",
        policy(),
        ResetFacts(started_at=z("11-20T20:00"), last_interaction_at=z("11-20T21:00")),
        "11-30T08:00",
        ResetDecision(due=True, reason="daily", boundary=z("11-29T09:00")),
    ),
    # Spring forward, at_hour 2 lies in the gap: the boundary is 03:00 EDT = 07:00Z.
    (
        "spring, hour 2: 01:59 EST",
        policy(at_hour=2),
        ResetFacts(started_at=z("03-07T23:00")),
        "03-08T06:59",
        ResetDecision(due=False),
    ),
    (
        "spring, hour 2: first instant after the gap",
        policy(at_hour=2),
        ResetFacts(started_at=z("03-07T23:00")),
        "03-08T07:00",
        ResetDecision(due=True, reason="daily", boundary=z("03-08T07:00")),
    ),
    (
        "spring, hour 4: 03:59 EDT",
        policy(),
        ResetFacts(started_at=z("03-07T23:00"), last_user_activity_at=z("03-08T07:59")),
        "03-08T07:59",
        ResetDecision(due=False),
    ),
    (
        "spring, hour 4: 04:00 EDT",
        policy(),
        ResetFacts(started_at=z("03-07T23:00"), last_user_activity_at=z("03-08T07:59")),
        "03-08T08:00",
        ResetDecision(due=True, reason="daily", boundary=z("03-08T08:00")),
    ),
    (
        "spring, hour 4: 04:01 EDT message defers",
        policy(),
        ResetFacts(started_at=z("03-07T23:00"), last_user_activity_at=z("03-08T08:01")),
        "03-08T08:01",
        ResetDecision(due=False, boundary=z("03-08T08:00"), deferred_until=z("03-08T08:31")),
    ),
    # Fall back. 01:00 happens twice (05:00Z EDT, 06:00Z EST): the first one is the boundary.
    (
        "fall, hour 1: first 01:00",
        policy(at_hour=1),
        ResetFacts(started_at=z("10-31T20:00")),
        "11-01T05:00",
        ResetDecision(due=True, reason="daily", boundary=z("11-01T05:00")),
    ),
    (
        "fall, hour 1: second 01:00, the new run is not reset again",
        policy(at_hour=1),
        ResetFacts(started_at=z("11-01T05:10")),
        "11-01T06:00",
        ResetDecision(due=False),
    ),
    (
        "fall, hour 1: second 01:00, a run already reset for the boundary",
        policy(at_hour=1),
        ResetFacts(started_at=z("10-31T20:00"), last_reset_boundary=z("11-01T05:00")),
        "11-01T06:00",
        ResetDecision(due=False),
    ),
    (
        "fall, hour 2: 01:30 EST is still before 02:00 EST",
        policy(at_hour=2),
        ResetFacts(started_at=z("10-31T20:00")),
        "11-01T06:30",
        ResetDecision(due=False),
    ),
    (
        "fall, hour 2: 02:00 EST",
        policy(at_hour=2),
        ResetFacts(started_at=z("10-31T20:00")),
        "11-01T07:00",
        ResetDecision(due=True, reason="daily", boundary=z("11-01T07:00")),
    ),
    (
        "fall, hour 4: 03:59 EST (25-hour day)",
        policy(),
        ResetFacts(started_at=z("10-31T20:00"), last_user_activity_at=z("11-01T08:59")),
        "11-01T08:59",
        ResetDecision(due=False),
    ),
    (
        "fall, hour 4: 04:00 EST",
        policy(),
        ResetFacts(started_at=z("10-31T20:00"), last_user_activity_at=z("11-01T08:59")),
        "11-01T09:00",
        ResetDecision(due=True, reason="daily", boundary=z("11-01T09:00")),
    ),
    (
        "fall, hour 4: 04:01 EST message defers",
        policy(),
        ResetFacts(started_at=z("10-31T20:00"), last_user_activity_at=z("11-01T09:01")),
        "11-01T09:20",
        ResetDecision(due=False, boundary=z("11-01T09:00"), deferred_until=z("11-01T09:31")),
    ),
]

IDLE_ROWS = [
    (
        "idle, fractional minutes: 29 s of 30",
        policy(mode="idle", idle_minutes=0.5),
        ResetFacts(started_at=z("11-30T11:00"), last_interaction_at=z("11-30T12:00")),
        "11-30T12:00:29",
        ResetDecision(due=False),
    ),
    (
        "idle, fractional minutes: 30 s",
        policy(mode="idle", idle_minutes=0.5),
        ResetFacts(started_at=z("11-30T11:00"), last_interaction_at=z("11-30T12:00")),
        "11-30T12:00:30",
        ResetDecision(due=True, reason="idle"),
    ),
    (
        "idle without interactions counts from the start",
        policy(mode="idle", idle_minutes=90),
        ResetFacts(started_at=z("11-30T10:00")),
        "11-30T11:30",
        ResetDecision(due=True, reason="idle"),
    ),
    (
        "idle mode ignores the boundary",
        policy(mode="idle"),
        ResetFacts(started_at=EVENING, last_interaction_at=z("11-30T08:00")),
        "11-30T10:00",
        ResetDecision(due=False),
    ),
    (
        "daily mode ignores idleness",
        policy(mode="daily", idle_minutes=1),
        ResetFacts(started_at=z("11-30T10:00")),
        "11-30T20:00",
        ResetDecision(due=False),
    ),
    (
        "both: idle due, daily not",
        policy(mode="both", idle_minutes=60),
        ResetFacts(started_at=z("11-30T10:00"), last_interaction_at=z("11-30T10:30")),
        "11-30T11:30",
        ResetDecision(due=True, reason="idle"),
    ),
    (
        "both: daily due, reported with its boundary",
        policy(mode="both", idle_minutes=60),
        ResetFacts(started_at=EVENING, last_interaction_at=z("11-30T06:00")),
        "11-30T09:00",
        ResetDecision(due=True, reason="daily", boundary=z("11-30T09:00")),
    ),
    (
        "both: daily deferred, idle not due",
        policy(mode="both", idle_minutes=60),
        ResetFacts(
            started_at=EVENING,
            last_interaction_at=z("11-30T09:05"),
            last_user_activity_at=z("11-30T09:05"),
        ),
        "11-30T09:10",
        ResetDecision(due=False, boundary=z("11-30T09:00"), deferred_until=z("11-30T09:35")),
    ),
    (
        "none: never",
        policy(mode="none", idle_minutes=1),
        ResetFacts(started_at=z("01-01T00:00"), last_interaction_at=z("01-01T00:00")),
        "11-30T12:00",
        ResetDecision(due=False),
    ),
]


@pytest.mark.parametrize(
    ("policy_", "facts", "now", "expected"),
    [pytest.param(*row[1:], id=str(row[0])) for row in DAILY_ROWS + IDLE_ROWS],
)
def test_reset_decision(policy_: ResetPolicy, facts: ResetFacts, now: str, expected: ResetDecision) -> None:
    assert reset_decision(policy_, facts, z(now)) == expected


@pytest.mark.parametrize(
    ("policy_", "facts", "now", "expected"),
    [
        pytest.param(policy(), ResetFacts(started_at=EVENING), "11-30T08:00", "11-30T09:00", id="next boundary"),
        pytest.param(policy(), ResetFacts(started_at=EVENING), "11-30T09:10", "11-30T09:10", id="due: now"),
        pytest.param(
            policy(),
            ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T09:01")),
            "11-30T09:02",
            "11-30T09:31",
            id="deferred",
        ),
        pytest.param(
            policy(),
            ResetFacts(started_at=EVENING, last_reset_boundary=z("11-30T09:00")),
            "11-30T09:10",
            "12-01T09:00",
            id="done for this boundary",
        ),
        pytest.param(
            policy(at_hour=2), ResetFacts(started_at=z("03-08T01:00")), "03-08T02:00", "03-08T07:00", id="gap"
        ),
        pytest.param(
            policy(mode="idle", idle_minutes=1.5),
            ResetFacts(started_at=z("11-30T11:00"), last_interaction_at=z("11-30T12:00")),
            "11-30T12:00:10",
            "11-30T12:01:30",
            id="idle",
        ),
        pytest.param(
            policy(mode="both", idle_minutes=600),
            ResetFacts(started_at=z("11-30T01:00")),
            "11-30T02:00",
            "11-30T09:00",
            id="both: boundary first",
        ),
        pytest.param(
            policy(mode="both", idle_minutes=60),
            ResetFacts(started_at=z("11-30T01:00")),
            "11-30T01:30",
            "11-30T02:00",
            id="both: idle first",
        ),
        pytest.param(policy(mode="none"), ResetFacts(started_at=EVENING), "11-30T09:10", None, id="none"),
        pytest.param(
            policy(),
            ResetFacts(started_at=EVENING, last_user_activity_at=z("11-30T09:05"), gateway_started_at=z("11-30T09:04")),
            "11-30T09:06",
            "11-30T09:06",
            id="down over the boundary: due now, not deferred",
        ),
    ],
)
def test_next_reset_at(policy_: ResetPolicy, facts: ResetFacts, now: str, expected: str | None) -> None:
    assert next_reset_at(policy_, facts, z(now)) == (z(expected) if expected else None)


instants = st.datetimes(min_value=datetime(2026, 2, 25), max_value=datetime(2026, 11, 10), timezones=st.just(UTC))


@settings(max_examples=300, deadline=None)
@given(
    mode=st.sampled_from(["daily", "idle", "both"]),
    at_hour=st.integers(0, 23),
    idle_minutes=st.floats(0.01, 3000),
    defer=st.floats(0, 120),
    now=instants,
    started_ago=st.integers(0, 4 * 24 * 3600),
    interaction_ago=st.none() | st.integers(0, 4 * 24 * 3600),
    user_ago=st.none() | st.integers(0, 3 * 3600),
)
def test_next_reset_at_is_when_the_decision_turns_due(
    mode: ResetMode,
    at_hour: int,
    idle_minutes: float,
    defer: float,
    now: datetime,
    started_ago: int,
    interaction_ago: int | None,
    user_ago: int | None,
) -> None:
    started = now - timedelta(seconds=started_ago)
    facts = ResetFacts(
        started_at=started,
        last_interaction_at=None if interaction_ago is None else max(started, now - timedelta(seconds=interaction_ago)),
        last_user_activity_at=None if user_ago is None else max(started, now - timedelta(seconds=user_ago)),
    )
    p = policy(mode=mode, at_hour=at_hour, idle_minutes=idle_minutes, defer=defer)
    when = next_reset_at(p, facts, now)
    assert when is not None and when >= now
    assert reset_decision(p, facts, when).due
    assert reset_decision(p, facts, now).due == (when == now)
    if when > now:
        just_before = max(now, when - timedelta(microseconds=1))
        assert not reset_decision(p, facts, just_before).due


SESSION = SessionSettings(
    reset=ResetSettings(mode="daily", at_hour=4),
    reset_by_type={
        "group": ResetOverride(mode="idle", idle_minutes=60),
        "cron": ResetOverride(at_hour=5),
    },
    reset_by_channel={
        "telegram": ResetOverride(mode="both", at_hour=6, timezone="Europe/Berlin"),
        "slack": ResetOverride(defer_if_active_minutes=5),
    },
)


@pytest.mark.parametrize(
    ("chat_type", "channel", "expected"),
    [
        ("direct", None, policy()),
        ("direct", "discord", policy()),
        ("group", None, policy(mode="idle", idle_minutes=60)),
        ("group", "telegram", policy(mode="both", at_hour=6, tz=BERLIN, idle_minutes=60)),
        ("direct", "telegram", policy(mode="both", at_hour=6, tz=BERLIN)),
        ("cron", "telegram", policy(mode="both", at_hour=6, tz=BERLIN)),
        ("cron", "slack", policy(at_hour=5, defer=5)),
        ("group", "slack", policy(mode="idle", idle_minutes=60, defer=5)),
    ],
)
def test_effective_policy_overrides(chat_type: str, channel: str | None, expected: ResetPolicy) -> None:
    assert effective_policy(SESSION, chat_type=chat_type, channel=channel, host_zone=NY) == expected


def test_configured_zone_beats_host_zone_and_overrides_without_zone_keep_it() -> None:
    session = SessionSettings(
        reset=ResetSettings(timezone="Asia/Tokyo"), reset_by_type={"hook": ResetOverride(at_hour=7)}
    )
    assert effective_policy(session, chat_type="hook", channel=None, host_zone=NY) == policy(at_hour=7, tz=TOKYO)


def test_daily_boundaries_lists_each_zone_and_hour_once() -> None:
    assert daily_boundaries(SESSION, host_zone=NY) == ((NY, 4), (BERLIN, 6), (NY, 5))
    assert daily_boundaries(SessionSettings(reset=ResetSettings(mode="idle")), host_zone=NY) == ()
