"""``GET /openapi.json``: the API described, built from the router on each request (no auth)."""

from __future__ import annotations

from aiohttp import web

from gateway import openapi
from gateway.contract import operation
from gateway.http import json_response

routes = web.RouteTableDef()


@routes.get("/openapi.json")
@operation("This document", "system")
async def openapi_document(request: web.Request) -> web.Response:
    return json_response(openapi.build(request.app.router.routes()))
