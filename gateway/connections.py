"""Connections under pressure: a cap on open connections kept below the
descriptor limit, a header timeout for connections that never send a request, and room for new
clients when idle sockets fill the cap.

The daemon listens through ``GuardedSite``: each accepted connection is wrapped by a thin protocol
that counts it. At the cap, a new connection closes the connection that has been idle longest (no
request in progress: a fresh socket that never sent a complete head, or a keep-alive one between
requests); only when none is idle is the newcomer answered 503 and closed. So a client holding a
thousand idle sockets cannot lock others out, and the process never runs out of descriptors (where
asyncio would log ``accept() out of system resource`` in a loop). After the first request, aiohttp's
keep-alive timeout (``gateway.keepalive_timeout_s``) closes idle connections.

Request bodies that arrive slowly: a connection whose request head is complete but whose body is
still arriving is busy, yet costs its sender one byte now and then. So one peer (remote address)
may have at most ``gateway.max_body_reads_per_peer`` requests whose bodies are still arriving;
the next is answered 429 ``too_many_body_reads`` before any of its body is read (``/hooks/<name>``
reads the body before it can check a signature, so this needs no credentials to hit). And at the
cap, when no connection is idle, the newcomer closes the oldest body read of the peer that holds the
most, before it is ever refused; ``gateway.body_timeout_s`` bounds each body read in time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import streams, web, web_protocol

from config.errors import TooManyBodyReads, Unavailable

log = logging.getLogger(__name__)

MIN_CONNECTIONS = 8


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    descriptor_limit: int | None
    reason: str | None  # why the cap is below gateway.max_connections, if it is


def connection_limits(max_connections: int, fd_reserve: int) -> ConnectionLimits:
    """``gateway.max_connections``, lowered to stay ``fd_reserve`` descriptors under the soft
    ``RLIMIT_NOFILE`` (files, SQLite, LanceDB, logs and the model need theirs)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return ConnectionLimits(max_connections, None, None)
    room = max(MIN_CONNECTIONS, soft - fd_reserve)
    if room >= max_connections:
        return ConnectionLimits(max_connections, soft, None)
    reason = (
        f"the descriptor limit is low (ulimit -n {soft}): connections are capped at {room} instead of"
        f" gateway.max_connections {max_connections} ({fd_reserve} kept for files: gateway.fd_reserve);"
        f" raise it with 'ulimit -n {max_connections + fd_reserve}' or LimitNOFILE= in a systemd unit"
    )
    return ConnectionLimits(room, soft, reason)


