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
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from config.clock import Clock, iso
from config.errors import Busy, Conflict, ProviderFailure
from config.settings import AgentSettings, Settings
from gateway.events import EventHub
from gateway.metrics import Metrics
from gateway.provider import ChatProvider, Completion, ProviderError, Usage
from gateway.summarizer import ModelSummarizer
from gateway.tools import ToolBox
from sessions.compaction import compaction_due
from sessions.compactor import CompactionResult, Compactor, Trigger
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
MAX_OVERFLOW_CYCLES = 2
FLUSH_PROMPT = (
    "The conversation context is about to be compacted: older messages will be replaced by a summary."
    " Save any durable facts worth remembering later (preferences, decisions, names, ids, open tasks)"
    " with memory_append, one fact per call; check memory_search first to avoid duplicates. If there is"
    " nothing worth saving, answer with an empty message."
)


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
        self._pending: dict[str, int] = {}
        self._running: dict[str, asyncio.Task[Any]] = {}
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

    def needs_turn(self, post: Post) -> bool:
        return post.role == "user" and post.reply and self.provider(post.key.agent_id) is not None

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
        cmid = post.client_message_id
        if cmid is None:
            return await self._post(post, on_delta, on_stored)
        marker = (post.key.raw, cmid)
        if marker in self._inflight:  # the same delivery is being handled right now
            return _outcome_from(await asyncio.shield(self._inflight[marker]))
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._inflight[marker] = future
        try:
            outcome = await self._post_once(post, on_delta, on_stored)
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
        previous = await self._idempotency_lookup(post.key.raw, post.client_message_id)
        if previous is None:
            outcome = await self._post(post, on_delta, on_stored)
        elif previous["response"] is not None:
            return _outcome_from(json.loads(previous["response"]))
        else:  # stored before, but its turn failed: run the turn again, store nothing new
            run = self.store.run_state(previous["run_id"]) if previous["run_id"] else None
            if run is None or run.status != "running" or not self.needs_turn(post):
                outcome = Outcome(post.key.raw, previous["run_id"], previous["message_seq"])
            else:
                outcome = Outcome(post.key.raw, run.run_id, previous["message_seq"])
                await self._queued_turn(post, run, outcome, on_delta)
        await self._idempotency_save(post.key.raw, post.client_message_id, outcome)
        return outcome

    async def _post(
        self, post: Post, on_delta: DeltaFn | None, on_stored: Callable[[Outcome], None] | None = None
    ) -> Outcome:
        key = post.key.raw
        turn = self.needs_turn(post)
        if turn and self._pending.get(key, 0) >= self.agent(post.key.agent_id).max_queued_turns:
            raise Busy(
                f"session {key!r} already has {self._pending[key]} turns queued (max_queued_turns); retry later",
                retry_after_s=1,
            )
        outcome = Outcome(key, None, None)
        for check in self.before_post:  # e.g. a reset that fell due while nobody wrote
            outcome.events.extend(await check(post))
        async with self.store.lock_for(key):
            run = self.store.active_run(key)
            new_run = run is None
            if run is not None:
                self.store.check_writable(run, NewMessage(role=post.role, content=""))
            else:
                run = await self._start_run(post, outcome)
            for hook in self.before_append:  # e.g. auto-recall before the first user message
                outcome.events.extend(await hook(run, post, new_run))
            started = time.perf_counter()
            record, durable = self.store.queue_append(run, self._new_message(post))
        # Durable outside the lock: the seq and the file order are fixed already, and the key's
        # next messages join this group commit instead of each waiting for the previous sync.
        await durable
        self.metrics.message_stored(post.role, time.perf_counter() - started)
        self.store.emit_message(run, record)
        outcome.run_id, outcome.message_seq = run.run_id, record["seq"]
        if post.client_message_id is not None:
            await self._idempotency_save(key, post.client_message_id, None, run_id=run.run_id, seq=record["seq"])
        if on_stored is not None:
            on_stored(outcome)
        if turn:
            await self._queued_turn(post, run, outcome, on_delta)
        elif self.settings.compaction.enabled and not run.hold_compaction and self._due(run):
            async with self.turn_lock(key):
                if self.store.run_state(run.run_id) is not None:
                    await self.compact_if_due(run, outcome)
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
        )
        entry = self.store.entry(key.raw)
        if entry is not None and not entry.inherit_next:
            entry.inherit_next = True
            self.store.registry.touch(key.raw)
        if found is not None:
            await self.store.append(
                run, NewMessage(role="system", content=found.message, kind="inheritance", user_activity=False)
            )
            outcome.events.append(found.event())
            self.store.emit("inheritance", run, **{k: v for k, v in found.event().items() if k != "type"})
        for starter in self.run_starters:
            outcome.events.extend(await starter(run, post))
        return run

    def _new_message(self, post: Post) -> NewMessage:
        return NewMessage(
            role=post.role,
            content=post.content,
            name=speaker_name(post.name) if post.role == "user" else post.name,
            sender_id=post.sender_id,
            tool_name=post.tool_name,
            tool_call_id=post.tool_call_id,
            client_message_id=post.client_message_id,
            user_activity=post.user_activity,
        )

    async def _queued_turn(self, post: Post, run: RunState, outcome: Outcome, on_delta: DeltaFn | None) -> None:
        """Wait for the key's turn lock (FIFO), then run the turn. ``_pending`` counts the calls
        queued or running, for the ``max_queued_turns`` limit."""
        key = post.key.raw
        self._pending[key] = self._pending.get(key, 0) + 1
        try:
            async with self.turn_lock(key):
                if self.store.run_state(run.run_id) is None:  # reset while this call waited
                    outcome.events.append({"type": "turn_skipped", "reason": "the run ended before its turn"})
                    return
                if run.status != "running":  # paused while this call waited: no model turn until /resume
                    outcome.events.append({"type": "turn_skipped", "reason": "the session was paused before its turn"})
                    return
                turn = asyncio.create_task(self._turn(run, outcome, on_delta))
                self._running[key] = turn
                try:
                    await turn
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if not turn.cancelled() or (current is not None and current.cancelling()):
                        raise
                    outcome.events.append({"type": "stopped", "reason": "/stop cancelled the turn"})
                finally:
                    self._running.pop(key, None)
        finally:
            self._pending[key] -= 1
            if self._pending[key] == 0:
                del self._pending[key]

    def stop_turn(self, key: str) -> bool:
        """Cancel the key's running turn (``/stop``); False when none runs."""
        task = self._running.get(key)
        if task is None or task.done():
            return False
        task.cancel()
        return True

    # -- the model turn -------------------------------------------------------------------------

    async def _turn(self, run: RunState, outcome: Outcome, on_delta: DeltaFn | None) -> None:
        agent = self.agent(run.agent_id)
        provider = self.provider(run.agent_id)
        assert provider is not None
        model = self.model_name(run.key, run.agent_id)
        tools = self.tools.schemas()
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
                messages = [{"role": "system", "content": agent.system_prompt}, *map(to_openai, context)]
                offered = tools if rounds < agent.max_tool_rounds else None
                try:
                    completion = await provider.complete(messages, tools=offered, model=model, on_delta=on_delta)
                except ProviderError as exc:
                    if exc.kind != "overflow" or overflow_cycles >= MAX_OVERFLOW_CYCLES:
                        raise
                    overflow_cycles += 1
                    if not await self._compact_for_overflow(run, outcome):
                        raise
                    continue
                total = total + completion.usage
                await self._account(run, completion, overhead, sent_tokens)
                if completion.tool_calls and offered:
                    rounds += 1
                    await self._run_tools(run, completion)
                    continue
                record = await self.store.append(
                    run,
                    NewMessage(role="assistant", content=completion.content, usage=completion.usage.as_dict()),
                )
                self.metrics.messages.labels("assistant").inc()
                outcome.reply = {"content": completion.content, "seq": record["seq"]}
                self.store.emit("reply", run, seq=record["seq"], content=completion.content, model=completion.model)
                break
        except asyncio.CancelledError:
            self.metrics.turns.labels("stopped").inc()
            raise
        except ProviderError as exc:
            self.metrics.turns.labels("provider_error").inc()
            raise ProviderFailure(
                f"the model call failed: {exc.message}; the message is stored (seq {outcome.message_seq})"
                " and the session stays usable",
                message_seq=outcome.message_seq,
                stored=True,
                kind=exc.kind,
            ) from exc
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

    async def _run_tools(self, run: RunState, completion: Completion) -> None:
        """Execute the calls, then store the assistant message and its results together under the
        key's append lock: a message posted meanwhile never lands between a call and its result,
        and a /stop during the tools leaves no call without its result."""
        calls = tuple(
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in completion.tool_calls
        )
        results = [await self.tools.execute(run, call) for call in completion.tool_calls]
        group = [
            NewMessage(
                role="assistant", content=completion.content, tool_calls=calls, usage=completion.usage.as_dict()
            ),
            *(
                NewMessage(role="tool", content=result, tool_name=call.name, tool_call_id=call.id)
                for call, result in zip(completion.tool_calls, results, strict=True)
            ),
        ]

        async def append_group() -> None:
            async with self.store.lock_for(run.key):
                for message in group:
                    await self.store.append(run, message)

        stored = asyncio.ensure_future(append_group())
        try:
            await asyncio.shield(stored)
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
        self, run: RunState, outcome: Outcome | None, *, trigger: Trigger, instructions: str | None = None
    ) -> CompactionResult | None:
        if trigger in ("auto", "manual"):
            await self.memory_flush(run)
        result = await self.compactors[run.agent_id or "main"].compact(
            run, trigger=trigger, threshold=self.threshold(run.agent_id), instructions=instructions
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

    async def _idempotency_save(
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

        await self.store.ledger.execute(_save)

    def context_overhead(self, agent_id: str | None) -> int:
        """Tokens of the system prompt and of the tool schemas the model is sent (none in
        store-only mode), counted toward the threshold."""
        agent = self.agent(agent_id)
        tools = estimate_text(json.dumps(self.tools.schemas())) if self.provider(agent_id) else 0
        return estimate_text(agent.system_prompt) + tools

    async def command_line(self, run: RunState, role: Role, text: str) -> dict[str, Any]:
        """Store a chat command or its answer (``command: true``: never sent to the model)."""
        return await self.store.append(run, NewMessage(role=role, content=text, command=True, user_activity=False))

    def ensure_active(self, key: str) -> RunState:
        run = self.store.active_run(key)
        if run is None:
            raise Conflict(f"session {key!r} has no active run", code="no_active_run")
        return run


def _outcome_from(body: dict[str, Any]) -> Outcome:
    return Outcome(
        session_key=body["session_key"],
        run_id=body.get("run_id"),
        message_seq=body.get("message_seq"),
        reply=body.get("reply"),
        events=list(body.get("events") or []),
        usage=dict(body.get("usage") or {}),
    )
