"""HTTP plumbing shared by every route: request ids, the one error middleware, bearer auth, and
JSON body reading with the size limit. Domain code raises ``NeotaskError``; only this module
turns errors into responses."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import math
import re
import sys
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import orjson
from aiohttp import web, web_protocol
from pydantic import BaseModel, ConfigDict, ValidationError

from config.errors import (
    BadRequest,
    InvalidBody,
    MethodNotAllowed,
    NeotaskError,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    Unauthorized,
)

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    """A route's body model: an unknown field is a 400, not silently dropped."""

    model_config = ConfigDict(extra="forbid")

REQUEST_ID = web.RequestKey("request_id", str)
_ID_PREFIX = uuid.uuid4().hex[:12]  # unique per process; a counter makes each request's id cheap
_ID_COUNTER = itertools.count(1)
SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")
_DRAIN_LIMIT = 64 * 1024 * 1024  # an oversized body is read and dropped up to this, then the connection closes


def error_body(code: str, message: str, request_id: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "request_id": request_id, **extra}}


_RESPONSE_ENCODER = json.JSONEncoder(ensure_ascii=False)  # what json.dumps(ensure_ascii=False) builds per call


def json_response(data: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        text=_RESPONSE_ENCODER.encode(data),
        status=status,
        content_type="application/json",
        headers=headers,
    )


_JSON_HEADERS = {"Content-Type": "application/json; charset=utf-8"}  # what json_response's text= sets


def message_response(body: Mapping[str, Any]) -> web.Response:
    """The 200 answer of the message routes, encoded by orjson: the same values and field order
    as ``json_response`` without the spaces after ``,`` and ``:`` (JSON whitespace is no
    contract), about a quarter of its cost. An answer with events (which may hold floats, which
    orjson writes differently: ``1e16`` for ``1e+16``) or that orjson refuses (integers beyond
    64 bits, lone surrogates) goes through ``json_response``."""
    if not body.get("events"):
        try:
            return web.Response(body=orjson.dumps(body), headers=_JSON_HEADERS)
        except (orjson.JSONEncodeError, TypeError):
            pass
    return json_response(body)


# aiohttp's own refusals (no route, wrong method, ...) answered with the code of our class for that status
FRAMEWORK_ERRORS: dict[int, tuple[type[NeotaskError], str]] = {
    400: (InvalidBody, "the request could not be parsed"),
    401: (Unauthorized, "send Authorization: Bearer <token>"),
    404: (NotFound, "no such route; see GET /openapi.json for the API"),
    405: (MethodNotAllowed, "this route does not take that method; see GET /openapi.json"),
    413: (PayloadTooLarge, "the body is larger than gateway.max_body_bytes"),
}


def framework_error(exc: web.HTTPException) -> tuple[str, str, dict[str, str]]:
    """(code, message, headers to keep) of an aiohttp refusal; ``http_error`` for a status no
    class stands for (aiohttp raises none of those on the gateway's routes)."""
    known = FRAMEWORK_ERRORS.get(exc.status)
    code, hint = (known[0].code, known[1]) if known else ("http_error", exc.reason)
    message = hint if exc.status in (404, 405) else f"{exc.reason}: {hint}"
    return code, message, {k: v for k, v in exc.headers.items() if k.lower() == "allow"}


def retry_headers(exc: NeotaskError) -> dict[str, str] | None:
    """``Retry-After`` (whole seconds, at least 1) when the error says when to retry."""
    retry = exc.extra.get("retry_after_s")
    return {"Retry-After": str(max(1, math.ceil(retry)))} if isinstance(retry, int | float) else None


def request_id_from(given: str | None) -> str:
    """The caller's ``X-Request-Id`` when it is sane (1 to 128 of ``A-Z a-z 0-9 . _ : / + = @ -``:
    it is echoed in a header and written in log lines), else a fresh one."""
    if given and SANE_REQUEST_ID.fullmatch(given):
        return given
    return f"{_ID_PREFIX}{next(_ID_COUNTER):06x}"


def new_request_id(request: web.Request) -> str:
    """The client's ``X-Request-Id`` (when sane), else a fresh one; kept on the request for error
    bodies, the ``X-Request-Id`` of the answer and the log lines of the request."""
    request_id = request_id_from(request.headers.get("X-Request-Id"))
    request[REQUEST_ID] = request_id
    return request_id


def error_answer(request: web.Request, request_id: str, exc: Exception) -> web.Response:
    """The gateway's error body for what a handler raised (``web.HTTPException`` below 400 is
    re-raised: aiohttp sends redirects itself)."""
    if isinstance(exc, NeotaskError):
        if exc.status >= 500:
            log.warning("%s %s -> %s %s: %s", request.method, request.path, exc.status, exc.code, exc.message)
        body = error_body(exc.code, exc.message, request_id, **exc.extra)
        return json_response(body, status=exc.status, headers=retry_headers(exc))
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        code, message, headers = framework_error(exc)
        return json_response(error_body(code, message, request_id), status=exc.status, headers=headers)
    if isinstance(exc, ConnectionError):  # the client went away: nothing failed here, nobody reads this
        log.debug("%s %s: the client went away (%s)", request.method, request.path, exc)
    else:
        log.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
    body = error_body(NeotaskError.code, NeotaskError.doc, request_id)
    return json_response(body, status=NeotaskError.status)


