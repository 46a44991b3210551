"""Summaries by the model, with the extractive fallback (SPEC section 5).

A request never exceeds the model's window: when the messages do not fit, they are summarized in
pieces, each folding in the summary of the pieces before it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

from conversations.completions import Completion, ProviderError, Usage
from conversations.fallbacks import ModelChain
from sessions.compactor import SummaryRequest, SummaryResult, extractive
from sessions.summarize import FINAL_PROMPT, SUMMARY_PROMPT, transcript
from sessions.tokens import estimate_text

log = logging.getLogger(__name__)
MARGIN = 0.9  # the token estimate is rough; leave room


class ModelSummarizer:
    def __init__(self, provider: ModelChain | None, *, model: str, context_window: int, max_output_tokens: int):
        self.provider = provider
        self.model = model
        self.context_window = context_window
        self.max_output_tokens = max_output_tokens

    async def __call__(self, request: SummaryRequest) -> SummaryResult:
        if self.provider is None:
            return await extractive(request)
        usage = Usage()
        calls = 0
        text = ""

        def fallback(error: str, fallen: SummaryResult) -> SummaryResult:
            return replace(
                fallen, model=self.model, error=error, calls=calls,
                input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
            )  # fmt: skip

        try:
            async for completion in self._summarize(request):
                usage = usage + completion.usage
                calls += 1
                text = completion.content
        except ProviderError as exc:
            log.warning("the model summary failed (%s); using the extractive summarizer", exc.message)
            return fallback(f"{exc.kind}: {exc.message}", await extractive(request))
        if not text.strip():
            log.warning("the model returned an empty summary; using the extractive summarizer")
            return fallback("the model returned an empty summary", await extractive(request))
        return SummaryResult(
            text.strip(), f"llm:{self.model}", model=self.model, calls=calls,
            input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
        )  # fmt: skip

    async def _summarize(self, request: SummaryRequest) -> AsyncIterator[Completion]:
        """One completion per piece; the last one's content is the summary."""
        assert self.provider is not None
        prompt = FINAL_PROMPT if request.purpose == "final" else SUMMARY_PROMPT
        if request.instructions:
            prompt += f"\nThe user asked for this focus: {request.instructions}"
        output = min(self.max_output_tokens, request.max_tokens)
        budget = int((self.context_window - output) * MARGIN) - estimate_text(prompt) - 64
        previous = request.previous
        # Every message of the request, estimated line by line (10,000 messages: about 20 ms of
        # CPU): on a worker thread, not the event loop.
        pieces = await asyncio.to_thread(self._pieces, request, budget, previous)
        for piece in pieces:
            parts = []
            if previous:
                parts.append(f"Previous summary:\n{previous}")
            parts.append(f"Messages:\n{piece}")
            completion = await self.provider.complete(
                [{"role": "system", "content": prompt}, {"role": "user", "content": "\n\n".join(parts)}],
                model=self.model,
                max_tokens=output,
            )
            previous = completion.content
            yield completion

    def _pieces(self, request: SummaryRequest, budget: int, previous: str | None) -> list[str]:
        """Split the transcript so each request (with the running summary) fits the budget."""
        room = max(256, budget - (estimate_text(previous) if previous else 0) - request.max_tokens)
        pieces: list[str] = []
        current: list[str] = []
        used = 0
        for line in request.lines:
            text = transcript([line])
            cost = estimate_text(text) + 1
            if cost > room:  # one message larger than a whole request: cut it
                text = text[: room * 4 - 40] + " …[cut]"
                cost = estimate_text(text) + 1
            if current and used + cost > room:
                pieces.append("\n".join(current))
                current, used = [], 0
            current.append(text)
            used += cost
        if current or not pieces:
            pieces.append("\n".join(current))
        return pieces
