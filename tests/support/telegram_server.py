"""A local Telegram Bot API server for the test suite and the benchmark, recording every call.

It speaks the part of the Bot API the connector uses, in Telegram's own shapes, so the real
aiogram client talks to it through ``api_base``: ``getMe``, ``getUpdates`` (long polling; an
``offset`` confirms every update below it, as Telegram does, and ``confirmed`` remembers it),
``sendMessage`` (the HTML is checked as Telegram checks it: unknown or badly nested tags are
``400 can't parse entities``; text over 4096 characters is ``400 message is too long``),
``sendChatAction``, ``setMyCommands``, ``setWebhook``, ``deleteWebhook``. Tokens it does not know answer 401.
Tests queue updates with :meth:`TelegramServer.message` (or any JSON with :meth:`update`, e.g. a
message with :func:`older_poll`, a shape aiogram does not read) and script failures with
:meth:`fail` (e.g. a 429 storm with ``retry_after``, or :func:`bad_gateway`: the HTML page a
proxy answers when the Bot API behind it is down). Updates and calls outlive a daemon restart: the server
runs in the test process.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

from aiohttp import web

from tests.support.platform_server import PlatformServer, Script, proxy_page

ALLOWED_TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "a", "code", "pre", "blockquote",
                "span", "tg-spoiler"}  # fmt: skip
LIMIT = 4096


class _Checker(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.text: list[str] = []
        self.error: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in ALLOWED_TAGS:
            self.error = self.error or f'unsupported start tag "{tag}"'
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.error = self.error or f'unexpected end tag "{tag}"'
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse_html(text: str) -> tuple[str, str | None]:
    """(visible text, error) as Telegram's HTML parse mode sees it (raw '<' or '&' unescaped fail)."""
    checker = _Checker()
    checker.feed(text)
    checker.close()
    if checker.stack and checker.error is None:
        checker.error = f'can\'t find end tag corresponding to start tag "{checker.stack[-1]}"'
    return "".join(checker.text), checker.error


@dataclass
class Call:
    token: str
    method: str
    params: dict[str, Any]
    at: float


@dataclass
class Failure:
    status: int
    description: str
    retry_after: int | None = None
    html: bool = False  # an HTML page (a proxy's), not the Bot API's JSON
    result: Any = None  # not None: the call is carried out and answered ok with this result instead


@dataclass
class Bot:
    token: str
    id: int
    username: str
    updates: list[dict[str, Any]] = field(default_factory=list)
    confirmed: int = 0  # every update below this id has been confirmed by an offset
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


