"""The Telegram connector: one bot account on aiogram 3, by long polling.

Start-up: ``getMe`` (a refused token is one clear log line and the account's ``last_error``; the
other accounts are not touched), ``setMyCommands``, ``deleteWebhook`` (polling and a webhook
exclude each other), then ``getUpdates`` in a loop. Each update's message is handed to the post
function, which returns once it is durable; only then does the next ``getUpdates`` carry an
offset past it, which is what tells Telegram the update is done. A crash in between means the
update comes again, and its ``client_message_id`` (``telegram:<account>:<update_id>``) makes the
second store a no-op.

Direct chats go through ``dm_policy``: ``allowlist`` (ids in ``allow_from``), ``pairing`` (an
unknown sender gets a one-time code, approved with ``neotask channels approve CODE``) or ``open``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import Mapping
from typing import Any

from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import (
    TelegramAPIError,
    TelegramBadRequest,
    TelegramConflictError,
    TelegramForbiddenError,
    TelegramNetworkError,
    TelegramNotFound,
    TelegramRetryAfter,
    TelegramServerError,
    TelegramUnauthorizedError,
)
from aiogram.types import BotCommand, ReplyParameters, Update
from aiogram.utils.token import TokenValidationError
from pydantic import ValidationError

from channels.access import DirectAccess
from channels.protocol import AccountStatus, PostFn, Rejected, RetryLater, Target
from channels.store import ChannelStore
from channels.telegram_format import TELEGRAM_LIMIT, split, to_plain
from channels.telegram_updates import CHANNEL, BotIdentity, Skip, inbound
from config.channels import TelegramAccount
from config.chat_commands import CHAT_COMMANDS
from config.clock import Clock, iso
from config.errors import BadRequest, ChannelNotReady, InvalidBody, InvalidSignature, NeotaskError

log = logging.getLogger(__name__)
ALLOWED_UPDATES = ["message", "edited_message"]
MENU = [BotCommand(command=c.name, description=c.summary) for c in CHAT_COMMANDS]  # the help's list, whole
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
MAX_BACKOFF_S = 30.0


class TelegramConnector:
    """One Telegram bot account."""

    channel = CHANNEL

    def __init__(
        self, name: str, account: TelegramAccount, token: str, store: ChannelStore, *, clock: Clock,
        limit: int = TELEGRAM_LIMIT, webhook_secret: str | None = None,
    ) -> None:  # fmt: skip
        self.account = name
        self.settings = account
        self.store = store
        self.clock = clock
        self.limit = limit
        self.status = AccountStatus(CHANNEL, name, account.agent, account.mode, enabled=account.enabled)
        self._token = token
        self._bot: Bot | None = None
        self._me: BotIdentity | None = None
        self._task: asyncio.Task[None] | None = None
        self.access = DirectAccess(CHANNEL, name, account, store, clock=clock, notify=self.notify)
        self._webhook_secret = webhook_secret
        self._post: PostFn | None = None

    def _client(self) -> Bot:
        api = TelegramAPIServer.from_base(self.settings.api_base) if self.settings.api_base else None
        session = AiohttpSession(api=api) if api is not None else AiohttpSession()
        return Bot(self._token, session=session)

    async def start(self, post: PostFn) -> None:
        try:
            self._bot = self._client()
        except TokenValidationError:
            self._refused(f"the value of {self.settings.token_env} is not a bot token (expected <digits>:<secret>)")
            return
        self._post = post
        self._task = asyncio.create_task(self._run(post), name=f"telegram {self.account}")

    def _refused(self, why: str) -> None:
        message = (f"telegram account {self.account}: {why}; this account is stopped, the others keep running;"
                   f" fix {self.settings.token_env} (from @BotFather) and restart")  # fmt: skip
        log.error("%s", message)
        self.status.connected = False
        self.status.last_error = message

    async def _run(self, post: PostFn) -> None:
        bot = self._bot
        assert bot is not None
        backoff = 1.0
        while self._me is None:
            try:
                me = await bot.get_me()
                self._me = BotIdentity(me.id, me.username or "")
                self.status.username = me.username
                await self.access.load()
                await bot.set_my_commands(MENU)
                if self.settings.mode == "webhook":
                    assert self.settings.webhook_url is not None
                    await bot.set_webhook(
                        self.settings.webhook_url, secret_token=self._webhook_secret, allowed_updates=ALLOWED_UPDATES
                    )
                else:
                    await bot.delete_webhook(drop_pending_updates=False)
            except TelegramUnauthorizedError:
                self._refused(f"the Bot API refused the token in {self.settings.token_env} (401 Unauthorized)")
                return
            except (TelegramNetworkError, TelegramServerError, TelegramRetryAfter) as exc:
                self._me = None
                backoff = await self._wait_after(exc, backoff)
        if self.settings.mode == "webhook":
            self.status.connected = True
            self.status.last_error = None
            log.info("telegram account %s: connected as @%s, webhook %s", self.account, self._me.username,
                     self.settings.webhook_url)  # fmt: skip
            return
        log.info("telegram account %s: connected as @%s, long polling", self.account, self._me.username)
        await self._poll(bot, post)

    @property
    def takes_calls(self) -> bool:
        return self.settings.mode == "webhook"

    async def receive(self, body: bytes, headers: Mapping[str, str]) -> dict[str, Any]:
        """One webhook call (``/hooks/telegram/<account>``): returns once the update is durable, so
        the 200 tells Telegram it is done; otherwise raises (Telegram retries a call it was not
        answered 2xx). The secret is checked before the body is read."""
        secret = headers.get(SECRET_HEADER)
        expected = self._webhook_secret or ""
        if not secret or not hmac.compare_digest(secret.encode(), expected.encode()):
            raise InvalidSignature(
                "missing or wrong X-Telegram-Bot-Api-Secret-Token: the webhook is registered with the secret in"
                f" {self.settings.webhook_secret_env}"
            )
        if self._me is None or self._post is None or self._bot is None:
            raise ChannelNotReady(f"telegram account {self.account} is not connected yet; Telegram will retry")
        try:
            data = json.loads(body)
        except ValueError:
            raise InvalidBody("the body is not JSON: Telegram sends one Update object per call") from None
        try:
            update = Update.model_validate(data, context={"bot": self._bot})
        except ValidationError as exc:
            raise BadRequest(f"not a Telegram update: {exc.errors()[0]['msg']}") from None
        if not await self._take(update, self._post):
            raise ChannelNotReady(f"update {update.update_id} could not be stored now; Telegram will retry")
        return {"ok": True}

    async def _wait_after(self, exc: Exception, backoff: float) -> float:
        self.status.connected = False
        self.status.last_error = f"{type(exc).__name__}: {exc}"
        wait = float(exc.retry_after) if isinstance(exc, TelegramRetryAfter) else backoff
        log.warning("telegram account %s: %s; trying again in %.0f s", self.account, self.status.last_error, wait)
        await asyncio.sleep(wait)
        return min(backoff * 2, MAX_BACKOFF_S)

    async def _poll(self, bot: Bot, post: PostFn) -> None:
        offset: int | None = None
        backoff = 1.0
        timeout = self.settings.poll_timeout_s
        while True:
            try:
                updates = await bot.get_updates(
                    offset=offset, timeout=timeout, allowed_updates=ALLOWED_UPDATES, request_timeout=timeout + 10
                )
            except TelegramUnauthorizedError:
                self._refused(f"the Bot API refused the token in {self.settings.token_env} (401 Unauthorized)")
                return
            except TelegramConflictError as exc:  # another process polls this bot, or a webhook is set
                backoff = await self._wait_after(exc, backoff)
                continue
            except (TelegramNetworkError, TelegramServerError, TelegramRetryAfter) as exc:
                backoff = await self._wait_after(exc, backoff)
                continue
            backoff = 1.0
            self.status.connected = True
            self.status.last_error = None
            if updates:
                offset = await self._take_batch(updates, post, offset)

    async def _take_batch(self, updates: list[Update], post: PostFn, offset: int | None) -> int | None:
        """Hand a batch on: the chats in parallel, each chat's updates in order. The next offset
        is past the batch when every update is durable, else at the first one that is not (those
        after it that were stored come again and are recognised by their client_message_id)."""
        by_chat: dict[int, list[Update]] = {}
        for update in updates:
            message = update.message or update.edited_message
            by_chat.setdefault(message.chat.id if message is not None else 0, []).append(update)

        async def chat_in_order(chat_updates: list[Update]) -> int | None:
            for update in chat_updates:
                if not await self._take(update, post):
                    return update.update_id  # not durable: this chat stops here
            return None

        failed = [f for f in await asyncio.gather(*(chat_in_order(u) for u in by_chat.values())) if f is not None]
        return min(failed) if failed else updates[-1].update_id + 1

    async def _take(self, update: Update, post: PostFn) -> bool:
        """Hand one update on; True once it needs no further delivery (stored, or skipped)."""
        assert self._me is not None
        self.status.last_update_at = iso(self.clock())
        message = inbound(update, self.account, self.settings, self._me)
        if isinstance(message, Skip):
            log.debug("telegram account %s: update %s skipped: %s", self.account, update.update_id, message.reason)
            return True
        if message.chat_type == "direct" and not await self.access.admitted(message):
            return True
        try:
            await post(message)
        except NeotaskError as exc:
            if exc.transient:  # shutting down, storage unavailable or full, busy: the update comes again
                log.warning(
                    "telegram account %s: update %s not stored: %s", self.account, update.update_id, exc.message
                )
                self.status.last_error = exc.message
                await asyncio.sleep(1.0)
                return False
            # refused for good (a paused session, a bad id): dropped, said so
            log.warning("telegram account %s: update %s refused: %s", self.account, update.update_id, exc.message)
            self.status.last_error = exc.message
            return True
        self.status.messages_in += 1
        return True

    # -- sending --------------------------------------------------------------------------------

    def render(self, markdown: str) -> list[str]:
        return split(markdown, self.limit)

    async def send_part(self, target: Target, part: str) -> None:
        try:
            try:
                await self._send(target, part, "HTML")
            except TelegramBadRequest as exc:
                if "parse" not in str(exc).lower():
                    raise
                log.warning("telegram account %s: HTML refused (%s); sent as plain text", self.account, exc)
                await self._send(target, to_plain(part), None)
        except TelegramRetryAfter as exc:
            raise RetryLater(str(exc), float(exc.retry_after)) from None
        except (TelegramNetworkError, TelegramServerError) as exc:
            raise RetryLater(f"{type(exc).__name__}: {exc}") from None
        except TelegramUnauthorizedError as exc:  # kept for a restart with a fixed token
            raise RetryLater(f"{type(exc).__name__}: {exc}", MAX_BACKOFF_S) from None
        except (TelegramForbiddenError, TelegramNotFound, TelegramBadRequest) as exc:
            raise Rejected(f"{type(exc).__name__}: {exc}") from None
        self.status.messages_out += 1

    async def _send(self, target: Target, text: str, parse_mode: str | None) -> None:
        bot = self._require_bot()
        reply = (
            ReplyParameters(message_id=int(target.reply_to), allow_sending_without_reply=True)
            if target.reply_to
            else None
        )
        await bot.send_message(
            int(target.chat_id),
            text,
            message_thread_id=int(target.thread_id) if target.thread_id else None,
            parse_mode=parse_mode,
            reply_parameters=reply,
        )

    async def typing(self, target: Target) -> None:
        bot = self._require_bot()
        with contextlib.suppress(TelegramAPIError):
            await bot.send_chat_action(
                int(target.chat_id), "typing", message_thread_id=int(target.thread_id) if target.thread_id else None
            )

    async def notify(self, target: Target, text: str) -> bool:
        try:
            await self._send(target, text, None)
        except (TelegramAPIError, Rejected) as exc:
            log.warning("telegram account %s: notice to %s not sent: %s", self.account, target.chat_id, exc)
            return False
        return True

    def _require_bot(self) -> Bot:
        if self._bot is None:
            raise Rejected(f"telegram account {self.account} is not running")
        return self._bot

    @property
    def running(self) -> bool:
        return self._me is not None and self._task is not None and not self._task.done()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._bot is not None:
            await self._bot.session.close()
        self.status.connected = False
