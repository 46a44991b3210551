"""The model turn and its tools loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from config.clock import iso
from config.errors import NeotaskError, ProviderFailure, TurnFailed
from config.settings import AgentSettings
from conversations.compaction_triggers import CompactionTriggers
from conversations.completions import Completion, ProviderError, ToolCall, Usage
from conversations.fallbacks import ModelChain, collect_attempts, record_attempts
from conversations.posts import DeltaFn, Outcome, TurnOptions, to_openai
from conversations.queueing import TurnScope
from conversations.turn_core import ConversationCore
from sessions.context_order import anchor
from sessions.events import reply_published
from sessions.records import NewMessage, RunState

log = logging.getLogger(__name__)

TOOL_LIMIT_PROMPT = (
    "You have used all {rounds} tool rounds of this turn; no more tools can be called. Answer the user now"
    " with what you have, and say what is left undone."
)
TOOL_LIMIT_REPLY = "(I reached the limit of {rounds} tool rounds before finishing. Send a message to let me continue.)"
MAX_OVERFLOW_CYCLES = 2


@dataclass
class _Turn:
    """One model turn: what it was given and what it decided at its start, and how far it is."""

    run: RunState
    outcome: Outcome
    on_delta: DeltaFn | None
    scope: TurnScope | None
    options: TurnOptions
    agent: AgentSettings
    provider: ModelChain
    model: str
    tools: list[dict[str, Any]]  # what the model is offered while it has tool rounds left
    system: str
    overhead: int
    total: Usage = field(default_factory=Usage)
    rounds: int = 0
    overflow_cycles: int = 0


class ModelTurns:
    """One model turn: the prompt (system, context as the caller's scope shows it), the tools
    loop up to ``max_tool_rounds``, compaction when due or when the provider overflows (through
    ``compaction``), usage."""

    def __init__(self, core: ConversationCore, compaction: CompactionTriggers) -> None:
        self.core = core
        self.compaction = compaction

    async def run_turn(
        self,
        run: RunState,
        outcome: Outcome,
        on_delta: DeltaFn | None,
        *,
        scope: TurnScope | None = None,
        options: TurnOptions | None = None,
    ) -> None:
        """Model calls until one answers without calling tools (or the client's tools); the reply
        is stored and ``outcome`` carries it, its events and the turn's usage."""
        turn = self._begin(run, outcome, on_delta, scope, options or TurnOptions())
        metrics = self.core.metrics
        started = time.perf_counter()
        run.hold_compaction = False  # a model call releases the hold set by /uncompact
        try:
            while not await self._round(turn):
                pass
        except asyncio.CancelledError:
            metrics.turns.labels("stopped").inc()
            raise
        except ProviderError as exc:
            metrics.turns.labels("provider_error").inc()
            raise provider_failure(exc, outcome.message_seq) from exc
        finally:
            outcome.usage = turn.total.as_dict()
            metrics.turn_seconds.observe(time.perf_counter() - started)
        metrics.turns.labels("ok").inc()

    def _begin(
        self, run: RunState, outcome: Outcome, on_delta: DeltaFn | None, scope: TurnScope | None, options: TurnOptions
    ) -> _Turn:
        core = self.core
        agent = core.agent(run.agent_id)
        provider = core.provider(run.agent_id)
        assert provider is not None
        return _Turn(
            run=run,
            outcome=outcome,
            on_delta=on_delta,
            scope=scope,
            options=options,
            agent=agent,
            provider=provider,
            model=core.model_name(run.key, run.agent_id),
            tools=[*core.tools.schemas(), *options.client_tools],
            system=agent.system_prompt + (f"\n\n{options.instructions}" if options.instructions else ""),
            overhead=core.context_overhead(run.agent_id),
        )

    async def _round(self, turn: _Turn) -> bool:
        """One model call of the turn (compacting first when due); True once the turn is answered."""
        run, outcome = turn.run, turn.outcome
        await self.compaction.compact_if_due(run, outcome)
        sent_tokens = run.context_tokens  # what is read now is what the model is sent
        messages, hidden, after = await self._prompt(turn)
        out_of_rounds = turn.rounds >= turn.agent.max_tool_rounds
        offered = None if out_of_rounds else turn.tools
        if out_of_rounds:  # one last call without tools, asking for the answer
            messages.append({"role": "system", "content": TOOL_LIMIT_PROMPT.format(rounds=turn.rounds)})
        try:
            completion = await self._complete(turn, messages, offered)
        except ProviderError as exc:
            if exc.kind != "overflow" or turn.overflow_cycles >= MAX_OVERFLOW_CYCLES:
                raise
            turn.overflow_cycles += 1
            if not await self.compaction.compact_for_overflow(run, outcome):
                raise
            return False
        turn.total = turn.total + completion.usage
        accounting = self.core.account(run, completion, turn.overhead, sent_tokens - hidden)
        if completion.tool_calls and offered:
            await accounting
            turn.rounds += 1
            return await self._tool_round(turn, completion, after)
        await self._reply(turn, completion, accounting, after, out_of_rounds)
        return True

    async def _prompt(self, turn: _Turn) -> tuple[list[dict[str, Any]], int, int | None]:
        """The messages the model is sent (the context as the caller's scope shows it), the tokens
        of the lines hidden from it, and the place in the context of what this call writes."""
        context = await self.core.store.read_context(turn.run)
        hidden = 0
        scope = turn.scope
        if scope is not None:  # lines of later callers wait for their own turn
            shown = [line for line in context if scope.visible(line)]
            hidden = sum(int(line.get("tokens") or 0) for line in context if not scope.visible(line))
            context = shown
            scope.seen_upto = max((seq for line in context if (seq := line.get("seq"))), default=0)
        after = anchor(context)  # what this call writes follows what it saw, not what waits
        return [{"role": "system", "content": turn.system}, *map(to_openai, context)], hidden, after

    async def _complete(
        self, turn: _Turn, messages: list[dict[str, Any]], offered: list[dict[str, Any]] | None
    ) -> Completion:
        """The provider's answer; each attempt recorded in tools.jsonl when one failed."""
        with collect_attempts() as attempts:
            try:
                return await turn.provider.complete(
                    messages,
                    tools=offered,
                    model=turn.model,
                    on_delta=turn.on_delta,
                    tool_choice=turn.options.tool_choice if offered else None,
                )
            finally:  # a stopped turn records nothing
                task = asyncio.current_task()
                if task is None or not task.cancelling():
                    await record_attempts(self.core.store, turn.run, attempts)

    async def _tool_round(self, turn: _Turn, completion: Completion, after: int | None) -> bool:
        """The tools the model called, stored with their results; True when some are the client's
        (the client runs those and sends the results with its next call: the turn is answered)."""
        run, names = turn.run, turn.options.client_tool_names
        client = [c for c in completion.tool_calls if c.name in names]
        seq = await self._run_tools(run, completion, turn.scope, client=names, after=after)
        if not client:
            return False
        turn.outcome.reply = {"content": completion.content, "seq": seq, "tool_calls": [_call_dict(c) for c in client]}
        store = self.core.store
        at = iso(store.clock())
        store.emit(reply_published(run, at, seq=seq, content=completion.content, model=completion.model))
        return True

    async def _reply(
        self,
        turn: _Turn,
        completion: Completion,
        accounting: Coroutine[Any, Any, None],
        after: int | None,
        out_of_rounds: bool,
    ) -> None:
        """The model's answer stored as the turn's reply."""
        run, outcome, content = turn.run, turn.outcome, completion.content
        if out_of_rounds:
            outcome.events.append({"type": "tool_limit", "max_tool_rounds": turn.agent.max_tool_rounds})
            log.info("run %s: the turn used all %d tool rounds", run.run_id, turn.rounds)
            if not content.strip():
                content = TOOL_LIMIT_REPLY.format(rounds=turn.rounds)
        reply = NewMessage(
            role="assistant",
            content=content,
            usage=completion.usage.as_dict(),
            reply_to=outcome.message_seq,
            after=after,
        )
        store = self.core.store
        # The usage's tasks.db write runs while the reply line is written and synced: one
        # wait instead of two (the reply waits for both, as before).
        record, _ = await asyncio.gather(store.append(run, reply), accounting)
        self.core.metrics.messages.labels("assistant").inc()
        outcome.reply = {"content": content, "seq": record["seq"]}
        at = iso(store.clock())
        store.emit(reply_published(run, at, seq=record["seq"], content=content, model=completion.model))

    async def _run_tools(
        self,
        run: RunState,
        completion: Completion,
        scope: TurnScope | None = None,
        *,
        client: frozenset[str] = frozenset(),
        after: int | None = None,
    ) -> int:
        """Execute the calls, then store the assistant message and its results together under the
        key's append lock: a message posted meanwhile never lands between a call and its result,
        and a /stop during the tools leaves no call without its result. Calls of ``client`` tools
        are stored without a result (the client sends it later). ``after``: their place in the
        context (``sessions.context_order``). Answers the assistant line's seq."""
        calls = tuple(_call_dict(c) for c in completion.tool_calls)
        own = [c for c in completion.tool_calls if c.name not in client]
        results = [await self.core.tools.execute(run, call) for call in own]
        group = [
            NewMessage(
                role="assistant",
                content=completion.content,
                tool_calls=calls,
                usage=completion.usage.as_dict(),
                after=after,
            ),
            *(
                NewMessage(role="tool", content=result, tool_name=call.name, tool_call_id=call.id, after=after)
                for call, result in zip(own, results, strict=True)
            ),
        ]

        async def append_group() -> int:
            async with self.core.store.lock_for(run.key):
                seqs = []
                for message in group:
                    record = await self.core.store.append(run, message)
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
