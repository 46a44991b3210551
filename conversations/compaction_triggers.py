"""Compaction triggers and the memory flush (SPEC sections 5 and 9)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from config.clock import iso
from conversations.completions import ProviderError
from conversations.posts import Outcome, to_openai
from conversations.turn_core import ConversationCore
from sessions.compaction import compaction_due
from sessions.compactor import CompactionResult, SummaryResult, Trigger
from sessions.events import flush_published
from sessions.records import RunState

log = logging.getLogger(__name__)

FLUSH_PROMPT = (
    "The conversation context is about to be compacted: older messages will be replaced by a summary."
    " Save any durable facts worth remembering later (preferences, decisions, names, ids, open tasks)"
    " with memory_append, one fact per call; check memory_search first to avoid duplicates. If there is"
    " nothing worth saving, answer with an empty message."
)


class CompactionTriggers:
    """When to compact (the threshold, /compact, a provider's overflow), the memory flush before
    a real cut or a reset, and the final summary of a completing run."""

    def __init__(self, core: ConversationCore) -> None:
        self.core = core

    def due(self, run: RunState) -> bool:
        core = self.core
        return compaction_due(run.context_tokens, core.context_overhead(run.agent_id), core.threshold(run.agent_id))

    async def compact_if_due(self, run: RunState, outcome: Outcome) -> CompactionResult | None:
        """Automatic compaction when the context reaches the threshold (caller holds the turn lock)."""
        if not self.core.settings.compaction.enabled or run.hold_compaction or not self.due(run):
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
        compactor = self.core.compactors[run.agent_id or "main"]
        if trigger in ("auto", "manual") and await compactor.would_compact(run):  # flush only before a real cut
            await self.memory_flush(run)
        result = await compactor.compact(
            run,
            trigger=trigger,
            threshold=self.core.threshold(run.agent_id),
            instructions=instructions,
            on_summary=on_summary,
        )
        if result is not None:
            self.core.metrics.compactions.labels(trigger).inc()
            if outcome is not None:
                outcome.events.append(result.event())
        return result

    async def compact_for_overflow(self, run: RunState, outcome: Outcome) -> bool:
        """The provider said the prompt is too long: compact, harder if the usual cut frees
        nothing; False when nothing can be freed (the caller gives up instead of looping)."""
        compactor = self.core.compactors[run.agent_id or "main"]
        threshold = self.core.threshold(run.agent_id)
        result = await compactor.compact(run, trigger="overflow", threshold=threshold)
        if result is None:
            result = await compactor.compact(
                run, trigger="overflow", threshold=threshold, keep_recent=2, min_to_compress=1
            )
        if result is None:
            return False
        self.core.metrics.compactions.labels("overflow").inc()
        outcome.events.append(result.event())
        return True

    async def memory_flush(self, run: RunState) -> None:
        """One silent turn that may save durable facts with memory_append before the context is
        compacted or the run reset; at most once per compaction count, never blocking. None for a
        one-off run: nothing inherits it, and its caller is nobody the memory should serve."""
        if run.key in self.core.one_off:
            return
        provider = self.core.provider(run.agent_id)
        flush = self.core.settings.compaction.memory_flush
        names = {"memory_append", "memory_search"}
        if provider is None or not flush.enabled or not self.core.tools.has("memory_append"):
            return
        if run.flushed_at_count == run.compaction_count:
            return
        run.flushed_at_count = run.compaction_count
        agent = self.core.agent(run.agent_id)

        async def flush_turn() -> None:
            context = await self.core.store.read_context(run)
            messages = [
                {"role": "system", "content": agent.system_prompt},
                *map(to_openai, context),
                {"role": "user", "content": FLUSH_PROMPT},
            ]
            completion = await provider.complete(
                messages, tools=self.core.tools.schemas(names), model=self.core.model_name(run.key, run.agent_id)
            )
            await self.core.account(run, completion, 0)
            for call in completion.tool_calls:
                if call.name in names:
                    await self.core.tools.execute(run, call, extra={"memory_flush": True})

        try:
            await asyncio.wait_for(flush_turn(), timeout=flush.timeout_s)
            self.core.store.emit(flush_published(run, iso(self.core.store.clock())))
        except (ProviderError, TimeoutError) as exc:
            log.warning("memory flush for run %s failed (%s); continuing", run.run_id, exc)

    async def final_summary(self, run: RunState, reason: str) -> str | None:
        """The text of final_summary.txt, which ``conversations/run_end.py`` hands to the store."""
        compactor = self.core.compactors[run.agent_id or "main"]
        result = await compactor.final_summary(run, self.core.threshold(run.agent_id))
        return f"{result.text}\n\n(summarizer: {result.summarizer})\n"
