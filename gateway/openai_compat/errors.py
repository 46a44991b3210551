"""OpenAI's error shape on the OpenAI-compatible routes.

``{"error": {"message", "type", "code", "param"}}`` is what OpenAI clients parse; the gateway's
own ``request_id`` (and any extra fields, e.g. ``message_seq``) ride along, so the body is also the
gateway's usual error body. The middleware sits inside the gateway's error middleware and outside
auth, so a missing token gets this shape too.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from config.errors import NeotaskError
from gateway.http import REQUEST_ID, Handler, framework_error, json_response, retry_headers

log = logging.getLogger(__name__)

PATHS = ("/v1/chat/completions", "/v1/responses", "/v1/models")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def is_compat(path: str) -> bool:
    return path in PATHS or path.startswith("/v1/models/")


def error_type(status: int) -> str:
    return _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def openai_error(
    status: int, code: str, message: str, request_id: str, param: str | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": error_type(status),
            "code": code,
            "param": param,
            "request_id": request_id,
            **extra,
        }
    }


def from_exception(exc: NeotaskError, request_id: str) -> dict[str, Any]:
    extra = dict(exc.extra)
    param = extra.pop("param", None) or extra.get("field")
    return openai_error(exc.status, exc.code, exc.message, request_id, param, **extra)


@web.middleware
async def openai_errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not is_compat(request.path):
        return await handler(request)
    request_id = request[REQUEST_ID]
    try:
        return await handler(request)
    except NeotaskError as exc:
        if exc.status >= 500:
            log.warning("%s %s -> %s %s: %s", request.method, request.path, exc.status, exc.code, exc.message)
        return json_response(from_exception(exc, request_id), status=exc.status, headers=retry_headers(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code, message, headers = framework_error(exc)
        return json_response(openai_error(exc.status, code, message, request_id), status=exc.status, headers=headers)
