"""Store events to every gateway process sharing the database (``gateway.workers`` above 1): each
process sends the events it emits with ``NOTIFY`` on ``CHANNEL`` (batched: the first event after a
quiet moment goes at once, then one statement per ``SEND_EVERY_S`` at most for every event emitted
meanwhile, the events packed into as few notifications as their size allows, each a JSON array, so
the server queues and every listener reads one notification for dozens of events) and
``LISTEN``s on a connection of its own; an event of another process goes to this process's
subscribers (``/v1/events``), its own are skipped (no echo: the emitting process published them
already). An event is delivered in the notification's callback, unless one before it waits (a
reference being read): then it waits behind it, so the order holds.

The same connection hears on ``LEASE_CHANNEL`` which keys other processes wait for
(``sessions.postgres.keylocks``): ``asked`` gets the lock number, and ``ask`` says this process
waits for one.

A notification's payload is less than 8000 bytes: a larger ``message`` event is sent without its
content, with a reference (run id and seq) from which the receiver reads the stored message; any
other oversized event has its long text fields cut (``truncated: true``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import os
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast

import asyncpg
import orjson

from sessions.appends import event_fields
from sessions.codec import decode
from sessions.events import StoreEvent
from sessions.postgres.keylocks import LEASE_CHANNEL

log = logging.getLogger(__name__)

CHANNEL = "neotask_events"
MAX_PAYLOAD = 7900  # bytes; the server refuses 8000 and more
CUT_TEXT = 500  # characters kept of a long text field of an oversized event that is not a message

Deliver = Callable[[StoreEvent], object]


def _dumps(value: Mapping[str, Any]) -> str:
    """Compact JSON, characters kept (orjson: every message's event is encoded once per process
    sharing the database, and read by each of the others); what orjson refuses (an integer beyond
    64 bits) through ``json``."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def encode(origin: str, event: Mapping[str, Any]) -> str:
    """The payload of ``event``: whole when it fits, else a reference or a cut copy."""
    text = _dumps({"o": origin, "e": event})
    if len(text.encode()) <= MAX_PAYLOAD:
        return text
    if event.get("type") == "message" and event.get("run_id") and isinstance(event.get("seq"), int):
        slim = {k: v for k, v in event.items() if k != "content"}
        text = _dumps({"o": origin, "e": slim, "ref": True})
        if len(text.encode()) <= MAX_PAYLOAD:
            return text
    cut = {k: (v[:CUT_TEXT] if isinstance(v, str) and len(v) > CUT_TEXT else v) for k, v in event.items()}
    cut["truncated"] = True
    text = _dumps({"o": origin, "e": cut})
    if len(text.encode()) <= MAX_PAYLOAD:
        return text
    keep = ("type", "key", "run_id", "at", "seq")
    return json.dumps({"o": origin, "e": {**{k: event[k] for k in keep if k in event}, "truncated": True}})


def pack(payloads: list[str]) -> list[str]:
    """``payloads`` (from :func:`encode`, in order) joined into JSON arrays of at most
    ``MAX_PAYLOAD`` bytes each, brackets aside: one notification each."""
    out: list[str] = []
    part: list[str] = []
    size = 0
    for payload in payloads:
        n = len(payload.encode()) + 1
        if part and size + n > MAX_PAYLOAD:
            out.append("[" + ",".join(part) + "]")
            part, size = [], 0
        part.append(payload)
        size += n
    if part:
        out.append("[" + ",".join(part) + "]")
    return out


SEND_EVERY_S = 0.05  # at most one NOTIFY statement this often: under load the events of this
# interval go in one statement (each statement wakes every listener, the sender's own included)
RELISTEN_FIRST_S = 0.5  # the first wait before listening again after the connection was lost
RELISTEN_MAX_S = 10.0  # doubling up to this


