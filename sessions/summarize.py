"""Summaries without a model: a deterministic extractive summarizer, and the prompts a model gets.

The extractive summary keeps what a later turn most needs verbatim — ids, paths, numbers, URLs and
open questions — and a short line per message, folded after the previous summary so summaries do
not nest.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sessions.tokens import estimate_text

_DETAIL = re.compile(
    r"https?://\S+"  # URLs
    r"|~?/?(?:[\w.-]+/)+[\w.-]+"  # paths, absolute ones with their leading / (or ~/)
    r"|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"  # uuids
    r"|#\d+|\b[A-Z]{2,}-\d+\b"  # issue refs, ticket ids
    r"|\b\d[\d.,:/-]*\d\b|\b\d\b"  # numbers, dates, versions
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|(?<=[\u3002\uff01\uff1f])\s*")
LINE_CHARS = 240  # at most this much of each message; less when that would not shrink the context
MIN_LINE_CHARS = 60
MAX_ITEMS = 120  # details and questions kept

SUMMARY_PROMPT = (
    "You compress a conversation so it can continue with less context. Write a concise summary of the"
    " messages below, folding in the previous summary if one is given, so the result replaces both."
    " Keep verbatim: ids, file paths, URLs, numbers, dates, names, decisions, and every open question or"
    " unfinished task. Prefer facts over narration. Do not address the user; output only the summary."
)
FINAL_PROMPT = (
    "Write the final summary of this whole session for whoever continues it later: the goal, what was"
    " done and decided, the current state, and what is still open. Keep ids, paths, URLs and numbers"
    " verbatim. Output only the summary."
)


def _speaker(line: dict[str, Any]) -> str:
    role = str(line.get("role", "?"))
    if line.get("name"):
        return f"{role} {line['name']}"
    if role == "tool" and line.get("tool_name"):
        return f"tool {line['tool_name']}"
    return role


def _first_sentences(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    out = ""
    for sentence in _SENTENCE.split(flat):
        if len(out) + len(sentence) + 1 > limit:
            break
        out = f"{out} {sentence}".strip()
    return out or flat[: limit - 1] + "…"


def details(text: str) -> list[str]:
    return list(dict.fromkeys(m.group(0) for m in _DETAIL.finditer(text)))


def open_questions(text: str) -> list[str]:
    flat = " ".join(text.split())
    return [s.strip() for s in _SENTENCE.split(flat) if s.strip().endswith(("?", "\uff1f"))]


def extractive_summary(
    lines: Sequence[dict[str, Any]],
    *,
    previous: str | None = None,
    instructions: str | None = None,
    max_tokens: int = 1500,
) -> str:
    """A deterministic summary of ``lines`` (oldest first), at most about ``max_tokens``."""
    parts: list[str] = []
    if previous:
        parts.append("Earlier: " + _first_sentences(previous, LINE_CHARS * 4))
    if instructions:
        parts.append(f"(Requested focus: {instructions})")
    keep_details: list[str] = []
    questions: list[str] = []
    total_chars = sum(len(str(x.get("content") or "")) for x in lines)
    per_line = max(MIN_LINE_CHARS, min(LINE_CHARS, total_chars // (3 * max(1, len(lines)))))
    for line in lines:
        content = str(line.get("content") or "")
        if line.get("tool_calls"):
            names = ", ".join(c.get("function", {}).get("name", "?") for c in line["tool_calls"])
            content = f"{content} [called {names}]".strip()
        if not content:
            continue
        parts.append(f"- {_speaker(line)}: {_first_sentences(content, per_line)}")
        keep_details.extend(details(content))
        if line.get("role") == "user":
            questions.extend(open_questions(content))
    if keep_details:  # the most recent ones matter most
        parts.append("Details: " + "; ".join(list(dict.fromkeys(reversed(keep_details)))[:MAX_ITEMS][::-1]))
    if questions:
        parts.append("Questions raised: " + " | ".join(list(dict.fromkeys(reversed(questions)))[:MAX_ITEMS][::-1]))
    return _fit(parts, max_tokens)


def _fit(parts: list[str], max_tokens: int) -> str:
    """Drop the oldest message lines first until the text fits (linear: thousands of messages
    are summarized at once), then cut what is still over."""
    costs = [estimate_text(p) + 1 for p in parts]
    total = sum(costs)
    dropped = 0
    if total > max_tokens:
        keep = [True] * len(parts)
        for i, part in enumerate(parts):
            if total <= max_tokens:
                break
            if part.startswith("- "):
                keep[i] = False
                total -= costs[i]
                dropped += 1
        parts = [p for p, k in zip(parts, keep, strict=True) if k]
    if dropped:
        parts.insert(0, f"[{dropped} older messages omitted]")
    text = "\n".join(parts)
    estimate = estimate_text(text)
    if estimate > max_tokens:
        text = text[: max(0, int(len(text) * max_tokens / estimate) - 20)] + " …[truncated]"
    return text


def transcript(lines: Sequence[dict[str, Any]]) -> str:
    """Messages as plain text for a summarizer request."""
    out = []
    for line in lines:
        content = str(line.get("content") or "")
        if line.get("tool_calls"):
            calls = "; ".join(
                f"{c.get('function', {}).get('name')}({c.get('function', {}).get('arguments')})"
                for c in line["tool_calls"]
            )
            content = f"{content}\n[tool calls: {calls}]".strip()
        out.append(f"[{line.get('seq', '-')}] {_speaker(line)}: {content}")
    return "\n".join(out)
