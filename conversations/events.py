"""Server-sent events: a hub with numbered events, a replay buffer for ``Last-Event-ID``, and one
queue per subscriber (a slow subscriber loses its oldest events, never blocks the gateway)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import NamedTuple

from sessions.events import HubEvent

SUBSCRIBER_QUEUE = 1000


class Event(NamedTuple):
    """One published event (a tuple: built per stored message, for the replay buffer too)."""

    id: int
    data: HubEvent

    def encode(self) -> bytes:
        payload = json.dumps(self.data, ensure_ascii=False)
        return f"id: {self.id}\nevent: {self.data['type']}\ndata: {payload}\n\n".encode()


@dataclass(eq=False)
class _Subscriber:
    key: str | None
    queue: asyncio.Queue[Event | None] = field(default_factory=lambda: asyncio.Queue(SUBSCRIBER_QUEUE))


class EventHub:
    def __init__(self, *, replay: int = 2000) -> None:
        self._ids = itertools.count(1)
        self._buffer: deque[Event] = deque(maxlen=replay)
        self._subscribers: set[_Subscriber] = set()
        self.closed = False

    def publish(self, data: HubEvent) -> Event:
        event = Event(next(self._ids), data)
        self._buffer.append(event)
        for sub in list(self._subscribers):
            if sub.key is None or sub.key == data["key"]:
                if sub.queue.full():
                    with contextlib.suppress(asyncio.QueueEmpty):
                        sub.queue.get_nowait()
                sub.queue.put_nowait(event)
        return event

    async def subscribe(
        self, *, key: str | None, last_event_id: int | None, heartbeat_s: float
    ) -> AsyncIterator[Event | None]:
        """Yields events for ``key`` (all keys when None), first the ones after
        ``last_event_id`` still in the buffer; yields None when a heartbeat is due."""
        sub = _Subscriber(key)
        self._subscribers.add(sub)
        try:
            if last_event_id is not None:
                for event in list(self._buffer):
                    if event.id > last_event_id and (key is None or event.data["key"] == key):
                        yield event
            while not self.closed:
                try:
                    item = await asyncio.wait_for(sub.queue.get(), timeout=heartbeat_s)
                except TimeoutError:
                    yield None
                    continue
                if item is None:
                    return
                yield item
        finally:
            self._subscribers.discard(sub)

    def forget(self, key: str) -> None:
        """Drop the key's events from the replay buffer (the key was purged: a reconnect with an
        old ``Last-Event-ID`` must not get its messages back)."""
        kept = [event for event in self._buffer if event.data["key"] != key]
        self._buffer.clear()
        self._buffer.extend(kept)

    def close(self) -> None:
        """End every subscription (shutdown)."""
        self.closed = True
        for sub in list(self._subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                sub.queue.put_nowait(None)

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)
