"""A small synchronous client for the gateway's HTTP API, used by the CLI (stdlib urllib only, so
the CLI starts fast and needs no event loop)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from config.errors import BadRequest


class ApiError(Exception):
    """The gateway answered with its JSON error body (or an HTTP error without one)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class Unreachable(Exception):
    """No answer from the gateway at all (refused, timed out, closed)."""


def key_segment(key: str) -> str:
    """A session key as one percent-encoded path segment (``/`` becomes ``%2F``)."""
    return quote(key, safe="")


class GatewayClient:
    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str | int | None] | None = None,
    ) -> Any:
        """The decoded JSON answer; raises ``ApiError`` for an error status, ``Unreachable`` when
        the gateway does not answer."""
        url = self.base_url + path
        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        data = None
        headers = {"Accept": "application/json"}
        try:
            if params:
                url += "?" + urlencode(params)
            if body is not None:
                data = json.dumps(body).encode("utf-8")
                headers["Content-Type"] = "application/json"
        except UnicodeEncodeError as exc:
            # an argument with bytes that are not UTF-8 (the shell passes them as lone surrogates)
            bad = exc.object[exc.start : exc.end].encode("utf-8", "surrogateescape")
            raise BadRequest(f"an argument holds bytes that are not UTF-8 text ({bad!r}): pass UTF-8 text") from None
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return _decode(response.read())
        except urllib.error.HTTPError as exc:
            with exc:
                raise _api_error(exc.code, exc.read(), exc.reason) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(f"cannot reach the gateway at {self.base_url}: {reason}") from None

    def get(self, path: str, **query: str | int | None) -> Any:
        return self.request("GET", path, query=query)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body=body if body is not None else {})

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def _api_error(status: int, raw: bytes, reason: str) -> ApiError:
    body = _decode(raw)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        return ApiError(status, str(error.get("code", "http_error")), str(error.get("message", reason)))
    return ApiError(status, "http_error", f"HTTP {status} {reason}")
