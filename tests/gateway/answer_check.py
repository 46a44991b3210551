"""Every JSON answer a gateway test receives, checked against what ``/openapi.json`` documents for
that route and status.

The check is a middleware outside the gateway's own (so it sees the answers errors render into):
it finds the route's path template, looks up the documented response for the status and validates
the body with the document's components beside it. A mismatch is recorded on the app and fails the
test at teardown (``tests/gateway/conftest.py``): the document is the contract clients generate
code from, so an answer it does not describe is a bug in one of the two.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

import jsonschema
from aiohttp import web

from gateway import openapi

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MISMATCHES = web.AppKey("answer_mismatches", list)
_STATE = web.AppKey("answer_state", dict)  # {"document": ..., "validators": {...}}, filled on first use


def _document(app: web.Application) -> dict[str, Any]:
    state: dict[str, Any] = app[_STATE]
    if state.get("document") is None:
        state["document"] = openapi.build(list(app.router.routes()))
    document: dict[str, Any] = state["document"]
    return document


def _validator(app: web.Application, where: tuple[str, str, str, str]) -> jsonschema.protocols.Validator | None:
    """The validator of the answer ``where`` = (path, method, status, media), None when the
    document names no JSON schema for it."""
    cache: dict[tuple[str, str, str, str], Any] = app[_STATE]["validators"]
    if where in cache:
        return cache[where]  # type: ignore[no-any-return]
    document = _document(app)
    path, method, status, media = where
    responses = document["paths"].get(path, {}).get(method, {}).get("responses", {})
    schema = responses.get(status, {}).get("content", {}).get(media, {}).get("schema")
    validator = None
    if schema is not None:
        rooted = _closed({**schema, "components": document["components"]})
        validator = jsonschema.Draft202012Validator(rooted)
    cache[where] = validator
    return validator


def _documented_statuses(app: web.Application, path: str, method: str) -> set[str]:
    return set(_document(app)["paths"].get(path, {}).get(method, {}).get("responses", {}))


@web.middleware
async def check_answers(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # aiohttp's own (404 of no route, 405): not a documented route
        raise exc
    route = request.match_info.route
    resource = route.resource
    if resource is None or isinstance(resource, web.StaticResource) or request.match_info.http_exception:
        return response
    path, method, status = resource.canonical, request.method.lower(), str(response.status)
    if method == "head":
        return response
    if not isinstance(response, web.Response) or response.content_type != "application/json":
        return response
    mismatches: list[str] = request.app[MISMATCHES]
    if status not in _documented_statuses(request.app, path, method):
        mismatches.append(f"{request.method} {path} answered {status}, which the document does not list")
        return response
    validator = _validator(request.app, (path, method, status, "application/json"))
    body = response.body
    if validator is None or not isinstance(body, bytes | bytearray) or not body:
        return response
    answer = json.loads(body)
    for error in validator.iter_errors(answer):
        where = "/".join(str(p) for p in error.absolute_path) or "(top)"
        mismatches.append(f"{request.method} {path} {status} at {where}: {error.message[:300]}")
        if os.environ.get("NEOTASK_ANSWER_LOG"):  # a file to gather mismatches across a whole run
            with open(os.environ["NEOTASK_ANSWER_LOG"], "a") as log:
                log.write(mismatches[-1] + "\n")
    return response


def install(app: web.Application) -> web.Application:
    """``app`` with the check as its outermost middleware."""
    app[MISMATCHES] = []
    app[_STATE] = {"document": None, "validators": {}}
    app.middlewares.insert(0, check_answers)
    return app


def _closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` wherever it lists properties and says nothing
    of others: a field an answer carries that the document does not name is a mismatch too. (The
    published document leaves objects open, so clients tolerate fields added later.)"""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    # allOf members are closed each on its own terms, which would refuse what another member names
    out = {k: (v if k == "allOf" else _closed(v)) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out
