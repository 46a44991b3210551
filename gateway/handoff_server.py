"""This worker's hand-off socket (``gateway.handoff``): runs the posts other workers hand it and
answers them, refuses a connection from another user (``SO_PEERCRED``), declines what comes once
it closes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from config.errors import NeotaskError
from conversations.posts import DeltaFn, Post
from gateway.handoff_frames import Frames, Sender, decode_post

log = logging.getLogger("gateway.handoff")

CLOSE_S = 30.0  # at close, the posts under way are waited for this long at most
_PEERCRED = struct.Struct("3i")

Handle = Callable[[Post, DeltaFn | None], Awaitable[Mapping[str, Any]]]
Count = Callable[[str], None]


class HandoffServer:
    """This worker's socket: runs the posts other workers hand it (``handle``) and answers."""

    def __init__(self, name: str, handle: Handle, count: Count | None = None) -> None:
        self.name = name
        self._count = count
        self._handle = handle
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._serving: set[asyncio.Task[None]] = set()  # the connections being read
        self._closing = False
        self.handled = 0  # posts run for other workers (tests, and what /metrics may show)

    async def start(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # made here: uvloop refuses an
        try:  # abstract name given as a path (EINVAL)
            sock.bind(self.name)
            sock.setblocking(False)
            self._server = await asyncio.start_unix_server(self._serve, sock=sock)
        except BaseException:
            sock.close()
            raise

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not _same_user(writer):
            writer.close()
            return
        self._writers.add(writer)
        serving = asyncio.current_task()
        if serving is not None:
            self._serving.add(serving)
        sender = Sender(writer)
        frames = Frames(reader)
        loop = asyncio.get_running_loop()
        try:
            while True:
                for request in await frames.next():
                    if self._closing:
                        sender.send({"id": request.get("id"), "declined": True})
                        continue
                    task = loop.create_task(self._answer(sender, request))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, OSError, orjson.JSONDecodeError):
            pass  # the other worker went away (or closed: it connects again when it needs to)
        finally:
            self._writers.discard(writer)
            if serving is not None:
                self._serving.discard(serving)
            if not self._closing:
                writer.close()

    async def _answer(self, sender: Sender, request: dict[str, Any]) -> None:
        ident = request.get("id")
        on_delta: DeltaFn | None = None
        if request.get("stream"):

            async def on_delta(text: str) -> None:
                sender.send({"id": ident, "delta": text})

        try:
            post = decode_post(request["post"])
            answer: dict[str, Any] = {"id": ident, "body": await self._handle(post, on_delta)}
            self.handled += 1
            if self._count is not None:
                self._count("served")
        except NeotaskError as exc:
            answer = {"id": ident, "error": {"code": exc.code, "message": exc.message, "extra": exc.extra}}
        except Exception as exc:
            log.exception("a post handed over by another worker failed")
            answer = {"id": ident, "error": {"code": NeotaskError.code, "message": f"the gateway failed: {exc}"}}
        try:
            sender.send(answer)
        except (TypeError, orjson.JSONEncodeError) as exc:  # an answer orjson refuses (huge ints, ...)
            error = {"code": NeotaskError.code, "message": f"the answer could not be passed on: {exc}"}
            sender.send({"id": ident, "error": error})

    async def close(self) -> None:
        """Decline what comes from now on (the other workers store it themselves), wait for the
        posts under way, then close."""
        if self._closing:
            return
        self._closing = True
        if self._server is not None:
            self._server.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=CLOSE_S)
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                await writer.drain()
            writer.close()
        self._writers.clear()
        if self._serving:  # each connection's reader sees its end (a loop ending first cancels them: a traceback)
            await asyncio.wait(list(self._serving), timeout=CLOSE_S)


def _same_user(writer: asyncio.StreamWriter) -> bool:
    """Whether the connecting process runs as this one's user (``SO_PEERCRED``)."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return False
    try:
        _pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except OSError:
        return False
    return bool(uid == os.getuid())
