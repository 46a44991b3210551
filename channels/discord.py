"""The Discord connector: one bot account on discord.py 2, over the gateway.

Start-up: the bot logs in over REST (``GET /users/@me``; a refused token is one clear log line and
the account's ``last_error``, the other accounts are not touched), asks ``GET /gateway/bot`` where
the gateway is, and connects there with the message content intent (privileged: without it Discord
sends messages with no text). A gateway that closes with 4014 (the intent is not enabled in the
developer portal) stops the account with a log line saying where to turn it on.

REST goes to ``api_base`` (null: Discord's ``/api/v10``) through this account's own HTTP client
(:class:`_AccountHTTP`: discord.py's, with the base and the gateway's URL per account; its global
``Route.BASE`` is never changed), so a proxy or a test server can stand in for both.

Each message is handed to the post function, which returns once it is durable; its id (a
snowflake) is the delivery id (``discord:<account>:<message id>`` as client_message_id), so a
message the gateway dispatches again after a RESUME is stored once. discord.py keeps the gateway
going itself (heartbeats, RESUME after a dropped connection, a new session when Discord says so).
The gateway has no acknowledgement and keeps nothing for a bot that is not connected: at each new
session the connector fetches over REST what was written since the last message it stored in each
recently active chat (``_catch_up``), so what came while the daemon was down, or was dispatched but
not stored before a kill, is stored then (once: by its id).

Replies go out as Discord Markdown, at most 2,000 characters a message, with mentions of
everyone, roles and users switched off (a model's ``@everyone`` pings nobody); a channel message is
answered as a reply to it. A 429 is waited out by discord.py (its ``retry_after``) and, past its
tries, by the outbox with the same hint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import warnings
from collections.abc import Awaitable, Mapping
from datetime import timedelta
from typing import Any

import aiohttp
import yarl

with warnings.catch_warnings():  # discord.py's voice player imports audioop (deprecated since 3.11; no voice here)
    warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
    import discord
    from discord.gateway import DiscordWebSocket
    from discord.http import HTTPClient, Route

from channels.account import AccountParts
from channels.discord_events import CHANNEL, Seen, inbound
from channels.discord_format import DISCORD_LIMIT, split
from channels.handover import hand_over
from channels.protocol import PostFn, Rejected, RetryLater, Skip, Target
from channels.revisions import Ignored
from channels.store import ChannelStore
from channels.supervisor import MAX_BACKOFF_S, supervise
from config.channels import DiscordAccount
from config.clock import Clock, iso
from config.errors import NotFound

log = logging.getLogger(__name__)
DEFAULT_API = "https://discord.com/api/v10"
INTENTS_CLOSE_CODE = 4014  # the gateway's "disallowed intents": a privileged intent not enabled for the bot
TOKEN_CLOSE_CODE = 4004  # the gateway's "authentication failed"
_SYSTEM_OK = (discord.MessageType.default, discord.MessageType.reply)
NO_PINGS = discord.AllowedMentions.none()
CATCH_UP_SINCE = timedelta(days=1)  # the chats where a message was stored within this are fetched at a new session
CATCH_UP_CHATS = 100  # at most this many chats, the latest first
CATCH_UP_MESSAGES = 100  # at most this many messages per chat


class _AccountHTTP(HTTPClient):
    """discord.py's HTTP client for one account: REST to ``api_base``, and a new session's gateway
    at the URL ``GET {api_base}/gateway/bot`` answers (a resume goes where READY said)."""

    def __init__(self, loop: Any, *, api_base: str, **options: Any) -> None:
        super().__init__(loop, **options)
        self.api_base = api_base.rstrip("/")

    async def request(self, route: Route, **kwargs: Any) -> Any:
        if route.url.startswith(Route.BASE) and self.api_base != Route.BASE:
            route.url = self.api_base + route.url[len(Route.BASE) :]
        return await super().request(route, **kwargs)

    async def ws_connect(self, url: str, *, compress: int = 0) -> aiohttp.ClientWebSocketResponse:
        asked = yarl.URL(url)
        if asked.with_query(None) == DiscordWebSocket.DEFAULT_GATEWAY:  # a new session: ask where the gateway is
            _shards, gateway, _limit = await self.get_bot_gateway()
            url = str(yarl.URL(gateway).with_query(asked.query))
        return await super().ws_connect(url, compress=compress)


discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = False  # no voice here: no warning that it is off


class _Client(discord.Client):
    """A discord.py client whose HTTP client is the account's (``_AccountHTTP``)."""

    def __init__(self, api_base: str, **options: Any) -> None:
        super().__init__(**options)
        self.http = _AccountHTTP(self.loop, api_base=api_base, max_ratelimit_timeout=MAX_BACKOFF_S)
        self._connection.http = self.http


