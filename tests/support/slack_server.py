"""A local Slack server for the test suite: the Web API methods the connector calls and Socket
Mode, recording every call and every acknowledgement.

- ``POST /api/auth.test`` (bot token), ``POST /api/apps.connections.open`` (app-level token: the
  answer's ``url`` is this server's WebSocket), ``POST /api/chat.postMessage`` (recorded);
  an unknown token answers ``{"ok": false, "error": "invalid_auth"}``. :meth:`SlackServer.fail`
  scripts the next answers of a method (before the token is looked at): a status and an error, or
  an HTML page (what a proxy in front answers when Slack is down).
- ``GET /link``: the Socket Mode WebSocket. It says ``hello``, then pushes each queued event as
  an ``events_api`` envelope; an envelope the client does not acknowledge (``{"envelope_id"}``)
  is pushed again on the next connection, with ``retry_attempt`` counted, as Slack does.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from tests.support.platform_server import PlatformServer, Script, proxy_page


@dataclass
class Call:
    method: str
    token: str
    params: dict[str, Any]
    at: float


@dataclass
class App:
    bot_token: str
    app_token: str
    bot_user: str
    envelopes: dict[str, dict[str, Any]] = field(default_factory=dict)  # not yet acknowledged
    acks: list[str] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


class SlackServer(PlatformServer[Call]):
    def __init__(self) -> None:
        super().__init__()
        self.apps: list[App] = []
        self._ids = itertools.count(1)
        self._sockets: set[web.WebSocketResponse] = set()
        self.failures = Script[tuple[int, str, int | None, bool]]()
        self.ts: dict[str, str] = {}  # event_id -> the ts of the message it carries

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    def add_app(self, bot_token: str, app_token: str, bot_user: str = "UBOT") -> App:
        app = App(bot_token, app_token, bot_user)
        self.apps.append(app)
        return app

    def app(self) -> web.Application:
        server = web.Application()
        server.router.add_post("/api/{method}", self._api)
        server.router.add_get("/link", self._link)
        return server

    async def close(self) -> None:
        for ws in list(self._sockets):
            await ws.close()
        await super().close()

    # -- what tests do ------------------------------------------------------------------------

    def message(self, app: App, *, channel: str, user: str, text: str, channel_type: str = "im",
                thread_ts: str | None = None, **extra: Any) -> str:  # fmt: skip
        """Queue a ``message`` event; its event_id is returned."""
        n = next(self._ids)
        event: dict[str, Any] = {"type": "message", "channel": channel, "channel_type": channel_type, "user": user,
                                 "text": text, "ts": f"1700000000.{n:06d}", **extra}  # fmt: skip
        if thread_ts is not None:
            event["thread_ts"] = thread_ts
        event_id = f"Ev{n:08d}"
        self.ts[event_id] = event["ts"]
        payload = {"team_id": "T1", "api_app_id": "A1", "event": event, "type": "event_callback", "event_id": event_id,
                   "event_time": int(time.time())}  # fmt: skip
        envelope = {"envelope_id": f"env-{n}", "type": "events_api", "accepts_response_payload": False,
                    "retry_attempt": 0, "retry_reason": "", "payload": payload}  # fmt: skip
        app.envelopes[envelope["envelope_id"]] = envelope
        app.arrived.set()
        return event_id

    def edit(
        self, app: App, *, channel: str, ts: str, user: str, text: str, previous_text: str, channel_type: str = "im",
        thread_ts: str | None = None,
    ) -> str:  # fmt: skip
        """Queue a ``message_changed`` event: the message ``ts`` of ``user`` read ``previous_text`` and
        now reads ``text`` (the same text: what Slack sends when it unfurls a link or counts a
        reply in the message's thread); its event_id is returned."""
        n = next(self._ids)
        message: dict[str, Any] = {"type": "message", "user": user, "text": text, "ts": ts}
        previous: dict[str, Any] = {"type": "message", "user": user, "text": previous_text, "ts": ts}
        if text != previous_text:
            message["edited"] = {"user": user, "ts": f"1700000000.{n:06d}"}
        else:
            message["attachments"] = [{"from_url": "https://example.com/", "title": "Example", "id": 1}]
        if thread_ts is not None:
            message["thread_ts"] = previous["thread_ts"] = thread_ts
        event = {"type": "message", "subtype": "message_changed", "hidden": True, "channel": channel,
                 "channel_type": channel_type, "ts": f"1700000000.{n:06d}", "message": message,
                 "previous_message": previous}  # fmt: skip
        return self._queue(app, n, "events_api", event=event)

    def deletion(
        self, app: App, *, channel: str, deleted_ts: str, user: str, text: str, channel_type: str = "im"
    ) -> str:
        """Queue a ``message_deleted`` event for a message of ``user``; its event_id is returned."""
        n = next(self._ids)
        event = {"type": "message", "subtype": "message_deleted", "hidden": True, "channel": channel,
                 "channel_type": channel_type, "ts": f"1700000000.{n:06d}", "deleted_ts": deleted_ts,
                 "previous_message": {"type": "message", "user": user, "text": text, "ts": deleted_ts}}  # fmt: skip
        return self._queue(app, n, "events_api", event=event)

    def slash(self, app: App, *, command: str, user: str, channel: str, text: str = "") -> str:
        """Queue a ``slash_commands`` envelope (what Slack sends when a user types ``/status``);
        its envelope id is returned."""
        n = next(self._ids)
        payload = {"token": "x", "team_id": "T1", "team_domain": "t", "channel_id": channel, "channel_name": "x",
                   "user_id": user, "user_name": user.lower(), "command": command, "text": text, "api_app_id": "A1",
                   "is_enterprise_install": "false", "response_url": f"http://127.0.0.1:{self.port}/respond/{n}",
                   "trigger_id": f"{n}.1.abc"}  # fmt: skip
        envelope = {"envelope_id": f"env-{n}", "type": "slash_commands", "accepts_response_payload": True,
                    "payload": payload}  # fmt: skip
        app.envelopes[envelope["envelope_id"]] = envelope
        app.arrived.set()
        return str(envelope["envelope_id"])

    def _queue(self, app: App, n: int, kind: str, *, event: dict[str, Any]) -> str:
        event_id = f"Ev{n:08d}"
        payload = {"team_id": "T1", "api_app_id": "A1", "event": event, "type": "event_callback", "event_id": event_id,
                   "event_time": int(time.time())}  # fmt: skip
        envelope = {"envelope_id": f"env-{n}", "type": kind, "accepts_response_payload": False,
                    "retry_attempt": 0, "retry_reason": "", "payload": payload}  # fmt: skip
        app.envelopes[envelope["envelope_id"]] = envelope
        app.arrived.set()
        return event_id

    def fail(self, method: str, status: int, error: str, retry_after: int | None = None, times: int = 1, *,
             html: bool = False) -> None:  # fmt: skip
        """The next ``times`` calls of ``method`` answer this failure (429 with ``Retry-After``;
        ``html``: an HTML page titled ``error`` instead of Slack's JSON)."""
        self.failures.add(method, *[(status, error, retry_after, html)] * times)

    def posted(self, channel: str | None = None) -> list[Call]:
        return [c for c in self.calls if c.method == "chat.postMessage" and c.params.get("_ok")
                and (channel is None or c.params.get("channel") == channel)]  # fmt: skip

    # -- the Web API ----------------------------------------------------------------------------

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if request.content_type == "application/json":
            params = dict(await request.json())
        else:
            params = {k: v for k, v in (await request.post()).items() if isinstance(v, str)}
        async with self._recording(Call(method, token, params, time.monotonic())):
            failure = self.failures.take(method)
            if failure is not None:
                return _failure(*failure)
            if method == "apps.connections.open":
                if not any(a.app_token == token for a in self.apps):
                    return web.json_response({"ok": False, "error": "invalid_auth"})
                return web.json_response({"ok": True, "url": f"ws://127.0.0.1:{self.port}/link?token={token}"})
            app = next((a for a in self.apps if a.bot_token == token), None)
            if app is None:
                return web.json_response({"ok": False, "error": "invalid_auth"})
            if method == "auth.test":
                return web.json_response({"ok": True, "user_id": app.bot_user, "user": "neotask", "team_id": "T1"})
            if method == "chat.postMessage":
                params["_ok"] = True
                ts = f"1700000001.{next(self._ids):06d}"
                return web.json_response({"ok": True, "channel": params.get("channel"), "ts": ts})
            return web.json_response({"ok": False, "error": "unknown_method"}, status=404)

    async def _link(self, request: web.Request) -> web.WebSocketResponse:
        app = next(a for a in self.apps if a.app_token == request.query.get("token"))
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._sockets.add(ws)
        await ws.send_json({"type": "hello", "num_connections": 1, "connection_info": {"app_id": "A1"}})
        sent: set[str] = set()

        async def push() -> None:
            while not ws.closed:
                for envelope_id, envelope in list(app.envelopes.items()):
                    if envelope_id not in sent:
                        sent.add(envelope_id)
                        await ws.send_json(envelope)
                        if "retry_attempt" in envelope:  # events count retries; slash commands are never retried
                            envelope["retry_attempt"] += 1
                app.arrived.clear()
                await app.arrived.wait()

        pusher = asyncio.create_task(push())
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    data = json.loads(msg.data)
                    envelope_id = data.get("envelope_id")
                    if envelope_id and app.envelopes.pop(envelope_id, None) is not None:
                        app.acks.append(envelope_id)
                        await self._notify()
        finally:
            pusher.cancel()
            self._sockets.discard(ws)
        return ws


def _failure(status: int, error: str, retry_after: int | None, html: bool) -> web.Response:
    if html:
        return proxy_page(status, error)
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    return web.json_response({"ok": False, "error": error}, status=status, headers=headers)
