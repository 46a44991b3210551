"""Posts handed to the worker that owns their key (``neotask gateway --workers N`` on PostgreSQL,
``gateway.key_handoff``, on by default).

Every key has an *owner* among the workers: a hash of the key, modulo N. A worker that takes a
post for a key another worker owns (the kernel spread the connections, a load balancer in front,
or a client whose connections come and go: a key's requests land on any worker) hands the post to
the owner over a local socket and answers with what the owner answered, so a key's posts are
stored by one process and its lease (``sessions.postgres.keylocks``) stays there: without this,
the lease moved between the workers with the key's messages, one move per message (a release, a
notification, a wait, a read of the key again), and two workers served a fifth of what one did.
The hop costs a few dozen microseconds of each worker's CPU.

The socket: one per worker, in Linux's abstract namespace (no file to clean up, no path length
limit), named by the home and the supervisor's pid; a connection from another user is refused
(``SO_PEERCRED``). Frames are a 4-byte length and an orjson object; a connection carries any
number of posts at once (each has an id).

What is handed: a post of the message routes, answered whole or streamed (``stream: true``: the
owner sends each text delta as a frame of its own as it comes, which the worker that took the post
writes to its client at once), through ``conversations.commands.dispatch`` as the owner would run
it itself. Not a post with per-call options: the OpenAI-compatible routes post several messages
per call and keep records around it (``gateway.openai_compat.service``), so a call would have to
be handed whole; it is answered where it came, the key's lease moving as before.

An owner that cannot be reached (starting again after a crash, shutting down: it declines what
comes meanwhile) is not asked for ``DOWN_S``: the worker stores the post itself, the key's lease
moving as before, which is correct, only slower. Each post for another worker's key is counted by
what became of it (``RESULTS``, ``neotask_handoffs_total{result}`` in ``/metrics``). An owner that
dies with a post under way answers nothing: the post may have been stored or not, and the client
is told so (503, no ``stored``; the same ``client_message_id`` sent again is stored once).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import operator
import os
import socket
import struct
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from config.errors import NeotaskError, StorageUnavailable, error_classes
from conversations.posts import DeltaFn, Post
from sessions.keys import SessionKey
from sessions.records import NewMessage, TaskKey

log = logging.getLogger(__name__)

DOWN_S = 1.0  # an owner that could not be reached is not asked again for this long
CONNECT_S = 1.0  # a connection to an owner taking longer: the owner is not reached
CLOSE_S = 30.0  # at close, the posts under way are waited for this long at most
MAX_FRAME = 1 << 28
READ_SIZE = 1 << 18  # read at once from a connection: every frame that came meanwhile
_LENGTH = struct.Struct("!I")
_PEERCRED = struct.Struct("3i")

Handle = Callable[[Post, DeltaFn | None], Awaitable[Mapping[str, Any]]]
# what became of a post for a key another worker owns (``neotask_handoffs_total{result}``):
ANSWERED = "answered"  # the owner stored it and answered
REFUSED = "refused"  # the owner refused it (its error passed on as it was)
DECLINED = "declined"  # the owner was shutting down: stored here
UNREACHABLE = "unreachable"  # the owner could not be reached (or was not asked, for DOWN_S): stored here
UNSENDABLE = "unsendable"  # a frame could not carry it (what orjson refuses): stored here
LOST = "lost"  # the owner went away with it under way: may be stored (503 without ``stored``)
RESULTS = (ANSWERED, REFUSED, DECLINED, UNREACHABLE, UNSENDABLE, LOST)
Count = Callable[[str], None]


def owner_of(key: str, workers: int) -> int:
    """The index (1 to ``workers``) of the worker that owns ``key``."""
    found = _OWNERS.get((key, workers))
    if found is None:
        if len(_OWNERS) >= OWNERS_KEPT:
            _OWNERS.clear()
        digest = hashlib.blake2b(key.encode(), digest_size=8, person=b"neotask-owner").digest()
        found = _OWNERS[key, workers] = int.from_bytes(digest, "big") % workers + 1
    return found


OWNERS_KEPT = 65536  # keys whose owner is remembered (the hash is most of a hand-off's decision)
_OWNERS: dict[tuple[str, int], int] = {}


def socket_name(home: Path, supervisor: int, index: int) -> str:
    """Worker ``index``'s socket, in the abstract namespace (a leading NUL)."""
    tag = hashlib.blake2b(str(home.resolve()).encode(), digest_size=6).hexdigest()
    return f"\0neotask-handoff-{tag}-{supervisor}-{index}"


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


