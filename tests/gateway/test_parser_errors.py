"""aiohttp's own parser errors answer the JSON error shape (issue 13, item 20), through a real
daemon: they happen before any route or middleware runs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.gateway.daemons import daemon

pytestmark = [pytest.mark.slow, pytest.mark.realtime]

REQUESTS = {
    "a header over 8 KB": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
    "a request line over 8190 bytes": b"GET /healthz?q=" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "an obs-fold header": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Folded: one\r\n two\r\n\r\n",
    "a broken request line": b"GET\r\n\r\n",
}


async def raw(url: str, data: bytes) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(data)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
        return int(lines[0].split()[1]), headers, body
    finally:
        writer.close()


async def test_parser_errors_answer_json(tmp_path: Path) -> None:
    async with daemon(tmp_path / "home") as gw:
        for what, data in REQUESTS.items():
            status, headers, body = await raw(gw.url, data)
            assert status == 400, what
            assert headers["content-type"].startswith("application/json"), what
            error = json.loads(body)["error"]
            assert error["code"] == "invalid_body" and error["request_id"], what
            assert error["message"].startswith("Bad Request: "), what
        status, _, _ = await raw(gw.url, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # an allowed Host
        assert status == 200
        assert await gw.stop() == 0
