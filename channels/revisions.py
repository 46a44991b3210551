"""Edits and deletions of platform messages (``Inbound.revision``): stored only in a session that
holds the message they change.

A connector records each platform message once it is durable (``stored_messages`` in
``channels.db``: its text's digest, the thread it was stored in, whether it asked for an answer),
and asks :meth:`Revisions.check` about each edit or deletion (:func:`revise` decides):

- of a message that was stored: stored in the same session as ``[edited message <id>] <text>`` or
  ``[deleted message <id>]``; an edit is answered only when its text addresses the bot and the
  message had not asked for an answer before; an edit that leaves the text as it was (formatting,
  a link preview) is skipped;
- of a message never stored (in a group, one that did not address the bot under
  ``store_unmentioned: false``): skipped, so it never reaches the model; unless the edit now
  addresses the bot: it is then taken as a new message that does (stored as written and answered),
  as if the mention had been sent now.

A record is kept ``KEPT`` after its last change: an edit of an older message counts as one of a
message never stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import sqlite3
from dataclasses import dataclass
from datetime import timedelta

from channels.protocol import Inbound
from channels.store import ChannelStore, StoredMessage
from config.clock import Clock, iso

log = logging.getLogger(__name__)
KEPT = timedelta(days=7)
PRUNE_EVERY = 500  # records written between two removals of those older than KEPT


@dataclass(frozen=True)
class Ignored:
    """An edit or a deletion that is not stored, and why."""

    reason: str


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def revise(message: Inbound, stored: StoredMessage | None) -> Inbound | Ignored:
    """What an edit or a deletion becomes, given the record of the message it changes (None:
    never stored, or forgotten); any other message is returned as it is."""
    if message.revision is None:
        return message
    if stored is None:
        if message.revision == "edit" and message.reply:
            return dataclasses.replace(message, revision=None)
        return Ignored(f"{'an edit' if message.revision == 'edit' else 'a deletion'} of a message never stored")
    if message.revision == "edit" and digest(message.text) == stored.digest:
        return Ignored("an edit that leaves the text as it was")
    reply = message.revision == "edit" and message.reply and not stored.replied
    return dataclasses.replace(message, thread_id=stored.thread_id, reply=reply)


class Revisions:
    """One account's record of the platform messages it stored."""

    def __init__(self, channel: str, account: str, store: ChannelStore, *, clock: Clock) -> None:
        self.channel = channel
        self.account = account
        self.store = store
        self.clock = clock
        self._written = 0

    async def check(self, message: Inbound) -> Inbound | Ignored:
        """The message to store for ``message`` (:func:`revise`), or why there is none."""
        if message.revision is None or message.message_id is None:
            return message
        try:
            stored = await self.store.stored_message(self.channel, self.account, message.chat_id, message.message_id)
        except (sqlite3.Error, OSError) as exc:  # the edit is then taken as one of a message never stored
            log.warning("%s account %s: stored messages not readable: %s", self.channel, self.account, exc)
            stored = None
        return revise(message, stored)

    async def stored(self, message: Inbound) -> None:
        """Record a message that is durable now (best effort: the message is stored either way)."""
        if message.message_id is None:
            return
        now = self.clock()
        try:
            if message.revision == "delete":
                await self.store.forget_message(self.channel, self.account, message.chat_id, message.message_id)
                return
            record = StoredMessage(digest(message.text), message.thread_id, message.reply)
            await self.store.record_message(
                self.channel, self.account, message.chat_id, message.message_id, record, iso(now)
            )
            self._written += 1
            if self._written % PRUNE_EVERY == 1:
                await self.store.forget_messages_before(iso(now - KEPT))
        except (sqlite3.Error, OSError) as exc:
            log.warning("%s account %s: message %s not recorded (an edit of it will not be stored): %s",
                        self.channel, self.account, message.message_id, exc)  # fmt: skip