class GuardedProtocol(asyncio.Protocol):
    """Forwards everything to aiohttp's ``RequestHandler``; tells the guard when the connection
    opens, closes, starts and ends requests."""

    __slots__ = ("busy", "guard", "inner", "peer", "started", "timer", "transport")

    def __init__(self, guard: ConnectionGuard, inner: web_protocol.RequestHandler) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.busy = 0
        self.started = False
        self.timer: asyncio.TimerHandle | None = None
        self.peer = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is no subclass of asyncio.Transport, but has its methods
        self.transport = cast(asyncio.Transport, transport)
        peername = transport.get_extra_info("peername")
        self.peer = str(peername[0]) if isinstance(peername, tuple) and peername else ""
        if not self.guard.admit(self):
            return
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> None:
        self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.forget(self)
        if self.inner.transport is not None:
            self.inner.connection_lost(exc)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class ConnectionGuard:
    """The open connections, the idle ones oldest first, and the counters /metrics could show."""

    def __init__(self, *, max_connections: int, header_timeout_s: float, max_body_reads_per_peer: int = 32) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.max_body_reads_per_peer = max_body_reads_per_peer
        self.open: dict[web_protocol.RequestHandler, GuardedProtocol] = {}
        self.idle: OrderedDict[GuardedProtocol, None] = OrderedDict()
        # per peer, its connections whose request body is still arriving (oldest first)
        self.bodies: dict[str, OrderedDict[GuardedProtocol, streams.StreamReader]] = {}
        self.evicted = 0
        self.refused = 0
        self.timed_out = 0
        self.body_refused = 0
        self.body_evicted = 0

    def protocol_factory(self, server: web.Server) -> GuardedProtocol:
        return GuardedProtocol(self, server())

    def admit(self, conn: GuardedProtocol) -> bool:
        if len(self.open) >= self.max_connections:
            if self.idle:
                oldest, _ = self.idle.popitem(last=False)
                self.open.pop(oldest.inner, None)  # counted out now: its close completes next iteration
                self.evicted += 1
                oldest.close()
            elif (reader := self._slowest_body_read()) is not None:
                self.open.pop(reader.inner, None)
                self._forget_body(reader)
                self.body_evicted += 1
                reader.close()
            else:
                self.refused += 1
                _refuse(conn)
                return False
        self.open[conn.inner] = conn
        self.idle[conn] = None
        loop = asyncio.get_running_loop()
        conn.timer = loop.call_later(self.header_timeout_s, self._header_deadline, conn)
        return True

    def _header_deadline(self, conn: GuardedProtocol) -> None:
        conn.timer = None
        if not conn.started:
            self.timed_out += 1
            conn.close()

    def forget(self, conn: GuardedProtocol) -> None:
        self.open.pop(conn.inner, None)
        self.idle.pop(conn, None)
        self._forget_body(conn)
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None

    def enter(self, request: web.Request) -> GuardedProtocol | None:
        """Marks the request's connection busy (None: not served through ``GuardedSite``, e.g.
        the test client); ``leave`` it once the request is handled. Cheap: two dict operations."""
        conn = self.open.get(request.protocol)
        if conn is not None:
            conn.started = True
            conn.busy += 1
            self.idle.pop(conn, None)
        return conn

    def body_read(self, conn: GuardedProtocol | None, request: web.Request) -> None:
        """Count a request whose body is still arriving against its peer; TooManyBodyReads when
        the peer already has ``max_body_reads_per_peer`` of them. A body that came with the head
        (most JSON calls) is never counted."""
        if conn is None or not request.body_exists or request.content.is_eof():
            return
        reads = self.bodies.setdefault(conn.peer, OrderedDict())
        for other in [c for c, content in reads.items() if content.is_eof()]:  # arrived since
            del reads[other]
        if len(reads) >= self.max_body_reads_per_peer:
            self.body_refused += 1
            raise TooManyBodyReads(
                f"{len(reads)} requests from {conn.peer or 'this peer'} are still sending their bodies"
                f" (gateway.max_body_reads_per_peer is {self.max_body_reads_per_peer}): send each body"
                " with its head, or wait for the others to finish",
                retry_after_s=1,
            )
        reads[conn] = request.content

    def _forget_body(self, conn: GuardedProtocol) -> None:
        reads = self.bodies.get(conn.peer)
        if reads is not None and reads.pop(conn, None) is not None and not reads:
            del self.bodies[conn.peer]

    def _slowest_body_read(self) -> GuardedProtocol | None:
        """The oldest body read of the peer with the most bodies still arriving."""
        best: OrderedDict[GuardedProtocol, streams.StreamReader] | None = None
        for peer, reads in list(self.bodies.items()):
            for conn in [c for c, content in reads.items() if content.is_eof()]:
                del reads[conn]
            if not reads:
                del self.bodies[peer]
            elif best is None or len(reads) > len(best):
                best = reads
        return None if best is None else next(iter(best))

    def leave(self, conn: GuardedProtocol) -> None:
        self._forget_body(conn)
        conn.busy -= 1
        if conn.busy == 0 and conn.inner in self.open:
            self.idle[conn] = None  # newest idle last: evicted after every older one

    def stats(self) -> dict[str, Any]:
        return {"open": len(self.open), "idle": len(self.idle), "max": self.max_connections,
                "evicted": self.evicted, "refused": self.refused, "header_timeouts": self.timed_out,
                "body_reads": sum(len(r) for r in self.bodies.values()), "body_refused": self.body_refused,
                "body_evicted": self.body_evicted}  # fmt: skip


def _refuse(conn: GuardedProtocol) -> None:
    message = "too many open connections (gateway.max_connections); retry shortly"
    body = json.dumps({"error": {"code": Unavailable.code, "message": message, "request_id": uuid.uuid4().hex[:12]}})
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
        f"Retry-After: 1\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    assert conn.transport is not None
    conn.transport.write((head + body).encode())
    conn.transport.close()


class GuardedSite(web.TCPSite):
    """``web.TCPSite`` whose connections go through a ``ConnectionGuard``."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self._guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with the runner
        server = self._runner.server
        assert server is not None
        guard = self._guard
        self._server = await asyncio.get_running_loop().create_server(
            lambda: guard.protocol_factory(server),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


GUARD = web.AppKey("connection_guard", ConnectionGuard)
