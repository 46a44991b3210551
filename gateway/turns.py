"""Conversations: posting messages to keys, model turns, per-key order, idempotent redelivery.

Two locks per key keep the rules of SPEC section 8: the *lifecycle* lock (short: start a run and
append) and the *turn* lock (held for a model turn). A message that arrives during a turn is
appended at once under the lifecycle lock and then waits for the turn lock, so its seq is its
arrival order and turns run one at a time in that order. Lifecycle changes take the turn lock
first, then the lifecycle lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from config.clock import Clock, iso
from config.errors import NeotaskError, NoActiveRun, ProviderFailure, ShuttingDown, TurnFailed
from config.settings import AgentSettings, Settings
from gateway.events import EventHub
from gateway.metrics import Metrics
from gateway.provider import ChatProvider, Completion, ProviderError, ToolCall, Usage
from gateway.queueing import Batch, Caller, QueueMode, TurnQueue, TurnScope
from gateway.summarizer import ModelSummarizer
from gateway.tools import ToolBox
from sessions.compaction import compaction_due
from sessions.compactor import CompactionResult, Compactor, SummaryResult, Trigger
from sessions.inheritance import find_inheritance
from sessions.keys import SessionKey
from sessions.records import NewMessage, Role, RunState, TaskKey
from sessions.store import SessionStore
from sessions.thresholds import compaction_threshold
from sessions.tokens import estimate_text

log = logging.getLogger(__name__)

DeltaFn = Callable[[str], Awaitable[None]]
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
IDEMPOTENCY_WINDOW = timedelta(days=1)
TOOL_LIMIT_PROMPT = (
    "You have used all {rounds} tool rounds of this turn; no more tools can be called. Answer the user now"
    " with what you have, and say what is left undone."
)
TOOL_LIMIT_REPLY = "(I reached the limit of {rounds} tool rounds before finishing. Send a message to let me continue.)"
MAX_OVERFLOW_CYCLES = 2
FLUSH_PROMPT = (
    "The conversation context is about to be compacted: older messages will be replaced by a summary."
    " Save any durable facts worth remembering later (preferences, decisions, names, ids, open tasks)"
    " with memory_append, one fact per call; check memory_search first to avoid duplicates. If there is"
    " nothing worth saving, answer with an empty message."
)


@dataclass(frozen=True)
class TurnOptions:
    """Per-call additions to a model turn (the OpenAI-compatible routes): extra system
    ``instructions`` after the agent's prompt, the client's own function ``client_tools`` (a call
    to one ends the turn and is handed back to the client) and ``tool_choice``; ``answer_tool``:
    a ``role: tool`` post (a client tool's result) gets a model turn like a user message."""

    instructions: str | None = None
    client_tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] | None = None
    answer_tool: bool = False

    @property
    def client_tool_names(self) -> frozenset[str]:
        return frozenset(str(t.get("function", {}).get("name", "")) for t in self.client_tools)


@dataclass(frozen=True)
class Post:
    """A message to post to a key, as the routes build it."""

    key: SessionKey
    role: Role
    content: str
    name: str | None = None
    sender_id: str | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    reply: bool = True
    client_message_id: str | None = None
    user_activity: bool | None = None
    task_key: TaskKey | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()
    options: TurnOptions | None = None


@dataclass
class Outcome:
    """What a message or command call answers (SPEC section 8)."""

    session_key: str
    run_id: str | None
    message_seq: int | None
    reply: dict[str, Any] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=lambda: Usage().as_dict())

    def body(self) -> dict[str, Any]:
        return {
            "session_key": self.session_key,
            "run_id": self.run_id,
            "message_seq": self.message_seq,
            "reply": self.reply,
            "events": self.events,
            "usage": self.usage,
        }


def speaker_name(name: str | None) -> str | None:
    """OpenAI's ``name`` allows ``[A-Za-z0-9_-]{1,64}``."""
    if not name:
        return None
    cleaned = _NAME_UNSAFE.sub("_", name.strip())[:64].strip("_")
    return cleaned or None


