"""Agent tools over other sessions: ``sessions_list``, ``sessions_history``,
``sessions_search`` and ``sessions_send``. Every call is recorded in tools.jsonl by the ToolBox.

Visibility (``agents.<id>.tools.sessions.visibility``): ``self`` (the calling key only), ``agent``
(every key of the same agent; a group or channel session does not see direct keys), ``all``
(every key). ``sessions_send`` also needs the send policy to allow the target: the first of
``send_rules`` that matches (key prefix, channel, chat type) decides, else ``send_default``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from config.errors import NeotaskError, RunNotFound
from config.settings import SendRule, SessionToolsSettings
from conversations.tools import Tool, ToolError
from conversations.turns import Conversations, Outcome, Post
from sessions.history_index import HistoryIndexProtocol, HistoryQuery
from sessions.keys import parse_key
from sessions.records import NewMessage, RunQuery, RunState

MAX_CONTENT = 2000  # characters of one message handed back to the model


@dataclass(frozen=True)
class KeyInfo:
    key: str
    agent_id: str | None
    chat_type: str


def visible(caller: RunState, keys: list[KeyInfo], visibility: str) -> list[KeyInfo]:
    """The keys ``caller`` may see under ``visibility`` (pure)."""
    if visibility == "self":
        return [k for k in keys if k.key == caller.key]
    if visibility == "all":
        return keys
    shared = caller.chat_type in ("group", "channel")
    return [
        k
        for k in keys
        if k.key == caller.key or (k.agent_id == caller.agent_id and not (shared and k.chat_type == "direct"))
    ]


def send_allowed(rules: tuple[SendRule, ...], default: str, *, key: str, channel: str | None, chat_type: str) -> bool:
    """First matching rule wins (pure)."""
    for rule in rules:
        if rule.key_prefix is not None and not key.startswith(rule.key_prefix):
            continue
        if rule.channel is not None and rule.channel != channel:
            continue
        if rule.chat_type is not None and rule.chat_type != chat_type:
            continue
        return rule.action == "allow"
    return default == "allow"


class SessionTools:
    def __init__(self, conversations: Conversations, history: HistoryIndexProtocol | None) -> None:
        self.conv = conversations
        self.store = conversations.store
        self.history = history

    def settings(self, run: RunState) -> SessionToolsSettings:
        tools = self.conv.agent(run.agent_id).tools.sessions
        if not tools.enabled:
            raise ToolError("session tools are disabled for this agent (agents.<id>.tools.sessions.enabled)")
        return tools

    async def keys(self, run: RunState) -> list[KeyInfo]:
        found = {e.key: KeyInfo(e.key, e.agent_id, e.chat_type) for e in self.store.entries()}
        for known in await self.store.known_keys():
            found.setdefault(known.key, KeyInfo(known.key, known.agent_id, known.chat_type or "direct"))
        return visible(run, sorted(found.values(), key=lambda k: k.key), self.settings(run).visibility)

    async def require_visible(self, run: RunState, key: str) -> KeyInfo:
        for info in await self.keys(run):
            if info.key == key:
                return info
        raise ToolError(f"no session {key!r} is visible from this session")

    def tools(self) -> list[Tool]:
        """sessions_list, sessions_history, sessions_search, sessions_send (added by gateway/services.py)."""
        string = {"type": "string"}
        return [
            Tool(
                "sessions_list",
                "List the sessions (conversations) you may see, newest activity first, with their last activity.",
                {"type": "object", "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 200}}},
                self._list,
            ),
            Tool(
                "sessions_history",
                "Read messages of a session (its current or latest run) or of one run, oldest first, paginated by "
                "after_seq. Chat commands are left out.",
                {
                    "type": "object",
                    "properties": {
                        "key": string,
                        "run_id": string,
                        "after_seq": {"type": "integer", "minimum": 0},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 500},
                    },
                },
                self._history,
            ),
            Tool(
                "sessions_search",
                "Full-text search over the messages of every session you may see, old and archived runs included.",
                {
                    "type": "object",
                    "properties": {
                        "query": string,
                        "key": string,
                        "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                    },
                    "required": ["query"],
                },
                self._search,
            ),
            Tool(
                "sessions_send",
                "Post a message into another session; with wait true, wait (up to timeout_s) for its reply.",
                {
                    "type": "object",
                    "properties": {
                        "key": string,
                        "message": string,
                        "wait": {"type": "boolean"},
                        "timeout_s": {"type": "number", "minimum": 1},
                    },
                    "required": ["key", "message"],
                },
                self._send,
            ),
        ]

    # -- the tools ------------------------------------------------------------------------------

    async def _list(self, run: RunState, arguments: dict[str, Any]) -> str:
        limit = _int(arguments, "limit", 50, 1, 200)
        rows = []
        for info in await self.keys(run):
            entry = self.store.entry(info.key)
            rows.append({
                "key": info.key, "agent_id": info.agent_id, "chat_type": info.chat_type,
                "status": entry.status if entry else "deleted", "run_id": entry.run_id if entry else None,
                "last_activity": (entry.last_interaction_at or entry.updated_at) if entry else None,
                "label": entry.label if entry else None,
            })  # fmt: skip
        rows.sort(key=lambda r: r["last_activity"] or "", reverse=True)
        return json.dumps({"sessions": rows[:limit]}, ensure_ascii=False)

    async def _history(self, run: RunState, arguments: dict[str, Any]) -> str:
        tools = self.settings(run)
        after = _int(arguments, "after_seq", 0, 0, 2**62)
        limit = _int(arguments, "limit", tools.max_messages, 1, tools.max_messages)
        run_id, key = arguments.get("run_id"), arguments.get("key")
        if run_id is not None and not isinstance(run_id, str):
            raise ToolError("'run_id' must be a run uuid")
        if run_id is None:
            if not isinstance(key, str) or not key:
                raise ToolError("give 'key' (a session key from sessions_list) or 'run_id'")
            await self.require_visible(run, key)
            entry = self.store.entry(key)
            run_id = (entry.run_id or entry.last_run_id) if entry else None
            if run_id is None:
                rows = await self.store.list_runs(RunQuery(session_key=key, limit=1))
                run_id = rows[0]["uuid"] if rows else None
            if run_id is None:
                raise ToolError(f"session {key!r} has no run")
        row = await self.store.get_run(run_id)
        run_key = row.get("session_key") if row is not None else None
        if row is None or not run_key:
            raise ToolError(f"no run {run_id!r}")
        await self.require_visible(run, run_key)
        messages: list[dict[str, Any]] = []
        cursor = after
        while len(messages) <= limit:  # commands are skipped: read on until a page is full
            try:
                batch = await self.store.read_messages(run_id, after_seq=cursor, limit=limit + 1)
            except RunNotFound:
                raise ToolError(f"run {run_id} has no readable transcript") from None
            for record in batch:
                if record.get("command"):
                    continue
                content = str(record.get("content") or "")
                messages.append({"seq": record.get("seq"), "role": record.get("role"), "name": record.get("name"),
                                 "timestamp": record.get("timestamp"), "content": content[:MAX_CONTENT]})  # fmt: skip
                if len(messages) > limit:
                    break
            if len(batch) <= limit:
                break
            cursor = int(batch[-1]["seq"])
        page = messages[:limit]
        next_after = page[-1]["seq"] if len(messages) > limit else None
        body = {"key": row["session_key"], "run_id": run_id, "messages": page, "next_after_seq": next_after}
        return json.dumps(body, ensure_ascii=False)

    async def _search(self, run: RunState, arguments: dict[str, Any]) -> str:
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ToolError("'query' must be a non-empty string")
        if self.history is None:
            raise ToolError("the history index is off (history.enabled: false)")
        keys = frozenset(k.key for k in await self.keys(run))
        key = arguments.get("key")
        if key is not None:
            if not isinstance(key, str) or key not in keys:
                raise ToolError(f"no session {key!r} is visible from this session")
            keys = frozenset({key})
        limit = _int(arguments, "limit", 10, 1, 50)
        hits = await self.history.search(HistoryQuery(q=query, limit=limit, keys=keys))
        results = [{k: v for k, v in h.as_dict().items() if k != "link"} for h in hits]
        return json.dumps({"results": results}, ensure_ascii=False)

    async def _send(self, run: RunState, arguments: dict[str, Any]) -> str:
        tools = self.settings(run)
        raw, message = arguments.get("key"), arguments.get("message")
        if not isinstance(raw, str) or not raw:
            raise ToolError("'key' must be a session key")
        if not isinstance(message, str) or not message.strip():
            raise ToolError("'message' must be a non-empty string")
        try:
            target = parse_key(raw, agents=self.conv.settings.agents)
        except NeotaskError as exc:
            raise ToolError(exc.message) from exc
        if target.raw == run.key:
            raise ToolError("a session cannot send to itself")
        await self.require_visible(run, target.raw)
        if not send_allowed(tools.send_rules, tools.send_default, key=target.raw, channel=target.channel,
                            chat_type=target.chat_type):  # fmt: skip
            raise ToolError(f"the send policy does not allow posting to {target.raw!r}")
        wait = bool(arguments.get("wait", False))
        timeout = min(float(arguments.get("timeout_s") or tools.send_timeout_s), tools.send_timeout_s)
        stored: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()

        def on_stored(outcome: Outcome) -> None:
            if not stored.done():
                stored.set_result(outcome)

        line = NewMessage(role="user", content=message, name=_speaker(run.key), sender_id=run.key, user_activity=False)
        post = Post(key=target if target.agent_id else _with_main(target), message=line)
        task = asyncio.create_task(self.conv.post(post, on_stored=on_stored), name=f"sessions_send:{target.raw}")
        task.add_done_callback(_quiet)
        try:
            if wait:
                outcome = await asyncio.wait_for(asyncio.shield(task), timeout)
                reply = outcome.reply["content"] if outcome.reply else None
                return json.dumps({"key": target.raw, "run_id": outcome.run_id, "message_seq": outcome.message_seq,
                                   "reply": reply}, ensure_ascii=False)  # fmt: skip
            first = await asyncio.wait_for(asyncio.shield(_first(stored, task)), timeout)
            return json.dumps({"key": target.raw, "run_id": first.run_id, "message_seq": first.message_seq,
                               "reply": None, "waiting": False})  # fmt: skip
        except TimeoutError:
            sent = stored.result() if stored.done() else None
            return json.dumps({"key": target.raw, "message_seq": sent.message_seq if sent else None, "reply": None,
                               "note": f"no reply within {timeout:g} s; the message was delivered"})  # fmt: skip
        except NeotaskError as exc:
            raise ToolError(exc.message) from exc


async def _first(stored: asyncio.Future[Outcome], task: asyncio.Task[Outcome]) -> Outcome:
    done, _ = await asyncio.wait({stored, task}, return_when=asyncio.FIRST_COMPLETED)
    if stored in done:
        return stored.result()
    return task.result()


def _quiet(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        with contextlib.suppress(Exception):  # the caller saw it, or nobody waits for it any more
            task.exception()


def _with_main(key: Any) -> Any:
    from dataclasses import replace

    return replace(key, agent_id="main")


def _speaker(key: str) -> str:
    return "session_" + "".join(c if c.isalnum() else "_" for c in key)[:50]


def _int(arguments: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = arguments.get(name, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ToolError(f"'{name}' must be an integer from {low} to {high}")
    return value
