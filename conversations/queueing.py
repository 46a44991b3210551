"""Queue modes: what happens to a message that arrives on a key while a model turn runs or while
earlier messages wait for one (``session.queue.mode``; SPEC section 8 as amended).

- ``collect`` (default): the calls that wait are answered together by one turn once the running
  turn ends; every waiting call gets that one reply, each with its own ``message_seq``.
- ``followup``: one turn per message, each seeing the context only up to its own message.
- ``steer``: a message that arrives during a turn joins it: the turn's next model call (after a
  tool round) sees it, and the turn's reply answers it; no separate turn runs for it. A message
  the turn had no further model call to see gets a turn of its own, so nothing goes unanswered.

A batch of calls runs its turn in a task of its own, not in any caller's: a caller that goes away
does not take the others' turn with it. Turns still take the key's turn lock, so they run one at
a time, in arrival order, between lifecycle changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, get_args

from config.errors import Busy
from config.settings import QueueMode
from sessions.events import TurnSkippedEvent

if TYPE_CHECKING:
    from conversations.posts import DeltaFn, Outcome, TurnOptions
    from sessions.records import RunState

QUEUE_MODES: tuple[str, ...] = get_args(QueueMode)


@dataclass
class TurnScope:
    """What one model turn may see: not the messages of calls that wait for a later turn
    (``hidden``), nor, unless steering (``horizon`` None), what was appended after the turn began
    (seq above ``horizon``), except the lines the turn appended itself (``own``). ``seen_upto`` is
    the highest seq its last model call was sent."""

    horizon: int | None
    hidden: frozenset[int] = frozenset()
    own: set[int] = field(default_factory=set)
    seen_upto: int = 0

    def visible(self, line: Mapping[str, Any]) -> bool:
        seq = line.get("seq")
        if seq is None or seq in self.own:
            return True
        return seq not in self.hidden and (self.horizon is None or seq <= self.horizon)


@dataclass(eq=False)
class Caller:
    """One call waiting for a turn; ``answered`` is True when the turn answered it, False when a
    steered turn ended without seeing its message."""

    outcome: Outcome
    on_delta: DeltaFn | None
    late: bool  # joined a turn that had started (steer)
    answered: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def seq(self) -> int:
        return self.outcome.message_seq or 0


@dataclass(eq=False)
class Batch:
    """The calls one turn answers."""

    run: RunState
    mode: QueueMode
    callers: list[Caller] = field(default_factory=list)
    started: bool = False
    finished: bool = False
    scope: TurnScope | None = None
    task: asyncio.Task[None] | None = None
    options: TurnOptions | None = None  # a call with per-call options (OpenAI routes) has a batch of its own

    @property
    def last_seq(self) -> int:
        return max(c.seq for c in self.callers)

    @property
    def streams(self) -> bool:
        """Whether the turn asks the model for a stream. The batch of an OpenAI-route call
        (``options``) is that call's own: it streams only when the call asked for deltas (a
        steer-mode call that joins it late gets the whole reply at the end). Any other batch always
        streams, since callers that want deltas may still join it."""
        return self.options is None or any(c.on_delta is not None for c in self.callers)

    def join(self, outcome: Outcome, on_delta: DeltaFn | None) -> Caller:
        caller = Caller(outcome, on_delta, late=self.started)
        self.callers.append(caller)
        return caller

    async def on_delta(self, text: str) -> None:
        """Streamed text goes to every caller that asked for it; one that went away drops out."""
        for caller in list(self.callers):
            if caller.on_delta is None:
                continue
            try:
                await caller.on_delta(text)
            except ConnectionError:
                caller.on_delta = None

    def answer(self, result: Outcome) -> None:
        """Give every caller the turn's reply, events and usage (each keeps its own seq)."""
        for caller in self.callers:
            if caller.answered.done():
                continue
            unseen = self.scope is not None and caller.late and caller.seq > self.scope.seen_upto
            if unseen:
                caller.answered.set_result(False)
                continue
            caller.outcome.reply = result.reply.copy() if result.reply is not None else None
            caller.outcome.events.extend(result.events)
            caller.outcome.usage = dict(result.usage)
            caller.answered.set_result(True)

    def skip(self, event: TurnSkippedEvent) -> None:
        for caller in self.callers:
            if not caller.answered.done():
                caller.outcome.events.append(event.copy())
                caller.answered.set_result(True)

    def fail(self, error: Callable[[Caller], BaseException]) -> None:
        for caller in self.callers:
            if not caller.answered.done():
                caller.answered.set_exception(error(caller))
                caller.answered.exception()  # retrieved: the caller re-raises it; none is logged as lost


BatchRunner = Callable[[Batch], Awaitable[None]]
LockFor = Callable[[str], asyncio.Lock]
ErrorFor = Callable[[Caller], BaseException]


class Room:
    """One call's place among a key's waiting calls (:meth:`TurnQueue.reserve`): taken before its
    message is stored and held until the call waits for its turn, or given back."""

    def __init__(self, queue: TurnQueue, key: str) -> None:
        self._queue, self.key, self.held = queue, key, True

    def release(self) -> None:
        """Give the place back (nothing if the call is already waiting: the place became that)."""
        if self.held:
            self.held = False
            self._queue._give_back(self.key)


