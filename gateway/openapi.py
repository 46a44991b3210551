"""The OpenAPI 3.1 document of the gateway (``GET /openapi.json``): an assembler, nothing more.

The path list comes from the app's router when the document is built, so it can never miss a
registered route; what each route takes and answers comes from the ``@operation`` beside its handler
(gateway/contract.py): its pydantic body model, its ``Param`` objects, its answer schema and its
error classes (config/errors.py), the same objects the handler validates and fails with. A
registered route whose handler has no ``@operation`` is still listed, with a generic description
and ``x-undescribed: true``.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import hdrs, web
from pydantic import BaseModel

from config.errors import (
    BadRequest,
    HostNotAllowed,
    InvalidBody,
    MethodNotAllowed,
    NeotaskError,
    PayloadTooLarge,
    RequestTimeout,
    TooManyBodyReads,
    Unauthorized,
    error_classes,
)
from gateway.contract import (
    PATH_ERRORS,
    PATH_PARAMS,
    STR,
    Answer,
    Errors,
    Operation,
    Param,
    Schema,
    operation_of,
    ref,
)
from gateway.http import _needs_token as needs_token

BODY_ERRORS: Errors = (InvalidBody, BadRequest, PayloadTooLarge, RequestTimeout, TooManyBodyReads)
EVERY_ROUTE_ERRORS: Errors = (MethodNotAllowed, NeotaskError, HostNotAllowed)
METHODS_OF_ANY = ("get", "post", "put", "patch", "delete")


def error_catalogue() -> dict[str, type[NeotaskError]]:
    """Every code an HTTP answer can carry, by code (the classes of config/errors.py)."""
    return error_classes()


def route_list(routes: Iterable[web.AbstractRoute]) -> list[tuple[str, str, Any]]:
    """(METHOD, path template, handler) of every route, ``*`` spread over the usual methods."""
    out: list[tuple[str, str, Any]] = []
    for route in routes:
        resource = route.resource
        if resource is None:
            continue
        path = resource.canonical
        if isinstance(resource, web.StaticResource):
            path = path.rstrip("/") + "/{filename}"
        methods = [m.upper() for m in METHODS_OF_ANY] if route.method == hdrs.METH_ANY else [route.method]
        out.extend((method, path, route.handler) for method in methods)
    return out


def build(routes: Iterable[web.AbstractRoute], *, title: str = "Neotask gateway", version: str = "0.1.0") -> Schema:
    """The OpenAPI 3.1 document for these routes (``app.router.routes()``)."""
    schemas: dict[str, Schema] = {"Object": {"type": "object"}, "Error": error_schema()}
    paths: dict[str, dict[str, Any]] = {}
    seen_ids: set[str] = set()
    for method, path, handler in sorted(route_list(routes), key=lambda r: (r[1], r[0] == "HEAD", r[0])):
        operation = _operation(method, path, operation_of(handler), schemas)
        name = getattr(handler, "__name__", "handler")
        op_id = f"head_{name}" if method == "HEAD" else name
        while op_id in seen_ids:
            op_id += "_"
        seen_ids.add(op_id)
        operation["operationId"] = op_id
        paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": INFO},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": SECURITY_SCHEMES},
    }


def _operation(method: str, path: str, op: Operation | None, schemas: dict[str, Schema]) -> Schema:
    names = re.findall(r"{(\w+)(?::[^}]*)?}", path)
    described = op is not None
    if op is None:
        op = Operation(
            f"{method} {path}",
            path.strip("/").split("/")[1 if path.startswith("/v1/") else 0] or "other",
            "Registered but not described yet: put an @operation (gateway/contract.py) on its handler.",
            body={"type": "object"} if method in ("POST", "PUT", "PATCH") else None,
            body_required=False,
        )
    head = method == "HEAD"
    operation: Schema = {"summary": f"Headers of: {op.summary}" if head else op.summary, "tags": [op.tag]}
    if op.description:
        operation["description"] = op.description
    if not described:
        operation["x-undescribed"] = True
    params = [PATH_PARAMS.get(n, Param(n, n, "path", True)) for n in names] + list(op.params)
    if params:
        operation["parameters"] = [_param(p) for p in params]
    body = op.body if not head else None
    if body is not None:
        operation["requestBody"] = {
            "required": op.body_required,
            "content": {"application/json": {"schema": _body(body, schemas)}},
        }
    errors: set[type[NeotaskError]] = {*op.errors, *EVERY_ROUTE_ERRORS}
    errors.update(e for n in names for e in PATH_ERRORS.get(n, ()))
    if body is not None:
        errors.update(BODY_ERRORS)
    if needs_token(path):
        errors.add(Unauthorized)
        operation["security"] = (
            [{"bearerAuth": []}, {"accessToken": []}] if path == "/v1/events" else [{"bearerAuth": []}]
        )
    else:
        operation["security"] = []
    operation["responses"] = _responses(op, errors, head, schemas)
    return operation


def _param(p: Param) -> Schema:
    return {"name": p.name, "in": p.where, "required": p.required, "description": p.description, "schema": p.schema}


def _body(body: type[BaseModel] | Schema, schemas: dict[str, Schema]) -> Schema:
    if isinstance(body, dict):
        return body
    schema = copy.deepcopy(_model_schema(body))
    schemas.update(schema.pop("$defs", {}))
    schemas[body.__name__] = schema
    return ref(body.__name__)


@functools.cache
def _model_schema(model: type[BaseModel]) -> Schema:
    """Pydantic's schema generation is most of the build time, and a model never changes."""
    return model.model_json_schema(ref_template="#/components/schemas/{model}")


