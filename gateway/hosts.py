"""The ``Host`` allow-list, against DNS rebinding: a web page on
``evil.example`` whose name is re-pointed at 127.0.0.1 reaches the daemon with
``Host: evil.example``, and without tokens nothing else would stop it.

Allowed: loopback names (``localhost``, ``*.localhost``, any loopback IP literal) and
``gateway.allowed_hosts``. With ``gateway.tokens`` set and no ``allowed_hosts``, the tokens guard the
API and any Host is accepted. A request without a Host header (HTTP/1.0) is not a browser's."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable

from aiohttp import hdrs, web

from config.errors import HostNotAllowed
from config.settings import GatewaySettings

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def host_name(header: str) -> str:
    """``Host`` without its port, brackets and trailing dot, lower-cased."""
    value = header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        value = value[1:end] if end > 0 else value[1:]
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def is_loopback(host: str) -> bool:
    """Whether a listen address (``[::1]`` as in a URL, or ``::1``) is a loopback one."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_address(host: str) -> str:
    """The address to bind: ``[::1]`` (as written in a URL) is ``::1``."""
    host = host.strip()
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback_name(name: str) -> bool:
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_hosts(settings: GatewaySettings) -> frozenset[str] | None:
    """The names accepted besides loopback ones; None when any Host is accepted (tokens set and
    no ``allowed_hosts``)."""
    if settings.allowed_hosts:
        return frozenset(host_name(h) for h in settings.allowed_hosts)
    return None if settings.tokens else frozenset()


def host_check(extra: Iterable[str] | None) -> Callable[[web.Request], None] | None:
    """Raises ``HostNotAllowed`` for a request whose ``Host`` is neither a loopback name nor in
    ``extra``; None when any Host is accepted (``extra`` None)."""
    if extra is None:
        return None
    names = frozenset(extra) | LOOPBACK_NAMES
    seen: dict[str, bool] = {}  # header value -> verdict; bounded, so a flood of names cannot grow it

    def check(request: web.Request) -> None:
        header = request.headers.get(hdrs.HOST)
        if header is None:
            return
        verdict = seen.get(header)
        if verdict is None:
            name = host_name(header)
            verdict = name in names or is_loopback_name(name)
            if len(seen) < 256:
                seen[header] = verdict
        if not verdict:
            raise HostNotAllowed(
                f"Host {header[:100]!r} is not allowed: without gateway.tokens only loopback names are"
                " accepted (against DNS rebinding); add the name to gateway.allowed_hosts"
            )

    return check