def auth_check(tokens: tuple[str, ...]) -> Callable[[web.Request], None] | None:
    """Raises ``Unauthorized`` for a request that needs a token and offers none of ``tokens``;
    None when no tokens are configured (nothing to check)."""
    if not tokens:
        return None
    encoded = [t.encode() for t in tokens]

    def check(request: web.Request) -> None:
        if _needs_token(request.path):
            offered = _offered_token(request)
            if offered is None or not any(hmac.compare_digest(offered.encode(), t) for t in encoded):
                raise Unauthorized(
                    "missing or wrong bearer token: send 'Authorization: Bearer <token>' with one of gateway.tokens"
                )

    return check


def _needs_token(path: str) -> bool:
    return path.startswith("/v1/") or path == "/metrics"


def _offered_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    if request.path == "/v1/events":
        return request.query.get("access_token")
    return None


BODY_TIMEOUT = web.AppKey("body_timeout_s", float)


async def read_body(request: web.Request, limit: int) -> bytes:
    """The raw body, at most ``limit`` bytes; a larger one is drained (so the client reads our
    answer) and refused with 413. The whole body must arrive within ``gateway.body_timeout_s``
    (408 ``request_timeout`` otherwise: a slow sender cannot hold a connection and a handler)."""
    if request.content.is_eof():  # the whole body came with the head: nothing to wait for, no timer
        return await _read_body(request, limit)
    seconds = request.app.get(BODY_TIMEOUT)
    try:
        async with asyncio.timeout(seconds):
            return await _read_body(request, limit)
    except TimeoutError:
        raise RequestTimeout(
            f"the request body did not arrive within {seconds:g} s (gateway.body_timeout_s); send it at once"
        ) from None
    except ConnectionResetError:  # the client went away, or the connection guard closed a slow body
        raise InvalidBody("the connection closed before the whole body arrived; send it again") from None


async def _read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        await _drain(request)
        raise PayloadTooLarge(
            f"the body is {request.content_length} bytes; the limit is {limit} (gateway.max_body_bytes)"
        )
    if request.content_length is not None and "Content-Encoding" not in request.headers:
        try:  # the common case, read at once (the length was checked above; aiohttp stops at it)
            return await request.read()
        except web_protocol.RequestPayloadError as exc:
            raise InvalidBody(f"the body could not be read: {str(exc).strip()}") from None
    chunks, size = [], 0
    try:
        async for chunk in request.content.iter_chunked(65536):
            size += len(chunk)
            if size > limit:
                await _drain(request)
                raise PayloadTooLarge(f"the body is over the limit of {limit} bytes (gateway.max_body_bytes)")
            chunks.append(chunk)
    except web_protocol.RequestPayloadError as exc:  # e.g. a body its Content-Encoding does not decode
        encoding = request.headers.get("Content-Encoding") or "none"
        raise InvalidBody(f"the body could not be read (Content-Encoding {encoding}): {str(exc).strip()}") from None
    return b"".join(chunks)


async def _drain(request: web.Request) -> None:
    drained = 0
    with contextlib.suppress(web_protocol.RequestPayloadError):
        async for chunk in request.content.iter_chunked(65536):
            drained += len(chunk)
            if drained > _DRAIN_LIMIT:
                break


async def read_json(request: web.Request, limit: int) -> Any:
    body = await read_body(request, limit)
    return decode_json(body, content_type_of(request))


def content_type_of(request: web.Request) -> str:
    """The body's media type; empty when the request has no Content-Type (aiohttp's
    ``content_type`` says application/octet-stream then, and the error named that)."""
    return request.content_type if request.headers.get("Content-Type", "").strip() else ""


