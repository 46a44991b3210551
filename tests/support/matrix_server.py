"""A light local Matrix homeserver for the ingest benchmark: the part of the client-server API the
connector calls (``channels/matrix.py``, matrix-nio), no database, no federation, no encryption.

One bot user (its access token; any other answers 401 ``M_UNKNOWN_TOKEN``) and the rooms the bench
makes, each a direct room one user invites the bot to. The stream is one list: an invite or a
message is appended at the next position, and a sync token is ``s<position>``.

- ``GET /_matrix/client/versions``, ``GET /account/whoami`` (no device: the bench runs with
  encryption off), ``GET /profile/{user}/displayname``, ``POST /user/{user}/filter`` (and a
  filter id, or inline JSON, in ``/sync``'s ``filter``);
- ``GET /sync``: without ``since`` the rooms the bot is invited to and the token of now; with
  ``since``, what came after it (invites still pending, each joined room's timeline, at most the
  filter's ``timeline.limit`` newest events of a room with ``limited`` and ``prev_batch`` when more
  came), at once when there is any, else when something comes or ``timeout`` ms pass. The
  highest ``since`` asked is ``confirmed``: the connector asks past an event only once it is
  durable, as Telegram's offset (the benchmark's measure);
- ``GET /rooms/{room}/messages`` (paging back before a limited timeline), ``/joined_members``,
  ``POST /join/{room}``, ``POST /rooms/{room}/leave``, ``PUT /rooms/{room}/send/{type}/{txn}``
  (one event per transaction id, in the stream as the bot's), ``PUT /rooms/{room}/typing/{user}``,
  ``POST /rooms/{room}/receipt/{type}/{event}``, ``POST /rooms/{room}/read_markers``.

Events are built (as the JSON text a sync carries) when the bench prepares them, and a sync
answer is joined from those texts: the stand-in does little per event, so the benchmark measures
the connector. The bench drives it over HTTP (``/_standin/...``: rooms, prepare, release, state)
and runs it in a process of its own (``python -m tests.support.matrix_server --bot ID --token T``
prints ``listening on URL``), so its CPU is its own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from aiohttp import web

from tests.support.platform_server import PlatformServer

SERVER = "localhost"
API = "/_matrix/client/{version:(r0|v3)}"
DEFAULT_LIMIT = 10


@dataclass
class Call:
    method: str
    path: str
    at: float


@dataclass
class Room:
    room_id: str
    user: str
    invited_at: int  # the stream position of the bot's invite
    joined: bool = False
    positions: list[int] = field(default_factory=list)  # this room's events in the stream, oldest first


@dataclass
class Event:
    room_id: str
    event_id: str
    text: bytes  # the event's JSON as a sync carries it


def _error(status: int, code: str, why: str) -> web.Response:
    return web.json_response({"errcode": code, "error": why}, status=status)


def _position(token: str | None) -> int:
    if not token or not token.startswith("s") or not token[1:].isdigit():
        raise web.HTTPBadRequest(text=json.dumps({"errcode": "M_INVALID_PARAM", "error": f"bad token {token!r}"}),
                                 content_type="application/json")  # fmt: skip
    return int(token[1:])


class MatrixServer(PlatformServer[Call]):
    """The homeserver of one bot user (``bot``, ``token``)."""

    def __init__(self, bot: str, token: str, *, display_name: str = "bench") -> None:
        super().__init__()
        self.bot, self.token, self.display_name = bot, token, display_name
        self.rooms: dict[str, Room] = {}
        self.stream: list[Event | str] = []  # position p is stream[p - 1]: an event, or the room id of an invite
        self.confirmed = 0
        self.filters: dict[str, dict[str, Any]] = {}
        self.sent: dict[tuple[str, str], str] = {}  # (room, txn): event id
        self.prepared: list[Event] = []
        self._grew = asyncio.Condition()
        self._ids = itertools.count(1)
        self.record = False  # calls logged in ``calls`` (off for the benchmark: it only counts)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        r = app.router
        r.add_get("/_matrix/client/versions", self._versions)
        r.add_get(f"{API}/account/whoami", self._whoami)
        r.add_get(API + "/profile/{user}/displayname", self._displayname)
        r.add_post(API + "/user/{user}/filter", self._filter)
        r.add_get(f"{API}/sync", self._sync)
        r.add_get(API + "/rooms/{room}/messages", self._messages)
        r.add_get(API + "/rooms/{room}/joined_members", self._members)
        r.add_post(API + "/join/{room}", self._join)
        r.add_post(API + "/rooms/{room}/join", self._join)
        r.add_post(API + "/rooms/{room}/leave", self._leave)
        r.add_put(API + "/rooms/{room}/send/{type}/{txn}", self._send)
        r.add_put(API + "/rooms/{room}/typing/{user}", self._empty)
        r.add_post(API + "/rooms/{room}/receipt/{type}/{event}", self._empty)
        r.add_post(API + "/rooms/{room}/read_markers", self._empty)
        r.add_post("/_standin/rooms", self._make_rooms)
        r.add_post("/_standin/prepare", self._prepare)
        r.add_post("/_standin/release", self._release)
        r.add_get("/_standin/state", self._state)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.record:
            self.calls.append(Call(request.method, request.path, time.monotonic()))
        if request.path.startswith("/_standin/") or request.path == "/_matrix/client/versions":
            return await handler(request)  # type: ignore[no-any-return]
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return _error(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        try:
            return await handler(request)  # type: ignore[no-any-return]
        except web.HTTPNotFound:
            return _error(404, "M_UNRECOGNIZED", "Unrecognized request")

    # -- the client-server API ------------------------------------------------------------------

    async def _versions(self, request: web.Request) -> web.Response:
        return web.json_response({"versions": ["r0.6.1", "v1.1", "v1.6", "v1.11"], "unstable_features": {}})

    async def _whoami(self, request: web.Request) -> web.Response:
        return web.json_response({"user_id": self.bot, "is_guest": False})

    async def _displayname(self, request: web.Request) -> web.Response:
        if request.match_info["user"] != self.bot:
            return _error(404, "M_NOT_FOUND", "Profile was not found")
        return web.json_response({"displayname": self.display_name})

    async def _filter(self, request: web.Request) -> web.Response:
        filter_id = str(len(self.filters) + 1)
        self.filters[filter_id] = await request.json()
        return web.json_response({"filter_id": filter_id})

    def _limit(self, given: str | None) -> int:
        if not given:
            return DEFAULT_LIMIT
        body = self.filters.get(given) if not given.startswith("{") else json.loads(given)
        limit = ((body or {}).get("room") or {}).get("timeline", {}).get("limit")
        return int(limit) if limit else DEFAULT_LIMIT

    async def _sync(self, request: web.Request) -> web.Response:
        since = request.query.get("since")
        limit = self._limit(request.query.get("filter"))
        if since is None:
            return self._answer(None, len(self.stream), limit)
        after = _position(since)
        if after > self.confirmed:
            self.confirmed = after
            await PlatformServer._notify(self)  # the bench waits on it
        timeout = int(request.query.get("timeout") or 0) / 1000
        if len(self.stream) <= after and timeout > 0:
            async with self._grew:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._grew.wait_for(lambda: len(self.stream) > after)
        return self._answer(after, len(self.stream), limit)

    def _answer(self, after: int | None, upto: int, limit: int) -> web.Response:
        """The sync from ``after`` (None: a first sync, the pending invites only) to ``upto``, as text."""
        invites = [r for r in self.rooms.values() if not r.joined and (after is None or r.invited_at > after)]
        timelines: dict[str, list[int]] = {}
        if after is not None:
            for position in range(after + 1, upto + 1):
                item = self.stream[position - 1]
                if isinstance(item, Event) and self.rooms[item.room_id].joined:
                    timelines.setdefault(item.room_id, []).append(position)
        joined = []
        for room_id, positions in timelines.items():
            shown = positions[-limit:]
            events = b",".join(self._event(p).text for p in shown)
            limited = b"true" if len(shown) < len(positions) else b"false"
            joined.append(b'%s:{"timeline":{"limited":%s,"prev_batch":"s%d","events":[%s]},"state":{"events":[]}}'
                          % (json.dumps(room_id).encode(), limited, shown[0] - 1, events))  # fmt: skip
        invite = {r.room_id: {"invite_state": {"events": self._invite_state(r)}} for r in invites}
        body = b'{"next_batch":"s%d","rooms":{"join":{%s},"invite":%s,"leave":{}}}' % (
            upto, b",".join(joined), json.dumps(invite).encode())  # fmt: skip
        return web.Response(body=body, content_type="application/json")

    def _event(self, position: int) -> Event:
        item = self.stream[position - 1]
        assert isinstance(item, Event)
        return item

    def _invite_state(self, room: Room) -> list[dict[str, Any]]:
        return [
            {"type": "m.room.create", "state_key": "", "sender": room.user, "content": {"room_version": "10"}},
            {"type": "m.room.member", "state_key": room.user, "sender": room.user,
             "content": {"membership": "join"}},
            {"type": "m.room.member", "state_key": self.bot, "sender": room.user,
             "content": {"membership": "invite", "is_direct": True}},
        ]  # fmt: skip

    def _room(self, request: web.Request) -> Room:
        room = self.rooms.get(request.match_info["room"])
        if room is None:
            raise web.HTTPNotFound()
        return room

    async def _messages(self, request: web.Request) -> web.Response:
        """Backwards from ``from`` down to ``to``: the room's events, newest first."""
        room = self._room(request)
        start = _position(request.query.get("from"))
        end = _position(request.query["to"]) if request.query.get("to") else 0
        limit = int(request.query.get("limit") or DEFAULT_LIMIT)
        older = [p for p in room.positions if end < p <= start][::-1][:limit]
        chunk = [json.loads(self._event(p).text) for p in older]
        answer: dict[str, Any] = {"chunk": chunk, "start": f"s{start}"}
        if older:
            answer["end"] = f"s{older[-1] - 1}"
        return web.json_response(answer)

    async def _members(self, request: web.Request) -> web.Response:
        room = self._room(request)
        members = [room.user, self.bot] if room.joined else [room.user]
        return web.json_response({"joined": {m: {"display_name": m[1:].split(":")[0], "avatar_url": None}
                                             for m in members}})  # fmt: skip

    async def _join(self, request: web.Request) -> web.Response:
        room = self._room(request)
        room.joined = True
        await self._notify()
        return web.json_response({"room_id": room.room_id})

    async def _leave(self, request: web.Request) -> web.Response:
        self._room(request).joined = False
        await self._notify()
        return web.json_response({})

    async def _send(self, request: web.Request) -> web.Response:
        room = self._room(request)
        key = (room.room_id, request.match_info["txn"])
        if key not in self.sent:
            content = await request.json()
            self.sent[key] = self._append(room, self.bot, request.match_info["type"], content)
            async with self._grew:
                self._grew.notify_all()
        return web.json_response({"event_id": self.sent[key]})

    async def _empty(self, request: web.Request) -> web.Response:
        self._room(request)
        return web.json_response({})

    # -- the stream -----------------------------------------------------------------------------

    def _built(self, room: Room, sender: str, kind: str, content: dict[str, Any]) -> Event:
        n = next(self._ids)
        event_id = f"${n}-{room.room_id[1:].split(':')[0]}"
        event = {"type": kind, "event_id": event_id, "sender": sender, "origin_server_ts": int(time.time() * 1000),
                 "content": content, "unsigned": {"age": 0}}  # fmt: skip
        return Event(room.room_id, event_id, json.dumps(event).encode())

    def _put(self, events: list[Event]) -> None:
        for event in events:
            self.stream.append(event)
            self.rooms[event.room_id].positions.append(len(self.stream))

    def _append(self, room: Room, sender: str, kind: str, content: dict[str, Any]) -> str:
        event = self._built(room, sender, kind, content)
        self._put([event])
        return event.event_id

    def add_room(self, user: str) -> Room:
        """A direct room ``user`` made and invited the bot to."""
        room = Room(f"!{quote(user[1:].split(':')[0], safe='')}{len(self.rooms)}:{SERVER}", user, 0)
        self.stream.append(room.room_id)
        room.invited_at = len(self.stream)
        self.rooms[room.room_id] = room
        return room

    def prepare(self, tag: str, count: int, rooms: list[Room]) -> None:
        """``count`` text messages, round robin over ``rooms`` from each room's user, built and held."""
        self.prepared = [
            self._built(room, room.user, "m.room.message",
                        {"msgtype": "m.text", "body": f"message {n} of {tag}: the quick brown fox"})
            for n, room in zip(range(count), itertools.cycle(rooms), strict=False)
        ]  # fmt: skip

    async def release(self) -> int:
        """The prepared messages into the stream at once; the position of the last."""
        self._put(self.prepared)
        self.prepared = []
        await self._notify()
        return len(self.stream)

    async def _notify(self) -> None:
        async with self._grew:
            self._grew.notify_all()
        await super()._notify()

    # -- the bench's controls -------------------------------------------------------------------

    async def _make_rooms(self, request: web.Request) -> web.Response:
        users = (await request.json())["users"]
        rooms = [self.add_room(user) for user in users]
        await self._notify()
        return web.json_response({"rooms": [r.room_id for r in rooms]})

    async def _prepare(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.prepare(str(body["tag"]), int(body["count"]), [self.rooms[r] for r in body["rooms"]])
        return web.json_response({"prepared": len(self.prepared)})

    async def _release(self, request: web.Request) -> web.Response:
        return web.json_response({"position": await self.release()})

    async def _state(self, request: web.Request) -> web.Response:
        """Now, or once ``confirmed`` (the highest ``since`` asked) reaches ``?confirmed=``, or all rooms joined."""
        wanted = int(request.query.get("confirmed") or 0)
        joined = request.query.get("joined") == "all"
        await self.wait_for(lambda: self.confirmed >= wanted and (not joined or all(r.joined for r in
                                                                                     self.rooms.values())),
                            timeout=float(request.query.get("timeout") or 600))  # fmt: skip
        return web.json_response({"position": len(self.stream), "confirmed": self.confirmed,
                                  "joined": sum(r.joined for r in self.rooms.values())})  # fmt: skip


async def serve(bot: str, token: str) -> None:
    server = MatrixServer(bot, token)
    async with server:
        print(f"listening on {server.url}", flush=True)
        await asyncio.Event().wait()


def main() -> None:
    """``python -m tests.support.matrix_server --bot @bench:localhost --token T``: serve until killed."""
    p = argparse.ArgumentParser(prog="tests.support.matrix_server", description=__doc__)
    p.add_argument("--bot", required=True)
    p.add_argument("--token", required=True)
    args = p.parse_args()
    asyncio.run(serve(args.bot, args.token))


if __name__ == "__main__":
    main()
