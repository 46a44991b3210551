"""The chat connectors wired to the engine: what a platform message becomes, and how its answer
gets back. The gateway builds one (``gateway/services.py``) and serves its calls and status.

For each message a connector hands over (``post``): an outbox row when it asks for an answer
(``<home>/channels.db``), then the message stored through the same path as ``POST /v1/messages``
(key routing with ``session.dm_scope`` and ``bindings``, idempotency by ``client_message_id``);
``post`` returns once the message is durable, so the connector acknowledges the platform only
then. The model turn goes on in a background task with the platform's typing indicator; its
answer is written to the row, then sent part by part (each accepted part is counted, so a restart
resends none twice), retried after a network error, a 5xx or a 429 (its ``retry_after``
honoured). At start, rows left pending or answered by a crash are finished: a pending one is
posted again under its client_message_id (stored once; its turn runs if it never finished), an
answered one is sent. Chat commands (``/new``, ``/status``...) are answered the same way.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from channels.access import command_refusal, direct_scope
from channels.background import BackgroundTurns, StoredFn
from channels.pairing import Pairing
from channels.protocol import AccountStatus, Connector, Inbound, Rejected, RetryLater
from channels.registry import PLATFORMS, Account, Platform, configured, load_sdks
from channels.store import ChannelStore, OutboxRow
from channels.throttle import Throttle
from config.channels import ChannelsSettings
from config.chat_commands import parse_command
from config.clock import Clock, iso
from config.errors import NeotaskError, NotFound, SessionPaused, ShuttingDown
from config.redaction import SECRETS
from config.settings import Settings
from conversations.commands import Commands, commands_in, dispatch
from conversations.turns import Conversations, Outcome, Post
from sessions.keys import DmScope, Ingress, route
from sessions.records import NewMessage

log = logging.getLogger(__name__)
TYPING_EVERY_S = 4.0
HANDLED_KEPT = 200_000  # client_message_ids kept in memory; older redeliveries are looked up in channels.db
KEEP_ROWS = timedelta(days=2)  # sent and failed outbox rows kept this long (redelivery and idempotency: a day)
CRASH_STEPS = ("channels.stored", "channels.answered")
APOLOGY = "Sorry, I could not answer this message just now. Please try again in a little while."
PAUSED_NOTICE = "This session is paused: your message was not read. /resume continues it."
PAUSED_NOTICE_EVERY = timedelta(minutes=10)  # a sender is told once in this window, per paused session
WELCOME_WAIT_S = 10.0  # an approval waits this long for its notice to be sent, then leaves it for the next start


class ChannelIntake:
    """The connectors of every configured account, the outbox, and the background turns."""

    def __init__(
        self,
        conversations: Conversations,
        commands: Commands,
        settings: Settings,
        store: ChannelStore,
        env: Mapping[str, str],
        *,
        clock: Clock,
        crash_at: str | None = None,
    ) -> None:
        """``crash_at``: a step of ``CRASH_STEPS`` where a crash test kills this process."""
        self.conv = conversations
        self.commands = commands
        self.settings = settings
        self.store = store
        self.clock = clock
        self.max_backoff_s = settings.channels.outbox.max_backoff_s
        self.connectors: dict[tuple[str, str], Connector] = {}
        self.statuses: list[AccountStatus] = []
        self._crash_at = crash_at if crash_at in CRASH_STEPS else None
        self._inflight: dict[str, asyncio.Future[Outcome]] = {}
        self._handled: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.turns = BackgroundTurns(conversations)
        self._send_locks: dict[tuple[str, str, str], asyncio.Lock] = {}
        self._started = asyncio.Event()  # cleared while a reload swaps connectors: sends wait
        self._sending: collections.Counter[tuple[str, str]] = collections.Counter()  # sends in flight per account
        self._sent_one = asyncio.Condition()
        self._paused_told = Throttle(PAUSED_NOTICE_EVERY, clock)
        self.env = env
        for platform, name, account in configured(settings.channels):
            self._add(platform, name, account)

    def _add(self, platform: Platform, name: str, account: Account) -> Connector | None:
        """The account's status, and its connector when it can run (enabled, its variables set)."""
        status = AccountStatus(platform.name, name, account.agent, account.mode, enabled=account.enabled)
        missing = platform.missing(account, self.env) if account.enabled else []
        if missing:
            unset = " and ".join(missing) + (" is" if len(missing) == 1 else "")
            status.last_error = (f"{platform.name} account {name}: {unset} not set; this account is stopped,"
                                 " the others keep running")  # fmt: skip
        if not account.enabled or missing:
            self.statuses.append(status)
            return None
        SECRETS.add(self.env.get(variable) for variable in platform.needs(account))  # hidden in logs and status
        connector = platform.build(name, account, self.env, self.store, self.clock)
        self.connectors[(platform.name, name)] = connector
        self.statuses.append(connector.status)
        return connector

    def _now(self) -> str:
        return iso(self.clock())

    def _crash(self, step: str) -> None:
        if self._crash_at == step:
            log.warning("test hook: killing this process at %s", step)
            os.kill(os.getpid(), signal.SIGKILL)

    async def start(self) -> None:
        """Finish what a previous process left in the outbox, then start every connector."""
        for status in self.statuses:
            if status.last_error:
                log.error("%s", status.last_error)
        await self.store.prune(iso(self.clock() - KEEP_ROWS))
        for cmid in await self.store.finished_since(iso(self.clock() - KEEP_ROWS)):
            self._remember(cmid)
        for row in await self.store.unsent():
            if row.inbound.client_message_id not in self._inflight:
                self._launch(row.inbound, row)
        for connector in self.connectors.values():
            await connector.start(self.post)
        self._started.set()

    # -- inbound --------------------------------------------------------------------------------

    async def post(self, inbound: Inbound) -> None:
        """Store one platform message; return once it is durable (the turn goes on)."""
        cmid = inbound.client_message_id
        if cmid in self._handled:
            return  # handled before: a redelivery
        pending = self._inflight.get(cmid)
        if pending is None:
            row = None
            if len(self._handled) >= HANDLED_KEPT:  # older ids were forgotten: ask the outbox
                row = await self.store.row(cmid)
                if row is not None and row.state != "pending":
                    return
            pending = self._inflight.get(cmid) or self._launch(inbound, row)
        await asyncio.shield(pending)
        self._crash("channels.stored")

    def _remember(self, cmid: str) -> None:
        self._handled[cmid] = None
        if len(self._handled) > HANDLED_KEPT:
            self._handled.popitem(last=False)

    def _launch(self, inbound: Inbound, row: OutboxRow | None) -> asyncio.Future[Outcome]:
        """The message's background turn (``channels/background.py``); the future resolves once
        the message is durable."""
        cmid = inbound.client_message_id

        def done(finished: asyncio.Task[bool]) -> None:
            if self._inflight.get(cmid) is stored:
                del self._inflight[cmid]
            if finished.cancelled():
                return
            exc = finished.exception()
            if exc is None:
                if finished.result():
                    self._remember(cmid)
            elif isinstance(exc, NeotaskError) and exc.transient:
                return  # not stored (shutdown, storage unavailable or full): the platform delivers it again
            elif isinstance(exc, NeotaskError):
                self._remember(cmid)  # refused: the post function's error
            else:
                log.error("channel message %s failed", cmid, exc_info=exc)

        stored = self.turns.launch(
            f"channel message {cmid}", lambda on_stored: self._handle(inbound, row, on_stored), on_done=done
        )
        self._inflight[cmid] = stored
        return stored

    def _account(self, inbound: Inbound) -> Any:
        """The settings of the account ``inbound`` came through (None: a reload removed it)."""
        platform = PLATFORMS.get(inbound.channel)
        return platform.accounts(self.settings.channels).get(inbound.account) if platform else None

    def _scope(self, inbound: Inbound) -> DmScope:
        """The ``session.dm_scope`` the message is routed with: strangers never share the owner's session."""
        dm_scope = self.settings.session.dm_scope
        if inbound.chat_type == "direct":
            dm_scope = direct_scope(inbound.sender_id, self._account(inbound), dm_scope)
        return dm_scope

    def _refusal(self, inbound: Inbound) -> str | None:
        """Why the sender may not run the command they sent (``channels/access.py``), or None."""
        refusal = command_refusal(commands_in(inbound.text), inbound.sender_id, inbound.chat_type,
                                  self._account(inbound), own_session=self._scope(inbound) != "main")  # fmt: skip
        if refusal is not None:
            log.info("%s account %s: %r from %s in %s %s refused (not an owner nor in commands.allow_from)",
                     inbound.channel, inbound.account, inbound.text[:80], inbound.sender_id, inbound.chat_type,
                     inbound.chat_id)  # fmt: skip
        return refusal

    def _paused(self, inbound: Inbound, key: str) -> str | None:
        """What a sender whose message a paused session refused is told: the notice, once per
        sender and session every ``PAUSED_NOTICE_EVERY``; None (nothing) in between."""
        if self._paused_told.due((key, inbound.sender_id)):
            log.info("%s: session %s is paused; %s told so", inbound.client_message_id, key, inbound.sender_id)
            return PAUSED_NOTICE
        log.debug("%s: session %s is paused; %s was told lately", inbound.client_message_id, key, inbound.sender_id)
        return None

    def _post_for(self, inbound: Inbound) -> Post:
        dm_scope = self._scope(inbound)
        key = route(
            Ingress(inbound.channel, inbound.chat_type, inbound.chat_id, inbound.sender_id, inbound.thread_id,
                    inbound.agent),
            dm_scope=dm_scope,
            bindings=self.settings.bindings,
            agents=self.settings.agents,
        )  # fmt: skip
        message = NewMessage(
            role="user",
            content=inbound.content,
            name=inbound.sender_name or inbound.sender_id,
            sender_id=inbound.sender_id,
            client_message_id=inbound.client_message_id,
        )
        return Post(key=key, message=message, reply=inbound.reply)

    async def _handle(self, inbound: Inbound, row: OutboxRow | None, stored_fn: StoredFn) -> bool:
        """Store one message, run its turn (or command) and deliver the answer through the outbox;
        True once nothing is left to do for it (False: shutdown stopped it, the row stays pending)."""
        stored = asyncio.Event()

        def on_stored(outcome: Outcome) -> None:
            stored.set()
            stored_fn(outcome)

        await self._started.wait()
        if row is not None and row.state == "answered":
            on_stored(Outcome("", None, None))
            await self._deliver(inbound.client_message_id)
            return True
        post = self._post_for(inbound)
        command = inbound.reply and parse_command(inbound.content) is not None
        wants_reply = inbound.reply and (command or self.conv.needs_turn(post))
        if wants_reply and row is None:
            await self.store.expect(inbound, self._now())
        typing: asyncio.Task[None] | None = None
        refusal = self._refusal(inbound) if command else None
        try:
            if refusal is not None:  # nothing runs, nothing is stored
                outcome = Outcome(post.key.raw, None, None, reply={"content": refusal, "seq": None})
            elif command:
                outcome = await dispatch(self.commands, post)
            else:
                if wants_reply and (inbound.channel, inbound.account) in self.connectors:
                    typing = asyncio.create_task(self._typing(inbound, stored))
                outcome = await self.conv.post(post, on_stored=on_stored)
        except ShuttingDown:
            if not stored.is_set():
                raise
            return False  # the row stays pending: the next start finishes it
        except SessionPaused:
            if stored.is_set() or not wants_reply:  # a message that asks nothing: refused unsaid, as before
                raise
            notice = self._paused(inbound, post.key.raw)
            outcome = Outcome(post.key.raw, None, None, reply={"content": notice, "seq": None} if notice else None)
        except NeotaskError as exc:
            if not stored.is_set():  # nothing stored: the error is the post function's answer
                raise
            log.warning("%s: the turn on %s failed: %s", inbound.client_message_id, post.key.raw, exc.message)
            # the details (a model URL, the operator's advice) are for the log, not for a chat user
            outcome = Outcome(post.key.raw, None, None, reply={"content": APOLOGY, "seq": None})
        finally:
            if typing is not None:
                typing.cancel()
        on_stored(Outcome("", None, None))  # a repeat stores nothing new and calls no on_stored
        if not wants_reply:
            return True
        reply = outcome.reply
        text = reply["content"] if reply is not None else None
        if not text:
            await self.store.sent(inbound.client_message_id, self._now())
            return True
        seq = reply.get("seq") if reply is not None else None
        ref = f"{outcome.session_key}#{outcome.run_id}#{seq}" if seq is not None else None  # seqs restart per run
        if await self.store.answer(inbound.client_message_id, text, ref, self._now()):
            self._crash("channels.answered")
            await self._deliver(inbound.client_message_id)
        return True

    async def _typing(self, inbound: Inbound, stored: asyncio.Event) -> None:
        await stored.wait()
        while True:
            connector = self.connectors.get((inbound.channel, inbound.account)) if self._started.is_set() else None
            if connector is not None:  # the account's connector of now: a reload may have replaced it
                with contextlib.suppress(Rejected, RetryLater):
                    await connector.typing(inbound.target)
            await asyncio.sleep(TYPING_EVERY_S)

    # -- outbound -------------------------------------------------------------------------------

    async def _deliver(self, cmid: str) -> None:
        """Send an answered row's remaining parts, in order, retrying until the platform takes them."""
        row = await self.store.row(cmid)
        if row is None or row.state != "answered" or row.reply is None:
            return
        inbound = row.inbound
        account = (inbound.channel, inbound.account)
        lock = self._send_locks.setdefault((*account, inbound.target.chat_id), asyncio.Lock())
        async with lock:
            parts: list[str] | None = None
            backoff = 1.0
            sent = row.parts_sent
            while parts is None or sent < len(parts):
                await self._started.wait()  # a reload swapping this account's connector: the next part waits
                connector = self.connectors.get(account)
                if connector is None:
                    await self.store.failed(cmid, f"{inbound.channel} account {inbound.account} is not running",
                                            self._now())  # fmt: skip
                    return
                parts = parts or connector.render(row.reply)
                if sent >= len(parts):
                    break
                try:
                    self._sending[account] += 1
                    try:
                        await connector.send_part(inbound.target, parts[sent])
                    finally:
                        await self._sent(account)
                except RetryLater as exc:
                    wait = exc.retry_after if exc.retry_after is not None else backoff
                    backoff = min(backoff * 2, self.max_backoff_s)
                    connector.status.last_error = str(exc)
                    log.warning("%s: part %d not sent (%s); trying again in %.1f s", cmid, sent + 1, exc, wait)
                    await self.store.attempt_failed(cmid, str(exc), self._now())
                    await asyncio.sleep(min(wait, self.max_backoff_s))
                    continue
                except Rejected as exc:
                    connector.status.last_error = str(exc)
                    log.error("%s: the reply was refused for good: %s", cmid, exc)
                    await self.store.failed(cmid, str(exc), self._now())
                    return
                sent += 1
                await self.store.part_sent(cmid, sent, self._now())
            await self.store.sent(cmid, self._now())

    async def _sent(self, account: tuple[str, str]) -> None:
        self._sending[account] -= 1
        async with self._sent_one:
            self._sent_one.notify_all()

    # -- reload ---------------------------------------------------------------------------------

    async def reconfigure(self, before: ChannelsSettings) -> list[str]:
        """Put the accounts of ``self.settings`` (just reloaded; ``before``: the channels that ran)
        in force: the connectors of accounts whose settings changed or that went away stop (once
        the sends in flight through them return) and those of changed and new accounts start;
        every other connector runs on untouched. Turns in progress are not touched: their
        messages are stored, their model calls finish, and their replies are sent through the
        account's connector of the moment. The accounts restarted, as ``<platform>.<name>``."""
        now = list(configured(self.settings.channels))
        was = {(p.name, name): account for p, name, account in configured(before)}
        changed = {(p.name, name) for p, name, account in now if was.get((p.name, name)) != account}
        changed |= set(was) - {(p.name, name) for p, name, _ in now}
        if not changed:
            return []
        await load_sdks(self.settings.channels, self.env)  # a first account of a platform: its SDK off the loop
        self._started.clear()
        try:
            async with self._sent_one:
                await self._sent_one.wait_for(lambda: not any(self._sending[key] for key in changed))
            for key in sorted(changed):
                connector = self.connectors.pop(key, None)
                if connector is not None:
                    await connector.stop()
            kept = {(s.channel, s.account): s for s in self.statuses}
            self.statuses, starting = [], []
            for platform, name, account in now:
                key = (platform.name, name)
                if key not in changed:
                    self.statuses.append(kept[key])
                elif (connector := self._add(platform, name, account)) is not None:
                    starting.append(connector)
                elif self.statuses[-1].last_error:
                    log.error("%s", self.statuses[-1].last_error)
            for connector in starting:
                await connector.start(self.post)
        finally:
            self._started.set()
        return [f"{platform}.{name}" for platform, name in sorted(changed)]

    # -- status, pairing, shutdown --------------------------------------------------------------

    def called(self, channel: str, account: str) -> Connector:
        """The connector a ``/hooks/<channel>/<account>`` call is for (an account the platform
        calls: Telegram's webhook mode, Slack's events mode)."""
        connector = self.connectors.get((channel, account))
        if connector is None or not connector.takes_calls:
            mode = PLATFORMS[channel].calling_mode if channel in PLATFORMS else "a calling"
            raise NotFound(f"no running {channel.capitalize()} account {account!r} in {mode} mode"
                           f" (channels.{channel}.accounts)")  # fmt: skip
        return connector

    def status(self) -> list[dict[str, Any]]:
        return [s.as_json() for s in self.statuses]

    async def approve(self, code: str) -> tuple[Pairing, bool]:
        """Approve a code; the sender is told through the running connector at once (True), else
        when the account next starts."""
        pairing = await self.store.approve(code, self.clock())
        connector = self.connectors.get((pairing.channel, pairing.account))
        if connector is None or pairing.welcomed_at is not None:
            return pairing, pairing.welcomed_at is not None
        try:
            async with asyncio.timeout(WELCOME_WAIT_S):
                told = await connector.access.welcome()
        except TimeoutError:
            log.warning("%s account %s: the approval notice to %s is not sent yet; it is sent at the next start",
                        pairing.channel, pairing.account, pairing.sender_id)  # fmt: skip
            return pairing, False
        return pairing, pairing.code in told

    async def revoke(self, code: str) -> Pairing:
        """Forget a pairing; a running connector no longer admits the sender from the next message."""
        pairing = await self.store.revoke(code)
        connector = self.connectors.get((pairing.channel, pairing.account))
        if connector is not None:
            connector.access.forget(pairing.sender_id)
        log.info("%s account %s: pairing %s of %s revoked", pairing.channel, pairing.account, pairing.code,
                 pairing.sender_id)  # fmt: skip
        return pairing

    async def pairings(self) -> list[Pairing]:
        return await self.store.pairings()

    async def idle(self) -> None:
        """Wait until every message in hand is answered and sent (tests)."""
        await self.turns.idle()

    async def close(self) -> None:
        for connector in self.connectors.values():
            await connector.stop()
        await self.turns.close()
        await self.store.close()