class TelegramServer(PlatformServer[Call]):
    def __init__(self) -> None:
        super().__init__()
        self.bots: dict[str, Bot] = {}
        self.failures = Script[Failure]()
        self._update_ids = itertools.count(1000)
        self._message_ids = itertools.count(1)
        self.message_ids: dict[int, int] = {}  # update_id -> the message_id of its message

    def add_bot(self, token: str, username: str) -> Bot:
        bot = Bot(token, int(token.split(":")[0]), username)
        self.bots[token] = bot
        return bot

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        return app

    async def close(self) -> None:
        for bot in self.bots.values():
            bot.arrived.set()
        await super().close()

    # -- what tests do ------------------------------------------------------------------------

    def fail(self, method: str, *failures: Failure) -> None:
        """The next calls of ``method`` answer these failures, one each, in order."""
        self.failures.add(method, *failures)

    def message(
        self,
        token: str,
        *,
        chat_id: int,
        chat_type: str = "private",
        from_id: int = 555,
        first_name: str = "Ann",
        text: str | None = None,
        entities: list[dict[str, Any]] | None = None,
        thread_id: int | None = None,
        reply_to_bot: bool = False,
        edited: bool = False,
        message_id: int | None = None,
        **extra: Any,
    ) -> int:
        """Queue a message update (``edited``: an ``edited_message`` of ``message_id``, as Telegram
        sends an edit); its update_id is returned."""
        bot = self.bots[token]
        chat: dict[str, Any] = {"id": chat_id, "type": chat_type}
        if chat_type == "private":
            chat["first_name"] = first_name
        else:
            chat["title"] = "Team"
            if thread_id is not None:
                chat["is_forum"] = True
        message: dict[str, Any] = {
            "message_id": message_id if message_id is not None else next(self._message_ids),
            "date": int(time.time()),
            "chat": chat,
            "from": {"id": from_id, "is_bot": False, "first_name": first_name},
            **extra,
        }
        if edited:
            message.setdefault("edit_date", int(time.time()))
        if text is not None:
            message["text"] = text
        if entities:
            message["entities"] = entities
        if thread_id is not None:
            message["message_thread_id"] = thread_id
            message["is_topic_message"] = True
        if reply_to_bot:
            message["reply_to_message"] = {
                "message_id": 1, "date": int(time.time()), "chat": chat,
                "from": {"id": bot.id, "is_bot": True, "first_name": "Bot", "username": bot.username},
                "text": "earlier answer",
            }  # fmt: skip
        update_id = next(self._update_ids)
        self.message_ids[update_id] = message["message_id"]
        bot.updates.append({"update_id": update_id, "edited_message" if edited else "message": message})
        bot.arrived.set()
        return update_id

    def update(self, token: str, body: dict[str, Any]) -> int:
        """Queue an update of any shape (``body`` without its ``update_id``); its update_id is returned."""
        bot = self.bots[token]
        update_id = next(self._update_ids)
        bot.updates.append({"update_id": update_id, **body})
        bot.arrived.set()
        return update_id

    def take_update(self, token: str) -> dict[str, Any]:
        """The last queued update, taken off the queue (to POST it to a webhook as Telegram would)."""
        return self.bots[token].updates.pop()

    def sent(self, token: str | None = None, chat_id: int | None = None) -> list[Call]:
        return [
            c for c in self.calls
            if c.method == "sendMessage" and c.params.get("_ok") and (token is None or c.token == token)
            and (chat_id is None or str(c.params["chat_id"]) == str(chat_id))
        ]  # fmt: skip

    def of(self, method: str, token: str | None = None) -> list[Call]:
        return [c for c in self.calls if c.method == method and (token is None or c.token == token)]

    # -- the Bot API ----------------------------------------------------------------------------

    async def _params(self, request: web.Request) -> dict[str, Any]:
        if request.content_type == "application/json":
            data = await request.json()
            return dict(data) if isinstance(data, dict) else {}
        form = await request.post()
        params: dict[str, Any] = dict(request.query)
        for key, value in form.items():
            text = value if isinstance(value, str) else ""
            try:
                params[key] = json.loads(text)
            except ValueError:
                params[key] = text
        return params

    async def _handle(self, request: web.Request) -> web.Response:
        token, method = request.match_info["token"], request.match_info["method"]
        params = await self._params(request)
        async with self._recording(Call(token, method, params, time.monotonic())):
            bot = self.bots.get(token)
            if bot is None:
                return _error(401, "Unauthorized")
            failure = self.failures.take(method)
            if failure is not None:
                if failure.result is not None:
                    handler = getattr(self, f"_m_{method}")
                    await handler(bot, params)
                    return _ok(failure.result)
                if failure.html:
                    return proxy_page(failure.status, failure.description)
                return _error(failure.status, failure.description, failure.retry_after)
            handler = getattr(self, f"_m_{method}", None)
            if handler is None:
                return _error(404, "Not Found: method not found")
            result: web.Response = await handler(bot, params)
            return result

    async def _m_getMe(self, bot: Bot, params: dict[str, Any]) -> web.Response:
        return _ok({"id": bot.id, "is_bot": True, "first_name": "Neotask", "username": bot.username})

    async def _m_setMyCommands(self, bot: Bot, params: dict[str, Any]) -> web.Response:
        return _ok(True)

    async def _m_setWebhook(self, bot: Bot, params: dict[str, Any]) -> web.Response:
        return _ok(True)

    async def _m_deleteWebhook(self, bot: Bot, params: dict[str, Any]) -> web.Response:
        return _ok(True)

    async def _m_sendChatAction(self, bot: Bot, params: dict[str, Any]) -> web.Response:
        return _ok(True)

    async def _m_getUpdates(self, bot: Bot, params: dict[str, Any]) -> web.Response:
        offset = int(params.get("offset") or 0)
        if offset:
            bot.confirmed = max(bot.confirmed, offset)
            bot.updates = [u for u in bot.updates if u["update_id"] >= offset]
        timeout = float(params.get("timeout") or 0)
        limit = int(params.get("limit") or 100)
        deadline = time.monotonic() + timeout
        while not bot.updates and time.monotonic() < deadline:
            bot.arrived.clear()
            try:
                await asyncio.wait_for(bot.arrived.wait(), deadline - time.monotonic())
            except TimeoutError:
                break
        return _ok(bot.updates[:limit])

    async def _m_sendMessage(self, bot: Bot, params: dict[str, Any]) -> web.Response:
        text = str(params.get("text", ""))
        visible = text
        if params.get("parse_mode") == "HTML":
            visible, error = parse_html(text)
            if error is not None:
                return _error(400, f"Bad Request: can't parse entities: {error}")
        if len(visible.encode("utf-16-le")) // 2 > LIMIT:
            return _error(400, "Bad Request: message is too long")
        params["_ok"] = True
        chat_id = int(params["chat_id"])
        message: dict[str, Any] = {
            "message_id": next(self._message_ids),
            "date": int(time.time()),
            "chat": {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup"},
            "from": {"id": bot.id, "is_bot": True, "first_name": "Neotask", "username": bot.username},
            "text": visible,
        }
        if params.get("message_thread_id"):
            message["message_thread_id"] = int(params["message_thread_id"])
        return _ok(message)


def _ok(result: Any) -> web.Response:
    return web.json_response({"ok": True, "result": result})


def _error(status: int, description: str, retry_after: int | None = None) -> web.Response:
    body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
    if retry_after is not None:
        body["parameters"] = {"retry_after": retry_after}
    return web.json_response(body, status=status)


def bad_gateway() -> Failure:
    """What a reverse proxy answers when the Bot API behind it is down: an HTML page."""
    return Failure(502, "Bad Gateway", html=True)


def newer_shape() -> Failure:
    """The call is carried out, but its answer has a shape the client may not read (a message
    without ``chat``, as a later Bot API might change it)."""
    return Failure(200, "OK", result={"message_id": 999_999, "date": int(time.time())})


def older_poll(chat_id: int, from_id: int = 555) -> dict[str, Any]:
    """A message update carrying a poll as an older Bot API sent it: options without
    ``persistent_id``, no ``allows_revoting``: aiogram refuses the whole ``getUpdates`` answer."""
    poll = {"id": "5012", "question": "Lunch?", "options": [{"text": "yes", "voter_count": 0},
            {"text": "no", "voter_count": 0}], "total_voter_count": 0, "is_closed": False, "is_anonymous": True,
            "type": "regular", "allows_multiple_answers": False}  # fmt: skip
    chat = {"id": chat_id, "type": "private", "first_name": "Ann"}
    sender = {"id": from_id, "is_bot": False, "first_name": "Ann"}
    return {"message": {"message_id": 90_000 + chat_id % 1000, "date": int(time.time()), "chat": chat,
                        "from": sender, "poll": poll}}  # fmt: skip


def rate_limited(retry_after: int = 1) -> Failure:
    return Failure(429, f"Too Many Requests: retry after {retry_after}", retry_after)