class DiscordConnector(AccountParts[DiscordAccount]):
    """One Discord bot account."""

    channel = CHANNEL

    def __init__(self, name: str, account: DiscordAccount, token: str, store: ChannelStore, *, clock: Clock,
                 limit: int = DISCORD_LIMIT) -> None:  # fmt: skip
        super().__init__(CHANNEL, name, account, store, clock=clock, limit=limit, notify=self.notify)
        self.status.extra["resumes"] = 0
        self._token = token
        self._client: _Client | None = None
        self._bot_id: str | None = None
        self._dm_users: dict[str, str] = {}  # direct chat id -> its user (a deletion names neither)
        self._parents: dict[int, int | None] = {}  # channel id -> the channel a thread is under (None: not a thread)
        self._task: asyncio.Task[None] | None = None
        self._post: PostFn | None = None
        self._taking: set[asyncio.Task[None]] = set()
        self._catching_up: set[asyncio.Task[None]] = set()

    @property
    def api_base(self) -> str:
        return (self.settings.api_base or DEFAULT_API).rstrip("/")

    @property
    def takes_calls(self) -> bool:
        return False

    async def receive(self, body: bytes, headers: Mapping[str, str]) -> dict[str, Any] | None:
        """Never called (``takes_calls`` is false: the intake answers such a call 404 first)."""
        raise NotFound(f"discord account {self.account} holds the gateway; Discord's interactions endpoint is not"
                       " supported")  # fmt: skip

    async def start(self, post: PostFn) -> None:
        self._post = post
        self._task = asyncio.create_task(supervise(self._run, self.status), name=f"discord {self.account}")

    def _new_client(self) -> _Client:
        intents = discord.Intents.none()
        intents.guilds = True  # the servers' channels and threads, to tell a thread from a channel
        intents.guild_messages = intents.dm_messages = True
        intents.guild_typing = intents.dm_typing = False
        intents.message_content = True  # privileged: enabled under Bot in the developer portal
        client = _Client(self.api_base, intents=intents, chunk_guilds_at_startup=False, member_cache_flags=
                         discord.MemberCacheFlags.none(), max_messages=None, guild_ready_timeout=0.5)  # fmt: skip
        client.event(self._on_message_for(client))

        @client.event
        async def on_raw_message_edit(payload: discord.RawMessageUpdateEvent) -> None:
            await self._tracked(self._take_edit(client, payload))

        @client.event
        async def on_raw_message_delete(payload: discord.RawMessageDeleteEvent) -> None:
            await self._tracked(self._take_deletion(client, payload))

        @client.event
        async def on_connect() -> None:  # a new session (READY): what was sent before it is fetched
            self._connected()
            self._catch_up_task(client)

        @client.event
        async def on_resumed() -> None:
            self.status.extra["resumes"] += 1
            self._connected()

        @client.event
        async def on_disconnect() -> None:
            self.status.connected = False

        return client

    def _on_message_for(self, client: _Client) -> Any:
        async def on_message(message: discord.Message) -> None:
            await self._tracked(self._take_message(client, message))

        return on_message

    async def _tracked(self, taking: Awaitable[None]) -> None:
        """Run an event's handling in the task discord.py gave it, known to stop() (which cancels
        those still waiting to be stored)."""
        task = asyncio.current_task()
        if task is not None:
            self._taking.add(task)
        try:
            await taking
        finally:
            if task is not None:
                self._taking.discard(task)

    def _catch_up_task(self, client: _Client) -> None:
        task = asyncio.create_task(self._catch_up(client), name=f"discord {self.account} catch-up")
        self._catching_up.add(task)
        task.add_done_callback(self._catching_up.discard)

    async def _catch_up(self, client: _Client) -> None:
        """Fetch what was written, since the last message stored, in the chats and threads where
        this account stored a message within ``CATCH_UP_SINCE``: what came while the daemon was
        down, or was dispatched but not stored before a kill. Each is handed on like a message from
        the gateway (stored once: a message the gateway delivers too is recognised by its id)."""
        since = iso(self.clock() - CATCH_UP_SINCE)
        try:
            chats = await self.store.recent_chats(CHANNEL, self.account, since, CATCH_UP_CHATS)
        except (sqlite3.Error, OSError) as exc:
            log.warning("discord account %s: the chats to catch up on are not readable: %s", self.account, exc)
            return
        for chat_id, thread_id, last in chats:
            where = int(thread_id or chat_id)
            try:
                channel = client.get_channel(where) or await client.fetch_channel(where)
                if not isinstance(channel, discord.abc.Messageable):
                    continue
                fetched = 0
                async for message in channel.history(after=discord.Object(int(last)), limit=CATCH_UP_MESSAGES,
                                                     oldest_first=True):  # fmt: skip
                    fetched += 1
                    await self._take_message(client, message)
            except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
                log.warning("discord account %s: messages of %s since %s not fetched: %s", self.account, where, last,
                            exc)  # fmt: skip
                continue
            if fetched:
                log.info("discord account %s: %d message(s) of %s since %s fetched", self.account, fetched, where,
                         last)  # fmt: skip

    def _connected(self) -> None:
        self.status.connected = True
        self.status.last_error = None

    def _token_refused(self, how: str) -> None:
        self._stop(f"Discord refused the token in {self.settings.token_env} ({how})",
                   f"fix {self.settings.token_env} (developer portal: your application, Bot, Reset Token) and"
                   " restart")  # fmt: skip

    async def _run(self) -> None:
        """Log in and hold the gateway (returns only when Discord refuses the token or the intent)."""
        if self._client is not None:
            await self._client.close()
        client = self._client = self._new_client()
        backoff = 1.0
        while True:
            try:
                await client.login(self._token)
                break
            except discord.LoginFailure:
                self._token_refused("401 Unauthorized")
                return
            except (discord.HTTPException, aiohttp.ClientError, OSError, TimeoutError) as exc:
                self.status.connected = False
                self.status.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("discord account %s: %s; trying again in %.0f s", self.account, self.status.last_error,
                            backoff)  # fmt: skip
                await client.close()  # its HTTP session with it: the next try is a new client
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                client = self._client = self._new_client()
        assert client.user is not None
        self._bot_id = str(client.user.id)
        self.status.username = str(client.user)
        await self.access.load()
        log.info("discord account %s: logged in as %s, connecting to the gateway", self.account, client.user)
        try:
            await client.connect(reconnect=True)
        except discord.PrivilegedIntentsRequired:
            self._stop(f"the gateway closed with {INTENTS_CLOSE_CODE}: the bot asks for the message content intent,"
                       " which is not enabled for it (without it Discord sends messages without their text)",
                       "turn on Message Content Intent (developer portal: your application, Bot, Privileged Gateway"
                       " Intents) and restart")  # fmt: skip
            return
        except discord.ConnectionClosed as exc:
            if exc.code == TOKEN_CLOSE_CODE:
                self._token_refused(f"the gateway closed with {TOKEN_CLOSE_CODE}, authentication failed")
                return
            raise
        if not client.is_closed():
            raise RuntimeError("the gateway connection ended")

    async def _parent(self, client: _Client, channel: Any) -> int | None:
        """The channel a thread is under (None: not a thread), from discord.py's cache, else asked
        once over REST (a thread created before the bot saw its server)."""
        if isinstance(channel, discord.Thread):
            return channel.parent_id
        if isinstance(
            channel, discord.TextChannel | discord.VoiceChannel | discord.StageChannel | discord.ForumChannel
        ):
            return None
        if channel.id not in self._parents:
            fetched = await client.fetch_channel(channel.id)
            self._parents[channel.id] = fetched.parent_id if isinstance(fetched, discord.Thread) else None
        return self._parents[channel.id]

    async def _seen(self, client: _Client, message: discord.Message, *, edit: bool = False) -> Seen:
        guild_id = message.guild.id if message.guild is not None else getattr(message.channel, "guild_id", None)
        parent = await self._parent(client, message.channel) if guild_id is not None else None
        author = message.author
        return Seen(
            message_id=str(message.id),
            channel_id=str(message.channel.id),
            guild_id=str(guild_id) if guild_id is not None else None,
            author_id=str(author.id),
            author_name=author.display_name,
            author_bot=author.bot,
            text=message.content,
            parent_id=str(parent) if parent is not None else None,
            mentions=tuple(sorted(_addressed(message))),
            attachments=tuple((a.filename, a.content_type) for a in message.attachments),
            system=message.type not in _SYSTEM_OK,
            revision="edit" if edit else None,
            edited_at=message.edited_at.isoformat() if edit and message.edited_at else None,
        )

    async def _take_message(self, client: _Client, message: discord.Message) -> None:
        if self._post is None or self._bot_id is None:
            return
        try:
            seen = await self._seen(client, message)
        except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
            log.warning("discord account %s: message %s skipped: its channel could not be read (%s)", self.account,
                        message.id, exc)  # fmt: skip
            return
        if seen.guild_id is None and not seen.author_bot:
            self._dm_users[seen.channel_id] = seen.author_id
        await self._take(seen)

    async def _take_edit(self, client: _Client, payload: discord.RawMessageUpdateEvent) -> None:
        if self._post is None or self._bot_id is None:
            return
        try:
            seen = await self._seen(client, payload.message, edit=True)
        except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
            log.warning("discord account %s: edit of %s skipped: its channel could not be read (%s)", self.account,
                        payload.message_id, exc)  # fmt: skip
            return
        await self._take(seen)

    async def _take_deletion(self, client: _Client, payload: discord.RawMessageDeleteEvent) -> None:
        """A deletion carries only ids: in a direct chat, its sender is the chat's other user, known
        from a message seen since the start (else the deletion is not stored)."""
        if self._post is None or self._bot_id is None:
            return
        channel_id, guild_id = str(payload.channel_id), payload.guild_id
        author = "" if guild_id is not None else self._dm_users.get(channel_id)
        if author is None:
            log.debug("discord account %s: deletion of %s skipped: the direct chat's user is not known since the"
                      " start", self.account, payload.message_id)  # fmt: skip
            return
        channel = client.get_channel(payload.channel_id) or client.get_partial_messageable(
            payload.channel_id, guild_id=guild_id
        )
        try:
            parent = await self._parent(client, channel) if guild_id is not None else None
        except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
            log.warning("discord account %s: deletion of %s skipped: its channel could not be read (%s)",
                        self.account, payload.message_id, exc)  # fmt: skip
            return
        seen = Seen(message_id=str(payload.message_id), channel_id=channel_id,
                    guild_id=str(guild_id) if guild_id is not None else None, author_id=author, author_name=None,
                    author_bot=False, text="", parent_id=str(parent) if parent is not None else None,
                    revision="delete")  # fmt: skip
        await self._take(seen)

    async def _take(self, seen: Seen) -> None:
        """Hand one message (or revision) on. The gateway has no acknowledgement: one that could
        not be stored now is tried again here, while the daemon runs."""
        assert self._post is not None and self._bot_id is not None
        self.status.last_update_at = iso(self.clock())
        parsed = inbound(seen, self.account, self.settings, self._bot_id)
        message = parsed if isinstance(parsed, Skip) else await self.revisions.check(parsed)
        if isinstance(message, Skip | Ignored):
            log.debug("discord account %s: message %s skipped: %s", self.account, seen.message_id, message.reason)
            return
        what = f"discord account {self.account}: message {message.update_id}"
        backoff = 1.0
        while not await hand_over(message, self._post, access=self.access, revisions=self.revisions,
                                  status=self.status, what=what):  # fmt: skip
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    # -- sending --------------------------------------------------------------------------------

    def render(self, markdown: str) -> list[str]:
        return split(markdown, self.limit)

    def _require_client(self) -> _Client:
        if self._client is None or self._bot_id is None:
            raise RetryLater(f"discord account {self.account} is not logged in yet")
        return self._client

    async def _send(self, target: Target, text: str) -> None:
        client = self._require_client()
        channel = client.get_partial_messageable(int(target.chat_id))
        reference = (discord.MessageReference(message_id=int(target.reply_to), channel_id=int(target.chat_id),
                                              fail_if_not_exists=False) if target.reply_to else None)  # fmt: skip
        await channel.send(text, reference=reference, allowed_mentions=NO_PINGS)  # type: ignore[arg-type]

    async def send_part(self, target: Target, part: str) -> None:
        try:
            await self._send(target, part)
        except discord.RateLimited as exc:  # longer than discord.py waits by itself
            raise RetryLater(f"discord: rate limited for {exc.retry_after:.1f} s", exc.retry_after) from None
        except discord.HTTPException as exc:
            if exc.status == 429:
                raise RetryLater(f"discord: 429 {exc.text}", _retry_after(exc)) from None
            if exc.status >= 500:
                raise RetryLater(f"discord: {exc.status} {exc.text}") from None
            if exc.status == 401:  # kept for a restart with a fixed token
                raise RetryLater(f"discord: 401 {exc.text}", MAX_BACKOFF_S) from None
            raise Rejected(f"discord: {exc.status} {exc.text}") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise RetryLater(f"discord: {type(exc).__name__}: {exc}") from None
        self.status.messages_out += 1

    async def typing(self, target: Target) -> None:
        client = self._client
        if client is None or self._bot_id is None:
            return
        with contextlib.suppress(discord.HTTPException, aiohttp.ClientError, OSError, TimeoutError):
            await client.http.send_typing(int(target.chat_id))

    async def notify(self, target: Target, text: str) -> bool:
        try:
            await self._send(target, text)
        except (discord.HTTPException, discord.RateLimited, aiohttp.ClientError, OSError, TimeoutError,
                RetryLater) as exc:  # fmt: skip
            log.warning("discord account %s: notice to %s not sent: %s", self.account, target.chat_id, exc)
            return False
        return True

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for task in [*self._taking, *self._catching_up]:
            task.cancel()
        await asyncio.gather(*self._taking, *self._catching_up, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
        self.status.connected = False


def _addressed(message: discord.Message) -> set[str]:
    """The users a message addresses: those it mentions (``<@id>`` in its text, and a replied-to
    author it pings), and the author of the message it replies to, pinged or not."""
    users = {str(i) for i in message.raw_mentions} | {str(u.id) for u in message.mentions}
    replied = message.reference.resolved if message.reference is not None else None
    if isinstance(replied, discord.Message):
        users.add(str(replied.author.id))
    return users


def _retry_after(exc: discord.HTTPException) -> float | None:
    """A 429's Retry-After header, in seconds (discord.py keeps the response, not its body)."""
    header = exc.response.headers.get("Retry-After") if exc.response is not None else None
    try:
        return float(header) if header else None
    except ValueError:
        return None
