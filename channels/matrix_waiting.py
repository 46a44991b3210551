"""The encrypted Matrix events that came before their room key: each waits (at most ``KEY_WAIT_S``,
``KEY_WAITING`` events) for the key to come in a later sync, then is read as if it had just
arrived. They are kept in channels.db (``connector_state``) before the sync's token moves past
them, so a restart meanwhile still reads them when the key comes."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from channels.store import ChannelStore
from config.clock import Clock, iso

log = logging.getLogger("neotask.channels")

CHANNEL = "matrix"
KEY_WAIT_S, KEY_WAITING = 3600.0, 200  # an undecryptable event waits this long for its key, this many at most
WAITING_KEYS = "waiting_keys"  # the connector_state row that holds them


class WaitingEvents:
    """One account's events waiting for their keys: event id -> (room, room kind, event, since)."""

    def __init__(self, store: ChannelStore, account: str, clock: Clock) -> None:
        self.store, self.account, self.clock = store, account, clock
        self.events: dict[str, tuple[str, str, dict[str, Any], float]] = {}

    async def load(self) -> None:
        """Those that waited when the gateway last stopped."""
        raw = await self.store.state(CHANNEL, self.account, WAITING_KEYS)
        try:
            rows = json.loads(raw) if raw else []
            self.events = {str(e): (str(room), str(kind), dict(event), float(since))
                           for e, room, kind, event, since in rows}  # fmt: skip
        except (ValueError, TypeError) as exc:
            log.warning("matrix account %s: the events waiting for their keys could not be read back (%s); they"
                        " are dropped", self.account, exc)  # fmt: skip
            self.events = {}
        if self.events:
            log.info("matrix account %s: %d events still wait for their keys", self.account, len(self.events))

    async def add(self, room_id: str, kind: str, event: dict[str, Any]) -> None:
        now = self.clock().timestamp()
        for event_id in [e for e, (_, _, _, since) in self.events.items() if now - since > KEY_WAIT_S]:
            del self.events[event_id]
        while len(self.events) >= KEY_WAITING:
            del self.events[next(iter(self.events))]
        self.events[str(event["event_id"])] = (room_id, kind, event, now)
        await self.save()

    def items(self) -> Iterator[tuple[str, tuple[str, str, dict[str, Any], float]]]:
        """In the order they came (a copy: read ones may be removed meanwhile)."""
        return iter(list(self.events.items()))

    async def remove(self, event_ids: list[str]) -> None:
        for event_id in event_ids:
            self.events.pop(event_id, None)
        if event_ids:
            await self.save()

    async def save(self) -> None:
        rows = [[event_id, *held] for event_id, held in self.events.items()]
        await self.store.keep_state(CHANNEL, self.account, WAITING_KEYS, json.dumps(rows), iso(self.clock()))
