"""The Matrix connector: one bot user on a homeserver, on matrix-nio's ``AsyncClient``, by
``/sync`` long polling (no public URL needed). The sync's JSON is read as it is (nio's own
``sync`` models every event, a second of CPU per thousand); nio makes every other call.

Start-up: ``whoami`` with the access token (a refused token, or one of another user, is one log
line and the account's ``last_error``; the other accounts keep running), the bot's display name
(a mention by name), then ``/sync`` in a loop from the sync token kept in ``channels.db``
(``connector_state``, ``next_batch``). Each sync's invites are decided (joined or rejected as
``dm_policy`` says) and its messages handed to the post function, room by room in parallel and in
order within a room; only once every one is durable is the sync's ``next_batch`` kept, so a crash
in between syncs those events again, and their event ids (``matrix:<account>:<event id>`` as
client_message_id) make the second store a no-op. A first start (no token kept) answers nothing
that was written before it: it takes the invites and keeps the token.

Invites: from an owner (``allow_from``), or anyone under ``dm_policy: open``, joined; under
``pairing`` a direct invite from anyone is joined (the sender's first message gets a pairing
code) and a group invite only from an approved sender; every other invite is rejected (left).
A room's kind (direct or group) is kept when it is joined; a room joined otherwise is direct when
it has two members.

End-to-end encrypted rooms: with ``encryption`` on (the default when matrix-nio's e2e extra is
installed) the account's olm machine (channels/matrix_crypto.py) takes each sync's keys and
decrypts its encrypted events, which then go on as clear ones; the replies to an encrypted room
are encrypted. An event that does not decrypt is logged once per room and megolm session and,
under ``undecryptable: notice``, answered once with a notice saying so; it waits for its key to
come in a later sync, also across a restart (channels/matrix_waiting.py), and is read then.
With encryption off (or unavailable) the first encrypted event of a room is answered once with a
notice that the bot cannot read it; the log says it, and the account's status lists the room
(``encrypted_rooms``).

Sends: ``m.text`` with ``formatted_body`` (HTML) and the Markdown as ``body``, in the thread of
the message answered; the transaction id is derived from the room, the event answered and the
part, so a part sent again after a crash (before its send was recorded) is the same transaction
and the homeserver keeps one. A 429 ``M_LIMIT_EXCEEDED`` is waited out for its ``retry_after_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from typing import Any
from urllib.parse import urlencode

import aiohttp
from nio import (
    AsyncClient,
    AsyncClientConfig,
    ErrorResponse,
    JoinedMembersResponse,
    JoinError,
    LocalProtocolError,
    ProfileGetDisplayNameResponse,
    RoomLeaveError,
    RoomSendError,
    SendRetryError,
    WhoamiError,
)

from channels.account import AccountParts
from channels.handover import hand_over
from channels.matrix_crypto import Crypto, Undecryptable
from channels.matrix_crypto import available as crypto_available
from channels.matrix_events import CHANNEL, DIRECT, GROUP, Bot, Encrypted, inbound, invite_of
from channels.matrix_format import MATRIX_LIMIT, content, split
from channels.matrix_waiting import WaitingEvents
from channels.protocol import Inbound, PostFn, Rejected, RetryLater, Skip, Target
from channels.revisions import Ignored
from channels.store import ChannelStore
from channels.supervisor import MAX_BACKOFF_S, supervise
from config.channels import MatrixAccount
from config.clock import Clock, iso

log = logging.getLogger(__name__)
TOKEN_REFUSALS = frozenset({"M_UNKNOWN_TOKEN", "M_MISSING_TOKEN", "M_FORBIDDEN"})
REJECTED_SENDS = frozenset({"M_FORBIDDEN", "M_NOT_FOUND", "M_UNKNOWN", "M_BAD_JSON", "M_NOT_JSON", "M_TOO_LARGE"})
NEXT_BATCH = "next_batch"
TIMELINE_LIMIT = 100  # events per room and sync; more (a long outage) is paged back with /messages
ENCRYPTED_NOTICE = ("This room is end-to-end encrypted, and this bot cannot read encrypted messages. "
                    "Talk to it in a room without encryption.")  # fmt: skip
UNDECRYPTABLE_NOTICE = ("I could not decrypt a message in this room: no key for it reached this bot's device. "
                        "Send it again; if this keeps happening, check that your client shares room keys with "
                        "unverified devices.")  # fmt: skip
NIO_FAILURES = (LocalProtocolError, SendRetryError)  # nio's own refusals before a send (a room or keys not ready)
SYNC_FILTER: dict[str, Any] = {
    "presence": {"types": []},
    "account_data": {"types": []},
    "room": {
        "timeline": {"limit": TIMELINE_LIMIT},
        "state": {"lazy_load_members": True, "types": ["m.room.encryption", "m.room.member"]},
        "ephemeral": {"types": []},
        "account_data": {"types": []},
    },
}


def _code(response: Any) -> str:
    return str(getattr(response, "status_code", None) or "")


def _http_status(response: Any) -> int:
    transport = getattr(response, "transport_response", None)
    return int(getattr(transport, "status", 0) or 0)


class MatrixConnector(AccountParts[MatrixAccount]):
    """One Matrix bot account."""

    channel = CHANNEL

    def __init__(self, name: str, account: MatrixAccount, token: str, store: ChannelStore, *, clock: Clock,
                 limit: int = MATRIX_LIMIT) -> None:  # fmt: skip
        super().__init__(CHANNEL, name, account, store, clock=clock, limit=limit, notify=self.notify)
        self.status.extra["encrypted_rooms"] = []
        config = AsyncClientConfig(max_limit_exceeded=0, max_timeouts=0, encryption_enabled=False,
                                   store_sync_tokens=False, request_timeout=30)  # fmt: skip
        self.client = AsyncClient(account.homeserver, account.user_id, config=config)
        self.client.access_token = token
        self.client.user_id = account.user_id
        self.bot = Bot(account.user_id)
        self.timeline_limit = TIMELINE_LIMIT
        self._kinds: dict[str, str] = {}
        self._told_encrypted: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self.crypto: Crypto | None = None  # end-to-end encryption: opened at start, once whoami gave the device
        self.crypto_folder = store.path.parent / "matrix" / name  # the account's crypto store, under the home
        self._told_undecryptable: set[str] = set()
        self.waiting = WaitingEvents(store, name, clock)  # encrypted events that came before their key

    async def start(self, post: PostFn) -> None:
        self._task = asyncio.create_task(supervise(lambda: self._run(post), self.status), name=f"matrix {self.account}")

    def _refused(self, why: str) -> None:
        self._stop(why, f"fix {self.settings.access_token_env} (the bot user's access token) and restart")

    async def _failed(self, failure: str, backoff: float, wait: float | None = None) -> float:
        self.status.connected = False
        self.status.last_error = failure
        pause = wait if wait is not None else backoff
        log.warning("matrix account %s: %s; trying again in %.1f s", self.account, failure, pause)
        await asyncio.sleep(pause)
        return min(backoff * 2, MAX_BACKOFF_S)

    async def _connect(self) -> bool:
        """``whoami`` until the homeserver answers it; False: the token was refused."""
        backoff = 1.0
        while True:
            try:
                me = await self.client.whoami()
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                backoff = await self._failed(f"whoami: {type(exc).__name__}: {exc}", backoff)
                continue
            if isinstance(me, WhoamiError):
                if _code(me) in TOKEN_REFUSALS or _http_status(me) == 401:
                    self._refused(f"the homeserver refused the token in {self.settings.access_token_env}"
                                  f" ({_code(me) or _http_status(me)}: {me.message})")  # fmt: skip
                    return False
                wait = (me.retry_after_ms or 0) / 1000 or None
                backoff = await self._failed(f"whoami answered {_code(me) or _http_status(me)}: {me.message}",
                                             backoff, wait)  # fmt: skip
                continue
            if me.user_id != self.settings.user_id:
                self._refused(f"the token in {self.settings.access_token_env} is {me.user_id}'s, not"
                              f" {self.settings.user_id}'s")  # fmt: skip
                return False
            self.client.device_id = me.device_id or ""
            return True

    async def _run(self, post: PostFn) -> None:
        if not await self._connect():
            return
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
            name = await self.client.get_displayname(self.settings.user_id)
            if isinstance(name, ProfileGetDisplayNameResponse) and name.displayname:
                self.bot = Bot(self.settings.user_id, name.displayname)
        self.status.username = self.settings.user_id.removeprefix("@")
        await self.access.load()
        await self._open_crypto()
        log.info("matrix account %s: connected as %s to %s, /sync", self.account, self.settings.user_id,
                 self.settings.homeserver)  # fmt: skip
        await self._sync_loop(post)

    async def _open_crypto(self) -> None:
        """The olm machine on the account's store, keys uploaded; or why encryption is off."""
        wanted, missing = self.settings.encryption, crypto_available()
        if wanted is False or (wanted is None and missing):
            self.status.extra["encryption"] = "off" if wanted is False else f"off: {missing}"
            return
        if missing:
            log.error("matrix account %s: encryption: true, but %s (pip install 'matrix-nio[e2e]'); encrypted rooms"
                      " will not be read", self.account, missing)  # fmt: skip
            self.status.extra["encryption"] = f"unavailable: {missing}"
            return
        if not self.client.device_id:
            why = "the access token has no device (log in for a token of the bot's own, docs/channels-matrix.md)"
            log.error("matrix account %s: end-to-end encryption off: %s; encrypted rooms will not be read",
                      self.account, why)  # fmt: skip
            self.status.extra["encryption"] = f"off: {why}"
            return
        if self.crypto is None:
            crypto = Crypto(self.client, self.crypto_folder, self.account)
            await asyncio.to_thread(crypto.open)
            self.crypto = crypto
        self.status.extra["encryption"] = "on"
        self.status.extra["device_id"] = self.client.device_id
        await self._keep_up_keys()

    async def _keep_up_keys(self) -> None:
        if self.crypto is None:
            return
        try:
            await self.crypto.keep_up()
        except (aiohttp.ClientError, TimeoutError, OSError, *NIO_FAILURES) as exc:
            log.warning("matrix account %s: end-to-end keys not kept up (tried again after the next sync): %s: %s",
                        self.account, type(exc).__name__, exc)  # fmt: skip

    async def _sync_loop(self, post: PostFn) -> None:
        token = await self.store.state(CHANNEL, self.account, NEXT_BATCH)
        if self.crypto is not None:
            await self.waiting.load()
        backoff = 1.0
        failing = False
        while True:
            timeout_ms = self.settings.sync_timeout_s * 1000 if token is not None else 0
            try:
                status, response = await self._sync(token, timeout_ms)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                failing = True
                backoff = await self._failed(f"/sync: {type(exc).__name__}: {exc}", backoff)
                continue
            if status != 200 or "next_batch" not in response:
                code, why = str(response.get("errcode") or ""), str(response.get("error") or "not a sync answer")
                if code in TOKEN_REFUSALS or status == 401:
                    self._refused(f"/sync refused the token in {self.settings.access_token_env} ({code}: {why})")
                    return
                failing = True
                wait = float(response.get("retry_after_ms") or 0) / 1000 or None
                backoff = await self._failed(f"/sync answered {status} {code}: {why}", backoff, wait)
                continue
            backoff = 1.0
            self.status.connected = True
            if failing:
                self.status.last_error = None
                failing = False
            if self.crypto is not None:
                await self.crypto.take_sync(response)
                await self._keep_up_keys()
                await self._keys_came(post)
            if await self._take_sync(response, post, first=token is None, since=token):
                token = str(response["next_batch"])
                await self.store.keep_state(CHANNEL, self.account, NEXT_BATCH, token, iso(self.clock()))
            else:
                await asyncio.sleep(1.0)  # not every message durable: the same sync again

    async def _sync(self, since: str | None, timeout_ms: int) -> tuple[int, dict[str, Any]]:
        """One ``/sync``: the HTTP status and the answer's JSON, as it is. On nio's connection, not
        through its ``sync``: that validates and models every event (a second of CPU for a
        thousand, on the event loop) and takes ``content`` out of invites; this reads JSON."""
        room_filter = {**SYNC_FILTER["room"], "timeline": {"limit": self.timeline_limit}}
        query = {"timeout": str(timeout_ms), "filter": json.dumps({**SYNC_FILTER, "room": room_filter})}
        if since is not None:
            query["since"] = since
        headers = {"Authorization": f"Bearer {self.client.access_token}"}
        response = await self.client.send("GET", f"/_matrix/client/v3/sync?{urlencode(query)}", headers=headers,
                                          timeout=timeout_ms / 1000 + 15)  # fmt: skip
        try:
            try:
                data = await response.json(content_type=None)
            except ValueError:
                data = None
        finally:
            response.release()
        return response.status, data if isinstance(data, dict) else {}

    async def _take_sync(self, response: dict[str, Any], post: PostFn, *, first: bool, since: str | None) -> bool:
        """Decide the invites and hand the messages on; True once nothing of the sync needs
        delivering again."""
        rooms_of = response.get("rooms") or {}
        for room_id, invited in (rooms_of.get("invite") or {}).items():
            await self._invited(room_id, list((invited.get("invite_state") or {}).get("events") or []))
        if first:
            return True  # what was written before the bot's first start is not answered
        rooms = []
        for room_id, joined in (rooms_of.get("join") or {}).items():
            timeline = joined.get("timeline") or {}
            events = list(timeline.get("events") or [])
            if timeline.get("limited") and since is not None:
                events = await self._earlier(room_id, timeline.get("prev_batch"), since) + events
            states = list((joined.get("state") or {}).get("events") or []) + events
            if self.crypto is None and any(s.get("type") == "m.room.encryption" for s in states):
                await self._encrypted(room_id)
            if events:
                rooms.append(self._take_room(room_id, events, post))
        return all(await asyncio.gather(*rooms))

    async def _earlier(self, room_id: str, start: str | None, since: str) -> list[dict[str, Any]]:
        """The events of a room between the last sync and the sync's timeline (more than
        ``TIMELINE_LIMIT`` came in while the gateway was away), oldest first."""
        found: list[dict[str, Any]] = []
        while start:
            page = await self.client.room_messages(room_id, start=start, end=since, limit=self.timeline_limit)
            chunk = getattr(page, "chunk", None)
            if not chunk:
                break
            found = [e.source for e in reversed(chunk)] + found
            start = None if getattr(page, "end", None) in (None, start) else page.end
        return found

    async def _take_room(self, room_id: str, events: list[dict[str, Any]], post: PostFn) -> bool:
        kind = await self._kind(room_id)
        for event in events:
            if not await self._take(room_id, kind, event, post):
                return False  # not durable: this room stops here, the sync comes again
        return True

    async def _take(self, room_id: str, kind: str, event: dict[str, Any], post: PostFn) -> bool:
        self.status.last_update_at = iso(self.clock())
        if self.crypto is not None and event.get("type") == "m.room.encrypted":
            clear = self.crypto.decrypt(room_id, event)
            if isinstance(clear, Undecryptable):
                await self._undecryptable(clear)
                if clear.sender != self.settings.user_id and clear.event_id:
                    await self.waiting.add(room_id, kind, event)
                return True
            event = clear
        parsed = inbound(event, room_id, kind, self.account, self.settings, self.bot)
        if isinstance(parsed, Encrypted):
            await self._encrypted(room_id)
            return True
        message: Inbound | Skip | Ignored = parsed if isinstance(parsed, Skip) else await self.revisions.check(parsed)
        if isinstance(message, Skip | Ignored):
            log.debug("matrix account %s: event %s skipped: %s", self.account, event.get("event_id"), message.reason)
            return True
        return await hand_over(message, post, access=self.access, revisions=self.revisions, status=self.status,
                               what=f"matrix account {self.account}: event {event.get('event_id')}")  # fmt: skip

    # -- rooms ----------------------------------------------------------------------------------

    async def _kind(self, room_id: str) -> str:
        """Direct or group: as kept when the room was joined, else two members is direct."""
        kind = self._kinds.get(room_id) or await self.store.state(CHANNEL, self.account, f"room:{room_id}")
        if kind is None:
            members = await self.client.joined_members(room_id)
            kind = DIRECT if isinstance(members, JoinedMembersResponse) and len(members.members) == 2 else GROUP
            await self.store.keep_state(CHANNEL, self.account, f"room:{room_id}", kind, iso(self.clock()))
        self._kinds[room_id] = kind
        return kind

    async def _welcome_invite(self, inviter: str, direct: bool) -> bool:
        policy = self.settings.dm_policy
        if policy == "open" or inviter in self.settings.allow_from:
            return True
        if policy == "pairing":
            return direct or inviter in await self.store.approved(CHANNEL, self.account)
        return False

    async def _invited(self, room_id: str, state: list[dict[str, Any]]) -> None:
        invite = invite_of(room_id, state, self.settings.user_id)
        inviter, direct = invite if invite is not None else ("", False)
        kind = DIRECT if direct else GROUP
        if not await self._welcome_invite(inviter, direct):
            log.info("matrix account %s: %s invite to %s from %s rejected (dm_policy %s, not in allow_from)",
                     self.account, kind, room_id, inviter or "someone", self.settings.dm_policy)  # fmt: skip
            left = await self.client.room_leave(room_id)
            if isinstance(left, RoomLeaveError):
                log.warning("matrix account %s: invite to %s not rejected: %s", self.account, room_id, left)
            return
        joined = await self.client.join(room_id)
        if isinstance(joined, JoinError):
            log.warning("matrix account %s: could not join %s: %s", self.account, room_id, joined)
            return
        await self.store.keep_state(CHANNEL, self.account, f"room:{room_id}", kind, iso(self.clock()))
        self._kinds[room_id] = kind
        log.info("matrix account %s: joined %s room %s (invited by %s)", self.account, kind, room_id, inviter)

    async def _encrypted(self, room_id: str) -> None:
        """Say once in the room (and in the log, and the status) that it cannot be read."""
        rooms: list[str] = self.status.extra["encrypted_rooms"]
        if room_id not in rooms:
            rooms.append(room_id)
        if room_id in self._told_encrypted:
            return
        self._told_encrypted.add(room_id)
        name = f"encrypted:{room_id}"
        if await self.store.state(CHANNEL, self.account, name) is not None:
            return
        log.warning("matrix account %s: room %s is end-to-end encrypted; its messages cannot be read (no e2e"
                    " support); told the room once", self.account, room_id)  # fmt: skip
        self.status.last_error = f"room {room_id} is end-to-end encrypted: its messages cannot be read"
        if await self.notify(Target(room_id), ENCRYPTED_NOTICE):
            await self.store.keep_state(CHANNEL, self.account, name, iso(self.clock()), iso(self.clock()))

    async def _keys_came(self, post: PostFn) -> None:
        """The waiting events whose room key this sync brought, read now (in the order they came)."""
        assert self.crypto is not None
        taken = []
        for event_id, (room_id, kind, event, _) in self.waiting.items():
            if self.crypto.has_key(room_id, event):
                log.info("matrix account %s: the key of event %s came later; read now", self.account, event_id)
                if await self._take(room_id, kind, event, post):
                    taken.append(event_id)
        await self.waiting.remove(taken)

    async def _undecryptable(self, event: Undecryptable) -> None:
        """Logged once per room and megolm session; under ``undecryptable: notice`` the room is
        told once too."""
        if event.sender == self.settings.user_id:
            return  # the bot's own message, from another of its devices
        self.status.extra["undecryptable"] = int(self.status.extra.get("undecryptable") or 0) + 1
        name = f"undecryptable:{event.room_id}:{event.session_id}"
        if name in self._told_undecryptable:
            return
        self._told_undecryptable.add(name)
        if await self.store.state(CHANNEL, self.account, name) is not None:
            return
        tell = self.settings.undecryptable == "notice"
        log.warning("matrix account %s: event %s in room %s from %s could not be decrypted (%s); %s",
                    self.account, event.event_id, event.room_id, event.sender, event.reason,
                    "told the room once" if tell else "ignored (undecryptable: ignore)")  # fmt: skip
        self.status.last_error = f"room {event.room_id}: a message from {event.sender} could not be decrypted"
        if not tell or await self.notify(Target(event.room_id), UNDECRYPTABLE_NOTICE):
            await self.store.keep_state(CHANNEL, self.account, name, iso(self.clock()), iso(self.clock()))

    # -- sending --------------------------------------------------------------------------------

    def render(self, markdown: str) -> list[str]:
        return split(markdown, self.limit)

    async def send_part(self, target: Target, part: str) -> None:
        body: dict[str, Any] = content(part)
        if target.thread_id:
            body["m.relates_to"] = {"rel_type": "m.thread", "event_id": target.thread_id, "is_falling_back": True,
                                    "m.in_reply_to": {"event_id": target.reply_to or target.thread_id}}  # fmt: skip
        seed = json.dumps([target.chat_id, target.thread_id, target.reply_to, part])
        txn = "neotask-" + hashlib.sha256(seed.encode()).hexdigest()[:32]
        try:
            if self.crypto is not None:
                await self.crypto.room_ready(target.chat_id)
            sent = await self.client.room_send(
                target.chat_id, "m.room.message", body, tx_id=txn, ignore_unverified_devices=True
            )  # fmt: skip: trust on first use
        except (aiohttp.ClientError, TimeoutError, OSError, *NIO_FAILURES) as exc:
            raise RetryLater(f"matrix: {type(exc).__name__}: {exc}") from None
        if isinstance(sent, RoomSendError | ErrorResponse):
            self._raise_for(sent)
        self.status.messages_out += 1

    def _raise_for(self, failed: Any) -> None:
        code, status = _code(failed), _http_status(failed)
        text = f"matrix: {code or status} {failed.message}"
        if code == "M_LIMIT_EXCEEDED" or status == 429:
            raise RetryLater(text, (failed.retry_after_ms or 0) / 1000 or None)
        if code == "M_UNKNOWN_TOKEN":  # kept for a restart with a fixed token
            raise RetryLater(text, MAX_BACKOFF_S)
        if code in REJECTED_SENDS and status < 500:
            raise Rejected(text)
        raise RetryLater(text)

    async def typing(self, target: Target) -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
            await self.client.room_typing(target.chat_id, True, timeout=10_000)

    async def notify(self, target: Target, text: str) -> bool:
        body = {"msgtype": "m.notice", "body": text}
        try:
            if self.crypto is not None:
                await self.crypto.room_ready(target.chat_id)
            sent = await self.client.room_send(target.chat_id, "m.room.message", body, ignore_unverified_devices=True)
        except (aiohttp.ClientError, TimeoutError, OSError, *NIO_FAILURES) as exc:
            log.warning("matrix account %s: notice to %s not sent: %s", self.account, target.chat_id, exc)
            return False
        if isinstance(sent, ErrorResponse):
            log.warning("matrix account %s: notice to %s not sent: %s", self.account, target.chat_id, sent)
            return False
        return True

    @property
    def takes_calls(self) -> bool:
        return False

    async def receive(self, body: bytes, headers: Any) -> dict[str, Any] | None:
        raise NotImplementedError("Matrix is read by /sync: the homeserver never calls the gateway")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.client.close()
        self.status.connected = False
