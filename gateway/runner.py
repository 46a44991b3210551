"""The app runner the daemon uses: aiohttp's own, except that the errors its HTTP parser answers
before any route or middleware runs (a header over 8 KB, a request line over 8,190 bytes, an
obs-fold header, a malformed request) carry the JSON error body of every other error.

aiohttp has no public hook for these: the parser's errors go to ``RequestHandler.handle_error``,
which answers plain text. The runner's server makes its connection handlers of a subclass that
answers JSON instead; closing the connection is aiohttp's. A client's mistake (a malformed
request) is logged at INFO and a client that went away at DEBUG, each in one line: aiohttp logs
both at ERROR with a traceback, as if the gateway had failed.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from aiohttp import http_exceptions, web, web_protocol, web_request

from config.errors import InvalidBody, NeotaskError, PayloadTooLarge
from gateway.http import error_body, json_response, request_id_from

_ERRORS: dict[int, type[NeotaskError]] = {400: InvalidBody, 413: PayloadTooLarge}
_HINT = "the request could not be parsed as HTTP/1.1 (headers at most 8190 bytes each, no obs-fold)"


def client_fault(exc: BaseException | None) -> str | None:
    """``malformed`` for a request the client got wrong, ``gone`` for a connection it dropped,
    None for anything else (the gateway's own failure)."""
    if isinstance(exc, http_exceptions.HttpProcessingError) and 400 <= (exc.code or 500) < 500:
        return "malformed"
    if isinstance(exc, ConnectionError):
        return "gone"
    return None


def one_line(exc: BaseException) -> str:
    text = exc.message if isinstance(exc, http_exceptions.HttpProcessingError) else str(exc)
    first = next((line.strip() for line in str(text).splitlines() if line.strip()), "")
    return first or type(exc).__name__


class JsonErrorHandler(web_protocol.RequestHandler):
    __slots__ = ()

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        fault = client_fault(exc if isinstance(exc, BaseException) else None)
        if fault is None or not isinstance(exc, BaseException):
            super().log_exception(*args, **kw)
            return
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        where = peer[0] if isinstance(peer, tuple) and peer else "a client"
        if fault == "malformed":
            self.logger.info("bad request from %s (answered 400): %s", where, one_line(exc))
        else:
            self.logger.debug("%s went away: %s", where, one_line(exc))

    def handle_error(
        self,
        request: web_request.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        plain = super().handle_error(request, status, exc, message)  # logs it; raises if a response began
        code = _ERRORS.get(status, NeotaskError if status >= 500 else InvalidBody).code
        if status >= 500:
            text = NeotaskError.doc
        else:
            reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Bad Request"
            detail = (message or "").strip().splitlines()[0] if message and message.strip() else _HINT
            text = f"{reason}: {detail}; {_HINT}"
        request_id = request_id_from(request.headers.get("X-Request-Id"))
        response = json_response(error_body(code, text, request_id), status=plain.status)
        response.headers["X-Request-Id"] = request_id
        response.force_close()
        return response


class JsonErrorServer(web.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        kwargs: dict[str, Any] = self._kwargs
        return JsonErrorHandler(self, loop=self._loop, **kwargs)


class JsonErrorsAppRunner(web.AppRunner):
    """``web.AppRunner`` whose parser errors answer ``{"error": {"code", "message", "request_id"}}``."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = JsonErrorServer  # the same server, handing out JSON-answering handlers
        return server
