"""Who may talk to an account in a direct chat (``dm_policy``), and who may run the commands
that change a session's settings, the same for every connector.

``open``: anyone. ``allowlist``: the ids in ``allow_from``. ``pairing``: those ids and every sender
approved with ``neotask channels approve CODE``; an unknown sender gets a code (one notice per code;
a code expires after ``pairing_code_lifetime_s``, then the next message gets a new one) and nothing
of theirs is stored; an approved sender is told so through the channel. ``allow_from`` names the
owner: under ``open`` and ``pairing`` everyone else talks in a session of their own
(:func:`direct_scope`).

A sender once seen approved is admitted from memory: the pairing table in ``channels.db`` is read
at start and again only for a sender not yet known approved (an approval made since); a revoke
(``neotask channels revoke CODE``) reaches the running connector through :meth:`DirectAccess.forget`.
A message from an approved sender never waits on SQLite, and is admitted while ``channels.db``
cannot be read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import KW_ONLY, dataclass, field
from datetime import timedelta
from typing import Protocol

from channels.protocol import ChatType, Inbound, Target
from channels.store import ChannelStore
from config.chat_commands import SETTINGS_COMMANDS
from config.clock import Clock
from sessions.keys import DmScope

log = logging.getLogger(__name__)


class AccessSettings(Protocol):
    @property
    def dm_policy(self) -> str: ...
    @property
    def allow_from(self) -> Collection[str]: ...
    @property
    def pairing_code_lifetime_s(self) -> int: ...


class CommandSettings(Protocol):
    @property
    def allow_from(self) -> Collection[str]: ...
    @property
    def restricted(self) -> Collection[str]: ...


class AccountSettings(AccessSettings, Protocol):
    @property
    def commands(self) -> CommandSettings: ...


NotifyFn = Callable[[Target, str], Awaitable[bool]]
SHARING_POLICIES = ("open", "pairing")  # the policies that admit people who are not the owner


def direct_scope(sender_id: str, settings: AccessSettings | None, dm_scope: DmScope) -> DmScope:
    """The ``session.dm_scope`` one direct message is routed with. ``main`` is the owner's own
    session: under ``open`` or ``pairing``, a sender who is not in ``allow_from`` (the owner's ids)
    gets a session of their own, ``per-channel-peer`` (and with it a memory scope of their own),
    whatever ``dm_scope`` says, so a stranger's prompt never holds the owner's conversation nor
    recalls the owner's memory. ``settings`` None (an account a reload removed): a stranger too."""
    if dm_scope != "main":
        return dm_scope
    if settings is None or (settings.dm_policy in SHARING_POLICIES and sender_id not in settings.allow_from):
        return "per-channel-peer"
    return dm_scope


def command_refusal(
    commands: Sequence[tuple[str, str]], sender_id: str, chat_type: ChatType, settings: AccountSettings | None, *,
    own_session: bool,
) -> str | None:  # fmt: skip
    """Why ``sender_id`` may not run ``commands`` (what one message runs: ``commands_in``), or
    None. A command of ``commands.restricted`` (``/model`` only with a name: without one it shows
    the model) is for the owners (``allow_from``) and the admins (``commands.allow_from``), and in
    a direct chat for a sender whose session is their own (``own_session``: not ``main``)."""
    if settings is None:  # an account a reload removed: nobody's owner
        restricted: Collection[str] = SETTINGS_COMMANDS
        allowed: set[str] = set()
    else:
        restricted = settings.commands.restricted
        allowed = {*settings.allow_from, *settings.commands.allow_from}
    if sender_id in allowed or (chat_type == "direct" and own_session):
        return None
    for name, args in commands:
        if name in restricted and not (name == "model" and not args):
            return f"Sorry, only the owner or an admin can use /{name} here."
    return None


@dataclass(eq=False)
class DirectAccess:
    """One account's direct-chat gate."""

    channel: str
    account: str
    settings: AccessSettings
    store: ChannelStore
    _: KW_ONLY
    clock: Clock
    notify: NotifyFn
    noun: str = "bot"
    _approved: set[str] = field(default_factory=set, init=False)
    _welcoming: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)

    async def load(self) -> None:
        """Read the approved senders and tell those approved while the account was not running
        (at start, once the platform answers)."""
        self._approved = await self.store.approved(self.channel, self.account)
        await self.welcome()

    async def welcome(self) -> set[str]:
        """Tell every approved sender not yet told that they are let in; the codes told now."""
        told: set[str] = set()
        async with self._welcoming:
            for pairing in await self.store.unwelcomed(self.channel, self.account):
                self._approved.add(pairing.sender_id)
                assert pairing.chat_id is not None
                text = f"You are approved: this {self.noun} takes your messages now."
                if await self.notify(Target(pairing.chat_id), text):
                    await self.store.welcomed(pairing.code, self.clock())
                    told.add(pairing.code)
                    log.info("%s account %s: told %s they are approved", self.channel, self.account,
                             pairing.sender_id)  # fmt: skip
        return told

    def forget(self, sender_id: str) -> None:
        """A revoked sender: a stranger again from the next message."""
        self._approved.discard(sender_id)

    async def admitted(self, message: Inbound) -> bool:
        """Whether the direct message may be stored; an unknown sender under ``pairing`` is sent
        its code."""
        policy = self.settings.dm_policy
        sender = message.sender_id
        if policy == "open" or sender in self.settings.allow_from:
            return True
        if policy != "pairing":
            log.info("%s account %s: direct message from %s (not in allow_from) ignored", self.channel, self.account,
                     sender)  # fmt: skip
            return False
        if sender in self._approved:
            return True
        self._approved = await self.store.approved(self.channel, self.account)
        if sender in self._approved:
            return True
        lifetime = timedelta(seconds=self.settings.pairing_code_lifetime_s)
        pairing, fresh = await self.store.pairing_code(
            self.channel, self.account, sender, message.sender_name, message.target.chat_id, now=self.clock(),
            lifetime=lifetime,
        )  # fmt: skip
        code = pairing.code
        if not fresh:  # told once per code: a sender writing on gets nothing more until the code expires
            log.debug("%s account %s: sender %s still has pairing code %s (until %s)", self.channel, self.account,
                      sender, code, pairing.expires_at)  # fmt: skip
            return False
        log.info("%s account %s: pairing code %s given to unknown sender %s (%s), good until %s", self.channel,
                 self.account, code, sender, message.sender_name or "no name", pairing.expires_at)  # fmt: skip
        text = (f"This {self.noun} does not know you yet. Pairing code: {code} (good for {_duration(lifetime)})\n"
                f"Ask its owner to run: neotask channels approve {code}")  # fmt: skip
        await self.notify(message.target, text)
        return False


def _duration(span: timedelta) -> str:
    minutes = round(span.total_seconds() / 60)
    if minutes % 60 == 0 and minutes >= 60:
        hours = minutes // 60
        return f"{hours} hour" + ("s" if hours != 1 else "")
    return f"{minutes} minute" + ("s" if minutes != 1 else "")
