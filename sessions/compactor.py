"""Carrying out compactions (SPEC section 5): summarize, then hand the store the rewrite as data
(``sessions.rewrites``); the store keeps the old context, appends the summary record and replaces
the context in an order its recovery can roll forward (``sessions.files.context_rewrite`` for the
run folders)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from config.clock import iso
from config.settings import CompactionSettings
from sessions.compaction import archive_name, is_summary, plan_compaction, summary_line
from sessions.context_lines import ContextLine
from sessions.events import CompactionEvent, compaction_published, uncompact_published
from sessions.protocol import RunStore
from sessions.records import RunState, ToolUse
from sessions.rewrites import Compaction, Uncompaction
from sessions.summarize import extractive_summary

log = logging.getLogger(__name__)

Trigger = Literal["auto", "manual", "overflow", "reset"]


@dataclass(frozen=True)
class SummaryRequest:
    lines: tuple[ContextLine, ...]
    previous: str | None
    instructions: str | None
    purpose: Literal["compaction", "final"]
    max_tokens: int


@dataclass(frozen=True)
class SummaryResult:
    text: str
    summarizer: str  # "llm:<model>" or "extractive"
    model: str | None = None  # the model asked, also when it failed and the extractive text is used
    error: str | None = None  # why the model's summary was not used
    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0  # model requests made (a long transcript is summarized in pieces)


Summarizer = Callable[[SummaryRequest], Awaitable[SummaryResult]]


async def extractive(request: SummaryRequest) -> SummaryResult:
    """The summary without a model, computed on a worker thread: a store-only compaction or final
    summary reads thousands of messages, and the event loop keeps serving every other key meanwhile."""
    text = await asyncio.to_thread(
        extractive_summary,
        request.lines,
        previous=request.previous,
        instructions=request.instructions,
        max_tokens=request.max_tokens,
    )
    return SummaryResult(text, "extractive")


@dataclass(frozen=True)
class CompactionResult:
    summary_id: int
    compaction: int
    start_seq: int
    end_seq: int
    compressed: int
    tokens_before: int
    tokens_after: int
    summarizer: str
    trigger: Trigger

    def event(self) -> CompactionEvent:
        return {
            "type": "compaction",
            "compaction": self.compaction,
            "summary_id": self.summary_id,
            "start_seq": self.start_seq,
            "end_seq": self.end_seq,
            "compressed": self.compressed,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "summarizer": self.summarizer,
            "trigger": self.trigger,
        }


def summary_budget(threshold: int) -> int:
    """How long a summary may be: a quarter of the threshold, within [200, 4000] tokens."""
    return max(200, min(4000, threshold // 4))


class Compactor:
    def __init__(self, store: RunStore, summarizer: Summarizer, settings: CompactionSettings) -> None:
        self.store = store
        self.summarizer = summarizer
        self.settings = settings

    async def compact(
        self,
        run: RunState,
        *,
        trigger: Trigger,
        threshold: int,
        instructions: str | None = None,
        keep_recent: int | None = None,
        min_to_compress: int | None = None,
        on_summary: Callable[[SummaryResult], None] | None = None,
    ) -> CompactionResult | None:
        """Summarize the older part of the context; None when there is too little to summarize or
        the summary would free nothing (never progress, so callers never loop on it).
        ``on_summary`` is told what the summarizer gave (e.g. that the model failed)."""
        snapshot = await self.store.read_context(run)
        plan = plan_compaction(
            snapshot,
            keep_recent=self.settings.keep_recent if keep_recent is None else keep_recent,
            min_to_compress=self.settings.min_to_compress if min_to_compress is None else min_to_compress,
        )
        if plan is None:
            return None
        previous = str(plan.previous_summary["content"]) if plan.previous_summary else None
        result = await self.summarize(
            run, SummaryRequest(plan.summarize, previous, instructions, "compaction", summary_budget(threshold))
        )
        if on_summary is not None:
            on_summary(result)
        summary_id, number = run.next_summary_id, run.compaction_count + 1
        head = summary_line(summary_id, result.text, covers_from=plan.covers_from, end_seq=plan.end_seq)
        record = {
            "id": summary_id,
            "type": "compaction",
            "summary": result.text,
            "compressed_message_count": len(plan.summarize),
            "tokens_saved": 0,
            "created_at": iso(self.store.clock()),
            "start_seq": plan.start_seq,
            "end_seq": plan.end_seq,
            "covers_from": plan.covers_from,
            "trigger": trigger,
            "summarizer": result.summarizer,
            "tokens_before": 0,
            "tokens_after": 0,
            "compaction_count": number,
            "archive": archive_name(summary_id),
        }
        if instructions:
            record["instructions"] = instructions
        change = Compaction(summary_id, number, head, plan.end_seq, record)
        done = await self.store.rewrite_context(run, change)
        if done is None:
            log.info("compaction of run %s would free nothing; skipped", run.run_id)
            return None
        outcome = CompactionResult(
            summary_id, number, plan.start_seq, plan.end_seq, len(plan.summarize), done.tokens_before,
            done.tokens_after, result.summarizer, trigger,
        )  # fmt: skip
        self.store.emit(compaction_published(run, iso(self.store.clock()), outcome.event()))
        return outcome

    async def would_compact(self, run: RunState) -> bool:
        """Whether a compaction now has messages to remove (it may still find the summary not shorter)."""
        snapshot = await self.store.read_context(run)
        plan = plan_compaction(
            snapshot, keep_recent=self.settings.keep_recent, min_to_compress=self.settings.min_to_compress
        )
        return plan is not None

    async def uncompact(self, run: RunState) -> int | None:
        """Restore the context saved before the last compaction (plus what came after it);
        None when there is nothing to undo."""
        number = run.compaction_count
        if number == 0:
            return None
        change = Uncompaction(run.next_summary_id, number, iso(self.store.clock()))
        if await self.store.rewrite_context(run, change) is None:
            return None
        run.hold_compaction = True
        self.store.emit(uncompact_published(run, iso(self.store.clock()), number))
        return number

    async def final_summary(self, run: RunState, threshold: int) -> SummaryResult:
        """The run's final summary: the latest summary plus the current context."""
        context = await self.store.read_context(run)
        previous = str(context[0]["content"]) if context and is_summary(context[0]) else None
        body = tuple(context[1:] if previous else context)
        return await self.summarize(run, SummaryRequest(body, previous, None, "final", summary_budget(threshold)))

    async def summarize(self, run: RunState, request: SummaryRequest) -> SummaryResult:
        """Call the summarizer and record the call in tools.jsonl, like the model's other side-calls."""
        started = time.perf_counter()
        result = await self.summarizer(request)
        await self.store.record_tool(
            run,
            ToolUse(
                tool_name="summarizer",
                arguments={
                    "purpose": request.purpose,
                    "messages": len(request.lines),
                    "instructions": request.instructions,
                },
                result={"summarizer": result.summarizer, "chars": len(result.text)},
                error=result.error,
                duration_ms=(time.perf_counter() - started) * 1000,
                extra={
                    "kind": "final_summary" if request.purpose == "final" else "compaction",
                    "model": result.model,
                    "input_tokens": result.input_tokens,
                    "output_tokens": result.output_tokens,
                    "calls": result.calls,
                },
            ),
        )
        return result

