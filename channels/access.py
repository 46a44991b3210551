"""Who may talk to an account in a direct chat (``dm_policy``), the same for every connector.

``open``: anyone. ``allowlist``: the ids in ``allow_from``. ``pairing``: those ids and every sender
approved with ``neotask channels approve CODE``; an unknown sender gets a one-time code (stable per
sender) and nothing of theirs is stored. ``allow_from`` names the owner: under ``open`` and
``pairing`` everyone else talks in a session of their own (:func:`direct_scope`).

Approvals only ever grow (there is no revoke), so a sender once seen approved is admitted from
memory: the pairing table in ``channels.db`` is read at start and again only for a sender not yet
known approved (an approval made since). A message from an approved sender never waits on SQLite,
and is admitted while ``channels.db`` cannot be read.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Protocol

from channels.protocol import Inbound, Target
from channels.store import ChannelStore
from config.clock import Clock, iso
from sessions.keys import DmScope

log = logging.getLogger(__name__)


class AccessSettings(Protocol):
    @property
    def dm_policy(self) -> str: ...
    @property
    def allow_from(self) -> Collection[str]: ...


NotifyFn = Callable[[Target, str], Awaitable[None]]
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


class DirectAccess:
    """One account's direct-chat gate."""

    def __init__(
        self, channel: str, account: str, settings: AccessSettings, store: ChannelStore, *, clock: Clock,
        notify: NotifyFn, noun: str = "bot",
    ) -> None:  # fmt: skip
        self.channel = channel
        self.account = account
        self.settings = settings
        self.store = store
        self.clock = clock
        self.notify = notify
        self.noun = noun
        self._approved: set[str] = set()

    async def load(self) -> None:
        """Read the approved senders (at start)."""
        self._approved = await self.store.approved(self.channel, self.account)

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
        code = await self.store.pairing_code(self.channel, self.account, sender, message.sender_name, iso(self.clock()))
        log.info("%s account %s: pairing code %s given to unknown sender %s (%s)", self.channel, self.account, code,
                 sender, message.sender_name or "no name")  # fmt: skip
        await self.notify(message.target, f"This {self.noun} does not know you yet. Pairing code: {code}\n"
                          f"Ask its owner to run: neotask channels approve {code}")  # fmt: skip
        return False
