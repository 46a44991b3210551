"""What every connector holds of its account, set up in one place: the account's name and
settings, the store and the clock, the part size, its status, its direct-chat gate and its record
of the messages it stored, and how it stops for good. Each connector (``telegram.py``, ``slack.py``, ``discord.py``,
``matrix.py``) is an :class:`AccountParts` with its platform's client beside them; these are the
``account``, ``status`` and ``access`` of the ``Connector`` protocol."""

from __future__ import annotations

import logging
from typing import Generic, Protocol, TypeVar

from channels.access import AccessSettings, DirectAccess, NotifyFn
from channels.protocol import AccountStatus
from channels.revisions import Revisions
from channels.store import ChannelStore
from config.clock import Clock


class ConnectorSettings(AccessSettings, Protocol):
    """What of an account's settings its parts read (the platforms' account models have it)."""

    @property
    def agent(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def enabled(self) -> bool: ...


S = TypeVar("S", bound=ConnectorSettings)


class AccountParts(Generic[S]):
    """One account's parts: ``account`` its name, ``settings`` its settings, ``limit`` the size of a
    reply's part; ``access`` tells approved senders through ``notify`` (the connector's)."""

    def __init__(
        self, channel: str, name: str, settings: S, store: ChannelStore, *, clock: Clock, limit: int,
        notify: NotifyFn, noun: str = "bot",
    ) -> None:  # fmt: skip
        self.account = name
        self.settings = settings
        self.store = store
        self.clock = clock
        self.limit = limit
        self.status = AccountStatus(channel, name, settings.agent, settings.mode, enabled=settings.enabled)
        self.access = DirectAccess(channel, name, settings, store, clock=clock, notify=notify, noun=noun)
        self.revisions = Revisions(channel, name, store, clock=clock)

    def _stop(self, why: str, fix: str) -> None:
        """The account stops for good (its token refused, a setting the platform wants), the others
        keep running: one error line in the connector's log, and its status says why."""
        message = (f"{self.status.channel} account {self.account}: {why}; this account is stopped, the others keep"
                   f" running; {fix}")  # fmt: skip
        logging.getLogger(type(self).__module__).error("%s", message)
        self.status.connected = False
        self.status.last_error = message
