"""What crosses between workers in a hand-off (``gateway.handoff``): a post as lists of its parts'
fields, frames (a 4-byte length and an orjson object) written a loop turn's worth at once and read
whole however the reads cut them, and the owner's refusal rebuilt as the error it raised."""

from __future__ import annotations

import asyncio
import dataclasses
import operator
import struct
from typing import Any

import orjson

from config.errors import NeotaskError, error_classes
from conversations.posts import Post
from sessions.keys import SessionKey
from sessions.records import NewMessage, TaskKey

MAX_FRAME = 1 << 28
READ_SIZE = 1 << 18  # read at once from a connection: every frame that came meanwhile
_LENGTH = struct.Struct("!I")


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


def frame_of(data: dict[str, Any]) -> bytes:
    body = orjson.dumps(data)
    return _LENGTH.pack(len(body)) + body


class Sender:
    """The frames for one connection, gathered until the loop's next turn: one write (one system
    call) for every frame that turn made, instead of one each."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._frames: list[bytes] = []

    def send(self, data: dict[str, Any]) -> None:
        frame = frame_of(data)  # an answer orjson refuses raises here, before anything is queued
        if not self._frames:
            asyncio.get_running_loop().call_soon(self._flush)
        self._frames.append(frame)

    def _flush(self) -> None:
        frames, self._frames = self._frames, []
        if frames and not self.writer.is_closing():
            self.writer.write(b"".join(frames))


class Frames:
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
