"""Memory in conversations (SPEC section 9): auto-recall at the start of a run (or every turn),
and the model's memory tools. ``memory/`` knows nothing of sessions; this module joins them. Each
session reads and writes only its key's memory scope (``conversations/memory_scope.py``): recall, the
daily log it is offered, ``memory_search``, ``memory_get`` and ``memory_append`` (the memory
flush's too)."""

from __future__ import annotations

import asyncio
import html
import json
import logging
import re
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

from config.clock import iso
from config.errors import BadRequest, NeotaskError, NotFound
from config.settings import Settings
from conversations.memory_scope import scope_of_raw
from conversations.relevance import tool_result
from conversations.tools import Tool, ToolError, params
from conversations.transcript_memory import is_transcript, run_citation, transcript_path
from conversations.turns import Conversations, Post
from memory import MemoryService, SearchHit, scopes
from memory.scopes import Scope
from sessions.events import RecallEvent, TurnEvent, recall_published
from sessions.records import NewMessage, RunState
from sessions.tokens import estimate_text

# A flush turn that has nothing to keep sometimes says so through memory_append; such a line would
# be recalled into every new session, so it is refused.
NOTHING_TO_SAVE = re.compile(
    r"^\W*(nothing|none|n/?a|no( new| durable| relevant| important)? (facts?|information|details?|memories))"
    r"( (new |else |more )?(worth|to|important|relevant|durable|of note|here|for now)[\w\s]*)?\W*$",
    re.IGNORECASE,
)

log = logging.getLogger(__name__)


def memory_message(hits: list[SearchHit], daily: list[tuple[str, str]], max_tokens: int) -> str | None:
    """One ``<relevant-memories>`` system message, each snippet escaped and cited, within budget."""
    parts: list[str] = []
    used = estimate_text("<relevant-memories>\n</relevant-memories>")
    for hit in hits:
        block = (
            f'<memory citation="{html.escape(hit.citation)}" score="{hit.score:.2f}">'
            f"{html.escape(hit.snippet.strip())}</memory>"
        )
        cost = estimate_text(block)
        if used + cost > max_tokens:
            break
        parts.append(block)
        used += cost
    for path, text in daily:
        room = max_tokens - used - 20
        if room <= 20:
            break
        body = text.strip()
        while body:
            block = f'<daily-log citation="{html.escape(path)}">{html.escape(body)}</daily-log>'
            cost = estimate_text(_wrap([*parts, block]))
            if cost <= max_tokens:
                parts.append(block)
                used = cost
                break
            # the latest lines of the log matter most; kana and kanji cost twice, escapes lengthen
            body = body[len(body) - int(len(body) * 0.9 * max_tokens / cost) :]
    while parts and estimate_text(_wrap(parts)) > max_tokens:  # the whole may count as Japanese
        parts.pop()
    if not parts:
        return None
    return _wrap(parts)


def _wrap(parts: list[str]) -> str:
    return "<relevant-memories>\n" + "\n".join(parts) + "\n</relevant-memories>"


