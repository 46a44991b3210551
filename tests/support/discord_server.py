"""A local Discord for the test suite: the gateway over a WebSocket and the REST calls a bot makes,
recording every call, every IDENTIFY, RESUME and heartbeat.

REST, under ``/api/v10`` (``Authorization: Bot <token>``; an unknown token answers 401 as Discord
does): ``GET /users/@me``, ``GET /oauth2/applications/@me``, ``GET /gateway/bot`` (its ``url`` is
this server's gateway), ``GET /channels/{id}`` (a direct chat is a channel once a message was sent in it),
``GET /channels/{id}/messages`` (its history: every message dispatched or sent, also those sent
while the bot had no session), ``POST /channels/{id}/messages`` (recorded), ``POST
/channels/{id}/typing``.
:meth:`DiscordServer.rate_limit` scripts 429s for the next sends, with ``retry_after`` in the body
and a ``Retry-After`` header (and ``Via``, as Discord's answers come through Google's front end:
discord.py takes a 429 without it for a Cloudflare ban).

The gateway (``/gateway``): HELLO (the heartbeat interval), IDENTIFY (an unknown token closes with
4004; the message content intent asked of a bot that does not have it enabled closes with 4014),
READY (with ``resume_gateway_url``) and a GUILD_CREATE per server, heartbeats acknowledged, each
queued message dispatched as MESSAGE_CREATE with the session's next sequence number. A session
keeps its events: :meth:`DiscordServer.drop` closes the socket (4000, which a client resumes
after), messages queued meanwhile wait in the session, and a RESUME with the last sequence number
the client saw gets the events after it, then RESUMED (``replay_overlap``: that many events before
it too, as a gateway that resends what the client may have missed); an unknown session gets an
INVALID_SESSION.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import WSMsgType, web

from tests.support.platform_server import PlatformServer, Script

MESSAGE_CONTENT = 1 << 15  # the intent
GATEWAY_MESSAGE_CONTENT_LIMITED = 1 << 19  # the application flag: the intent enabled (a bot in under 100 servers)
FIRST_ID = 1_180_000_000_000_000_000


@dataclass
class Call:
    method: str
    path: str
    token: str
    body: dict[str, Any]
    at: float
    query: dict[str, str] = field(default_factory=dict)
    status: int = 200


@dataclass
class Session:
    id: str
    token: str
    events: list[dict[str, Any]] = field(default_factory=list)  # every dispatch, with its sequence number
    socket: web.WebSocketResponse | None = None

    @property
    def seq(self) -> int:
        return len(self.events)


@dataclass
class Bot:
    token: str
    id: str
    name: str
    content_intent: bool = True
    identifies: list[dict[str, Any]] = field(default_factory=list)
    resumes: list[dict[str, Any]] = field(default_factory=list)
    heartbeats: int = 0
    replayed: list[str] = field(default_factory=list)  # the ids of the messages a RESUME dispatched again
    sessions: list[Session] = field(default_factory=list)

    def user(self) -> dict[str, Any]:
        return {"id": self.id, "username": self.name, "discriminator": "0", "global_name": None, "avatar": None,
                "bot": True, "flags": 0}  # fmt: skip


class DiscordServer(PlatformServer[Call]):
    def __init__(self, *, heartbeat_interval_ms: int = 1000, replay_overlap: int = 0) -> None:
        super().__init__()
        self.bots: dict[str, Bot] = {}
        self.guilds: dict[str, dict[str, Any]] = {}
        self.channels: dict[str, dict[str, Any]] = {}
        self.messages: dict[str, dict[str, Any]] = {}  # the users' messages dispatched, by id
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.replay_overlap = replay_overlap
        self._ids = itertools.count(1)
        self._limits: list[float] = []  # retry_after of the next sends answered 429
        self._failures = Script[int]()
        self._resumes_open = asyncio.Event()
        self._resumes_open.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v10"

    def snowflake(self) -> str:
        return str(FIRST_ID + next(self._ids) * 4_194_304)  # spaced like real ids (a millisecond apart)

    def add_bot(self, token: str, name: str = "neo", *, content_intent: bool = True) -> Bot:
        bot = Bot(token, self.snowflake(), name, content_intent)
        self.bots[token] = bot
        return bot

    def add_guild(self, channels: list[str], threads: dict[str, str] | None = None) -> str:
        """A server with text channels and threads (thread id -> its parent channel); its id."""
        guild = self.snowflake()
        listed = [{"id": c, "type": 0, "guild_id": guild, "name": f"c{c[-4:]}", "position": i, "permission_overwrites":
                   [], "nsfw": False, "parent_id": None} for i, c in enumerate(channels)]  # fmt: skip
        threaded = [{"id": t, "type": 11, "guild_id": guild, "parent_id": p, "name": f"t{t[-4:]}", "owner_id": "1",
                     "message_count": 0, "member_count": 1, "rate_limit_per_user": 0,
                     "thread_metadata": {"archived": False, "auto_archive_duration": 1440,
                                         "archive_timestamp": _now(), "locked": False}}
                    for t, p in (threads or {}).items()]  # fmt: skip
        self.guilds[guild] = {"id": guild, "name": "server", "icon": None, "owner_id": "1", "roles": [], "emojis": [],
                              "features": [], "member_count": 2, "members": [], "channels": listed,
                              "threads": threaded, "large": False, "unavailable": False, "verification_level": 0,
                              "default_message_notifications": 0, "explicit_content_filter": 0, "mfa_level": 0,
                              "system_channel_flags": 0, "premium_tier": 0, "preferred_locale": "en-US",
                              "nsfw_level": 0, "stickers": [], "stage_instances": [],
                              "guild_scheduled_events": [], "voice_states": [], "presences": []}  # fmt: skip
        for channel in [*listed, *threaded]:
            self.channels[str(channel["id"])] = channel
        return guild

    def add_thread(self, guild: str, parent: str) -> str:
        """A thread created after the bot's GUILD_CREATE, and never announced to it (no
        THREAD_CREATE): known only to ``GET /channels/{id}``; its id."""
        thread = self.snowflake()
        self.channels[thread] = {"id": thread, "type": 11, "guild_id": guild, "parent_id": parent, "name": "late",
                                 "owner_id": "1", "message_count": 0, "member_count": 1, "rate_limit_per_user": 0,
                                 "thread_metadata": {"archived": False, "auto_archive_duration": 1440,
                                                     "archive_timestamp": _now(), "locked": False}}  # fmt: skip
        return thread

    def app(self) -> web.Application:
        server = web.Application()
        server.router.add_route("*", "/api/v10/{path:.*}", self._rest)
        server.router.add_get("/gateway", self._gateway)
        return server

    async def close(self) -> None:
        for bot in self.bots.values():
            for session in bot.sessions:
                if session.socket is not None:
                    await session.socket.close()
        await super().close()

    # -- what tests do ------------------------------------------------------------------------

    async def message(self, token: str, *, channel: str, author: str, text: str, guild: str | None = None,
                      mentions: tuple[str, ...] = (), bot: bool = False, name: str = "ann",
                      reply_to: str | None = None) -> str:  # fmt: skip
        """Dispatch a MESSAGE_CREATE to the bot's session (queued in it while its socket is down;
        lost, as on Discord, when the bot has no session); the message's id. ``reply_to``: the
        message it replies to (without pinging its author unless ``mentions`` names them)."""
        message_id = self.snowflake()
        by = {"id": author, "username": name, "discriminator": "0", "global_name": name.title(), "avatar": None,
              "bot": bot}  # fmt: skip
        pinged = [{**self.bots[token].user()} for _ in mentions if _ == self.bots[token].id]
        data: dict[str, Any] = {"id": message_id, "channel_id": channel, "author": by, "content": text,
                                "timestamp": _now(), "edited_timestamp": None, "tts": False,
                                "mention_everyone": False, "mentions": pinged, "mention_roles": [],
                                "attachments": [], "embeds": [], "pinned": False, "type": 0}  # fmt: skip
        if reply_to is not None:
            data["type"] = 19
            data["message_reference"] = {"message_id": reply_to, "channel_id": channel, "guild_id": guild}
            data["referenced_message"] = self.messages[reply_to]
        if guild is not None:
            data["guild_id"] = guild
            data["member"] = {"roles": [], "joined_at": _now(), "deaf": False, "mute": False, "flags": 0}
        elif channel not in self.channels:  # a direct chat: a channel of its own, with its one user
            self.channels[channel] = {"id": channel, "type": 1, "recipients": [by], "last_message_id": None}
        self.messages[message_id] = data
        await self.dispatch(token, "MESSAGE_CREATE", data)
        return message_id

    async def edit(self, token: str, message_id: str, text: str, *, mentions: tuple[str, ...] = (),
                   preview: bool = False) -> None:  # fmt: skip
        """Dispatch a MESSAGE_UPDATE of a message sent with :meth:`message`: its new text (``preview``:
        the text as it was and no edit time, what Discord sends when a link's preview loads)."""
        before = self.messages[message_id]
        pinged = [self.bots[token].user() for m in mentions if m == self.bots[token].id]
        data = {**before, "content": before["content"] if preview else text, "mentions": pinged,
                "edited_timestamp": None if preview else _now()}  # fmt: skip
        if preview:
            data["embeds"] = [{"type": "link", "url": "https://example.com/", "title": "Example"}]
        self.messages[message_id] = data
        await self.dispatch(token, "MESSAGE_UPDATE", data)

    async def delete(self, token: str, message_id: str) -> None:
        """Dispatch a MESSAGE_DELETE (ids only, as Discord sends it)."""
        before = self.messages.pop(message_id)
        data = {"id": message_id, "channel_id": before["channel_id"]}
        if "guild_id" in before:
            data["guild_id"] = before["guild_id"]
        await self.dispatch(token, "MESSAGE_DELETE", data)

    async def dispatch(self, token: str, event: str, data: dict[str, Any]) -> None:
        bot = self.bots[token]
        if not bot.sessions:
            return
        session = bot.sessions[-1]
        payload = {"op": 0, "t": event, "s": session.seq + 1, "d": data}
        session.events.append(payload)
        if session.socket is not None and not session.socket.closed:
            await session.socket.send_str(json.dumps(payload))

    async def drop(self, token: str, code: int = 4000, *, hold: bool = False) -> None:
        """Close the bot's gateway socket (4000: an unknown error, which a client resumes after);
        ``hold``: RESUMEs wait until :meth:`release` (what is dispatched meanwhile is queued)."""
        if hold:
            self._resumes_open.clear()
        session = self.bots[token].sessions[-1]
        socket, session.socket = session.socket, None
        if socket is not None:
            await socket.close(code=code, message=b"dropped by the test")

    def release(self) -> None:
        """Let held RESUMEs through."""
        self._resumes_open.set()

    def fail(self, path: str, status: int, times: int = 1) -> None:
        """The next ``times`` calls of ``path`` (``users/@me``) answer ``status`` with Discord's
        error JSON."""
        self._failures.add(path, *[status] * times)

    def rate_limit(self, *retry_after: float) -> None:
        """The next sends answer 429, one per ``retry_after`` (seconds)."""
        self._limits.extend(retry_after)

    def sent(self, channel: str | None = None) -> list[Call]:
        return [c for c in self.calls if c.method == "POST" and c.path.endswith("/messages") and c.status == 200
                and (channel is None or c.path == f"channels/{channel}/messages")]  # fmt: skip

    def of(self, path_end: str) -> list[Call]:
        return [c for c in self.calls if c.path.endswith(path_end)]

    def connected(self, token: str) -> bool:
        bot = self.bots[token]
        return bool(bot.sessions) and bot.sessions[-1].socket is not None and not bot.sessions[-1].socket.closed

    # -- REST ----------------------------------------------------------------------------------

    async def _rest(self, request: web.Request) -> web.Response:
        path = request.match_info["path"]
        token = request.headers.get("Authorization", "").removeprefix("Bot ").strip()
        body = await request.json() if request.can_read_body and request.content_type == "application/json" else {}
        call = Call(request.method, path, token, body, time.monotonic(), query=dict(request.query))
        async with self._recording(call):
            response = self._answer(call)
            call.status = response.status
            return response

    def _answer(self, call: Call) -> web.Response:
        status = self._failures.take(call.path)
        if status is not None:
            return _json({"message": f"{status}: failed by the test", "code": 0}, status=status)
        bot = self.bots.get(call.token)
        if bot is None:
            return _json({"message": "401: Unauthorized", "code": 0}, status=401)
        if call.method == "GET" and call.path == "users/@me":
            return _json(bot.user())
        if call.method == "GET" and call.path == "oauth2/applications/@me":
            flags = GATEWAY_MESSAGE_CONTENT_LIMITED if bot.content_intent else 0
            return _json({"id": bot.id, "name": bot.name, "description": "", "icon": None, "bot_public": False,
                          "bot_require_code_grant": False, "owner": {**bot.user(), "id": "1", "bot": False},
                          "verify_key": "0" * 64, "flags": flags, "interactions_endpoint_url": None})  # fmt: skip
        if call.method == "GET" and call.path == "gateway/bot":
            limit = {"total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 1}
            return _json({"url": f"ws://127.0.0.1:{self.port}/gateway", "shards": 1,
                                      "session_start_limit": limit})  # fmt: skip
        parts = call.path.split("/")
        if len(parts) >= 2 and parts[0] == "channels":
            channel = parts[1]
            if call.method == "GET" and len(parts) == 2:
                found = self.channels.get(channel)
                if found is None:
                    return _json({"message": "Unknown Channel", "code": 10003}, status=404)
                return _json(found)
            if call.method == "POST" and parts[2:] == ["typing"]:
                return web.Response(status=204)
            if call.method == "GET" and parts[2:] == ["messages"]:
                return self._history(channel, call.query)
            if call.method == "POST" and parts[2:] == ["messages"]:
                if self._limits:
                    wait = self._limits.pop(0)
                    headers = {"Retry-After": str(wait), "Via": "1.1 google", "X-RateLimit-Scope": "user"}
                    return _json({"message": "You are being rate limited.", "retry_after": wait,
                                              "global": False}, status=429, headers=headers)  # fmt: skip
                sent = {"id": self.snowflake(), "channel_id": channel, "author": bot.user(),
                        "content": call.body.get("content", ""), "timestamp": _now(), "edited_timestamp": None,
                        "tts": False, "mention_everyone": False, "mentions": [], "mention_roles": [],
                        "attachments": [], "embeds": [], "pinned": False, "type": 0}  # fmt: skip
                self.messages[str(sent["id"])] = sent
                return _json(sent)
        return _json({"message": "404: Not Found", "code": 0}, status=404)

    def _history(self, channel: str, query: dict[str, str]) -> web.Response:
        """``GET /channels/{id}/messages?after=&limit=``: the ``limit`` messages right after
        ``after``, the newest first (as Discord answers)."""
        after, limit = int(query.get("after", "0")), int(query.get("limit", "50"))
        found = sorted((m for m in self.messages.values() if m["channel_id"] == channel and int(m["id"]) > after),
                       key=lambda m: int(m["id"]))[:limit]  # fmt: skip
        return _json(list(reversed(found)))

    # -- the gateway ---------------------------------------------------------------------------

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str(json.dumps({"op": 10, "d": {"heartbeat_interval": self.heartbeat_interval_ms}}))
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                data = json.loads(msg.data)
                op, d = data.get("op"), data.get("d")
                if op == 1:
                    for bot in self.bots.values():
                        if any(s.socket is ws for s in bot.sessions):
                            bot.heartbeats += 1
                    await ws.send_str(json.dumps({"op": 11}))
                elif op == 2:
                    await self._identify(ws, d)
                elif op == 6:
                    await self._resume(ws, d)
                await self._notify()
        finally:
            await self._notify()
        return ws

    async def _identify(self, ws: web.WebSocketResponse, d: dict[str, Any]) -> None:
        bot = self.bots.get(str(d.get("token", "")).removeprefix("Bot "))
        if bot is None:
            await ws.close(code=4004, message=b"Authentication failed.")
            return
        bot.identifies.append(d)
        if int(d.get("intents", 0)) & MESSAGE_CONTENT and not bot.content_intent:
            await ws.close(code=4014, message=b"Disallowed intent(s).")
            return
        session = Session(f"session-{next(self._ids)}", bot.token, socket=ws)
        bot.sessions.append(session)
        ready = {"v": 10, "user": bot.user(), "guilds": [{"id": g, "unavailable": True} for g in self.guilds],
                 "session_id": session.id, "resume_gateway_url": f"ws://127.0.0.1:{self.port}/gateway",
                 "application": {"id": bot.id, "flags": 0}, "private_channels": [], "relationships": []}  # fmt: skip
        await self.dispatch(bot.token, "READY", ready)
        for guild in self.guilds.values():
            await self.dispatch(bot.token, "GUILD_CREATE", guild)

    async def _resume(self, ws: web.WebSocketResponse, d: dict[str, Any]) -> None:
        await self._resumes_open.wait()
        bot = self.bots.get(str(d.get("token", "")).removeprefix("Bot "))
        session = next((s for s in bot.sessions if s.id == d.get("session_id")), None) if bot else None
        if bot is None or session is None:
            await ws.send_str(json.dumps({"op": 9, "d": False}))
            return
        bot.resumes.append(d)
        session.socket = ws
        seen = int(d.get("seq") or 0)
        for payload in session.events[max(1, seen - self.replay_overlap) :]:  # never READY again
            if payload["t"] == "MESSAGE_CREATE":
                bot.replayed.append(payload["d"]["id"])
            await ws.send_str(json.dumps(payload))
        await self.dispatch(bot.token, "RESUMED", {})


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """JSON as Discord sends it: ``Content-Type: application/json`` exactly (discord.py reads a
    body as JSON only then)."""
    return web.Response(body=json.dumps(data).encode(), status=status,
                        headers={"Content-Type": "application/json", **(headers or {})})  # fmt: skip


def _now() -> str:
    return datetime.now(UTC).isoformat()


__all__ = ["Bot", "Call", "DiscordServer"]