class EventRelay:
    def __init__(self, pool: asyncpg.Pool, dsn: str, password: str | None) -> None:
        self.pool = pool
        self.dsn, self.password = dsn, password
        self.origin = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._echo = "[" + encode(self.origin, {})[: -len(',"e":{}}')]  # how this process's payloads begin
        self.deliver: Deliver | None = None
        self.asked: Callable[[int], object] | None = None
        self._conn: asyncpg.Connection | None = None
        self._outbox: list[str] = []
        self._last_sent = -math.inf  # loop time of the last statement's start
        self._sender: asyncio.Task[None] | None = None
        # the events that wait, in order; the first stays until delivered (a reference being read)
        self._inbox: collections.deque[dict[str, Any]] = collections.deque()
        self._arrived = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._closing = False
        self._asking: set[asyncio.Task[None]] = set()
        self.sent = self.notifications = self.statements = self.received = self.reconnects = 0

    async def start(self) -> None:
        await self._listen()
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="postgres-events-in")

    async def _listen(self) -> None:
        conn = await asyncpg.connect(self.dsn, password=self.password)
        try:
            await conn.add_listener(CHANNEL, self._on_notify)
            await conn.add_listener(LEASE_CHANNEL, self._on_ask)
        except BaseException:
            conn.terminate()
            raise
        conn.add_termination_listener(self._on_lost)
        self._conn = conn

    def _on_lost(self, _conn: object) -> None:
        """The LISTEN connection closed (a database restart, a terminated backend): listen again,
        retrying with backoff. What other processes sent meanwhile is not received (NOTIFY keeps
        nothing for a listener that is away): subscribers resynchronise from the store."""
        if self._closing or (self._keeper is not None and not self._keeper.done()):
            return
        log.warning("the connection receiving the other gateway processes' events was lost: listening again")
        self._keeper = asyncio.get_running_loop().create_task(self._relisten(), name="postgres-events-listen")

    async def _relisten(self) -> None:
        delay = RELISTEN_FIRST_S
        while not self._closing:
            await asyncio.sleep(delay)
            try:
                await self._listen()
            except Exception as exc:
                log.debug("listening again failed (%s); next try in %.1f s", exc, delay)
                delay = min(delay * 2, RELISTEN_MAX_S)
                continue
            self.reconnects += 1
            log.info("receiving the other gateway processes' events again")
            return

    def send(self, event: Mapping[str, Any]) -> None:
        self._outbox.append(encode(self.origin, event))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send(), name="postgres-events-out")

    async def _send(self) -> None:
        loop = asyncio.get_running_loop()
        while self._outbox:
            wait = self._last_sent + SEND_EVERY_S - loop.time()
            if wait > 0:  # a statement went out less than SEND_EVERY_S ago: this one's events gather
                await asyncio.sleep(wait)
            batch, self._outbox = self._outbox, []
            packed = pack(batch)
            self._last_sent = loop.time()
            try:
                await self.pool.execute(f"SELECT pg_notify('{CHANNEL}', p) FROM unnest($1::text[]) AS p", packed)
                self.sent += len(batch)
                self.notifications += len(packed)
                self.statements += 1
            except Exception as exc:  # the events of this process still reach its own subscribers
                log.warning("%d event(s) not sent to the other gateway processes (%s)", len(batch), exc)

    def ask(self, lock: int) -> None:
        """Tell the other processes that this one waits for the advisory lock ``lock``."""
        task = asyncio.get_running_loop().create_task(self._ask(lock), name="postgres-lease-ask")
        self._asking.add(task)
        task.add_done_callback(self._asking.discard)

    async def _ask(self, lock: int) -> None:
        try:
            await self.pool.execute(f"SELECT pg_notify('{LEASE_CHANNEL}', $1)", f"{self.origin} {lock}")
        except Exception as exc:  # the holder gives the key back when its lease's linger ends
            log.debug("could not ask for lock %s (%s)", lock, exc)

    def _on_ask(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        origin, _, lock = payload.partition(" ")
        if origin != self.origin and self.asked is not None:
            try:
                number = int(lock)
            except ValueError:
                return
            self.asked(number)

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload.startswith(self._echo):  # this process's own event: skipped before it is parsed
            return
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        for item in data if isinstance(data, list) else [data]:
            if isinstance(item, dict) and item.get("o") != self.origin and isinstance(item.get("e"), dict):
                if item.get("ref") or self._inbox:
                    self._inbox.append(item)  # after the events before it (a reference is read first)
                    self._arrived.set()
                else:  # nothing before it waits: delivered now, without a task switch per event
                    self._deliver(item["e"])

    def _deliver(self, event: dict[str, Any]) -> None:
        self.received += 1
        if self.deliver is not None:
            try:
                self.deliver(cast(StoreEvent, event))
            except Exception:  # one event's failure must stop neither the reader nor the events after it
                log.exception("an event from another gateway process was not delivered")

    async def _read(self) -> None:
        """Deliver, in the order they came, the events that had to wait: a reference (the stored
        message is read first) and every event that came while one was being read."""
        while True:
            await self._arrived.wait()
            while self._inbox:
                data = self._inbox[0]
                event: dict[str, Any] = data["e"]
                try:
                    if data.get("ref"):
                        event = await self._resolve(event)
                except Exception as exc:
                    log.warning("event of run %s seq %s not read (%s)", event.get("run_id"), event.get("seq"), exc)
                else:
                    self._deliver(event)
                finally:
                    self._inbox.popleft()
            self._arrived.clear()

    async def _resolve(self, event: dict[str, Any]) -> dict[str, Any]:
        text = await self.pool.fetchval(
            "SELECT record::text FROM messages WHERE run_id = $1 AND seq = $2", event["run_id"], event["seq"]
        )
        if text is None:  # purged meanwhile
            return {**event, "truncated": True}
        return {**event, **event_fields(decode(text.encode()))}

    async def close(self) -> None:
        self._closing = True
        await _cancel(self._keeper)
        if self._sender is not None:
            with contextlib.suppress(Exception):
                await self._sender
        await _cancel(self._reader)
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=5)


async def _cancel(task: asyncio.Task[None] | None) -> None:
    """``task`` cancelled, and waited for (None: none was started)."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