# a post crosses as lists of its parts' fields in their declared order (both sides run the same
# code): a third cheaper to write and to read than objects naming each field
_KEY, _MESSAGE, _TASK = _names(SessionKey), _names(NewMessage), _names(TaskKey)
_key_values, _message_values = operator.attrgetter(*_KEY), operator.attrgetter(*_MESSAGE)
_task_values = operator.attrgetter(*_TASK)
_HOOK_PARTS, _TOOL_CALLS = _KEY.index("hook_parts"), _MESSAGE.index("tool_calls")


def encode_post(post: Post) -> list[Any]:
    task = post.task_key
    return [_key_values(post.key), _message_values(post.message), post.reply,
            _task_values(task) if task is not None else None, post.id_scope]  # fmt: skip


def decode_post(data: list[Any]) -> Post:
    key, message, reply, task, id_scope = data
    key[_HOOK_PARTS] = tuple(key[_HOOK_PARTS])
    message[_TOOL_CALLS] = tuple(message[_TOOL_CALLS])
    task_key = TaskKey(*task) if task is not None else None
    return Post(SessionKey(*key), NewMessage(*message), bool(reply), task_key, None, id_scope)


def _frame(data: dict[str, Any]) -> bytes:
    body = orjson.dumps(data)
    return _LENGTH.pack(len(body)) + body


class _Sender:
    """The frames for one connection, gathered until the loop's next turn: one write (one system
    call) for every frame that turn made, instead of one each."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._frames: list[bytes] = []

    def send(self, data: dict[str, Any]) -> None:
        frame = _frame(data)  # an answer orjson refuses raises here, before anything is queued
        if not self._frames:
            asyncio.get_running_loop().call_soon(self._flush)
        self._frames.append(frame)

    def _flush(self) -> None:
        frames, self._frames = self._frames, []
        if frames and not self.writer.is_closing():
            self.writer.write(b"".join(frames))


class _Frames:
    """The frames coming on one connection: ``next`` reads what has come (one read for any
    number of frames) and gives every whole frame in it; a frame cut by the read waits for the
    rest."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self._buffer = b""

    async def next(self) -> list[dict[str, Any]]:
        frames: list[dict[str, Any]] = []
        while not frames:
            chunk = await self.reader.read(READ_SIZE)
            if not chunk:
                raise asyncio.IncompleteReadError(self._buffer, None)
            buffer = self._buffer + chunk if self._buffer else chunk
            at, end = 0, len(buffer)
            while end - at >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(buffer, at)
                if length > MAX_FRAME:
                    raise ConnectionError(f"a hand-off frame of {length} bytes")
                if end - at - _LENGTH.size < length:
                    break
                data = orjson.loads(buffer[at + _LENGTH.size : at + _LENGTH.size + length])
                if not isinstance(data, dict):
                    raise ConnectionError("a hand-off frame that is not an object")
                frames.append(data)
                at += _LENGTH.size + length
            self._buffer = buffer[at:] if at < end else b""
        return frames


def rebuild_error(error: dict[str, Any]) -> NeotaskError:
    """The owner's refusal as the error it raised (its class by code: status, retry headers)."""
    cls = error_classes(http_only=False).get(str(error.get("code")), NeotaskError)
    exc = cls.__new__(cls)
    Exception.__init__(exc, error.get("message", ""))
    exc.message = str(error.get("message", ""))
    extra = error.get("extra")
    exc.extra = dict(extra) if isinstance(extra, dict) else {}
    return exc


