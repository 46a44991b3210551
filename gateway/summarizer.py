"""Summaries by the model, with the extractive fallback (SPEC section 5).

A request never exceeds the model's window: when the messages do not fit, they are summarized in
pieces, each folding in the summary of the pieces before it.
"""

from __future__ import annotations

import logging

from gateway.provider import ChatProvider, ProviderError
from sessions.compactor import SummaryRequest, SummaryResult, extractive
from sessions.summarize import FINAL_PROMPT, SUMMARY_PROMPT, transcript
from sessions.tokens import estimate_text

log = logging.getLogger(__name__)
MARGIN = 0.9  # the token estimate is rough; leave room


class ModelSummarizer:
    def __init__(self, provider: ChatProvider | None, *, model: str, context_window: int, max_output_tokens: int):
        self.provider = provider
        self.model = model
        self.context_window = context_window
        self.max_output_tokens = max_output_tokens

    async def __call__(self, request: SummaryRequest) -> SummaryResult:
        if self.provider is None:
            return await extractive(request)
        try:
            text = await self._summarize(request)
        except ProviderError as exc:
            log.warning("the model summary failed (%s); using the extractive summarizer", exc.message)
            return await extractive(request)
        if not text.strip():
            log.warning("the model returned an empty summary; using the extractive summarizer")
            return await extractive(request)
        return SummaryResult(text.strip(), f"llm:{self.model}")

    async def _summarize(self, request: SummaryRequest) -> str:
        assert self.provider is not None
        prompt = FINAL_PROMPT if request.purpose == "final" else SUMMARY_PROMPT
        if request.instructions:
            prompt += f"\nThe user asked for this focus: {request.instructions}"
        output = min(self.max_output_tokens, request.max_tokens)
        budget = int((self.context_window - output) * MARGIN) - estimate_text(prompt) - 64
        previous = request.previous
        for piece in self._pieces(request, budget, previous):
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
        return previous or ""

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
