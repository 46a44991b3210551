"""Issue 24 item 18: a client's mistake is not the gateway's failure. Malformed requests and
dropped connections against a real daemon leave one INFO (or DEBUG) line each in gateway.log, no
ERROR and no traceback, and the daemon keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from pathlib import Path

import aiohttp
import pytest

from tests.gateway.daemons import daemon

pytestmark = pytest.mark.realtime  # reads the real clock: CI runs it at shifted dates too

MALFORMED = [
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
    b"POST /v1/sessions/agent%3Amain%3Amain/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
]
MESSAGES = b"POST /v1/sessions/agent%3Amain%3Amain/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
DROPPED = [
    MESSAGES + b'Content-Length: 1000\r\n\r\n{"content": "half',  # the body never finishes
    MESSAGES + b'Content-Length: 19\r\n\r\n{"content": "full"}',  # gone before the answer
    b"GET /v1/events HTTP/1.1\r\nHost: x\r\n\r\n",  # an event stream dropped at once
]


async def _send(port: int, data: bytes, *, reset: bool) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        if reset:  # RST, as a client that crashed or lost its network
            await asyncio.sleep(0.05)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return b""
        async with asyncio.timeout(10):
            return await reader.read(200)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_malformed_requests_and_dropped_connections_log_one_line_and_no_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with daemon(home) as running, aiohttp.ClientSession() as session:
        port = int(running.url.rsplit(":", 1)[1])
        for data in MALFORMED:
            answer = await _send(port, data, reset=False)
            assert answer.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400", b"HTTP/1.0 431", b"HTTP/1.1 431")), answer
        for data in DROPPED:
            await _send(port, data, reset=True)
        await asyncio.sleep(0.5)
        async with session.get(f"{running.url}/healthz") as resp:
            assert resp.status == 200
        assert await running.stop() == 0
    log = (home / "logs" / "gateway.log").read_text()
    assert "Traceback" not in log and " ERROR " not in log, log
    assert "INFO aiohttp.server: bad request from 127.0.0.1 (answered 400): Invalid character in Content-Length" in log
    assert "Traceback" not in running.stderr()