def owner_lost(index: int, exc: BaseException) -> StorageUnavailable:
    typed = StorageUnavailable(
        f"the worker that stores this key's messages (worker {index}) stopped while storing this one ({exc}):"
        " it may be stored; send it again shortly with the same client_message_id (stored once either way)",
        retry_after_s=1,
    )
    del typed.extra["stored"]  # not known: ``stored: false`` would invite a resend under a new id
    return typed


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
        sender = _Sender(writer)
        frames = _Frames(reader)
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

    async def _answer(self, sender: _Sender, request: dict[str, Any]) -> None:
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


_Sink = asyncio.Future[dict[str, Any]] | asyncio.Queue[dict[str, Any] | BaseException]


@dataclasses.dataclass(eq=False)
class _Owner:
    index: int
    name: str
    writer: asyncio.StreamWriter | None = None
    sender: _Sender | None = None
    # the posts under way, by id: the connection they were sent on and where their frames go (a
    # future for the answer; a queue for a streamed post's deltas, then its answer or the failure)
    pending: dict[int, tuple[asyncio.StreamWriter, _Sink]] = dataclasses.field(default_factory=dict)
    down_until: float = 0.0
    connecting: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    reading: asyncio.Task[None] | None = None


class Handoff:
    """This worker's side: ``post`` hands a post to its key's owner when that is another worker."""

    def __init__(
        self, home: Path, supervisor: int, index: int, workers: int, handle: Handle, count: Count | None = None
    ) -> None:
        """``count``: told what became of each post for another worker's key (one of ``RESULTS``)
        and of each post run here for another worker (``served``)."""
        self.index, self.workers = index, workers
        self._count = count if count is not None else _no_count
        self.server = HandoffServer(socket_name(home, supervisor, index), handle, count)
        self._owners = {i: _Owner(i, socket_name(home, supervisor, i)) for i in range(1, workers + 1) if i != index}
        self._next = 0
        self.enabled = True
        self.handed = 0  # posts another worker stored (tests)

    async def start(self) -> None:
        """Listen for the others' posts; a socket that cannot be made (the same home served by
        another supervisor of the same pid: another machine's namespace) leaves hand-offs off."""
        try:
            await self.server.start()
        except OSError as exc:
            log.warning("worker %d hands no posts over and takes none (%s)", self.index, exc)
            self.enabled = False

    async def close(self) -> None:
        await self.server.close()
        log.info("worker %d: %d post(s) stored by the workers owning their keys, %d stored here for others",
                 self.index, self.handed, self.server.handled)  # fmt: skip
        for owner in self._owners.values():
            if owner.writer is not None:
                owner.writer.close()
            if owner.reading is not None:
                owner.reading.cancel()

    def owner(self, post: Post) -> int | None:
        """The other worker that owns the post's key; None: this one answers it."""
        if post.options is not None or not self.enabled:
            return None
        index = owner_of(post.key.raw, self.workers)
        return None if index == self.index else index

    async def post(self, post: Post, on_delta: DeltaFn | None = None) -> dict[str, Any] | None:
        """The owner's answer body (its refusal raised as the error it was); None when this
        worker answers the post itself (it owns the key, or the owner cannot be reached now).
        With ``on_delta`` (a streamed post) the owner's text deltas are passed to it as they come."""
        index = self.owner(post)
        if index is None:
            return None
        owner = self._owners[index]
        loop = asyncio.get_running_loop()
        if loop.time() < owner.down_until:
            self._count(UNREACHABLE)
            return None
        writer = owner.writer if owner.writer is not None and not owner.writer.is_closing() else None
        if writer is None:
            writer = await self._connect(owner)
            if writer is None:
                self._count(UNREACHABLE)
                return None
        sender = owner.sender
        assert sender is not None and sender.writer is writer
        self._next += 1
        ident = self._next
        request: dict[str, Any] = {"id": ident, "post": encode_post(post)}
        if on_delta is not None:
            request["stream"] = True
        try:
            sender.send(request)
        except (TypeError, orjson.JSONEncodeError):  # what orjson refuses (huge integers, ...): stored here
            self._count(UNSENDABLE)
            return None
        try:
            answer = await (self._answer(owner, ident, writer) if on_delta is None
                            else self._streamed(owner, ident, writer, on_delta))  # fmt: skip
        except _Lost as lost:  # not what ``on_delta`` raises: a client gone mid-stream is not the owner
            self._count(LOST)
            raise owner_lost(index, lost.problem) from lost.problem
        finally:
            owner.pending.pop(ident, None)
        if answer.get("declined"):  # the owner is shutting down: nothing was done there
            owner.down_until = loop.time() + DOWN_S
            self._count(DECLINED)
            return None
        error = answer.get("error")
        if isinstance(error, dict):
            self._count(REFUSED)
            raise rebuild_error(error)
        self.handed += 1
        self._count(ANSWERED)
        body = answer.get("body")
        return body if isinstance(body, dict) else {}

    @staticmethod
    async def _answer(owner: _Owner, ident: int, writer: asyncio.StreamWriter) -> dict[str, Any]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        owner.pending[ident] = (writer, future)
        return await future

    @staticmethod
    async def _streamed(owner: _Owner, ident: int, writer: asyncio.StreamWriter, on_delta: DeltaFn) -> dict[str, Any]:
        """The deltas of a streamed post, each passed on as it comes, then its answer."""
        frames: asyncio.Queue[dict[str, Any] | BaseException] = asyncio.Queue()
        owner.pending[ident] = (writer, frames)
        while True:
            frame = await frames.get()
            if isinstance(frame, BaseException):
                raise frame
            if "delta" not in frame:
                return frame
            await on_delta(str(frame["delta"]))

    async def _connect(self, owner: _Owner) -> asyncio.StreamWriter | None:
        async with owner.connecting:
            if owner.writer is not None and not owner.writer.is_closing():
                return owner.writer
            loop = asyncio.get_running_loop()
            if loop.time() < owner.down_until:
                return None
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                await asyncio.wait_for(loop.sock_connect(sock, owner.name), CONNECT_S)
                reader, writer = await asyncio.open_unix_connection(sock=sock)
            except (OSError, TimeoutError) as exc:  # starting again, or gone: stored here meanwhile
                sock.close()
                log.debug("worker %d not reached for a hand-off (%s)", owner.index, exc)
                owner.down_until = loop.time() + DOWN_S
                return None
            owner.writer, owner.sender = writer, _Sender(writer)
            owner.reading = loop.create_task(self._read(owner, reader, writer), name=f"handoff-{owner.index}")
            return writer

    async def _read(self, owner: _Owner, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        problem: BaseException = ConnectionResetError("the connection closed")
        try:
            frames = _Frames(reader)
            pending = owner.pending
            while True:
                for answer in await frames.next():
                    sent = pending.get(answer.get("id", -1))
                    if sent is None:
                        continue
                    sink = sent[1]
                    if isinstance(sink, asyncio.Queue):
                        sink.put_nowait(answer)
                    elif not sink.done():
                        sink.set_result(answer)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, orjson.JSONDecodeError) as exc:
            problem = exc if isinstance(exc, ConnectionError | OSError) else ConnectionResetError(str(exc))
        finally:
            if owner.writer is writer:
                owner.writer = None
                owner.down_until = asyncio.get_running_loop().time() + DOWN_S
            writer.close()
            for on, sink in list(owner.pending.values()):
                if on is not writer:
                    continue
                if isinstance(sink, asyncio.Queue):
                    sink.put_nowait(_Lost(problem))
                elif not sink.done():
                    sink.set_exception(_Lost(problem))


class _Lost(Exception):
    """The connection to the owner broke with a post under way (``problem``: how)."""

    def __init__(self, problem: BaseException) -> None:
        super().__init__(str(problem))
        self.problem = problem


def _no_count(result: str) -> None:
    pass


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
