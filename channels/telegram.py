"""The Telegram connector: one bot account on aiogram 3, by long polling.

Start-up: ``getMe`` (a refused token is one clear log line and the account's ``last_error``; the
other accounts are not touched), ``setMyCommands``, ``deleteWebhook`` (polling and a webhook
exclude each other), then ``getUpdates`` in a loop. Each update's message is handed to the post
function, which returns once it is durable; only then does the next ``getUpdates`` carry an
offset past it, which is what tells Telegram the update is done. A crash in between means the
update comes again, and its ``client_message_id`` (``telegram:<account>:<update_id>``, with the
bot's id before the update id for any bot but the account's first) makes the second store a no-op.

Nothing stops the account quietly: an update aiogram does not read is kept in ``channels.db``,
logged and confirmed; an answer that is not JSON (a proxy's HTML error page) is retried like a
5xx; and whatever else ends the connector's task is logged and the task started again
(``channels/supervisor.py``).

Direct chats go through ``dm_policy``: ``allowlist`` (ids in ``allow_from``), ``pairing`` (an
unknown sender gets a one-time code, approved with ``neotask channels approve CODE``) or ``open``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from aiogram import Bot
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import (
    ClientDecodeError,
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

from channels.account import AccountParts
from channels.handover import hand_over
from channels.protocol import PostFn, Rejected, RetryLater, Skip, Target
from channels.revisions import Ignored
from channels.store import ChannelStore
from channels.supervisor import supervise
from channels.telegram_format import TELEGRAM_LIMIT, split, to_plain
from channels.telegram_updates import (
    CHANNEL,
    BotIdentity,
    Unreadable,
    delivery_id,
    inbound,
    read_batch,
    read_update,
    why,
)
from config.channels import TelegramAccount
from config.chat_commands import CHAT_COMMANDS
from config.clock import Clock, iso
from config.errors import BadRequest, ChannelNotReady, InvalidBody, InvalidSignature

log = logging.getLogger(__name__)
ALLOWED_UPDATES = ["message", "edited_message"]
MENU = [BotCommand(command=c.name, description=c.summary) for c in CHAT_COMMANDS]  # the help's list, whole
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
MAX_BACKOFF_S = 30.0
_TRANSIENT = (TelegramNetworkError, TelegramServerError, TelegramRetryAfter, ClientDecodeError)


class TelegramConnector(AccountParts[TelegramAccount]):
    """One Telegram bot account."""

    channel = CHANNEL

    def __init__(
        self, name: str, account: TelegramAccount, token: str, store: ChannelStore, *, clock: Clock,
        limit: int = TELEGRAM_LIMIT, webhook_secret: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(CHANNEL, name, account, store, clock=clock, limit=limit, notify=self.notify)
        self.status.extra["updates_unreadable"] = 0
        self._token = token
        self._bot: Bot | None = None
        self._me: BotIdentity | None = None
        self._task: asyncio.Task[None] | None = None
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
        run = supervise(lambda: self._run(post), self.status)
        self._task = asyncio.create_task(run, name=f"telegram {self.account}")

    def _refused(self, why: str) -> None:
        self._stop(why, f"fix {self.settings.token_env} (from @BotFather) and restart")

    async def _run(self, post: PostFn) -> None:
        """Connect, then poll (returns only when the token is refused, or once a webhook is set)."""
        bot = self._bot
        assert bot is not None
        if not await self._connect(bot):
            return
        assert self._me is not None
        if self.settings.mode == "webhook":
            self.status.connected = True
            self.status.last_error = None
            log.info("telegram account %s: connected as @%s, webhook %s", self.account, self._me.username,
                     self.settings.webhook_url)  # fmt: skip
            return
        log.info("telegram account %s: connected as @%s, long polling", self.account, self._me.username)
        await self._poll(bot, post)

    async def _connect(self, bot: Bot) -> bool:
        """``getMe``, the command menu, the webhook set (or deleted, to poll); a network error, a
        5xx, a 429 or an answer that is not JSON is waited out. False: the token was refused."""
        backoff = 1.0
        while True:
            try:
                me = await bot.get_me()
                identity = await self._identity(me.id, me.username or "")
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
                return False
            except _TRANSIENT as exc:
                backoff = await self._wait_after(exc, backoff)
                continue
            self._me = identity
            self.status.username = me.username
            return True

    async def _identity(self, bot_id: int, username: str) -> BotIdentity:
        """The bot, keyed by its id unless it is the first the account ran with (whose keys, as
        earlier versions wrote them, carry no bot id: a redelivery after an upgrade is found)."""
        first = await self.store.first_bot(CHANNEL, self.account, str(bot_id), iso(self.clock()))
        return BotIdentity(bot_id, username, keyed=first != str(bot_id))

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
        update = read_update(data, self._bot)
        if update is None:
            raise BadRequest("not a Telegram update: no integer update_id")
        if isinstance(update, Unreadable):  # answered 200: else Telegram retries it and holds the rest
            await self._keep_unreadable(update)
            return {"ok": True}
        if not await self._take(update, self._post):
            raise ChannelNotReady(f"update {update.update_id} could not be stored now; Telegram will retry")
        return {"ok": True}

    async def _wait_after(self, exc: Exception, backoff: float) -> float:
        self.status.connected = False
        self.status.last_error = failure_text(exc)
        wait = float(exc.retry_after) if isinstance(exc, TelegramRetryAfter) else backoff
        log.warning("telegram account %s: %s; trying again in %.0f s", self.account, self.status.last_error, wait)
        await asyncio.sleep(wait)
        return min(backoff * 2, MAX_BACKOFF_S)

    async def _poll(self, bot: Bot, post: PostFn) -> None:
        offset: int | None = None
        backoff = 1.0
        while True:
            try:
                updates, unreadable = await self._fetch(bot, offset)
            except TelegramUnauthorizedError:
                self._refused(f"the Bot API refused the token in {self.settings.token_env} (401 Unauthorized)")
                return
            except TelegramConflictError as exc:  # another process polls this bot, or a webhook is set
                backoff = await self._wait_after(exc, backoff)
                continue
            except _TRANSIENT as exc:
                backoff = await self._wait_after(exc, backoff)
                continue
            backoff = 1.0
            self.status.connected = True
            self.status.last_error = None
            if updates or unreadable:
                offset = await self._take_batch(updates, unreadable, post)

    async def _fetch(self, bot: Bot, offset: int | None) -> tuple[list[Update], list[Unreadable]]:
        """One ``getUpdates``. aiogram refuses a whole answer for one update it does not read: that
        answer is read again update by update (an answer that is not a list of updates is raised)."""
        timeout = self.settings.poll_timeout_s
        try:
            updates = await bot.get_updates(
                offset=offset, timeout=timeout, allowed_updates=ALLOWED_UPDATES, request_timeout=timeout + 10
            )
        except ClientDecodeError as exc:
            batch = read_batch(exc.data, bot)
            if batch is None:
                raise
            return batch
        return updates, []

    async def _take_batch(self, updates: list[Update], unreadable: list[Unreadable], post: PostFn) -> int:
        """Hand a batch on: the unreadable updates kept, the chats in parallel, each chat's updates
        in order. The next offset is past the batch when every update is durable, else at the first
        one that is not (those after it that were stored come again and are recognised by their
        client_message_id)."""
        for skipped in unreadable:
            await self._keep_unreadable(skipped)
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
        last = max([u.update_id for u in updates] + [u.update_id for u in unreadable])
        return min(failed) if failed else last + 1

    async def _keep_unreadable(self, update: Unreadable) -> None:
        """Keep an update aiogram does not read (``channels.db``, ``unreadable_updates``), log it
        once and count it; it is then confirmed like any other."""
        assert self._me is not None
        update_id = delivery_id(update.update_id, self._me)
        body = json.dumps(update.raw, ensure_ascii=False)
        if await self.store.unreadable(CHANNEL, self.account, update_id, update.reason, body, iso(self.clock())):
            self.status.extra["updates_unreadable"] += 1
            log.warning("telegram account %s: update %s could not be read and is skipped (%s); kept in channels.db"
                        " (unreadable_updates)", self.account, update_id, update.reason)  # fmt: skip

    async def _take(self, update: Update, post: PostFn) -> bool:
        """Hand one update on; True once it needs no further delivery (stored, or skipped)."""
        assert self._me is not None
        self.status.last_update_at = iso(self.clock())
        parsed = inbound(update, self.account, self.settings, self._me)
        message = parsed if isinstance(parsed, Skip) else await self.revisions.check(parsed)
        if isinstance(message, Skip | Ignored):
            log.debug("telegram account %s: update %s skipped: %s", self.account, update.update_id, message.reason)
            return True
        what = f"telegram account {self.account}: update {update.update_id}"
        if await hand_over(message, post, access=self.access, revisions=self.revisions, status=self.status, what=what):
            return True
        await asyncio.sleep(1.0)  # not stored now: the update comes again (its offset is not confirmed)
        return False

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
        except ClientDecodeError as exc:
            if not _accepted(exc):
                raise RetryLater(failure_text(exc)) from None
            log.warning("telegram account %s: a part was sent; Telegram's answer was not read: %s", self.account,
                        failure_text(exc))  # fmt: skip
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
        with contextlib.suppress(TelegramAPIError, ClientDecodeError):
            await bot.send_chat_action(
                int(target.chat_id), "typing", message_thread_id=int(target.thread_id) if target.thread_id else None
            )

    async def notify(self, target: Target, text: str) -> bool:
        try:
            await self._send(target, text, None)
        except (TelegramAPIError, ClientDecodeError, Rejected) as exc:
            log.warning("telegram account %s: notice to %s not sent: %s", self.account, target.chat_id,
                        failure_text(exc))  # fmt: skip
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


def failure_text(exc: Exception) -> str:
    """A failure as the status and the log show it; an answer aiogram could not read is summed up
    (an HTML page from a proxy is not dumped into the log)."""
    if not isinstance(exc, ClientDecodeError):
        return f"{type(exc).__name__}: {exc}"
    if isinstance(exc.original, ValidationError):
        return f"the Bot API's answer has a shape aiogram does not read ({why(exc.original)})"
    page = " ".join(re.sub(r"<[^>]*>", " ", str(exc.data)).split())
    return f"the Bot API answered with something that is not JSON (a proxy's error page?): {page[:120]!r}"


def _accepted(exc: ClientDecodeError) -> bool:
    """Telegram said ``ok`` and only its answer was not read (the call was carried out)."""
    return isinstance(exc.original, ValidationError) and isinstance(exc.data, dict) and exc.data.get("ok") is True
