"""The web console (SPEC section 11): ``GET /ui`` and its static files from ``gateway/static``.

These routes need no token (SPEC section 8): the page asks for one and sends it on its own calls
to ``/v1/*``. The console uses only the public HTTP API; the one thing the page is told at load is
whether tokens are configured, so it asks for one before its first call instead of after a 401.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from aiohttp import web

from config.errors import NotFound
from gateway import keys as K
from gateway.contract import operation

routes = web.RouteTableDef()
STATIC = Path(__file__).resolve().parent.parent / "static"
INDEX = "index.html"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
# One flat folder of plain names: nothing else (no dot-files, no sub-paths, no "..") is ever served.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\.(?:html|js|css|svg|png)")
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
}
_HTML_TAG = '<html lang="en">'


@routes.get("/ui")
@operation("The web console", "ui", answer=None, media="text/html")
async def console_page(request: web.Request) -> web.Response:
    return await _index(request)


@routes.get("/ui/{file:.*}")
@operation("The web console's scripts and styles (no token)", "ui", answer=None, media="*/*", errors=(NotFound,))
async def console_file(request: web.Request) -> web.StreamResponse:
    name = request.match_info["file"]
    if name in ("", INDEX):
        return await _index(request)
    if not _NAME.fullmatch(name):
        raise web.HTTPNotFound()
    path = STATIC / name
    if not await asyncio.to_thread(path.is_file):
        raise web.HTTPNotFound()
    headers = {**HEADERS, "Content-Type": CONTENT_TYPES[path.suffix]}
    return web.FileResponse(path, headers=headers)


async def _index(request: web.Request) -> web.Response:
    html = await asyncio.to_thread((STATIC / INDEX).read_text, encoding="utf-8")
    auth = "required" if request.app[K.CONFIG].settings.gateway.tokens else "none"
    html = html.replace(_HTML_TAG, f'<html lang="en" data-auth="{auth}">', 1)
    headers = {**HEADERS, "Cache-Control": "no-store"}
    return web.Response(text=html, content_type="text/html", charset="utf-8", headers=headers)