def to_openai(line: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": line["role"], "content": line.get("content") or ""}
    if line["role"] == "user" and line.get("name"):
        message["name"] = line["name"]
    if line.get("tool_calls"):
        message["tool_calls"] = line["tool_calls"]
        if not message["content"]:
            message["content"] = None
    if line["role"] == "tool":
        message["tool_call_id"] = line.get("tool_call_id") or ""
    return message


class Conversations:
    def __init__(
        self,
        store: SessionStore,
        settings: Settings,
        *,
        providers: Mapping[str, ChatProvider],
        hub: EventHub,
        metrics: Metrics,
        clock: Clock,
    ) -> None:
        self.store = store
        self.settings = settings
        self.providers = providers
        self.hub = hub
        self.metrics = metrics
        self.clock = clock
        self.tools = ToolBox(store)
        self._turn_locks: dict[str, asyncio.Lock] = {}
        self._running: dict[str, asyncio.Task[Any]] = {}
        self.queue = TurnQueue(self._batch_turn, self.turn_lock, self._closing_error)
        self.closing = False
        self._inflight: dict[tuple[str, str], asyncio.Future[dict[str, Any]]] = {}
        self.run_starters: list[Callable[[RunState, Post], Awaitable[list[dict[str, Any]]]]] = []
        self.archive_text: Callable[[str, str], Awaitable[str | None]] | None = None
        self.before_post: list[Callable[[Post], Awaitable[list[dict[str, Any]]]]] = []
        self.before_append: list[Callable[[RunState, Post, bool], Awaitable[list[dict[str, Any]]]]] = []
        self.compactors = {agent_id: self._compactor(agent_id) for agent_id in settings.agents}
        store.final_summarizer = self._final_summary

    def _compactor(self, agent_id: str) -> Compactor:
        agent = self.settings.agents[agent_id]
        summarizer = ModelSummarizer(
            self.providers.get(agent_id),
            model=self.settings.compaction.model or agent.model.name,
            context_window=agent.model.context_window,
            max_output_tokens=agent.model.max_output_tokens,
        )
        return Compactor(self.store, summarizer, self.settings.compaction)

    def threshold(self, agent_id: str | None) -> int:
        return compaction_threshold(self.settings.compaction, self.agent(agent_id).model)

    # -- configuration --------------------------------------------------------------------------

    def agent(self, agent_id: str | None) -> AgentSettings:
        return self.settings.agents[agent_id or "main"]

    def provider(self, agent_id: str | None) -> ChatProvider | None:
        return self.providers.get(agent_id or "main")

    def model_name(self, key: str, agent_id: str | None) -> str:
        entry = self.store.entry(key)
        override = entry.settings.get("model") if entry else None
        return str(override or self.agent(agent_id).model.name)

    def queue_mode(self, key: str, agent_id: str | None) -> QueueMode:
        """The session's ``queue_mode`` setting, else the agent's, else ``session.queue.mode``."""
        entry = self.store.entry(key)
        override = entry.settings.get("queue_mode") if entry else None
        mode = override or self.agent(agent_id).queue_mode or self.settings.session.queue.mode
        return mode if mode in ("followup", "steer") else "collect"

    def needs_turn(self, post: Post) -> bool:
        answers = post.role == "user" or (post.role == "tool" and post.options is not None and post.options.answer_tool)
        return answers and post.reply and self.provider(post.key.agent_id) is not None

    # -- locks ----------------------------------------------------------------------------------

    def turn_lock(self, key: str) -> asyncio.Lock:
        lock = self._turn_locks.get(key)
        if lock is None:
            lock = self._turn_locks[key] = asyncio.Lock()
        return lock

    @contextlib.asynccontextmanager
    async def exclusive(self, key: str) -> AsyncIterator[None]:
        """Both locks: no turn runs and nothing is appended while a lifecycle change happens."""
        async with self.turn_lock(key), self.store.lock_for(key):
            yield

    # -- posting --------------------------------------------------------------------------------

    async def post(
        self, post: Post, *, on_delta: DeltaFn | None = None, on_stored: Callable[[Outcome], None] | None = None
    ) -> Outcome:
        """Store ``post`` and run its model turn. ``on_stored`` is called with the outcome as soon as
        this call has made the message durable, before the turn (webhooks answer 202 then); it is
        not called when nothing new is stored (an idempotent repeat)."""
        if post.client_message_id is None:
            return await self._post(post, on_delta, on_stored)
        return await self.once(post, lambda: self._post_once(post, on_delta, on_stored))

    async def once(self, post: Post, work: Callable[[], Awaitable[Outcome]]) -> Outcome:
        """Run ``work`` for a delivery with a client_message_id; a second delivery of the same id
        arriving while the first is handled waits for the first one's answer."""
        assert post.client_message_id is not None
        marker = (post.key.raw, post.client_message_id)
        if marker in self._inflight:  # the same delivery is being handled right now
            return outcome_from(await asyncio.shield(self._inflight[marker]))
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._inflight[marker] = future
        try:
            outcome = await work()
            future.set_result(outcome.body())
            return outcome
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
            raise
        finally:
            del self._inflight[marker]

    async def _post_once(
        self, post: Post, on_delta: DeltaFn | None, on_stored: Callable[[Outcome], None] | None
    ) -> Outcome:
        assert post.client_message_id is not None
        previous = await self.find_previous(post.key.raw, post.client_message_id)
        if previous is None:
            outcome = await self._post(post, on_delta, on_stored)
        elif previous["response"] is not None:
            return outcome_from(json.loads(previous["response"]))
        elif previous.get("reply") is not None:  # answered, but the answer's record was lost
            outcome = Outcome(post.key.raw, previous["run_id"], previous["message_seq"], reply=previous["reply"])
        else:  # stored before, but its turn failed: run the turn again, store nothing new
            run = self.store.run_state(previous["run_id"]) if previous["run_id"] else None
            if run is None or run.status != "running" or not self.needs_turn(post):
                outcome = Outcome(post.key.raw, previous["run_id"], previous["message_seq"])
            else:
                outcome = Outcome(post.key.raw, run.run_id, previous["message_seq"])
                await self._queued_turn(post, run, outcome, on_delta)
        await self.remember(post.key.raw, post.client_message_id, outcome)
        return outcome

    async def find_previous(self, key: str, cmid: str) -> dict[str, Any] | None:
        """An earlier delivery of ``cmid`` on ``key`` within the window: its idempotency record,
        or, when there is none (a crash or a tasks.db error came between storing the message and
        committing the record) or tasks.db cannot be read, the message found in the active run's
        messages.jsonl (the durable truth) with its reply if one was stored."""
        try:
            previous = await self._idempotency_lookup(key, cmid)
        except sqlite3.Error as exc:
            log.warning("idempotency lookup on %r failed (%s): checking the transcript instead", key, exc)
            previous = None
        if previous is not None:
            return previous
        since = iso(self.clock() - IDEMPOTENCY_WINDOW)
        found = await self.store.find_delivery(key, cmid, since=since)
        if found is None:
            return None
        log.info("redelivery of %r on %r recognised from the transcript (seq %d)", cmid, key, found.seq)
        return {"run_id": found.run_id, "message_seq": found.seq, "response": None, "reply": found.reply}

    async def _post(
        self, post: Post, on_delta: DeltaFn | None, on_stored: Callable[[Outcome], None] | None = None
    ) -> Outcome:
        key = post.key.raw
        turn = self.needs_turn(post)
        if self.closing:
            raise ShuttingDown("the gateway is shutting down; nothing was stored, send later")
        if turn:
            self.queue.check_room(key, self.agent(post.key.agent_id).max_queued_turns)
        outcome = Outcome(key, None, None)
        for check in self.before_post:  # e.g. a reset that fell due while nobody wrote
            outcome.events.extend(await check(post))
        async with self.store.lock_for(key):
            run = self.store.active_run(key)
            new_run = run is None
            had_entry = self.store.entry(key) is not None
            if run is not None:
                self.store.check_writable(run, NewMessage(role=post.role, content=""))
            else:
                run = await self._start_run(post, outcome)
            started = time.perf_counter()
            try:
                for hook in self.before_append:  # e.g. auto-recall before the first user message
                    outcome.events.extend(await hook(run, post, new_run))
                message = self._new_message(post)
                record, durable = self.store.queue_append(run, message)
                if new_run:  # the run exists only for this message: a failure leaves nothing behind
                    await self.store.finish_append(run, message, record, durable)
            except Exception:
                if new_run:
                    await self.store.discard_run(run, remove_entry=not had_entry)
                raise
        if not new_run:
            # Durable outside the lock: the seq and the file order are fixed already, and the key's
            # next messages join this group commit instead of each waiting for the previous sync.
            await self.store.finish_append(run, message, record, durable)
        self.metrics.message_stored(post.role, time.perf_counter() - started)
        outcome.run_id, outcome.message_seq = run.run_id, record["seq"]
        if post.client_message_id is not None:
            await self.remember(key, post.client_message_id, None, run_id=run.run_id, seq=record["seq"])
        if on_stored is not None:
            on_stored(outcome)
        if turn:
            await self._queued_turn(post, run, outcome, on_delta)
        elif self.settings.compaction.enabled and not run.hold_compaction and self._due(run):
            try:
                async with self.turn_lock(key):
                    if self.store.run_state(run.run_id) is not None:
                        await self.compact_if_due(run, outcome)
            except Exception as exc:
                raise stored_failure(exc, key, outcome.message_seq) from exc
        return outcome

    async def _start_run(self, post: Post, outcome: Outcome) -> RunState:
        key = post.key
        task_key = post.task_key or TaskKey(
            task_type=key.family, task_identifier=key.raw, repository=None, user=post.sender_id
        )
        entry = self.store.entry(key.raw)
        inherit = self.settings.inheritance.enabled and (entry is None or entry.inherit_next)
        found = None
        if inherit:
            found = await find_inheritance(
                self.store,
                key=key.raw,
                task_key=task_key if key.family == "hook" else None,
                settings=self.settings.inheritance,
                archive_text=self.archive_text,
            )
        run = await self.store.start_run(
            key.raw,
            agent_id=key.agent_id,
            chat_type=key.chat_type,
            channel=key.channel,
            task_key=task_key,
            parent_uuid=found.run_id if found else None,
            opening=True,
        )
        try:
            if found is not None:
                await self.store.append(
                    run, NewMessage(role="system", content=found.message, kind="inheritance", user_activity=False)
                )
            for starter in self.run_starters:
                outcome.events.extend(await starter(run, post))
        except Exception:  # the run exists only for the message being posted: it leaves nothing behind
            await self.store.discard_run(run, remove_entry=entry is None)
            raise
        if found is not None:
            event = {**found.event(), "from_run_id": found.run_id}
            outcome.events.append(event)  # run_id: the earlier run, as SPEC section 6 has it for replies
            fields = {k: v for k, v in event.items() if k not in ("type", "run_id")}
            self.store.emit("inheritance", run, **fields)  # run_id: the new run; from_run_id: the earlier
        entry = self.store.entry(key.raw)
        if entry is not None and not entry.inherit_next:
            entry.inherit_next = True
            self.store.registry.touch(key.raw)
        return run

    def _new_message(self, post: Post) -> NewMessage:
        return NewMessage(
            role=post.role,
            content=post.content,
            name=speaker_name(post.name) if post.role == "user" else post.name,
            sender_id=post.sender_id,
            tool_name=post.tool_name,
            tool_call_id=post.tool_call_id,
            tool_calls=post.tool_calls,
            client_message_id=post.client_message_id,
            user_activity=post.user_activity,
        )

    async def _queued_turn(self, post: Post, run: RunState, outcome: Outcome, on_delta: DeltaFn | None) -> None:
        """Wait for a turn that answers ``outcome``, as the key's queue mode says (gateway/queueing.py).
        The message is stored already: any failure answers ``stored: true`` with its seq."""
        try:
            mode = self.queue_mode(post.key.raw, post.key.agent_id)
            await self.queue.submit(run, outcome, on_delta, mode, post.options)
        except Exception as exc:
            raise stored_failure(exc, post.key.raw, outcome.message_seq) from exc

    async def _batch_turn(self, batch: Batch) -> None:
        """Run one model turn for ``batch`` (the queue holds the key's turn lock) and answer its callers."""
        run = batch.run
        key = run.key
        if self.store.run_state(run.run_id) is None:  # reset while the calls waited
            batch.skip({"type": "turn_skipped", "reason": "the run ended before its turn"})
            return
        if run.status != "running":  # paused while the calls waited: no model turn until /resume
            batch.skip({"type": "turn_skipped", "reason": "the session was paused before its turn"})
            return
        last = batch.last_seq
        batch.scope = self.queue.scope_for(batch)
        result = Outcome(key, run.run_id, last)
        turn = asyncio.create_task(self._turn(run, result, batch.on_delta, scope=batch.scope, options=batch.options))
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

    def _closing_error(self, caller: Caller) -> BaseException:
        return ShuttingDown(
            f"the gateway is shutting down: the turn was stopped; the message is stored (seq {caller.seq})",
            message_seq=caller.seq,
            stored=True,
        )

    async def shutdown(self) -> None:
        """Refuse new messages, stop every running turn (as /stop does) and answer the callers of
        running and waiting turns 503 ``shutting_down`` with their stored seq."""
        self.closing = True
        await self.queue.close()

    def stop_turn(self, key: str) -> bool:
        """Cancel the key's running turn (``/stop``); False when none runs."""
        task = self._running.get(key)
        if task is None or task.done():
            return False
        task.cancel()
        return True

    # -- the model turn -------------------------------------------------------------------------

    async def _turn(
        self,
        run: RunState,
        outcome: Outcome,
        on_delta: DeltaFn | None,
        *,
        scope: TurnScope | None = None,
        options: TurnOptions | None = None,
    ) -> None:
        agent = self.agent(run.agent_id)
        provider = self.provider(run.agent_id)
        assert provider is not None
        model = self.model_name(run.key, run.agent_id)
        options = options or TurnOptions()
        tools = [*self.tools.schemas(), *options.client_tools]
        system = agent.system_prompt + (f"\n\n{options.instructions}" if options.instructions else "")
        overhead = self.context_overhead(run.agent_id)
        total = Usage()
        started = time.perf_counter()
        rounds = 0
        overflow_cycles = 0
        run.hold_compaction = False  # a model call releases the hold set by /uncompact
        try:
            while True:
                await self.compact_if_due(run, outcome)
                sent_tokens = run.context_tokens  # what is read now is what the model is sent
                context = await self.store.read_context(run)
                hidden = 0
                if scope is not None:  # lines of later callers wait for their own turn
                    shown = [line for line in context if scope.visible(line)]
                    hidden = sum(int(line.get("tokens") or 0) for line in context if not scope.visible(line))
                    context = shown
                    scope.seen_upto = max((int(line["seq"]) for line in context if line.get("seq")), default=0)
                messages = [{"role": "system", "content": system}, *map(to_openai, context)]
                out_of_rounds = rounds >= agent.max_tool_rounds
                offered = None if out_of_rounds else tools
                if out_of_rounds:  # one last call without tools, asking for the answer
                    messages.append({"role": "system", "content": TOOL_LIMIT_PROMPT.format(rounds=rounds)})
                try:
                    completion = await provider.complete(
                        messages,
                        tools=offered,
                        model=model,
                        on_delta=on_delta,
                        tool_choice=options.tool_choice if offered else None,
                    )
                except ProviderError as exc:
                    if exc.kind != "overflow" or overflow_cycles >= MAX_OVERFLOW_CYCLES:
                        raise
                    overflow_cycles += 1
                    if not await self._compact_for_overflow(run, outcome):
                        raise
                    continue
                total = total + completion.usage
                await self._account(run, completion, overhead, sent_tokens - hidden)
                if completion.tool_calls and offered:
                    rounds += 1
                    client = [c for c in completion.tool_calls if c.name in options.client_tool_names]
                    seq = await self._run_tools(run, completion, scope, client=options.client_tool_names)
                    if client:  # the client runs these and sends the results with its next call
                        outcome.reply = {
                            "content": completion.content,
                            "seq": seq,
                            "tool_calls": [_call_dict(c) for c in client],
                        }
                        self.store.emit("reply", run, seq=seq, content=completion.content, model=completion.model)
                        break
                    continue
                content = completion.content
                if out_of_rounds:
                    outcome.events.append({"type": "tool_limit", "max_tool_rounds": agent.max_tool_rounds})
                    log.info("run %s: the turn used all %d tool rounds", run.run_id, rounds)
                    if not content.strip():
                        content = TOOL_LIMIT_REPLY.format(rounds=rounds)
                record = await self.store.append(
                    run,
                    NewMessage(
                        role="assistant",
                        content=content,
                        usage=completion.usage.as_dict(),
                        reply_to=outcome.message_seq,
                    ),
                )
                self.metrics.messages.labels("assistant").inc()
                outcome.reply = {"content": content, "seq": record["seq"]}
                self.store.emit("reply", run, seq=record["seq"], content=content, model=completion.model)
                break
        except asyncio.CancelledError:
            self.metrics.turns.labels("stopped").inc()
            raise
        except ProviderError as exc:
            self.metrics.turns.labels("provider_error").inc()
            raise provider_failure(exc, outcome.message_seq) from exc
        finally:
            outcome.usage = total.as_dict()
            self.metrics.turn_seconds.observe(time.perf_counter() - started)
        self.metrics.turns.labels("ok").inc()

    async def _account(
        self, run: RunState, completion: Completion, overhead: int, sent_tokens: int | None = None
    ) -> None:
        """Record usage; with ``sent_tokens`` (the context count when the prompt was read), also
        calibrate the context count, keeping what was appended while the model answered."""
        usage = completion.usage.as_dict()
        await self.store.add_usage(run, usage)
        for kind, value in usage.items():
            if value:
                self.metrics.tokens.labels(kind).inc(value)
        if completion.usage.input_tokens and sent_tokens is not None:
            appended = run.context_tokens - sent_tokens
            self.store.calibrate_context(run, completion.usage.input_tokens, overhead, appended_since=appended)

    async def _run_tools(
        self,
        run: RunState,
        completion: Completion,
        scope: TurnScope | None = None,
        *,
        client: frozenset[str] = frozenset(),
    ) -> int:
        """Execute the calls, then store the assistant message and its results together under the
        key's append lock: a message posted meanwhile never lands between a call and its result,
        and a /stop during the tools leaves no call without its result. Calls of ``client`` tools
        are stored without a result (the client sends it later). Answers the assistant line's seq."""
        calls = tuple(_call_dict(c) for c in completion.tool_calls)
        own = [c for c in completion.tool_calls if c.name not in client]
        results = [await self.tools.execute(run, call) for call in own]
        group = [
            NewMessage(
                role="assistant", content=completion.content, tool_calls=calls, usage=completion.usage.as_dict()
            ),
            *(
                NewMessage(role="tool", content=result, tool_name=call.name, tool_call_id=call.id)
                for call, result in zip(own, results, strict=True)
            ),
        ]

        async def append_group() -> int:
            async with self.store.lock_for(run.key):
                seqs = []
                for message in group:
                    record = await self.store.append(run, message)
                    seqs.append(record["seq"])
                    if scope is not None:
                        scope.own.add(record["seq"])
            return int(seqs[0])

        stored = asyncio.ensure_future(append_group())
        try:
            return await asyncio.shield(stored)
        except asyncio.CancelledError:
            await stored  # once started, the group is stored whole before the turn ends
            raise

    # -- compaction, memory flush, final summary -------------------------------------------------

    def _due(self, run: RunState) -> bool:
        return compaction_due(run.context_tokens, self.context_overhead(run.agent_id), self.threshold(run.agent_id))

    async def compact_if_due(self, run: RunState, outcome: Outcome) -> CompactionResult | None:
        """Automatic compaction when the context reaches the threshold (caller holds the turn lock)."""
        if not self.settings.compaction.enabled or run.hold_compaction or not self._due(run):
            return None
        return await self.compact(run, outcome, trigger="auto")

    async def compact(
        self,
        run: RunState,
        outcome: Outcome | None,
        *,
        trigger: Trigger,
        instructions: str | None = None,
        on_summary: Callable[[SummaryResult], None] | None = None,
    ) -> CompactionResult | None:
        compactor = self.compactors[run.agent_id or "main"]
        if trigger in ("auto", "manual") and await compactor.would_compact(run):  # flush only before a real cut
            await self.memory_flush(run)
        result = await compactor.compact(
            run,
            trigger=trigger,
            threshold=self.threshold(run.agent_id),
            instructions=instructions,
            on_summary=on_summary,
        )
        if result is not None:
            self.metrics.compactions.labels(trigger).inc()
            if outcome is not None:
                outcome.events.append(result.event())
        return result

    async def _compact_for_overflow(self, run: RunState, outcome: Outcome) -> bool:
        """The provider said the prompt is too long: compact, harder if the usual cut frees
        nothing; False when nothing can be freed (the caller gives up instead of looping)."""
        compactor = self.compactors[run.agent_id or "main"]
        threshold = self.threshold(run.agent_id)
        result = await compactor.compact(run, trigger="overflow", threshold=threshold)
        if result is None:
            result = await compactor.compact(
                run, trigger="overflow", threshold=threshold, keep_recent=2, min_to_compress=1
            )
        if result is None:
            return False
        self.metrics.compactions.labels("overflow").inc()
        outcome.events.append(result.event())
        return True

    async def memory_flush(self, run: RunState) -> None:
        """One silent turn that may save durable facts with memory_append before the context is
        compacted or the run reset; at most once per compaction count, never blocking."""
        provider = self.provider(run.agent_id)
        flush = self.settings.compaction.memory_flush
        names = {"memory_append", "memory_search"}
        if provider is None or not flush.enabled or not self.tools.has("memory_append"):
            return
        if run.flushed_at_count == run.compaction_count:
            return
        run.flushed_at_count = run.compaction_count
        agent = self.agent(run.agent_id)

        async def flush_turn() -> None:
            context = await self.store.read_context(run)
            messages = [
                {"role": "system", "content": agent.system_prompt},
                *map(to_openai, context),
                {"role": "user", "content": FLUSH_PROMPT},
            ]
            completion = await provider.complete(
                messages, tools=self.tools.schemas(names), model=self.model_name(run.key, run.agent_id)
            )
            await self._account(run, completion, 0)
            for call in completion.tool_calls:
                if call.name in names:
                    await self.tools.execute(run, call, extra={"memory_flush": True})

        try:
            await asyncio.wait_for(flush_turn(), timeout=flush.timeout_s)
            self.store.emit("memory", run, action="flush", compaction=run.compaction_count)
        except (ProviderError, TimeoutError) as exc:
            log.warning("memory flush for run %s failed (%s); continuing", run.run_id, exc)

    async def _final_summary(self, run: RunState, reason: str) -> str | None:
        result = await self.compactors[run.agent_id or "main"].final_summary(run, self.threshold(run.agent_id))
        return f"{result.text}\n\n(summarizer: {result.summarizer})\n"

    # -- idempotency ----------------------------------------------------------------------------

    async def _idempotency_lookup(self, key: str, cmid: str) -> dict[str, Any] | None:
        since = iso(self.clock() - IDEMPOTENCY_WINDOW)

        def _find(conn: Any) -> dict[str, Any] | None:
            row = conn.execute(
                "SELECT run_id, message_seq, response FROM idempotency"
                " WHERE session_key = ? AND client_message_id = ? AND created_at >= ?",
                (key, cmid, since),
            ).fetchone()
            return dict(row) if row else None

        return await self.store.ledger.execute(_find)

    async def remember_delivery(self, key: str, cmid: str, *, run_id: str, seq: int) -> None:
        """Record that ``seq`` was stored as delivery ``cmid`` without an answer, as if it had been
        posted with that id: a repeat within the window then runs the turn again, storing nothing."""
        await self.remember(key, cmid, None, run_id=run_id, seq=seq)

    async def remember(
        self, key: str, cmid: str, outcome: Outcome | None, *, run_id: str | None = None, seq: int | None = None
    ) -> None:
        now = iso(self.clock())
        response = json.dumps(outcome.body(), ensure_ascii=False) if outcome is not None else None
        run_id = outcome.run_id if outcome is not None else run_id
        seq = outcome.message_seq if outcome is not None else seq

        # Without an outcome this is a new delivery (none within the window): it replaces an
        # expired row whole, so its window starts now and the old answer is not replayed.
        update = (
            " response = COALESCE(excluded.response, idempotency.response)"
            if outcome is not None
            else " created_at = excluded.created_at, response = NULL"
        )

        def _save(conn: Any) -> None:
            conn.execute(
                "INSERT INTO idempotency (session_key, client_message_id, created_at, run_id, message_seq, response)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_key, client_message_id) DO UPDATE SET"
                " run_id = excluded.run_id, message_seq = excluded.message_seq," + update,
                (key, cmid, now, run_id, seq, response),
            )

        try:
            await self.store.ledger.execute(_save)
        except sqlite3.Error as exc:
            # The message is durable and carries its client_message_id: a redelivery is still
            # recognised from the transcript, so the caller gets its answer, not an error.
            log.warning("idempotency record of %r on %r not saved (%s)", cmid, key, exc)

    def context_overhead(self, agent_id: str | None) -> int:
        """Tokens of the system prompt and of the tool schemas the model is sent (none in
        store-only mode), counted toward the threshold."""
        agent = self.agent(agent_id)
        tools = estimate_text(json.dumps(self.tools.schemas())) if self.provider(agent_id) else 0
        return estimate_text(agent.system_prompt) + tools

    async def command_line(
        self,
        run: RunState,
        role: Role,
        text: str,
        *,
        client_message_id: str | None = None,
        reply_to: int | None = None,
    ) -> dict[str, Any]:
        """Store a chat command or its answer (``command: true``: never sent to the model)."""
        message = NewMessage(
            role=role,
            content=text,
            command=True,
            user_activity=False,
            client_message_id=client_message_id,
            reply_to=reply_to,
        )
        return await self.store.append(run, message)

    def ensure_active(self, key: str) -> RunState:
        run = self.store.active_run(key)
        if run is None:
            raise NoActiveRun(f"session {key!r} has no active run")
        return run


def provider_failure(exc: ProviderError, message_seq: int | None) -> ProviderFailure:
    return ProviderFailure(
        f"the model call failed: {exc.message}; the message is stored (seq {message_seq}) and the session stays usable",
        message_seq=message_seq,
        stored=True,
        kind=exc.kind,
    )


def stored_failure(exc: Exception, key: str, message_seq: int | None) -> NeotaskError:
    """The error a caller gets when the turn after its stored message fails: one that says the
    message is stored (never one inviting a resend); an error saying so already is kept."""
    if isinstance(exc, NeotaskError) and exc.extra.get("stored"):
        return exc
    if isinstance(exc, NeotaskError):
        what = f"{exc.code}: {exc.message}"
    else:
        log.error("the turn on %r failed after message seq %s was stored", key, message_seq, exc_info=exc)
        what = f"{type(exc).__name__} (see the gateway log)"
    return TurnFailed(
        f"the turn failed after the message was stored (seq {message_seq}): {what}; do not send it again:"
        " the session stays usable",
        message_seq=message_seq,
        stored=True,
    )


def _call_dict(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def outcome_from(body: dict[str, Any]) -> Outcome:
    return Outcome(
        session_key=body["session_key"],
        run_id=body.get("run_id"),
        message_seq=body.get("message_seq"),
        reply=body.get("reply"),
        events=list(body.get("events") or []),
        usage=dict(body.get("usage") or {}),
    )
