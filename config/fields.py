"""The checks several configuration sections' fields share: a time zone, an http(s) URL, an
environment variable's name."""

from __future__ import annotations

import re
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


def check_zone(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {value!r}; use an IANA name such as Europe/Berlin") from exc
    return value


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_url(value: str | None) -> str | None:
    """An http(s) URL with a host (``http://127.0.0.1:11434/v1``); null or "" means none."""
    if not value:
        return value
    how = "write it whole, e.g. http://127.0.0.1:11434/v1 or https://example.com/hook"
    if any(c.isspace() for c in value):
        raise ValueError(f"{value!r} is not a URL: it contains a space; {how}")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (a port that is not a number raises here)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a URL ({exc}); {how}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{value!r} is not an http:// or https:// URL; {how}")
    if not parts.hostname:
        raise ValueError(f"{value!r} names no host; {how}")
    return value


def check_env_name(value: str | None) -> str | None:
    if value is not None and not _ENV_NAME.match(value):
        raise ValueError(f"{value!r} is not an environment variable name (letters, digits, _; e.g. OPENAI_API_KEY)")
    return value
