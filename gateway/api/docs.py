"""``GET /openapi.json``: the API described, built from the router (no auth).

The router is frozen once the app runs, so the document is built once per app, on a thread (the
first build generates the body models' schemas), and served from then on."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from aiohttp import web

from gateway import openapi
from gateway.contract import operation
from gateway.http import json_response

routes = web.RouteTableDef()
_BUILT: dict[int, tuple[weakref.ref[web.UrlDispatcher], dict[str, Any]]] = {}  # id(router): (router, document)


@routes.get("/openapi.json")
@operation("This document", "system")
async def openapi_document(request: web.Request) -> web.Response:
    router = request.app.router
    built = _BUILT.get(id(router))
    if built is not None and built[0]() is router:
        return json_response(built[1])
    document = await asyncio.to_thread(openapi.build, list(router.routes()))
    if router.frozen:
        key = id(router)
        _BUILT[key] = (weakref.ref(router, lambda _: _BUILT.pop(key, None)), document)
    return json_response(document)
