"""Conversations: posting messages to keys in per-key order, composed with the engine's parts over
one ``ConversationCore`` (``conversations/turn_core.py``): ``Idempotency``
(``conversations/idempotency.py``), ``CompactionTriggers`` (``conversations/compaction_triggers.py``)
and ``ModelTurns`` (``conversations/model_turn.py``); what is posted and answered is
``conversations/posts.py``, re-exported here.

Two locks per key keep the rules of SPEC section 8: the *lifecycle* lock (short: start a run and
append) and the *turn* lock (held for a model turn). A message that arrives during a turn is
appended at once under the lifecycle lock and then waits for the turn lock, so its seq is its
arrival order and turns run one at a time in that order. Lifecycle changes take the turn lock
first, then the lifecycle lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from config.clock import Clock, iso
from config.errors import ProviderFailure, ShuttingDown
from config.settings import Settings
from conversations import log_context
from conversations.compaction_triggers import FLUSH_PROMPT as FLUSH_PROMPT
from conversations.compaction_triggers import CompactionTriggers
from conversations.completions import ProviderError
from conversations.events import EventHub
from conversations.fallbacks import ModelChain
from conversations.hooks import ConversationHooks
from conversations.idempotency import IDEMPOTENCY_WINDOW as IDEMPOTENCY_WINDOW
from conversations.idempotency import Idempotency, previous_of
from conversations.log_context import EVERY_ONE
from conversations.metrics import Metrics
from conversations.model_turn import ModelTurns, provider_failure, stored_failure
from conversations.posts import DeltaFn, Outcome, Post, TurnOptions, outcome_from, speaker_name
from conversations.queueing import Batch, Caller, Room, TurnQueue
from conversations.tools import ToolBox
from conversations.turn_core import ConversationCore
from sessions.compactor import Compactor
from sessions.delegate import Delegate, PartField
from sessions.deliveries import AlreadyDelivered
from sessions.events import inheritance_published
from sessions.inheritance import find_inheritance
from sessions.protocol import ConversationStore
from sessions.records import NewMessage, RunStart, RunState, TaskKey

log = logging.getLogger(__name__)
__all__ = [
    "FLUSH_PROMPT",
    "IDEMPOTENCY_WINDOW",
    "Conversations",
    "DeltaFn",
    "Outcome",
    "Post",
    "TurnOptions",
    "outcome_from",
    "provider_failure",
    "stored_failure",
]


class Conversations:
    """The engine: posting (this class) composed with its parts over one ``ConversationCore``
    (``idempotency``, ``compaction``, ``turns``)."""

    # the shared state's fields, read-only here
    store: PartField[ConversationStore] = PartField("core")
    settings: PartField[Settings] = PartField("core")
    providers: PartField[Mapping[str, ModelChain]] = PartField("core")
    hub: PartField[EventHub] = PartField("core")
    metrics: PartField[Metrics] = PartField("core")
    clock: PartField[Clock] = PartField("core")
    tools: PartField[ToolBox] = PartField("core")
    hooks: PartField[ConversationHooks] = PartField("core")
    one_off: PartField[set[str]] = PartField("core")
    compactors: PartField[dict[str, Compactor]] = PartField("core")
    # what the gateway, the channels and the housekeeping call on the parts (``sessions.delegate``)
    # the shared state's helpers
    agent = Delegate("core", ConversationCore.agent)
    provider = Delegate("core", ConversationCore.provider)
    model_name = Delegate("core", ConversationCore.model_name)
    threshold = Delegate("core", ConversationCore.threshold)
    queue_mode = Delegate("core", ConversationCore.queue_mode)
    needs_turn = Delegate("core", ConversationCore.needs_turn)
    turn_lock = Delegate("core", ConversationCore.turn_lock)
    exclusive = Delegate("core", ConversationCore.exclusive)
    context_overhead = Delegate("core", ConversationCore.context_overhead)
    command_exchange = Delegate("core", ConversationCore.command_exchange)
    ensure_active = Delegate("core", ConversationCore.ensure_active)
    refresh_compactors = Delegate("core", ConversationCore.refresh_compactors)
    # idempotent redelivery
    once = Delegate("idempotency", Idempotency.once)
    find_previous = Delegate("idempotency", Idempotency.find_previous)
    find_in_run = Delegate("idempotency", Idempotency.find_in_run)
    remember = Delegate("idempotency", Idempotency.remember)
    remember_delivery = Delegate("idempotency", Idempotency.remember_delivery)
    # compaction, the memory flush, the final summary
    compact = Delegate("compaction", CompactionTriggers.compact)
    compact_if_due = Delegate("compaction", CompactionTriggers.compact_if_due)
    memory_flush = Delegate("compaction", CompactionTriggers.memory_flush)
    final_summary = Delegate("compaction", CompactionTriggers.final_summary)

    def __init__(
        self,
        store: ConversationStore,
        settings: Settings,
        *,
        providers: Mapping[str, ModelChain],
        hub: EventHub,
        metrics: Metrics,
        clock: Clock,
        tools: ToolBox | None = None,
        hooks: ConversationHooks | None = None,
    ) -> None:
        tools = tools if tools is not None else ToolBox(store)
        core = self.core = ConversationCore(
            store, settings, providers, hub, metrics, clock, tools, hooks or ConversationHooks()
        )
        self.idempotency = Idempotency(core)
        self.compaction = CompactionTriggers(core)
        self.turns = ModelTurns(core, self.compaction)
        self.queue = TurnQueue(self._batch_turn, core.turn_lock, self._closing_error)
        self.closing = False
        self._running: dict[str, asyncio.Task[Any]] = {}
        # runs a posted message's automatic compaction is under way for: whether a message was
        # stored meanwhile (and answered without waiting), so the threshold is checked again after it
        self._compacting: dict[str, bool] = {}
        self._rechecks: set[asyncio.Task[None]] = set()  # those checks, made after the compaction

    def _closing_error(self, caller: Caller) -> BaseException:
        return ShuttingDown(
            f"the gateway is shutting down: the turn was stopped; the message is stored (seq {caller.seq})",
            message_seq=caller.seq,
            stored=True,
        )

    async def post(
        self, post: Post, *, on_delta: DeltaFn | None = None, on_stored: Callable[[Outcome], None] | None = None
    ) -> Outcome:
        """Store ``post`` and run its model turn. ``on_stored`` is called with the outcome as soon as
        this call has made the message durable, before the turn (webhooks answer 202 then); it is
        not called when nothing new is stored (an idempotent repeat)."""
        if post.message.client_message_id is None:
            return await self._post(post, on_delta, on_stored)
        return await self.idempotency.once(post, lambda: self._post_once(post, on_delta, on_stored))

    async def _post_once(
        self, post: Post, on_delta: DeltaFn | None, on_stored: Callable[[Outcome], None] | None
    ) -> Outcome:
        assert post.message.client_message_id is not None
        key, cmid = post.key.raw, post.message.client_message_id
        if post.id_scope == "run":
            previous = await self.idempotency.find_in_run(key, cmid)
        elif self.core.store.checks_deliveries(key):
            previous = None  # the append checks the id in the statement that stores it
        else:
            previous = await self.idempotency.find_previous(key, cmid)
        if previous is None:
            try:
                outcome = await self._post(post, on_delta, on_stored)
            except AlreadyDelivered as repeat:  # stored before: nothing was stored now
                previous = previous_of(repeat.prior)
                if repeat.prior.response is None:  # a check in memory knows where, not the recorded answer
                    previous = await self.idempotency.find_previous(key, cmid) or previous
        if previous is None:
            pass
        elif previous["response"] is not None:
            return outcome_from(json.loads(previous["response"]))
        elif previous.get("reply") is not None:  # answered, but the answer's record was lost
            outcome = Outcome(key, previous["run_id"], previous["message_seq"], reply=previous["reply"])
        else:  # stored before, but its turn failed: run the turn again, store nothing new
            run = self.core.store.run_state(previous["run_id"]) if previous["run_id"] else None
            if run is None or run.status != "running" or not self.core.needs_turn(post):
                outcome = Outcome(key, previous["run_id"], previous["message_seq"])
            else:
                outcome = Outcome(key, run.run_id, previous["message_seq"])
                await self._queued_turn(post, run, outcome, on_delta)
        if post.id_scope == "key":
            await self.idempotency.remember(key, cmid, outcome)
        return outcome

    async def _post(
        self, post: Post, on_delta: DeltaFn | None, on_stored: Callable[[Outcome], None] | None = None
    ) -> Outcome:
        key = post.key.raw
        log_context.bind_turn(key, post.key.agent_id)  # the log lines of this message name them
        turn = self.core.needs_turn(post)
        if self.closing:
            raise ShuttingDown("the gateway is shutting down; nothing was stored, send later")
        room = self.queue.reserve(key, self.core.agent(post.key.agent_id).max_queued_turns) if turn else None
        try:
            return await self._store_and_answer(post, on_delta, on_stored, room)
        finally:
            if room is not None:
                room.release()  # stored and answered, or failed before it waited: the place is free

    async def _store_and_answer(
        self,
        post: Post,
        on_delta: DeltaFn | None,
        on_stored: Callable[[Outcome], None] | None,
        room: Room | None,
    ) -> Outcome:
        key = post.key.raw
        turn = room is not None
        outcome = Outcome(key, None, None)
        for check in self.core.hooks.before_post:  # e.g. a reset that fell due while nobody wrote
            outcome.events.extend(await check(post))
        async with self.core.store.lock_for(key):
            run = self.core.store.active_run(key)
            new_run = run is None
            had_entry = self.core.store.entry(key) is not None
            if run is not None:
                self.core.store.check_writable(run, NewMessage(role=post.message.role, content=""))
            else:
                run = await self._start_run(post, outcome)
            started = time.perf_counter()
            try:
                for hook in self.core.hooks.before_append:  # e.g. auto-recall before the first user message
                    outcome.events.extend(await hook(run, post, new_run))
                message = self._new_message(post)
                record, durable = self.core.store.queue_append(run, message)
                if new_run:  # the run exists only for this message: a failure leaves nothing behind
                    await self.core.store.finish_append(run, message, record, durable)
            except Exception:
                if new_run:
                    await self.core.store.discard_run(run, remove_entry=not had_entry)
                raise
        if not new_run:
            # Durable outside the lock: the seq and the file order are fixed already, and the key's
            # next messages join this group commit instead of each waiting for the previous sync.
            await self.core.store.finish_append(run, message, record, durable)
        self.core.metrics.message_stored(post.message.role, time.perf_counter() - started)
        outcome.run_id, outcome.message_seq = run.run_id, record["seq"]
        log_context.RUN_ID.set(run.run_id)
        # the message is its own delivery record (it carries its client_message_id): no record now
        if on_stored is not None:
            on_stored(outcome)
        if turn:
            await self._queued_turn(post, run, outcome, on_delta, room)
        elif self.core.settings.compaction.enabled and not run.hold_compaction and self.compaction.due(run):
            await self._compact_after_post(run, outcome)
        return outcome

    async def _compact_after_post(self, run: RunState, outcome: Outcome) -> None:
        """The automatic compaction a stored message without a turn brought due. The message that
        found it due runs it (its answer carries the compaction event); messages stored while it
        runs answer at once: their lines are kept on top of the new context. Without this, every
        message posted to a busy key during the compaction waited for it.

        Their check after the append (SPEC section 5) is handed on, not skipped: when messages
        came meanwhile, a task checks again once the compaction is done, and compacts again
        (and again, while messages keep coming) if they keep the context at or over the
        threshold; else a burst during a compaction left the key over it until its next message.
        The message that waited is answered without waiting for that; while the gateway shuts
        down it checks again itself (no task may start then, and no message comes after these)."""
        if run.run_id in self._compacting:
            self._compacting[run.run_id] = True
            return
        self._compacting[run.run_id] = False
        try:
            while await self._compact_pass(run, outcome) and self.closing and self._compacting[run.run_id]:
                # shutting down: no task may take the check over, and no message comes after these
                self._compacting[run.run_id] = False
        except Exception as exc:
            raise stored_failure(exc, run.key, outcome.message_seq) from exc
        finally:  # also when it failed: each of those messages would have tried it again
            if self._compacting[run.run_id] and not self.closing:
                task = asyncio.create_task(self._check_again(run))
                self._rechecks.add(task)
                task.add_done_callback(self._rechecks.discard)
            else:
                del self._compacting[run.run_id]

    async def _check_again(self, run: RunState) -> None:
        """The threshold check of the messages answered during an automatic compaction, made
        after it (it owns the marker of ``run`` until no message comes during its own pass)."""
        try:
            while self._compacting[run.run_id]:  # shutdown waits; no message is taken after it
                self._compacting[run.run_id] = False
                if not await self._compact_pass(run, Outcome(run.key, run.run_id, None)):
                    return
        except Exception:  # their messages are answered: nobody to tell; the key's next message tries again
            log.exception("automatic compaction of run %s after a burst failed", run.run_id)
        finally:
            del self._compacting[run.run_id]

    async def _compact_pass(self, run: RunState, outcome: Outcome) -> bool:
        """One automatic compaction check of ``run`` under its key's turn lock; False when the run
        ended meanwhile."""
        async with self.core.turn_lock(run.key):
            if self.core.store.run_state(run.run_id) is None:
                return False
            await self.compaction.compact_if_due(run, outcome)
            return True

    async def _start_run(self, post: Post, outcome: Outcome) -> RunState:
        key = post.key
        task_key = post.task_key or TaskKey(
            task_type=key.family, task_identifier=key.raw, repository=None, user=post.message.sender_id
        )
        entry = self.core.store.entry(key.raw)
        inherit = self.core.settings.inheritance.enabled and (entry is None or entry.inherit_next)
        found = None
        if inherit:
            found = await find_inheritance(
                self.core.store,
                key=key.raw,
                task_key=task_key if key.family == "hook" else None,
                settings=self.core.settings.inheritance,
            )
        run = await self.core.store.start_run(
            RunStart(
                key.raw,
                agent_id=key.agent_id,
                chat_type=key.chat_type,
                channel=key.channel,
                task_key=task_key,
                parent_uuid=found.run_id if found else None,
                opening=True,
            ),
        )
        try:
            if found is not None:
                await self.core.store.append(
                    run, NewMessage(role="system", content=found.message, kind="inheritance", user_activity=False)
                )
        except Exception:  # the run exists only for the message being posted: it leaves nothing behind
            await self.core.store.discard_run(run, remove_entry=entry is None)
            raise
        if found is not None:
            event = found.event()
            event["from_run_id"] = found.run_id
            outcome.events.append(event)  # run_id: the earlier run, as SPEC section 6 has it for replies
            # published: run_id the new run, from_run_id the earlier
            self.core.store.emit(inheritance_published(run, iso(self.core.store.clock()), event))
        await self.core.store.set_inherit_next(key.raw, True)
        log_context.RUN_ID.set(run.run_id)  # this line and the message's next ones name the new run
        log.info("%s: new run %s (%s)", key.raw, run.run_id,
                 f"inherits run {found.run_id}" if found else "inherits nothing", extra=EVERY_ONE)  # fmt: skip
        return run

    def _new_message(self, post: Post) -> NewMessage:
        """The message as stored: the speaker's name made OpenAI-safe; a key-scoped
        client_message_id marked ``once`` (the append refuses a repeat: ``AlreadyDelivered``)."""
        message = post.message
        once = message.client_message_id is not None and post.id_scope == "key"
        if message.role == "user" and message.name is not None:
            return dataclasses.replace(message, name=speaker_name(message.name), once=once)
        return dataclasses.replace(message, once=True) if once and not message.once else message

    async def _queued_turn(
        self, post: Post, run: RunState, outcome: Outcome, on_delta: DeltaFn | None, room: Room | None = None
    ) -> None:
        """Wait for a turn that answers ``outcome``, as the key's queue mode says (conversations/queueing.py).
        The message is stored already: any failure answers ``stored: true`` with its seq."""
        try:
            mode = self.core.queue_mode(post.key.raw, post.key.agent_id)
            await self.queue.submit(run, outcome, on_delta, mode, post.options, room)
        except Exception as exc:
            raise stored_failure(exc, post.key.raw, outcome.message_seq) from exc

    async def _batch_turn(self, batch: Batch) -> None:
        """Run one model turn for ``batch`` (the queue holds the key's turn lock) and answer its callers."""
        run = batch.run
        key = run.key
        if self.core.store.run_state(run.run_id) is None:  # reset while the calls waited
            batch.skip({"type": "turn_skipped", "reason": "the run ended before its turn"})
            return
        if run.status != "running":  # paused while the calls waited: no model turn until /resume
            batch.skip({"type": "turn_skipped", "reason": "the session was paused before its turn"})
            return
        last = batch.last_seq
        batch.scope = self.queue.scope_for(batch)
        result = Outcome(key, run.run_id, last)
        deltas = batch.on_delta if batch.streams else None  # an OpenAI-route call not streamed: one plain answer
        turn = asyncio.create_task(self.turns.run_turn(run, result, deltas, scope=batch.scope, options=batch.options))
        self._running[key] = turn
        try:
            await turn
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not turn.cancelled() or (current is not None and current.cancelling()):
                raise
            if self.closing:
                batch.fail(self._closing_error)
                return
            result.events.append({"type": "stopped", "reason": "/stop cancelled the turn"})
        except ProviderFailure as exc:
            cause = exc.__cause__
            if not isinstance(cause, ProviderError):
                raise
            batch.fail(lambda caller: provider_failure(cause, caller.seq))
            return
        finally:
            if self._running.get(key) is turn:
                del self._running[key]
        batch.answer(result)

    async def shutdown(self) -> None:
        """Refuse new messages, stop every running turn (as /stop does) and answer the callers of
        running and waiting turns 503 ``shutting_down`` with their stored seq."""
        self.closing = True
        await self.queue.close()
        if self._rechecks:  # their checks end while the store is open (no message is taken now)
            await asyncio.gather(*self._rechecks, return_exceptions=True)

    def stop_turn(self, key: str) -> bool:
        """Cancel the key's running turn (``/stop``); False when none runs."""
        task = self._running.get(key)
        if task is None or task.done():
            return False
        task.cancel()
        return True
