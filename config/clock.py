"""The injected clock: every decision that depends on time takes ``now`` from one of these."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    """Aware UTC now; the only place the wall clock is read."""
    return datetime.now(UTC)


def iso(dt: datetime) -> str:
    """ISO 8601 with offset, as every stored timestamp is written."""
    return dt.astimezone(UTC).isoformat()


def parse_iso(text: str) -> datetime:
    dt = datetime.fromisoformat(text)
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)