class MemoryBridge:
    def __init__(self, memory: MemoryService, conversations: Conversations, settings: Settings, *, host_zone: ZoneInfo):
        self.memory = memory
        self.conv = conversations
        self.settings = settings
        self.host_zone = host_zone

    def zone(self, agent_id: str | None) -> ZoneInfo:
        name = self.conv.agent(agent_id).timezone
        return ZoneInfo(name) if name else self.host_zone

    def sees_memory_md(self, chat_type: str) -> bool:
        return chat_type in self.settings.memory.recall.chat_types

    def scope(self, run: RunState) -> Scope:
        """The memory scope of the run's key (``memory.scope``)."""
        return scope_of_raw(run.key, self.settings.memory.scope, self.settings.agents)

    # -- auto-recall ----------------------------------------------------------------------------

    async def recall(self, run: RunState, post: Post, new_run: bool) -> list[TurnEvent]:
        """Before the first user message of a run (or every user message with ``on:
        every_turn``): inject what the memory holds about it."""
        recall = self.settings.memory.recall
        if not recall.enabled or post.message.role != "user" or run.chat_type not in recall.chat_types:
            return []
        if not post.message.content.strip():  # nothing to search for
            return []
        if recall.on == "session_start" and not new_run:
            return []
        if not self.memory.ready:
            log.info("recall skipped for %s: the memory index is not ready yet", run.key)
            return []
        agent = run.agent_id or "main"
        scope = self.scope(run)
        query = post.message.content
        hits = await self.memory.search(agent, query, k=recall.top_k, include_memory_md=True, scope=scope)
        daily = await asyncio.to_thread(self._daily_logs, agent, scope) if recall.daily_logs and new_run else []
        text = memory_message(hits, daily, recall.max_tokens)
        if text is None:
            return []
        record = await self.conv.store.append(
            run, NewMessage(role="system", content=text, kind="recall", user_activity=False)
        )
        citations = [h.citation for h in hits] + [path for path, _ in daily]
        event: RecallEvent = {"type": "memory", "action": "recall", "seq": record["seq"], "citations": citations}
        self.conv.store.emit(recall_published(run, iso(self.conv.store.clock()), event))
        return [event]

    def _daily_logs(self, agent: str, scope: Scope) -> list[tuple[str, str]]:
        """Today's and yesterday's logs of ``scope`` (blocking file reads: called off the event loop)."""
        today = self.conv.clock().astimezone(self.zone(agent)).date()
        out = []
        for day in (today - timedelta(days=1), today):
            path = scopes.daily_path(day, _writes_to(scope))
            try:
                out.append((path, self.memory.read_file(agent, path)))
            except NotFound:  # no log that day: the common case
                continue
            except BadRequest:  # a symlink out of the workspace: refused, and logged by memory/
                continue
        return out

    # -- tools ----------------------------------------------------------------------------------

    def tools(self) -> list[Tool]:
        """memory_search, memory_get, memory_append (the composition root adds them to the toolbox)."""
        return [
            Tool(
                name="memory_search",
                description="Search long-term memory (MEMORY.md and memory/*.md notes). Returns cited snippets.",
                parameters=params(
                    ("query",),
                    query={"type": "string", "description": "What to look for, in natural language."},
                    k={"type": "integer", "minimum": 1, "maximum": 20, "description": "How many results."},
                ),
                run=self._search,
            ),
            Tool(
                name="memory_get",
                description="Read lines of a memory file (a path from a memory_search citation).",
                parameters=params(
                    ("path",),
                    path={"type": "string"},
                    start_line={"type": "integer", "minimum": 1},
                    end_line={"type": "integer", "minimum": 1},
                ),
                run=self._get,
            ),
            Tool(
                name="memory_append",
                description="Save a durable fact to today's memory log (memory/YYYY-MM-DD.md). One fact per call.",
                parameters=params(("text",), text={"type": "string", "description": "The fact, one line."}),
                run=self._append,
            ),
        ]

    async def _search(self, run: RunState, arguments: dict[str, Any]) -> str:
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ToolError("'query' must be a non-empty string")
        k = arguments.get("k", self.settings.memory.search.top_k)
        if not isinstance(k, int) or not 1 <= k <= self.settings.memory.search.candidates:
            raise ToolError(f"'k' must be an integer from 1 to {self.settings.memory.search.candidates}")
        hits = await self.memory.search(
            run.agent_id or "main",
            query,
            k=k,
            include_memory_md=self.sees_memory_md(run.chat_type),
            scope=self.scope(run),
        )
        if not self.sees_memory_md(run.chat_type):  # transcripts of runs: like MEMORY.md, direct only
            hits = [h for h in hits if not is_transcript(h.path)]
        results = [tool_result(h, run_citation(h.citation)) for h in hits]
        return json.dumps({"results": results}, ensure_ascii=False)

    async def _get(self, run: RunState, arguments: dict[str, Any]) -> str:
        path = arguments.get("path")
        if not isinstance(path, str) or not path:
            raise ToolError("'path' must be a memory file path such as memory/2026-01-31.md")
        path = path.split("#", 1)[0]
        scope = self.scope(run)
        if path.startswith("run:"):
            path = transcript_path(_writes_to(scope), path.removeprefix("run:"))
        if path.lstrip("./") == "MEMORY.md" and not self.sees_memory_md(run.chat_type):
            raise ToolError("MEMORY.md is not available in this kind of session")
        if is_transcript(path.lstrip("./")) and not self.sees_memory_md(run.chat_type):
            raise ToolError("run summaries are not available in this kind of session")
        start, end = arguments.get("start_line"), arguments.get("end_line")
        try:
            return await self.memory.get(run.agent_id or "main", path, start, end, scope=scope)
        except NeotaskError as exc:  # a bad or missing path, told to the model
            raise ToolError(exc.message) from exc

    async def _append(self, run: RunState, arguments: dict[str, Any]) -> str:
        text = arguments.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ToolError("'text' must be a non-empty string")
        if NOTHING_TO_SAVE.match(text.strip()):
            raise ToolError("that says there is nothing to save, so nothing was written; only save facts")
        agent = run.agent_id or "main"
        today = self.conv.clock().astimezone(self.zone(agent)).date()
        result = await self.memory.append_daily(agent, text, today=today, scope=_writes_to(self.scope(run)))
        if result.appended == 0:
            return f"already in {result.path}; nothing added"
        return f"saved to {result.path}"


def _writes_to(scope: Scope) -> Scope:
    """Where a session of ``scope`` keeps its own files: every scope (``memory.scope: shared``)
    writes and is offered the shared daily log."""
    return None if scope == scopes.EVERY else scope
