"""Secrets masked in what the gateway shows of its configuration (``GET /v1/admin/config``, the
console's config page, ``neotask config show``): tokens are replaced whole by the caller; here,
any string that is a URL loses the password of its user part (``https://bot:***@host``) and the
values of query parameters whose names say they are secrets (``?api_key=***``)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_SECRET_NAME = re.compile(r"token|secret|passw|key|sig|auth|credential", re.IGNORECASE)


def mask_url(value: str) -> str:
    if not _URL.match(value):
        return value
    try:
        parts = urlsplit(value)
        password = parts.password
    except ValueError:
        return value
    netloc = parts.netloc
    if password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.split(':', 1)[0]}:{MASK}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_NAME.search(name) for name, _ in pairs):
            query = urlencode([(n, MASK if _SECRET_NAME.search(n) else v) for n, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def mask_secrets(data: Any) -> Any:
    """``data`` (JSON-like) with every URL string masked (a new structure)."""
    if isinstance(data, dict):
        return {k: mask_secrets(v) for k, v in data.items()}
    if isinstance(data, list):
        return [mask_secrets(v) for v in data]
    if isinstance(data, str):
        return mask_url(data)
    return data