def decode_json(body: bytes, content_type: str, *, hint: str = "") -> Any:
    """The JSON value of a request body, or BadRequest ``invalid_body``: a wrong content type,
    invalid UTF-8, an empty body, invalid JSON, nesting too deep to parse, or a ``\\u`` escape of
    an unpaired surrogate (no UTF-8 file can store it). ``hint`` is added to the content-type error."""
    if content_type != "application/json":
        if not content_type:
            raise InvalidBody(f"the request has no Content-Type: send Content-Type: application/json{hint}")
        raise InvalidBody(f"content type must be application/json, not {content_type}{hint}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidBody(f"the body is not valid UTF-8 (byte {exc.start})") from None
    if not text.strip():
        raise InvalidBody("the body is empty; send a JSON object")
    try:
        data = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise InvalidBody(f"the body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise InvalidBody("the body's JSON is nested too deeply") from None
    except ValueError as exc:  # _no_constant, _finite, or an integer past Python's digit limit
        digits = sys.get_int_max_str_digits()
        message = str(exc) if isinstance(exc, _NotJson) else f"the body holds an integer of more than {digits:,} digits"
        raise InvalidBody(f"{message}; send a finite number of a sane size, null, or a string") from None
    if _SURROGATE_ESCAPE.search(text) and not _encodable(data):
        raise InvalidBody(
            "the body has a \\u escape of an unpaired surrogate (\\ud800-\\udfff); send the character itself"
            " or a complete surrogate pair",
        )
    return data


class _NotJson(ValueError):
    pass


def _no_constant(name: str) -> Any:
    """``NaN``, ``Infinity`` and ``-Infinity``, which Python's parser takes and JSON has not: stored,
    they would be served back as invalid JSON (a browser's JSON.parse refuses the answer)."""
    raise _NotJson(f"the body holds {name}, which is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: valid JSON, but no double holds it (it would come back as Infinity)
        raise _NotJson(f"the body holds the number {text[:40]}, too large for a double")
    return value


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _encodable(data: Any) -> bool:
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    except RecursionError:  # as deep as the parser allowed but not the encoder: cannot be stored either
        return False
    return True


async def parse_body(request: web.Request, model: type[M], limit: int, *, optional: bool = False) -> M:
    """The body validated by ``model``. ``optional``: no body at all (zero bytes, whatever the
    content type) means the model's defaults, as /openapi.json documents for that route."""
    if optional:
        body = await read_body(request, limit)
        data = decode_json(body, content_type_of(request)) if body else {}
    else:
        data = await read_json(request, limit)
    return validate(model, json_object(data))


async def read_object(request: web.Request, limit: int) -> dict[str, Any]:
    """The body's JSON object, not yet validated (``parse_body`` without the model)."""
    return json_object(await read_json(request, limit))


def json_object(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InvalidBody("the body must be a JSON object")
    return data


def validate(model: type[M], data: Any) -> M:
    """``data`` (decoded JSON) as ``model``, in pydantic's strict mode: a value of the wrong JSON type
    is refused, not converted (lax mode took ``"yes"`` and ``1`` for true, ``"5"`` for 5 and ``2.0``
    for 2; ``{"force": "yes"}`` rebuilt a whole memory index). An integer is still a number."""
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as exc:
        errors = _errors(exc)
        first = ".".join(str(p) for p in errors[0]["loc"]) or None if errors else None
        raise BadRequest(_describe(errors), field=first) from None


# the strict mode's wrong-type errors: the message names what was sent instead
_TYPE_ERRORS = frozenset(
    ("bool_type", "int_type", "float_type", "string_type", "dict_type", "list_type", "model_type", "literal_error")
)


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {json.dumps(value)}"
    if isinstance(value, (int, float)):
        shown = json.dumps(value)
        return f"the number {shown if len(shown) <= 40 else shown[:40] + '...'}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:40] + "..."
        return f"the string {json.dumps(shown, ensure_ascii=False)}"
    return "an array" if isinstance(value, list) else "an object"


# a union member's tag in an error's location (``str``, ``dict[str,any]``, ``list[dict[str,any]]``,
# ``function-before[...]``), never a body field's name
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|bytes|dict|list|tuple|set)(\[.*\])?$|^[a-z][a-z-]*\[.*\]$")


def _errors(exc: ValidationError) -> list[dict[str, Any]]:
    """pydantic's errors located by field, without the members of a union (``input.str`` is
    ``input``), and a union's wrong-type errors as one: ``tool_choice: 5`` fails each member of
    ``str | dict``; it is one field. Errors of two fields or two list items are never merged."""
    out: list[dict[str, Any]] = []
    for details in exc.errors():
        loc = tuple(details["loc"])
        where = tuple(p for p in loc if not (isinstance(p, str) and _UNION_TAG.match(p)))
        last = out[-1] if out else None
        if (
            last is not None
            and where != loc  # this one is a member of a union
            and last["member"]
            and details["type"] in _TYPE_ERRORS
            and last["type"] in _TYPE_ERRORS
            and tuple(last["loc"]) == where
            and details["input"] is last["input"]
        ):
            last["msg"] += " or " + details["msg"].removeprefix("Input should be ")
            continue
        err: dict[str, Any] = {**details, "loc": where, "member": where != loc}
        out.append(err)
    return out


def describe_validation(exc: ValidationError) -> str:
    return _describe(_errors(exc))


def _describe(errors: list[dict[str, Any]]) -> str:
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown field '{where}'")
        elif err["type"] == "missing":
            parts.append(f"missing field '{where}'")
        elif err["type"] in _TYPE_ERRORS:
            parts.append(f"field '{where}': {err['msg']}, not {_json_kind(err['input'])}")
        else:
            parts.append(f"field '{where}': {err['msg']}")
    return "; ".join(parts) + " (see GET /openapi.json for the accepted fields)"
