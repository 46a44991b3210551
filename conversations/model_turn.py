"""The model turn and its tools loop."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from config.clock import iso
from config.errors import NeotaskError, ProviderFailure, TurnFailed
from conversations.compaction_triggers import CompactionTriggers
from conversations.completions import Completion, ProviderError, ToolCall, Usage
from conversations.fallbacks import collect_attempts, record_attempts
from conversations.posts import DeltaFn, Outcome, TurnOptions, to_openai
from conversations.queueing import TurnScope
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


class ModelTurns(CompactionTriggers):
    """One model turn: the prompt (system, context as the caller's scope shows it), the tools
    loop up to ``max_tool_rounds``, compaction when due or when the provider overflows, usage."""

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
                    scope.seen_upto = max((seq for line in context if (seq := line.get("seq"))), default=0)
                after = anchor(context)  # what this call writes follows what it saw, not what waits
                messages = [{"role": "system", "content": system}, *map(to_openai, context)]
                out_of_rounds = rounds >= agent.max_tool_rounds
                offered = None if out_of_rounds else tools
                if out_of_rounds:  # one last call without tools, asking for the answer
                    messages.append({"role": "system", "content": TOOL_LIMIT_PROMPT.format(rounds=rounds)})
                try:
                    with collect_attempts() as attempts:
                        try:
                            completion = await provider.complete(
                                messages,
                                tools=offered,
                                model=model,
                                on_delta=on_delta,
                                tool_choice=options.tool_choice if offered else None,
                            )
                        finally:  # each attempt, when one failed; a stopped turn records nothing
                            task = asyncio.current_task()
                            if task is None or not task.cancelling():
                                await record_attempts(self.store, run, attempts)
                except ProviderError as exc:
                    if exc.kind != "overflow" or overflow_cycles >= MAX_OVERFLOW_CYCLES:
                        raise
                    overflow_cycles += 1
                    if not await self._compact_for_overflow(run, outcome):
                        raise
                    continue
                total = total + completion.usage
                accounting = self._account(run, completion, overhead, sent_tokens - hidden)
                if completion.tool_calls and offered:
                    await accounting
                    rounds += 1
                    client = [c for c in completion.tool_calls if c.name in options.client_tool_names]
                    seq = await self._run_tools(run, completion, scope, client=options.client_tool_names, after=after)
                    if client:  # the client runs these and sends the results with its next call
                        outcome.reply = {
                            "content": completion.content,
                            "seq": seq,
                            "tool_calls": [_call_dict(c) for c in client],
                        }
                        published = reply_published(
                            run, iso(self.store.clock()), seq=seq, content=completion.content, model=completion.model
                        )
                        self.store.emit(published)
                        break
                    continue
                content = completion.content
                if out_of_rounds:
                    outcome.events.append({"type": "tool_limit", "max_tool_rounds": agent.max_tool_rounds})
                    log.info("run %s: the turn used all %d tool rounds", run.run_id, rounds)
                    if not content.strip():
                        content = TOOL_LIMIT_REPLY.format(rounds=rounds)
                reply = NewMessage(
                    role="assistant",
                    content=content,
                    usage=completion.usage.as_dict(),
                    reply_to=outcome.message_seq,
                    after=after,
                )
                # The usage's tasks.db write runs while the reply line is written and synced: one
                # wait instead of two (the reply waits for both, as before).
                record, _ = await asyncio.gather(self.store.append(run, reply), accounting)
                self.metrics.messages.labels("assistant").inc()
                outcome.reply = {"content": content, "seq": record["seq"]}
                at = iso(self.store.clock())
                self.store.emit(reply_published(run, at, seq=record["seq"], content=content, model=completion.model))
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
        results = [await self.tools.execute(run, call) for call in own]
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
