"""Posts handed to the worker that owns their key (``neotask gateway --workers N`` on PostgreSQL,
``gateway.key_handoff``, on by default).

Every key has an *owner* among the workers: a hash of the key, modulo N (``gateway.key_owner:
first``: worker 1, for every key; one process stores every post, its group commit as wide as one
gateway's, at the price of that process's one core bounding the fleet). A worker that takes a
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
number of posts at once (each has an id). What crosses is ``gateway.handoff_frames``; this worker's
socket, which runs what the others hand it, ``gateway.handoff_server``.

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
import dataclasses
import hashlib
import logging
import socket
from pathlib import Path
from typing import Any

import orjson

from config.errors import StorageUnavailable
from conversations.posts import DeltaFn, Post
from gateway.handoff_frames import Frames, Sender, encode_post, rebuild_error
from gateway.handoff_server import Count, Handle, HandoffServer

log = logging.getLogger(__name__)

FIRST = 1  # the worker owning every key with ``gateway.key_owner: first``
DOWN_S = 1.0  # an owner that could not be reached is not asked again for this long
CONNECT_S = 1.0  # a connection to an owner taking longer: the owner is not reached

# what became of a post for a key another worker owns (``neotask_handoffs_total{result}``):
ANSWERED = "answered"  # the owner stored it and answered
REFUSED = "refused"  # the owner refused it (its error passed on as it was)
DECLINED = "declined"  # the owner was shutting down: stored here
UNREACHABLE = "unreachable"  # the owner could not be reached (or was not asked, for DOWN_S): stored here
UNSENDABLE = "unsendable"  # a frame could not carry it (what orjson refuses): stored here
LOST = "lost"  # the owner went away with it under way: may be stored (503 without ``stored``)
RESULTS = (ANSWERED, REFUSED, DECLINED, UNREACHABLE, UNSENDABLE, LOST)


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


def owner_lost(index: int, exc: BaseException) -> StorageUnavailable:
    typed = StorageUnavailable(
        f"the worker that stores this key's messages (worker {index}) stopped while storing this one ({exc}):"
        " it may be stored; send it again shortly with the same client_message_id (stored once either way)",
        retry_after_s=1,
    )
    del typed.extra["stored"]  # not known: ``stored: false`` would invite a resend under a new id
    return typed


_Sink = asyncio.Future[dict[str, Any]] | asyncio.Queue[dict[str, Any] | BaseException]


@dataclasses.dataclass(eq=False)
class _Owner:
    index: int
    name: str
    writer: asyncio.StreamWriter | None = None
    sender: Sender | None = None
    # the posts under way, by id: the connection they were sent on and where their frames go (a
    # future for the answer; a queue for a streamed post's deltas, then its answer or the failure)
    pending: dict[int, tuple[asyncio.StreamWriter, _Sink]] = dataclasses.field(default_factory=dict)
    down_until: float = 0.0
    connecting: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    reading: asyncio.Task[None] | None = None


class Handoff:
    """This worker's side: ``post`` hands a post to its key's owner when that is another worker."""

    def __init__(
        self, home: Path, supervisor: int, index: int, workers: int, handle: Handle, count: Count | None = None,
        *, one_owner: bool = False,
    ) -> None:
        """``count``: told what became of each post for another worker's key (one of ``RESULTS``)
        and of each post run here for another worker (``served``). ``one_owner``: worker 1 owns
        every key (``gateway.key_owner: first``)."""
        self.index, self.workers, self.one_owner = index, workers, one_owner
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
        index = FIRST if self.one_owner else owner_of(post.key.raw, self.workers)
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
            owner.writer, owner.sender = writer, Sender(writer)
            owner.reading = loop.create_task(self._read(owner, reader, writer), name=f"handoff-{owner.index}")
            return writer

    async def _read(self, owner: _Owner, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        problem: BaseException = ConnectionResetError("the connection closed")
        try:
            frames = Frames(reader)
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
