"""The injected clock: every decision that depends on time takes ``now`` from one of these."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

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


def host_zone(env: Mapping[str, str]) -> ZoneInfo:
    """The host's IANA zone: ``TZ`` when it names one, else /etc/localtime's target, else UTC."""
    from pathlib import Path
    from zoneinfo import ZoneInfoNotFoundError

    candidates = [env.get("TZ", "").lstrip(":")]
    try:
        target = str(Path("/etc/localtime").resolve())
        if "zoneinfo/" in target:
            candidates.append(target.split("zoneinfo/", 1)[1])
    except OSError:
        pass
    for name in candidates:
        if name:
            try:
                return ZoneInfo(name)
            except (ZoneInfoNotFoundError, ValueError):
                continue
    return ZoneInfo("UTC")