class TurnQueue:
    """Per key: the batch still collecting callers, the batch whose turn runs, and how many calls
    wait for a turn that has not started (the ``max_queued_turns`` count), places taken included."""

    def __init__(self, run_batch: BatchRunner, lock_for: LockFor, closing_error: ErrorFor) -> None:
        self._run_batch = run_batch
        self._lock_for = lock_for
        self._closing_error = closing_error
        self._open: dict[str, Batch] = {}
        self._current: dict[str, Batch] = {}
        self._waiting: dict[str, int] = {}
        self._reserved: dict[str, int] = {}  # places taken by calls whose message is being stored
        self._queued: dict[str, list[Batch]] = {}  # batches not started yet, in order
        self._tasks: set[asyncio.Task[None]] = set()

    def waiting(self, key: str) -> int:
        return self._waiting.get(key, 0) + self._reserved.get(key, 0)

    def reserve(self, key: str, limit: int) -> Room:
        """A place among the key's waiting calls; Busy when ``limit`` calls already wait or hold one
        (a call is refused only past the limit). The place is taken now, before the call's message
        is stored: checked then and counted only once the call waits, calls arriving together all
        passed the check while the first of them was being stored (CI saw a third call admitted
        with a limit of 2)."""
        waiting = self.waiting(key)
        if waiting >= limit:
            raise Busy(
                f"session {key!r} already has {waiting} calls waiting for a model turn (max_queued_turns"
                f" {limit}); retry later",
                retry_after_s=1,
            )
        self._reserved[key] = self._reserved.get(key, 0) + 1
        return Room(self, key)

    def _give_back(self, key: str) -> None:
        left = self._reserved.get(key, 0) - 1
        if left > 0:
            self._reserved[key] = left
        else:
            self._reserved.pop(key, None)

    async def submit(
        self,
        run: RunState,
        outcome: Outcome,
        on_delta: DeltaFn | None,
        mode: QueueMode,
        options: TurnOptions | None = None,
        room: Room | None = None,
    ) -> None:
        """Wait until a turn answered ``outcome`` (filled in place); raises what the turn raised. A
        call with ``options`` (its own instructions and client tools) gets a turn of its own, as in
        ``followup`` mode: they are not merged into another caller's turn. ``room``: the call's
        place (:meth:`reserve`), which becomes its count among the waiting calls."""
        key = run.key
        if options is not None:
            mode = "followup"
        current = self._current.get(key)
        if mode == "steer" and current is not None and current.run.run_id == run.run_id and not current.finished:
            answered = await asyncio.shield(current.join(outcome, on_delta).answered)
            if answered:
                return
        caller = self._batch_for(run, mode, options).join(outcome, on_delta)
        if room is not None and room.held:  # counted among the waiting now: the place is given back
            room.release()
        await asyncio.shield(caller.answered)

    def _batch_for(self, run: RunState, mode: QueueMode, options: TurnOptions | None) -> Batch:
        """The batch a new call joins (the key's open one in the same run, else a new one with its
        task started), the call counted among the key's waiting calls."""
        key = run.key
        batch = self._open.get(key) if mode != "followup" else None
        if batch is None or batch.run.run_id != run.run_id:
            batch = Batch(run, mode, options=options)
            if mode != "followup":
                self._open[key] = batch
            self._queued.setdefault(key, []).append(batch)
            batch.task = asyncio.create_task(self._run(batch), name=f"turn {key}")
            self._tasks.add(batch.task)
            batch.task.add_done_callback(self._tasks.discard)
        self._waiting[key] = self._waiting.get(key, 0) + 1
        return batch

    async def _run(self, batch: Batch) -> None:
        key = batch.run.key
        try:
            async with self._lock_for(key):
                self._start(batch)
                self._current[key] = batch
                try:
                    await self._run_batch(batch)
                finally:
                    batch.finished = True
                    if self._current.get(key) is batch:
                        del self._current[key]
        except asyncio.CancelledError:  # the gateway is shutting down
            self._start(batch)
            batch.fail(self._closing_error)
        except BaseException as exc:
            failure = exc
            batch.fail(lambda _caller: failure)
            if not isinstance(exc, Exception):
                raise

    def _start(self, batch: Batch) -> None:
        if batch.started:
            return
        key = batch.run.key
        batch.started = True
        if self._open.get(key) is batch:
            del self._open[key]
        queued = self._queued.get(key, [])
        if batch in queued:
            queued.remove(batch)
        if not queued:
            self._queued.pop(key, None)
        left = self._waiting.get(key, 0) - len(batch.callers)
        if left > 0:
            self._waiting[key] = left
        else:
            self._waiting.pop(key, None)

    def scope_for(self, batch: Batch) -> TurnScope:
        """The scope of ``batch``'s turn, which starts now."""
        if batch.mode == "steer":
            return TurnScope(horizon=None)
        run_id = batch.run.run_id
        later = frozenset(
            c.seq for b in self._queued.get(batch.run.key, ()) if b.run.run_id == run_id for c in b.callers
        )
        return TurnScope(horizon=batch.run.next_seq - 1, hidden=later)

    async def close(self) -> None:
        """Cancel every turn that waits or runs (shutdown): their callers get the closing error."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
