"""Summaries without a model: a deterministic extractive summarizer, and the prompts a model gets.

The extractive summary keeps what a later turn most needs verbatim — ids, paths, numbers, URLs and
open questions — and a short line per message, folded after the previous summary so summaries do
not nest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from sessions.tokens import estimate_text

_DETAIL = re.compile(
    r"https?://\S+"  # URLs
    r"|~?/?(?:[\w.-]+/)+[\w.-]+"  # paths, absolute ones with their leading / (or ~/)
    r"|\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"  # uuids
    r"|#\d+|\b[A-Z]{2,}-\d+\b"  # issue refs, ticket ids
    r"|\b\d[\d.,:/-]*\d\b|\b\d\b"  # numbers, dates, versions
)
_MAYBE_DETAIL = re.compile(r"[\d/-]")
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


def _speaker(line: Mapping[str, Any]) -> str:
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
    if _MAYBE_DETAIL.search(text) is None:  # every kind of detail has a digit, a "/" or a "-"
        return []
    return list(dict.fromkeys(_DETAIL.findall(text)))  # no capturing group: findall gives whole matches


def open_questions(text: str) -> list[str]:
    if "?" not in text and "\uff1f" not in text:  # most messages ask nothing: skip the split
        return []
    flat = " ".join(text.split())
    return [s.strip() for s in _SENTENCE.split(flat) if s.strip().endswith(("?", "\uff1f"))]


def extractive_summary(
    lines: Sequence[Mapping[str, Any]],
    *,
    previous: str | None = None,
    instructions: str | None = None,
    max_tokens: int = 1500,
) -> str:
    """A deterministic summary of ``lines`` (oldest first), at most about ``max_tokens``: the
    newest message lines that fit, after the details and questions of the newest messages.

    A compaction or a final summary may take tens of thousands of messages of which about a
    hundred lines fit, so the messages are read newest first: lines are built only until the
    budget is full, and details and questions searched for only until ``MAX_ITEMS`` of each are
    found; every message still costs one cheap look (its text, whether it can hold a detail or a
    question). The text is what building every line and dropping the oldest gives."""
    head: list[str] = []
    if previous:
        head.append("Earlier: " + _first_sentences(previous, LINE_CHARS * 4))
    if instructions:
        head.append(f"(Requested focus: {instructions})")
    total_chars = sum(len(str(x.get("content") or "")) for x in lines)
    per_line = max(MIN_LINE_CHARS, min(LINE_CHARS, total_chars // (3 * max(1, len(lines)))))
    found: dict[str, None] = {}  # details, newest first
    asked: dict[str, None] = {}  # questions, newest first
    texts: list[tuple[int, str]] = []  # (index, content) of the messages with text, newest first
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        content = _content(line)
        if not content:
            continue
        texts.append((index, content))
        if len(found) < MAX_ITEMS:
            for detail in reversed(details(content)):
                found.setdefault(detail)
        if len(asked) < MAX_ITEMS and line.get("role") == "user":
            for question in reversed(open_questions(content)):
                asked.setdefault(question)
    tail: list[str] = []
    if found:  # the most recent ones matter most, in the order they came
        tail.append("Details: " + "; ".join(list(found)[:MAX_ITEMS][::-1]))
    if asked:
        tail.append("Questions raised: " + " | ".join(list(asked)[:MAX_ITEMS][::-1]))
    budget = max_tokens - sum(estimate_text(p) + 1 for p in (*head, *tail))
    kept: list[str] = []
    for index, content in texts:
        part = f"- {_speaker(lines[index])}: {_first_sentences(content, per_line)}"
        cost = estimate_text(part) + 1
        if cost > budget:
            break
        budget -= cost
        kept.append(part)
    return assemble([*head, *kept[::-1], *tail], len(texts) - len(kept), max_tokens)


def assemble(parts: list[str], dropped: int, max_tokens: int) -> str:
    """The summary's text: its parts, after a note of the ``dropped`` older message lines, cut
    with a marker if it is still over ``max_tokens`` (the header alone can be)."""
    if dropped:
        parts = [f"[{dropped} older messages omitted]", *parts]
    text = "\n".join(parts)
    estimate = estimate_text(text)
    if estimate > max_tokens:
        text = text[: max(0, int(len(text) * max_tokens / estimate) - 20)] + " …[truncated]"
    return text


def _content(line: Mapping[str, Any]) -> str:
    content = str(line.get("content") or "")
    if line.get("tool_calls"):
        names = ", ".join(c.get("function", {}).get("name", "?") for c in line["tool_calls"])
        content = f"{content} [called {names}]".strip()
    return content


def transcript(lines: Sequence[Mapping[str, Any]]) -> str:
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
