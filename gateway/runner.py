"""The app runner the daemon uses: aiohttp's own, except that the errors its HTTP parser answers
before any route or middleware runs (a header over 8 KB, a request line over 8,190 bytes, an
obs-fold header, a malformed request) carry the JSON error body of every other error.

aiohttp has no public hook for these: the parser's errors go to ``RequestHandler.handle_error``,
which answers plain text. The runner's server makes its connection handlers of a subclass that
answers JSON instead; everything else (logging, closing the connection) is aiohttp's.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from aiohttp import web, web_protocol, web_request

from config.errors import InvalidBody, NeotaskError, PayloadTooLarge
from gateway.http import error_body, json_response, request_id_from

_ERRORS: dict[int, type[NeotaskError]] = {400: InvalidBody, 413: PayloadTooLarge}
_HINT = "the request could not be parsed as HTTP/1.1 (headers at most 8190 bytes each, no obs-fold)"


class JsonErrorHandler(web_protocol.RequestHandler):
    __slots__ = ()

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