def _component(answer: Answer, schemas: dict[str, Schema]) -> Schema:
    """The answer's ``$ref``, with the answer (and the answers it names) added to the components."""
    known = schemas.setdefault(answer.name, answer.schema)
    assert known is answer.schema or known == answer.schema, f"two answers named {answer.name}"
    for part in answer.parts:
        _component(part, schemas)
    return answer.ref


def _responses(op: Operation, errors: set[type[NeotaskError]], head: bool, schemas: dict[str, Schema]) -> Schema:
    ok: Schema = {"description": "success"}
    if op.answer is not None:
        ok["content"] = {"application/json": {"schema": _component(op.answer, schemas)}}
    elif op.media != "application/json":
        ok["content"] = {op.media: {"schema": STR}}
    if op.stream is not None:
        ok["description"] = f"the answer; with `stream: true` server-sent events instead (see `{op.stream.name}`)"
        ok.setdefault("content", {})["text/event-stream"] = {"schema": _component(op.stream, schemas)}
    responses: Schema = {str(op.status): ok}
    for status, answer, description in op.extra_answers:
        content = {"application/json": {"schema": _component(answer, schemas)}}
        responses[str(status)] = {"description": description, "content": content}
    by_status: dict[int, list[type[NeotaskError]]] = {}
    for error in sorted(errors, key=lambda e: e.code):
        by_status.setdefault(error.status, []).append(error)
    for status, classes in sorted(by_status.items()):
        if str(status) in responses:
            continue
        codes = [e.code for e in classes]
        schema: Schema = {"allOf": [ref("Error"), {"properties": {"error": {"properties": {"code": {"enum": codes}}}}}]}
        responses[str(status)] = {
            "description": "; ".join(f"`{e.code}`: {e.doc}" for e in classes),
            "x-error-codes": codes,
            "content": {"application/json": {"schema": schema}},
        }
    if head:
        responses = {k: {"description": v["description"]} for k, v in responses.items()}
    return responses


def error_codes(document: Mapping[str, Any]) -> set[str]:
    """Every error code the document mentions (for tests and clients)."""
    return {
        code
        for item in document["paths"].values()
        for operation in item.values()
        for response in operation["responses"].values()
        for code in response.get("x-error-codes", ())
    }


def errors_markdown() -> str:
    """The table of docs/errors.md: every HTTP error code, its status, its class and its meaning."""
    rows = ["| status | code | class | meaning |", "|---|---|---|---|"]
    for code, cls in sorted(error_catalogue().items(), key=lambda item: (item[1].status, item[0])):
        rows.append(f"| {cls.status} | `{code}` | `{cls.__name__}` | {cls.doc} |")
    return "\n".join(rows) + "\n"


def error_schema() -> Schema:
    return {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "request_id"],
                "properties": {
                    "code": {"type": "string", "enum": sorted(error_catalogue())},
                    "message": {"type": "string", "description": "what was wrong and how to fix it"},
                    "request_id": STR,
                    "field": {"type": "string", "description": "invalid_field: the field"},
                    "rule": {"type": "string", "description": "invalid_key: the rule broken"},
                    "message_seq": {
                        "type": "integer",
                        "description": "provider_error, turn_failed, shutting_down: seq of the stored message",
                    },
                    "stored": {
                        "const": True,
                        "description": "provider_error, turn_failed, shutting_down: the message is stored",
                    },
                    "kind": {"type": "string", "description": "provider_error: the kind of failure"},
                    "retry_after_s": {"type": "number", "description": "session_busy: when to retry"},
                    "type": {"type": "string", "description": "OpenAI-compatible routes: OpenAI's error type"},
                    "param": {
                        "type": ["string", "null"],
                        "description": "OpenAI-compatible routes: the parameter at fault, else null",
                    },
                },
            }
        },
    }


SECURITY_SCHEMES: Schema = {
    "bearerAuth": {"type": "http", "scheme": "bearer", "description": "one of `gateway.tokens`"},
    "accessToken": {"type": "apiKey", "in": "query", "name": "access_token", "description": "GET /v1/events only"},
}
INFO = (
    "The Neotask gateway API (SPEC section 8). Every error answers "
    '`{"error": {"code", "message", "request_id"}}`; each operation lists the codes it can return. '
    "When `gateway.tokens` is set, `/v1/*` and `/metrics` need `Authorization: Bearer <token>`; "
    "`/hooks/*`, `/healthz`, `/readyz`, `/openapi.json` and `/ui` do not. Any unknown path answers 404 "
    "`not_found`. A session key travels as one percent-encoded path segment (`/` as %2F). Every answer carries "
    "`X-Request-Id`: the caller's own when it is 1 to 128 of `A-Z a-z 0-9 . _ : / + = @ -`, else a fresh one; "
    "it is the error's `request_id` and names the gateway's log lines of that request."
)


if __name__ == "__main__":  # python -m gateway.openapi > the table of docs/errors.md
    import gateway.app  # noqa: F401  (every route module and error class loaded)

    print(errors_markdown(), end="")
